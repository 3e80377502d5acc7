//! `xpu bench collectives`: collective operations over a communicator, measured the way
//! nccl-tests measures them, beside the memory-bandwidth ceiling of the same devices
//! measured in the same run.
//!
//! Each size runs `-w` warm-up iterations, then `-n` iterations back to back on every
//! rank's stream followed by one synchronization (the `time` column: the mean, as
//! nccl-tests reports it), then `-n` iterations synchronized one by one (the p50 and p99
//! latencies: each starts on every rank together after a barrier and lasts until the
//! slowest rank's stream has finished it, as MPI benchmarks time a call). `algbw` is size / time; `busbw` applies nccl-tests' factor (2(n−1)/n for
//! all-reduce, (n−1)/n for all-gather, reduce-scatter and all-to-all, 1 otherwise), so
//! busbw compares with the hardware's bandwidth whatever the rank count. The reference
//! column, `ceiling`, is the bandwidth of every rank copying the same number of bytes
//! within its own device at the same time: the most the devices' memory moves. From 64
//! KiB its copies interleave with the out-of-place p50 samples, so that both see the
//! machine in the same state (below, they follow the samples: a small copy measures a
//! hand-off, and waking the streams between samples would disturb them), and `ratio` is the busbw at the p50 time over the ceiling. With `-c
//! 1` each size is checked once per mode with inputs whose exact result is known
//! (`#wrong` counts differing elements).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use xpu::{DType, Device, Error, Result, Stream};
use xpu_collectives::check;
use xpu_collectives::comm::select::Selector;
use xpu_collectives::{Collective, CommOptions, Communicator, Rank, ReduceOp, Topology};

/// What `xpu bench collectives` was asked to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// The operation.
    pub collective: Collective,
    /// Smallest size, bytes.
    pub min_bytes: u64,
    /// Largest size, bytes.
    pub max_bytes: u64,
    /// Size multiplier between rows.
    pub step_factor: u64,
    /// Timed iterations per size.
    pub iters: usize,
    /// Warm-up iterations per size.
    pub warmup: usize,
    /// Whether to check results.
    pub check: bool,
    /// The reduction.
    pub op: ReduceOp,
    /// The element type.
    pub dtype: DType,
    /// Root of rooted operations.
    pub root: usize,
    /// Force an algorithm (`ring`, `direct`, `halving-doubling`, `tree`, `hierarchical`,
    /// `shared-memory`, `native`) instead of the cost model's choice.
    pub algorithm: Option<String>,
    /// Also time every algorithm at each size and report whether the cost model chose
    /// the fastest.
    pub compare_algorithms: bool,
    /// Print JSON (one object per row) instead of the table.
    pub json: bool,
}

/// nccl-tests' name for a dtype (`float`, `half` …), also accepted on the command line.
fn nccl_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "half",
        DType::BF16 => "bfloat16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
    }
}

/// Parses a dtype given as nccl-tests names it or as xpu does (`float`, `f32`, `int8`…).
pub fn parse_dtype(text: &str) -> Result<DType> {
    let t = text.trim().to_ascii_lowercase();
    DType::ALL
        .into_iter()
        .find(|d| d.name() == t || nccl_type(*d) == t)
        .or(match t.as_str() {
            "int" => Some(DType::I32),
            "uint8_t" | "char" => Some(DType::U8),
            "bf16" => Some(DType::BF16),
            _ => None,
        })
        .ok_or_else(|| {
            Error::invalid(format!(
                "unknown dtype `{text}`; expected one of float, double, half, bfloat16, int32, int64, uint8 (or f32, f64, f16, bf16, i32, i64, u8)"
            ))
        })
}

/// One mode's figures of a row.
#[derive(Debug, Clone, Copy, Serialize)]
struct Figures {
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: Option<usize>,
    p50_us: f64,
    p99_us: f64,
}

