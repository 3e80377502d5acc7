//! Fill: every dtype, every element, at offsets, neighbours untouched; and the dtypes a
//! device does not support.

use xpu_hal::{bf16, f16, DType, Scalar};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{check_bytes, encode, expect_unsupported, pattern, upload};

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "fill.every_dtype",
        "fill writes its value to every element for every supported dtype, at offsets, leaving neighbours untouched",
        every_dtype,
    ),
    Case::core(
        "fill.unsupported_dtype",
        "builtin operations on a dtype the device does not list are unsupported errors",
        unsupported_dtype,
    ),
];

/// Values whose bytes are all different from each other and from zero.
fn values(dtype: DType) -> Vec<Scalar> {
    match dtype {
        DType::F32 => vec![Scalar::F32(-1.5), Scalar::F32(3.0e38), Scalar::F32(1.0e-40)],
        DType::F64 => vec![
            Scalar::F64(1.0e300),
            Scalar::F64(-0.1),
            Scalar::F64(5.0e-324),
        ],
        DType::F16 => vec![
            Scalar::F16(f16::from_f32(-0.333)),
            Scalar::F16(f16::MAX),
            Scalar::F16(f16::from_bits(0x0001)),
        ],
        DType::BF16 => vec![
            Scalar::BF16(bf16::from_f32(3.140625)),
            Scalar::BF16(bf16::MIN),
            Scalar::BF16(bf16::from_bits(0x0001)),
        ],
        DType::I32 => vec![
            Scalar::I32(-123_456_789),
            Scalar::I32(i32::MAX),
            Scalar::I32(0x0102_0304),
        ],
        DType::I64 => vec![
            Scalar::I64(i64::MIN + 7),
            Scalar::I64(0x0102_0304_0506_0708),
            Scalar::I64(-2),
        ],
        DType::U8 => vec![Scalar::U8(0xA5), Scalar::U8(0xFF), Scalar::U8(1)],
    }
}

fn every_dtype(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let mut tested = 0;
    for dtype in DType::ALL {
        if !ctx.device.capabilities().supports_dtype(dtype) {
            continue;
        }
        tested += 1;
        let size = dtype.size();
        for (i, value) in values(dtype).into_iter().enumerate() {
            for &(offset_elems, count) in &[(0usize, 1usize), (5, 7), (3, 1001)] {
                let total = offset_elems + count + 4;
                let background = pattern(i as u64 * 31 + count as u64, total * size);
                let dev = upload(&ctx.device, &stream, &background)?;
                stream.fill(
                    dev.slice((offset_elems * size) as u64, (count * size) as u64),
                    value,
                )?;
                let got = stream.read(&dev)?;
                let mut want = background;
                let bytes = encode(&[value]);
                for e in offset_elems..offset_elems + count {
                    want[e * size..(e + 1) * size].copy_from_slice(&bytes);
                }
                check_bytes(
                    &got,
                    &want,
                    &format!(
                        "fill of {count} {dtype} elements with {value} at element {offset_elems} of {total}"
                    ),
                )?;
            }
        }
    }
    if tested == 0 {
        return Err(CaseError::fail("the device lists no dtypes to fill"));
    }
    Ok(())
}

fn unsupported_dtype(ctx: &CaseContext) -> CaseOutcome {
    let caps = ctx.device.capabilities();
    let Some(missing) = DType::ALL.into_iter().find(|d| !caps.supports_dtype(*d)) else {
        return Err(CaseError::skip(
            "device supports every dtype, so there is none to refuse",
        ));
    };
    let stream = ctx.device.create_stream()?;
    let a = ctx.device.allocate(64)?;
    let b = ctx.device.allocate(64)?;
    let value = crate::reference::from_i64(missing, 1);
    expect_unsupported(
        stream.fill(&a, value),
        &format!("a fill with an unsupported {missing} value"),
    )?;
    expect_unsupported(
        stream.binary(xpu_hal::BinaryOp::Sum, missing, &a, &b, &a),
        &format!("a binary sum on unsupported {missing}"),
    )?;
    expect_unsupported(
        stream.scale(&a, &b, value),
        &format!("a scale by an unsupported {missing} factor"),
    )?;
    if let Some(supported) = caps.dtypes.first().copied() {
        let n = 64 / supported.size().max(missing.size()) as u64;
        expect_unsupported(
            stream.cast(
                a.slice(0, n * supported.size() as u64),
                supported,
                b.slice(0, n * missing.size() as u64),
                missing,
            ),
            &format!("a cast from {supported} to unsupported {missing}"),
        )?;
    }
    stream.synchronize()?;
    Ok(())
}
