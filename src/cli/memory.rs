//! `xpu bench memory`: an allocation trace replayed through the caching allocator on real
//! devices (or a fake device, by default one with virtual memory in 2 MiB steps), beside a
//! baseline with PyTorch's default rules, in the same run; and the reuse scenario
//! (8 × 16 MiB freed, then 4 × 32 MiB).

use std::path::PathBuf;

use serde::Serialize;
use xpu::{Device, Error, Result};
use xpu_memory::{
    measure_cached_latency, replay_on_device, replay_source, reuse_scenario, FakeSource, Policy,
    ReplayReport, Trace, TraceFormat,
};

/// What `xpu bench memory` was asked to do.
pub struct Options {
    /// The trace file, if any.
    pub trace: Option<PathBuf>,
    /// Its format name (`None`: detect).
    pub format: Option<String>,
    /// `xpu`, `pytorch` or `both`.
    pub policy: String,
    /// Passes over the trace.
    pub iterations: u64,
    /// Also run the reuse scenario.
    pub scenario: bool,
    /// Replay over the fake source instead of devices.
    pub fake: bool,
    /// The fake source's growth granularity: bytes with an optional `K`, `M` or `G` binary
    /// suffix, or `none` for a source with fixed segments only.
    pub fake_granularity: String,
    /// Also time cached allocate + free pairs beside the device's allocate + drop.
    pub latency: bool,
    /// Print JSON.
    pub json: bool,
}

/// The figures of one replay, with the key names the JSON output promises.
#[derive(Serialize)]
struct Figures {
    workload: String,
    target: String,
    policy: &'static str,
    expandable: bool,
    requests: u64,
    iterations: u64,
    peak_live_bytes: u64,
    peak_reserved_bytes: u64,
    utilization: f64,
    device_alloc_calls: u64,
    steady_device_alloc_calls: u64,
    device_alloc_calls_per_iteration: Vec<u64>,
    alloc_free_p50_ns: u64,
    alloc_free_p99_ns: u64,
}

fn figures(workload: &str, policy: &'static str, r: ReplayReport) -> Figures {
    Figures {
        workload: workload.to_string(),
        target: r.target,
        policy,
        expandable: r.expandable,
        requests: r.requests,
        iterations: r.iterations,
        peak_live_bytes: r.peak_live_bytes,
        peak_reserved_bytes: r.peak_reserved_bytes,
        utilization: r.utilization,
        device_alloc_calls: r.device_allocs,
        steady_device_alloc_calls: r.steady_device_allocs,
        device_alloc_calls_per_iteration: r.device_allocs_per_iteration,
        alloc_free_p50_ns: r.p50_ns,
        alloc_free_p99_ns: r.p99_ns,
    }
}

/// Parses `--fake-granularity`: `none`, or bytes with an optional `K`, `M` or `G` binary
/// suffix (`2M`, `4K`, `65536`).
pub fn parse_granularity(text: &str) -> Result<Option<u64>> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.eq_ignore_ascii_case(&'k') => (&t[..i], 10),
        Some((i, c)) if c.eq_ignore_ascii_case(&'m') => (&t[..i], 20),
        Some((i, c)) if c.eq_ignore_ascii_case(&'g') => (&t[..i], 30),
        _ => (t, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .filter(|n| *n > 0)
        .map(Some)
        .ok_or_else(|| {
            Error::invalid(format!(
                "--fake-granularity `{text}` is not a positive size (e.g. 2M, 4K, 65536) or `none`"
            ))
        })
}

