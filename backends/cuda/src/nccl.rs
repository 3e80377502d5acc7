//! NCCL for groups of CUDA devices in this process.
//!
//! [`NcclGroup::new`] makes one NCCL communicator per device with `ncclCommInitAll` over
//! the devices' ordinals; [`NcclGroup::run`] enqueues one collective for every rank at
//! once between `ncclGroupStart` and `ncclGroupEnd`, each rank's part on its own stream,
//! which is how one thread drives several GPUs. The work is then accounted to each
//! rank's xpu stream like any operation of its own: the stream's next checkpoint covers
//! it (so `synchronize`, `query` and events see it) and holds the buffers until it has
//! run.
//!
//! NCCL is found like NVRTC ([`crate::libs`]: `libnccl.so.2` on the loader path, a
//! toolkit, Python's `nvidia/nccl/lib`, or `XPU_NCCL_LIBRARY`) and called through a
//! function table of our own over its C ABI; when it is absent `new` says so, with
//! where it looked, and callers use their own algorithms.
//!
//! All-to-all is a group of sends and receives, as in nccl-tests; every reduction
//! maps to NCCL's (`avg` to `ncclAvg`, NCCL ≥ 2.10).

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use cudarc::driver::sys::CUstream;
use libloading::Library;
use xpu_hal::group::{CollectiveGroup, GroupOp, GroupPart, GroupReduce};
use xpu_hal::{BufferSlice, DType, Device, Error, Result};

use crate::libs::{self, Found, NotFound, Opened, Places};
use crate::stream::{buffer_of, CudaStream, Held};
use crate::NAME;

/// `ncclComm_t`: an opaque handle.
type Comm = *mut c_void;
/// `ncclResult_t`: 0 is `ncclSuccess`.
type NcclResult = c_int;

// `ncclDataType_t` values (nccl.h; stable since NCCL 2.0, bfloat16 since 2.10).
const NCCL_UINT8: c_int = 1;
const NCCL_INT32: c_int = 2;
const NCCL_INT64: c_int = 4;
const NCCL_FLOAT16: c_int = 6;
const NCCL_FLOAT32: c_int = 7;
const NCCL_FLOAT64: c_int = 8;
const NCCL_BFLOAT16: c_int = 9;

// `ncclRedOp_t` values (nccl.h; `ncclAvg` since NCCL 2.10).
const NCCL_SUM: c_int = 0;
const NCCL_PROD: c_int = 1;
const NCCL_MAX: c_int = 2;
const NCCL_MIN: c_int = 3;
const NCCL_AVG: c_int = 4;

type Reduction = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    CUstream,
) -> NcclResult;

/// NCCL's entry points this crate calls, with their C types (`nccl.h`).
#[derive(Clone, Copy)]
struct Api {
    version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> NcclResult,
    destroy: unsafe extern "C" fn(Comm) -> NcclResult,
    abort: unsafe extern "C" fn(Comm) -> NcclResult,
    group_start: unsafe extern "C" fn() -> NcclResult,
    group_end: unsafe extern "C" fn() -> NcclResult,
    error_string: unsafe extern "C" fn(NcclResult) -> *const std::ffi::c_char,
    all_reduce: Reduction,
    reduce_scatter: Reduction,
    reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        c_int,
        Comm,
        CUstream,
    ) -> NcclResult,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        CUstream,
    ) -> NcclResult,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        Comm,
        CUstream,
    ) -> NcclResult,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, CUstream) -> NcclResult,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, CUstream) -> NcclResult,
}

impl Api {
    fn load(lib: &Library) -> std::result::Result<Api, String> {
        // SAFETY: each lookup's type is the one `nccl.h` declares for its name.
        unsafe {
            Ok(Api {
                version: libs::symbol(lib, "NCCL", "ncclGetVersion")?,
                init_all: libs::symbol(lib, "NCCL", "ncclCommInitAll")?,
                destroy: libs::symbol(lib, "NCCL", "ncclCommDestroy")?,
                abort: libs::symbol(lib, "NCCL", "ncclCommAbort")?,
                group_start: libs::symbol(lib, "NCCL", "ncclGroupStart")?,
                group_end: libs::symbol(lib, "NCCL", "ncclGroupEnd")?,
                error_string: libs::symbol(lib, "NCCL", "ncclGetErrorString")?,
                all_reduce: libs::symbol(lib, "NCCL", "ncclAllReduce")?,
                reduce_scatter: libs::symbol(lib, "NCCL", "ncclReduceScatter")?,
                reduce: libs::symbol(lib, "NCCL", "ncclReduce")?,
                broadcast: libs::symbol(lib, "NCCL", "ncclBroadcast")?,
                all_gather: libs::symbol(lib, "NCCL", "ncclAllGather")?,
                send: libs::symbol(lib, "NCCL", "ncclSend")?,
                recv: libs::symbol(lib, "NCCL", "ncclRecv")?,
            })
        }
    }
}

