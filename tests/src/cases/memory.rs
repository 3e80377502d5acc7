//! Allocation and release: sizes, zero size, double free, use after free, running out
//! of memory, accounting, freeing memory that queued work still uses, and growable
//! allocations (`Device::allocate_growable` / `Allocation::resize`).

use std::time::Duration;

use xpu_hal::{BinaryOp, DType, Error, HostBuffer, MemoryInfo};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{
    check_bytes, encode, ensure, expect_invalid, expect_oom, expect_unsupported, hold, pattern,
    upload, Rng, ACCOUNTING_ATTEMPTS, MIB,
};
use crate::reference::from_i64;

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "memory.allocate_free",
        "allocations of 1, 3, 4097 and 1 MiB + 13 bytes report their size, hold data, and free once",
        allocate_free,
    ),
    Case::core(
        "memory.zero_size",
        "a zero-size allocation and empty ranges work with every operation, and free like any other",
        zero_size,
    ),
    Case::core(
        "memory.double_free",
        "freeing an allocation twice is an invalid-argument error",
        double_free,
    ),
    Case::core(
        "memory.use_after_free",
        "using a freed allocation in any operation is an invalid-argument error",
        use_after_free,
    ),
    Case::core(
        "memory.over_capacity",
        "asking for more than the device holds is out-of-memory, and the device keeps working",
        over_capacity,
    ),
    Case::core(
        "memory.fragmentation",
        "after 400 allocations of odd sizes freed in a shuffled order, some reallocated, free memory is back to its starting value to the byte",
        fragmentation,
    ).alone(),
    Case::core(
        "memory.threads",
        "8 threads allocating odd sizes, copying through them on streams of their own and freeing at once keep every byte and give all the memory back",
        threads,
    ).alone(),
    Case::core(
        "memory.accounting",
        "free memory drops by an allocation's size and comes back after free and after drop",
        accounting,
    ).alone(),
    Case::core(
        "memory.free_in_flight",
        "freeing memory that queued work still uses lets that work complete correctly",
        free_in_flight,
    ),
    Case::core(
        "memory.no_aliasing",
        "many live allocations of odd sizes hold distinct data",
        no_aliasing,
    ),
    Case::core(
        "memory.host_view",
        "a host-addressable device's memory reads and writes through its host view, which outlives free; other devices give no view",
        host_view,
    ),
    Case::core(
        "memory.growable_capability",
        "without virtual memory allocate_growable is unsupported; with it sizes round up to the granularity and plain allocations do not resize",
        growable_capability,
    ),
    Case::core(
        "memory.growable_keeps_contents",
        "growing an allocation in place keeps the bytes it already held, and the grown range holds data",
        growable_keeps_contents,
    ),
    Case::core(
        "memory.growable_ops",
        "copies and fills work on the grown range of a growable allocation",
        growable_ops,
    ),
    Case::core(
        "memory.growable_shrink",
        "shrinking keeps the bytes below the new size, refuses operations beyond it, and the allocation grows again",
        growable_shrink,
    ),
    Case::core(
        "memory.growable_refused_sizes",
        "resizing to a size that is not a multiple of the granularity, to 0 or above the reservation is an invalid-argument error that changes nothing",
        growable_refused_sizes,
    ),
    Case::core(
        "memory.growable_accounting",
        "free memory drops by what a growable allocation grows and comes back when it shrinks and when it is freed",
        growable_accounting,
    ).alone(),
    Case::core(
        "memory.growable_resize_after_free",
        "resizing a freed growable allocation is an invalid-argument error",
        growable_resize_after_free,
    ),
];

fn allocate_free(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    for (i, size) in [1u64, 3, 4097, MIB + 13].into_iter().enumerate() {
        let a = ctx.device.allocate(size)?;
        ensure(a.size() == size, || {
            format!(
                "allocate({size}) returned an allocation of {} bytes",
                a.size()
            )
        })?;
        ensure(a.device() == ctx.device.id(), || {
            format!(
                "allocation on {} reports device {}",
                ctx.device.id(),
                a.device()
            )
        })?;
        let data = pattern(100 + i as u64, size as usize);
        stream.write(&a, &data)?;
        check_bytes(
            &stream.read(&a)?,
            &data,
            &format!("read back of a {size}-byte allocation"),
        )?;
        let clone = a.clone();
        a.free()?;
        ensure(clone.is_freed(), || {
            format!("after free, a clone of the {size}-byte allocation does not report it freed")
        })?;
    }
    Ok(())
}

