//! Calibration: measure what each device pair really achieves, and cache it.
//!
//! The path measured is the one a communicator uses. Within a device it is a
//! device-to-device copy. Between two devices it is the staged path: a copy from the
//! source device into a host buffer, an event, and a copy from the buffer to the
//! destination device, on the two devices' own streams. Latency is the median time of a
//! 8-byte transfer; bandwidth is the transfer size over the median time of a large one.
//!
//! Each device's builtin reduction is measured too (an `f32` sum accumulated into a
//! buffer of the transfer's size, on the device's stream): where data is reduced matters
//! as much as how it moves, and on some devices (a CPU Vulkan driver, a simulator) a
//! reduction runs at a twentieth of a copy's speed.
//!
//! Results are cached in a JSON file keyed by the devices' ids and names, so that
//! communicators created later start from measurements instead of class estimates.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use xpu_hal::{BinaryOp, DType, Device, Error, HostBuffer, Result, Scalar};

use super::Topology;

/// How much to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalibrationOptions {
    /// Bytes of the bandwidth transfer.
    pub bytes: u64,
    /// Timed repetitions of each transfer (the median is kept).
    pub repetitions: u32,
}

impl Default for CalibrationOptions {
    fn default() -> Self {
        CalibrationOptions {
            bytes: 16 << 20,
            repetitions: 5,
        }
    }
}

/// One measured pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Source device id.
    pub from: String,
    /// Destination device id.
    pub to: String,
    /// Median latency of an 8-byte transfer, µs.
    pub latency_us: f64,
    /// Bandwidth of the large transfer, GB/s.
    pub bandwidth_gbps: f64,
}

/// One device's measured reduction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReductionMeasurement {
    /// Device id.
    pub device: String,
    /// Bytes of destination an `f32` sum accumulates per second, GB/s.
    pub gbps: f64,
}

/// What a calibration measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Every ordered pair of devices.
    pub links: Vec<Measurement>,
    /// Every device that has an `f32` sum.
    pub reductions: Vec<ReductionMeasurement>,
}

/// The calibration cache file's content.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CalibrationCache {
    /// Link measurements by the key of the device set they were taken on.
    pub entries: BTreeMap<String, Vec<Measurement>>,
    /// Reduction measurements by the same key.
    #[serde(default)]
    pub reductions: BTreeMap<String, Vec<ReductionMeasurement>>,
}

/// The key under which a device set's measurements are cached: ids and names, so that a
/// different machine or driver does not reuse them.
pub fn cache_key(topology: &Topology) -> String {
    topology
        .devices
        .iter()
        .map(|d| format!("{}={}", d.id, d.name))
        .collect::<Vec<_>>()
        .join(";")
}

/// Where the cache lives: `XPU_CACHE_DIR`, else `$XDG_CACHE_HOME/xpu`, else
/// `$HOME/.cache/xpu`; the file is `topology-calibration.json`.
pub fn default_cache_path() -> Option<PathBuf> {
    let dir = std::env::var_os("XPU_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("xpu")))
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("xpu"))
        })?;
    Some(dir.join("topology-calibration.json"))
}

/// Measures every ordered pair of the topology's devices (`devices` in the same order as
/// [`Topology::devices`]) and every device's reduction, and stores the figures in the
/// topology.
pub fn calibrate(
    topology: &mut Topology,
    devices: &[Device],
    options: CalibrationOptions,
) -> Result<Calibration> {
    if devices.len() != topology.len()
        || devices
            .iter()
            .zip(&topology.devices)
            .any(|(d, t)| d.id().to_string() != t.id)
    {
        return Err(Error::invalid(
            "calibration needs the same devices, in the same order, as the topology was made from",
        ));
    }
    if options.bytes == 0 || options.repetitions == 0 {
        return Err(Error::invalid(
            "calibration needs a transfer of at least 1 byte and at least 1 repetition",
        ));
    }
    let mut out = Vec::new();
    for (a, da) in devices.iter().enumerate() {
        for (b, db) in devices.iter().enumerate() {
            let small = median_transfer_us(da, db, 8, options.repetitions)?;
            let large = median_transfer_us(da, db, options.bytes, options.repetitions)?;
            let bandwidth_gbps = options.bytes as f64 / (large.max(1e-3) * 1e3);
            topology.set_measured(a, b, small, bandwidth_gbps)?;
            out.push(Measurement {
                from: da.id().to_string(),
                to: db.id().to_string(),
                latency_us: small,
                bandwidth_gbps,
            });
        }
    }
    let mut reductions = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        if !d.capabilities().supports_dtype(DType::F32) {
            continue;
        }
        let us = median_reduction_us(d, options.bytes, options.repetitions)?;
        let gbps = options.bytes as f64 / (us.max(1e-3) * 1e3);
        topology.devices[i].reduce_gbps = Some(gbps);
        reductions.push(ReductionMeasurement {
            device: d.id().to_string(),
            gbps,
        });
    }
    Ok(Calibration {
        links: out,
        reductions,
    })
}

