//! [`SimConfig`]: how many simulated devices, how much memory each has, and how slow
//! they are — from code or from the `XPU_SIMNPU_*` environment variables.

use std::fmt;
use std::time::Duration;

use xpu_plugin_sdk::{Error, Result};

/// Devices when `XPU_SIMNPU_DEVICES` is not set.
pub const DEFAULT_DEVICES: u32 = 2;

/// The most devices accepted.
pub const MAX_DEVICES: u32 = 64;

/// The least memory per device accepted: 4 KiB.
pub const MIN_MEMORY: u64 = 4096;

/// Bytes per device when `XPU_SIMNPU_MEMORY` is not set: 256 MiB.
pub const DEFAULT_MEMORY: u64 = 256 << 20;

/// How the simulated NPU is set up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// Number of devices (`plugin.simnpu:0` …), 0 to [`MAX_DEVICES`].
    pub devices: u32,
    /// Bytes of each device's memory arena.
    pub memory: u64,
    /// Time every copy, builtin operation and kernel launch takes at least.
    pub latency: Duration,
    /// Copy bandwidth in bytes per second; `None` for unlimited. A copy of `n` bytes
    /// takes at least `latency + n / bandwidth`.
    pub bandwidth: Option<f64>,
    /// Fault injection: `(device, operations)` loses that device once it has run that
    /// many copies, builtins and launches; from then on its work and allocations fail
    /// with `DeviceLost`.
    pub lose_after: Option<(u32, u64)>,
    /// Standard operations the devices do not list (to stand for a device that lacks
    /// some): bit `n` set leaves out `XPU_OP_*` number `n`.
    pub without_ops: u64,
    /// Whether the devices offer their collective library, `simccl` (ABI 1.3).
    pub ccl: bool,
    /// The figures `simccl` states: the latency of an empty operation and the bus
    /// bandwidth in bytes per second; `None` states none.
    pub ccl_cost: Option<(Duration, f64)>,
    /// Bytes each rank of a `simccl` group across processes stages per step in the
    /// shared-memory segment; larger operations run in steps of this size.
    pub ccl_slot: u64,
}

/// The default of [`SimConfig::ccl_slot`]: 8 MiB.
pub const DEFAULT_CCL_SLOT: u64 = 8 << 20;

/// The latency `simccl` states when `XPU_SIMNPU_CCL_LATENCY_US` is not set (on top
/// of twice the devices' own): the hand-offs between the ranks' stream threads,
/// measured as 52–80 µs for 8 B to 32 KiB on 2 ranks of a 2-core VM (`xpu bench
/// collectives --devices plugin.simnpu:0,1 --algo native`, release build).
pub const DEFAULT_CCL_LATENCY: Duration = Duration::from_micros(60);

/// The bus bandwidth `simccl` states when neither `XPU_SIMNPU_CCL_GBPS` nor a copy
/// bandwidth is set, in bytes per second: measured as 3.3–5.1 GB/s busbw for 8 and
/// 16 MiB on the same machine (a copy in, then a reduction, per rank).
pub const DEFAULT_CCL_BANDWIDTH: f64 = 4e9;

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: DEFAULT_DEVICES,
            memory: DEFAULT_MEMORY,
            latency: Duration::ZERO,
            bandwidth: None,
            lose_after: None,
            without_ops: 0,
            ccl: true,
            ccl_cost: Some((DEFAULT_CCL_LATENCY, DEFAULT_CCL_BANDWIDTH)),
            ccl_slot: DEFAULT_CCL_SLOT,
        }
    }
}

