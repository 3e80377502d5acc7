//! The caching allocator (`xpu-memory`) on the device: blocks hold data and are reused on
//! their stream, a block freed while another stream still uses it is not handed out before
//! that stream's fence, `empty_cache` gives memory back to the device, and expandable
//! segments grow in place where the device has virtual memory.

use xpu_hal::{DType, MemoryInfo, Scalar};
use xpu_memory::{Config, DeviceAllocator, DeviceBlock};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{check_bytes, ensure, pattern, ACCOUNTING_ATTEMPTS, MIB};

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "pool.reuse_on_stream",
        "pool blocks of odd sizes hold distinct data, and a freed block is handed out again on its stream without a device allocation",
        reuse_on_stream,
    ),
    Case::core(
        "pool.cross_stream_fence",
        "a block freed while another stream still uses it is not reused before that stream passes its fence: data written after reuse survives",
        cross_stream_fence,
    ),
    Case::core(
        "pool.empty_cache",
        "memory the pool caches counts as used on the device until empty_cache returns it",
        empty_cache,
    ).alone(),
    Case::core(
        "pool.expandable_growth",
        "with virtual memory, the pool grows one segment in place: earlier blocks keep their data and empty_cache shrinks the free tail",
        expandable_growth,
    ),
];

fn pool(ctx: &CaseContext) -> DeviceAllocator {
    DeviceAllocator::new(ctx.device.clone(), Config::xpu())
}

fn free_all(pool: &DeviceAllocator, blocks: Vec<DeviceBlock>) -> CaseOutcome {
    for b in blocks {
        pool.free(b)?;
    }
    Ok(())
}

fn reuse_on_stream(ctx: &CaseContext) -> CaseOutcome {
    let pool = pool(ctx);
    let stream = ctx.device.create_stream()?;
    let s = pool.register_stream(&stream);
    let sizes = [1u64, 513, 4097, MIB + 13, 3 * MIB + 1];
    let mut blocks = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let b = pool.allocate(*size, s)?;
        ensure(b.slice().len == *size, || {
            format!(
                "a pool block for {size} bytes is a {}-byte slice",
                b.slice().len
            )
        })?;
        stream.write(b.slice(), &pattern(300 + i as u64, *size as usize))?;
        blocks.push(b);
    }
    for (i, b) in blocks.iter().enumerate() {
        check_bytes(
            &stream.read(b.slice())?,
            &pattern(300 + i as u64, sizes[i] as usize),
            &format!("pool block {i} ({} bytes) after all were written", sizes[i]),
        )?;
    }
    let calls = pool.stats().num_device_alloc;
    let third = blocks.remove(2);
    let key = (third.block.segment, third.block.offset);
    pool.free(third)?;
    let again = pool.allocate(4000, s)?;
    ensure((again.block.segment, again.block.offset) == key, || {
        "a freed block was not handed out again to a request of its size on its stream".to_string()
    })?;
    ensure(pool.stats().num_device_alloc == calls, || {
        "reusing a cached block asked the device for memory".to_string()
    })?;
    stream.write(again.slice(), &pattern(399, 4000))?;
    for (i, b) in blocks.iter().enumerate() {
        let n = if i >= 2 { i + 1 } else { i };
        check_bytes(
            &stream.read(b.slice())?,
            &pattern(300 + n as u64, sizes[n] as usize),
            &format!("pool block {n} after its neighbour was reused"),
        )?;
    }
    blocks.push(again);
    free_all(&pool, blocks)?;
    pool.empty_cache();
    Ok(())
}

fn cross_stream_fence(ctx: &CaseContext) -> CaseOutcome {
    ctx.require_streams(2)?;
    let pool = pool(ctx);
    let (s0, s1) = (ctx.device.create_stream()?, ctx.device.create_stream()?);
    let (i0, i1) = (pool.register_stream(&s0), pool.register_stream(&s1));
    let n = 64 * 1024;
    let a_data = pattern(501, n as usize);
    let b_data = pattern(502, n as usize);
    let source = ctx.device.allocate(n)?;
    s0.write(&source, &a_data)?;
    // Keep s1 busy, then have it write into the block after the busy work.
    let delay = ctx.device.allocate(16 * MIB)?;
    let block = pool.allocate(n, i0)?;
    pool.record_stream(&block, i1)?;
    if ctx.device.capabilities().supports_dtype(DType::F32) {
        for _ in 0..4 {
            s1.fill(&delay, Scalar::F32(7.0))?;
        }
    }
    s1.copy(&source, block.slice())?;
    pool.free(block)?;
    // Allocated on s0 while s1's copy may still be queued: it must not be that block unless
    // the copy has finished.
    let next = pool.allocate(n, i0)?;
    s0.write(next.slice(), &b_data)?;
    s1.synchronize()?;
    check_bytes(
        &s0.read(next.slice())?,
        &b_data,
        "a block written after reuse (another stream's queued copy must not land on it)",
    )?;
    pool.free(next)?;
    s1.synchronize()?;
    // Once the fence has passed, the block is reused like any other.
    pool.empty_cache();
    ensure(pool.stats().reserved_bytes.current == 0, || {
        format!(
            "after both streams finished, {} bytes stayed reserved through empty_cache",
            pool.stats().reserved_bytes.current
        )
    })?;
    Ok(())
}

