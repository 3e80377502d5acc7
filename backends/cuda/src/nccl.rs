//! NCCL for groups of CUDA devices, in this process or across processes.
//!
//! [`NcclGroup::new`] makes one NCCL communicator per device of this process with
//! `ncclCommInitAll` over the devices' ordinals. [`NcclGroup::across`] makes this
//! process's part of a group that spans processes: one process makes an identifier
//! with `ncclGetUniqueId` ([`unique_id`]), the caller hands it to the others by its own
//! means (the collectives send it over MPI), and every process joins with its own
//! devices at their ranks of the whole group, each with `ncclCommInitRankConfig`, all
//! of them inside one `ncclGroupStart`/`ncclGroupEnd`. Those communicators are
//! non-blocking (NCCL ≥ 2.14): joining returns at once, and we poll
//! `ncclCommGetAsyncError` until every process has joined or the group's timeout has
//! passed, then abort the communicators (`ncclCommAbort`) and report the timeout, so a
//! process that never comes cannot hang this one.
//!
//! [`NcclGroup::run`] enqueues one collective for every rank of this process at once
//! between `ncclGroupStart` and `ncclGroupEnd`, each rank's part on its own stream,
//! which is how one thread drives several GPUs; roots and all-to-all peers are ranks of
//! the whole group. Before it issues anything it asks `ncclCommGetAsyncError` whether a
//! communicator has failed (a peer died, a network error) and then returns NCCL's error
//! instead of issuing onto a broken communicator. A non-blocking group's `ncclGroupEnd`
//! may return `ncclInProgress` while NCCL's own thread launches the work; `run` waits
//! for that under the same timeout (an abort from another thread ends the wait). The
//! work is then accounted to each rank's xpu stream like any operation of its own: the
//! stream's next checkpoint covers it (so `synchronize`, `query` and events see it) and
//! holds the buffers until it has run. [`CollectiveGroup::abort`] aborts every
//! communicator of this process once, which releases ranks that wait for peers and
//! frees the communicators.
//!
//! NCCL is found like NVRTC ([`crate::libs`]: `libnccl.so.2` on the loader path, a
//! toolkit, Python's `nvidia/nccl/lib`, or `XPU_NCCL_LIBRARY`) and called through a
//! function table of our own over its C ABI; when it is absent `new` says so, with
//! where it looked, and callers use their own algorithms. Groups in this process need
//! NCCL 2.10; the entry points of groups across processes are optional in the table,
//! so an older NCCL still serves this process, and [`available_across`] says why it
//! cannot span processes.
//!
//! All-to-all is a group of sends and receives, as in nccl-tests; every reduction
//! maps to NCCL's (`avg` to `ncclAvg`, NCCL ≥ 2.10).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUstream;
use libloading::Library;
use xpu_hal::group::{CollectiveGroup, GroupAcross, GroupConfig, GroupOp, GroupPart, GroupReduce};
use xpu_hal::{BufferSlice, DType, Device, Error, Result};

use crate::device::CudaDevice;
use crate::libs::{self, Found, NotFound, Opened, Places};
use crate::stream::{buffer_of, CudaStream, Held};
use crate::NAME;

/// `ncclComm_t`: an opaque handle.
type Comm = *mut c_void;
/// `ncclResult_t`: 0 is `ncclSuccess`.
type NcclResult = c_int;

/// `ncclInProgress`: a non-blocking communicator's call is still under way (NCCL 2.14).
const NCCL_IN_PROGRESS: NcclResult = 7;

/// `NCCL_UNIQUE_ID_BYTES`: the size of an `ncclUniqueId`, the identifier of a group
/// across processes.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId` (nccl.h): `struct { char internal[128]; }`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; UNIQUE_ID_BYTES],
}

/// `NCCL_API_MAGIC`: the magic an `ncclConfig_t` carries when it was initialised.
const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`): an attribute NCCL chooses itself.
const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_VERSION(2, 17, 0)`: the header version whose `ncclConfig_t` [`NcclConfig`]
/// declares (`ncclConfig_v21700`).
const NCCL_CONFIG_VERSION: c_uint = 21700;

/// `ncclConfig_t` as nccl.h declares it from NCCL 2.17 on (`ncclConfig_v21700`): the
/// four fields of NCCL 2.14's (`size`, `magic`, `version`, `blocking`) and the four 2.17
/// appended. Later NCCLs append more and read only `size` bytes of a caller's config,
/// keeping their defaults for the rest; NCCL 2.14 to 2.16 read their own 24 bytes. The
/// fields after `blocking` are left undefined (NCCL's defaults) either way.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct NcclConfig {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
}