impl SimConfig {
    /// The configuration from the environment:
    ///
    /// | variable | meaning | default |
    /// |---|---|---|
    /// | `XPU_SIMNPU_DEVICES` | number of devices, 0–64 | 2 |
    /// | `XPU_SIMNPU_MEMORY` | bytes per device (`512M`, `1G`, `1048576`), at least 4K | 256 MiB |
    /// | `XPU_SIMNPU_LATENCY_US` | microseconds each operation takes at least | 0 |
    /// | `XPU_SIMNPU_BANDWIDTH_GBPS` | copy bandwidth in GB/s (10^9 bytes per second), or `unlimited` | unlimited |
    /// | `XPU_SIMNPU_LOSE_AFTER` | `DEVICE:OPS`: device `DEVICE` is lost after `OPS` operations (fault injection) | never |
    /// | `XPU_SIMNPU_WITHOUT_OPS` | comma-separated standard operations (`gelu,gelu_backward`) the devices do not provide | none |
    /// | `XPU_SIMNPU_CCL` | `on` or `off`: the devices offer their collective library, `simccl` | on |
    /// | `XPU_SIMNPU_CCL_LATENCY_US` | the latency `simccl` states, µs, or `none` (with `none`, it states no figures) | latency × 2 + 60 |
    /// | `XPU_SIMNPU_CCL_GBPS` | the bus bandwidth `simccl` states, GB/s | the copy bandwidth, else 4 |
    /// | `XPU_SIMNPU_CCL_SLOT` | bytes per rank and step of `simccl` across processes (`64K`, `8M`), 64 to 1G | 8 MiB |
    ///
    /// An unset or empty variable takes the default; a malformed one is an
    /// `InvalidArgument` error naming it.
    pub fn from_env() -> Result<Self> {
        SimConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// The configuration from any source of variables (`from_env` uses the process's
    /// environment).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let value = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let mut config = SimConfig::default();
        if let Some(v) = value("XPU_SIMNPU_DEVICES") {
            config.devices = match v.trim().parse::<u32>() {
                Ok(n) if n <= MAX_DEVICES => n,
                _ => {
                    return Err(Error::invalid_argument(format!(
                    "XPU_SIMNPU_DEVICES is `{v}`; set it to a whole number from 0 to {MAX_DEVICES}"
                )))
                }
            };
        }
        if let Some(v) = value("XPU_SIMNPU_MEMORY") {
            config.memory = xpu_host::parse_size(&v)
                .map_err(|e| Error::invalid_argument(format!("XPU_SIMNPU_MEMORY: {e}")))?;
            if config.memory < MIN_MEMORY {
                return Err(Error::invalid_argument(format!(
                    "XPU_SIMNPU_MEMORY is `{v}`; a device needs at least {MIN_MEMORY} bytes"
                )));
            }
        }
        if let Some(v) = value("XPU_SIMNPU_LATENCY_US") {
            let us = v.trim().parse::<u64>().map_err(|_| {
                Error::invalid_argument(format!(
                    "XPU_SIMNPU_LATENCY_US is `{v}`; set it to a whole number of microseconds"
                ))
            })?;
            config.latency = Duration::from_micros(us);
        }
        if let Some(v) = value("XPU_SIMNPU_BANDWIDTH_GBPS") {
            config.bandwidth = parse_bandwidth(&v)?;
        }
        if let Some(v) = value("XPU_SIMNPU_LOSE_AFTER") {
            let parsed = v
                .trim()
                .split_once(':')
                .and_then(|(d, n)| Some((d.trim().parse().ok()?, n.trim().parse().ok()?)));
            config.lose_after = Some(parsed.ok_or_else(|| {
                Error::invalid_argument(format!(
                    "XPU_SIMNPU_LOSE_AFTER is `{v}`; set it to DEVICE:OPERATIONS, e.g. 1:40"
                ))
            })?);
        }
        if let Some(v) = value("XPU_SIMNPU_WITHOUT_OPS") {
            for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let op = xpu_plugin_sdk::OpKind::ALL
                    .iter()
                    .find(|k| k.name() == name)
                    .ok_or_else(|| {
                        Error::invalid_argument(format!(
                            "XPU_SIMNPU_WITHOUT_OPS names `{name}`, which is no standard operation; use names such as gelu or relu_backward"
                        ))
                    })?;
                config.without_ops |= 1u64 << (op.raw() % 64);
            }
        }
        if let Some(v) = value("XPU_SIMNPU_CCL") {
            config.ccl = match v.trim().to_ascii_lowercase().as_str() {
                "on" | "1" | "true" => true,
                "off" | "0" | "false" => false,
                _ => {
                    return Err(Error::invalid_argument(format!(
                        "XPU_SIMNPU_CCL is `{v}`; set it to on or off"
                    )))
                }
            };
        }
        let latency = match value("XPU_SIMNPU_CCL_LATENCY_US") {
            Some(v) if v.trim().eq_ignore_ascii_case("none") => None,
            Some(v) => Some(Duration::from_micros(v.trim().parse::<u64>().map_err(|_| {
                Error::invalid_argument(format!(
                    "XPU_SIMNPU_CCL_LATENCY_US is `{v}`; set it to a whole number of microseconds, or none"
                ))
            })?)),
            None => Some(
                config
                    .latency
                    .saturating_mul(2)
                    .saturating_add(DEFAULT_CCL_LATENCY),
            ),
        };
        let bandwidth = match value("XPU_SIMNPU_CCL_GBPS") {
            Some(v) => match v.trim().parse::<f64>() {
                Ok(gbps) if gbps.is_finite() && gbps > 0.0 => gbps * 1e9,
                _ => {
                    return Err(Error::invalid_argument(format!(
                        "XPU_SIMNPU_CCL_GBPS is `{v}`; set it to a positive number of GB/s"
                    )))
                }
            },
            None => config.bandwidth.unwrap_or(DEFAULT_CCL_BANDWIDTH),
        };
        config.ccl_cost = latency.map(|l| (l, bandwidth));
        if let Some(v) = value("XPU_SIMNPU_CCL_SLOT") {
            config.ccl_slot = xpu_host::parse_size(&v)
                .ok()
                .filter(|b| (64..=1 << 30).contains(b))
                .ok_or_else(|| {
                    Error::invalid_argument(format!(
                        "XPU_SIMNPU_CCL_SLOT is `{v}`; set it to a size from 64 bytes to 1G, e.g. 8M"
                    ))
                })?;
        }
        Ok(config)
    }

    /// How long an operation moving `bytes` bytes takes at least: the latency plus the
    /// transfer time at the configured bandwidth.
    pub fn copy_time(&self, bytes: u64) -> Duration {
        let transfer = match self.bandwidth {
            Some(bytes_per_second) => Duration::try_from_secs_f64(bytes as f64 / bytes_per_second)
                .unwrap_or(Duration::MAX),
            None => Duration::ZERO,
        };
        self.latency.saturating_add(transfer)
    }
}

