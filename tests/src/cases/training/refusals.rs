//! `training.refusals`: what the standard operations must refuse, and how.

use xpu_hal::ops::{Distribution, Layout, Op, OpKind, Tensor};
use xpu_hal::{Allocation, DType, Stream};

use crate::case::{CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{ensure, expect_invalid, expect_unsupported, full_message, upload};

fn lists(ctx: &CaseContext, kind: OpKind, dtype: DType) -> bool {
    ctx.device.capabilities().supports_op(kind, dtype)
}

fn f32s(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn i32s(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn t<'a>(a: &'a Allocation, dtype: DType, dims: &[u64]) -> Result<Tensor<'a>, CaseError> {
    Ok(Tensor::new(a, dtype, dims)?)
}

pub(crate) fn refusals(ctx: &CaseContext) -> CaseOutcome {
    let dt = DType::F32;
    let listed = OpKind::ALL.iter().filter(|&&k| lists(ctx, k, dt)).count();
    let stream = ctx.device.create_stream()?;
    let mut checked = 0;
    // Operations the device does not list are refused as unsupported.
    let buf = upload(&ctx.device, &stream, &f32s(&[1.0; 64]))?;
    for kind in [OpKind::Relu, OpKind::Softmax, OpKind::Random] {
        if lists(ctx, kind, dt) {
            continue;
        }
        let op = match kind {
            OpKind::Relu => Op::Relu {
                x: t(&buf, dt, &[8])?,
                y: t(&buf, dt, &[8])?.at(128),
            },
            OpKind::Softmax => Op::Softmax {
                x: t(&buf, dt, &[2, 4])?,
                y: t(&buf, dt, &[2, 4])?.at(128),
            },
            _ => Op::Random {
                y: t(&buf, dt, &[8])?,
                dist: Distribution::Bits,
                seed: 0,
                offset: 0,
            },
        };
        expect_unsupported(
            stream.run_op(&op),
            &format!("{kind}, which the device does not list"),
        )?;
        checked += 1;
    }
    if lists(ctx, OpKind::Relu, dt) {
        relu_refusals(ctx, &stream)?;
        checked += 1;
    }
    if lists(ctx, OpKind::Matmul, dt) {
        matmul_refusals(ctx, &stream)?;
        checked += 1;
    }
    if lists(ctx, OpKind::Gather, dt) {
        index_failures(ctx, &stream)?;
        checked += 1;
    }
    if lists(ctx, OpKind::CrossEntropy, dt) {
        label_failures(ctx, &stream)?;
        checked += 1;
    }
    if lists(ctx, OpKind::Dropout, dt) && lists(ctx, OpKind::AdamW, dt) {
        parameter_refusals(ctx, &stream)?;
        checked += 1;
    }
    if checked == 0 || (listed == 0 && checked < 3) {
        return Err(CaseError::skip(
            "device lists none of the standard operations on f32 that these checks use",
        ));
    }
    Ok(())
}

fn relu_refusals(ctx: &CaseContext, stream: &Stream) -> CaseOutcome {
    let dt = DType::F32;
    let data: Vec<f32> = (0..64).map(|i| i as f32 - 31.5).collect();
    let a = upload(&ctx.device, stream, &f32s(&data))?;
    let b = upload(&ctx.device, stream, &f32s(&[7.0; 64]))?;
    // Shapes that differ.
    expect_invalid(
        stream.run_op(&Op::Relu {
            x: t(&a, dt, &[8])?,
            y: t(&b, dt, &[9])?,
        }),
        "relu with y of another shape",
    )?;
    // Dtypes that differ, and a dtype the operation is not defined on.
    expect_invalid(
        stream.run_op(&Op::Relu {
            x: t(&a, dt, &[8])?,
            y: t(&b, DType::F64, &[8])?,
        }),
        "relu with y of another dtype",
    )?;
    expect_unsupported(
        stream.run_op(&Op::Relu {
            x: t(&a, DType::I32, &[8])?,
            y: t(&b, DType::I32, &[8])?,
        }),
        "relu on i32",
    )?;
    // A written tensor that addresses an element twice.
    let broadcast = Layout::strided(dt, &[4, 4], &[0, 1])?;
    expect_invalid(
        stream.run_op(&Op::Relu {
            x: t(&a, dt, &[4, 4])?,
            y: Tensor::with_layout(&b, broadcast),
        }),
        "relu writing through a stride-0 dimension",
    )?;
    // Out of bounds, misaligned, partly overlapping.
    expect_invalid(
        stream.run_op(&Op::Relu {
            x: t(&a, dt, &[8])?,
            y: t(&b, dt, &[8])?.at(240),
        }),
        "relu writing past the end of its allocation",
    )?;
    expect_invalid(
        stream.run_op(&Op::Relu {
            x: t(&a, dt, &[8])?.at(2),
            y: t(&b, dt, &[8])?,
        }),
        "relu reading from a misaligned offset",
    )?;
    expect_invalid(
        stream.run_op(&Op::Relu {
            x: t(&a, dt, &[8])?,
            y: t(&a, dt, &[8])?.at(16),
        }),
        "relu with y partly overlapping x",
    )?;
    stream.synchronize()?;
    ensure(stream.read(&b)? == f32s(&[7.0; 64]), || {
        "a refused relu changed its output".to_string()
    })?;
    // In place (y is x itself) is allowed and right.
    stream.run_op(&Op::Relu {
        x: t(&a, dt, &[64])?,
        y: t(&a, dt, &[64])?,
    })?;
    let want: Vec<f32> = data
        .iter()
        .map(|&v| if v > 0.0 { v } else { 0.0 })
        .collect();
    ensure(stream.read(&a)? == f32s(&want), || {
        "relu in place (y the very tensor x) gave wrong values".to_string()
    })?;
    // Empty tensors: nothing done.
    stream.run_op(&Op::Relu {
        x: t(&a, dt, &[0, 5])?,
        y: t(&b, dt, &[0, 5])?,
    })?;
    stream.synchronize()?;
    ensure(stream.read(&b)? == f32s(&[7.0; 64]), || {
        "relu of an empty tensor wrote something".to_string()
    })
}

fn matmul_refusals(ctx: &CaseContext, stream: &Stream) -> CaseOutcome {
    let dt = DType::F32;
    let a = upload(&ctx.device, stream, &f32s(&[1.0; 64]))?;
    let c = upload(&ctx.device, stream, &f32s(&[5.0; 64]))?;
    let op = |ad: &[u64], bd: &[u64], cd: &[u64]| -> Result<Op<Tensor<'_>>, CaseError> {
        Ok(Op::Matmul {
            a: t(&a, dt, ad)?,
            b: t(&a, dt, bd)?,
            c: t(&c, dt, cd)?,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
        })
    };
    expect_invalid(
        stream.run_op(&op(&[2, 3], &[4, 2], &[2, 2])?),
        "matmul with a's columns ≠ b's rows",
    )?;
    expect_invalid(
        stream.run_op(&op(&[2, 3], &[3, 2], &[3, 2])?),
        "matmul with c of the wrong shape",
    )?;
    expect_invalid(
        stream.run_op(&op(&[2, 2, 3], &[3, 3, 2], &[2, 2, 2])?),
        "matmul with different batch sizes",
    )?;
    expect_invalid(stream.run_op(&op(&[6], &[6], &[1])?), "matmul of vectors")?;
    let overlapping = Op::Matmul {
        a: t(&c, dt, &[2, 2])?,
        b: t(&a, dt, &[2, 2])?,
        c: t(&c, dt, &[2, 2])?,
        trans_a: false,
        trans_b: false,
        alpha: 1.0,
        beta: 0.0,
    };
    expect_invalid(
        stream.run_op(&overlapping),
        "matmul with c the same memory as a",
    )?;
    // K = 0 is an empty operand: nothing is done, c keeps its values.
    stream.run_op(&op(&[2, 0], &[0, 2], &[2, 2])?)?;
    stream.synchronize()?;
    ensure(stream.read(&c)? == f32s(&[5.0; 64]), || {
        "a refused or empty matmul changed c".to_string()
    })
}

