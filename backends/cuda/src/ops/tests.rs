//! Unit tests of the pure parts (packing, grids, selection) and the host-C++ type check
//! of every module source. None of them runs a kernel.

use super::plan::{blocks_for, blocks_for_rows, checked, matmul_grid};
use super::*;
use xpu_hal::ops::{Distribution, Layout, ReduceOp};

fn l(dtype: DType, dims: &[u64]) -> Layout {
    Layout::contiguous(dtype, dims).unwrap()
}

#[test]
fn params_match_the_c_struct() {
    assert_eq!(std::mem::size_of::<OpParams>(), 704);
    assert_eq!(std::mem::align_of::<OpParams>(), 8);
    assert!(COMMON.contains("struct XpuOpParams {"));
    let mut p = OpParams::default();
    let t = l(DType::F32, &[2, 3]).transposed(0, 1).unwrap();
    p.set(1, &t, 0xABC0);
    assert_eq!(p.ptr[1], 0xABC0);
    assert_eq!(
        (p.rank[1], p.dims[1], p.strides[1]),
        (2, [3, 2, 0, 0], [1, 3, 0, 0])
    );
}

#[test]
fn grids_are_bounded_and_nonzero() {
    assert_eq!(blocks_for(1, 80), 1);
    assert_eq!(blocks_for(257, 80), 2);
    assert_eq!(blocks_for(u64::MAX / 2, 80), 80 * 32);
    assert_eq!(blocks_for(10, 0), 1);
    assert_eq!(blocks_for_rows(5, 80), 5);
    assert_eq!(blocks_for_rows(1 << 40, 4), 128);
    assert_eq!(matmul_grid(33, 17, 1), [2, 3, 1]);
    assert_eq!(matmul_grid(1 << 30, 1, 1 << 20), [1, 65_535, 65_535]);
}

#[test]
fn matmul_packs_shapes_transposes_and_scalars() {
    let (a, b, c) = (
        l(DType::F16, &[4, 7, 5]),
        l(DType::F16, &[4, 5, 9]),
        l(DType::F16, &[4, 7, 9]),
    );
    let op = Op::Matmul {
        a,
        b,
        c,
        trans_a: false,
        trans_b: false,
        alpha: 2.0,
        beta: 0.0,
    };
    let launches = plan(&op, |_| 0x1000, 80, 0).unwrap();
    assert_eq!(launches.len(), 1);
    let m = launches[0];
    assert_eq!(m.entry, Entry::Matmul);
    assert_eq!(m.params.size, [7, 9, 5, 4]);
    assert_eq!(m.params.f[..2], [2.0, 0.0]);
    assert_eq!(m.grid, [1, 1, 4]);
    let ta = l(DType::F32, &[5, 7]);
    let op = Op::Matmul {
        a: ta,
        b: l(DType::F32, &[9, 5]),
        c: l(DType::F32, &[7, 9]),
        trans_a: true,
        trans_b: true,
        alpha: 1.0,
        beta: 1.0,
    };
    let m = plan(&op, |_| 0, 80, 0).unwrap()[0];
    assert_eq!(
        (m.params.size, m.params.word[..2].to_vec()),
        ([7, 9, 5, 1], vec![1, 1])
    );
}

#[test]
fn indexed_operations_check_first() {
    let op = Op::Gather {
        table: l(DType::I64, &[10, 3]),
        indices: l(DType::I32, &[6]),
        out: l(DType::I64, &[6, 3]),
    };
    let launches = plan(&op, |t| t.elements(), 8, 0xFEED).unwrap();
    assert_eq!(
        launches.iter().map(|l| l.entry).collect::<Vec<_>>(),
        [Entry::CheckIndices, Entry::Gather]
    );
    let check = launches[0].params;
    assert_eq!(
        (check.size[0], check.word[0], check.word[3]),
        (10, 0, 0xFEED)
    );
    assert_eq!(check.ptr[0], 6, "the indices");
    assert_eq!(launches[1].params.word[3], 0xFEED);
    assert_eq!(launches[1].params.size[..2], [6, 3]);
    let op = Op::CrossEntropy {
        logits: l(DType::BF16, &[4, 11]),
        labels: l(DType::I32, &[4]),
        loss: l(DType::BF16, &[4]),
    };
    assert_eq!(checked(&op), Some(Checked::Labels { classes: 11 }));
    let launches = plan(&op, |_| 0, 8, 1).unwrap();
    assert_eq!(launches[0].params.word[0], 1, "-1 allowed");
    assert_eq!(launches[1].entry, Entry::CrossEntropy);
    assert_eq!(launches[1].grid, [4, 1, 1]);
    assert_eq!(
        checked(&Op::Relu {
            x: l(DType::F32, &[2]),
            y: l(DType::F32, &[2])
        }),
        None
    );
}