/// One row, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Row {
    collective: &'static str,
    size: u64,
    count: u64,
    #[serde(rename = "type")]
    dtype: &'static str,
    redop: String,
    root: i64,
    algorithm: String,
    out_of_place: Figures,
    in_place: Figures,
    ceiling_gbps: f64,
    busbw_over_ceiling: f64,
    /// With `--compare-algos`: each algorithm's out-of-place time and the cost model's
    /// estimate of it, µs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    algorithm_times_us: Vec<(String, f64, Option<f64>)>,
    /// With `--compare-algos`: whether the chosen algorithm was the fastest measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    chosen_was_fastest: Option<bool>,
    /// With `--compare-algos`, where the model offers shared memory: the algorithm that
    /// runs when streams are busy, and whether it was the fastest of the enqueued ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    enqueued: Option<(String, bool)>,
}

/// `println!` where `$on` (the process that prints for all, under mpirun).
macro_rules! say {
    ($on:expr, $($t:tt)*) => {
        if $on {
            println!($($t)*);
        }
    };
}

/// A barrier that spins (briefly, then yields): waking a sleeping thread costs tens of
/// microseconds here, more than a small collective.
struct SpinBarrier {
    n: usize,
    count: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    fn new(n: usize) -> Self {
        SpinBarrier {
            n,
            count: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.count.store(0, Ordering::Release);
            self.generation.fetch_add(1, Ordering::AcqRel);
            return;
        }
        // A short spin, then yields: a rank that shares its core with the one it waits
        // for (threads outnumber cores) must not hold it for long.
        let mut backoff = xpu::shm::Backoff::spin_then_yield(64);
        while self.generation.load(Ordering::Acquire) == generation {
            backoff.pause();
        }
    }
}

/// The ranks' start line: a spinning barrier within the process, then, across
/// processes, the communicator's own barrier.
struct Barrier<'a> {
    local: &'a SpinBarrier,
    spanning: bool,
}

impl Barrier<'_> {
    fn wait(&self, rank: &xpu_collectives::Rank, stream: &Stream) -> Result<()> {
        self.local.wait();
        if self.spanning {
            rank.barrier(stream)?;
            stream.synchronize()?;
        }
        Ok(())
    }
}

/// One rank's times of a measurement.
type RankTimes = (Duration, Vec<Duration>, usize, Vec<Duration>);

/// Across processes: every rank's times become the slowest rank's, iteration by
/// iteration, and its wrong count the sum over ranks (through the communicator, in µs).
fn slowest_everywhere(
    rank: &xpu_collectives::Rank,
    stream: &Stream,
    mean: Duration,
    samples: Vec<Duration>,
    wrong: usize,
    copies: Vec<Duration>,
) -> Result<RankTimes> {
    let us = |d: &Duration| d.as_secs_f64() * 1e6;
    let mut values: Vec<f64> = vec![us(&mean)];
    values.extend(samples.iter().map(us));
    values.extend(copies.iter().map(us));
    let device = rank.device();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let times = device.allocate(bytes.len() as u64)?;
    stream.write(&times, &bytes)?;
    rank.all_reduce(&times, &times, DType::F64, ReduceOp::Max, stream)?;
    let counted = device.allocate(8)?;
    stream.write(&counted, &(wrong as i64).to_le_bytes())?;
    rank.all_reduce(&counted, &counted, DType::I64, ReduceOp::Sum, stream)?;
    stream.synchronize()?;
    let got: Vec<Duration> = stream
        .read(&times)?
        .chunks_exact(8)
        .map(|c| {
            let v = f64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
            Duration::try_from_secs_f64(v.max(0.0) / 1e6).unwrap_or(Duration::MAX)
        })
        .collect();
    let wrong = stream.read(&counted)?;
    let wrong = i64::from_le_bytes(wrong[..8].try_into().unwrap_or([0; 8]));
    let k = samples.len();
    Ok((
        got[0],
        got[1..1 + k].to_vec(),
        usize::try_from(wrong).unwrap_or(usize::MAX),
        got[1 + k..].to_vec(),
    ))
}

/// Per-rank buffer sizes (send, receive) for `size` bytes of the operation, as
/// nccl-tests counts size.
fn buffer_bytes(kind: Collective, size: u64, n: u64) -> (u64, u64) {
    match kind {
        Collective::AllGather => (size / n, size),
        Collective::ReduceScatter => (size, size / n),
        _ => (size, size),
    }
}

