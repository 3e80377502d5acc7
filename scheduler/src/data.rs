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
}

/// The home copy in host memory.
pub(crate) struct Home {
    pub(crate) buffer: HostBuffer,
    pub(crate) valid: bool,
    pub(crate) ready: Option<Point>,
}

/// Everything the scheduler knows about one handle.
pub(crate) struct HandleState {
    pub(crate) handle: Handle,
    pub(crate) deps: HandleDeps<u64>,
    pub(crate) home: Home,
    /// Per device of the scheduler.
    pub(crate) replicas: Vec<Option<Replica>>,
}

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
        }
    }

    /// Marks device `d`'s replica (or the home, for `None`) as the only valid copy,
    /// ready after `point`.
    pub(crate) fn written(&mut self, d: usize, point: Point) {
        for (i, r) in self.replicas.iter_mut().enumerate() {
            if let Some(r) = r {
                r.valid = i == d;
                if i == d {
                    r.ready = Some(point);
                }
            }
        }
        self.home.valid = false;
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
