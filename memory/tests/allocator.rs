//! The pooling algorithm on plain offsets: a randomized model check, threads, streams and
//! fences, coalescing and the out-of-memory path.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use xpu_memory::{
    AllocError, Block, BlockStateKind, CachingAllocator, Config, FakeSource, Fence, SegmentId,
    SegmentSource, SourceError, StreamId, MIB,
};

/// A fence completed by hand.
#[derive(Clone, Default)]
struct Flag(Arc<AtomicBool>);

impl Fence for Flag {
    fn is_complete(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A bounded source whose fences the test completes, and which can be told to fail.
#[derive(Default)]
struct TestSource {
    inner: FakeSource,
    fences: Vec<(StreamId, Flag)>,
    fail_next: usize,
}

impl SegmentSource for TestSource {
    type Fence = Flag;
    fn allocate(&mut self, size: u64) -> Result<SegmentId, SourceError> {
        if self.fail_next > 0 {
            self.fail_next -= 1;
            return Err(SourceError::OutOfMemory);
        }
        self.inner.allocate(size)
    }
    fn free(&mut self, segment: SegmentId) -> Result<(), SourceError> {
        self.inner.free(segment)
    }
    fn record_fence(&mut self, stream: StreamId) -> Result<Flag, SourceError> {
        let f = Flag::default();
        self.fences.push((stream, f.clone()));
        Ok(f)
    }
    fn capacity(&self) -> Option<u64> {
        self.inner.capacity
    }
}

impl TestSource {
    fn bounded(cap: u64) -> Self {
        TestSource {
            inner: FakeSource::new(Some(cap)),
            ..Default::default()
        }
    }
    fn complete(&self, stream: StreamId) {
        for (s, f) in &self.fences {
            if *s == stream {
                f.0.store(true, Ordering::SeqCst);
            }
        }
    }
}

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Live blocks must not overlap and must lie inside live segments of the right size.
fn check_model(a: &CachingAllocator<TestSource>, live: &[Block]) {
    a.check_invariants().unwrap();
    let sizes = &a.source().inner.live;
    let reserved: u64 = sizes.values().sum();
    assert_eq!(a.stats().reserved_bytes.current, reserved);
    let mut by_seg: HashMap<SegmentId, Vec<(u64, u64)>> = HashMap::new();
    for b in live {
        assert!(b.size >= b.requested);
        let seg = sizes[&b.segment];
        assert!(b.offset + b.size <= seg, "block outside its segment");
        by_seg
            .entry(b.segment)
            .or_default()
            .push((b.offset, b.offset + b.size));
    }
    for ranges in by_seg.values_mut() {
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            assert!(w[0].1 <= w[1].0, "live blocks overlap: {w:?}");
        }
    }
    let s = a.stats();
    assert!(s.allocated_bytes.current <= s.active_bytes.current);
    assert!(s.active_bytes.current <= s.reserved_bytes.current);
    assert_eq!(
        s.allocated_bytes.current,
        live.iter().map(|b| b.size).sum::<u64>()
    );
}

fn random_run(seed: u64, config: Config) {
    let mut rng = XorShift(seed);
    let mut a = CachingAllocator::new(TestSource::bounded(512 * MIB), config);
    let mut live: Vec<Block> = Vec::new();
    for step in 0..1500 {
        let op = rng.below(10);
        if op < 5 || live.is_empty() {
            let size = match rng.below(4) {
                0 => rng.below(4096),
                1 => rng.below(MIB),
                2 => rng.below(12 * MIB),
                _ => rng.below(40 * MIB),
            };
            let stream = StreamId(rng.below(2));
            match a.allocate(size, stream) {
                Ok(b) => {
                    assert_eq!(b.requested, size);
                    if rng.below(4) == 0 {
                        a.record_stream(&b, StreamId(2)).unwrap();
                    }
                    live.push(b);
                }
                Err(AllocError::OutOfMemory(_)) => {}
                Err(e) => panic!("step {step}: {e}"),
            }
        } else if op < 9 {
            let i = rng.below(live.len() as u64) as usize;
            let b = live.swap_remove(i);
            a.free(&b).unwrap();
            assert!(a.free(&b).is_err(), "double free accepted");
        } else if rng.below(2) == 0 {
            a.source().complete(StreamId(2));
            a.process_pending();
        } else {
            a.empty_cache();
        }
        check_model(&a, &live);
    }
    for b in live.drain(..) {
        a.free(&b).unwrap();
    }
    a.source().complete(StreamId(2));
    a.empty_cache();
    check_model(&a, &live);
    assert_eq!(a.stats().reserved_bytes.current, 0);
    assert_eq!(a.source().inner.used, 0);
}

#[test]
fn randomized_against_model_xpu() {
    for seed in 1..=8 {
        random_run(seed * 0x9E37_79B9, Config::xpu());
    }
}

#[test]
fn randomized_against_model_pytorch() {
    for seed in 1..=8 {
        random_run(seed * 0x85EB_CA6B, Config::pytorch());
    }
}

#[test]
fn threads_share_one_allocator() {
    let a = Arc::new(Mutex::new(CachingAllocator::new(
        TestSource::bounded(1 << 34),
        Config::xpu(),
    )));
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut rng = XorShift(t + 1);
                let mut live = Vec::new();
                for _ in 0..2000 {
                    if rng.below(2) == 0 || live.is_empty() {
                        let b = a
                            .lock()
                            .unwrap()
                            .allocate(rng.below(3 * MIB), StreamId(t % 3));
                        live.push(b.unwrap());
                    } else {
                        let i = rng.below(live.len() as u64) as usize;
                        a.lock().unwrap().free(&live.swap_remove(i)).unwrap();
                    }
                }
                live
            })
        })
        .collect();
    let mut live = Vec::new();
    for h in handles {
        live.extend(h.join().unwrap());
    }
    let mut a = a.lock().unwrap();
    check_model(&a, &live);
    for b in &live {
        a.free(b).unwrap();
    }
    a.empty_cache();
    assert_eq!(a.stats().reserved_bytes.current, 0);
}