impl NcclConfig {
    /// What `NCCL_CONFIG_INITIALIZER` makes: every attribute undefined.
    fn initializer() -> NcclConfig {
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_CONFIG_VERSION,
            blocking: NCCL_CONFIG_UNDEF_INT,
            cga_cluster_size: NCCL_CONFIG_UNDEF_INT,
            min_ctas: NCCL_CONFIG_UNDEF_INT,
            max_ctas: NCCL_CONFIG_UNDEF_INT,
            net_name: std::ptr::null(),
        }
    }

    /// The initializer with `blocking = 0`: NCCL's calls on the communicator return at
    /// once (`ncclInProgress`) and `ncclCommGetAsyncError` tells when they are done.
    fn non_blocking() -> NcclConfig {
        NcclConfig {
            blocking: 0,
            ..NcclConfig::initializer()
        }
    }
}

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
    /// `ncclGetUniqueId`, for groups across processes.
    unique_id: Option<unsafe extern "C" fn(*mut UniqueId) -> NcclResult>,
    /// `ncclCommInitRankConfig` (NCCL 2.14), for groups across processes.
    init_rank_config: Option<
        unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int, *mut NcclConfig) -> NcclResult,
    >,
    /// `ncclCommGetAsyncError`: a communicator's state (failed, in progress, or fine).
    async_error: Option<unsafe extern "C" fn(Comm, *mut NcclResult) -> NcclResult>,
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
                // Optional: without them the groups of this process still work.
                unique_id: libs::symbol(lib, "NCCL", "ncclGetUniqueId").ok(),
                init_rank_config: libs::symbol(lib, "NCCL", "ncclCommInitRankConfig").ok(),
                async_error: libs::symbol(lib, "NCCL", "ncclCommGetAsyncError").ok(),
            })
        }
    }
}

/// The oldest NCCL whose ABI this crate calls (`ncclAvg` and bfloat16 came in 2.10).
pub const MIN_NCCL_VERSION: c_int = 21000;

/// The oldest NCCL that makes groups across processes here: non-blocking
/// `ncclCommInitRankConfig` came in 2.14.
pub const MIN_NCCL_ACROSS_VERSION: c_int = 21400;

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

    /// Whether this NCCL makes groups across processes (NCCL 2.14 or newer, with
    /// `ncclGetUniqueId`, `ncclCommInitRankConfig` and `ncclCommGetAsyncError`), or why
    /// not.
    pub fn across(&self) -> std::result::Result<(), String> {
        let missing = [
            ("ncclGetUniqueId", self.api.unique_id.is_none()),
            (
                "ncclCommInitRankConfig",
                self.api.init_rank_config.is_none(),
            ),
            ("ncclCommGetAsyncError", self.api.async_error.is_none()),
        ]
        .into_iter()
        .find(|&(_, absent)| absent);
        let lack = match missing {
            Some((name, _)) => format!("lacks {name}"),
            None if self.version < MIN_NCCL_ACROSS_VERSION => "is older than 2.14".to_string(),
            None => return Ok(()),
        };
        Err(format!(
            "NCCL {} ({}) {lack}: groups across processes need NCCL 2.14 or newer (non-blocking ncclCommInitRankConfig); install NCCL 2.14 or newer (the nvidia-nccl-cu12 or nvidia-nccl-cu13 Python package, or NVIDIA's libnccl2) and point XPU_NCCL_LIBRARY at it, or let the collectives run their own algorithms",
            version_string(self.version),
            self.path
        ))
    }

    /// NCCL's text for a result code.
    fn reason(&self, r: NcclResult) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let text = unsafe { (self.api.error_string)(r) };
        if text.is_null() {
            format!("error {r}")
        } else {
            // SAFETY: as above: a static NUL-terminated string.
            unsafe { std::ffi::CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        }
    }

    /// The error of a failed NCCL call: the call and NCCL's reason.
    fn failure(&self, what: &str, r: NcclResult) -> Error {
        Error::backend_message(
            NAME,
            format!(
                "{what} failed: {} ({r}); set NCCL_DEBUG=WARN for NCCL's details",
                self.reason(r)
            ),
        )
    }

    /// Turns an NCCL result into an error naming the call and NCCL's reason.
    fn check(&self, what: &str, r: NcclResult) -> Result<()> {
        if r == 0 {
            Ok(())
        } else {
            Err(self.failure(what, r))
        }
    }
}

