//! Streams: in-order execution without synchronizing in between, many small
//! operations, several threads, and memory of another device.

use xpu_hal::{
    Access, BinaryOp, DType, HostArg, HostBuffer, KernelArg, KernelParam, LaunchDims, Scalar,
};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{
    check_bytes, check_values, encode, enqueue_slow_write, expect_invalid, hold, kernel_kind,
    pattern, portable_kernel, require_host_functions, small_values, upload, Rng, MIB, NUMERIC,
};
use crate::reference::{self, from_i64};

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "stream.order_builtin",
        "fill, binary, accumulate, scale, cast and a copy to the host queued without synchronizing run in order",
        order_builtin,
    ),
    Case::core(
        "stream.order_host_fn",
        "a copy queued after a slow host-function kernel sees what the kernel wrote",
        order_host_fn,
    ),
    Case::core(
        "stream.order_kernel",
        "a copy from the host, a device copy, two kernel launches (host function or WGSL), a device copy and a copy to the host queued without synchronizing run in order",
        order_kernel,
    ),
    Case::core(
        "stream.order_behind_wait",
        "large and small copies queued behind a held wait, and on a second stream behind an event of the first, run in order once released; nothing runs while held",
        order_behind_wait,
    ),
    Case::core(
        "stream.many_small_ops",
        "1000 small operations queued back to back all run, in order",
        many_small_ops,
    ),
    Case::core(
        "stream.threads_own_streams",
        "4 threads, each with its own stream on the device, submit and verify work at once",
        threads_own_streams,
    ),
    Case::core(
        "stream.threads_shared_stream",
        "4 threads submit to one shared stream at once; each thread's work stays in its order",
        threads_shared_stream,
    ),
    Case::core(
        "stream.foreign_memory",
        "memory of another device used on this device's stream is an invalid-argument error",
        foreign_memory,
    ),
];

fn order_builtin(ctx: &CaseContext) -> CaseOutcome {
    let dtype = ctx.pick_dtype(&NUMERIC)?;
    let s = dtype.size() as u64;
    let n = 333u64;
    let stream = ctx.device.create_stream()?;
    let a = ctx.device.allocate(n * s)?;
    let b = ctx.device.allocate(n * s)?;
    let c = ctx.device.allocate(n * s)?;
    // A second dtype for the cast, if the device has one.
    let target = NUMERIC
        .into_iter()
        .find(|d| *d != dtype && ctx.device.capabilities().supports_dtype(*d))
        .unwrap_or(dtype);
    let out = ctx.device.allocate(n * target.size() as u64)?;
    let mut host = HostBuffer::new((n * target.size() as u64) as usize)?;
    // ((3 + 4) * 3) * 2 = 42 in every dtype.
    stream.fill(&a, from_i64(dtype, 3))?;
    stream.fill(&b, from_i64(dtype, 4))?;
    stream.binary(BinaryOp::Sum, dtype, &a, &b, &c)?;
    stream.accumulate(BinaryOp::Prod, dtype, &c, &a)?;
    stream.scale(&c, &c, from_i64(dtype, 2))?;
    stream.cast(&c, dtype, &out, target)?;
    stream.copy_to_host(&out, &host, 0)?;
    stream.synchronize()?;
    let want = vec![from_i64(target, 42); n as usize];
    check_values(
        target,
        host.as_slice()?,
        &want,
        0,
        &format!(
            "fill 3 and 4, sum, multiply by 3, scale by 2 ({dtype}), cast to {target}, copy to host, one synchronize"
        ),
        |_| "((3 + 4) * 3) * 2".to_string(),
    )
}

fn order_host_fn(ctx: &CaseContext) -> CaseOutcome {
    require_host_functions(ctx)?;
    let stream = ctx.device.create_stream()?;
    let data = pattern(0x0D, 4097);
    let a = ctx.device.allocate(data.len() as u64)?;
    let b = ctx.device.allocate(data.len() as u64)?;
    let mut host = HostBuffer::new(data.len())?;
    enqueue_slow_write(&stream, &a, data.clone(), 20)?;
    stream.copy(&a, &b)?;
    stream.copy_to_host(&b, &host, 0)?;
    stream.synchronize()?;
    check_bytes(
        host.as_slice()?,
        &data,
        "a device copy and a copy to the host queued after a kernel that sleeps 20 ms, then writes",
    )
}

