//! Batches: operations gathered and enqueued as one submission, and batches kept to be
//! enqueued again over other memory.

use xpu_hal::{Allocation, BinaryOp, DType, HostBuffer, Scalar, Stream};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{
    check_values, encode, expect_invalid, small_values, upload, Rng, NUMERIC,
};
use crate::reference::{self, from_i64};

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "batch.order",
        "fill, binary, accumulate, scale and cast added to a batch run in order once it is submitted; a refused operation is left out and a dropped batch runs nothing",
        order,
    ),
    Case::core(
        "batch.kept_rebinds",
        "a batch kept over three allocations computes the same operations over other allocations of the same sizes, as often as it is submitted",
        kept_rebinds,
    ),
    Case::core(
        "batch.kept_refused",
        "keeping a batch without all its memory, or submitting a kept batch with the wrong number, sizes or repeated allocations, is an invalid-argument error and enqueues nothing",
        kept_refused,
    ),
];

fn order(ctx: &CaseContext) -> CaseOutcome {
    let dtype = ctx.pick_dtype(&NUMERIC)?;
    let s = dtype.size() as u64;
    let n = 333u64;
    let stream = ctx.device.create_stream()?;
    let a = ctx.device.allocate(n * s)?;
    let b = ctx.device.allocate(n * s)?;
    let c = ctx.device.allocate(n * s)?;
    let short = ctx.device.allocate((n - 1) * s)?;
    let target = NUMERIC
        .into_iter()
        .find(|d| *d != dtype && ctx.device.capabilities().supports_dtype(*d))
        .unwrap_or(dtype);
    let out = ctx.device.allocate(n * target.size() as u64)?;
    stream.fill(&a, from_i64(dtype, 5))?;
    // Dropped without submitting: `a` keeps 5.
    {
        let mut dropped = stream.batch();
        dropped.fill(&a, from_i64(dtype, 9))?;
    }
    // ((5 + 4) * 5) * 2 = 90 in every dtype.
    let mut batch = stream.batch();
    batch.fill(&b, from_i64(dtype, 4))?;
    batch.binary(BinaryOp::Sum, dtype, &a, &b, &c)?;
    expect_invalid(
        batch.binary(BinaryOp::Sum, dtype, &a, &b, &short),
        "a binary operation whose destination is one element short, added to a batch",
    )?;
    batch.accumulate(BinaryOp::Prod, dtype, &c, &a)?;
    batch.scale(&c, &c, from_i64(dtype, 2))?;
    batch.cast(&c, dtype, &out, target)?;
    if batch.len() != 5 {
        return Err(CaseError::fail(format!(
            "a batch given 5 valid operations and 1 refused one holds {}",
            batch.len()
        )));
    }
    batch.submit()?;
    let mut host = HostBuffer::new((n * target.size() as u64) as usize)?;
    stream.copy_to_host(&out, &host, 0)?;
    stream.synchronize()?;
    check_values(
        target,
        host.as_slice()?,
        &vec![from_i64(target, 90); n as usize],
        0,
        &format!(
            "fill 5, a dropped batch filling 9, then one batch: fill 4, sum, multiply by 5, scale by 2 ({dtype}), cast to {target}"
        ),
        |_| "((5 + 4) * 5) * 2".to_string(),
    )
}

/// `z = max(x + y, x) * 2`, as a batch over `x`, `y`, `z` on `stream`.
fn formula(
    stream: &Stream,
    dtype: DType,
    x: &Allocation,
    y: &Allocation,
    z: &Allocation,
) -> xpu_hal::Result<xpu_hal::KeptBatch> {
    let mut batch = stream.batch();
    batch.binary(BinaryOp::Sum, dtype, x, y, z)?;
    batch.accumulate(BinaryOp::Max, dtype, z, x)?;
    batch.scale(z, z, from_i64(dtype, 2))?;
    batch.keep(&[x, y, z])
}

/// What [`formula`] computes, element by element.
fn expected(dtype: DType, x: &[Scalar], y: &[Scalar]) -> Vec<Scalar> {
    x.iter()
        .zip(y)
        .map(|(a, b)| {
            let sum = reference::binary(BinaryOp::Sum, *a, *b).unwrap_or(*a);
            let max = reference::binary(BinaryOp::Max, sum, *a).unwrap_or(sum);
            reference::scale(max, from_i64(dtype, 2)).unwrap_or(max)
        })
        .collect()
}