fn memory_free(ctx: &CaseContext) -> Result<MemoryInfo, CaseError> {
    Ok(ctx.device.memory_info()?)
}

fn empty_cache(ctx: &CaseContext) -> CaseOutcome {
    let pool = pool(ctx);
    let stream = ctx.device.create_stream()?;
    let s = pool.register_stream(&stream);
    let size = 8 * MIB;
    let mut last = String::new();
    for _ in 0..ACCOUNTING_ATTEMPTS {
        let before = memory_free(ctx)?.free;
        let blocks: Vec<DeviceBlock> = (0..2)
            .map(|_| pool.allocate(size, s))
            .collect::<Result<_, _>>()?;
        let held = memory_free(ctx)?.free;
        free_all(&pool, blocks)?;
        let cached = memory_free(ctx)?.free;
        let released = pool.empty_cache();
        // Whatever else happens on the device, the pool itself must release what it
        // cached: that is no measurement.
        ensure(released >= 2 * size, || {
            format!("empty_cache released {released} bytes of the 16 MiB cached")
        })?;
        let after = memory_free(ctx)?.free;
        last = if held + 2 * size > before {
            format!(
                "free memory went from {before} to {held} bytes with 16 MiB allocated from the pool"
            )
        } else if cached != held {
            format!("freeing pool blocks changed the device's free memory ({held} → {cached} bytes); the pool should keep it cached")
        } else if after != before {
            format!(
                "free memory is {after} bytes after empty_cache, {before} before the pool allocated"
            )
        } else {
            return Ok(());
        };
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Err(CaseError::fail(format!(
        "{last}, in each of {ACCOUNTING_ATTEMPTS} attempts"
    )))
}

fn expandable_growth(ctx: &CaseContext) -> CaseOutcome {
    let Some(granularity) = ctx.device.capabilities().virtual_memory_granularity else {
        return Err(CaseError::skip(
            "device has no virtual memory (virtual_memory_granularity is None)",
        ));
    };
    let pool = pool(ctx);
    ensure(pool.expandable(), || {
        "the pool does not use expandable segments on a device with virtual memory".to_string()
    })?;
    let stream = ctx.device.create_stream()?;
    let s = pool.register_stream(&stream);
    let size = 3 * MIB + 5;
    let mut blocks = Vec::new();
    for i in 0..4u64 {
        let b = pool.allocate(size, s)?;
        stream.write(b.slice(), &pattern(600 + i, size as usize))?;
        blocks.push(b);
    }
    let snap = pool.snapshot();
    ensure(snap.segments.len() == 1, || {
        format!(
            "4 large blocks on one stream took {} segments; an expandable segment grows in place",
            snap.segments.len()
        )
    })?;
    ensure(pool.stats().num_segment_grows >= 3, || {
        format!(
            "the segment grew {} times for 4 blocks",
            pool.stats().num_segment_grows
        )
    })?;
    for (i, b) in blocks.iter().enumerate() {
        check_bytes(
            &stream.read(b.slice())?,
            &pattern(600 + i as u64, size as usize),
            &format!("block {i} after the segment grew"),
        )?;
    }
    let reserved = pool.stats().reserved_bytes.current;
    if let Some(last) = blocks.pop() {
        pool.free(last)?;
    }
    let released = pool.empty_cache();
    ensure(released + granularity > size && released > 0, || {
        format!("empty_cache released {released} bytes of a free {size}-byte tail (granularity {granularity})")
    })?;
    ensure(
        pool.stats().reserved_bytes.current == reserved - released,
        || "reserved bytes do not match what empty_cache released".to_string(),
    )?;
    for (i, b) in blocks.iter().enumerate() {
        check_bytes(
            &stream.read(b.slice())?,
            &pattern(600 + i as u64, size as usize),
            &format!("block {i} after the tail was released"),
        )?;
    }
    free_all(&pool, blocks)?;
    pool.empty_cache();
    ensure(pool.stats().reserved_bytes.current == 0, || {
        "the pool still reserves memory after everything was freed and emptied".to_string()
    })
}
