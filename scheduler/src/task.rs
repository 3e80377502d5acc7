//! Tasks as the caller describes them.

use std::sync::Arc;

use std::fmt;

use xpu_hal::{Device, Scalar};

use crate::codelet::Codelet;
use crate::data::Handle;
use crate::deps::AccessMode;

/// A submitted task's id, in submission order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub(crate) u64);

impl TaskId {
    /// Its number: 0 for the first task a scheduler took, then 1, 2 …
    pub fn index(self) -> u64 {
        self.0
    }

    /// The id of the `index`-th task (for replaying a recorded order).
    pub fn from_index(index: u64) -> TaskId {
        TaskId(index)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {}", self.0)
    }
}

/// One task: a codelet applied to handles (in order, each with its access) and scalars,
/// optionally pinned to a device and ordered after other tasks.
#[derive(Debug, Clone)]
pub struct Task {
    pub(crate) codelet: Codelet,
    pub(crate) accesses: Vec<(Handle, AccessMode)>,
    pub(crate) scalars: Vec<Scalar>,
    pub(crate) pinned: Option<Device>,
    pub(crate) after: Vec<TaskId>,
    pub(crate) name: Option<String>,
}

impl Task {
    /// A task of `codelet` with no data yet.
    pub fn new(codelet: &Codelet) -> Task {
        Task {
            codelet: codelet.clone(),
            accesses: Vec::new(),
            scalars: Vec::new(),
            pinned: None,
            after: Vec::new(),
            name: None,
        }
    }

    /// Adds `handle` as the next buffer argument, accessed as `mode`.
    pub fn access(mut self, handle: Handle, mode: AccessMode) -> Task {
        self.accesses.push((handle, mode));
        self
    }

    /// Adds `handle`, read.
    pub fn read(self, handle: Handle) -> Task {
        self.access(handle, AccessMode::Read)
    }

    /// Adds `handle`, overwritten entirely (its previous value is not read).
    pub fn write(self, handle: Handle) -> Task {
        self.access(handle, AccessMode::Write)
    }

    /// Adds `handle`, read and written.
    pub fn read_write(self, handle: Handle) -> Task {
        self.access(handle, AccessMode::ReadWrite)
    }

    /// Adds `handle`, updated by a commutative operation (see [`AccessMode::Reduce`]).
    pub fn reduce(self, handle: Handle) -> Task {
        self.access(handle, AccessMode::Reduce)
    }

    /// Adds a scalar argument (after every buffer).
    pub fn scalar(mut self, value: Scalar) -> Task {
        self.scalars.push(value);
        self
    }

    /// Runs the task on `device` only.
    pub fn on(mut self, device: &Device) -> Task {
        self.pinned = Some(device.clone());
        self
    }

    /// Orders the task after `task` as well as after what its data implies.
    pub fn after(mut self, task: TaskId) -> Task {
        self.after.push(task);
        self
    }

    /// Names the task for messages and traces (default: the codelet's name).
    pub fn named(mut self, name: impl Into<String>) -> Task {
        self.name = Some(name.into());
        self
    }

    /// The handles it touches, in order, with how it touches them.
    pub fn accesses(&self) -> &[(Handle, AccessMode)] {
        &self.accesses
    }

    /// The name messages use.
    pub(crate) fn label(&self) -> Arc<str> {
        match &self.name {
            Some(name) => Arc::from(name.as_str()),
            None => self.codelet.shared_name(),
        }
    }
}
