//! Communicators across processes under a real `mpirun`: each trial starts this same
//! test program in several processes (`XPU_MPI_CASE` names what they run), which form
//! one communicator with `Communicator::from_mpi` and check every operation element by
//! element, then the failure paths: desync, a stalled process, an abort.
//!
//! Without `mpirun` the trials are ignored, saying why — unless `XPU_REQUIRE_MPI=1`, as
//! CI sets, in which case they fail.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use xpu_collectives::comm::select::Selector;
use xpu_collectives::process::mpi::Mpi;
use xpu_collectives::topology::LinkClass;
use xpu_collectives::{Collective, CommOptions, Communicator, ReduceOp};
use xpu_hal::{DType, Device, DeviceSelector, Error, Registry};
use xpu_host::{HostBackend, HostConfig};

mod support;
use support::KINDS;

fn main() -> ExitCode {
    if let Ok(case) = std::env::var("XPU_MPI_CASE") {
        return match child(&case) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("process {}: {e}", std::process::id());
                ExitCode::FAILURE
            }
        };
    }
    let args = Arguments::from_args();
    let trials = vec![
        trial(
            "every_operation_between_two_processes_of_one_device",
            "one",
            2,
        ),
        trial(
            "every_operation_between_two_processes_of_two_devices",
            "two",
            2,
        ),
        trial(
            "every_operation_over_mpi_alone_when_a_process_turns_shared_memory_off",
            "no_shm",
            2,
        ),
        trial("three_processes_of_uneven_device_counts", "uneven", 3),
        trial("processes_that_disagree_are_told_of_a_desync", "desync", 2),
        trial("a_stalled_process_is_named_within_the_timeout", "stall", 2),
        trial("an_abort_releases_the_other_processes", "abort", 2),
        trial("a_dead_process_is_named_within_the_timeout", "kill", 2),
        trial(
            "the_survivors_of_a_dead_process_shrink_the_communicator_and_go_on",
            "shrink",
            3,
        ),
        trial("sends_and_receives_cross_processes_in_order", "p2p", 2),
        trial(
            "the_topology_spans_the_processes_and_their_links_are_measured",
            "topology",
            3,
        ),
        trial(
            "every_operation_over_machines_of_unequal_sizes_is_exact",
            "machines",
            4,
        ),
        trial(
            "every_operation_over_machines_of_equal_sizes_is_exact",
            "machines_even",
            4,
        ),
        trial(
            "a_process_without_devices_is_named_on_every_process",
            "empty",
            2,
        ),
        trial(
            "every_operation_through_a_plugins_library_across_processes",
            "native",
            2,
        ),
        trial(
            "a_plugins_library_across_processes_finds_processes_that_disagree",
            "native_desync",
            2,
        ),
        trial(
            "a_stalled_process_is_named_by_a_plugins_library_across_processes",
            "native_stall",
            2,
        ),
        trial(
            "a_host_and_a_plugin_device_in_each_process_are_exact",
            "mixed",
            2,
        ),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}

fn required() -> bool {
    std::env::var("XPU_REQUIRE_MPI").is_ok_and(|v| v.trim() == "1")
}