#[test]
fn selection_of_the_other_kernels() {
    let x = l(DType::F32, &[3, 4, 5]);
    let y = l(DType::F32, &[3, 1, 5]);
    let op = Op::Reduce {
        x,
        y,
        op: ReduceOp::Max,
        axis: 1,
    };
    let r = plan(&op, |_| 0, 8, 0).unwrap()[0];
    assert_eq!(
        (
            r.entry,
            r.params.size[..2].to_vec(),
            r.params.word[..2].to_vec()
        ),
        (Entry::Reduce, vec![4, 15], vec![1, 2])
    );
    let bits = Op::Random {
        y: l(DType::I32, &[9]),
        dist: Distribution::Bits,
        seed: 5,
        offset: 7,
    };
    let r = plan(&bits, |_| 0, 8, 0).unwrap()[0];
    assert_eq!(
        (r.entry, r.params.word[..2].to_vec()),
        (Entry::RandomBits, vec![5, 7])
    );
    let normal = Op::Random {
        y: l(DType::F64, &[9]),
        dist: Distribution::Normal {
            mean: 1.0,
            std: 2.0,
        },
        seed: 5,
        offset: 7,
    };
    let r = plan(&normal, |_| 0, 8, 0).unwrap()[0];
    assert_eq!(
        (r.entry, r.params.word[2], r.params.f[..2].to_vec()),
        (Entry::Random, 2, vec![1.0, 2.0])
    );
    let drop = Op::Dropout {
        x: l(DType::F32, &[9]),
        y: l(DType::F32, &[9]),
        p: 0.5,
        seed: 1,
        offset: 0,
    };
    let r = plan(&drop, |_| 0, 8, 0).unwrap()[0];
    assert_eq!(f64::from_bits(r.params.word[2]), 2.0);
    let lnb = Op::LayerNormBackward {
        x: l(DType::F32, &[6, 300]),
        gamma: l(DType::F32, &[300]),
        mean: l(DType::F32, &[6]),
        rstd: l(DType::F32, &[6]),
        dy: l(DType::F32, &[6, 300]),
        dx: l(DType::F32, &[6, 300]),
        dgamma: l(DType::F32, &[300]),
        dbeta: l(DType::F32, &[300]),
    };
    let v = plan(&lnb, |_| 0, 8, 0).unwrap();
    assert_eq!(
        v.iter().map(|l| (l.entry, l.grid[0])).collect::<Vec<_>>(),
        [
            (Entry::LayerNormBackwardRows, 6),
            (Entry::LayerNormBackwardParams, 2)
        ]
    );
    let adam = Op::AdamW {
        param: l(DType::F32, &[3]),
        grad: l(DType::F32, &[3]),
        m: l(DType::F32, &[3]),
        v: l(DType::F32, &[3]),
        lr: 0.1,
        beta1: 0.5,
        beta2: 0.75,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 2,
    };
    let r = plan(&adam, |_| 0, 8, 0).unwrap()[0];
    assert_eq!(f64::from_bits(r.params.word[0]), 0.75);
    assert_eq!(f64::from_bits(r.params.word[1]), 1.0 - 0.5625);
}

#[test]
fn listed_operations_follow_the_dtype_rules() {
    let ops = supported(90);
    assert_eq!(ops.len(), OpKind::ALL.len());
    let scatter = ops.iter().find(|s| s.kind == OpKind::ScatterAdd).unwrap();
    assert_eq!(scatter.dtypes, [DType::F32, DType::F64]);
    let old = supported(52);
    let scatter = old.iter().find(|s| s.kind == OpKind::ScatterAdd).unwrap();
    assert_eq!(scatter.dtypes, [DType::F32]);
    let gather = ops.iter().find(|s| s.kind == OpKind::Gather).unwrap();
    assert_eq!(gather.dtypes.len(), 7);
}

#[test]
fn every_entry_is_in_its_module() {
    for &d in &DType::ALL {
        let src = source(d, scatter_supported(d, 90));
        for e in Entry::ALL {
            let present = src.contains(&format!("extern \"C\" __global__ void {}(", e.name()));
            let expected = match e {
                Entry::CheckIndices | Entry::Gather | Entry::RandomBits => true,
                Entry::ScatterAdd => scatter_supported(d, 90),
                _ => is_float(d),
            };
            assert_eq!(present, expected, "{e:?} in the {d} module");
        }
        assert!(!src.contains("#include"));
    }
}

/// Every module source (each dtype, scatter included where provided) compiled as host
/// C++ with warnings as errors, through the builtins' shim (plus `__shared__`,
/// `__syncthreads`, `atomicAdd`, math): catches syntax and type errors NVRTC would
/// report. Also checks that `XpuOpParams` has `OpParams`' size. Skipped (with a
/// message) without a C++ compiler.
#[test]
fn every_op_kernel_compiles_as_host_cpp() {
    let dir = std::env::temp_dir().join(format!("xpu-cuda-ops-cpp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_default();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    for &d in &DType::ALL {
        let mut text = String::from(crate::builtins::source::HOST_SHIM);
        text.push_str(&source(d, scatter_supported(d, 90)));
        text.push_str(&format!(
            "\nstatic_assert(sizeof(XpuOpParams) == {}, \"OpParams mirrors XpuOpParams\");\nstatic_assert(sizeof(XpuIndexRecord) == {RECORD_BYTES}, \"record size\");\n",
            std::mem::size_of::<OpParams>()
        ));
        let file = dir.join(format!("ops_{d}.cpp"));
        if std::fs::write(&file, &text).is_err() {
            eprintln!("skipped: cannot write {}", file.display());
            return;
        }
        let out = std::process::Command::new(&cxx)
            .args([
                "-fsyntax-only",
                "-std=c++14",
                "-Wall",
                "-Werror",
                "-Wno-unused-function",
            ])
            .arg(&file)
            .output();
        match out {
            Ok(o) => assert!(
                o.status.success(),
                "{d}: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => {
                eprintln!("skipped: no C++ compiler `{cxx}`: {e}");
                break;
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
