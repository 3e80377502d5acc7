//! Standard operations as tasks: results equal to the HAL's reference on every device
//! mix, accesses derived from the operation, and bad operations refused at submission.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{devices, options};
use xpu_hal::ops::{Layout, Op};
use xpu_hal::{DType, HostBuffer};
use xpu_scheduler::{AccessMode, Policy, Scheduler, Task, TensorRef};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        })
        .collect()
}

fn matmul_ref(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
            c[i * n + j] = s as f32;
        }
    }
    c
}

/// `out[.., n..2n] = relu(x·w1)·w2` through views at offsets and an in-place ReLU, on
/// `sel`'s devices under `policy`; checked against plain loops.
fn two_layers(sel: &str, policy: Policy) {
    let Some(devs) = devices(sel) else {
        return;
    };
    let (m, k, h, n) = (33usize, 17usize, 24usize, 9usize);
    let (x, w1, w2) = (data(m * k, 1), data(k * h, 2), data(h * n, 3));
    let sched = Scheduler::new(&devs, options(policy)).unwrap();
    let reg = |v: &[f32]| {
        sched
            .register(HostBuffer::from_bytes(&f32_bytes(v)).unwrap())
            .unwrap()
    };
    let (hx, hw1, hw2) = (reg(&x), reg(&w1), reg(&w2));
    // `act` holds a scratch row of 7 floats before the hidden activations.
    let act = sched.create(((7 + m * h) * 4) as u64).unwrap();
    let out = sched
        .register(HostBuffer::from_bytes(&f32_bytes(&vec![5.0; m * 2 * n])).unwrap())
        .unwrap();
    let hidden = TensorRef::strided(
        act,
        28,
        Layout::contiguous(DType::F32, &[m as u64, h as u64]).unwrap(),
    );
    let mm = |a: TensorRef, b: TensorRef, c: TensorRef| Op::Matmul {
        a,
        b,
        c,
        trans_a: false,
        trans_b: false,
        alpha: 1.0,
        beta: 0.0,
    };
    let t1 = Task::op(
        "test.mm1",
        mm(
            TensorRef::new(hx, DType::F32, &[m as u64, k as u64]).unwrap(),
            TensorRef::new(hw1, DType::F32, &[k as u64, h as u64]).unwrap(),
            hidden.clone(),
        ),
    )
    .unwrap();
    sched.submit(t1).unwrap();
    let relu = Task::op(
        "test.relu",
        Op::Relu {
            x: hidden.clone(),
            y: hidden.clone(),
        },
    )
    .unwrap();
    sched.submit(relu).unwrap();
    // The right half of each row of `out`: strides (2n, 1) at byte offset 4n.
    let right = TensorRef::strided(
        out,
        (n * 4) as u64,
        Layout::strided(DType::F32, &[m as u64, n as u64], &[2 * n as u64, 1]).unwrap(),
    );
    let t2 = Task::op(
        "test.mm2",
        mm(
            hidden,
            TensorRef::new(hw2, DType::F32, &[h as u64, n as u64]).unwrap(),
            right,
        ),
    )
    .unwrap();
    sched.submit(t2).unwrap();
    sched.wait_all().unwrap();
    let got = floats(&sched.read(out).unwrap());
    let mut want_h = matmul_ref(&x, &w1, m, k, h);
    want_h.iter_mut().for_each(|v| *v = v.max(0.0));
    let want_y = matmul_ref(&want_h, &w2, m, h, n);
    for r in 0..m {
        for c in 0..n {
            assert_eq!(
                got[r * 2 * n + c],
                5.0,
                "{sel}: left half of row {r} changed"
            );
            let (g, w) = (got[r * 2 * n + n + c], want_y[r * n + c]);
            assert!(
                (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "{sel}: [{r}, {c}] = {g}, want {w}"
            );
        }
    }
}

#[test]
fn operations_as_tasks_match_plain_loops_on_every_device_mix() {
    for sel in [
        "host:0",
        "host:0,1",
        "vulkan:0",
        "plugin.simnpu:0",
        "host:0;vulkan:0;plugin.simnpu:0",
    ] {
        for policy in [Policy::Dmda, Policy::Eager] {
            two_layers(sel, policy);
        }
    }
}

#[test]
fn accesses_follow_from_the_operation() {
    let Some(devs) = devices("host:0") else {
        return;
    };
    let sched = Scheduler::new(&devs, options(Policy::Dmda)).unwrap();
    let a = sched.create(64).unwrap();
    let b = sched.create(64).unwrap();
    let t16 = |h| TensorRef::new(h, DType::F32, &[16]).unwrap();
    let t8 = |h| TensorRef::new(h, DType::F32, &[8]).unwrap();
    let modes = |t: Task| -> Vec<AccessMode> { t.accesses().iter().map(|(_, m)| *m).collect() };
    use AccessMode::*;
    // A whole-handle output is a write; an input a read.
    let t = Task::op(
        "t",
        Op::Relu {
            x: t16(a),
            y: t16(b),
        },
    )
    .unwrap();
    assert_eq!(modes(t), [Read, Write]);
    // In place: one handle, read-write.
    let t = Task::op(
        "t",
        Op::Relu {
            x: t16(a),
            y: t16(a),
        },
    )
    .unwrap();
    assert_eq!(modes(t), [ReadWrite]);
    // Part of a handle: read-write, so the rest stays valid.
    let t = Task::op("t", Op::Relu { x: t8(a), y: t8(b) }).unwrap();
    assert_eq!(modes(t), [Read, ReadWrite]);
    // Matmul's `c` is read only when beta is not 0.
    let mm = |beta| {
        let m = |h| TensorRef::new(h, DType::F32, &[4, 4]).unwrap();
        let c = sched.create(64).unwrap();
        Task::op(
            "t",
            Op::Matmul {
                a: m(a),
                b: m(b),
                c: m(c),
                trans_a: false,
                trans_b: false,
                alpha: 1.0,
                beta,
            },
        )
        .unwrap()
    };
    assert_eq!(modes(mm(0.0)), [Read, Read, Write]);
    assert_eq!(modes(mm(1.0)), [Read, Read, ReadWrite]);
}

#[test]
fn bad_operations_are_refused_at_submission_with_the_reason() {
    let Some(devs) = devices("host:0") else {
        return;
    };
    let sched = Scheduler::new(&devs, options(Policy::Dmda)).unwrap();
    let a = sched.create(64).unwrap();
    let b = sched.create(32).unwrap();
    // Outside its handle.
    let e = Task::op(
        "t",
        Op::Relu {
            x: TensorRef::new(a, DType::F32, &[16]).unwrap(),
            y: TensorRef::new(b, DType::F32, &[16]).unwrap(),
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("`y` spans bytes 0..64"), "{e}");
    // Shapes that do not match.
    let e = Task::op(
        "t",
        Op::Relu {
            x: TensorRef::new(a, DType::F32, &[16]).unwrap(),
            y: TensorRef::new(b, DType::F32, &[8]).unwrap(),
        },
    )
    .unwrap_err();
    assert_eq!(e.kind(), "invalid-argument", "{e}");
    // An operation the device does not list: the C example lists ReLU on f32 only.
    if let Some(devs) = devices("plugin.minimal:0") {
        let sched = Scheduler::new(&devs, options(Policy::Dmda)).unwrap();
        let a = sched.create(128).unwrap();
        let b = sched.create(128).unwrap();
        let e = sched
            .submit(
                Task::op(
                    "t",
                    Op::Gelu {
                        x: TensorRef::new(a, DType::F32, &[32]).unwrap(),
                        y: TensorRef::new(b, DType::F32, &[32]).unwrap(),
                    },
                )
                .unwrap(),
            )
            .unwrap_err();
        assert!(e.to_string().contains("gelu"), "{e}");
    }
}