/// Enqueues one operation for `rank`.
fn enqueue(
    rank: &Rank,
    o: &Options,
    send: &xpu::Allocation,
    recv: &xpu::Allocation,
    in_place: bool,
    stream: &Stream,
) -> Result<()> {
    let r = rank.rank();
    let (dtype, op, root) = (o.dtype, o.op, o.root);
    match o.collective {
        Collective::AllReduce if in_place => rank.all_reduce(recv, recv, dtype, op, stream),
        Collective::AllReduce => rank.all_reduce(send, recv, dtype, op, stream),
        Collective::Reduce if in_place => rank.reduce(
            recv,
            (r == root).then(|| recv.whole()),
            dtype,
            op,
            root,
            stream,
        ),
        Collective::Reduce => rank.reduce(
            send,
            (r == root).then(|| recv.whole()),
            dtype,
            op,
            root,
            stream,
        ),
        Collective::Broadcast if in_place => rank.broadcast(None, recv, root, stream),
        Collective::Broadcast => {
            rank.broadcast((r == root).then(|| send.whole()), recv, root, stream)
        }
        Collective::AllGather if in_place => {
            let block = send.size();
            rank.all_gather(recv.slice(r as u64 * block, block), recv, stream)
        }
        Collective::AllGather => rank.all_gather(send, recv, stream),
        Collective::ReduceScatter if in_place => {
            let block = recv.size();
            rank.reduce_scatter(send, send.slice(r as u64 * block, block), dtype, op, stream)
        }
        Collective::ReduceScatter => rank.reduce_scatter(send, recv, dtype, op, stream),
        Collective::AllToAll => rank.all_to_all(send, recv, stream),
        Collective::Barrier => rank.barrier(stream),
        Collective::SendRecv => {
            let n = rank.size();
            rank.send(send, (r + 1) % n, stream)?;
            rank.recv(recv, (r + n - 1) % n, stream)
        }
    }
}

/// The input rank `r` starts from, and where its result is to be read and what it must be.
fn inputs_and_expectation(
    o: &Options,
    r: usize,
    n: usize,
    send_bytes: u64,
    recv_bytes: u64,
    in_place: bool,
) -> (Vec<u8>, Vec<u8>, Option<Vec<u8>>) {
    let size = o.dtype.size();
    let reducing = matches!(
        o.collective,
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
    );
    let op = reducing.then_some(o.op);
    let send_elems = send_bytes as usize / size;
    let recv_elems = recv_bytes as usize / size;
    let send = check::input(o.dtype, op, r, n, send_elems);
    // The receive buffer's initial content: in place, the operation reads it.
    let recv = match o.collective {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce if in_place => {
            check::input(o.dtype, op, r, n, recv_elems)
        }
        Collective::AllGather if in_place => {
            let mut v = vec![0u8; recv_bytes as usize];
            let block = send.len();
            v[r * block..(r + 1) * block].copy_from_slice(&send);
            v
        }
        _ => vec![0u8; recv_bytes as usize],
    };
    if !o.check {
        return (send, recv, None);
    }
    let want = match o.collective {
        Collective::AllReduce => Some(check::reduced(o.dtype, o.op, n, recv_elems)),
        Collective::Reduce if r == o.root => Some(check::reduced(o.dtype, o.op, n, recv_elems)),
        Collective::Reduce => None,
        Collective::Broadcast => Some(check::input(o.dtype, None, o.root, n, recv_elems)),
        Collective::AllGather => Some(
            (0..n)
                .flat_map(|q| check::input(o.dtype, None, q, n, send_elems))
                .collect(),
        ),
        Collective::ReduceScatter => {
            let all = check::reduced(o.dtype, o.op, n, send_elems);
            Some(all[r * recv_bytes as usize..(r + 1) * recv_bytes as usize].to_vec())
        }
        Collective::AllToAll => {
            let block = send_bytes as usize / n;
            Some(
                (0..n)
                    .flat_map(|q| {
                        check::input(o.dtype, None, q, n, send_elems)[r * block..(r + 1) * block]
                            .to_vec()
                    })
                    .collect(),
            )
        }
        Collective::Barrier => None,
        Collective::SendRecv => Some(check::input(o.dtype, None, (r + n - 1) % n, n, send_elems)),
    };
    (send, recv, want)
}