/// NCCL communicators over CUDA devices: this process's ranks of a group that may span
/// processes. `comms[i]` is the communicator of `devices[i]`, at rank `ranks[i]` of the
/// `size` ranks of the whole group; a group of this process alone has the ranks
/// `0..size` here.
pub struct NcclGroup {
    nccl: Arc<Nccl>,
    /// The ranks in every process.
    size: usize,
    comms: Vec<Comm>,
    devices: Vec<Device>,
    /// The rank of each local communicator in the whole group.
    ranks: Vec<usize>,
    /// Whether the communicators block (`ncclCommInitAll`). Non-blocking ones (groups
    /// across processes) may answer `ncclInProgress` while NCCL's thread works.
    blocking: bool,
    /// How long `run` waits for NCCL's thread to launch an operation on a non-blocking
    /// group.
    timeout: Duration,
    /// Set by [`CollectiveGroup::abort`]: the communicators were aborted (which also
    /// frees them), so no call may use them again.
    aborted: Mutex<bool>,
    /// Set by [`CollectiveGroup::abort`] before it takes `aborted`'s lock, so that a
    /// `run` waiting for NCCL's thread aborts at once rather than at its timeout.
    abort_requested: AtomicBool,
}

// SAFETY: NCCL communicators may be used from any thread as long as calls on one
// communicator are not concurrent; `run` takes `&self` but callers serialize operations
// on a group (the collectives' rendezvous enqueues one operation at a time), `run` and
// `abort` exclude each other through `aborted`, and NCCL itself serializes within a
// group call.
unsafe impl Send for NcclGroup {}
// SAFETY: as above.
unsafe impl Sync for NcclGroup {}

impl std::fmt::Debug for NcclGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.devices.iter().map(|d| d.id().to_string()).collect();
        f.debug_struct("NcclGroup")
            .field("devices", &ids)
            .field("ranks", &self.ranks)
            .field("size", &self.size)
            .field("blocking", &self.blocking)
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

/// Whether NCCL can make groups across processes (see [`Nccl::across`]), or why not.
pub fn available_across() -> std::result::Result<(), String> {
    library()?.across()
}

/// A fresh identifier for a group across processes: the [`UNIQUE_ID_BYTES`] bytes of
/// `ncclGetUniqueId`, which every process then passes to [`NcclGroup::across`].
pub fn unique_id() -> Result<Vec<u8>> {
    let nccl = library().map_err(|reason| Error::unavailable("nccl", reason))?;
    nccl.across().map_err(Error::unsupported)?;
    let Some(get) = nccl.api.unique_id else {
        return Err(Error::unsupported(reason_absent("ncclGetUniqueId")));
    };
    let mut id = UniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    // SAFETY: `id` is a writable ncclUniqueId.
    let r = unsafe { get(&mut id) };
    nccl.check("ncclGetUniqueId", r)?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// The ordinals of `devices`: distinct CUDA devices of this process.
fn ordinals(devices: &[Device]) -> Result<Vec<c_int>> {
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
    Ok(ordinals)
}

/// One rank's part of an operation, resolved: its buffers' addresses, its xpu stream,
/// and what the work holds.
struct Native<'a> {
    send: *mut c_void,
    recv: *mut c_void,
    stream: &'a CudaStream,
    held: Vec<Held>,
}

/// The wait of a group of this process until [`NcclGroup::with_timeout`] sets one. Its
/// communicators block, so NCCL never leaves their work in progress and nothing waits
/// on it.
const BLOCKING_TIMEOUT: Duration = Duration::from_secs(600);

/// Why the communicators did not settle.
enum Unsettled {
    /// Local communicator `local` failed with `state` (or the query on it did).
    Failed { local: usize, state: NcclResult },
    /// The deadline passed with work still in progress.
    Late,
    /// [`CollectiveGroup::abort`] was called meanwhile.
    Aborted,
}

