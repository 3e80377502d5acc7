//! Conformance certificates: a machine-readable record of what a run passed, and the
//! check of a certificate against a new run.
//!
//! A vendor qualifies a device with `xpu conformance --certificate FILE` and publishes
//! the file. It names everything needed to repeat the run and compare: the xpu version
//! and plugin ABI of the host, a SHA-256 of the suite (every case's name, profile and
//! description, so two builds with the same hash ran the same cases), each device's
//! identity (name, vendor, driver, and for a plugin its version, ABI and the SHA-256
//! of its library), the profile, every result with its reason (skips say what the
//! device lacks), the command line and the date. Anyone with the same device and
//! plugin reruns the suite with `--check-certificate FILE`: the suite hash and the
//! device identities must match, and so must every case's status.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use xpu_hal::Device;

use crate::case::Case;
use crate::report::{Report, Status};

/// The format tag of a certificate, checked on reading.
pub const CERTIFICATE_FORMAT: &str = "xpu-conformance-certificate/1";

/// The largest certificate file read, in bytes.
const MAX_CERTIFICATE_BYTES: u64 = 64 << 20;

/// The SHA-256, in hexadecimal, of the cases of a suite: each case's name, profile and
/// description, one line each, in name order.
pub fn suite_hash(cases: &[Case]) -> String {
    let mut lines: Vec<String> = cases
        .iter()
        .map(|c| format!("{}\t{}\t{}\n", c.name, c.profile, c.description))
        .collect();
    lines.sort();
    let mut h = Sha256::new();
    for l in &lines {
        h.update(l.as_bytes());
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of a file, in hexadecimal.
pub fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut file, &mut h)?;
    Ok(hex(&h.finalize()))
}

/// Who and what a device is, as a certificate records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceIdentity {
    /// Its id in the run (`plugin.simnpu:0`).
    pub id: String,
    /// Its backend.
    pub backend: String,
    /// Its name, vendor and driver version, as the backend reports them.
    pub name: String,
    /// The vendor.
    pub vendor: String,
    /// The driver or firmware version.
    pub driver: String,
    /// Its total memory in bytes.
    pub memory_bytes: u64,
    /// The backend's facts about it (`plugin_version=…`, `plugin_abi=…` …).
    pub extra: Vec<String>,
    /// For a plugin device: the SHA-256 of the plugin's library file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_sha256: Option<String>,
}

impl DeviceIdentity {
    /// The identity of `device`; a plugin library that cannot be read gives no digest.
    pub fn of(device: &Device) -> Self {
        let info = device.info();
        let plugin_sha256 = info
            .extra
            .iter()
            .find_map(|e| e.strip_prefix("plugin_file="))
            .and_then(|p| file_sha256(Path::new(p)).ok());
        DeviceIdentity {
            id: device.id().to_string(),
            backend: device.backend().to_string(),
            name: info.name.clone(),
            vendor: info.vendor.clone(),
            driver: info.driver.clone(),
            memory_bytes: info.memory_bytes,
            extra: info.extra.clone(),
            plugin_sha256,
        }
    }

    /// What identifies the hardware and software, leaving out where the plugin file
    /// lies: the fields a rerun must match.
    fn key(&self) -> (&str, &str, &str, &str, Option<&str>, Vec<&str>) {
        (
            &self.backend,
            &self.name,
            &self.vendor,
            &self.driver,
            self.plugin_sha256.as_deref(),
            self.extra
                .iter()
                .filter(|e| !e.starts_with("plugin_file="))
                .map(String::as_str)
                .collect(),
        )
    }
}

/// One case's outcome on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertifiedResult {
    /// The case.
    pub case: String,
    /// The device's id.
    pub device: String,
    /// How it went.
    pub status: Status,
    /// Why, for every status but `pass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A record of a conformance run (see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Certificate {
    /// [`CERTIFICATE_FORMAT`].
    pub format: String,
    /// When the run ended, in UTC, RFC 3339.
    pub issued: String,
    /// The xpu version that ran it.
    pub xpu_version: String,
    /// The plugin ABI version the host speaks (`1.4`).
    pub host_plugin_abi: String,
    /// The operating system and architecture.
    pub platform: String,
    /// The command line of the run.
    pub command: Vec<String>,
    /// The profile.
    pub profile: String,
    /// [`suite_hash`] of every case of the suite, and how many cases that is.
    pub suite_sha256: String,
    /// The number of cases in the suite.
    pub suite_cases: usize,
    /// Whether every backend of the run passed the profile.
    pub passed: bool,
    /// The devices of the run.
    pub devices: Vec<DeviceIdentity>,
    /// Every result.
    pub results: Vec<CertifiedResult>,
}