/// The oldest NCCL whose ABI this crate calls (`ncclAvg` and bfloat16 came in 2.10).
pub const MIN_NCCL_VERSION: c_int = 21000;

/// `major.minor.patch` of an `ncclGetVersion` code (`major × 10000 + minor × 100 +
/// patch` since NCCL 2.9).
pub fn version_string(code: c_int) -> String {
    format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
}

/// A loaded NCCL: its entry points, version and file.
pub struct Nccl {
    api: Api,
    /// `ncclGetVersion`'s code.
    pub version: c_int,
    /// The file the loader mapped.
    pub path: String,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("version", &version_string(self.version))
            .field("path", &self.path)
            .finish()
    }
}

// SAFETY: the table only holds function pointers into a library that is never
// unloaded; NCCL's own rules on concurrent calls are kept by `NcclGroup`.
unsafe impl Send for Nccl {}
// SAFETY: as above.
unsafe impl Sync for Nccl {}

impl Nccl {
    /// Finds NCCL 2.10 or newer (see [`crate::libs`]): `places` from the environment
    /// unless given.
    pub fn find(places: Option<Places>) -> std::result::Result<Found<Nccl>, NotFound> {
        let places = places.unwrap_or_else(|| Places::from_env(&libs::NCCL));
        let open = |lib: &Library| {
            let api = Api::load(lib)?;
            let mut code = 0;
            // SAFETY: valid out-pointer.
            let r = unsafe { (api.version)(&mut code) };
            if r != 0 {
                return Err(format!("ncclGetVersion failed with {r}"));
            }
            if code < MIN_NCCL_VERSION {
                return Err(format!(
                    "NCCL {} is older than 2.10, which xpu needs (ncclAvg, bfloat16)",
                    version_string(code)
                ));
            }
            Ok(Opened {
                symbol: api.version as *const c_void,
                version: version_string(code),
                value: Nccl {
                    api,
                    version: code,
                    path: String::new(),
                },
            })
        };
        // SAFETY: loading NCCL runs its initialisers, which is what using it means; the
        // table is used only as `nccl.h` declares.
        unsafe { libs::search(&libs::NCCL, &places, open) }.map(|mut found| {
            found.value.path = found.path.clone();
            found
        })
    }

    /// Turns an NCCL result into an error naming the call and NCCL's reason.
    fn check(&self, what: &str, r: NcclResult) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let text = unsafe { (self.api.error_string)(r) };
        let reason = if text.is_null() {
            format!("error {r}")
        } else {
            // SAFETY: as above: a static NUL-terminated string.
            unsafe { std::ffi::CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(Error::backend_message(
            NAME,
            format!("{what} failed: {reason} ({r}); set NCCL_DEBUG=WARN for NCCL's details"),
        ))
    }
}

/// NCCL communicators over CUDA devices of this process, rank `r` on `devices[r]`.
pub struct NcclGroup {
    nccl: Arc<Nccl>,
    comms: Vec<Comm>,
    devices: Vec<Device>,
    /// Set by [`CollectiveGroup::abort`]: the communicators were aborted (which also
    /// frees them), so no call may use them again.
    aborted: std::sync::Mutex<bool>,
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
        f.debug_struct("NcclGroup")
            .field("devices", &ids)
            .field("nccl", &self.nccl)
            .finish()
    }
}

fn dtype(d: DType) -> c_int {
    match d {
        DType::F32 => NCCL_FLOAT32,
        DType::F64 => NCCL_FLOAT64,
        DType::F16 => NCCL_FLOAT16,
        DType::BF16 => NCCL_BFLOAT16,
        DType::I32 => NCCL_INT32,
        DType::I64 => NCCL_INT64,
        DType::U8 => NCCL_UINT8,
    }
}

fn reduce(op: GroupReduce) -> c_int {
    match op {
        GroupReduce::Sum => NCCL_SUM,
        GroupReduce::Prod => NCCL_PROD,
        GroupReduce::Min => NCCL_MIN,
        GroupReduce::Max => NCCL_MAX,
        GroupReduce::Avg => NCCL_AVG,
    }
}