fn zero_size(ctx: &CaseContext) -> CaseOutcome {
    let dtype = ctx.pick_dtype(&DType::ALL)?;
    let stream = ctx.device.create_stream()?;
    let empty = ctx.device.allocate(0)?;
    ensure(empty.size() == 0, || {
        format!("allocate(0) returned {} bytes", empty.size())
    })?;
    let empty2 = ctx.device.allocate(0)?;
    let full = upload(&ctx.device, &stream, &pattern(7, 64))?;
    let host = HostBuffer::new(0)?;
    let mut host8 = HostBuffer::from_bytes(&[0xEE; 8])?;
    stream.copy_from_host(&host, 0, &empty)?;
    stream.copy_to_host(&empty, &host, 0)?;
    stream.copy_to_host(&empty, &host8, 8)?;
    stream.copy(&empty, &empty2)?;
    stream.copy(full.slice(8, 0), empty.whole())?;
    stream.fill(&empty, from_i64(dtype, 1))?;
    stream.fill(full.slice(16, 0), from_i64(dtype, 1))?;
    stream.binary(BinaryOp::Sum, dtype, &empty, &empty2, &empty)?;
    stream.accumulate(BinaryOp::Max, dtype, full.slice(0, 0), &empty)?;
    stream.scale(&empty, &empty2, from_i64(dtype, 2))?;
    stream.cast(&empty, dtype, &empty2, dtype)?;
    stream.synchronize()?;
    ensure(stream.read(&empty)?.is_empty(), || {
        "reading a zero-size allocation returned bytes".to_string()
    })?;
    check_bytes(
        host8.as_slice()?,
        &[0xEE; 8],
        "a host buffer after an empty copy into it",
    )?;
    check_bytes(
        &stream.read(&full)?,
        &pattern(7, 64),
        "an allocation after empty operations on slices of it",
    )?;
    empty.free()?;
    expect_invalid(empty.free(), "freeing a zero-size allocation twice")?;
    expect_invalid(
        stream.fill(&empty, from_i64(dtype, 1)),
        "fill into a freed zero-size allocation",
    )
}

fn double_free(ctx: &CaseContext) -> CaseOutcome {
    let a = ctx.device.allocate(256)?;
    let clone = a.clone();
    a.free()?;
    expect_invalid(a.free(), "the second free of an allocation")?;
    expect_invalid(clone.free(), "freeing a clone of a freed allocation")?;
    // The device still allocates and frees afterwards.
    ctx.device.allocate(256)?.free()?;
    Ok(())
}

fn use_after_free(ctx: &CaseContext) -> CaseOutcome {
    let dtype = ctx.pick_dtype(&DType::ALL)?;
    let stream = ctx.device.create_stream()?;
    let live = upload(&ctx.device, &stream, &pattern(3, 64))?;
    let freed = ctx.device.allocate(64)?;
    freed.free()?;
    let host = HostBuffer::new(64)?;
    expect_invalid(
        stream.copy_from_host(&host, 0, &freed),
        "a host-to-device copy into freed memory",
    )?;
    expect_invalid(
        stream.copy_to_host(&freed, &host, 0),
        "a device-to-host copy from freed memory",
    )?;
    expect_invalid(
        stream.copy(&freed, &live),
        "a device copy from freed memory",
    )?;
    expect_invalid(
        stream.copy(&live, &freed),
        "a device copy into freed memory",
    )?;
    expect_invalid(
        stream.fill(&freed, from_i64(dtype, 1)),
        "a fill of freed memory",
    )?;
    expect_invalid(
        stream.accumulate(BinaryOp::Sum, dtype, &live, &freed),
        "an accumulate reading freed memory",
    )?;
    expect_invalid(stream.read(&freed), "a read of freed memory")?;
    expect_invalid(stream.write(&freed, &[0; 64]), "a write to freed memory")?;
    // Nothing was enqueued by the refused calls; the live data is intact.
    check_bytes(
        &stream.read(&live)?,
        &pattern(3, 64),
        "a live allocation after refused operations on a freed one",
    )
}

