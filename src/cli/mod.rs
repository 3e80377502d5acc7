//! The `xpu` command's subcommands and their shared helpers.

pub mod bench;
pub mod bench_ops;
pub mod bench_train;
pub mod collectives;
pub mod compare;
pub mod conformance;
pub mod devices;
pub mod launch;
pub mod memory;
pub mod sched;
pub mod sched_bench;
pub mod topo;
pub mod train;

/// `1536` → `1.5 KiB`, with binary units.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::format_bytes;

    #[test]
    fn bytes_are_formatted_with_binary_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(3 << 30), "3.0 GiB");
    }
}
