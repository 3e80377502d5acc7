//! MPI as the transport between processes (the `mpi` feature, on by default).
//!
//! [`Mpi`] initialises MPI (or adopts it when the application already did) and
//! finalises it when the last user is gone. Communicators duplicate `MPI_COMM_WORLD`
//! with `MPI_ERRORS_RETURN`, so an error is returned instead of ending the job, and move
//! bytes with non-blocking sends and receives that this process polls against its own
//! deadline, so that a process that stalls or dies is reported instead of waited for
//! forever. Each communicator keeps a receive posted for another process's abort.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mpi::ffi;
use xpu_hal::{Error, Result};

use super::{cores, GiveUp, Incomplete, Peers};

/// The tag of the message that tells the other processes of an abort.
const ABORT_TAG: c_int = (1 << 21) + 7;
/// The tag `MPI_Comm_create_group` uses when the survivors of a failure make their
/// communicator.
const SUBSET_TAG: c_int = (1 << 21) + 9;
/// The longest piece one MPI call moves (its counts are C ints).
const PIECE: usize = 1 << 30;
/// Messages up to this size go in pieces of [`EAGER_PIECE`] bytes: MPI libraries send
/// small messages eagerly (copied through shared memory at once) but larger ones with a
/// rendezvous first, which costs several microseconds (Open MPI's shared-memory transport
/// switches at 4 KiB, its own header included).
const SPLIT_UP_TO: usize = 64 << 10;
/// The piece size below [`SPLIT_UP_TO`]: under 4 KiB with room for MPI's header.
const EAGER_PIECE: usize = 4000;
/// `usize::MAX` in [`MpiPeers::aborted_by`]: no other process has aborted.
const NOBODY: usize = usize::MAX;

/// MPI in this process: initialised by [`Mpi::init`] (or adopted, when the application
/// initialised it), finalised when this handle and every communicator made from it are
/// gone — unless the application initialised it, which then finalises it itself.
#[derive(Clone)]
pub struct Mpi {
    inner: Arc<Inner>,
}

struct Inner {
    /// Present when this library initialised MPI: dropping it finalises MPI.
    universe: Option<mpi::environment::Universe>,
    rank: usize,
    size: usize,
    host: String,
    /// Held around each MPI call when MPI was not initialised for concurrent calls from
    /// several threads.
    serial: Option<Mutex<()>>,
    /// Set once the processes that remain after a failure have gone on without another
    /// (a shrink): it may be dead, and `MPI_Finalize` would wait for it forever.
    lost_peer: AtomicBool,
    /// Polls before a waiting thread yields its core.
    spins: u32,
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi")
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.size)
            .field("host", &self.inner.host)
            .finish()
    }
}

/// The message of an MPI error code.
fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING bytes, as MPI_Error_string requires;
    // `len` is a valid out-pointer.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return format!("MPI error {code}");
    }
    buf.truncate(usize::try_from(len).unwrap_or(0).min(buf.len()));
    String::from_utf8_lossy(&buf).into_owned()
}

fn check(rc: c_int, what: &str) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    Err(Error::backend_message(
        "mpi",
        format!("{what} failed: {}", error_string(rc)),
    ))
}