const MIX_WGSL: &str = "
struct Params { k: i32 }
var<immediate> params: Params;
@group(0) @binding(0) var<storage, read> src: array<i32>;
@group(0) @binding(1) var<storage, read_write> dst: array<i32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = gid.x; i < arrayLength(&dst); i += nwg.x * 64u) {
        dst[i] = dst[i] * 3 + src[i] + params.k;
    }
}
";

fn order_kernel(ctx: &CaseContext) -> CaseOutcome {
    let kind = kernel_kind(ctx)?;
    ctx.require_dtype(DType::I32)?;
    let stream = ctx.device.create_stream()?;
    // dst = dst * 3 + src + k, wrapping: k = 1 then k = 2 turns src into 13 src + 5
    // (the other order would give 13 src + 7).
    let kernel = portable_kernel(
        &ctx.device,
        kind,
        "conformance.mix",
        vec![
            KernelParam::Buffer(Access::Read),
            KernelParam::Buffer(Access::ReadWrite),
            KernelParam::Scalar(DType::I32),
        ],
        "main",
        MIX_WGSL,
        |k| {
            match k.split() {
            [HostArg::Read(src), HostArg::Write(dst), HostArg::Scalar(Scalar::I32(add))]
                if src.len() == dst.len() =>
            {
                let add = *add;
                for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                    let old = i32::from_le_bytes([d[0], d[1], d[2], d[3]]);
                    let s = i32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                    let new = old.wrapping_mul(3).wrapping_add(s).wrapping_add(add);
                    d.copy_from_slice(&new.to_le_bytes());
                }
                Ok(())
            }
            _ => Err("conformance.mix: arguments are not (read buffer, read-write buffer of the same length, i32)".to_string()),
        }
        },
    )?;
    let n = 65_537usize;
    let data = pattern(0x0E, n * 4);
    let values: Vec<i32> = data
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let bytes = data.len() as u64;
    let src = ctx.device.allocate(bytes)?;
    let dst = ctx.device.allocate(bytes)?;
    let out = ctx.device.allocate(bytes)?;
    let upload_from = HostBuffer::from_bytes(&data)?;
    let mut host = HostBuffer::new(data.len())?;
    let dims = LaunchDims::linear(64, 64);
    let args = |k: i32| {
        [
            KernelArg::Buffer(src.whole()),
            KernelArg::Buffer(dst.whole()),
            KernelArg::Scalar(Scalar::I32(k)),
        ]
    };
    stream.copy_from_host(&upload_from, 0, &src)?;
    stream.copy(&src, &dst)?;
    stream.launch(&kernel, dims, &args(1))?;
    stream.launch(&kernel, dims, &args(2))?;
    stream.copy(&dst, &out)?;
    stream.copy_to_host(&out, &host, 0)?;
    stream.synchronize()?;
    let want: Vec<Scalar> = values
        .iter()
        .map(|v| Scalar::I32(v.wrapping_mul(13).wrapping_add(5)))
        .collect();
    check_values(
        DType::I32,
        host.as_slice()?,
        &want,
        0,
        &format!(
            "copy in, copy, {kind} kernel dst = dst * 3 + src + 1, then + 2, copy, copy out, one synchronize"
        ),
        |i| format!("src {}, expected 13 src + 5", values[i]),
    )
}