#[test]
fn same_stream_reuse_is_immediate() {
    let mut a = CachingAllocator::new(TestSource::bounded(64 * MIB), Config::xpu());
    let s = StreamId(0);
    let b = a.allocate(1000, s).unwrap();
    a.free(&b).unwrap();
    let c = a.allocate(1000, s).unwrap();
    assert_eq!((c.segment, c.offset), (b.segment, b.offset));
    // Another stream does not get the first stream's cached blocks.
    a.free(&c).unwrap();
    let d = a.allocate(1000, StreamId(1)).unwrap();
    assert_ne!(d.segment, b.segment);
    assert_eq!(a.stats().num_device_alloc, 2);
}

#[test]
fn cross_stream_use_waits_for_fence() {
    let mut a = CachingAllocator::new(TestSource::bounded(64 * MIB), Config::xpu());
    let (s0, s1) = (StreamId(0), StreamId(1));
    let b = a.allocate(4096, s0).unwrap();
    a.record_stream(&b, s1).unwrap();
    a.free(&b).unwrap();
    assert_eq!(a.pending_frees(), 1);
    assert_eq!(a.stats().active_bytes.current, b.size);
    assert_eq!(a.stats().allocated_bytes.current, 0);
    let c = a.allocate(4096, s0).unwrap();
    assert_ne!(
        (c.segment, c.offset),
        (b.segment, b.offset),
        "reused before the fence"
    );
    a.check_invariants().unwrap();
    a.source().complete(s1);
    a.free(&c).unwrap();
    let d = a.allocate(4096, s0).unwrap();
    assert_eq!(a.pending_frees(), 0);
    assert_eq!((d.segment, d.offset), (b.segment, b.offset));
    a.check_invariants().unwrap();
    let snap = a.snapshot();
    let json = serde_json::to_string(&snap).unwrap();
    assert!(json.contains("\"allocated\""));
}