fn over_capacity(ctx: &CaseContext) -> CaseOutcome {
    let bytes = ctx.device.info().memory_bytes;
    let max = ctx.device.capabilities().max_allocation;
    if let Some(size) = bytes.checked_add(1) {
        let result = ctx.device.allocate(size);
        if let Err(Error::OutOfMemory { requested, .. }) = &result {
            ensure(*requested == size, || {
                format!("the out-of-memory error for {size} bytes reports {requested} requested")
            })?;
        }
        expect_oom(
            result,
            &format!("allocate({size}), one byte more than the device holds"),
        )?;
    }
    expect_oom(ctx.device.allocate(u64::MAX), "allocate(u64::MAX)")?;
    if max < bytes {
        expect_oom(
            ctx.device.allocate(max + 1),
            &format!("allocate({}), one byte more than max_allocation", max + 1),
        )?;
    }
    let stream = ctx.device.create_stream()?;
    let data = pattern(11, 4096);
    let a = upload(&ctx.device, &stream, &data)?;
    check_bytes(
        &stream.read(&a)?,
        &data,
        "a 4096-byte allocation made after an out-of-memory error",
    )
}

fn info_or_skip(ctx: &CaseContext) -> Result<MemoryInfo, CaseError> {
    match ctx.device.memory_info() {
        Err(Error::Unsupported { message }) => Err(CaseError::skip(format!(
            "device does not report memory use ({message})"
        ))),
        other => Ok(other?),
    }
}