/// The median time in µs of accumulating an `f32` sum into `bytes` on `device`.
fn median_reduction_us(device: &Device, bytes: u64, reps: u32) -> Result<f64> {
    let bytes = (bytes / 4).max(1) * 4;
    let (dst, src) = (device.allocate(bytes)?, device.allocate(bytes)?);
    let stream = device.create_stream()?;
    stream.fill(&dst, Scalar::F32(1.0))?;
    stream.fill(&src, Scalar::F32(0.5))?;
    stream.synchronize()?;
    let once = || -> Result<f64> {
        let start = Instant::now();
        stream.accumulate(BinaryOp::Sum, DType::F32, &dst, &src)?;
        stream.synchronize()?;
        Ok(start.elapsed().as_secs_f64() * 1e6)
    };
    once()?; // warm up: builds the device's kernel on first use
    let mut times = Vec::with_capacity(reps as usize);
    for _ in 0..reps {
        times.push(once()?);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The median time in µs of moving `bytes` from `from` to `to` on the communicator's path.
fn median_transfer_us(from: &Device, to: &Device, bytes: u64, reps: u32) -> Result<f64> {
    let src = from.allocate(bytes)?;
    let dst = to.allocate(bytes)?;
    let s_from = from.create_stream()?;
    let s_to = if from == to {
        s_from.clone()
    } else {
        to.create_stream()?
    };
    let len = usize::try_from(bytes)
        .map_err(|_| Error::invalid("the calibration transfer does not fit in host memory"))?;
    let staging = HostBuffer::new(len)?;
    let once = || -> Result<f64> {
        let start = Instant::now();
        if from == to {
            s_from.copy(&src, &dst)?;
            s_from.synchronize()?;
        } else {
            s_from.copy_to_host(&src, &staging, 0)?;
            let staged = s_from.record_event()?;
            s_to.wait_event(&staged)?;
            s_to.copy_from_host(&staging, 0, &dst)?;
            s_to.synchronize()?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e6)
    };
    once()?; // warm up: first touch of fresh pages, lazy driver set-up
    let mut times = Vec::with_capacity(reps as usize);
    for _ in 0..reps {
        times.push(once()?);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Reads the cache file; a missing file is an empty cache.
pub fn load_cache(path: &Path) -> Result<CalibrationCache> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| {
            Error::invalid(format!(
                "the calibration cache {} is not valid ({e}); delete it or calibrate again",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(CalibrationCache::default()),
        Err(e) => Err(Error::invalid(format!(
            "cannot read the calibration cache {}: {e}",
            path.display()
        ))),
    }
}

/// Stores `calibration` for the topology's device set in the cache file.
pub fn store(path: &Path, topology: &Topology, calibration: &Calibration) -> Result<()> {
    let mut cache = load_cache(path).unwrap_or_default();
    let key = cache_key(topology);
    cache.entries.insert(key.clone(), calibration.links.clone());
    cache.reductions.insert(key, calibration.reductions.clone());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::invalid(format!("cannot create {}: {e}", dir.display())))?;
    }
    let text = serde_json::to_string_pretty(&cache)
        .map_err(|e| Error::backend_message("topology", format!("encoding the cache: {e}")))?;
    std::fs::write(path, text)
        .map_err(|e| Error::invalid(format!("cannot write {}: {e}", path.display())))
}

/// Applies cached measurements for the topology's device set. Returns how many pairs were
/// applied (0 when the cache has none for this set); the devices' reductions are applied
/// with them.
pub fn apply_cached(topology: &mut Topology, cache: &CalibrationCache) -> Result<usize> {
    let key = cache_key(topology);
    for m in cache.reductions.get(&key).into_iter().flatten() {
        if let Some(i) = topology.position(&m.device) {
            topology.devices[i].reduce_gbps = Some(m.gbps);
        }
    }
    let Some(entries) = cache.entries.get(&key) else {
        return Ok(0);
    };
    let mut applied = 0;
    for m in entries {
        if let (Some(a), Some(b)) = (topology.position(&m.from), topology.position(&m.to)) {
            topology.set_measured(a, b, m.latency_us, m.bandwidth_gbps)?;
            applied += 1;
        }
    }
    Ok(applied)
}
