//! `xpu bench memory`: an allocation trace replayed through the caching allocator,
//! beside a baseline with PyTorch's default rules, in the same run.

use std::path::Path;

use serde::Serialize;
use xpu::{Error, Result};
use xpu_memory::{replay as replay_trace, Policy, ReplayReport, Trace};

/// The figures of one replay, with the key names the JSON output promises.
#[derive(Serialize)]
struct Figures {
    policy: &'static str,
    requests: u64,
    peak_live_bytes: u64,
    peak_reserved_bytes: u64,
    utilization: f64,
    device_alloc_calls: u64,
    alloc_free_p50_ns: u64,
    alloc_free_p99_ns: u64,
}

fn figures(policy: &'static str, r: &ReplayReport) -> Figures {
    Figures {
        policy,
        requests: r.requests,
        peak_live_bytes: r.peak_live_bytes,
        peak_reserved_bytes: r.peak_reserved_bytes,
        utilization: r.utilization,
        device_alloc_calls: r.device_allocs,
        alloc_free_p50_ns: r.p50_ns,
        alloc_free_p99_ns: r.p99_ns,
    }
}

/// Replays `trace` under `policy` (`xpu`, `pytorch` or `both`) and prints the figures.
pub fn replay(trace: &Path, policy: &str, json: bool) -> Result<()> {
    let policies: Vec<(&'static str, Policy)> = match policy {
        "xpu" => vec![("xpu", Policy::Xpu)],
        "pytorch" => vec![("pytorch", Policy::PyTorch)],
        "both" => vec![("xpu", Policy::Xpu), ("pytorch", Policy::PyTorch)],
        other => {
            return Err(Error::invalid(format!(
                "--policy `{other}` is unknown; use xpu, pytorch or both"
            )))
        }
    };
    let parsed = Trace::load(trace)
        .map_err(|e| Error::invalid(format!("cannot read the trace {}: {e}", trace.display())))?;
    let mut out = Vec::new();
    for (name, p) in policies {
        let report = replay_trace(&parsed, p)
            .map_err(|e| Error::backend_message("xpu-memory", e.to_string()))?;
        out.push(figures(name, &report));
    }
    if json {
        let text = if out.len() == 1 {
            serde_json::to_string_pretty(&out[0])
        } else {
            serde_json::to_string_pretty(&out)
        }
        .map_err(|e| Error::backend("xpu", e))?;
        println!("{text}");
        return Ok(());
    }
    println!(
        "trace {} ({} requests)",
        trace.display(),
        parsed.entries.len()
    );
    println!(
        "{:<8} {:>16} {:>18} {:>11} {:>12} {:>10} {:>10}",
        "policy",
        "peak live B",
        "peak reserved B",
        "utilization",
        "device allocs",
        "p50 ns",
        "p99 ns"
    );
    for f in &out {
        println!(
            "{:<8} {:>16} {:>18} {:>11.3} {:>12} {:>10} {:>10}",
            f.policy,
            f.peak_live_bytes,
            f.peak_reserved_bytes,
            f.utilization,
            f.device_alloc_calls,
            f.alloc_free_p50_ns,
            f.alloc_free_p99_ns
        );
    }
    println!();
    println!("utilization = peak live / peak reserved (1.0: no memory held beyond the tensors)");
    Ok(())
}
