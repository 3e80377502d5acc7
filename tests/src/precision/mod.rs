//! Precision comparison, as the people who qualify new chips run it every day: per
//! operation, the maximum absolute and relative errors, the cosine similarity and the
//! share of elements beyond 0.1% and 0.5% relative error of one device's outputs
//! against a reference's ([`compare_devices`], behind `xpu compare`), and the same for
//! named tensors dumped by two runs ([`TensorDump`], [`compare_dumps`]), so whole
//! training steps can be compared the same way.

mod devices;
mod dump;
mod metrics;

pub use devices::{compare_devices, OpComparison};
pub use dump::{compare_dumps, DumpComparison, DumpEntry, TensorComparison, TensorDump};
pub use metrics::{combine, metrics, relative_tolerance, within_tolerance, Metrics};