fn index_failures(ctx: &CaseContext, stream: &Stream) -> CaseOutcome {
    let dt = DType::F32;
    let table = upload(&ctx.device, stream, &f32s(&[2.0; 32]))?;
    let out = upload(&ctx.device, stream, &f32s(&[9.0; 32]))?;
    for bad in [8, -1, i32::MIN] {
        let idx = upload(&ctx.device, stream, &i32s(&[0, 7, bad, 3]))?;
        stream.run_op(&Op::Gather {
            table: t(&table, dt, &[8, 4])?,
            indices: t(&idx, DType::I32, &[4])?,
            out: t(&out, dt, &[4, 4])?,
        })?;
        match stream.synchronize() {
            Ok(()) => {
                return Err(CaseError::fail(format!(
                    "a gather with index {bad} (table of 8 rows) at position 2 succeeded"
                )))
            }
            Err(e) => {
                let m = full_message(&e);
                ensure(m.contains('2') && m.contains(&bad.to_string()), || {
                    format!("the error of a gather with index {bad} at position 2 does not name both: {m}")
                })?;
            }
        }
        ensure(stream.read(&out)? == f32s(&[9.0; 32]), || {
            format!("a gather with index {bad} out of range wrote its output")
        })?;
        // The stream is usable again.
        stream.synchronize()?;
    }
    let idx = upload(&ctx.device, stream, &i32s(&[0, 1, 9]))?;
    if lists(ctx, OpKind::ScatterAdd, dt) {
        stream.run_op(&Op::ScatterAdd {
            src: t(&out, dt, &[3, 4])?,
            indices: t(&idx, DType::I32, &[3])?,
            table: t(&table, dt, &[8, 4])?,
        })?;
        ensure(stream.synchronize().is_err(), || {
            "a scatter-add with index 9 into 8 rows succeeded".to_string()
        })?;
        ensure(stream.read(&table)? == f32s(&[2.0; 32]), || {
            "a scatter-add with an index out of range added some rows".to_string()
        })?;
    }
    Ok(())
}

