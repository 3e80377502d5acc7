//! Tensor dumps: named tensors written to one file, so that two runs (two devices, two
//! builds, a device and the reference) can be compared tensor by tensor with
//! [`compare_dumps`].
//!
//! ## Format (`.xtd`, version 1)
//!
//! ```text
//! "XPUTDMP1"                      8 bytes, the magic and version
//! header length                   u64, little-endian
//! header                          UTF-8 JSON: {"tensors": [{"name", "dtype", "dims",
//!                                 "offset", "len"}]}, offsets into the data
//! data                            each tensor's elements, row-major, packed,
//!                                 little-endian
//! ```
//!
//! Reading checks everything (magic, sizes, that each tensor's length is its element
//! count times its dtype size, that ranges lie in the file, unique names) and says what
//! is wrong.

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};
use xpu_hal::ops::{Layout, Tensor};
use xpu_hal::reference::ops::{pack, to_f64};
use xpu_hal::{DType, Error, Result, Stream};

use super::metrics::{metrics, relative_tolerance, Metrics};

const MAGIC: &[u8; 8] = b"XPUTDMP1";
/// The largest header a dump may declare (64 MiB).
const MAX_HEADER: u64 = 64 << 20;

/// One named tensor: its dtype, shape and packed row-major elements.
#[derive(Debug, Clone, PartialEq)]
pub struct DumpEntry {
    /// The name (unique in its dump).
    pub name: String,
    /// The element type.
    pub dtype: DType,
    /// The shape.
    pub dims: Vec<u64>,
    /// The elements, row-major, packed.
    pub data: Vec<u8>,
}

/// Named tensors, in the order they were added.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TensorDump {
    entries: Vec<DumpEntry>,
}

#[derive(Serialize, Deserialize)]
struct HeaderEntry {
    name: String,
    dtype: String,
    dims: Vec<u64>,
    offset: u64,
    len: u64,
}

#[derive(Serialize, Deserialize)]
struct Header {
    tensors: Vec<HeaderEntry>,
}

fn elements(dims: &[u64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
}

impl TensorDump {
    /// An empty dump.
    pub fn new() -> Self {
        TensorDump::default()
    }

    /// The tensors.
    pub fn entries(&self) -> &[DumpEntry] {
        &self.entries
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&DumpEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Adds a tensor from packed row-major bytes.
    pub fn add(&mut self, name: &str, dtype: DType, dims: &[u64], data: Vec<u8>) -> Result<()> {
        if name.is_empty() {
            return Err(Error::invalid("a dumped tensor needs a non-empty name"));
        }
        if self.get(name).is_some() {
            return Err(Error::invalid(format!(
                "the dump already has a tensor named `{name}`; names must be unique"
            )));
        }
        let want = elements(dims)
            .and_then(|n| n.checked_mul(dtype.size() as u64))
            .ok_or_else(|| Error::invalid(format!("`{name}`: shape {dims:?} is too large")))?;
        if data.len() as u64 != want {
            return Err(Error::invalid(format!(
                "`{name}`: {} bytes given for {dtype}{dims:?}, which has {want}",
                data.len()
            )));
        }
        self.entries.push(DumpEntry {
            name: name.to_string(),
            dtype,
            dims: dims.to_vec(),
            data,
        });
        Ok(())
    }

    /// Reads `tensor` back from its device through `stream` (after the work enqueued
    /// before) and adds it under `name`.
    pub fn add_tensor(&mut self, name: &str, stream: &Stream, tensor: &Tensor<'_>) -> Result<()> {
        let layout: Layout = tensor.layout;
        let bytes = stream.read(tensor.span())?;
        self.add(name, layout.dtype, layout.dims(), pack(&bytes, &layout))
    }

    /// Writes the dump to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut offset = 0u64;
        let tensors = self
            .entries
            .iter()
            .map(|e| {
                let h = HeaderEntry {
                    name: e.name.clone(),
                    dtype: e.dtype.name().to_string(),
                    dims: e.dims.clone(),
                    offset,
                    len: e.data.len() as u64,
                };
                offset += e.data.len() as u64;
                h
            })
            .collect();
        let header =
            serde_json::to_vec(&Header { tensors }).map_err(|e| Error::backend("xpu", e))?;
        let mut out = Vec::with_capacity(16 + header.len() + offset as usize);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(&header);
        for e in &self.entries {
            out.extend_from_slice(&e.data);
        }
        std::fs::write(path, out).map_err(|e| {
            Error::invalid(format!(
                "cannot write the tensor dump {}: {e}",
                path.display()
            ))
        })
    }

    /// Reads a dump written by [`TensorDump::write`].
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::invalid(format!(
                "cannot read the tensor dump {}: {e}",
                path.display()
            ))
        })?;
        Self::parse(&bytes).map_err(|m| {
            Error::invalid(format!(
                "{} is not a valid tensor dump: {m}",
                path.display()
            ))
        })
    }

    /// Parses the bytes of a dump.
    pub fn parse(bytes: &[u8]) -> std::result::Result<Self, String> {
        if bytes.len() < 16 || &bytes[..8] != MAGIC {
            return Err("it does not start with XPUTDMP1 (a version-1 xpu tensor dump)".into());
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&bytes[8..16]);
        let header_len = u64::from_le_bytes(len);
        if header_len > MAX_HEADER || 16 + header_len > bytes.len() as u64 {
            return Err(format!(
                "its header claims {header_len} bytes, more than the file holds"
            ));
        }
        let header_end = 16 + header_len as usize;
        let header: Header = serde_json::from_slice(&bytes[16..header_end])
            .map_err(|e| format!("its header is not the expected JSON: {e}"))?;
        let data = &bytes[header_end..];
        let mut dump = TensorDump::new();
        let mut names = HashSet::new();
        for h in header.tensors {
            if !names.insert(h.name.clone()) {
                return Err(format!("the name `{}` appears twice", h.name));
            }
            let dtype: DType = h.dtype.parse().map_err(|e| format!("`{}`: {e}", h.name))?;
            let end = h
                .offset
                .checked_add(h.len)
                .filter(|&e| e <= data.len() as u64)
                .ok_or_else(|| format!("`{}` lies outside the file's data", h.name))?;
            dump.add(
                &h.name,
                dtype,
                &h.dims,
                data[h.offset as usize..end as usize].to_vec(),
            )
            .map_err(|e| e.to_string())?;
        }
        Ok(dump)
    }
}