/// Replays the trace and/or the scenario under each policy on each device and prints the
/// figures, each policy's row beside the other's.
pub fn run(devices: &[Device], opts: &Options) -> Result<()> {
    let granularity = parse_granularity(&opts.fake_granularity)?;
    let policies: Vec<(&'static str, Policy)> = match opts.policy.as_str() {
        "xpu" => vec![("xpu", Policy::Xpu)],
        "pytorch" => vec![("pytorch", Policy::PyTorch)],
        "both" => vec![("xpu", Policy::Xpu), ("pytorch", Policy::PyTorch)],
        other => {
            return Err(Error::invalid(format!(
                "--policy `{other}` is unknown; use xpu, pytorch or both"
            )))
        }
    };
    let format = match &opts.format {
        None => None,
        Some(name) => Some(TraceFormat::from_name(name).ok_or_else(|| {
            Error::invalid(format!(
                "--format `{name}` is unknown; use allocsim, rmm-csv or xpu-json"
            ))
        })?),
    };
    let mut workloads: Vec<(String, Trace)> = Vec::new();
    if let Some(path) = &opts.trace {
        let trace = Trace::load_as(path, format).map_err(|e| {
            Error::invalid(format!("cannot read the trace {}: {e}", path.display()))
        })?;
        workloads.push((path.display().to_string(), trace));
    }
    if opts.scenario {
        workloads.push(("8x16MiB-then-4x32MiB".to_string(), reuse_scenario()));
    }
    if workloads.is_empty() && !opts.latency {
        return Err(Error::invalid(
            "nothing to measure; give --trace FILE, --scenario, --latency, or several",
        ));
    }
    if !opts.fake && devices.is_empty() {
        return Err(Error::invalid(
            "--devices selects no device; try --devices host:0",
        ));
    }
    let mut out = Vec::new();
    for (name, trace) in &workloads {
        for (pname, policy) in &policies {
            if opts.fake {
                let source = match granularity {
                    Some(g) => FakeSource::growable(None, g),
                    None => FakeSource::new(None),
                };
                let r = replay_source(trace, policy.config(), source, opts.iterations)
                    .map_err(|e| Error::backend_message("xpu-memory", e.to_string()))?;
                out.push(figures(name, pname, r));
            }
            for device in devices.iter().filter(|_| !opts.fake) {
                let r = replay_on_device(trace, device, policy.config(), opts.iterations)?;
                out.push(figures(name, pname, r));
            }
        }
    }
    let mut latency = Vec::new();
    if opts.latency {
        for device in devices {
            for size in [4096, 1 << 20, 16 << 20] {
                latency.push(measure_cached_latency(
                    device,
                    Policy::Xpu.config(),
                    size,
                    201,
                    512,
                )?);
            }
        }
    }
    if opts.json {
        let text = if !latency.is_empty() {
            serde_json::to_string_pretty(&serde_json::json!({
                "replays": out,
                "cached_latency": latency,
            }))
        } else if out.len() == 1 {
            serde_json::to_string_pretty(&out[0])
        } else {
            serde_json::to_string_pretty(&out)
        }
        .map_err(|e| Error::backend("xpu", e))?;
        println!("{text}");
        return Ok(());
    }
    if !latency.is_empty() {
        println!("cached allocate + free, median of 201 batches of 512 pairs");
        println!(
            "{:<10} {:>10} {:>4} {:>14} {:>24} {:>13}",
            "target", "size B", "exp", "pool p50 ns", "device alloc+drop p50 ns", "device allocs"
        );
        for l in &latency {
            println!(
                "{:<10} {:>10} {:>4} {:>14.1} {:>24.1} {:>13}",
                l.device,
                l.size,
                if l.expandable { "yes" } else { "no" },
                l.pool_p50_ns,
                l.device_p50_ns,
                l.pool_device_allocs
            );
        }
        println!();
    }
    for (name, trace) in &workloads {
        let on = match (opts.fake, granularity) {
            (false, _) => String::new(),
            (true, Some(g)) => format!(", fake device growing segments in {g}-byte steps"),
            (true, None) => ", fake device with fixed segments".to_string(),
        };
        println!(
            "{name}: {} requests, {} pass(es){on}",
            trace.entries.len(),
            opts.iterations.max(1)
        );
        println!(
            "{:<10} {:<8} {:>4} {:>14} {:>16} {:>11} {:>13} {:>14} {:>8} {:>8}",
            "target",
            "policy",
            "exp",
            "peak live B",
            "peak reserved B",
            "utilization",
            "device allocs",
            "after 1st pass",
            "p50 ns",
            "p99 ns"
        );
        for f in out.iter().filter(|f| &f.workload == name) {
            println!(
                "{:<10} {:<8} {:>4} {:>14} {:>16} {:>11.3} {:>13} {:>14} {:>8} {:>8}",
                f.target,
                f.policy,
                if f.expandable { "yes" } else { "no" },
                f.peak_live_bytes,
                f.peak_reserved_bytes,
                f.utilization,
                f.device_alloc_calls,
                f.steady_device_alloc_calls,
                f.alloc_free_p50_ns,
                f.alloc_free_p99_ns
            );
        }
        println!();
    }
    println!(
        "utilization = peak live / peak reserved (1.0: no memory held beyond the tensors); \
         exp = expandable segments; after 1st pass = device allocation calls after the first \
         pass (--iterations); p50/p99 = one allocate or free call through the allocator"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_granularity;

    #[test]
    fn fake_granularity_sizes_and_none() {
        assert_eq!(parse_granularity("2M").ok(), Some(Some(2 << 20)));
        assert_eq!(parse_granularity("4k").ok(), Some(Some(4096)));
        assert_eq!(parse_granularity("65536").ok(), Some(Some(65536)));
        assert_eq!(parse_granularity("1G").ok(), Some(Some(1 << 30)));
        assert_eq!(parse_granularity("None").ok(), Some(None));
        for bad in ["", "0", "M", "3Q", "-1K", "99999999999G"] {
            assert!(parse_granularity(bad).is_err(), "{bad}");
        }
    }
}
