//! The `xpu` command: list devices and run the conformance suite.

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xpu::{DeviceSelector, Result};

/// xpu: one runtime for every accelerator in the machine.
///
/// With no subcommand, lists the devices and runs the core conformance profile on the
/// host devices.
#[derive(Parser, Debug)]
#[command(name = "xpu", version, about, long_about = None)]
struct Cli {
    /// Load a vendor plugin: a shared library or a folder of them (repeatable; also
    /// from the colon-separated XPU_PLUGIN_PATH).
    #[arg(long = "plugin", value_name = "PATH", global = true)]
    plugins: Vec<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Per-operation precision: every standard operation the devices share with the
    /// reference device, on identical inputs, with max absolute and relative error,
    /// cosine similarity and the shares of elements beyond 0.1% and 0.5% relative error;
    /// exits 1 when any is out of tolerance. With `--dumps A B`, the same for two tensor
    /// dumps.
    Compare {
        /// The reference device (default: host:0).
        #[arg(long, default_value = "host:0")]
        reference: String,
        /// Devices to compare with it (default: XPU_DEVICES, else every device).
        #[arg(long)]
        devices: Option<String>,
        /// Operations to compare, comma-separated (default: all the devices share).
        #[arg(long)]
        ops: Option<String>,
        /// Compare two tensor dumps (reference first) instead of devices.
        #[arg(long, num_args = 2, value_names = ["REFERENCE", "OTHER"])]
        dumps: Vec<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Train a model data-parallel over the devices: one replica per device, the batch
    /// shared in proportion to their speed, gradients all-reduced as the backward pass
    /// finishes them.
    Train(cli::train::TrainArgs),
    /// List devices and backends.
    Devices {
        /// Devices to list, e.g. `host:0,1;vulkan:*` (default: XPU_DEVICES, else every
        /// device).
        #[arg(long)]
        devices: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run the conformance suite against devices.
    Conformance {
        /// Devices to test, e.g. `host:*` (default: XPU_DEVICES, else every device).
        #[arg(long)]
        devices: Option<String>,
        /// The profile to run.
        #[arg(long, default_value = "core")]
        profile: String,
        /// Write a JSON report to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Write a JUnit XML report to this file.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// A JSON file of expected failures to add (repeatable).
        #[arg(long, value_name = "FILE")]
        expectations: Vec<PathBuf>,
        /// Run only the case instances whose name contains this text.
        #[arg(long)]
        filter: Option<String>,
        /// List the profile's cases and exit.
        #[arg(long)]
        list: bool,
        /// Backends that must have a device in the run, comma-separated (default:
        /// XPU_REQUIRE); a trailing `*` is a prefix wildcard.
        #[arg(long, value_name = "BACKENDS")]
        require: Option<String>,
        /// Write a certificate of the run to this file: the xpu and plugin ABI
        /// versions, a hash of the suite, each device's identity (with its plugin
        /// library's SHA-256), every result with its reason, the command and the date.
        #[arg(long, value_name = "FILE", conflicts_with = "filter")]
        certificate: Option<PathBuf>,
        /// Rerun the profile of this certificate and check it: same suite, the same
        /// devices (by identity), every case with the certified status.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["filter", "profile"])]
        check_certificate: Option<PathBuf>,
        /// How long one case may run, in seconds, before it counts as a failure (a
        /// device that hangs).
        #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
        case_timeout: f64,
    },
    /// Show the machine's topology: NUMA nodes, devices, and the link class, latency and
    /// bandwidth between every pair of devices.
    Topo {
        /// Devices to include (default: XPU_DEVICES, else every device).
        #[arg(long)]
        devices: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Print the topology in NCCL's XML format (devices with a PCI address only).
        #[arg(long, conflicts_with = "json")]
        xml: bool,
        /// Read the machine from an NCCL XML topology file instead of hwloc (default:
        /// XPU_TOPO_FILE), for VMs whose PCI tree hides the real one.
        #[arg(long, value_name = "FILE", env = "XPU_TOPO_FILE")]
        topo_file: Option<PathBuf>,
        /// Measure every link and store the figures in the calibration cache
        /// (XPU_CACHE_DIR, else ~/.cache/xpu).
        #[arg(long)]
        calibrate: bool,
        /// Bytes of the calibration's bandwidth transfer.
        #[arg(long, default_value_t = 16 << 20, value_name = "BYTES")]
        calibrate_bytes: u64,
    },
    /// Measure xpu beside a reference measured in the same run.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Plan task graphs on given processors without running them.
    #[command(subcommand)]
    Sched(cli::sched::SchedCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Collective operations over a communicator, with nccl-tests' flags and columns,
    /// beside the devices' memory-bandwidth ceiling measured in the same run.
    Collectives {
        /// The operation: allreduce, reduce, broadcast, allgather, reducescatter,
        /// alltoall, sendrecv, barrier.
        #[arg(long = "coll", default_value = "allreduce")]
        collective: String,
        /// Smallest size in bytes (K, M, G suffixes).
        #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = xpu::parse_bytes)]
        min_bytes: u64,
        /// Largest size in bytes (K, M, G suffixes).
        #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = xpu::parse_bytes)]
        max_bytes: u64,
        /// Multiplier between sizes.
        #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
        step_factor: u64,
        /// Timed iterations per size.
        #[arg(short = 'n', long = "iters", default_value_t = 20)]
        iters: usize,
        /// Warm-up iterations per size.
        #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
        warmup: usize,
        /// Check results (1) or not (0).
        #[arg(short = 'c', long = "check", default_value_t = 1)]
        check: u8,
        /// The reduction: sum, prod, min, max, avg.
        #[arg(short = 'o', long = "op", default_value = "sum")]
        op: String,
        /// The element type: float, double, half, bfloat16, int32, int64, uint8.
        #[arg(
            short = 'd',
            long = "dtype",
            alias = "datatype",
            default_value = "float"
        )]
        dtype: String,
        /// Root rank of reduce and broadcast.
        #[arg(short = 'r', long = "root", default_value_t = 0)]
        root: usize,
        /// Ranks' devices, one rank each (default: host:0,1).
        #[arg(long)]
        devices: Option<String>,
        /// Force an algorithm (ring, direct, halving-doubling, tree, hierarchical, shared-memory, native: the devices' own library, NCCL or a plugin's) instead of the cost model's choice.
        #[arg(long)]
        algo: Option<String>,
        /// Also time every algorithm at each size and report how often the cost model
        /// chose the fastest.
        #[arg(long = "compare-algos")]
        compare_algos: bool,
        /// Print one JSON object per row instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// HAL dispatch overhead and copy bandwidth on a host device, against the host
    /// backend called directly and against memcpy.
    Hal {
        /// Interleaved measurement rounds (the median is reported).
        #[arg(long, default_value_t = 15)]
        rounds: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Copies, a large elementwise add and per-launch overhead on vulkan:0, against the
    /// same Vulkan commands issued directly with ash on the same device.
    Vulkan {
        /// Interleaved measurement rounds (the median is reported).
        #[arg(long, default_value_t = 9)]
        rounds: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Pinned host↔device copies and the launch + synchronize of an empty kernel on
    /// cuda:0, against the same driver calls made directly through cudarc; prints
    /// `skipped: REASON` without CUDA (an error when XPU_REQUIRE lists cuda).
    Cuda {
        /// Interleaved measurement rounds (mean and median are reported).
        #[arg(long, default_value_t = 20)]
        rounds: usize,
        /// Bytes per copy (K, M, G suffixes).
        #[arg(long, default_value = "64M", value_parser = xpu::parse_bytes, value_name = "BYTES")]
        size: u64,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Replays an allocation trace through the caching allocator on real devices, beside
    /// a baseline that follows PyTorch's default rules, and prints reserved memory,
    /// utilization, device calls and latency.
    Memory {
        /// The trace file.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// The trace's format: `allocsim` (`start_op end_op bytes` per tensor),
        /// `rmm-csv` (an RMM allocation log) or `xpu-json` (default: detected).
        #[arg(long)]
        format: Option<String>,
        /// Devices to replay on, e.g. `host:0` or `cuda:*` (default: host:0).
        #[arg(long)]
        devices: Option<String>,
        /// Which policy to replay: `xpu`, `pytorch`, or `both` side by side.
        #[arg(long, default_value = "both")]
        policy: String,
        /// Replay the trace this many times with the cache kept, and report the device
        /// allocation calls made after the first pass.
        #[arg(long, default_value_t = 1)]
        iterations: u64,
        /// Also run the reuse scenario: 8 × 16 MiB allocated and freed, then 4 × 32 MiB.
        #[arg(long)]
        scenario: bool,
        /// Replay over a fake source (no device memory) instead of devices.
        #[arg(long)]
        fake: bool,
        /// With --fake: the fake device's virtual-memory granularity, in bytes (`K`, `M`,
        /// `G` suffixes), or `none` for fixed segments only (no expandable segments).
        #[arg(long, value_name = "BYTES|none", default_value = "2M")]
        fake_granularity: String,
        /// Also time a cached allocate + free through the pool beside the device's own
        /// allocate + drop of the same size (4 KiB, 1 MiB, 16 MiB).
        #[arg(long)]
        latency: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One standard operation (matmul, softmax, layer norm …) on each selected device:
    /// time and GFLOP/s or GB/s, beside OpenBLAS (host matmul, the device's threads) or
    /// host memcpy of the same bytes, measured in the same run.
    Ops {
        /// The operation (`matmul`, `bias_add`, `relu`, `gelu`, `softmax`,
        /// `cross_entropy`, `layer_norm`, `gather`, `reduce`, `adamw`, … and their
        /// `_backward` forms).
        #[arg(long, default_value = "matmul")]
        op: String,
        /// The shape: `MxNxK` for matmul, `RxN` for row operations, `VxDxN` for gather
        /// and scatter-add, any dims for elementwise operations.
        #[arg(long, default_value = "1024x1024x1024")]
        shape: String,
        /// The dtype: float, half, bfloat16 or double (or f32, f16, bf16, f64).
        #[arg(short = 'd', long = "dtype", default_value = "float")]
        dtype: String,
        /// Devices to run on (default: host:0).
        #[arg(long)]
        devices: Option<String>,
        /// Interleaved measurement rounds (the median is reported).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Task Bench's dependency patterns as task graphs on the scheduler: wall time, per-task
    /// overhead, efficiency and METG(50%); `benches/starpu/compare.sh` runs StarPU beside it.
    Scheduler(cli::sched_bench::SchedBenchArgs),
    /// Placement policies on devices that differ (any backends), with transfers: eager and
    /// dmda in alternating rounds, and HEFT planned on dmda's learned costs and replayed.
    Placement(cli::sched_bench::placement::PlacementArgs),
    /// Training throughput: the trainer against the same model run without the
    /// scheduler, two host devices against one, and host + a half-speed sim-npu
    /// against the host alone, in interleaved rounds.
    Train(cli::bench_train::BenchTrainArgs),
}

fn selector(arg: Option<String>, default: &str) -> Result<DeviceSelector> {
    match arg {
        Some(text) => DeviceSelector::parse(&text),
        None => xpu::selector_from_env(default),
    }
}

fn run(cli: Cli) -> Result<bool> {
    // Planning touches no device, so it needs no registry.
    if let Some(Command::Sched(command)) = &cli.command {
        return cli::sched::run(command);
    }
    let (registry, plugin_errors) = xpu::registry_with_plugins(&cli.plugins)?;
    // A plugin named on the command line must load; one found on XPU_PLUGIN_PATH that
    // does not is listed by `xpu devices` with the reason.
    let named: Vec<PathBuf> = cli
        .plugins
        .iter()
        .flat_map(|p| {
            let absolute = std::env::current_dir()
                .map(|d| d.join(p))
                .unwrap_or_else(|_| p.clone());
            let canonical = std::fs::canonicalize(&absolute).ok();
            [Some(absolute), canonical]
        })
        .flatten()
        .collect();
    if let Some(first) = plugin_errors
        .iter()
        .find(|e| named.iter().any(|p| e.path().starts_with(p)))
    {
        return Err(xpu::Error::invalid(first.to_string()));
    }
    match cli.command {
        Some(Command::Devices { devices, json }) => {
            cli::devices::run(&registry, &selector(devices, "*")?, json)?;
            Ok(true)
        }
        Some(Command::Topo {
            devices,
            json,
            xml,
            topo_file,
            calibrate,
            calibrate_bytes,
        }) => {
            let args = cli::topo::TopoArgs {
                selector: selector(devices, "*")?,
                json,
                xml,
                topo_file,
                calibrate,
                calibrate_bytes,
            };
            cli::topo::run(&registry, &args)?;
            Ok(true)
        }
        Some(Command::Conformance {
            devices,
            profile,
            json,
            junit,
            expectations,
            filter,
            list,
            require,
            certificate,
            check_certificate,
            case_timeout,
        }) => cli::conformance::run(
            &registry,
            &cli::conformance::Options {
                selector: selector(devices, "*")?,
                profile,
                json,
                junit,
                expectations,
                filter,
                list,
                required: match require {
                    Some(text) => xpu_conformance::parse_required(&text),
                    None => xpu_conformance::required_from_env(),
                },
                certificate,
                check_certificate,
                case_timeout: std::time::Duration::try_from_secs_f64(case_timeout)
                    .ok()
                    .filter(|t| !t.is_zero() && t.as_secs() <= 24 * 3600)
                    .ok_or_else(|| {
                        xpu::Error::invalid(format!(
                            "--case-timeout {case_timeout}: give a number of seconds above 0 and at most a day"
                        ))
                    })?,
            },
        ),
        Some(Command::Bench(BenchCommand::Collectives {
            collective,
            min_bytes,
            max_bytes,
            step_factor,
            iters,
            warmup,
            check,
            op,
            dtype,
            root,
            devices,
            algo,
            compare_algos,
            json,
        })) => {
            let options = cli::collectives::Options {
                collective: collective.parse()?,
                min_bytes,
                max_bytes,
                step_factor,
                iters,
                warmup,
                check: check != 0,
                op: op.parse()?,
                dtype: cli::collectives::parse_dtype(&dtype)?,
                root,
                algorithm: algo,
                compare_algorithms: compare_algos,
                json,
            };
            let sel = match devices {
                Some(text) => DeviceSelector::parse(&text)?,
                None => DeviceSelector::parse("host:0,1")?,
            };
            cli::collectives::run(registry.devices(&sel)?, &options)
        }
        Some(Command::Compare {
            reference,
            devices,
            ops,
            dumps,
            json,
        }) => {
            let options = cli::compare::Options {
                ops: cli::compare::parse_ops(ops.as_deref().unwrap_or(""))?,
                dumps,
                json,
            };
            if !options.dumps.is_empty() {
                return cli::compare::run_dumps(&options);
            }
            let reference = registry
                .devices(&DeviceSelector::parse(&reference)?)?
                .into_iter()
                .next()
                .ok_or_else(|| {
                    xpu::Error::invalid(format!("--reference {reference} selects no device"))
                })?;
            let devices = registry.devices(&selector(devices, "*")?)?;
            cli::compare::run(&reference, &devices, &options)
        }
        Some(Command::Train(args)) => cli::train::run(&registry, &args),
        Some(Command::Sched(command)) => cli::sched::run(&command),
        Some(Command::Bench(BenchCommand::Scheduler(args))) => {
            let devices = registry.devices(&selector(args.devices.clone(), "host:*")?)?;
            cli::sched_bench::run(devices, &args)
        }
        Some(Command::Bench(BenchCommand::Train(args))) => {
            cli::bench_train::run(&registry, &args)?;
            Ok(true)
        }
        Some(Command::Bench(BenchCommand::Placement(args))) => {
            let devices = registry.devices(&selector(args.devices.clone(), "host:0,1")?)?;
            cli::sched_bench::placement::run(devices, &args)
        }
        Some(Command::Bench(BenchCommand::Ops {
            op,
            shape,
            dtype,
            devices,
            rounds,
            json,
        })) => {
            let devices = registry.devices(&selector(devices, "host:0")?)?;
            cli::bench_ops::run(
                &devices,
                &cli::bench_ops::Options {
                    op: op.parse()?,
                    shape: cli::bench_ops::parse_shape(&shape)?,
                    dtype: cli::bench_ops::parse_dtype(&dtype)?,
                    rounds,
                    json,
                },
            )?;
            Ok(true)
        }
        Some(Command::Bench(BenchCommand::Hal { rounds, json })) => {
            cli::bench::hal(json, rounds)?;
            Ok(true)
        }
        Some(Command::Bench(BenchCommand::Vulkan { rounds, json })) => {
            cli::bench::vulkan(json, rounds)?;
            Ok(true)
        }
        Some(Command::Bench(BenchCommand::Cuda { rounds, size, json })) => {
            cli::bench::cuda(json, rounds, size)?;
            Ok(true)
        }
        Some(Command::Bench(BenchCommand::Memory {
            trace,
            format,
            devices,
            policy,
            iterations,
            scenario,
            fake,
            fake_granularity,
            latency,
            json,
        })) => {
            let selected = if fake {
                Vec::new()
            } else {
                let sel = match devices {
                    Some(text) => DeviceSelector::parse(&text)?,
                    None => DeviceSelector::parse("host:0")?,
                };
                registry.devices(&sel)?
            };
            cli::memory::run(
                &selected,
                &cli::memory::Options {
                    trace,
                    format,
                    policy,
                    iterations,
                    scenario,
                    fake,
                    fake_granularity,
                    latency,
                    json,
                },
            )?;
            Ok(true)
        }
        None => {
            cli::devices::run(&registry, &selector(None, "*")?, false)?;
            println!();
            cli::conformance::run(
                &registry,
                &cli::conformance::Options {
                    selector: DeviceSelector::parse("host:*")?,
                    profile: "core".to_string(),
                    json: None,
                    junit: None,
                    expectations: Vec::new(),
                    filter: None,
                    list: false,
                    required: Vec::new(),
                    certificate: None,
                    check_certificate: None,
                    case_timeout: xpu_conformance::DEFAULT_CASE_TIMEOUT,
                },
            )
        }
    }
}

/// Sends `tracing` output (the collectives' algorithm choices, …) to stderr when `XPU_LOG`
/// is set, with its value as the filter (`debug`, `xpu_collectives=debug` …).
fn init_logging() {
    if let Ok(filter) = std::env::var("XPU_LOG") {
        let filter = tracing_subscriber::EnvFilter::new(filter);
        // A second initialisation (impossible here) would only be refused.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    }
}

/// Restores the default action for SIGPIPE, so that `xpu … | head` ends quietly when the
/// reader goes away instead of failing on a closed pipe.
fn quiet_broken_pipes() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to the default at start-up, before any other
    // thread exists, has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    quiet_broken_pipes();
    init_logging();
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("xpu: {e}");
            ExitCode::from(2)
        }
    }
}
