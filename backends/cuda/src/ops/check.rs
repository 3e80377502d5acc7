//! [`IndexCheck`]: the record of an operation's index check, in pinned host memory the
//! device writes through a mapping, read by the stream's completion thread.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr};
use xpu_hal::{Error, Result};

use crate::device::DeviceShared;
use crate::driver::cu;

/// Bytes of the record: `{ u32 bad; i32 value; u64 position; }` (`XpuIndexRecord`).
pub const RECORD_BYTES: usize = 16;

/// What the checked tensor holds, for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Gather / scatter-add indices into `rows` rows.
    Indices {
        /// The table's rows.
        rows: u64,
    },
    /// Cross-entropy labels of `classes` classes (−1 ignores a row).
    Labels {
        /// The number of classes.
        classes: u64,
    },
}

impl Checked {
    /// The bound the check kernel compares with.
    pub fn bound(self) -> u64 {
        match self {
            Checked::Indices { rows } => rows,
            Checked::Labels { classes } => classes,
        }
    }

    /// Whether −1 is allowed.
    pub fn allows_minus_one(self) -> bool {
        matches!(self, Checked::Labels { .. })
    }

    /// The error for the bad `value` at `position` (the reference's wording).
    pub fn error(self, position: u64, value: i32) -> Error {
        match self {
            Checked::Indices { rows } => Error::invalid(format!(
                "index at position {position} is {value}, outside [0, {rows}); the operation was not carried out"
            )),
            Checked::Labels { classes } => Error::invalid(format!(
                "label of row {position} is {value}, outside [0, {classes}) and not -1 (ignored); the operation was not carried out"
            )),
        }
    }
}

/// One operation's index-check record: pinned, device-mapped host memory, zeroed at
/// creation; the check kernel fills it when it finds a bad index, the operation's
/// writing kernels read it and write nothing then, and the completion thread reports it
/// (via [`IndexCheck::failure`]) once the work has completed.
pub struct IndexCheck {
    dev: Arc<DeviceShared>,
    host: *mut u8,
    device: CUdeviceptr,
    checked: Checked,
}

// SAFETY: the record is plain pinned memory owned by this value; the host reads it
// only after the device work that writes it has completed.
unsafe impl Send for IndexCheck {}
// SAFETY: as above.
unsafe impl Sync for IndexCheck {}

impl IndexCheck {
    /// A zeroed record on `dev`.
    pub(crate) fn new(dev: &Arc<DeviceShared>, checked: Checked) -> Result<Self> {
        dev.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        cu(
            &dev.name,
            "allocating an index-check record",
            "cuMemHostAlloc",
            // SAFETY: context current; valid out-pointer.
            || unsafe { sys::cuMemHostAlloc(&mut p, RECORD_BYTES, flags) },
        )?;
        let mut check = IndexCheck {
            dev: dev.clone(),
            host: p.cast::<u8>(),
            device: 0,
            checked,
        };
        // SAFETY: `host` is a fresh allocation of RECORD_BYTES bytes no device work uses yet.
        unsafe { std::ptr::write_bytes(check.host, 0, RECORD_BYTES) };
        let mut device: CUdeviceptr = 0;
        cu(
            &dev.name,
            "mapping an index-check record",
            "cuMemHostGetDevicePointer_v2",
            // SAFETY: pinned memory from cuMemHostAlloc with DEVICEMAP; flags must be 0.
            || unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, p, 0) },
        )?;
        check.device = device;
        Ok(check)
    }

    /// The record's device address.
    pub fn device_address(&self) -> u64 {
        self.device
    }

    /// What is checked.
    pub fn checked(&self) -> Checked {
        self.checked
    }

    /// The error the record holds, if the check found a bad index. Call only after the
    /// work that wrote it has completed.
    pub fn failure(&self) -> Option<Error> {
        let mut b = [0u8; RECORD_BYTES];
        for (i, byte) in b.iter_mut().enumerate() {
            // SAFETY: `host` is live for RECORD_BYTES bytes; volatile, since the device
            // wrote it through the mapping.
            *byte = unsafe { std::ptr::read_volatile(self.host.add(i)) };
        }
        decode_record(&b).map(|(position, value)| self.checked.error(position, value))
    }
}

/// `(position, value)` of a record that reports a bad index.
pub fn decode_record(b: &[u8; RECORD_BYTES]) -> Option<(u64, i32)> {
    let bad = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let value = i32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let mut pos = [0u8; 8];
    pos.copy_from_slice(&b[8..16]);
    (bad != 0).then_some((u64::from_le_bytes(pos), value))
}

impl Drop for IndexCheck {
    fn drop(&mut self) {
        let p = self.host.cast::<c_void>();
        // SAFETY: from cuMemHostAlloc, freed once; held by the operation until its work
        // has completed, so the device no longer uses it.
        self.dev.release(
            "freeing an index-check record",
            "cuMemFreeHost",
            || unsafe { sys::cuMemFreeHost(p) },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_decode_and_name_position_and_value() {
        let mut b = [0u8; RECORD_BYTES];
        assert_eq!(decode_record(&b), None);
        b[0] = 1;
        b[4..8].copy_from_slice(&(-7i32).to_le_bytes());
        b[8..16].copy_from_slice(&42u64.to_le_bytes());
        assert_eq!(decode_record(&b), Some((42, -7)));
        let e = Checked::Indices { rows: 5 }.error(42, -7).to_string();
        assert!(
            e.contains("position 42") && e.contains("-7") && e.contains("[0, 5)"),
            "{e}"
        );
        let e = Checked::Labels { classes: 3 }.error(2, 9).to_string();
        assert!(e.contains("row 2") && e.contains("is 9"), "{e}");
        assert!(Checked::Labels { classes: 3 }.allows_minus_one());
        assert!(!Checked::Indices { rows: 3 }.allows_minus_one());
    }
}
