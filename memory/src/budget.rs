//! A reservation limit shared by several allocators.
//!
//! The budget's total and its members' shares live in one ledger behind one lock: every
//! change to a share changes the total in the same critical section, and a report copies
//! them in one too. So a [`BudgetReport`] always adds up — its total is the sum of its
//! shares — however many allocators take and give back bytes while it is made. The lock is
//! taken only when an allocator obtains, grows, shrinks or returns a segment, never for a
//! block handed out from its cache.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

struct Member {
    id: u64,
    name: String,
    held: u64,
}

/// The budget's use: changed and read only under [`Inner::ledger`]'s lock.
struct Ledger {
    /// The sum of the members' `held`.
    reserved: u64,
    next_member: u64,
    members: Vec<Member>,
}

impl Ledger {
    fn member(&mut self, id: u64) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.id == id)
    }
}

struct Inner {
    name: String,
    limit: u64,
    ledger: Mutex<Ledger>,
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

/// A [`Budget`] at one moment: `reserved` is always the sum of the shares' `reserved`,
/// taken at the same instant (see the module docs).
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
                ledger: Mutex::new(Ledger {
                    reserved: 0,
                    next_member: 0,
                    members: Vec::new(),
                }),
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
        self.ledger().reserved
    }

    /// Bytes still available.
    pub fn available(&self) -> u64 {
        self.limit().saturating_sub(self.reserved())
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // Every update leaves the ledger consistent before anything that could panic, so
        // a poisoned lock still guards a ledger that adds up.
        self.inner.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its use now: the total and each allocator's share, read at one instant, so the
    /// shares add up to the total.
    pub fn report(&self) -> BudgetReport {
        let ledger = self.ledger();
        BudgetReport {
            name: self.inner.name.clone(),
            limit: self.inner.limit,
            reserved: ledger.reserved,
            shares: ledger
                .members
                .iter()
                .map(|m| BudgetShare {
                    name: m.name.clone(),
                    reserved: m.held,
                })
                .collect(),
        }
    }

    /// Registers an allocator named `name` as drawing from this budget.
    pub(crate) fn join(&self, name: String) -> BudgetMember {
        let mut ledger = self.ledger();
        let id = ledger.next_member;
        ledger.next_member += 1;
        ledger.members.push(Member { id, name, held: 0 });
        BudgetMember {
            budget: self.clone(),
            id,
        }
    }
}

/// One allocator's membership in a [`Budget`]: what it holds, given back when dropped.
pub(crate) struct BudgetMember {
    budget: Budget,
    id: u64,
}

impl BudgetMember {
    /// The budget.
    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Bytes this member holds.
    pub(crate) fn held(&self) -> u64 {
        let mut ledger = self.budget.ledger();
        ledger.member(self.id).map_or(0, |m| m.held)
    }

    /// Takes `n` bytes from the budget; `false` (and nothing taken) if that would pass the
    /// limit.
    pub(crate) fn take(&self, n: u64) -> bool {
        let limit = self.budget.inner.limit;
        let mut ledger = self.budget.ledger();
        let Some(total) = ledger.reserved.checked_add(n).filter(|t| *t <= limit) else {
            return false;
        };
        let Some(member) = ledger.member(self.id) else {
            return false;
        };
        // `held` ≤ `reserved` ≤ `limit`, so this cannot overflow once the total did not.
        member.held += n;
        ledger.reserved = total;
        true
    }

    /// Gives `n` bytes back (at most what this member holds).
    pub(crate) fn give_back(&self, n: u64) {
        let mut ledger = self.budget.ledger();
        let Some(member) = ledger.member(self.id) else {
            return;
        };
        let n = n.min(member.held);
        member.held -= n;
        ledger.reserved -= n;
    }
}

impl Drop for BudgetMember {
    fn drop(&mut self) {
        let mut ledger = self.budget.ledger();
        if let Some(i) = ledger.members.iter().position(|m| m.id == self.id) {
            let member = ledger.members.remove(i);
            ledger.reserved -= member.held;
        }
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