fn parse_bandwidth(v: &str) -> Result<Option<f64>> {
    let t = v.trim();
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("inf") {
        return Ok(None);
    }
    match t.parse::<f64>() {
        Ok(gbps) if gbps.is_finite() && gbps > 0.0 => Ok(Some(gbps * 1e9)),
        _ => Err(Error::invalid_argument(format!(
            "XPU_SIMNPU_BANDWIDTH_GBPS is `{v}`; set it to a positive number of GB/s (e.g. 12.5), or `unlimited`"
        ))),
    }
}

impl fmt::Display for SimConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} device(s) of {} bytes, latency {} us, bandwidth ",
            self.devices,
            self.memory,
            self.latency.as_micros()
        )?;
        match self.bandwidth {
            Some(b) => write!(f, "{} GB/s", b / 1e9)?,
            None => f.write_str("unlimited")?,
        }
        if let Some((d, n)) = self.lose_after {
            write!(f, ", device {d} lost after {n} operations")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<SimConfig> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        SimConfig::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_apply_when_nothing_is_set() {
        assert_eq!(from(&[]).unwrap(), SimConfig::default());
        assert_eq!(from(&[("XPU_SIMNPU_DEVICES", " ")]).unwrap().devices, 2);
        assert_eq!(SimConfig::default().memory, 256 << 20);
    }

    #[test]
    fn every_variable_is_read() {
        let c = from(&[
            ("XPU_SIMNPU_DEVICES", "5"),
            ("XPU_SIMNPU_MEMORY", "64M"),
            ("XPU_SIMNPU_LATENCY_US", "250"),
            ("XPU_SIMNPU_BANDWIDTH_GBPS", "2.5"),
            ("XPU_SIMNPU_LOSE_AFTER", "1:40"),
            ("XPU_SIMNPU_WITHOUT_OPS", "gelu, relu_backward"),
        ])
        .unwrap();
        assert_eq!(c.lose_after, Some((1, 40)));
        let (gelu, relu_bw) = (
            xpu_plugin_sdk::OpKind::ALL
                .iter()
                .find(|k| k.name() == "gelu")
                .unwrap()
                .raw(),
            xpu_plugin_sdk::OpKind::ALL
                .iter()
                .find(|k| k.name() == "relu_backward")
                .unwrap()
                .raw(),
        );
        assert_eq!(c.without_ops, (1 << gelu) | (1 << relu_bw));
        assert_eq!(c.devices, 5);
        assert_eq!(c.memory, 64 << 20);
        assert_eq!(c.latency, Duration::from_micros(250));
        assert_eq!(c.bandwidth, Some(2.5e9));
        assert_eq!(c.copy_time(5_000_000), Duration::from_micros(250 + 2000));
        assert_eq!(
            from(&[("XPU_SIMNPU_BANDWIDTH_GBPS", "Unlimited")])
                .unwrap()
                .bandwidth,
            None
        );
        assert_eq!(from(&[("XPU_SIMNPU_DEVICES", "0")]).unwrap().devices, 0);
        // The library's figures follow the device's unless they are set.
        assert_eq!(
            c.ccl_cost,
            Some((Duration::from_micros(2 * 250 + 60), 2.5e9))
        );
        let ccl = from(&[
            ("XPU_SIMNPU_CCL", "off"),
            ("XPU_SIMNPU_CCL_LATENCY_US", "7"),
            ("XPU_SIMNPU_CCL_GBPS", "100"),
        ])
        .unwrap();
        assert!(!ccl.ccl);
        assert_eq!(ccl.ccl_cost, Some((Duration::from_micros(7), 1e11)));
        assert_eq!(
            from(&[("XPU_SIMNPU_CCL_LATENCY_US", "None")])
                .unwrap()
                .ccl_cost,
            None
        );
    }

    #[test]
    fn malformed_values_name_their_variable() {
        for (k, v) in [
            ("XPU_SIMNPU_DEVICES", "65"),
            ("XPU_SIMNPU_DEVICES", "two"),
            ("XPU_SIMNPU_MEMORY", "0"),
            ("XPU_SIMNPU_MEMORY", "12Q"),
            ("XPU_SIMNPU_MEMORY", "100"),
            ("XPU_SIMNPU_LATENCY_US", "-1"),
            ("XPU_SIMNPU_BANDWIDTH_GBPS", "0"),
            ("XPU_SIMNPU_BANDWIDTH_GBPS", "fast"),
            ("XPU_SIMNPU_LOSE_AFTER", "40"),
            ("XPU_SIMNPU_LOSE_AFTER", "a:b"),
            ("XPU_SIMNPU_WITHOUT_OPS", "gelu,warp"),
            ("XPU_SIMNPU_CCL", "maybe"),
            ("XPU_SIMNPU_CCL_LATENCY_US", "soon"),
            ("XPU_SIMNPU_CCL_GBPS", "-3"),
        ] {
            let e = from(&[(k, v)]).unwrap_err();
            assert_eq!(e.code(), xpu_plugin_sdk::ErrorCode::InvalidArgument);
            assert!(e.message().contains(k), "{e}");
        }
    }
}