/// A trial that runs `case` in `processes` processes under mpirun.
fn trial(name: &'static str, case: &'static str, processes: usize) -> Trial {
    Trial::ignorable_test(name, move || {
        let probe = Command::new("mpirun").arg("--version").output();
        if probe.as_ref().map_or(true, |o| !o.status.success()) {
            let why = "mpirun is not installed (scripts/deps.sh installs Open MPI)";
            if required() {
                return Err(Failed::from(format!("{why}, and XPU_REQUIRE_MPI=1")));
            }
            return Ok(Completion::ignored_with(why));
        }
        let exe = std::env::current_exe().map_err(|e| Failed::from(e.to_string()))?;
        let started = Instant::now();
        let dies = case == "kill" || case == "shrink";
        // A run that hangs is killed (and fails) rather than holding the suite up.
        let mut mpirun = Command::new("timeout");
        mpirun.args(["--kill-after=10", "300", "mpirun"]);
        if dies {
            // Without it Open MPI ends the whole job when one process dies.
            mpirun.arg("--enable-recovery");
        }
        let out = mpirun
            .args(["-np", &processes.to_string(), "--oversubscribe"])
            .arg(exe)
            .env("XPU_MPI_CASE", case)
            // Open MPI refuses to run as root unless told that it is meant.
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            // The launcher need not look for network interfaces: one machine.
            .env("OMPI_MCA_btl", "self,vader")
            .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
            .output()
            .map_err(|e| Failed::from(format!("mpirun did not start: {e}")))?;
        // Every process but the one that dies says so.
        let survived = String::from_utf8_lossy(&out.stdout)
            .matches(SURVIVED)
            .count()
            == processes - 1;
        if dies && survived {
            return Ok(Completion::Completed);
        }
        if dies || !out.status.success() {
            return Err(Failed::from(format!(
                "mpirun -np {processes} ({case}) failed after {:.1} s with {}:\n{}\n{}",
                started.elapsed().as_secs_f64(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(Completion::Completed)
    })
}

fn host_devices(count: usize) -> xpu_hal::Result<Vec<Device>> {
    let mut r = Registry::new();
    r.register(Arc::new(HostBackend::new(HostConfig {
        devices: count as u32,
        capacity: 256 << 20,
    })))?;
    r.devices(&DeviceSelector::parse("host:*")?)
}

fn communicator(mpi: &Mpi, devices: usize, timeout: Duration) -> xpu_hal::Result<Communicator> {
    Communicator::from_mpi(
        mpi,
        host_devices(devices)?,
        CommOptions {
            timeout,
            selector: Selector::default(),
        },
    )
}

type Outcome = Result<(), String>;

/// A communicator with a short `timeout`, formed once the processes have met on one
/// with a long timeout: however late each process starts, none waits for the other to
/// form it.
fn short_communicator(mpi: &Mpi, timeout: Duration) -> xpu_hal::Result<Communicator> {
    let long = communicator(mpi, 1, Duration::from_secs(120))?;
    on_every_rank(&long, |rank, stream| rank.barrier(stream)).map_err(Error::invalid)?;
    communicator(mpi, 1, timeout)
}

/// What the surviving process of the `kill` case prints once it has checked its error.
const SURVIVED: &str = "xpu-mpi-test: the survivor named the dead process";

fn child(case: &str) -> Outcome {
    let mpi = Mpi::init().map_err(|e| e.to_string())?;
    match case {
        "one" => {
            let comm = communicator(&mpi, 1, Duration::from_secs(60)).map_err(|e| e.to_string())?;
            if !comm.shares_memory_between_processes() {
                return Err("the processes of one machine share no memory".into());
            }
            sweep(&comm)
        }
        "no_shm" => {
            // One process says no: no process shares memory, and all goes over MPI.
            if mpi.rank() == 1 {
                // Set before the communicator reads it; nothing else runs yet.
                std::env::set_var("XPU_COLL_SHM", "off");
            }
            let comm = communicator(&mpi, 2, Duration::from_secs(60)).map_err(|e| e.to_string())?;
            if comm.shares_memory_between_processes() {
                return Err("memory is shared though a process turned it off".into());
            }
            sweep(&comm)
        }
        "two" => sweep(&communicator(&mpi, 2, Duration::from_secs(60)).map_err(|e| e.to_string())?),
        "uneven" => {
            // One, two and three devices: ranks 0, 1–2 and 3–5.
            let comm = communicator(&mpi, mpi.rank() + 1, Duration::from_secs(60))
                .map_err(|e| e.to_string())?;
            if comm.size() != 6 || comm.first_rank() != [0, 1, 3][mpi.rank()] {
                return Err(format!(
                    "{} ranks, this process's first {}",
                    comm.size(),
                    comm.first_rank()
                ));
            }
            sweep(&comm)
        }
        "desync" => desync(&mpi),
        "stall" => stall(&mpi),
        "abort" => abort(&mpi),
        "kill" => kill(&mpi),
        "shrink" => shrink(&mpi),
        "p2p" => p2p(&mpi),
        "topology" => topology(&mpi),
        "machines" => machines(&mpi),
        "machines_even" => machines_even(&mpi),
        "empty" => empty(&mpi),
        "native" => native(&mpi),
        "native_desync" => native_desync(&mpi),
        "native_stall" => native_stall(&mpi),
        "mixed" => mixed(&mpi),
        other => Err(format!("unknown case {other}")),
    }
}

/// Every operation in and out of place, several dtypes and sizes (odd ones, and all-reduces
/// large enough to take two rounds between processes), every reduction.
fn sweep(comm: &Communicator) -> Outcome {
    let mut checked = 0;
    for kind in KINDS {
        for dtype in [DType::F32, DType::I32, DType::BF16] {
            for elems in [1, 7, 20_003] {
                for in_place in [false, true] {
                    if kind == Collective::AllToAll && in_place {
                        continue;
                    }
                    let wrong = support::run(comm, kind, dtype, ReduceOp::Sum, elems, in_place);
                    if wrong.iter().any(|&w| w != 0) {
                        return Err(format!(
                            "{kind} of {elems} × {dtype:?} (in place: {in_place}): wrong elements per local rank {wrong:?}"
                        ));
                    }
                    checked += 1;
                }
            }
        }
    }
    // Messages of several steps of the processes' shared memory (a step moves at most
    // 256 KiB per process, or its share per destination).
    for kind in KINDS {
        for in_place in [false, true] {
            if kind == Collective::AllToAll && in_place {
                continue;
            }
            let wrong = support::run(comm, kind, DType::F32, ReduceOp::Sum, 150_001, in_place);
            if wrong.iter().any(|&w| w != 0) {
                return Err(format!(
                    "{kind} of 150001 × F32 (in place: {in_place}): wrong elements per local rank {wrong:?}"
                ));
            }
            checked += 1;
        }
    }
    for op in ReduceOp::ALL {
        for kind in [
            Collective::AllReduce,
            Collective::Reduce,
            Collective::ReduceScatter,
        ] {
            for dtype in [DType::F32, DType::I64] {
                let wrong = support::run(comm, kind, dtype, op, 1_001, false);
                if wrong.iter().any(|&w| w != 0) {
                    return Err(format!("{kind} {op} of {dtype:?}: wrong {wrong:?}"));
                }
                checked += 1;
            }
        }
    }
    // A stream of another device is refused before anything crosses processes (the
    // other process is not waiting for it: it never arrives there).
    let ranks = comm.ranks();
    if let [first, second, ..] = ranks.as_slice() {
        let foreign = second.device().create_stream().map_err(|e| e.to_string())?;
        let buf = first.device().allocate(64).map_err(|e| e.to_string())?;
        match first.all_reduce(&buf, &buf, DType::F32, ReduceOp::Sum, &foreign) {
            Err(Error::InvalidArgument { .. }) => {}
            got => return Err(format!("a foreign stream was not refused: {got:?}")),
        }
    }
    on_every_rank(comm, |rank, stream| rank.barrier(stream))?;
    if checked == 0 {
        return Err("nothing was checked".into());
    }
    Ok(())
}

/// Runs `f` on every local rank, each on its own thread.
fn on_every_rank(
    comm: &Communicator,
    f: impl Fn(&xpu_collectives::Rank, &xpu_hal::Stream) -> xpu_hal::Result<()> + Sync,
) -> Outcome {
    std::thread::scope(|s| {
        let handles: Vec<_> = comm
            .ranks()
            .into_iter()
            .map(|rank| {
                let f = &f;
                s.spawn(move || {
                    let stream = rank.device().create_stream().map_err(|e| e.to_string())?;
                    f(&rank, &stream).map_err(|e| format!("rank {}: {e}", rank.rank()))?;
                    stream.synchronize().map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err("a rank's thread panicked".into()))
        })
    })
}

/// Process 0 all-reduces 4 elements, process 1 eight: both are told of a desync naming
/// the other process and what it called.
fn desync(mpi: &Mpi) -> Outcome {
    let comm = communicator(mpi, 1, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    let rank = comm.rank(comm.first_rank()).map_err(|e| e.to_string())?;
    let stream = rank.device().create_stream().map_err(|e| e.to_string())?;
    let elems = if mpi.rank() == 0 { 4 } else { 8 };
    let buf = rank
        .device()
        .allocate(elems * 4)
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let result = rank.all_reduce(&buf, &buf, DType::F32, ReduceOp::Sum, &stream);
    let other = 1 - mpi.rank();
    match result {
        // Found here, or told by the other process, which found it first.
        Err(Error::InvalidArgument { message } | Error::Aborted { message })
            if message.contains("desync")
                && message.contains(&format!("process {other}"))
                && message.contains("allreduce of") =>
        {
            // Far less than the 30 s timeout: the headers, not the timeout, told.
            if started.elapsed() > Duration::from_secs(20) {
                return Err(format!("the desync took {:?} to show", started.elapsed()));
            }
        }
        other => return Err(format!("expected a desync, got {other:?}")),
    }
    // The communicator is failed from then on.
    match rank.barrier(&stream) {
        Err(_) => Ok(()),
        Ok(()) => Err("the communicator went on after a desync".into()),
    }
}

/// Process 1 comes 8 s late to an operation with a 3 s timeout: process 0 is told that
/// process 1 never came, and process 1, later, that process 0 gave up (aborted).
fn stall(mpi: &Mpi) -> Outcome {
    let timeout = Duration::from_secs(3);
    let comm = short_communicator(mpi, timeout).map_err(|e| e.to_string())?;
    let rank = comm.rank(comm.first_rank()).map_err(|e| e.to_string())?;
    let stream = rank.device().create_stream().map_err(|e| e.to_string())?;
    let buf = rank.device().allocate(4096).map_err(|e| e.to_string())?;
    if mpi.rank() == 1 {
        std::thread::sleep(Duration::from_secs(8));
    }
    let started = Instant::now();
    let result = rank.all_reduce(&buf, &buf, DType::F32, ReduceOp::Sum, &stream);
    let took = started.elapsed();
    // A guard against waiting for the late process, not a timing check: the bound
    // (timeout + 1 s) is for benchmarks.
    if took > timeout + Duration::from_secs(15) {
        return Err(format!("the operation took {took:?} to fail"));
    }
    match (mpi.rank(), result) {
        (0, Err(Error::Timeout { message }))
            if message.contains("process 1")
                && message.contains("pid")
                && message.contains("operation #0") =>
        {
            Ok(())
        }
        // The late process finds the communicator aborted by the one that gave up.
        (1, Err(Error::Aborted { message }))
            if message.contains("process 0") && message.contains("did not come in time") =>
        {
            Ok(())
        }
        (_, got) => Err(format!("expected the other process named, got {got:?}")),
    }
}

/// Process 0 aborts while process 1 waits in an all-reduce with a long timeout: process 1
/// returns at once, told that process 0 aborted.
fn abort(mpi: &Mpi) -> Outcome {
    let comm = communicator(mpi, 1, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    let rank = comm.rank(comm.first_rank()).map_err(|e| e.to_string())?;
    let stream = rank.device().create_stream().map_err(|e| e.to_string())?;
    let buf = rank.device().allocate(4096).map_err(|e| e.to_string())?;
    if mpi.rank() == 0 {
        std::thread::sleep(Duration::from_millis(500));
        comm.abort();
        return match rank.all_reduce(&buf, &buf, DType::F32, ReduceOp::Sum, &stream) {
            Err(Error::Aborted { .. }) => Ok(()),
            other => Err(format!("an aborted communicator answered {other:?}")),
        };
    }
    let started = Instant::now();
    match rank.all_reduce(&buf, &buf, DType::F32, ReduceOp::Sum, &stream) {
        Err(Error::Aborted { message })
            if message.contains("process 0") && message.contains("application aborted") =>
        {
            // Far less than the 60 s timeout: the abort, not the timeout, released it.
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!("the abort took {:?} to arrive", started.elapsed()));
            }
            Ok(())
        }
        other => Err(format!("expected an abort by process 0, got {other:?}")),
    }
}

/// Process 1 dies (abort, SIGABRT) after the communicator is formed: process 0 is told,
/// within the timeout and a second, that process 1 never came. (mpirun runs it with
/// `--enable-recovery`, so that the survivor is not killed with the job.)
fn kill(mpi: &Mpi) -> Outcome {
    let timeout = Duration::from_secs(3);
    let comm = short_communicator(mpi, timeout).map_err(|e| e.to_string())?;
    let rank = comm.rank(comm.first_rank()).map_err(|e| e.to_string())?;
    let stream = rank.device().create_stream().map_err(|e| e.to_string())?;
    let buf = rank.device().allocate(4096).map_err(|e| e.to_string())?;
    if mpi.rank() == 1 {
        std::process::abort();
    }
    let started = Instant::now();
    let result = rank.all_reduce(&buf, &buf, DType::F32, ReduceOp::Sum, &stream);
    let took = started.elapsed();
    match result {
        // Within far less than the 60 s the dead process would have taken to be
        // waited for (a guard, not a timing check).
        Err(Error::Timeout { message })
            if message.contains("process 1") && took <= timeout + Duration::from_secs(15) =>
        {
            println!("{SURVIVED}");
            Ok(())
        }
        got => Err(format!(
            "expected a timeout naming process 1, got {got:?} after {took:?}"
        )),
    }
}

/// Of three processes, process 1 dies after the communicator is formed (two devices
/// each): the other two are told, shrink the communicator to their four ranks, agree
/// on who they are, and all-reduce on it right.
fn shrink(mpi: &Mpi) -> Outcome {
    let timeout = Duration::from_secs(5);
    let long = communicator(mpi, 1, Duration::from_secs(120)).map_err(|e| e.to_string())?;
    on_every_rank(&long, |rank, stream| rank.barrier(stream))?;
    let comm = communicator(mpi, 2, timeout).map_err(|e| e.to_string())?;
    if mpi.rank() == 1 {
        std::process::abort();
    }
    let failed = on_every_rank(&comm, |rank, stream| {
        let buf = rank.device().allocate(64)?;
        rank.all_reduce(&buf, &buf, DType::F32, ReduceOp::Sum, stream)
    });
    // Named by whichever survivor timed out first; the other hears of its abort.
    match &failed {
        Err(e) if e.contains("process 1") || e.contains("did not come in time") => {}
        other => {
            return Err(format!(
                "expected a failure naming process 1, got {other:?}"
            ))
        }
    }
    let shrunk = comm.shrink().map_err(|e| format!("shrink: {e}"))?;
    let me = usize::from(mpi.rank() == 2);
    if shrunk.size() != 4 || shrunk.processes().len() != 2 || shrunk.first_rank() != 2 * me {
        return Err(format!(
            "the shrunk communicator has {} ranks over {:?}, this process's first {}",
            shrunk.size(),
            shrunk.processes(),
            shrunk.first_rank()
        ));
    }
    // Each rank contributes its old process's index + 1 in every element: 1 + 1 + 3 + 3.
    let value = mpi.rank() as f32 + 1.0;
    on_every_rank(&shrunk, |rank, stream| {
        let elems = 1000usize;
        let buf = rank.device().allocate((elems * 4) as u64)?;
        stream.write(&buf, bytemuck::cast_slice(&vec![value; elems]))?;
        rank.all_reduce(&buf, &buf, DType::F32, ReduceOp::Sum, stream)?;
        stream.synchronize()?;
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&stream.read(&buf)?);
        if got.iter().any(|&v| v != 8.0) {
            return Err(Error::invalid(format!(
                "rank {} got {:?}",
                rank.rank(),
                &got[..4]
            )));
        }
        Ok(())
    })?;
    println!("{SURVIVED}");
    Ok(())
}

/// Two ranks per process in a ring: each sends two messages (5 bytes, then 100 KiB) to
/// the next rank — in its own process or the other — and receives the previous rank's,
/// in the order sent.
fn p2p(mpi: &Mpi) -> Outcome {
    let comm = communicator(mpi, 2, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    let n = comm.size();
    let message = |from: usize, len: usize| -> Vec<u8> {
        (0..len).map(|i| (from * 31 + i * 7 + len) as u8).collect()
    };
    on_every_rank(&comm, |rank, stream| {
        let r = rank.rank();
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let device = rank.device();
        let mut bufs = Vec::new();
        for len in [5usize, 100 << 10] {
            let b = device.allocate(len as u64)?;
            stream.write(&b, &message(r, len))?;
            rank.send(&b, next, stream)?;
            bufs.push(b);
        }
        for len in [5usize, 100 << 10] {
            let b = device.allocate(len as u64)?;
            rank.recv(&b, prev, stream)?;
            stream.synchronize()?;
            if stream.read(&b)? != message(prev, len) {
                return Err(Error::invalid(format!(
                    "rank {r} received the wrong {len} bytes from rank {prev}"
                )));
            }
        }
        stream.synchronize()?;
        drop(bufs);
        Ok(())
    })
}

/// Process 1 selects no device: every process is refused, naming process 1.
fn empty(mpi: &Mpi) -> Outcome {
    let devices = if mpi.rank() == 1 {
        Vec::new()
    } else {
        host_devices(1).map_err(|e| e.to_string())?
    };
    let options = CommOptions {
        timeout: Duration::from_secs(60),
        selector: Selector::default(),
    };
    match Communicator::from_mpi(mpi, devices, options) {
        Err(Error::InvalidArgument { message })
            if message.contains("process 1") && message.contains("no device") =>
        {
            Ok(())
        }
        got => Err(format!("expected a refusal naming process 1, got {got:?}")),
    }
}

/// Three processes of one, two and one devices: the topology names every process's
/// devices, classes the links between processes as cross-process, groups each
/// process's devices, and measures every pair of processes; operations go on after.
fn topology(mpi: &Mpi) -> Outcome {
    let counts = [1, 2, 1];
    let comm = communicator(mpi, counts[mpi.rank()], Duration::from_secs(60))
        .map_err(|e| e.to_string())?;
    let t = comm.global_topology();
    let ids: Vec<&str> = t.devices.iter().map(|d| d.id.as_str()).collect();
    if ids != ["host:0@p0", "host:0@p1", "host:1@p1", "host:0@p2"] {
        return Err(format!("devices {ids:?}"));
    }
    let class = |a, b| t.link(a, b).map(|l| l.class).map_err(|e| e.to_string());
    if class(0, 1)? != LinkClass::CrossProcess
        || class(1, 3)? != LinkClass::CrossProcess
        || class(1, 2)? != LinkClass::SharedMemory
    {
        return Err(format!(
            "links {:?} {:?} {:?}",
            class(0, 1),
            class(1, 3),
            class(1, 2)
        ));
    }
    if t.groups() != vec![vec![0], vec![1, 2], vec![3]] {
        return Err(format!("groups {:?}", t.groups()));
    }
    let pairs = comm
        .calibrate_processes(1 << 20)
        .map_err(|e| e.to_string())?;
    let found: Vec<(usize, usize)> = pairs.iter().map(|m| (m.a, m.b)).collect();
    if found != [(0, 1), (0, 2), (1, 2)]
        || pairs.iter().any(|m| {
            !(m.latency_us > 0.0 && m.bandwidth_gbps > 0.0 && m.bandwidth_gbps.is_finite())
        })
    {
        return Err(format!("measured {pairs:?}"));
    }
    let t = comm.global_topology();
    for (a, b) in [(0, 1), (2, 3), (3, 0)] {
        let l = t.link(a, b).map_err(|e| e.to_string())?;
        if !l.measured {
            return Err(format!("link {a} → {b} was not measured: {l:?}"));
        }
    }
    if t.link(1, 2).map_err(|e| e.to_string())?.measured {
        return Err("a link within a process was changed".into());
    }
    // Operations go on after the measurement.
    sweep_one(&comm)
}

/// One exact all-reduce on every rank.
fn sweep_one(comm: &Communicator) -> Outcome {
    let wrong = support::run(
        comm,
        Collective::AllReduce,
        DType::F32,
        ReduceOp::Sum,
        1000,
        false,
    );
    if wrong.iter().any(|&w| w != 0) {
        return Err(format!("wrong elements per rank {wrong:?}"));
    }
    Ok(())
}

/// Four processes standing for two machines (XPU_NODE_NAME): processes 0, 1 and 3 on
/// one, 2 on the other, so that the first machine's processes are not contiguous and
/// the machines differ in size (large all-reduces go through each machine's leader).
fn machines(mpi: &Mpi) -> Outcome {
    over_machines(
        mpi,
        if mpi.rank() == 2 {
            "machine-b"
        } else {
            "machine-a"
        },
        1,
    )
}

/// Four processes standing for two machines of two processes each, interleaved (0 and 2
/// on one, 1 and 3 on the other): large all-reduces, reduce-scatters and all-gathers
/// run in two dimensions. Process 0 holds two ranks, so the processes' blocks differ
/// in size.
fn machines_even(mpi: &Mpi) -> Outcome {
    let machine = if mpi.rank().is_multiple_of(2) {
        "machine-a"
    } else {
        "machine-b"
    };
    over_machines(mpi, machine, if mpi.rank() == 0 { 2 } else { 1 })
}

/// This process stands on `machine`, with `devices` host devices: links between the
/// machines are network links, links within one are between processes; small and large
/// all-reduces (which are grouped by machine) are exact in every dtype and reduction, in
/// place and out of place, and so are the other operations at a large size (root the
/// last rank, which is not its machine's first).
fn over_machines(mpi: &Mpi, machine: &str, devices: usize) -> Outcome {
    // Set before the communicator reads it; nothing else runs in this process yet.
    std::env::set_var("XPU_NODE_NAME", machine);
    let comm = communicator(mpi, devices, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    let t = comm.global_topology();
    let class = |a, b| t.link(a, b).map(|l| l.class).map_err(|e| e.to_string());
    let procs = comm.processes();
    let process_of = |r: usize| {
        procs
            .iter()
            .find(|p| (p.first_rank..p.first_rank + p.ranks()).contains(&r))
            .map(|p| (p.index, p.host.clone()))
    };
    for a in 0..comm.size() {
        for b in (0..comm.size()).filter(|&b| b != a) {
            let (pa, pb) = (process_of(a), process_of(b));
            let want = match (pa, pb) {
                (Some(x), Some(y)) if x.0 == y.0 => continue,
                (Some(x), Some(y)) if x.1 == y.1 => LinkClass::CrossProcess,
                (Some(_), Some(_)) => LinkClass::Network,
                _ => return Err(format!("rank {a} or {b} is in no process")),
            };
            if class(a, b)? != want {
                return Err(format!("link {a}–{b}: {:?}, not {want:?}", class(a, b)));
            }
        }
    }
    // 40,003 elements take the large path between processes in every dtype here (over
    // 64 KiB), and are cut into blocks of odd sizes.
    for dtype in [DType::F32, DType::I32, DType::BF16, DType::F64] {
        for op in ReduceOp::ALL {
            for elems in [1, 7, 1000, 40_003] {
                for in_place in [false, true] {
                    let wrong =
                        support::run(&comm, Collective::AllReduce, dtype, op, elems, in_place);
                    if wrong.iter().any(|&w| w != 0) {
                        return Err(format!(
                            "{} {op} × {elems} in_place={in_place}: wrong per rank {wrong:?}",
                            dtype.name()
                        ));
                    }
                }
            }
        }
    }
    for kind in KINDS {
        for in_place in [false, true] {
            if kind == Collective::AllToAll && in_place {
                continue;
            }
            let wrong = support::run(&comm, kind, DType::F32, ReduceOp::Sum, 40_003, in_place);
            if wrong.iter().any(|&w| w != 0) {
                return Err(format!(
                    "{kind} of 40003 × F32 (in place: {in_place}): wrong per rank {wrong:?}"
                ));
            }
        }
    }
    // Reduces and broadcasts rooted at every rank: first on its machine or not.
    for root in 0..comm.size() {
        for kind in [Collective::Reduce, Collective::Broadcast] {
            for elems in [7, 40_003] {
                let wrong =
                    support::run_rooted(&comm, kind, DType::F32, ReduceOp::Sum, elems, false, root);
                if wrong.iter().any(|&w| w != 0) {
                    return Err(format!(
                        "{kind} of {elems} × F32 at root {root}: wrong per rank {wrong:?}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The devices `selector` picks from one host device and the sim-npu plugin.
fn mixed_devices(selector: &str) -> xpu_hal::Result<Vec<Device>> {
    let mut r = Registry::new();
    r.register(Arc::new(HostBackend::new(HostConfig {
        devices: 1,
        capacity: 256 << 20,
    })))?;
    r.register(Arc::new(xpu_plugin::PluginBackend::load(
        support::sim_npu(),
    )?))?;
    r.devices(&DeviceSelector::parse(selector)?)
}

/// A communicator over `selector`'s devices in this process, with `overrides`.
fn comm_over(mpi: &Mpi, selector: &str, overrides: &str) -> Result<Communicator, String> {
    comm_timed(mpi, selector, overrides, Duration::from_secs(60))
}

/// [`comm_over`] with a timeout.
fn comm_timed(
    mpi: &Mpi,
    selector: &str,
    overrides: &str,
    timeout: Duration,
) -> Result<Communicator, String> {
    Communicator::from_mpi(
        mpi,
        mixed_devices(selector).map_err(|e| e.to_string())?,
        CommOptions {
            timeout,
            selector: Selector::parse(overrides).map_err(|e| e.to_string())?,
        },
    )
    .map_err(|e| e.to_string())
}

/// Two sim-npu devices in process 0 and one in process 1, every operation forced
/// through simccl across the processes: its group spans them (the library is named),
/// and every operation, dtype and reduction is exact, in place and out of place. The
/// slots are 4 KiB, so the larger operations run in many steps.
fn native(mpi: &Mpi) -> Outcome {
    // Set before the plugin reads it; nothing else runs in this process yet.
    std::env::set_var("XPU_SIMNPU_CCL_SLOT", "4K");
    let selector = if mpi.rank() == 0 {
        "plugin.simnpu:0,1"
    } else {
        "plugin.simnpu:0"
    };
    let comm = comm_over(mpi, selector, &support::forced("native"))?;
    if comm.native_library().as_deref() != Some("simccl 1.0") || comm.size() != 3 {
        return Err(format!(
            "{} ranks, library {:?}",
            comm.size(),
            comm.native_library()
        ));
    }
    sweep(&comm)
}

/// Process 0 all-gathers 4 bytes per rank through simccl across processes, process 1
/// eight: the library finds that they enqueued different operations and says so, on
/// both sides (or the other side learns that this one failed), within the timeout.
fn native_desync(mpi: &Mpi) -> Outcome {
    let comm = comm_over(mpi, "plugin.simnpu:0", &support::forced("native"))?;
    let rank = comm.rank(comm.first_rank()).map_err(|e| e.to_string())?;
    let stream = rank.device().create_stream().map_err(|e| e.to_string())?;
    let bytes = if mpi.rank() == 0 { 4 } else { 8 };
    let send = rank.device().allocate(bytes).map_err(|e| e.to_string())?;
    let recv = rank
        .device()
        .allocate(bytes * 2)
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    rank.all_gather(&send, &recv, &stream)
        .map_err(|e| format!("the all-gather was refused: {e}"))?;
    match stream.synchronize() {
        Err(e)
            if e.to_string().contains("enqueued another operation")
                || e.to_string().contains("failed, never ran its part") =>
        {
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!("the desync took {:?} to show", started.elapsed()));
            }
            Ok(())
        }
        other => Err(format!("expected simccl to find a desync, got {other:?}")),
    }
}

/// Process 1 never takes part in an all-reduce that process 0 hands to simccl across
/// the processes, with a 3 s timeout: process 0's part fails with a timeout naming rank
/// 1 and its process id, within the timeout and a margin, and nothing hangs.
fn native_stall(mpi: &Mpi) -> Outcome {
    let native = support::forced("native");
    // Met first with a long timeout, so that neither waits for the other to start.
    let long = comm_over(mpi, "plugin.simnpu:0", &native)?;
    on_every_rank(&long, |rank, stream| rank.barrier(stream))?;
    let timeout = Duration::from_secs(3);
    let comm = comm_timed(mpi, "plugin.simnpu:0", &native, timeout)?;
    on_every_rank(&long, |rank, stream| rank.barrier(stream))?;
    if mpi.rank() == 1 {
        std::thread::sleep(Duration::from_secs(6));
        return Ok(());
    }
    let rank = comm.rank(0).map_err(|e| e.to_string())?;
    let stream = rank.device().create_stream().map_err(|e| e.to_string())?;
    let buf = rank.device().allocate(64).map_err(|e| e.to_string())?;
    let started = Instant::now();
    rank.all_reduce(&buf, &buf, DType::F32, ReduceOp::Sum, &stream)
        .map_err(|e| format!("the all-reduce was refused: {e}"))?;
    let peer = format!("1 (process {})", mpi_pid_of_peer(&comm));
    match stream.synchronize() {
        Err(Error::Timeout { message }) if message.contains(&peer) => {
            let took = started.elapsed();
            if took > timeout + Duration::from_secs(2) {
                return Err(format!("the timeout took {took:?}"));
            }
            Ok(())
        }
        other => Err(format!(
            "expected a timeout naming rank {peer}, got {other:?}"
        )),
    }
}

/// The process id of the process holding rank 1.
fn mpi_pid_of_peer(comm: &Communicator) -> u32 {
    comm.processes()
        .iter()
        .find(|p| p.first_rank == 1)
        .map_or(0, |p| p.pid)
}

/// A host device and a sim-npu device in each process: no library spans them, and the
/// communicator's own algorithms are exact for every operation.
fn mixed(mpi: &Mpi) -> Outcome {
    let comm = comm_over(mpi, "host:0;plugin.simnpu:0", "")?;
    if comm.size() != 4 {
        return Err(format!("{} ranks", comm.size()));
    }
    sweep(&comm)
}
