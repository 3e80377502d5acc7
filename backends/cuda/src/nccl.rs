//! NCCL for groups of CUDA devices in this process.
//!
//! [`NcclGroup::new`] makes one NCCL communicator per device with `ncclCommInitAll` over
//! the devices' ordinals; [`NcclGroup::run`] enqueues one collective for every rank at
//! once between `ncclGroupStart` and `ncclGroupEnd`, each rank's part on its own stream,
//! which is how one thread drives several GPUs. NCCL is loaded at run time like the
//! driver: when `libnccl.so.2` is absent, `new` says so instead of panicking, and
//! callers use their own algorithms.
//!
//! All-to-all is a group of sends and receives, as in nccl-tests; every reduction
//! maps to NCCL's (`avg` to `ncclAvg`, NCCL ≥ 2.10).

use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::sys::CUstream;
use cudarc::nccl::sys::{self as nccl, ncclComm_t, ncclDataType_t, ncclRedOp_t};
use xpu_hal::{BufferSlice, DType, Device, Error, Result, Stream};

use crate::stream::{buffer_of, CudaStream};
use crate::NAME;

/// A reduction NCCL computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclReduce {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMin`.
    Min,
    /// `ncclMax`.
    Max,
    /// `ncclAvg`.
    Avg,
}

/// One collective, described the same for every rank. Counts are elements of `dtype`;
/// byte lengths are for operations that only move bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclOp {
    /// `ncclAllReduce` of `count` elements.
    AllReduce {
        /// Elements per rank.
        count: usize,
        /// Their type.
        dtype: DType,
        /// The reduction.
        op: NcclReduce,
    },
    /// `ncclReduce` of `count` elements to `root`.
    Reduce {
        /// Elements per rank.
        count: usize,
        /// Their type.
        dtype: DType,
        /// The reduction.
        op: NcclReduce,
        /// The rank that receives the result.
        root: usize,
    },
    /// `ncclBroadcast` of `bytes` from `root`.
    Broadcast {
        /// Bytes broadcast.
        bytes: usize,
        /// The rank whose data it is.
        root: usize,
    },
    /// `ncclAllGather` of `bytes` per rank.
    AllGather {
        /// Bytes each rank contributes.
        bytes: usize,
    },
    /// `ncclReduceScatter` of `count` elements per rank.
    ReduceScatter {
        /// Elements each rank receives.
        count: usize,
        /// Their type.
        dtype: DType,
        /// The reduction.
        op: NcclReduce,
    },
    /// Blocks of `bytes` between every pair, as grouped sends and receives.
    AllToAll {
        /// Bytes per block.
        bytes: usize,
    },
}

/// One rank's part of an operation: its stream and buffers (`None` where the rank has
/// none, as non-roots of a reduce).
pub struct NcclPart<'a> {
    /// The rank's stream, on its device.
    pub stream: &'a Stream,
    /// The send buffer.
    pub send: Option<BufferSlice<'a>>,
    /// The receive buffer.
    pub recv: Option<BufferSlice<'a>>,
}

/// NCCL communicators over CUDA devices of this process, rank `r` on `devices[r]`.
pub struct NcclGroup {
    comms: Vec<ncclComm_t>,
    devices: Vec<Device>,
}

// SAFETY: NCCL communicators may be used from any thread as long as calls on one
// communicator are not concurrent; `run` takes `&self` but callers serialize operations
// on a group (the collectives' rendezvous enqueues one operation at a time), and NCCL
// itself serializes within a group call.
unsafe impl Send for NcclGroup {}
// SAFETY: as above.
unsafe impl Sync for NcclGroup {}

impl std::fmt::Debug for NcclGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.devices.iter().map(|d| d.id().to_string()).collect();
        f.debug_struct("NcclGroup").field("devices", &ids).finish()
    }
}

/// Runs an NCCL call, turning a panic in the loader (a missing symbol) into an error.
fn call(what: &str, f: impl FnOnce() -> nccl::ncclResult_t) -> Result<()> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(nccl::ncclResult_t::ncclSuccess) => Ok(()),
        Ok(code) => Err(Error::backend_message(
            NAME,
            format!("{what} failed with {code:?}; set NCCL_DEBUG=WARN for NCCL's reason"),
        )),
        Err(_) => Err(Error::backend_message(
            NAME,
            format!("{what} is missing from libnccl; install NCCL 2.18 or newer"),
        )),
    }
}