/// What a run was, besides its report: filled in by the program that ran it.
#[derive(Debug, Clone)]
pub struct RunContext<'a> {
    /// The xpu version.
    pub xpu_version: &'a str,
    /// The plugin ABI version the host speaks.
    pub host_plugin_abi: (u32, u32),
    /// The command line.
    pub command: Vec<String>,
    /// The profile.
    pub profile: &'a str,
    /// Every case of the suite (for its hash).
    pub suite: &'a [Case],
}

impl Certificate {
    /// The certificate of `report`, a run of `context.profile` over `devices`.
    pub fn new(report: &Report, devices: &[Device], context: &RunContext<'_>) -> Self {
        Certificate {
            format: CERTIFICATE_FORMAT.to_string(),
            issued: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            xpu_version: context.xpu_version.to_string(),
            host_plugin_abi: format!(
                "{}.{}",
                context.host_plugin_abi.0, context.host_plugin_abi.1
            ),
            platform: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
            command: context.command.clone(),
            profile: context.profile.to_string(),
            suite_sha256: suite_hash(context.suite),
            suite_cases: context.suite.len(),
            passed: report.success(),
            devices: devices.iter().map(DeviceIdentity::of).collect(),
            results: report
                .results
                .iter()
                .map(|r| CertifiedResult {
                    case: r.case.clone(),
                    device: r.device.clone(),
                    status: r.status,
                    reason: r.reason.clone(),
                })
                .collect(),
        }
    }

    /// The certificate as pretty-printed JSON.
    pub fn to_json(&self) -> Result<String, String> {
        serde_json::to_string_pretty(self).map_err(|e| e.to_string())
    }