fn label_failures(ctx: &CaseContext, stream: &Stream) -> CaseOutcome {
    let dt = DType::F32;
    let logits = upload(&ctx.device, stream, &f32s(&[0.5; 12]))?;
    let loss = upload(&ctx.device, stream, &f32s(&[9.0; 3]))?;
    let labels = upload(&ctx.device, stream, &i32s(&[1, 4, -1]))?;
    stream.run_op(&Op::CrossEntropy {
        logits: t(&logits, dt, &[3, 4])?,
        labels: t(&labels, DType::I32, &[3])?,
        loss: t(&loss, dt, &[3])?,
    })?;
    match stream.synchronize() {
        Ok(()) => Err(CaseError::fail(
            "cross-entropy with label 4 of 4 classes succeeded",
        )),
        Err(e) => {
            let m = full_message(&e);
            ensure(m.contains("row 1") && m.contains('4'), || {
                format!("the error of cross-entropy with label 4 of 4 classes in row 1 does not name both: {m}")
            })?;
            ensure(stream.read(&loss)? == f32s(&[9.0; 3]), || {
                "cross-entropy with a label out of range wrote its loss".to_string()
            })
        }
    }
}

fn parameter_refusals(ctx: &CaseContext, stream: &Stream) -> CaseOutcome {
    let dt = DType::F32;
    let a = upload(&ctx.device, stream, &f32s(&[1.0; 16]))?;
    let b = upload(&ctx.device, stream, &f32s(&[1.0; 16]))?;
    for p in [1.0f32, -0.1, f32::NAN] {
        expect_invalid(
            stream.run_op(&Op::Dropout {
                x: t(&a, dt, &[16])?,
                y: t(&b, dt, &[16])?,
                p,
                seed: 0,
                offset: 0,
            }),
            &format!("dropout with p = {p}"),
        )?;
    }
    let c = upload(&ctx.device, stream, &f32s(&[0.0; 16]))?;
    let d = upload(&ctx.device, stream, &f32s(&[0.0; 16]))?;
    for (beta1, eps, step, what) in [
        (0.9f32, 1e-8f32, 0u32, "step 0"),
        (1.0, 1e-8, 1, "beta1 = 1"),
        (0.9, 0.0, 1, "eps = 0"),
    ] {
        expect_invalid(
            stream.run_op(&Op::AdamW {
                param: t(&a, dt, &[16])?,
                grad: t(&b, dt, &[16])?,
                m: t(&c, dt, &[16])?,
                v: t(&d, dt, &[16])?,
                lr: 1e-3,
                beta1,
                beta2: 0.999,
                eps,
                weight_decay: 0.0,
                step,
            }),
            &format!("adamw with {what}"),
        )?;
    }
    Ok(())
}