impl Mpi {
    /// Initialises MPI with `MPI_THREAD_MULTIPLE`, or adopts it when the application (or
    /// an earlier [`Mpi`]) already initialised it, at whatever thread level it chose.
    pub fn init() -> Result<Mpi> {
        if let Some(existing) = ADOPTED.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            if let Some(inner) = existing.upgrade() {
                return Ok(Mpi { inner });
            }
        }
        let (universe, threading) = if mpi::environment::is_initialized() {
            let mut finalized: c_int = 0;
            // SAFETY: a valid out-pointer; MPI_Finalized may be called at any time.
            let rc = unsafe { ffi::MPI_Finalized(&mut finalized) };
            check(rc, "MPI_Finalized")?;
            if finalized != 0 {
                return Err(Error::unavailable(
                    "mpi",
                    "MPI was already finalised in this process; communicators across processes need it running",
                ));
            }
            (None, mpi::environment::threading_support())
        } else {
            match mpi::initialize_with_threading(mpi::Threading::Multiple) {
                Some((u, t)) => (Some(u), t),
                None => {
                    return Err(Error::unavailable(
                        "mpi",
                        "MPI could not be initialised; start the program with mpirun or srun",
                    ))
                }
            }
        };
        let mut rank: c_int = 0;
        let mut size: c_int = 0;
        // SAFETY: MPI is initialised; the out-pointers are valid.
        unsafe {
            check(
                ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut rank),
                "MPI_Comm_rank",
            )?;
            check(
                ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut size),
                "MPI_Comm_size",
            )?;
        }
        let host = mpi::environment::processor_name()
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unknown".to_string());
        let inner = Arc::new(Inner {
            universe,
            lost_peer: AtomicBool::new(false),
            rank: usize::try_from(rank).unwrap_or(0),
            size: usize::try_from(size).unwrap_or(1),
            host,
            serial: (threading < mpi::Threading::Multiple).then(|| Mutex::new(())),
            spins: cores::spins(local_processes() <= cores::online()),
        });
        *ADOPTED.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(&inner));
        Ok(Mpi { inner })
    }

    /// Whether this process was started by an MPI launcher (`mpirun`, `mpiexec`, `srun`
    /// with PMI): what the CLI checks before it forms communicators across processes.
    pub fn launched() -> bool {
        [
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
            "PMIX_RANK",
            "PMI_RANK",
            "MPI_LOCALNRANKS",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    }

    /// This process's rank in `MPI_COMM_WORLD`.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of processes in `MPI_COMM_WORLD`.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The name of the host this process runs on, as MPI reports it.
    pub fn host(&self) -> &str {
        &self.inner.host
    }

    /// A new communicator's transport: a duplicate of `MPI_COMM_WORLD`. Every process
    /// must call it, in the same order; waits at most `timeout` for them.
    pub(crate) fn peers(&self, timeout: Duration) -> Result<MpiPeers> {
        // SAFETY: RSMPI_COMM_NULL is a valid communicator handle value.
        let mut comm = Comm(unsafe { ffi::RSMPI_COMM_NULL });
        // SAFETY: RSMPI_REQUEST_NULL is a valid request handle value.
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        {
            let _serial = self.serial();
            // SAFETY: MPI is initialised (this handle keeps it so); the out-pointers are
            // valid and live until the request completes below.
            let rc = unsafe { ffi::MPI_Comm_idup(ffi::RSMPI_COMM_WORLD, &mut comm.0, &mut req) };
            check(rc, "MPI_Comm_idup")?;
        }
        let deadline = Instant::now() + timeout;
        let mut spins = 0;
        loop {
            let mut flag: c_int = 0;
            {
                let _serial = self.serial();
                // SAFETY: `req` is the pending request started above; STATUS_IGNORE is
                // accepted for the status.
                let rc = unsafe { ffi::MPI_Test(&mut req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                check(rc, "MPI_Comm_idup")?;
            }
            if flag != 0 {
                break;
            }
            if Instant::now() >= deadline {
                // The request and the communicator it fills are left to MPI: `comm`
                // must outlive it, so it is leaked on purpose.
                Box::leak(Box::new(comm));
                return Err(Error::Timeout {
                    message: format!(
                        "not every process made the communicator within {:.1} s (MPI_Comm_idup on {} processes); every process must make it, in the same order",
                        timeout.as_secs_f64(),
                        self.size()
                    ),
                });
            }
            pause(&mut spins, self.spins());
        }
        MpiPeers::on(self.clone(), comm)
    }

    fn spins(&self) -> u32 {
        self.inner.spins
    }

    fn serial(&self) -> Option<MutexGuard<'_, ()>> {
        self.inner
            .serial
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The number of this job's processes on this node, as the launcher tells it (Open
/// MPI, MPICH and Slurm); 1 when none does.
fn local_processes() -> usize {
    [
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "SLURM_NTASKS_PER_NODE",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
    .unwrap_or(1)
}

/// The [`Mpi`] every later [`Mpi::init`] in this process shares while it lives.
static ADOPTED: Mutex<Option<std::sync::Weak<Inner>>> = Mutex::new(None);

/// Waits a little: spins `budget` polls first, then gives the core away at each poll,
/// so that a waiting process does not keep a core from the process it waits for when
/// processes outnumber the cores.
fn pause(spins: &mut u32, budget: u32) {
    if *spins < budget {
        *spins += 1;
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// An MPI communicator handle.
struct Comm(ffi::MPI_Comm);

// SAFETY: an MPI communicator handle names process-wide MPI state that any thread may
// use: MPI was initialised for concurrent calls, or every call here is serialised by
// `Inner::serial`.
unsafe impl Send for Comm {}
// SAFETY: as above; the handle itself is never changed after creation.
unsafe impl Sync for Comm {}

/// Requests in flight: each with its peer and the bytes a receive expects
/// (`usize::MAX` for sends).
type Pending = Vec<(Request, usize, usize)>;

/// Point-to-point sends in flight, each with the bytes it sends.
type Outgoing = Vec<(Pending, Vec<u8>)>;

/// A pending MPI request.
struct Request(ffi::MPI_Request);

// SAFETY: as for `Comm`: a request handle may be tested from any thread under the same
// rules, and only one thread holds each (behind a mutex or on its stack).
unsafe impl Send for Request {}

/// Memory only MPI writes: where an abort message lands.
struct Slot(std::cell::UnsafeCell<u64>);

// SAFETY: no Rust code reads or writes the slot; MPI writes it once, on its own.
unsafe impl Sync for Slot {}

impl Drop for Inner {
    fn drop(&mut self) {
        // Once the processes went on without one that may have died, finalising would
        // wait for it (Open MPI's finalisation meets every process): MPI is left to
        // the process's exit.
        if self.lost_peer.load(Ordering::Relaxed) {
            if let Some(universe) = self.universe.take() {
                std::mem::forget(universe);
            }
        }
    }
}

/// One communicator's transport over MPI.
pub(crate) struct MpiPeers {
    mpi: Mpi,
    comm: Comm,
    /// This process's rank in `comm`, and its size.
    index: usize,
    count: usize,
    /// Where another process's abort message lands; boxed so that its address stays
    /// fixed while the receive is posted.
    abort_slot: Box<Slot>,
    abort_req: Mutex<Option<Request>>,
    aborted_by: AtomicUsize,
    /// The reason code the aborting process sent.
    abort_why: std::sync::atomic::AtomicU64,
    /// Point-to-point sends still in flight, with the bytes they send.
    outgoing: Mutex<Outgoing>,
    /// Polls before a waiting thread yields its core: MPI's guess until the
    /// communicator using it knows whether its processes fit ([`Peers::set_fitting`]).
    spins: AtomicU32,
}

impl MpiPeers {
    /// The transport over `comm`, a communicator just made for it: errors returned
    /// rather than fatal, and the receive of other processes' aborts posted.
    fn on(mpi: Mpi, comm: Comm) -> Result<MpiPeers> {
        let (mut index, mut count): (c_int, c_int) = (0, 0);
        {
            let _serial = mpi.serial();
            // SAFETY: `comm` is a communicator MPI made; the out-pointers are valid.
            unsafe {
                check(
                    ffi::MPI_Comm_set_errhandler(comm.0, ffi::RSMPI_ERRORS_RETURN),
                    "MPI_Comm_set_errhandler",
                )?;
                check(ffi::MPI_Comm_rank(comm.0, &mut index), "MPI_Comm_rank")?;
                check(ffi::MPI_Comm_size(comm.0, &mut count), "MPI_Comm_size")?;
            }
        }
        let spins = AtomicU32::new(mpi.spins());
        let peers = MpiPeers {
            mpi,
            comm,
            index: usize::try_from(index).unwrap_or(0),
            count: usize::try_from(count).unwrap_or(1),
            abort_slot: Box::new(Slot(std::cell::UnsafeCell::new(0))),
            abort_req: Mutex::new(None),
            aborted_by: AtomicUsize::new(NOBODY),
            abort_why: std::sync::atomic::AtomicU64::new(0),
            spins,
            outgoing: Mutex::new(Vec::new()),
        };
        peers.post_abort_receive()?;
        Ok(peers)
    }

    fn post_abort_receive(&self) -> Result<()> {
        // SAFETY: RSMPI_REQUEST_NULL is a valid request handle value.
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        let _serial = self.mpi.serial();
        // SAFETY: the slot is 8 bytes owned by `self` (boxed, never moved) and outlives
        // the request: `Drop` cancels and completes it first.
        let rc = unsafe {
            ffi::MPI_Irecv(
                self.abort_slot.0.get().cast(),
                8,
                ffi::RSMPI_UINT8_T,
                ffi::RSMPI_ANY_SOURCE,
                ABORT_TAG,
                self.comm.0,
                &mut req,
            )
        };
        check(rc, "MPI_Irecv")?;
        *self.abort_req.lock().unwrap_or_else(|p| p.into_inner()) = Some(Request(req));
        Ok(())
    }

    /// Which process gave up on the communicator, and why, if one did.
    fn aborted_by(&self) -> Option<(usize, GiveUp)> {
        let why = || GiveUp::from_code(self.abort_why.load(Ordering::Acquire));
        let by = self.aborted_by.load(Ordering::Acquire);
        if by != NOBODY {
            return Some((by, why()));
        }
        let mut guard = self.abort_req.lock().unwrap_or_else(|p| p.into_inner());
        let req = guard.as_mut()?;
        let mut flag: c_int = 0;
        // SAFETY: an all-zero status is a valid value for MPI to overwrite.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        let rc = {
            let _serial = self.mpi.serial();
            // SAFETY: the posted abort receive; `status` is a valid out-pointer.
            unsafe { ffi::MPI_Test(&mut req.0, &mut flag, &mut status) }
        };
        if rc != 0 || flag == 0 {
            return None;
        }
        *guard = None;
        // SAFETY: the receive has completed: MPI no longer writes the slot.
        let code = unsafe { *self.abort_slot.0.get() };
        self.abort_why.store(code, Ordering::Release);
        let by = usize::try_from(status.MPI_SOURCE).unwrap_or(0);
        self.aborted_by.store(by, Ordering::Release);
        Some((by, why()))
    }

    /// Starts sending (or receiving) `len` bytes at `ptr` to (from) process `peer`, in
    /// pieces, adding the requests to `pending`.
    ///
    /// # Safety
    ///
    /// `ptr` must be valid for `len` bytes until every request added completes or is
    /// released, and forever if that cannot be known.
    unsafe fn start(
        &self,
        tag: u32,
        peer: usize,
        ptr: *mut u8,
        len: usize,
        send: bool,
        pending: &mut Pending,
    ) -> std::result::Result<(), Incomplete> {
        let tag = c_int::try_from(tag).unwrap_or(0);
        let piece = if len <= SPLIT_UP_TO {
            EAGER_PIECE
        } else {
            PIECE
        };
        let mut at = 0;
        loop {
            let k = (len - at).min(piece);
            // SAFETY: RSMPI_REQUEST_NULL is a valid request handle value.
            let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
            // SAFETY: `ptr + at` is valid for `k` bytes (a piece of the caller's range)
            // for as long as this function's contract says; the count fits a C int.
            let rc = unsafe {
                let buf = ptr.add(at).cast::<c_void>();
                let (count, dest) = (k as c_int, peer as c_int);
                if send {
                    ffi::MPI_Isend(
                        buf,
                        count,
                        ffi::RSMPI_UINT8_T,
                        dest,
                        tag,
                        self.comm.0,
                        &mut req,
                    )
                } else {
                    ffi::MPI_Irecv(
                        buf,
                        count,
                        ffi::RSMPI_UINT8_T,
                        dest,
                        tag,
                        self.comm.0,
                        &mut req,
                    )
                }
            };
            if rc != 0 {
                return Err(Incomplete::Failed {
                    peer,
                    message: error_string(rc),
                    settled: false,
                });
            }
            pending.push((Request(req), peer, if send { usize::MAX } else { k }));
            at += k;
            if at >= len {
                return Ok(());
            }
        }
    }

    /// Releases the buffers of posted sends that have completed.
    fn reap(&self, outgoing: &mut Outgoing) {
        let _serial = self.mpi.serial();
        outgoing.retain_mut(|(requests, _)| {
            requests.retain_mut(|(req, _, _)| {
                let mut flag: c_int = 0;
                // SAFETY: a pending send request of this communicator.
                let rc = unsafe { ffi::MPI_Test(&mut req.0, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                rc == 0 && flag == 0
            });
            !requests.is_empty()
        });
    }

    /// Cancels and releases pending requests (their buffers stay the caller's to leak).
    fn cancel(&self, pending: &mut [(Request, usize, usize)]) {
        let _serial = self.mpi.serial();
        for (req, _, _) in pending.iter_mut() {
            // SAFETY: each is a pending request of this communicator; freeing a
            // cancelled request is allowed, and MPI completes or drops it on its own.
            unsafe {
                ffi::MPI_Cancel(&mut req.0);
                ffi::MPI_Request_free(&mut req.0);
            }
        }
    }
}

impl Drop for MpiPeers {
    fn drop(&mut self) {
        // Sends still in flight get a moment to finish; the bytes of any that do not
        // are leaked, never freed under MPI.
        let mut outgoing =
            std::mem::take(self.outgoing.get_mut().unwrap_or_else(|p| p.into_inner()));
        let until = Instant::now() + Duration::from_secs(1);
        let mut spins = 0;
        while !outgoing.is_empty() && Instant::now() < until {
            self.reap(&mut outgoing);
            pause(&mut spins, self.spins.load(Ordering::Relaxed));
        }
        std::mem::forget(outgoing);
        let req = self
            .abort_req
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut req) = req {
            let _serial = self.mpi.serial();
            // SAFETY: the pending abort receive: cancelled, then waited for (a
            // cancelled receive completes at once), so the slot is no longer MPI's when
            // it is freed with `self`.
            unsafe {
                ffi::MPI_Cancel(&mut req.0);
                ffi::MPI_Wait(&mut req.0, ffi::RSMPI_STATUS_IGNORE);
            }
        }
    }
}

impl Peers for MpiPeers {
    fn index(&self) -> usize {
        self.index
    }

    fn count(&self) -> usize {
        self.count
    }

    unsafe fn exchange(
        &self,
        tag: u32,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
        deadline: Instant,
        abort: &AtomicBool,
    ) -> std::result::Result<(), Incomplete> {
        // A process that gave up on an earlier operation has aborted: its messages for
        // this one may already be here, but the communicator is failed.
        if let Some((by, why)) = self.aborted_by() {
            return Err(Incomplete::Aborted { by, why });
        }
        // (request, peer, bytes expected for receives or usize::MAX for sends)
        let mut pending: Pending = Vec::new();
        let mut failure: Option<Incomplete> = None;
        {
            let _serial = self.mpi.serial();
            let mut post = |peer: usize, ptr: *mut u8, len: usize, send: bool| {
                // SAFETY: the caller's slices, valid for `len` bytes until the requests
                // complete or, on an error, forever (this function's contract).
                unsafe { self.start(tag, peer, ptr, len, send, &mut pending) }
            };
            for (peer, data) in sends {
                if let Err(e) = post(*peer, data.as_ptr().cast_mut(), data.len(), true) {
                    failure = Some(e);
                    break;
                }
            }
            if failure.is_none() {
                for (peer, data) in recvs.iter_mut() {
                    if let Err(e) = post(*peer, data.as_mut_ptr(), data.len(), false) {
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        if let Some(e) = failure {
            self.cancel(&mut pending);
            return Err(e);
        }
        let mut spins = 0;
        while !pending.is_empty() {
            let mut i = 0;
            while i < pending.len() {
                let (req, peer, expected) = &mut pending[i];
                let mut flag: c_int = 0;
                // SAFETY: an all-zero status is a valid value for MPI to overwrite.
                let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
                let rc = {
                    let _serial = self.mpi.serial();
                    // SAFETY: a pending request posted above; valid out-pointers.
                    unsafe { ffi::MPI_Test(&mut req.0, &mut flag, &mut status) }
                };
                if rc != 0 {
                    failure.get_or_insert(Incomplete::Failed {
                        peer: *peer,
                        message: error_string(if status.MPI_ERROR != 0 {
                            status.MPI_ERROR
                        } else {
                            rc
                        }),
                        settled: true,
                    });
                    pending.swap_remove(i);
                    continue;
                }
                if flag == 0 {
                    i += 1;
                    continue;
                }
                if *expected != usize::MAX {
                    let mut count: c_int = 0;
                    // SAFETY: `status` is the completed receive's status.
                    unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
                    if usize::try_from(count).ok() != Some(*expected) {
                        failure.get_or_insert(Incomplete::Failed {
                            peer: *peer,
                            message: format!("received {count} bytes where {expected} were due"),
                            settled: true,
                        });
                    }
                }
                pending.swap_remove(i);
            }
            if pending.is_empty() {
                break;
            }
            let stop = if abort.load(Ordering::Acquire) {
                Some(Incomplete::AbortedHere)
            } else if let Some((by, why)) = self.aborted_by() {
                Some(Incomplete::Aborted { by, why })
            } else if Instant::now() >= deadline {
                let mut peers: Vec<usize> = pending.iter().map(|p| p.1).collect();
                peers.sort_unstable();
                peers.dedup();
                Some(Incomplete::Deadline { peers })
            } else {
                None
            };
            if let Some(stop) = stop {
                self.cancel(&mut pending);
                return Err(stop);
            }
            pause(&mut spins, self.spins.load(Ordering::Relaxed));
        }
        match failure {
            Some(e) => Err(e),
            None => match self.aborted_by() {
                Some((by, why)) => Err(Incomplete::Aborted { by, why }),
                None => Ok(()),
            },
        }
    }

    fn post(
        &self,
        tag: u32,
        peer: usize,
        mut data: Vec<u8>,
    ) -> std::result::Result<(), Incomplete> {
        if let Some((by, why)) = self.aborted_by() {
            return Err(Incomplete::Aborted { by, why });
        }
        let mut outgoing = self.outgoing.lock().unwrap_or_else(|p| p.into_inner());
        self.reap(&mut outgoing);
        let mut requests = Vec::new();
        let started = {
            let _serial = self.mpi.serial();
            // SAFETY: the bytes move into `outgoing` below with their requests, and are
            // released only once those complete (or leaked).
            unsafe {
                self.start(
                    tag,
                    peer,
                    data.as_mut_ptr(),
                    data.len(),
                    true,
                    &mut requests,
                )
            }
        };
        outgoing.push((requests, data));
        started
    }

    fn receive(
        &self,
        tag: u32,
        peer: usize,
        data: &mut Vec<u8>,
        deadline: Instant,
        abort: &AtomicBool,
    ) -> std::result::Result<(), Incomplete> {
        // SAFETY: on an error the buffer is leaked here, never freed or reused.
        let done =
            unsafe { self.exchange(tag, &[], &mut [(peer, &mut data[..])], deadline, abort) };
        if done.is_err() {
            std::mem::forget(std::mem::take(data));
        }
        done
    }

    fn set_fitting(&self, fitting: bool) {
        self.spins.store(cores::spins(fitting), Ordering::Relaxed);
    }

    fn abort_others(&self, why: GiveUp) {
        // One static message per reason, valid for as long as MPI may read it.
        static CODES: [u64; 6] = [0, 1, 2, 3, 4, 5];
        let signal = &CODES[why as usize];
        let _serial = self.mpi.serial();
        for p in (0..self.count()).filter(|&p| p != self.index()) {
            // SAFETY: RSMPI_REQUEST_NULL is a valid request handle value.
            let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
            // SAFETY: the message is a static 8 bytes, valid for as long as MPI may read
            // it; the request is released at once (a fire-and-forget send).
            unsafe {
                let rc = ffi::MPI_Isend(
                    std::ptr::from_ref(signal).cast(),
                    8,
                    ffi::RSMPI_UINT8_T,
                    p as c_int,
                    ABORT_TAG,
                    self.comm.0,
                    &mut req,
                );
                if rc == 0 {
                    ffi::MPI_Request_free(&mut req);
                }
            }
        }
    }

    fn swap_after_failure(
        &self,
        tag: u32,
        mine: &[u8],
        with: &[usize],
        deadline: Instant,
        arrived: &mut dyn FnMut(usize, &[u8]) -> Vec<usize>,
    ) -> Vec<Option<Vec<u8>>> {
        // Only ever called after a failure, to go on without the processes that do not
        // answer: one may be dead.
        self.mpi.inner.lost_peer.store(true, Ordering::Relaxed);
        let mut got: Vec<Option<Vec<u8>>> = vec![None; with.len()];
        let mut outgoing = self.outgoing.lock().unwrap_or_else(|p| p.into_inner());
        self.reap(&mut outgoing);
        // Receives: (index into `with`, request, buffer).
        let mut pending: Vec<(usize, Pending, Vec<u8>)> = Vec::new();
        {
            let _serial = self.mpi.serial();
            for (i, &q) in with.iter().enumerate() {
                let mut data = mine.to_vec();
                let mut requests = Vec::new();
                // SAFETY: the bytes move into `outgoing` with their requests and are
                // released only once those complete (or leaked).
                let sent = unsafe {
                    self.start(tag, q, data.as_mut_ptr(), data.len(), true, &mut requests)
                };
                outgoing.push((requests, data));
                if sent.is_err() {
                    continue;
                }
                let mut buf = vec![0u8; mine.len()];
                let mut requests = Vec::new();
                // SAFETY: `buf` moves into `pending` (its heap bytes do not move) and is
                // leaked if its receive never completes.
                let posted = unsafe {
                    self.start(tag, q, buf.as_mut_ptr(), buf.len(), false, &mut requests)
                };
                if posted.is_ok() {
                    pending.push((i, requests, buf));
                } else {
                    self.cancel(&mut requests);
                    std::mem::forget(buf);
                }
            }
        }
        drop(outgoing);
        let mut spins = 0;
        let mut dropped: Vec<usize> = Vec::new();
        while !pending.is_empty() && Instant::now() < deadline {
            pending.retain_mut(|(i, requests, buf)| {
                requests.retain_mut(|(req, _, _)| {
                    let mut flag: c_int = 0;
                    let _serial = self.mpi.serial();
                    // SAFETY: a pending receive of this communicator.
                    let rc =
                        unsafe { ffi::MPI_Test(&mut req.0, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                    rc == 0 && flag == 0
                });
                if requests.is_empty() {
                    let bytes = std::mem::take(buf);
                    dropped.extend(arrived(with[*i], &bytes));
                    got[*i] = Some(bytes);
                    return false;
                }
                true
            });
            // Receives no longer waited for: cancelled, their buffers left to MPI.
            pending.retain_mut(|(i, requests, buf)| {
                if !dropped.contains(&with[*i]) {
                    return true;
                }
                self.cancel(requests);
                std::mem::forget(std::mem::take(buf));
                false
            });
            if !pending.is_empty() {
                pause(&mut spins, self.spins.load(Ordering::Relaxed));
            }
        }
        for (_, mut requests, buf) in pending {
            // Never completed: MPI may still write the buffer.
            self.cancel(&mut requests);
            std::mem::forget(buf);
        }
        got
    }

    fn subset(&self, keep: &[usize]) -> Result<Box<dyn Peers>> {
        let ranks: Vec<c_int> = keep
            .iter()
            .map(|&q| c_int::try_from(q).unwrap_or(c_int::MAX))
            .collect();
        let count = c_int::try_from(ranks.len()).unwrap_or(c_int::MAX);
        // SAFETY: RSMPI_COMM_NULL is a valid communicator handle value.
        let mut comm = Comm(unsafe { ffi::RSMPI_COMM_NULL });
        {
            let _serial = self.mpi.serial();
            // SAFETY: the groups are made from this live communicator and freed here;
            // `ranks` holds `count` ranks of it; the out-pointers are valid. Only the
            // processes of the group take part, so dead ones do not hold it up.
            unsafe {
                let mut all: ffi::MPI_Group = std::mem::zeroed();
                check(ffi::MPI_Comm_group(self.comm.0, &mut all), "MPI_Comm_group")?;
                let mut group: ffi::MPI_Group = std::mem::zeroed();
                let rc = ffi::MPI_Group_incl(all, count, ranks.as_ptr(), &mut group);
                ffi::MPI_Group_free(&mut all);
                check(rc, "MPI_Group_incl")?;
                let rc = ffi::MPI_Comm_create_group(self.comm.0, group, SUBSET_TAG, &mut comm.0);
                ffi::MPI_Group_free(&mut group);
                check(rc, "MPI_Comm_create_group")?;
            }
        }
        Ok(Box::new(MpiPeers::on(self.mpi.clone(), comm)?))
    }
}