    /// Reads a certificate file, checking its size and format tag.
    pub fn read(path: &Path) -> Result<Self, String> {
        let shown = path.display();
        let size = std::fs::metadata(path)
            .map_err(|e| format!("cannot read the certificate {shown}: {e}"))?
            .len();
        if size > MAX_CERTIFICATE_BYTES {
            return Err(format!(
                "the certificate {shown} is {size} bytes, more than the {MAX_CERTIFICATE_BYTES} a certificate can be; is it the right file?"
            ));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the certificate {shown}: {e}"))?;
        let cert: Certificate = serde_json::from_str(&text)
            .map_err(|e| format!("{shown} is not a conformance certificate: {e}"))?;
        if cert.format != CERTIFICATE_FORMAT {
            return Err(format!(
                "{shown} is a certificate of format `{}`; this xpu reads `{CERTIFICATE_FORMAT}`",
                cert.format
            ));
        }
        Ok(cert)
    }

    /// How a new run (`other`, of the same profile) differs from this certificate:
    /// nothing when it confirms it. Devices are matched by identity, not by id, so the
    /// rerun may number them differently; the plugin files may lie elsewhere.
    pub fn differences(&self, other: &Certificate) -> Vec<String> {
        let mut out = Vec::new();
        if other.profile != self.profile {
            out.push(format!(
                "the certificate is for the `{}` profile; the rerun ran `{}`",
                self.profile, other.profile
            ));
        }
        if other.suite_sha256 != self.suite_sha256 {
            out.push(format!(
                "the suite differs: the certificate's ran {} cases hashing to {} (xpu {}), this one has {} cases hashing to {} (xpu {}); rerun with the certificate's xpu version",
                self.suite_cases,
                self.suite_sha256,
                self.xpu_version,
                other.suite_cases,
                other.suite_sha256,
                other.xpu_version
            ));
        }
        // Certified device id → rerun device id, by identity.
        let mut map = BTreeMap::new();
        let mut taken = vec![false; other.devices.len()];
        for d in &self.devices {
            let found = other
                .devices
                .iter()
                .enumerate()
                .find(|(i, o)| !taken[*i] && o.key() == d.key());
            match found {
                Some((i, o)) => {
                    taken[i] = true;
                    map.insert(d.id.as_str(), o.id.as_str());
                }
                None => out.push(format!(
                    "no device of the rerun is {} as certified ({} by {}, driver {}{})",
                    d.id,
                    d.name,
                    d.vendor,
                    d.driver,
                    d.plugin_sha256
                        .as_deref()
                        .map(|h| format!(", plugin library SHA-256 {h}"))
                        .unwrap_or_default()
                )),
            }
        }
        let rerun: BTreeMap<(&str, &str), &CertifiedResult> = other
            .results
            .iter()
            .map(|r| ((r.device.as_str(), r.case.as_str()), r))
            .collect();
        for r in &self.results {
            let Some(id) = map.get(r.device.as_str()) else {
                continue;
            };
            match rerun.get(&(*id, r.case.as_str())) {
                None => out.push(format!(
                    "{} on {}: certified {}, not run again",
                    r.case, r.device, r.status
                )),
                Some(n) if n.status != r.status => out.push(format!(
                    "{} on {}: certified {}, now {}{}",
                    r.case,
                    r.device,
                    r.status,
                    n.status,
                    n.reason
                        .as_deref()
                        .map(|m| format!(" ({m})"))
                        .unwrap_or_default()
                )),
                Some(_) => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(results: &[(&str, &str, Status)]) -> Certificate {
        Certificate {
            format: CERTIFICATE_FORMAT.into(),
            issued: "2026-01-01T00:00:00Z".into(),
            xpu_version: "0.1.0".into(),
            host_plugin_abi: "1.4".into(),
            platform: "linux-x86_64".into(),
            command: vec!["xpu".into()],
            profile: "core".into(),
            suite_sha256: suite_hash(&crate::all_cases()),
            suite_cases: crate::all_cases().len(),
            passed: true,
            devices: vec![DeviceIdentity {
                id: "plugin.x:0".into(),
                backend: "plugin.x".into(),
                name: "x".into(),
                vendor: "v".into(),
                driver: "1".into(),
                memory_bytes: 1,
                extra: vec!["plugin_file=/a/libx.so".into(), "plugin_abi=1.4".into()],
                plugin_sha256: Some("ab".into()),
            }],
            results: results
                .iter()
                .map(|(c, d, s)| CertifiedResult {
                    case: c.to_string(),
                    device: d.to_string(),
                    status: *s,
                    reason: None,
                })
                .collect(),
        }
    }

    #[test]
    fn the_suite_hash_names_its_cases() {
        let all = crate::all_cases();
        let h = suite_hash(&all);
        assert_eq!(h.len(), 64);
        assert_eq!(h, suite_hash(&all));
        assert_ne!(h, suite_hash(&all[1..]));
    }

    #[test]
    fn a_rerun_confirms_or_names_each_difference() {
        let a = cert(&[("copy.roundtrip", "plugin.x:0", Status::Pass)]);
        // Same identity, renumbered and moved: confirmed.
        let mut b = cert(&[("copy.roundtrip", "plugin.x:3", Status::Pass)]);
        b.devices[0].id = "plugin.x:3".into();
        b.devices[0].extra[0] = "plugin_file=/b/libx.so".into();
        assert!(a.differences(&b).is_empty(), "{:?}", a.differences(&b));
        // A status changed.
        let c = cert(&[("copy.roundtrip", "plugin.x:0", Status::Fail)]);
        let d = a.differences(&c);
        assert!(d.len() == 1 && d[0].contains("now fail"), "{d:?}");
        // Another plugin build.
        let mut e = a.clone();
        e.devices[0].plugin_sha256 = Some("cd".into());
        let d = a.differences(&e);
        assert!(d.iter().any(|m| m.contains("no device")), "{d:?}");
        // Another suite, another profile.
        let mut f = a.clone();
        f.suite_sha256 = "00".into();
        f.profile = "training".into();
        assert_eq!(a.differences(&f).len(), 2);
        // Not run again.
        let g = cert(&[]);
        assert!(a.differences(&g)[0].contains("not run again"));
    }

    #[test]
    fn a_certificate_reads_back_and_bad_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("xpu-cert-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.json");
        let a = cert(&[("copy.roundtrip", "plugin.x:0", Status::Skip)]);
        std::fs::write(&path, a.to_json().unwrap()).unwrap();
        assert_eq!(Certificate::read(&path).unwrap(), a);
        let mut other = a.clone();
        other.format = "something/2".into();
        std::fs::write(&path, other.to_json().unwrap()).unwrap();
        assert!(Certificate::read(&path).unwrap_err().contains("format"));
        std::fs::write(&path, "{").unwrap();
        assert!(Certificate::read(&path)
            .unwrap_err()
            .contains("not a conformance certificate"));
        assert!(Certificate::read(&dir.join("missing.json")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