fn kept_rebinds(ctx: &CaseContext) -> CaseOutcome {
    let dtype = ctx.pick_dtype(&NUMERIC)?;
    let n = 257usize;
    let stream = ctx.device.create_stream()?;
    let mut rng = Rng::new(0xBA7C);
    let sets: Vec<(Vec<Scalar>, Vec<Scalar>)> = (0..3)
        .map(|_| {
            (
                small_values(&mut rng, dtype, n),
                small_values(&mut rng, dtype, n),
            )
        })
        .collect();
    let mut memory = Vec::new();
    for (x, y) in &sets {
        memory.push((
            upload(&ctx.device, &stream, &encode(x))?,
            upload(&ctx.device, &stream, &encode(y))?,
            ctx.device.allocate((n * dtype.size()) as u64)?,
        ));
    }
    let (x0, y0, z0) = &memory[0];
    let kept = formula(&stream, dtype, x0, y0, z0)?;
    if kept.len() != 3 {
        return Err(CaseError::fail(format!(
            "a batch of 3 operations was kept with {}",
            kept.len()
        )));
    }
    // Keeping enqueues nothing: z0 is filled first and must be overwritten later only.
    // Every set, the last one twice (the same memory bound again).
    for (x, y, z) in memory.iter().chain(memory.last()) {
        stream.submit_kept(&kept, &[x, y, z])?;
    }
    stream.synchronize()?;
    for (k, ((x, y), (_, _, z))) in sets.iter().zip(&memory).enumerate() {
        check_values(
            dtype,
            &stream.read(z)?,
            &expected(dtype, x, y),
            0,
            &format!(
                "set {k} of 3 through a batch kept over set 0: z = max(x + y, x) * 2 ({dtype})"
            ),
            |i| format!("x {}, y {}", x[i], y[i]),
        )?;
        check_values(
            dtype,
            &stream.read(&memory[k].0)?,
            x,
            0,
            &format!("set {k}: x, only read by the kept batch"),
            |_| "unchanged".to_string(),
        )?;
    }
    Ok(())
}

fn kept_refused(ctx: &CaseContext) -> CaseOutcome {
    let dtype = ctx.pick_dtype(&NUMERIC)?;
    let n = 64u64;
    let bytes = n * dtype.size() as u64;
    let stream = ctx.device.create_stream()?;
    let (x, y, z) = (
        ctx.device.allocate(bytes)?,
        ctx.device.allocate(bytes)?,
        ctx.device.allocate(bytes)?,
    );
    let other = ctx.device.allocate(bytes)?;
    let longer = ctx.device.allocate(bytes + dtype.size() as u64)?;
    stream.fill(&x, from_i64(dtype, 1))?;
    stream.fill(&y, from_i64(dtype, 2))?;
    stream.fill(&z, from_i64(dtype, 7))?;
    // Keeping without all the memory the operations use, or with one listed twice.
    let mut batch = stream.batch();
    batch.binary(BinaryOp::Sum, dtype, &x, &y, &z)?;
    expect_invalid(
        batch.keep(&[&x, &z]),
        "keeping a batch over x and z when an operation also reads y",
    )?;
    let mut batch = stream.batch();
    batch.binary(BinaryOp::Sum, dtype, &x, &y, &z)?;
    expect_invalid(
        batch.keep(&[&x, &y, &z, &x]),
        "keeping a batch with x listed twice",
    )?;
    let kept = formula(&stream, dtype, &x, &y, &z)?;
    expect_invalid(
        stream.submit_kept(&kept, &[&x, &y]),
        "submitting a kept batch of 3 slots with 2 allocations",
    )?;
    expect_invalid(
        stream.submit_kept(&kept, &[&x, &y, &longer]),
        "submitting a kept batch with a slot bound to a larger allocation",
    )?;
    expect_invalid(
        stream.submit_kept(&kept, &[&x, &x, &z]),
        "submitting a kept batch with one allocation bound to two slots",
    )?;
    // None of that ran: z still holds 7; then a valid submission computes.
    let untouched = stream.read(&z)?;
    check_values(
        dtype,
        &untouched,
        &vec![from_i64(dtype, 7); n as usize],
        0,
        "z after refused keeps and submissions",
        |_| "the 7 it was filled with".to_string(),
    )?;
    stream.submit_kept(&kept, &[&x, &y, &other])?;
    stream.synchronize()?;
    let ones = vec![from_i64(dtype, 1); n as usize];
    let twos = vec![from_i64(dtype, 2); n as usize];
    check_values(
        dtype,
        &stream.read(&other)?,
        &expected(dtype, &ones, &twos),
        0,
        "a kept batch submitted after refused submissions: max(1 + 2, 1) * 2",
        |_| "x 1, y 2".to_string(),
    )
}