#[test]
fn coalescing_restores_whole_segment() {
    let mut a = CachingAllocator::new(TestSource::bounded(64 * MIB), Config::pytorch());
    let s = StreamId(0);
    let blocks: Vec<Block> = (0..4).map(|_| a.allocate(256 * 1024, s).unwrap()).collect();
    assert!(blocks.iter().all(|b| b.segment == blocks[0].segment));
    // Free the middle two, then the ends: every free merges with its neighbours.
    for i in [1, 2, 0, 3] {
        a.free(&blocks[i]).unwrap();
        a.check_invariants().unwrap();
    }
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].blocks.len(), 1);
    assert_eq!(snap.segments[0].blocks[0].state, BlockStateKind::Free);
    assert_eq!(a.stats().inactive_split_bytes.current, 0);
    assert_eq!(a.empty_cache(), 2 * MIB);
    assert_eq!(a.stats().num_device_free, 1);
}

#[test]
fn oom_retries_after_releasing_cache() {
    let mut a = CachingAllocator::new(TestSource::bounded(64 * MIB), Config::pytorch());
    let s = StreamId(0);
    let b = a.allocate(40 * MIB, s).unwrap();
    a.free(&b).unwrap();
    // 50 MiB does not fit beside the cached 40 MiB segment; the cache is released and retried.
    let c = a.allocate(50 * MIB, s).unwrap();
    let st = a.stats();
    assert_eq!(st.num_alloc_retries, 1);
    assert_eq!(st.num_device_free, 1);
    assert_eq!(st.num_ooms, 0);
    // Now nothing can help.
    let err = a.allocate(30 * MIB, s).unwrap_err();
    let AllocError::OutOfMemory(r) = &err else {
        panic!("{err}")
    };
    assert_eq!(r.requested, 30 * MIB);
    assert_eq!(r.capacity, Some(64 * MIB));
    assert_eq!(r.allocated, c.size);
    let msg = err.to_string();
    assert!(
        msg.contains("largest free block") && msg.contains("fragmentation"),
        "{msg}"
    );
    assert!(
        !msg.contains("memory_fraction"),
        "suggests a remedy not in effect: {msg}"
    );
    assert_eq!(a.stats().num_ooms, 1);
    a.check_invariants().unwrap();
}

#[test]
fn source_failure_then_success() {
    let mut src = TestSource::bounded(64 * MIB);
    src.fail_next = 1;
    let mut a = CachingAllocator::new(src, Config::xpu());
    let b = a.allocate(MIB, StreamId(0)).unwrap();
    assert_eq!(a.stats().num_alloc_retries, 1);
    a.free(&b).unwrap();
}

#[test]
fn memory_fraction_limits_reservation() {
    let mut cfg = Config::xpu();
    cfg.memory_fraction = Some(0.25);
    let mut a = CachingAllocator::new(TestSource::bounded(64 * MIB), cfg);
    assert!(a.allocate(15 * MIB, StreamId(0)).is_ok());
    let err = a.allocate(8 * MIB, StreamId(0)).unwrap_err();
    assert!(err.to_string().contains("memory_fraction"), "{err}");
    a.set_memory_fraction(None);
    assert!(a.allocate(8 * MIB, StreamId(0)).is_ok());
}

#[test]
fn split_limit_keeps_big_blocks_whole() {
    let mut a = CachingAllocator::new(TestSource::bounded(1 << 30), Config::xpu());
    let s = StreamId(0);
    let big = a.allocate(200 * MIB, s).unwrap();
    a.free(&big).unwrap();
    let small = a.allocate(2 * MIB, s).unwrap();
    assert_ne!(small.segment, big.segment);
    let stats_before = a.stats();
    a.reset_peak_stats();
    assert_eq!(
        a.stats().reserved_bytes.peak,
        stats_before.reserved_bytes.current
    );
    assert!(a.history().count() > 0);
}
