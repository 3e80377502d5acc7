//! Host backend configuration: how many virtual devices, and how much memory each may
//! hold, from code or from `XPU_HOST_DEVICES` / `XPU_HOST_MEMORY`.

use xpu_hal::{Error, Result};

/// Default number of virtual devices.
pub const DEFAULT_DEVICES: u32 = 4;

/// Largest number of virtual devices accepted.
pub const MAX_DEVICES: u32 = 256;

/// How the host backend is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostConfig {
    /// Number of virtual devices (`host:0` … `host:N-1`), 1 to [`MAX_DEVICES`].
    pub devices: u32,
    /// Bytes each device may hold at once. Memory is taken from the process as it is
    /// allocated; this is an accounting limit so that out-of-memory is testable.
    pub capacity: u64,
}

impl HostConfig {
    /// The configuration from the environment: `XPU_HOST_DEVICES` (default 4) and
    /// `XPU_HOST_MEMORY` (bytes per device, with an optional `K`, `M`, `G` or `T` binary
    /// suffix; default: half of the machine's RAM shared between the devices).
    pub fn from_env() -> Result<Self> {
        let devices = match std::env::var("XPU_HOST_DEVICES") {
            Ok(v) => parse_devices(&v)?,
            Err(_) => DEFAULT_DEVICES,
        };
        let capacity = match std::env::var("XPU_HOST_MEMORY") {
            Ok(v) => parse_size(&v).map_err(|e| Error::invalid(format!("XPU_HOST_MEMORY: {e}")))?,
            Err(_) => default_capacity(devices),
        };
        Ok(HostConfig { devices, capacity })
    }
}

fn parse_devices(v: &str) -> Result<u32> {
    match v.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_DEVICES).contains(&n) => Ok(n),
        _ => Err(Error::invalid(format!(
            "XPU_HOST_DEVICES is `{v}`; set it to a whole number from 1 to {MAX_DEVICES}"
        ))),
    }
}

/// Parses a device memory size such as `1073741824`, `512M`, `2GiB` or `64k`
/// ([`xpu_hal::parse_bytes`]); zero is refused.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    match xpu_hal::parse_bytes(text)? {
        0 => Err(format!("`{text}` is zero; a device needs some memory")),
        bytes => Ok(bytes),
    }
}

/// Half of physical memory split between `devices`, at least 64 MiB each.
fn default_capacity(devices: u32) -> u64 {
    let total = physical_memory().unwrap_or(8 << 30);
    (total / 2 / u64::from(devices.max(1))).max(64 << 20)
}

/// Physical memory in bytes, from `/proc/meminfo` where it exists.
fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size(" 1 T "), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-5").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn device_counts_are_checked() {
        assert_eq!(parse_devices("4").ok(), Some(4));
        assert!(parse_devices("0").is_err());
        assert!(parse_devices("many").is_err());
        assert!(parse_devices("100000").is_err());
    }

    #[test]
    fn default_capacity_is_positive() {
        assert!(default_capacity(4) >= 64 << 20);
    }
}
