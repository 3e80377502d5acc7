//! Data handles and their replicas.
//!
//! A [`Handle`] is a logical buffer the scheduler owns: registered from host memory
//! ([`crate::Scheduler::register`]) or created by it ([`crate::Scheduler::create`]). It
//! has a home in host memory and at most one replica per device. Replicas follow the
//! MSI protocol: a task that writes the handle on a device makes that replica the only
//! valid copy (modified); a task that reads it where the replica is invalid first gets a
//! copy from the cheapest valid one (shared); the home in host memory is one more
//! replica, valid or not like the others. Every replica remembers the point on a stream
//! after which its content is ready, so that a reader or a copy elsewhere waits for
//! exactly that.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use xpu_hal::{Allocation, HostBuffer};

use crate::deps::HandleDeps;
use crate::stream::Point;

static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// A logical buffer the scheduler owns (see the module docs). Cheap to copy; it stays
/// valid until [`crate::Scheduler::unregister`], after which using it is an error.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle {
    pub(crate) id: u64,
    pub(crate) len: u64,
}

impl Handle {
    pub(crate) fn fresh(len: u64) -> Handle {
        Handle {
            id: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
            len,
        }
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A process-unique id, for messages and traces.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "handle {} ({} bytes)", self.id, self.len)
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "handle {}", self.id)
    }
}

/// A device's copy of a handle.
pub(crate) struct Replica {
    pub(crate) memory: Allocation,
    pub(crate) valid: bool,
    /// After this point the content is the handle's current value (when valid).
    pub(crate) ready: Option<Point>,
    /// When a task last used it (the scheduler's clock), for eviction.
    pub(crate) last_use: u64,
    /// Which allocation this is (a replica evicted and made again is another one).
    pub(crate) generation: u64,
}

/// The home copy in host memory.
pub(crate) struct Home {
    pub(crate) buffer: HostBuffer,
    pub(crate) valid: bool,
    pub(crate) ready: Option<Point>,
}

/// Where a copy of a handle lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Its home in host memory.
    Home,
    /// A device's replica.
    Device(usize),
}

/// What an operation in the journal did to the handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Copied the value into a place.
    Copy(Place),
    /// A task wrote it on a device.
    Write,
}

/// The validity of one copy: valid, ready after, and (for replicas) which allocation.
type CopyState = (bool, Option<Point>, u64);

/// A handle's state before one operation (see [`HandleState::repair`]).
struct Entry {
    point: Point,
    change: Change,
    home: (bool, Option<Point>),
    replicas: Vec<Option<CopyState>>,
}

/// Everything the scheduler knows about one handle.
pub(crate) struct HandleState {
    pub(crate) handle: Handle,
    pub(crate) deps: HandleDeps<u64>,
    pub(crate) home: Home,
    /// Per device of the scheduler.
    pub(crate) replicas: Vec<Option<Replica>>,
    /// The state before each operation not yet known to have run, oldest first.
    journal: Vec<Entry>,
    /// Recent writes by task id (see [`HandleState::value_lost`]).
    writes: BTreeMap<u64, Write>,
    /// How many of `writes` are failures: with none, every value is there.
    failed_writes: usize,
    /// Why the handle has no value since its only copy went with a lost device (until a
    /// task overwrites it).
    pub(crate) gone: Option<String>,
    /// When its last writer is expected to finish (seconds since the scheduler's
    /// epoch, predicted), for placement.
    pub(crate) written_by: f64,
}

/// What a task's write did to a handle's value.
#[derive(Debug, Clone)]
enum Write {
    /// Replaced it.
    Overwrote,
    /// Changed it from what it was (read-write, reduction).
    Added,
    /// Failed, with the failure it comes from: the handle has no value after it.
    Failed(String),
}

/// Writes remembered per handle; older ones are long decided.
const WRITES_KEPT: usize = 64;

impl HandleState {
    pub(crate) fn new(handle: Handle, home: HostBuffer, devices: usize) -> HandleState {
        HandleState {
            handle,
            deps: HandleDeps::default(),
            home: Home {
                buffer: home,
                valid: true,
                ready: None,
            },
            replicas: (0..devices).map(|_| None).collect(),
            journal: Vec::new(),
            writes: BTreeMap::new(),
            failed_writes: 0,
            gone: None,
            written_by: 0.0,
        }
    }

    /// Notes the state before an operation at `point` that makes `change`; forgets the
    /// entries of operations known to have run (`completed` says whether a point has).
    pub(crate) fn journal(
        &mut self,
        point: Point,
        change: Change,
        completed: impl Fn(Point) -> bool,
    ) {
        let done = self
            .journal
            .iter()
            .take_while(|e| completed(e.point))
            .count();
        // The new entry reuses the list of a forgotten one (no allocation per write
        // once the journal turns over).
        let mut replicas = self
            .journal
            .drain(..done)
            .next_back()
            .map(|e| e.replicas)
            .unwrap_or_default();
        replicas.clear();
        replicas.extend(
            self.replicas
                .iter()
                .map(|r| r.as_ref().map(|r| (r.valid, r.ready, r.generation))),
        );
        self.journal.push(Entry {
            point,
            change,
            home: (self.home.valid, self.home.ready),
            replicas,
        });
    }