fn many_small_ops(ctx: &CaseContext) -> CaseOutcome {
    let dtype = ctx.pick_dtype(&NUMERIC)?;
    let stream = ctx.device.create_stream()?;
    let n = 64usize;
    let mut rng = Rng::new(0x3E8);
    let start = small_values(&mut rng, dtype, n);
    let acc = upload(&ctx.device, &stream, &encode(&start))?;
    let one = ctx.device.allocate((n * dtype.size()) as u64)?;
    stream.fill(&one, from_i64(dtype, 1))?;
    let mut want = start.clone();
    // 1000 operations: 998 accumulates, a copy out and a copy back.
    let tmp = ctx.device.allocate(acc.size())?;
    for i in 0..998 {
        let op = if i % 100 == 99 {
            BinaryOp::Max
        } else {
            BinaryOp::Sum
        };
        stream.accumulate(op, dtype, &acc, &one)?;
        for w in &mut want {
            *w = reference::binary(op, *w, from_i64(dtype, 1)).unwrap_or(*w);
        }
    }
    stream.copy(&acc, &tmp)?;
    stream.copy(&tmp, &acc)?;
    stream.synchronize()?;
    check_values(
        dtype,
        &stream.read(&acc)?,
        &want,
        0,
        &format!("{dtype} accumulator after 998 queued accumulates of 1 and two copies"),
        |i| format!("{} plus 1, 998 times", start[i]),
    )
}

/// One thread's share of the threaded cases: its own data, through its own or a
/// shared stream. Returns the data it expects back.
fn thread_work(
    stream: &xpu_hal::Stream,
    dtype: DType,
    t: u64,
    acc: &xpu_hal::Allocation,
) -> Result<Vec<Scalar>, CaseError> {
    let n = 1000usize;
    let mut rng = Rng::new(0x7700 + t);
    let values = small_values(&mut rng, dtype, n);
    let host = HostBuffer::from_bytes(&encode(&values))?;
    let mut want = values.clone();
    stream.copy_from_host(&host, 0, acc)?;
    for k in 0..25 {
        let factor = from_i64(dtype, (k % 3) as i64 + 1);
        stream.scale(acc, acc, factor)?;
        stream.accumulate(BinaryOp::Max, dtype, acc, acc)?;
        for w in &mut want {
            *w = reference::scale(*w, factor).unwrap_or(*w);
        }
    }
    Ok(want)
}