/// Times of one mode: (mean per iteration back to back, per-iteration samples), and the
/// wrong elements summed over ranks when checked.
struct Measured {
    mean: Duration,
    samples: Vec<Duration>,
    wrong: Option<usize>,
    /// With a reference: per iteration, the slowest rank's copy of `size` bytes within
    /// its own device, each right after that iteration's sample (from
    /// [`INTERLEAVE_FROM`]; below, after all the samples).
    reference: Vec<Duration>,
}

/// The smallest size whose ceiling copies interleave with the latency samples. Below it
/// a copy's time is the stream's hand-off rather than memory bandwidth, and the copies
/// (which wake the streams' workers) would disturb the latencies measured between them,
/// so they follow all the samples instead.
const INTERLEAVE_FROM: u64 = 64 << 10;

/// The most iterations (`-n`, `-w`) a size may take: every timing is kept.
const MAX_ITERS: usize = 10_000_000;

/// Measures one mode; with `reference`, each latency sample is followed by a sample of
/// the ceiling (every rank copying `size` bytes within its own device at once), so that
/// both see the machine in the same state: on a shared virtual machine the memory
/// bandwidth changes by half from one second to the next. Below [`INTERLEAVE_FROM`] the
/// ceiling's samples follow all the latency samples.
fn measure(
    comm: &Communicator,
    o: &Options,
    size: u64,
    in_place: bool,
    reference: bool,
) -> Result<Measured> {
    let n = comm.size();
    let (send_bytes, recv_bytes) = buffer_bytes(o.collective, size, n as u64);
    let local = SpinBarrier::new(comm.ranks().len());
    let spanning = !comm.processes().is_empty();
    // Across processes the ranks of every process start together: this process's at
    // the spinning barrier, then all through the communicator's own barrier.
    let barrier = Barrier {
        local: &local,
        spanning,
    };
    let results: Vec<Result<RankTimes>> = std::thread::scope(|s| {
        let handles: Vec<_> = comm
            .ranks()
            .into_iter()
            .map(|rank| {
                let barrier = &barrier;
                s.spawn(move || -> Result<RankTimes> {
                    let device = rank.device().clone();
                    let stream = device.create_stream()?;
                    let send = device.allocate(send_bytes)?;
                    let recv = device.allocate(recv_bytes)?;
                    let (input, initial, want) =
                        inputs_and_expectation(o, rank.rank(), n, send_bytes, recv_bytes, in_place);
                    let load = |stream: &Stream| -> Result<()> {
                        if send_bytes > 0 {
                            stream.write(&send, &input)?;
                        }
                        if recv_bytes > 0 {
                            stream.write(&recv, &initial)?;
                        }
                        stream.synchronize()
                    };
                    load(&stream)?;
                    for _ in 0..o.warmup {
                        enqueue(&rank, o, &send, &recv, in_place, &stream)?;
                    }
                    stream.synchronize()?;
                    barrier.wait(&rank, &stream)?;
                    let start = Instant::now();
                    for _ in 0..o.iters {
                        enqueue(&rank, o, &send, &recv, in_place, &stream)?;
                    }
                    stream.synchronize()?;
                    barrier.wait(&rank, &stream)?;
                    let mean = start.elapsed() / o.iters.max(1) as u32;
                    let copies = match reference && size > 0 {
                        true => {
                            let (a, b) = (device.allocate(size)?, device.allocate(size)?);
                            stream.fill(&a, xpu::Scalar::U8(1))?;
                            stream.copy(&a, &b)?;
                            stream.synchronize()?;
                            Some((a, b))
                        }
                        false => None,
                    };
                    let mut copy_times = Vec::new();
                    let copy = |copy_times: &mut Vec<Duration>| -> Result<()> {
                        if let Some((a, b)) = &copies {
                            barrier.wait(&rank, &stream)?;
                            let t = Instant::now();
                            stream.copy(a, b)?;
                            stream.synchronize()?;
                            copy_times.push(t.elapsed());
                        }
                        Ok(())
                    };
                    let interleave = size >= INTERLEAVE_FROM;
                    let mut samples = Vec::with_capacity(o.iters);
                    // Each sample starts together and ends when this rank's part is
                    // done (as MPI benchmarks time a call between barriers); the
                    // slowest rank's time is the iteration's.
                    for _ in 0..o.iters {
                        barrier.wait(&rank, &stream)?;
                        let t = Instant::now();
                        enqueue(&rank, o, &send, &recv, in_place, &stream)?;
                        stream.synchronize()?;
                        samples.push(t.elapsed());
                        if interleave {
                            copy(&mut copy_times)?;
                        }
                    }
                    if !interleave {
                        for _ in 0..o.iters {
                            copy(&mut copy_times)?;
                        }
                    }
                    let mut wrong = 0;
                    if o.check {
                        load(&stream)?;
                        barrier.wait(&rank, &stream)?;
                        enqueue(&rank, o, &send, &recv, in_place, &stream)?;
                        stream.synchronize()?;
                        if let Some(want) = want {
                            let got = match o.collective {
                                Collective::ReduceScatter if in_place => {
                                    let r = rank.rank() as u64;
                                    stream.read(send.slice(r * recv_bytes, recv_bytes))?
                                }
                                _ => stream.read(&recv)?,
                            };
                            wrong = check::wrong_elements(o.dtype, &got, &want);
                        }
                    }
                    if spanning {
                        return slowest_everywhere(
                            &rank, &stream, mean, samples, wrong, copy_times,
                        );
                    }
                    Ok((mean, samples, wrong, copy_times))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|p| {
                    Err(Error::from_panic("a rank thread of the benchmark", &*p))
                })
            })
            .collect()
    });
    let mut mean = Duration::ZERO;
    let mut samples: Vec<Duration> = Vec::new();
    let mut wrong = 0;
    let mut reference = Vec::new();
    for r in results {
        let (m, s, w, c) = r?;
        mean = mean.max(m);
        slowest_of(&mut samples, s);
        slowest_of(&mut reference, c);
        wrong += w;
    }
    Ok(Measured {
        mean,
        samples,
        wrong: o.check.then_some(wrong),
        reference,
    })
}

/// The reference of a measurement taken with one: the median bandwidth of its copies,
/// GB/s (0 without).
fn ceiling(m: &Measured, size: u64) -> f64 {
    let mut sorted = m.reference.clone();
    sorted.sort();
    match sorted.get(sorted.len() / 2) {
        Some(median) if size > 0 => size as f64 / median.as_secs_f64().max(1e-12) / 1e9,
        _ => 0.0,
    }
}

/// Folds one rank's per-iteration times into the slowest so far: an iteration of a
/// collective takes as long as its slowest rank.
fn slowest_of(slowest: &mut Vec<Duration>, times: Vec<Duration>) {
    if slowest.is_empty() {
        *slowest = times;
    } else {
        for (a, b) in slowest.iter_mut().zip(times) {
            *a = (*a).max(b);
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e6
}

fn figures(m: &Measured, size: u64, factor: f64) -> Figures {
    let mut sorted = m.samples.clone();
    sorted.sort();
    let time_us = m.mean.as_secs_f64() * 1e6;
    let algbw = if time_us > 0.0 {
        size as f64 / (time_us * 1e3)
    } else {
        0.0
    };
    Figures {
        time_us,
        algbw,
        busbw: algbw * factor,
        wrong: m.wrong,
        p50_us: percentile(&sorted, 0.5),
        p99_us: percentile(&sorted, 0.99),
    }
}

/// Runs the benchmark over `devices` (one rank each).
pub fn run(devices: Vec<Device>, o: &Options) -> Result<bool> {
    if devices.is_empty() {
        return Err(Error::invalid(
            "no devices selected; pass --devices, e.g. host:0,1",
        ));
    }
    if o.min_bytes > o.max_bytes || o.step_factor < 2 || o.iters == 0 {
        return Err(Error::invalid(
            "need -b <= -e, a step factor -f of at least 2, and at least one iteration -n",
        ));
    }
    if o.iters > MAX_ITERS || o.warmup > MAX_ITERS {
        return Err(Error::invalid(format!(
            "-n {} and -w {}: at most {MAX_ITERS} iterations each (their timings are kept)",
            o.iters, o.warmup
        )));
    }
    let mut selector = Selector::from_env()?;
    if let Some(a) = &o.algorithm {
        let forced = Selector::parse(&format!("{}:{a}", o.collective.name()))?;
        selector.overrides.splice(0..0, forced.overrides);
    }
    let options = CommOptions {
        selector,
        ..CommOptions::from_env()?
    };
    // Started by mpirun or srun: one communicator over every process's devices.
    let across = super::launch::Launch::detect()?;
    let comm = match &across {
        Some(launch) => launch.communicator(devices.clone(), options)?,
        None => {
            let topology = Topology::discover_calibrated(&devices)?;
            Communicator::with_topology(devices.clone(), topology, options)?
        }
    };
    // Across processes, the first process prints for all.
    let printing = comm.first_rank() == 0;
    let n = comm.size();
    if o.root >= n {
        return Err(Error::invalid(format!(
            "root {} is not a rank of the {n} ranks",
            o.root
        )));
    }
    // One communicator per algorithm, each forced by an override, to time them all.
    let mut forced = Vec::new();
    if o.compare_algorithms && !comm.processes().is_empty() {
        return Err(Error::invalid(
            "--compare-algorithms times the in-process algorithms; run it without mpirun",
        ));
    }
    if o.compare_algorithms {
        for a in xpu_collectives::Algorithm::ALL {
            let sel = Selector::parse(&format!("{}:{}", o.collective.name(), a.name()))?;
            let t = Topology::discover_calibrated(&devices)?;
            let c = Communicator::with_topology(
                devices.clone(),
                t,
                CommOptions {
                    selector: sel,
                    ..CommOptions::from_env()?
                },
            )?;
            // Only algorithms that implement the operation.
            if c.algorithm_for(o.collective, o.min_bytes.max(1)).0 == a {
                forced.push((a, c));
            }
        }
    }
    let (mut chosen_fastest, mut compared) = (0usize, 0usize);
    let (mut enqueued_fastest, mut enqueued_compared) = (0usize, 0usize);
    // Sums of ln(chosen time / fastest time), for geometric means.
    let (mut chosen_log_ratio, mut enqueued_log_ratio) = (0.0f64, 0.0f64);
    let esize = o.dtype.size() as u64;
    // Sizes must split into whole elements per rank where the operation splits them.
    let unit = match o.collective {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
            esize * n as u64
        }
        _ => esize,
    };
    let factor = o.collective.bus_factor(n);
    let rooted = matches!(o.collective, Collective::Reduce | Collective::Broadcast);
    let redop = if matches!(
        o.collective,
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
    ) {
        o.op.name().to_string()
    } else {
        "none".to_string()
    };
    if !o.json {
        let ids: Vec<String> = match comm.processes() {
            [] => devices.iter().map(|d| d.id().to_string()).collect(),
            procs => procs
                .iter()
                .map(|p| format!("process {}: {}", p.index, p.devices.join(", ")))
                .collect(),
        };
        say!(
            printing,
            "# xpu bench collectives: {} on {n} ranks ({})",
            o.collective,
            ids.join("; ")
        );
        say!(printing,
            "# reference `ceiling`: every rank copying the same bytes within its own device at once, each copy"
        );
        say!(printing,
            "# right after a p50 sample (from 64 KiB; below, after all of them); `ratio`: busbw at the p50 time / ceiling"
        );
        say!(printing, "#");
        say!(printing,
            "# {:>10} {:>12} {:>8} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}   {:>8} {:>8}   {:>7} {:>6}  algo",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
            "algbw", "busbw", "#wrong", "p50", "p99", "ceiling", "ratio"
        );
        say!(printing,
            "# {:>10} {:>12} {:>8} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}   {:>8} {:>8}   {:>7} {:>6}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "o-o-p", "(us)", "(GB/s)",
            "(GB/s)", "in-pl", "(us)", "(us)", "(GB/s)", ""
        );
    }
    let mut all_right = true;
    let mut size = (o.min_bytes / unit).max(1) * unit;
    loop {
        if o.collective == Collective::Barrier {
            size = 0;
        }
        let oop = measure(&comm, o, size, false, true)?;
        let in_place_ok = o.collective != Collective::AllToAll
            && o.collective != Collective::SendRecv
            && o.collective != Collective::Barrier;
        let ip = if in_place_ok {
            Some(measure(&comm, o, size, true, false)?)
        } else {
            None
        };
        let ceiling_gbps = ceiling(&oop, size);
        let f_oop = figures(&oop, size, factor);
        let f_ip = ip.as_ref().map(|m| figures(m, size, factor));
        let wrong = f_oop.wrong.unwrap_or(0) + f_ip.and_then(|f| f.wrong).unwrap_or(0);
        all_right &= wrong == 0;
        let (algorithm, _) = comm.algorithm_for(o.collective, size);
        let mut algorithm_times_us = Vec::new();
        let mut chosen_was_fastest = None;
        let mut enqueued = None;
        if forced.len() > 1 {
            let quick = Options {
                check: false,
                ..o.clone()
            };
            use xpu_collectives::Algorithm;
            let mut best: Option<(Algorithm, f64)> = None;
            let mut best_enqueued: Option<(Algorithm, f64)> = None;
            for (a, c) in &forced {
                let t = measure(c, &quick, size, false, false)?.mean.as_secs_f64() * 1e6;
                algorithm_times_us.push((
                    a.name().to_string(),
                    t,
                    comm.estimate(o.collective, *a, size),
                ));
                if best.is_none_or(|(_, bt)| t < bt) {
                    best = Some((*a, t));
                }
                if *a != Algorithm::SharedMemory && best_enqueued.is_none_or(|(_, bt)| t < bt) {
                    best_enqueued = Some((*a, t));
                }
            }
            let fastest = best.map(|(a, _)| a) == Some(algorithm);
            let time_of = |which: Algorithm| {
                algorithm_times_us
                    .iter()
                    .find(|(a, _, _)| a == which.name())
                    .map(|(_, t, _)| *t)
            };
            if let (Some(t), Some((_, bt))) = (time_of(algorithm), best) {
                chosen_log_ratio += (t / bt.max(1e-9)).ln();
            }
            chosen_fastest += usize::from(fastest);
            compared += 1;
            chosen_was_fastest = Some(fastest);
            // Where shared memory was chosen, also judge the choice for busy streams.
            let busy = comm.enqueued_algorithm_for(o.collective, size).0;
            if algorithm == Algorithm::SharedMemory && busy != algorithm {
                let fastest = best_enqueued.map(|(a, _)| a) == Some(busy);
                if let (Some(t), Some((_, bt))) = (time_of(busy), best_enqueued) {
                    enqueued_log_ratio += (t / bt.max(1e-9)).ln();
                }
                enqueued_fastest += usize::from(fastest);
                enqueued_compared += 1;
                enqueued = Some((busy.name().to_string(), fastest));
            }
        }
        let row = Row {
            collective: o.collective.name(),
            size,
            count: size / esize,
            dtype: nccl_type(o.dtype),
            redop: redop.clone(),
            root: if rooted { o.root as i64 } else { -1 },
            // Across processes: the in-process algorithm (with more than one rank in a
            // process), then MPI between the processes.
            algorithm: match (comm.processes().is_empty(), comm.ranks().len()) {
                (true, _) => algorithm.name().to_string(),
                (false, 1) => "mpi".to_string(),
                (false, _) => format!("{}+mpi", algorithm.name()),
            },
            out_of_place: f_oop,
            in_place: f_ip.unwrap_or(Figures {
                time_us: 0.0,
                algbw: 0.0,
                busbw: 0.0,
                wrong: None,
                p50_us: 0.0,
                p99_us: 0.0,
            }),
            ceiling_gbps,
            // Like for like: the p50 sample and the ceiling are medians over the same
            // iterations, each started on every rank together.
            busbw_over_ceiling: if ceiling_gbps > 0.0 && f_oop.p50_us > 0.0 {
                size as f64 / (f_oop.p50_us * 1e3) * factor / ceiling_gbps
            } else {
                0.0
            },
            algorithm_times_us,
            chosen_was_fastest,
            enqueued,
        };
        if o.json {
            let text = serde_json::to_string(&row)
                .map_err(|e| Error::backend_message("xpu", format!("encoding JSON: {e}")))?;
            say!(printing, "{text}");
        } else {
            let w = |f: Option<usize>| f.map_or_else(|| "N/A".to_string(), |w| w.to_string());
            let (ip_t, ip_a, ip_b, ip_w) = match f_ip {
                Some(f) => (
                    format!("{:.2}", f.time_us),
                    format!("{:.2}", f.algbw),
                    format!("{:.2}", f.busbw),
                    w(f.wrong),
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            say!(printing,
                "  {:>10} {:>12} {:>8} {:>6} {:>5}   {:>9.2} {:>7.2} {:>7.2} {:>6}   {:>9} {:>7} {:>7} {:>6}   {:>8.2} {:>8.2}   {:>7.2} {:>6.2}  {}",
                row.size,
                row.count,
                row.dtype,
                row.redop,
                row.root,
                f_oop.time_us,
                f_oop.algbw,
                f_oop.busbw,
                w(f_oop.wrong),
                ip_t,
                ip_a,
                ip_b,
                ip_w,
                f_oop.p50_us,
                f_oop.p99_us,
                ceiling_gbps,
                row.busbw_over_ceiling,
                row.algorithm
            );
            if let Some(fastest) = row.chosen_was_fastest {
                let times: Vec<String> = row
                    .algorithm_times_us
                    .iter()
                    .map(|(a, t, model)| match model {
                        Some(m) => format!("{a} {t:.2} us (model {m:.2})"),
                        None => format!("{a} {t:.2} us"),
                    })
                    .collect();
                let yes = |b: bool| if b { "yes" } else { "no" };
                say!(
                    printing,
                    "  {:>10}   measured: {}; chosen ({}) was the fastest: {}",
                    "",
                    times.join(", "),
                    row.algorithm,
                    yes(fastest)
                );
                if let Some((busy, fastest)) = &row.enqueued {
                    say!(printing,
                        "  {:>10}   with busy streams: {busy}, the fastest of the enqueued ones: {}",
                        "",
                        yes(*fastest)
                    );
                }
            }
        }
        if o.collective == Collective::Barrier || size >= o.max_bytes {
            break;
        }
        let next = size.saturating_mul(o.step_factor).min(o.max_bytes);
        let next = (next / unit).max(1) * unit;
        // A maximum that is not a whole number of units rounds back down: stop there.
        if next <= size {
            break;
        }
        size = next;
    }
    if !o.json && compared > 0 {
        say!(printing,
            "# the cost model chose the fastest measured algorithm at {chosen_fastest} of {compared} sizes; its choices took {:.2}× the fastest's time (geometric mean)",
            (chosen_log_ratio / compared as f64).exp()
        );
        if enqueued_compared > 0 {
            say!(printing,
                "# with busy streams (no shared memory), it chose the fastest enqueued algorithm at {enqueued_fastest} of {enqueued_compared} sizes; its choices took {:.2}× the fastest enqueued one's time",
                (enqueued_log_ratio / enqueued_compared as f64).exp()
            );
        }
    }
    if !o.json {
        say!(
            printing,
            "# {} (all results checked: {})",
            if all_right {
                "0 wrong elements"
            } else {
                "WRONG ELEMENTS FOUND"
            },
            if o.check { "yes" } else { "no (-c 0)" }
        );
        let staging = xpu_memory::host_staging().stats();
        if staging.acquired > 0 {
            say!(printing,
                "# host staging (copies between devices that cannot reach each other): {:.1} MiB reserved, {:.1} MiB at peak; {} buffers handed out: {} idle, {} after a stream wait, {} new ({} over the limit); {} pinned for a device ({} refused)",
                staging.reserved_bytes as f64 / (1u64 << 20) as f64,
                staging.peak_reserved_bytes as f64 / (1u64 << 20) as f64,
                staging.acquired,
                staging.reused_idle,
                staging.reused_pending,
                staging.allocated,
                staging.over_limit,
                staging.pins,
                staging.pin_failures
            );
            if let Some(e) = xpu_memory::host_staging().last_pin_error() {
                say!(printing, "# the latest refusal to pin: {e}");
            }
        }
    }
    Ok(all_right)
}