/// The comparison of one tensor present in both dumps.
#[derive(Debug, Clone, Serialize)]
pub struct TensorComparison {
    /// The tensor's name.
    pub name: String,
    /// Its dtype (in the compared dump).
    pub dtype: String,
    /// The metrics, or why the tensors could not be compared (shape or dtype differ).
    pub metrics: Option<Metrics>,
    /// Why they could not be compared.
    pub mismatch: Option<String>,
}

/// Two dumps compared: every tensor of the reference that the other has, and the names
/// only one of them has.
#[derive(Debug, Clone, Serialize)]
pub struct DumpComparison {
    /// Tensors in both.
    pub tensors: Vec<TensorComparison>,
    /// Names only in the reference.
    pub only_in_reference: Vec<String>,
    /// Names only in the other dump.
    pub only_in_other: Vec<String>,
}

impl DumpComparison {
    /// Whether every tensor is in both, comparable and within tolerance.
    pub fn ok(&self) -> bool {
        self.only_in_reference.is_empty()
            && self.only_in_other.is_empty()
            && self
                .tensors
                .iter()
                .all(|t| t.metrics.is_some_and(|m| m.within_tolerance))
    }
}

/// Compares `other` with `reference`, tensor by tensor, with the tolerance of each
/// tensor's dtype in `other`.
pub fn compare_dumps(reference: &TensorDump, other: &TensorDump) -> DumpComparison {
    let mut tensors = Vec::new();
    let mut only_in_reference = Vec::new();
    for r in reference.entries() {
        let Some(o) = other.get(&r.name) else {
            only_in_reference.push(r.name.clone());
            continue;
        };
        let mismatch = if r.dims != o.dims {
            Some(format!(
                "shape {:?} against {:?} in the reference",
                o.dims, r.dims
            ))
        } else {
            None
        };
        tensors.push(TensorComparison {
            name: r.name.clone(),
            dtype: o.dtype.name().to_string(),
            metrics: mismatch.is_none().then(|| {
                metrics(
                    &to_f64(&o.data, o.dtype),
                    &to_f64(&r.data, r.dtype),
                    relative_tolerance(o.dtype),
                )
            }),
            mismatch,
        });
    }
    let only_in_other = other
        .entries()
        .iter()
        .filter(|o| reference.get(&o.name).is_none())
        .map(|o| o.name.clone())
        .collect();
    DumpComparison {
        tensors,
        only_in_reference,
        only_in_other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn round_trip_and_compare() {
        let dir = std::env::temp_dir().join(format!("xpu-dump-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut a = TensorDump::new();
        a.add("w", DType::F32, &[2, 2], f32s(&[1.0, 2.0, 3.0, 4.0]))
            .unwrap();
        a.add("b", DType::F32, &[2], f32s(&[0.5, -0.5])).unwrap();
        assert!(a.add("w", DType::F32, &[1], f32s(&[1.0])).is_err());
        assert!(a.add("x", DType::F32, &[3], f32s(&[1.0])).is_err());
        let path = dir.join("a.xtd");
        a.write(&path).unwrap();
        let back = TensorDump::read(&path).unwrap();
        assert_eq!(back, a);
        let mut b = TensorDump::new();
        b.add("w", DType::F32, &[2, 2], f32s(&[1.0, 2.0, 3.0, 4.01]))
            .unwrap();
        b.add("c", DType::F32, &[1], f32s(&[0.0])).unwrap();
        let cmp = compare_dumps(&a, &b);
        assert!(!cmp.ok());
        assert_eq!(cmp.only_in_reference, vec!["b".to_string()]);
        assert_eq!(cmp.only_in_other, vec!["c".to_string()]);
        let m = cmp.tensors[0].metrics.unwrap();
        assert!((m.max_abs_err - 0.01).abs() < 1e-6 && !m.within_tolerance);
        // Damaged files are refused with the reason.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 3);
        assert!(TensorDump::parse(&bytes).unwrap_err().contains("outside"));
        assert!(TensorDump::parse(b"nonsense").is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