/// The deadline `timeout` from now; `None` (no deadline) where it cannot be
/// represented.
fn deadline(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

impl NcclGroup {
    /// Communicators over `devices`: distinct CUDA devices of this process. Fails, with
    /// the reason, when one is not a CUDA device, one appears twice, or NCCL is absent.
    pub fn new(devices: &[Device]) -> Result<NcclGroup> {
        let ordinals = ordinals(devices)?;
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
            size: comms.len(),
            ranks: (0..comms.len()).collect(),
            comms,
            devices: devices.to_vec(),
            blocking: true,
            timeout: BLOCKING_TIMEOUT,
            aborted: Mutex::new(false),
            abort_requested: AtomicBool::new(false),
        })
    }

    /// The group with `timeout` for its waits on NCCL's thread (see [`NcclGroup::run`]).
    pub fn with_timeout(mut self, timeout: Duration) -> NcclGroup {
        self.timeout = timeout;
        self
    }

    /// This process's part of a group across processes: a non-blocking communicator per
    /// device of `devices` (distinct CUDA devices of this process) at the ranks `across`
    /// gives them, over the identifier one process made with [`unique_id`]. Collective:
    /// every process of the group calls it, and it returns once every rank has joined.
    /// Fails with [`Error::Timeout`] when the other processes have not joined within
    /// `config.timeout` (the communicators are aborted then), with NCCL's error when a
    /// join fails, and says why when NCCL is absent or too old.
    pub fn across(
        devices: &[Device],
        across: &GroupAcross,
        config: GroupConfig,
    ) -> Result<NcclGroup> {
        across.check(devices.len())?;
        ordinals(devices)?;
        let nccl = library().map_err(|reason| Error::unavailable("nccl", reason))?;
        nccl.across().map_err(Error::unsupported)?;
        let Some(init) = nccl.api.init_rank_config else {
            return Err(Error::unsupported(reason_absent("ncclCommInitRankConfig")));
        };
        if across.id.len() != UNIQUE_ID_BYTES {
            return Err(Error::invalid(format!(
                "a group identifier of {} bytes; NCCL's are {UNIQUE_ID_BYTES} bytes: pass the bytes group_id made on a CUDA device in one process",
                across.id.len()
            )));
        }
        let mut id = UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        for (to, &from) in id.internal.iter_mut().zip(&across.id) {
            *to = from as c_char;
        }
        let size = c_int::try_from(across.size)
            .map_err(|_| Error::invalid("an NCCL group's size does not fit a C int"))?;
        let ranks = across
            .ranks
            .iter()
            .map(|&r| c_int::try_from(r))
            .collect::<std::result::Result<Vec<c_int>, _>>()
            .map_err(|_| Error::invalid("a rank does not fit a C int"))?;
        let shared = devices
            .iter()
            .map(|d| {
                d.implementation()
                    .as_any()
                    .downcast_ref::<CudaDevice>()
                    .map(|c| c.shared.clone())
                    .ok_or_else(|| {
                        Error::backend_message(
                            NAME,
                            "internal error: a CUDA device of another type",
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let until = deadline(config.timeout);
        // The group owns the communicators from here on: every failure below aborts
        // them through it. NCCL keeps the address of each slot while it joins, and the
        // vector's buffer does not move with the group.
        let mut group = NcclGroup {
            nccl,
            size: across.size,
            comms: vec![std::ptr::null_mut(); devices.len()],
            devices: devices.to_vec(),
            ranks: across.ranks.clone(),
            blocking: false,
            timeout: config.timeout,
            aborted: Mutex::new(false),
            abort_requested: AtomicBool::new(false),
        };
        let nccl = group.nccl.clone();
        // NCCL copies the configuration when it is called; one per rank all the same.
        let mut configs = vec![NcclConfig::non_blocking(); devices.len()];
        // SAFETY: group calls take no arguments; every call between them is this group's.
        let started = unsafe { (nccl.api.group_start)() };
        nccl.check("ncclGroupStart", started)?;
        let mut joined = Ok(());
        for (i, device) in shared.iter().enumerate() {
            // ncclCommInitRankConfig joins with the calling thread's current device.
            if let Err(e) = device.bind() {
                joined = Err(e);
                break;
            }
            let slot: *mut Comm = &mut group.comms[i];
            // SAFETY: `slot` is a communicator slot of the group's vector, which lives
            // (and stays in place) until the communicator is aborted or destroyed;
            // `configs[i]` is an initialised ncclConfig_t; `id` is passed by value.
            let r = unsafe { init(slot, size, id, ranks[i], &mut configs[i]) };
            if r != 0 && r != NCCL_IN_PROGRESS {
                joined = nccl.check("ncclCommInitRankConfig", r);
                break;
            }
        }
        // Always close the group, so NCCL's state on this thread is left usable.
        // SAFETY: closes the group opened above.
        let ended = unsafe { (nccl.api.group_end)() };
        let ended = if ended == NCCL_IN_PROGRESS {
            Ok(())
        } else {
            nccl.check("ncclGroupEnd", ended)
        };
        if let Err(e) = joined.and(ended) {
            group.abort();
            return Err(e);
        }
        if let Some(local) = group.comms.iter().position(|c| c.is_null()) {
            group.abort();
            return Err(Error::backend_message(
                NAME,
                format!(
                    "ncclCommInitRankConfig made no communicator for rank {}; set NCCL_DEBUG=WARN for NCCL's details",
                    group.ranks[local]
                ),
            ));
        }
        match group.settle(until) {
            Ok(()) => {}
            Err(Unsettled::Failed { local, state }) => {
                group.abort();
                return Err(group.nccl.failure(
                    &format!(
                        "joining rank {} of an NCCL group of {} (ncclCommInitRankConfig)",
                        group.ranks[local], group.size
                    ),
                    state,
                ));
            }
            Err(Unsettled::Late | Unsettled::Aborted) => {
                group.abort();
                return Err(Error::Timeout {
                    message: format!(
                        "the other processes did not join the NCCL group of {} ranks (ranks {:?} here) within {:?}; check that every process joined with the same identifier and size and can reach this one (NCCL_SOCKET_IFNAME), or raise the timeout",
                        group.size, group.ranks, config.timeout
                    ),
                });
            }
        }
        // Joins NCCL's thread for the finished joins (NCCL 2.14 to 2.17 keep it until
        // this thread's next group call).
        if let Err(e) = group.reap() {
            group.abort();
            return Err(e);
        }
        Ok(group)
    }

    /// Polls `ncclCommGetAsyncError` on every communicator, every millisecond, until
    /// none is in progress, one has failed, `until` has passed, or an abort was asked.
    /// Returns at once where NCCL lacks the call (its communicators then block).
    fn settle(&self, until: Option<Instant>) -> std::result::Result<(), Unsettled> {
        let Some(get) = self.nccl.api.async_error else {
            return Ok(());
        };
        loop {
            let mut pending = false;
            for (local, &comm) in self.comms.iter().enumerate() {
                let mut state: NcclResult = 0;
                // SAFETY: `comm` is a live communicator of this group (not aborted: the
                // callers hold or own `aborted`); `state` is a valid out-pointer.
                let r = unsafe { get(comm, &mut state) };
                if r != 0 {
                    return Err(Unsettled::Failed { local, state: r });
                }
                match state {
                    0 => {}
                    NCCL_IN_PROGRESS => pending = true,
                    _ => return Err(Unsettled::Failed { local, state }),
                }
            }
            if !pending {
                return Ok(());
            }
            if self.abort_requested.load(Ordering::Acquire) {
                return Err(Unsettled::Aborted);
            }
            if until.is_some_and(|t| Instant::now() >= t) {
                return Err(Unsettled::Late);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// An empty `ncclGroupStart`/`ncclGroupEnd` on this thread: NCCL 2.14 to 2.17 join
    /// the thread of this thread's last non-blocking group there.
    fn reap(&self) -> Result<()> {
        // SAFETY: group calls take no arguments.
        let started = unsafe { (self.nccl.api.group_start)() };
        self.nccl.check("ncclGroupStart", started)?;
        // SAFETY: closes the (empty) group opened above.
        let ended = unsafe { (self.nccl.api.group_end)() };
        self.nccl.check("ncclGroupEnd", ended)
    }

    /// `ncclCommAbort` on every communicator, once; `aborted` is the flag under the
    /// group's lock.
    fn abort_locked(&self, aborted: &mut bool) {
        if *aborted {
            return;
        }
        *aborted = true;
        for &comm in &self.comms {
            if !comm.is_null() {
                // SAFETY: each communicator came from NCCL and is aborted once (the flag
                // above, held across the calls); no call uses it later.
                let _ = unsafe { (self.nccl.api.abort)(comm) };
            }
        }
    }

    /// The global rank of local communicator `local`, for messages.
    fn rank_of(&self, local: usize) -> usize {
        self.ranks.get(local).copied().unwrap_or(local)
    }
}

/// The reason when NCCL lacks an entry point of groups across processes.
fn reason_absent(name: &str) -> String {
    format!(
        "the loaded NCCL lacks {name}: groups across processes need NCCL 2.14 or newer; point XPU_NCCL_LIBRARY at a newer one"
    )
}

impl CollectiveGroup for NcclGroup {
    /// The number of ranks, in every process.
    fn size(&self) -> usize {
        self.size
    }

    /// The number of this process's ranks: the parts [`NcclGroup::run`] takes.
    fn local_size(&self) -> usize {
        self.comms.len()
    }

    fn library(&self) -> String {
        format!("nccl {}", version_string(self.nccl.version))
    }

    /// `ncclCommAbort` on every communicator of this process, once: NCCL's kernels that
    /// wait for peers stop, and the communicators are freed (never destroyed again). A
    /// `run` waiting for NCCL's thread stops waiting and aborts them itself.
    fn abort(&self) {
        self.abort_requested.store(true, Ordering::Release);
        let mut aborted = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        self.abort_locked(&mut aborted);
    }

    /// Enqueues `op` for every rank of this process, `parts[i]` being the stream and
    /// buffers of the `i`-th device the group was made for; roots and all-to-all blocks
    /// are ranks of the whole group. Each rank's stream then counts the work as its own:
    /// its next checkpoint covers it, and the buffers are held until it has run.
    fn run(&self, op: GroupOp, parts: &[GroupPart<'_>]) -> Result<()> {
        if parts.len() != self.comms.len() {
            return Err(Error::invalid(format!(
                "{} parts for an NCCL group with {} ranks in this process ({} in all); give one per device of this process, in the group's order",
                parts.len(),
                self.comms.len(),
                self.size
            )));
        }
        // Held until the operation is enqueued, so that an abort waits for it.
        let mut aborted = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        if *aborted || self.abort_requested.load(Ordering::Acquire) {
            self.abort_locked(&mut aborted);
            return Err(Error::aborted(
                "the NCCL communicators were aborted with the communicator; make a new one",
            ));
        }
        // Never issue onto a communicator NCCL has marked failed.
        match self.settle(deadline(self.timeout)) {
            Ok(()) => {}
            Err(Unsettled::Failed { local, state }) => {
                return Err(Error::backend_message(
                    NAME,
                    format!(
                        "ncclCommGetAsyncError reports the communicator of rank {} failed: {} ({state}); abort the group and make a new one (set NCCL_DEBUG=WARN for NCCL's details)",
                        self.rank_of(local),
                        self.nccl.reason(state)
                    ),
                ));
            }
            Err(Unsettled::Aborted) => {
                self.abort_locked(&mut aborted);
                return Err(Error::aborted(
                    "the NCCL communicators were aborted with the communicator; make a new one",
                ));
            }
            Err(Unsettled::Late) => {
                return Err(Error::Timeout {
                    message: format!(
                        "the NCCL communicators of ranks {:?} were still busy with earlier work after {:?}; abort the group and make a new one",
                        self.ranks, self.timeout
                    ),
                });
            }
        }
        // Resolve everything first, so that a bad argument leaves no group half-issued.
        let mut native = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let device = &self.devices[i];
            if part.stream.device() != device {
                return Err(Error::invalid(format!(
                    "rank {}'s stream is on {}, not {}",
                    self.rank_of(i),
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
        let ended = if ended == NCCL_IN_PROGRESS && !self.blocking {
            // NCCL's thread is launching the work onto the streams: wait for it, so
            // that the accounting below comes after the work on every stream.
            match self.settle(deadline(self.timeout)) {
                Ok(()) => self.reap(),
                Err(Unsettled::Failed { local, state }) => {
                    // NCCL's thread has finished, failing: join it too (its result is
                    // the failure reported here).
                    let _ = self.reap();
                    Err(self.nccl.failure(
                        &format!("ncclGroupEnd (for rank {})", self.rank_of(local)),
                        state,
                    ))
                }
                Err(Unsettled::Aborted) => {
                    self.abort_locked(&mut aborted);
                    Err(Error::aborted(
                        "the NCCL communicators were aborted with the communicator while the operation was being launched; make a new one",
                    ))
                }
                Err(Unsettled::Late) => {
                    // Aborting stops NCCL's thread, so nothing lands on the streams
                    // after they are accounted below.
                    self.abort_locked(&mut aborted);
                    Err(Error::Timeout {
                        message: format!(
                            "NCCL did not launch the operation on ranks {:?} within {:?}: other ranks of the group did not take part; the communicators were aborted, make a new group",
                            self.ranks, self.timeout
                        ),
                    })
                }
            }
        } else {
            self.nccl.check("ncclGroupEnd", ended)
        };
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
    /// A call between `ncclGroupStart` and `ncclGroupEnd`: on a non-blocking
    /// communicator `ncclInProgress` only says the work is queued.
    fn check_queued(&self, what: &str, r: NcclResult) -> Result<()> {
        if r == NCCL_IN_PROGRESS && !self.blocking {
            Ok(())
        } else {
            self.nccl.check(what, r)
        }
    }

    fn issue(&self, op: GroupOp, native: &[Native<'_>]) -> Result<()> {
        let api = &self.nccl.api;
        let rank_int = |r: usize| {
            c_int::try_from(r).map_err(|_| Error::invalid("a rank does not fit a C int"))
        };
        for (i, part) in native.iter().enumerate() {
            let (send, recv) = (part.send, part.recv);
            let stream = part.stream.raw();
            let comm = self.comms[i];
            // SAFETY (every call below): the addresses were resolved from live, in-bounds
            // slices of local rank i's device with the lengths the operation implies
            // (checked by the caller's validation), held until the work has run; the
            // stream is rank i's native stream, and the communicator belongs to this
            // group.
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
                    // Block q of each buffer is global rank q's, in every process.
                    for q in 0..self.size {
                        let peer = rank_int(q)?;
                        let out = (send as *const u8).wrapping_add(q * bytes) as *const c_void;
                        let inp = (recv as *mut u8).wrapping_add(q * bytes) as *mut c_void;
                        // SAFETY: see above; block q of each buffer lies within it.
                        let sent =
                            unsafe { (api.send)(out, bytes, NCCL_UINT8, peer, comm, stream) };
                        self.check_queued("ncclSend", sent)?;
                        // SAFETY: as for the send.
                        let got = unsafe { (api.recv)(inp, bytes, NCCL_UINT8, peer, comm, stream) };
                        self.check_queued("ncclRecv", got)?;
                    }
                    continue;
                }
            };
            self.check_queued(what, result)?;
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
                // SAFETY: each communicator came from NCCL and is destroyed once; errors
                // cannot be returned from a drop and leave nothing to undo.
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

    #[test]
    fn the_config_is_ncclconfig_t_as_nccl_config_initializer_fills_it() {
        let c = NcclConfig::initializer();
        assert_eq!(c.size, std::mem::size_of::<NcclConfig>());
        assert_eq!(c.magic, 0xcafebeef);
        assert_eq!(
            c.version, 21700,
            "NCCL_VERSION(2, 17, 0): ncclConfig_v21700"
        );
        for undefined in [c.blocking, c.cga_cluster_size, c.min_ctas, c.max_ctas] {
            assert_eq!(undefined, i32::MIN, "NCCL_CONFIG_UNDEF_INT");
        }
        assert!(c.net_name.is_null(), "NCCL_CONFIG_UNDEF_PTR");
        let n = NcclConfig::non_blocking();
        assert_eq!(n.blocking, 0);
        assert_eq!(
            (n.size, n.magic, n.version, n.max_ctas),
            (c.size, c.magic, c.version, c.max_ctas)
        );
    }

    #[cfg(target_pointer_width = "64")]
    #[test]
    fn the_config_and_the_id_have_nccl_h_layout() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(offset_of!(NcclConfig, size), 0);
        assert_eq!(offset_of!(NcclConfig, magic), 8);
        assert_eq!(offset_of!(NcclConfig, version), 12);
        assert_eq!(offset_of!(NcclConfig, blocking), 16);
        assert_eq!(offset_of!(NcclConfig, cga_cluster_size), 20);
        assert_eq!(offset_of!(NcclConfig, min_ctas), 24);
        assert_eq!(offset_of!(NcclConfig, max_ctas), 28);
        assert_eq!(offset_of!(NcclConfig, net_name), 32);
        assert_eq!(size_of::<NcclConfig>(), 40);
        assert_eq!(align_of::<NcclConfig>(), 8);
        assert_eq!(size_of::<UniqueId>(), UNIQUE_ID_BYTES);
        assert_eq!(align_of::<UniqueId>(), 1);
    }
}