fn accounting(ctx: &CaseContext) -> CaseOutcome {
    let size = (8 * MIB)
        .min(ctx.device.capabilities().max_allocation / 4)
        .max(1);
    let mut last = String::new();
    for release_by_drop in [false, true] {
        let how = if release_by_drop { "drop" } else { "free" };
        let mut ok = false;
        for _ in 0..ACCOUNTING_ATTEMPTS {
            let before = info_or_skip(ctx)?;
            let a = ctx.device.allocate(size)?;
            let during = info_or_skip(ctx)?;
            if release_by_drop {
                drop(a);
            } else {
                a.free()?;
            }
            let after = info_or_skip(ctx)?;
            let drop_by = before.free.saturating_sub(during.free);
            let back_by = after.free.saturating_sub(during.free);
            if drop_by >= size && drop_by <= 2 * size && back_by >= size {
                ok = true;
                break;
            }
            last = format!(
                "allocating {size} bytes moved free memory from {} to {} (expected a drop of at least {size} and at most {}), and releasing it by {how} moved it to {} (expected a rise of at least {size})",
                before.free,
                during.free,
                2 * size,
                after.free
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        if !ok {
            return Err(CaseError::fail(format!(
                "{last} in each of {ACCOUNTING_ATTEMPTS} attempts"
            )));
        }
    }
    Ok(())
}

fn free_in_flight(ctx: &CaseContext) -> CaseOutcome {
    ctx.require_streams(2)?;
    let stream = ctx.device.create_stream()?;
    let other = ctx.device.create_stream()?;
    let size = 64 * 1024 + 5;
    let data = pattern(21, size);
    let src = upload(&ctx.device, &stream, &data)?;
    let mid = ctx.device.allocate(size as u64)?;
    let mut host = HostBuffer::new(size)?;
    // The stream is held so the frees below certainly happen while the copies are
    // queued.
    let gate = hold(&stream)?;
    stream.copy(&src, &mid)?;
    stream.copy_to_host(&mid, &host, 0)?;
    src.free()?;
    mid.free()?;
    // Reuse of the released memory, if the backend released it early, would show as
    // this pattern in the result.
    let mut fresh = Vec::new();
    for i in 0..4 {
        let garbage = pattern(900 + i, size);
        fresh.push(upload(&ctx.device, &other, &garbage)?);
    }
    gate.open();
    stream.synchronize()?;
    check_bytes(
        host.as_slice()?,
        &data,
        "data copied through allocations freed while the copies were queued",
    )
}

/// Free memory, as memory_info reports it, or a skip where the device reports none.
fn free_bytes(ctx: &CaseContext) -> Result<u64, CaseError> {
    Ok(info_or_skip(ctx)?.free)
}

/// Runs `round` until free memory after it equals free memory before it (other work
/// on the device may allocate or free meanwhile), at most [`ACCOUNTING_ATTEMPTS`]
/// times; fails with the last difference.
fn exact_accounting(
    ctx: &CaseContext,
    what: &str,
    mut round: impl FnMut(u64) -> CaseOutcome,
) -> CaseOutcome {
    let mut last = String::new();
    for attempt in 0..ACCOUNTING_ATTEMPTS as u64 {
        let before = free_bytes(ctx)?;
        round(attempt)?;
        let after = free_bytes(ctx)?;
        if after == before {
            return Ok(());
        }
        last = format!("free memory was {before} bytes before {what} and {after} after");
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(CaseError::fail(format!(
        "{last}, in each of {ACCOUNTING_ATTEMPTS} attempts"
    )))
}

fn fragmentation(ctx: &CaseContext) -> CaseOutcome {
    let max = ctx.device.capabilities().max_allocation.max(1);
    exact_accounting(
        ctx,
        "400 odd-sized allocations and their frees",
        |attempt| {
            let mut rng = Rng::new(0xF4A6 + attempt);
            let mut live = Vec::new();
            for i in 0..400u64 {
                // Mostly small and odd, some of a page and more, a few large.
                let size = match i % 10 {
                    0 => 4096 * (1 + rng.below(8)) + rng.below(3),
                    1 => (1 + rng.below(4)) * MIB / 2 + 1,
                    _ => 1 + rng.below(3000),
                }
                .min(max);
                live.push(ctx.device.allocate(size)?);
                // Free some at random as we go, so that holes open between live ones.
                if rng.below(3) == 0 {
                    let at = rng.below(live.len() as u64) as usize;
                    live.swap_remove(at).free()?;
                }
            }
            // Shuffled frees, with reallocations of other sizes into the holes.
            while !live.is_empty() {
                let at = rng.below(live.len() as u64) as usize;
                let a = live.swap_remove(at);
                let size = a.size();
                a.free()?;
                if rng.below(4) == 0 {
                    let again = ctx.device.allocate((size / 2).max(1) + rng.below(7))?;
                    again.free()?;
                }
            }
            Ok(())
        },
    )
}

fn threads(ctx: &CaseContext) -> CaseOutcome {
    let max = ctx.device.capabilities().max_allocation.max(1);
    exact_accounting(
        ctx,
        "8 threads allocating, copying and freeing",
        |attempt| {
            let results: Vec<CaseOutcome> = std::thread::scope(|scope| {
                let workers: Vec<_> = (0..8u64)
                    .map(|t| {
                        scope.spawn(move || -> CaseOutcome {
                            let stream = ctx.device.create_stream()?;
                            let mut rng = Rng::new(0x7E4D + 97 * t + attempt);
                            for i in 0..24u64 {
                                let size = (1 + rng.below(20_000)).min(max);
                                let data = pattern(t * 1000 + i, size as usize);
                                let a = upload(&ctx.device, &stream, &data)?;
                                let b = ctx.device.allocate(size)?;
                                stream.copy(&a, &b)?;
                                if rng.below(2) == 0 {
                                    // Freed with the copy from it still queued.
                                    a.free()?;
                                }
                                check_bytes(
                                    &stream.read(&b)?,
                                    &data,
                                    &format!("thread {t}, allocation {i} ({size} bytes)"),
                                )?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|w| {
                        w.join()
                            .unwrap_or_else(|_| Err(CaseError::fail("a worker thread panicked")))
                    })
                    .collect()
            });
            results.into_iter().collect()
        },
    )
}

fn no_aliasing(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let mut rng = Rng::new(77);
    let mut allocations = Vec::new();
    let mut hosts = Vec::new();
    for i in 0..48u64 {
        let size = 1 + rng.below(5000) as usize;
        let a = ctx.device.allocate(size as u64)?;
        let h = HostBuffer::from_bytes(&pattern(1000 + i, size))?;
        stream.copy_from_host(&h, 0, &a)?;
        allocations.push(a);
        hosts.push(h);
    }
    stream.synchronize()?;
    let mut ids = std::collections::HashSet::new();
    for (i, a) in allocations.iter().enumerate() {
        ensure(ids.insert(a.id()), || {
            format!("two live allocations share the id {}", a.id())
        })?;
        check_bytes(
            &stream.read(a)?,
            &pattern(1000 + i as u64, a.size() as usize),
            &format!("allocation {i} of 48 ({} bytes)", a.size()),
        )?;
    }
    Ok(())
}

fn host_view(ctx: &CaseContext) -> CaseOutcome {
    let len = 4097usize;
    let a = ctx.device.allocate(len as u64)?;
    if !ctx.device.capabilities().host_addressable {
        return ensure(a.host_view().is_none(), || {
            "the device does not report host_addressable, yet an allocation gave a host view"
                .to_string()
        });
    }
    let stream = ctx.device.create_stream()?;
    let want = pattern(71, len);
    stream.write(&a, &want)?;
    stream.synchronize()?;
    let view = a.host_view().ok_or_else(|| {
        CaseError::fail("the device reports host_addressable, but an allocation gave no host view")
    })?;
    ensure(view.len() == len as u64, || {
        format!(
            "the host view is {} bytes; the allocation is {len}",
            view.len()
        )
    })?;
    // SAFETY: the view spans `len` bytes and the stream that wrote them is synchronized;
    // nothing else touches the allocation.
    let seen = unsafe { std::slice::from_raw_parts(view.as_ptr(), len) }.to_vec();
    check_bytes(
        &seen,
        &want,
        "bytes written by the stream, read through the host view",
    )?;
    let written = pattern(72, len);
    // SAFETY: as above; no work is enqueued on the allocation.
    unsafe { std::ptr::copy_nonoverlapping(written.as_ptr(), view.as_ptr(), len) };
    check_bytes(
        &stream.read(&a)?,
        &written,
        "bytes written through the host view, read by the stream",
    )?;
    a.free()?;
    ensure(a.host_view().is_none(), || {
        "a freed allocation still gave a host view".to_string()
    })?;
    // The view keeps the memory alive after free.
    // SAFETY: the view holds the backend memory; nothing else uses it any more.
    let kept = unsafe { std::slice::from_raw_parts(view.as_ptr(), len) }.to_vec();
    check_bytes(&kept, &written, "bytes read through a view after free")?;
    let empty = ctx.device.allocate(0)?;
    ensure(empty.host_view().is_none(), || {
        "a zero-size allocation gave a host view".to_string()
    })
}

/// The device's growable-allocation granularity, or a skip: the device has no virtual
/// memory, or the cases' allocations of up to `granules` granules do not fit.
fn granularity_or_skip(ctx: &CaseContext, granules: u64) -> Result<u64, CaseError> {
    let Some(g) = ctx.device.capabilities().virtual_memory_granularity else {
        return Err(CaseError::skip(
            "device has no virtual memory (virtual_memory_granularity is None); memory.growable_capability checks that it refuses",
        ));
    };
    let max = ctx.device.capabilities().max_allocation;
    match g.checked_mul(granules) {
        Some(need) if g > 0 && need <= max => Ok(g),
        _ => Err(CaseError::skip(format!(
            "the case needs {granules} granules of {g} bytes in one allocation, and the largest allocation is {max} bytes"
        ))),
    }
}

/// `len` bytes as a host-side length.
fn host_len(len: u64) -> Result<usize, CaseError> {
    usize::try_from(len)
        .map_err(|_| CaseError::skip(format!("{len} bytes do not fit in host memory")))
}

fn growable_capability(ctx: &CaseContext) -> CaseOutcome {
    let Some(g) = ctx.device.capabilities().virtual_memory_granularity else {
        return expect_unsupported(
            ctx.device.allocate_growable(MIB, 4096),
            "allocate_growable on a device whose virtual_memory_granularity is None",
        );
    };
    ensure(g > 0, || {
        "virtual_memory_granularity is Some(0); a granularity is at least one byte".to_string()
    })?;
    let g = granularity_or_skip(ctx, 4)?;
    let a = ctx.device.allocate_growable(3 * g + 1, 1)?;
    ensure(a.is_growable(), || {
        "an allocation from allocate_growable does not report is_growable".to_string()
    })?;
    ensure(a.size() == g && a.reserved() == 4 * g, || {
        format!(
            "allocate_growable({}, 1) with a granularity of {g} gave size {} and reserved {} (expected {g} and {})",
            3 * g + 1,
            a.size(),
            a.reserved(),
            4 * g
        )
    })?;
    expect_invalid(
        ctx.device.allocate_growable(4 * g, 0),
        "allocate_growable with nothing backed at first",
    )?;
    expect_invalid(
        ctx.device.allocate_growable(g, 2 * g),
        "allocate_growable backing more than it reserves",
    )?;
    let plain = ctx.device.allocate(g)?;
    ensure(!plain.is_growable() && plain.reserved() == g, || {
        format!(
            "a plain allocation of {g} bytes reports is_growable {} and reserved {}",
            plain.is_growable(),
            plain.reserved()
        )
    })?;
    expect_invalid(plain.resize(2 * g), "resizing a plain allocation")
}

fn growable_keeps_contents(ctx: &CaseContext) -> CaseOutcome {
    let g = granularity_or_skip(ctx, 4)?;
    let stream = ctx.device.create_stream()?;
    let a = ctx.device.allocate_growable(4 * g, g)?;
    let first = pattern(31, host_len(g)?);
    stream.write(&a, &first)?;
    a.resize(3 * g)?;
    ensure(a.size() == 3 * g, || {
        format!("after resize({}) the size is {}", 3 * g, a.size())
    })?;
    check_bytes(
        &stream.read(a.slice(0, g))?,
        &first,
        "the first granule after growing from 1 to 3 granules",
    )?;
    let grown = pattern(32, host_len(2 * g)?);
    stream.write(a.slice(g, 2 * g), &grown)?;
    a.resize(4 * g)?;
    let all = stream.read(a.slice(0, 3 * g))?;
    check_bytes(
        &all[..first.len()],
        &first,
        "the first granule after growing twice",
    )?;
    check_bytes(
        &all[first.len()..],
        &grown,
        "granules 2 and 3, written after the first grow, after the second",
    )
}

fn growable_ops(ctx: &CaseContext) -> CaseOutcome {
    let g = granularity_or_skip(ctx, 4)?;
    let len = host_len(g)?;
    let stream = ctx.device.create_stream()?;
    let a = ctx.device.allocate_growable(4 * g, g)?;
    a.resize(3 * g)?;
    // A device copy into the grown range, and one within it.
    let data = pattern(41, len);
    let src = upload(&ctx.device, &stream, &data)?;
    stream.copy(&src, a.slice(2 * g, g))?;
    stream.copy(a.slice(2 * g, g), a.slice(g, g))?;
    check_bytes(
        &stream.read(a.slice(g, 2 * g))?,
        &[data.clone(), data].concat(),
        "granules 2 and 3 after a copy into granule 3 and from there into granule 2",
    )?;
    // A fill of the grown range, where the device has a dtype to fill with.
    if let Ok(dtype) = ctx.pick_dtype(&DType::ALL) {
        let value = from_i64(dtype, 7);
        stream.fill(a.slice(g, 2 * g), value)?;
        let count = host_len(2 * g)? / dtype.size();
        check_bytes(
            &stream.read(a.slice(g, 2 * g))?,
            &encode(&vec![value; count]),
            &format!("granules 2 and 3 after a {dtype} fill"),
        )?;
    }
    Ok(())
}

fn growable_shrink(ctx: &CaseContext) -> CaseOutcome {
    let g = granularity_or_skip(ctx, 4)?;
    let stream = ctx.device.create_stream()?;
    let a = ctx.device.allocate_growable(4 * g, 4 * g)?;
    let data = pattern(51, host_len(4 * g)?);
    stream.write(&a, &data)?;
    a.resize(g)?;
    ensure(a.size() == g && a.reserved() == 4 * g, || {
        format!(
            "after shrinking to {g} bytes the size is {} and the reservation {}",
            a.size(),
            a.reserved()
        )
    })?;
    let head = &data[..host_len(g)?];
    check_bytes(
        &stream.read(&a)?,
        head,
        "the first granule after shrinking from 4 granules to 1",
    )?;
    expect_invalid(
        stream.read(a.slice(0, 2 * g)),
        "a read reaching past the size after a shrink",
    )?;
    let src = upload(&ctx.device, &stream, head)?;
    expect_invalid(
        stream.copy(&src, a.slice(2 * g, g)),
        "a copy into the released range",
    )?;
    if let Ok(dtype) = ctx.pick_dtype(&DType::ALL) {
        expect_invalid(
            stream.fill(a.slice(g, g), from_i64(dtype, 1)),
            "a fill of the released range",
        )?;
    }
    // Nothing was enqueued by the refused calls, and the allocation grows again.
    a.resize(2 * g)?;
    let second = pattern(52, host_len(g)?);
    stream.write(a.slice(g, g), &second)?;
    check_bytes(
        &stream.read(&a)?,
        &[head, &second[..]].concat(),
        "two granules after shrinking to one and growing back",
    )
}

fn growable_refused_sizes(ctx: &CaseContext) -> CaseOutcome {
    let g = granularity_or_skip(ctx, 4)?;
    let stream = ctx.device.create_stream()?;
    let a = ctx.device.allocate_growable(4 * g, 2 * g)?;
    let data = pattern(61, host_len(2 * g)?);
    stream.write(&a, &data)?;
    let mut refused = vec![
        (0, "0 bytes".to_string()),
        (5 * g, "more than the reservation".to_string()),
    ];
    if g > 1 {
        refused.push((2 * g + g / 2, "a size between two granules".to_string()));
        refused.push((3 * g - 1, "one byte less than three granules".to_string()));
    }
    for (size, what) in refused {
        expect_invalid(a.resize(size), &format!("resize({size}), {what}"))?;
        ensure(a.size() == 2 * g, || {
            format!(
                "after the refused resize({size}) the size is {} (expected {})",
                a.size(),
                2 * g
            )
        })?;
    }
    check_bytes(
        &stream.read(&a)?,
        &data,
        "a growable allocation after refused resizes",
    )
}

fn growable_accounting(ctx: &CaseContext) -> CaseOutcome {
    let g = granularity_or_skip(ctx, 8)?;
    // The host backend accounts exactly; other devices may charge more (page tables,
    // rounding of the driver's figures), so only a lower bound is checked there.
    let exact = ctx.device.backend() == "host";
    let grow_by = 3 * g;
    let mut last = String::new();
    for _ in 0..ACCOUNTING_ATTEMPTS {
        let a = ctx.device.allocate_growable(8 * g, g)?;
        let before = info_or_skip(ctx)?;
        a.resize(g + grow_by)?;
        let during = info_or_skip(ctx)?;
        a.resize(g)?;
        let after = info_or_skip(ctx)?;
        a.free()?;
        let freed = info_or_skip(ctx)?;
        let drop_by = before.free.saturating_sub(during.free);
        let back_by = after.free.saturating_sub(during.free);
        let freed_by = freed.free.saturating_sub(after.free);
        let ok = if exact {
            drop_by == grow_by && back_by == grow_by && freed_by == g
        } else {
            drop_by >= grow_by && back_by >= grow_by && freed_by >= g
        };
        if ok {
            return Ok(());
        }
        last = format!(
            "growing by {grow_by} bytes moved free memory from {} to {}, shrinking back moved it to {}, and freeing the remaining {g} bytes moved it to {} (expected a drop and a rise of {}{grow_by}, then a rise of {}{g})",
            before.free,
            during.free,
            after.free,
            freed.free,
            if exact { "exactly " } else { "at least " },
            if exact { "exactly " } else { "at least " },
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(CaseError::fail(format!(
        "{last} in each of {ACCOUNTING_ATTEMPTS} attempts"
    )))
}

fn growable_resize_after_free(ctx: &CaseContext) -> CaseOutcome {
    let g = granularity_or_skip(ctx, 2)?;
    let a = ctx.device.allocate_growable(2 * g, g)?;
    let clone = a.clone();
    a.free()?;
    expect_invalid(a.resize(2 * g), "growing a freed allocation")?;
    expect_invalid(clone.resize(g), "resizing a clone of a freed allocation")?;
    // The device still makes growable allocations afterwards.
    let b = ctx.device.allocate_growable(2 * g, g)?;
    b.resize(2 * g)?;
    Ok(())
}