/// The process's NCCL, or why there is none (with where it looked).
pub fn library() -> std::result::Result<Arc<Nccl>, String> {
    crate::driver()?.nccl.clone()
}

/// Whether NCCL can be used, or why not.
pub fn available() -> std::result::Result<(), String> {
    library().map(|_| ())
}

/// One rank's part of an operation, resolved: its buffers' addresses, its xpu stream,
/// and what the work holds.
struct Native<'a> {
    send: *mut c_void,
    recv: *mut c_void,
    stream: &'a CudaStream,
    held: Vec<Held>,
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
        let nccl = library().map_err(|reason| Error::unavailable("nccl", reason))?;
        let n = c_int::try_from(ordinals.len())
            .map_err(|_| Error::invalid("too many devices for one NCCL group"))?;
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); ordinals.len()];
        // SAFETY: `comms` has room for `n` communicators and `ordinals` holds `n` device
        // ordinals; NCCL fills the former.
        let r = unsafe { (nccl.api.init_all)(comms.as_mut_ptr(), n, ordinals.as_ptr()) };
        nccl.check("ncclCommInitAll", r)?;
        Ok(NcclGroup {
            nccl,
            comms,
            devices: devices.to_vec(),
            aborted: std::sync::Mutex::new(false),
        })
    }
}

impl CollectiveGroup for NcclGroup {
    /// The number of ranks.
    fn size(&self) -> usize {
        self.comms.len()
    }

    fn library(&self) -> String {
        format!("nccl {}", version_string(self.nccl.version))
    }

    /// `ncclCommAbort` on every rank's communicator, once: NCCL's kernels that wait for
    /// peers stop, and the communicators are freed (never destroyed again).
    fn abort(&self) {
        let mut aborted = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        if *aborted {
            return;
        }
        *aborted = true;
        for &comm in &self.comms {
            if !comm.is_null() {
                // SAFETY: each communicator came from ncclCommInitAll and is aborted
                // once (the flag above, held across the calls); no call uses it later.
                let _ = unsafe { (self.nccl.api.abort)(comm) };
            }
        }
    }

    /// Enqueues `op` for every rank, `parts[r]` being rank `r`'s stream and buffers.
    /// Each rank's stream then counts the work as its own: its next checkpoint covers
    /// it, and the buffers are held until it has run.
    fn run(&self, op: GroupOp, parts: &[GroupPart<'_>]) -> Result<()> {
        if parts.len() != self.comms.len() {
            return Err(Error::invalid(format!(
                "{} parts for an NCCL group of {} ranks; give one per rank",
                parts.len(),
                self.comms.len()
            )));
        }
        // Held until the operation is enqueued, so that an abort waits for it.
        let aborted = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        if *aborted {
            return Err(Error::aborted(
                "the NCCL communicators were aborted with the communicator; make a new one",
            ));
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
                })?;
            let mut held: Vec<Held> = Vec::new();
            let mut address = |b: &Option<BufferSlice<'_>>| -> Result<*mut c_void> {
                match b {
                    None => Ok(std::ptr::null_mut()),
                    Some(b) => match b.resolve(device)? {
                        None => Ok(std::ptr::null_mut()),
                        Some(raw) => {
                            let buf = buffer_of(&raw)?;
                            let at = buf.address(raw.offset) as *mut c_void;
                            held.push(buf);
                            Ok(at)
                        }
                    },
                }
            };
            let (send, recv) = (address(&part.send)?, address(&part.recv)?);
            native.push(Native {
                send,
                recv,
                stream,
                held,
            });
        }
        // SAFETY: group calls take no arguments; every call between them is this group's.
        let started = unsafe { (self.nccl.api.group_start)() };
        self.nccl.check("ncclGroupStart", started)?;
        let issued = self.issue(op, &native);
        // Always close the group, even after a failed call, so NCCL is left usable.
        // SAFETY: closes the group opened above.
        let ended = unsafe { (self.nccl.api.group_end)() };
        let ended = self.nccl.check("ncclGroupEnd", ended);
        // Whatever NCCL enqueued is now on the streams: account it there, so that the
        // streams' checkpoints cover it and hold its buffers until it has run.
        let mut accounted = Ok(());
        for n in native {
            if let Err(e) = n.stream.shared.issued_outside(n.held) {
                accounted = accounted.and(Err(e));
            }
        }
        issued.and(ended).and(accounted)
    }
}