fn dtype(d: DType) -> ncclDataType_t {
    match d {
        DType::F32 => ncclDataType_t::ncclFloat32,
        DType::F64 => ncclDataType_t::ncclFloat64,
        DType::F16 => ncclDataType_t::ncclFloat16,
        DType::BF16 => ncclDataType_t::ncclBfloat16,
        DType::I32 => ncclDataType_t::ncclInt32,
        DType::I64 => ncclDataType_t::ncclInt64,
        DType::U8 => ncclDataType_t::ncclUint8,
    }
}

fn reduce(op: NcclReduce) -> ncclRedOp_t {
    match op {
        NcclReduce::Sum => ncclRedOp_t::ncclSum,
        NcclReduce::Prod => ncclRedOp_t::ncclProd,
        NcclReduce::Min => ncclRedOp_t::ncclMin,
        NcclReduce::Max => ncclRedOp_t::ncclMax,
        NcclReduce::Avg => ncclRedOp_t::ncclAvg,
    }
}

/// Whether libnccl can be loaded, or why not.
pub fn available() -> std::result::Result<(), String> {
    let driver = crate::driver()?;
    if driver.nccl {
        Ok(())
    } else {
        Err("libnccl.so.2 not found; install NCCL (Debian's libnccl2) to use it".to_string())
    }
}