    /// After a failure: `failed(p)` says whether the operation at `p` failed or was
    /// skipped. Rolls the handle back to its state before the first such operation in
    /// its journal, then applies again the copies after it that did run (a copy that
    /// ran copied a value that was current then, since anything that changed the
    /// value waited for it). Replicas freed or made anew since keep no old validity.
    pub(crate) fn repair(&mut self, failed: impl Fn(Point) -> bool) {
        let journal = std::mem::take(&mut self.journal);
        let Some(k) = journal.iter().position(|e| failed(e.point)) else {
            return;
        };
        let before = &journal[k];
        self.home.valid = before.home.0;
        self.home.ready = before.home.1;
        for (i, r) in self.replicas.iter_mut().enumerate() {
            let Some(r) = r else { continue };
            match before.replicas.get(i).copied().flatten() {
                Some((valid, ready, generation)) if generation == r.generation => {
                    r.valid = valid;
                    r.ready = ready;
                }
                _ => r.valid = false,
            }
        }
        for e in &journal[k + 1..] {
            if failed(e.point) {
                continue;
            }
            match e.change {
                Change::Copy(Place::Home) => {
                    self.home.valid = true;
                    self.home.ready = Some(e.point);
                }
                Change::Copy(Place::Device(d)) => {
                    let generation = e.replicas.get(d).copied().flatten().map(|c| c.2);
                    if let Some(Some(r)) = self.replicas.get_mut(d) {
                        if generation.is_none_or(|g| g == r.generation) {
                            r.valid = true;
                            r.ready = Some(e.point);
                        }
                    }
                }
                // A write waits for every earlier use of the handle, so one that ran
                // cannot follow one that did not.
                Change::Write => {}
            }
        }
    }

    /// Why the value a task with id `reader` reads has none (`u64::MAX`: the current
    /// value): the copy went with a lost device, or the last write before `reader` that
    /// replaced it was followed by a failed one. Tasks may be dispatched out of
    /// submission order (after a failure, some run again), so this goes by task ids,
    /// not by the order writes happened in.
    pub(crate) fn value_lost(&self, reader: u64) -> Option<&str> {
        if let Some(g) = &self.gone {
            return Some(g);
        }
        if self.failed_writes == 0 {
            return None;
        }
        for (_, w) in self.writes.range(..reader).rev() {
            match w {
                Write::Failed(root) => return Some(root),
                Write::Overwrote => return None,
                Write::Added => {}
            }
        }
        None
    }

    /// Notes that task `by` failed: what it writes has no value because of `root`.
    pub(crate) fn failed_write(&mut self, by: u64, root: String) {
        self.note(by, Write::Failed(root));
    }

    fn note(&mut self, by: u64, w: Write) {
        let failed = |w: &Write| usize::from(matches!(w, Write::Failed(_)));
        self.failed_writes += failed(&w);
        if let Some(old) = self.writes.insert(by, w) {
            self.failed_writes -= failed(&old);
        }
        while self.writes.len() > WRITES_KEPT {
            if let Some((_, old)) = self.writes.pop_first() {
                self.failed_writes -= failed(&old);
            }
        }
    }

    /// Drops device `d`'s replica (its device was lost); says whether that left the
    /// handle without a valid copy.
    pub(crate) fn drop_replica(&mut self, d: usize) -> bool {
        let had = self.replicas[d].take().is_some_and(|r| r.valid);
        had && !self.home.valid && self.valid_on().next().is_none()
    }

    /// Marks device `d`'s replica as the only valid copy, ready after `point`, written by
    /// task `by`, which `overwrite`s the whole value or (read-write, reduction) changes
    /// it.
    pub(crate) fn written(&mut self, d: usize, point: Point, overwrite: bool, by: u64) {
        for (i, r) in self.replicas.iter_mut().enumerate() {
            if let Some(r) = r {
                r.valid = i == d;
                if i == d {
                    r.ready = Some(point);
                }
            }
        }
        self.home.valid = false;
        if overwrite {
            self.gone = None;
        }
        self.note(
            by,
            if overwrite {
                Write::Overwrote
            } else {
                Write::Added
            },
        );
    }

    /// Devices holding a valid replica.
    pub(crate) fn valid_on(&self) -> impl Iterator<Item = usize> + '_ {
        self.replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.as_ref().is_some_and(|r| r.valid))
            .map(|(i, _)| i)
    }
}