fn threaded(ctx: &CaseContext, shared: bool) -> CaseOutcome {
    // Integer or wide float dtypes keep the repeated scaling exact.
    let dtype = ctx.pick_dtype(&[DType::I32, DType::I64, DType::F64, DType::F32, DType::U8])?;
    let threads = 4u64;
    let shared_stream = ctx.device.create_stream()?;
    let mut accs = Vec::new();
    for _ in 0..threads {
        accs.push(ctx.device.allocate(1000 * dtype.size() as u64)?);
    }
    let results: Vec<Result<(Vec<Scalar>, xpu_hal::Stream), CaseError>> =
        std::thread::scope(|scope| {
            let handles: Vec<_> = accs
                .iter()
                .enumerate()
                .map(|(t, acc)| {
                    let shared_stream = shared_stream.clone();
                    scope.spawn(move || {
                        let stream = if shared {
                            shared_stream
                        } else {
                            ctx.device.create_stream()?
                        };
                        let want = thread_work(&stream, dtype, t as u64, acc)?;
                        if !shared {
                            stream.synchronize()?;
                        }
                        Ok((want, stream))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(CaseError::fail("a submitting thread panicked")))
                })
                .collect()
        });
    shared_stream.synchronize()?;
    let how = if shared {
        "one shared stream"
    } else {
        "its own stream"
    };
    for (t, (result, acc)) in results.into_iter().zip(&accs).enumerate() {
        let (want, stream) = result?;
        check_values(
            dtype,
            &stream.read(acc)?,
            &want,
            0,
            &format!("thread {t} of {threads}, submitting 51 {dtype} operations through {how}"),
            |_| "its values scaled 25 times".to_string(),
        )?;
    }
    Ok(())
}

fn threads_own_streams(ctx: &CaseContext) -> CaseOutcome {
    ctx.require_streams(5)?;
    threaded(ctx, false)
}

fn threads_shared_stream(ctx: &CaseContext) -> CaseOutcome {
    threaded(ctx, true)
}

fn foreign_memory(ctx: &CaseContext) -> CaseOutcome {
    let peer = ctx.require_peer()?;
    let dtype = ctx.pick_dtype(&NUMERIC)?;
    let stream = ctx.device.create_stream()?;
    let peer_stream = peer.create_stream()?;
    let data = pattern(0xF0, 64);
    let local = upload(&ctx.device, &stream, &data)?;
    let foreign = upload(peer, &peer_stream, &data)?;
    let host = HostBuffer::new(64)?;
    let on = format!("memory of {} on a stream of {}", peer.id(), ctx.device.id());
    expect_invalid(
        stream.copy_from_host(&host, 0, &foreign),
        &format!("a host-to-device copy into {on}"),
    )?;
    expect_invalid(
        stream.copy_to_host(&foreign, &host, 0),
        &format!("a device-to-host copy from {on}"),
    )?;
    expect_invalid(
        stream.copy(&foreign, &local),
        &format!("a device copy from {on}"),
    )?;
    expect_invalid(
        stream.copy(&local, &foreign),
        &format!("a device copy into {on}"),
    )?;
    if peer.capabilities().supports_dtype(dtype) {
        expect_invalid(
            stream.fill(&foreign, from_i64(dtype, 1)),
            &format!("a fill of {on}"),
        )?;
        expect_invalid(
            stream.accumulate(BinaryOp::Sum, dtype, &local, &foreign),
            &format!("an accumulate reading {on}"),
        )?;
    }
    check_bytes(
        &stream.read(&local)?,
        &data,
        "local memory after refused operations",
    )?;
    check_bytes(
        &peer_stream.read(&foreign)?,
        &data,
        "the other device's memory after refused operations",
    )
}

fn order_behind_wait(ctx: &CaseContext) -> CaseOutcome {
    ctx.require_streams(2)?;
    let a = ctx.device.create_stream()?;
    let b = ctx.device.create_stream()?;
    let big = (4 * MIB)
        .min(ctx.device.capabilities().max_allocation / 2)
        .max(64);
    let n = big as usize;
    let first = pattern(0x0B1, n);
    let patch = pattern(0x0B2, 13);
    let x = upload(&ctx.device, &a, &vec![0; n])?;
    let y = upload(&ctx.device, &a, &vec![0; n])?;
    let up = HostBuffer::from_bytes(&first)?;
    let small = HostBuffer::from_bytes(&patch)?;
    let mut down = HostBuffer::new(n)?;
    let gate = hold(&a)?;
    // Large, small over it, large again from the result, then the second stream.
    a.copy_from_host(&up, 0, &x)?;
    a.copy_from_host(&small, 0, x.slice(7, 13))?;
    a.copy(&x, &y)?;
    a.copy_from_host(&small, 0, x.slice(big - 13, 13))?;
    let ea = a.record_event()?;
    b.wait_event(&ea)?;
    b.copy_to_host(&y, &down, 0)?;
    let eb = b.record_event()?;
    // Held: nothing after the wait may have run, on either stream.
    let early = eb.wait_timeout(std::time::Duration::from_millis(30));
    gate.open();
    match early {
        Err(xpu_hal::Error::Timeout { .. }) => {}
        Ok(()) => {
            return Err(CaseError::fail(format!(
                "work queued behind a held stream ({}) finished before it was released",
                gate.how()
            )))
        }
        Err(e) => return Err(e.into()),
    }
    b.synchronize()?;
    a.synchronize()?;
    let mut want_y = first.clone();
    want_y[7..20].copy_from_slice(&patch);
    check_bytes(
        down.as_slice()?,
        &want_y,
        "a large copy made after a small one over it, read on a second stream after an event of the first",
    )?;
    let mut want_x = want_y;
    want_x[n - 13..].copy_from_slice(&patch);
    check_bytes(
        &a.read(&x)?,
        &want_x,
        "a small copy queued after a large copy that read the same allocation",
    )
}