impl NcclGroup {
    /// Communicators over `devices`: distinct CUDA devices of this process. Fails, with
    /// the reason, when one is not a CUDA device, one appears twice, or NCCL is absent.
    pub fn new(devices: &[Device]) -> Result<NcclGroup> {
        if let Some(d) = devices.iter().find(|d| d.backend() != NAME) {
            return Err(Error::invalid(format!(
                "{} is not a CUDA device; NCCL groups hold CUDA devices only",
                d.id()
            )));
        }
        let ordinals = devices
            .iter()
            .map(|d| c_int::try_from(d.id().index))
            .collect::<std::result::Result<Vec<c_int>, _>>()
            .map_err(|_| Error::invalid("a CUDA device index does not fit a C int"))?;
        let mut seen = ordinals.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != ordinals.len() {
            return Err(Error::invalid(
                "a device appears twice; NCCL needs one rank per GPU",
            ));
        }
        available().map_err(|reason| Error::unavailable("nccl", reason))?;
        let n = c_int::try_from(ordinals.len())
            .map_err(|_| Error::invalid("too many devices for one NCCL group"))?;
        let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); ordinals.len()];
        // SAFETY: `comms` has room for `n` communicators and `ordinals` holds `n` device
        // ordinals; NCCL fills the former.
        call("ncclCommInitAll", || unsafe {
            nccl::ncclCommInitAll(comms.as_mut_ptr(), n, ordinals.as_ptr())
        })?;
        Ok(NcclGroup {
            comms,
            devices: devices.to_vec(),
        })
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.comms.len()
    }

    /// Enqueues `op` for every rank, `parts[r]` being rank `r`'s stream and buffers.
    pub fn run(&self, op: NcclOp, parts: &[NcclPart<'_>]) -> Result<()> {
        if parts.len() != self.comms.len() {
            return Err(Error::invalid(format!(
                "{} parts for an NCCL group of {} ranks; give one per rank",
                parts.len(),
                self.comms.len()
            )));
        }
        // Resolve everything first, so that a bad argument leaves no group half-issued.
        let mut native = Vec::with_capacity(parts.len());
        for (r, part) in parts.iter().enumerate() {
            let device = &self.devices[r];
            if part.stream.device() != device {
                return Err(Error::invalid(format!(
                    "rank {r}'s stream is on {}, not {}",
                    part.stream.device().id(),
                    device.id()
                )));
            }
            let stream = part
                .stream
                .implementation()
                .as_any()
                .downcast_ref::<CudaStream>()
                .ok_or_else(|| {
                    Error::backend_message(NAME, "internal error: a CUDA stream of another type")
                })?
                .shared
                .stream;
            let address = |b: &Option<BufferSlice<'_>>| -> Result<*mut c_void> {
                match b {
                    None => Ok(std::ptr::null_mut()),
                    Some(b) => match b.resolve(device)? {
                        None => Ok(std::ptr::null_mut()),
                        Some(raw) => {
                            let buf = buffer_of(&raw)?;
                            Ok((buf.ptr + raw.offset) as *mut c_void)
                        }
                    },
                }
            };
            native.push((address(&part.send)?, address(&part.recv)?, stream));
        }
        // SAFETY: group calls take no arguments; every call between them is this group's.
        call("ncclGroupStart", || unsafe { nccl::ncclGroupStart() })?;
        let issued = self.issue(op, &native);
        // Always close the group, even after a failed call, so NCCL is left usable.
        // SAFETY: closes the group opened above.
        let ended = call("ncclGroupEnd", || unsafe { nccl::ncclGroupEnd() });
        issued.and(ended)
    }

    fn issue(&self, op: NcclOp, native: &[(*mut c_void, *mut c_void, CUstream)]) -> Result<()> {
        let n = self.comms.len();
        let rank_int = |r: usize| {
            c_int::try_from(r).map_err(|_| Error::invalid("a rank does not fit a C int"))
        };
        for (r, &(send, recv, stream)) in native.iter().enumerate() {
            let comm = self.comms[r];
            let stream = stream as nccl::cudaStream_t;
            // SAFETY (every call below): the addresses were resolved from live, in-bounds
            // slices of rank r's device with the lengths the operation implies (checked
            // by the caller's validation), the stream is rank r's native stream, and the
            // communicator belongs to this group.
            match op {
                NcclOp::AllReduce {
                    count,
                    dtype: t,
                    op,
                } => {
                    // SAFETY: see above.
                    call("ncclAllReduce", || unsafe {
                        nccl::ncclAllReduce(send, recv, count, dtype(t), reduce(op), comm, stream)
                    })?;
                }
                NcclOp::Reduce {
                    count,
                    dtype: t,
                    op,
                    root,
                } => {
                    let root = rank_int(root)?;
                    // SAFETY: see above.
                    call("ncclReduce", || unsafe {
                        nccl::ncclReduce(
                            send,
                            recv,
                            count,
                            dtype(t),
                            reduce(op),
                            root,
                            comm,
                            stream,
                        )
                    })?;
                }
                NcclOp::Broadcast { bytes, root } => {
                    let from = if send.is_null() { recv } else { send };
                    let root = rank_int(root)?;
                    let u8s = ncclDataType_t::ncclUint8;
                    // SAFETY: see above.
                    call("ncclBroadcast", || unsafe {
                        nccl::ncclBroadcast(from, recv, bytes, u8s, root, comm, stream)
                    })?;
                }
                NcclOp::AllGather { bytes } => {
                    let u8s = ncclDataType_t::ncclUint8;
                    // SAFETY: see above.
                    call("ncclAllGather", || unsafe {
                        nccl::ncclAllGather(send, recv, bytes, u8s, comm, stream)
                    })?;
                }
                NcclOp::ReduceScatter {
                    count,
                    dtype: t,
                    op,
                } => {
                    // SAFETY: see above.
                    call("ncclReduceScatter", || unsafe {
                        nccl::ncclReduceScatter(
                            send,
                            recv,
                            count,
                            dtype(t),
                            reduce(op),
                            comm,
                            stream,
                        )
                    })?;
                }
                NcclOp::AllToAll { bytes } => {
                    let u8s = ncclDataType_t::ncclUint8;
                    for q in 0..n {
                        let peer = rank_int(q)?;
                        let out = (send as *const u8).wrapping_add(q * bytes) as *const c_void;
                        let inp = (recv as *mut u8).wrapping_add(q * bytes) as *mut c_void;
                        // SAFETY: see above; block q of each buffer lies within it.
                        call("ncclSend", || unsafe {
                            nccl::ncclSend(out, bytes, u8s, peer, comm, stream)
                        })?;
                        // SAFETY: as for the send.
                        call("ncclRecv", || unsafe {
                            nccl::ncclRecv(inp, bytes, u8s, peer, comm, stream)
                        })?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        for &comm in &self.comms {
            if !comm.is_null() {
                // SAFETY: each communicator came from ncclCommInitAll and is destroyed
                // once; errors cannot be returned from a drop and leave nothing to undo.
                let _ = call("ncclCommDestroy", || unsafe { nccl::ncclCommDestroy(comm) });
            }
        }
    }
}
