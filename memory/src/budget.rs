//! A reservation limit shared by several allocators.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

struct Member {
    id: u64,
    name: String,
    held: Arc<AtomicU64>,
}

struct Inner {
    name: String,
    limit: u64,
    reserved: AtomicU64,
    next_member: AtomicU64,
    members: Mutex<Vec<Member>>,
}

/// One limit on the bytes several allocators may reserve together: all the host devices of
/// a process, say, or a GPU and the pinned host memory that stages its copies.
///
/// A `Budget` is a cheap handle (clone it to share). Give it to each allocator that should
/// draw from it ([`crate::CachingAllocator::with_budget`],
/// [`crate::DeviceAllocator::with_budget`]). Every segment an allocator obtains, and every
/// growth of an expandable segment, is first taken from the budget; releasing a segment or
/// shrinking one gives the bytes back, and so does dropping the allocator. A request that
/// would take the budget past its limit fails like a full device: the allocator releases its
/// own cache and retries, and if that is not enough the out-of-memory report names the
/// budget, its use and the allocators sharing it.
#[derive(Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

/// One allocator's share of a [`Budget`], as the out-of-memory report lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetShare {
    /// The allocator's name (a device id for a [`crate::DeviceAllocator`]).
    pub name: String,
    /// Bytes it has reserved from the budget.
    pub reserved: u64,
}

/// A [`Budget`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetReport {
    /// The budget's name.
    pub name: String,
    /// Its limit in bytes.
    pub limit: u64,
    /// Bytes reserved from it by all its allocators.
    pub reserved: u64,
    /// Each allocator drawing from it.
    pub shares: Vec<BudgetShare>,
}

impl fmt::Display for BudgetReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "budget `{}`: {} of {} bytes reserved",
            self.name, self.reserved, self.limit
        )?;
        if !self.shares.is_empty() {
            let shares: Vec<String> = self
                .shares
                .iter()
                .map(|s| format!("{} {}", s.name, s.reserved))
                .collect();
            write!(f, " (shared by {})", shares.join(", "))?;
        }
        Ok(())
    }
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("name", &self.inner.name)
            .field("limit", &self.inner.limit)
            .field("reserved", &self.reserved())
            .finish()
    }
}

impl Budget {
    /// A budget named `name` (for messages) of `limit` bytes, with nothing reserved.
    pub fn new(name: impl Into<String>, limit: u64) -> Self {
        Budget {
            inner: Arc::new(Inner {
                name: name.into(),
                limit,
                reserved: AtomicU64::new(0),
                next_member: AtomicU64::new(0),
                members: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Its limit in bytes.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// Bytes reserved from it now, by all its allocators.
    pub fn reserved(&self) -> u64 {
        self.inner.reserved.load(Ordering::Acquire)
    }

    /// Bytes still available.
    pub fn available(&self) -> u64 {
        self.limit().saturating_sub(self.reserved())
    }

    fn members(&self) -> MutexGuard<'_, Vec<Member>> {
        self.inner.members.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its use now: the total and each allocator's share.
    pub fn report(&self) -> BudgetReport {
        let shares = self
            .members()
            .iter()
            .map(|m| BudgetShare {
                name: m.name.clone(),
                reserved: m.held.load(Ordering::Acquire),
            })
            .collect();
        BudgetReport {
            name: self.inner.name.clone(),
            limit: self.inner.limit,
            reserved: self.reserved(),
            shares,
        }
    }

    /// Registers an allocator named `name` as drawing from this budget.
    pub(crate) fn join(&self, name: String) -> BudgetMember {
        let id = self.inner.next_member.fetch_add(1, Ordering::Relaxed);
        let held = Arc::new(AtomicU64::new(0));
        self.members().push(Member {
            id,
            name,
            held: held.clone(),
        });
        BudgetMember {
            budget: self.clone(),
            id,
            held,
        }
    }

    fn try_take(&self, n: u64) -> bool {
        let r = &self.inner.reserved;
        let mut cur = r.load(Ordering::Acquire);
        loop {
            let Some(next) = cur.checked_add(n).filter(|v| *v <= self.inner.limit) else {
                return false;
            };
            match r.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    fn give_back(&self, n: u64) {
        let r = &self.inner.reserved;
        let mut cur = r.load(Ordering::Acquire);
        loop {
            let next = cur.saturating_sub(n);
            match r.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }
}

/// One allocator's membership in a [`Budget`]: what it holds, given back when dropped.
pub(crate) struct BudgetMember {
    budget: Budget,
    id: u64,
    held: Arc<AtomicU64>,
}

impl BudgetMember {
    /// The budget.
    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Bytes this member holds.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    /// Takes `n` bytes from the budget; `false` (and nothing taken) if that would pass the
    /// limit.
    pub(crate) fn take(&self, n: u64) -> bool {
        if !self.budget.try_take(n) {
            return false;
        }
        self.held.fetch_add(n, Ordering::AcqRel);
        true
    }

    /// Gives `n` bytes back.
    pub(crate) fn give_back(&self, n: u64) {
        let n = n.min(self.held());
        self.held.fetch_sub(n, Ordering::AcqRel);
        self.budget.give_back(n);
    }
}

impl Drop for BudgetMember {
    fn drop(&mut self) {
        self.budget.give_back(self.held.swap(0, Ordering::AcqRel));
        self.budget.members().retain(|m| m.id != self.id);
    }
}

impl fmt::Debug for BudgetMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetMember")
            .field("budget", &self.budget.name())
            .field("held", &self.held())
            .finish()
    }
}