impl NcclGroup {
    fn issue(&self, op: GroupOp, native: &[Native<'_>]) -> Result<()> {
        let n = self.comms.len();
        let api = &self.nccl.api;
        let rank_int = |r: usize| {
            c_int::try_from(r).map_err(|_| Error::invalid("a rank does not fit a C int"))
        };
        for (r, part) in native.iter().enumerate() {
            let (send, recv) = (part.send, part.recv);
            let stream = part.stream.raw();
            let comm = self.comms[r];
            // SAFETY (every call below): the addresses were resolved from live, in-bounds
            // slices of rank r's device with the lengths the operation implies (checked
            // by the caller's validation), held until the work has run; the stream is
            // rank r's native stream, and the communicator belongs to this group.
            let (what, result) = match op {
                GroupOp::AllReduce {
                    count,
                    dtype: t,
                    op,
                } => {
                    // SAFETY: see above.
                    let r = unsafe {
                        (api.all_reduce)(send, recv, count, dtype(t), reduce(op), comm, stream)
                    };
                    ("ncclAllReduce", r)
                }
                GroupOp::Reduce {
                    count,
                    dtype: t,
                    op,
                    root,
                } => {
                    let root = rank_int(root)?;
                    // SAFETY: see above.
                    let r = unsafe {
                        (api.reduce)(send, recv, count, dtype(t), reduce(op), root, comm, stream)
                    };
                    ("ncclReduce", r)
                }
                GroupOp::Broadcast { bytes, root } => {
                    let from = if send.is_null() { recv } else { send };
                    let root = rank_int(root)?;
                    // SAFETY: see above.
                    let r = unsafe {
                        (api.broadcast)(from, recv, bytes, NCCL_UINT8, root, comm, stream)
                    };
                    ("ncclBroadcast", r)
                }
                GroupOp::AllGather { bytes } => {
                    // SAFETY: see above.
                    let r =
                        unsafe { (api.all_gather)(send, recv, bytes, NCCL_UINT8, comm, stream) };
                    ("ncclAllGather", r)
                }
                GroupOp::ReduceScatter {
                    count,
                    dtype: t,
                    op,
                } => {
                    // SAFETY: see above.
                    let r = unsafe {
                        (api.reduce_scatter)(send, recv, count, dtype(t), reduce(op), comm, stream)
                    };
                    ("ncclReduceScatter", r)
                }
                GroupOp::AllToAll { bytes } => {
                    for q in 0..n {
                        let peer = rank_int(q)?;
                        let out = (send as *const u8).wrapping_add(q * bytes) as *const c_void;
                        let inp = (recv as *mut u8).wrapping_add(q * bytes) as *mut c_void;
                        // SAFETY: see above; block q of each buffer lies within it.
                        let sent =
                            unsafe { (api.send)(out, bytes, NCCL_UINT8, peer, comm, stream) };
                        self.nccl.check("ncclSend", sent)?;
                        // SAFETY: as for the send.
                        let got = unsafe { (api.recv)(inp, bytes, NCCL_UINT8, peer, comm, stream) };
                        self.nccl.check("ncclRecv", got)?;
                    }
                    continue;
                }
            };
            self.nccl.check(what, result)?;
        }
        Ok(())
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        if *self.aborted.get_mut().unwrap_or_else(|p| p.into_inner()) {
            return;
        }
        for &comm in &self.comms {
            if !comm.is_null() {
                // SAFETY: each communicator came from ncclCommInitAll and is destroyed
                // once; errors cannot be returned from a drop and leave nothing to undo.
                let _ = unsafe { (self.nccl.api.destroy)(comm) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_version_codes_read_as_nccl_prints_them() {
        assert_eq!(version_string(22304), "2.23.4");
        assert_eq!(version_string(MIN_NCCL_VERSION), "2.10.0");
    }

    #[test]
    fn every_dtype_and_reduction_has_its_nccl_value() {
        let types: Vec<c_int> = DType::ALL.iter().map(|d| dtype(*d)).collect();
        let mut unique = types.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), types.len(), "distinct NCCL types");
        assert_eq!(dtype(DType::F32), 7);
        assert_eq!(dtype(DType::BF16), 9);
        assert_eq!(reduce(GroupReduce::Avg), 4);
        assert_eq!(reduce(GroupReduce::Min), 3);
    }
}
