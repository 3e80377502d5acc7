//! Dependency inference for a sequential task flow.
//!
//! Tasks are submitted in program order, each with the handles it accesses and how. The
//! graph that runs them in parallel must give every task exactly the data a sequential
//! run would: a reader sees the last write before it (read after write), a writer waits
//! for the readers of the version it replaces (write after read) and for the previous
//! writer (write after write). Commutative reductions (`Reduce`) update a handle in any
//! order: consecutive reductions of one handle by the same operation (the same key: the
//! runtime uses the codelet) do not depend on each other, only on what came before the
//! group; the first plain access after the group, or a reduction by another operation
//! (two commutative operations need not commute with each other: max and min), depends
//! on every member.
//!
//! Per handle the inference keeps the tasks that produced its current version (one
//! writer, or the members of an open reduction group), the readers of that version, and
//! — for an open group — what its members depend on. Each access touches only that
//! handle's state, so submitting a task costs O(its accesses + the dependencies it gets).

use std::collections::BTreeSet;

/// How a task accesses a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessMode {
    /// Reads the handle's current value.
    Read,
    /// Overwrites it without reading it.
    Write,
    /// Reads and then writes it.
    ReadWrite,
    /// Updates it with a commutative, associative operation (an accumulation): tasks of
    /// one reduction group may run in any order, one at a time.
    Reduce,
}

impl AccessMode {
    /// Whether the task reads the handle's previous value.
    pub fn reads(self) -> bool {
        !matches!(self, AccessMode::Write)
    }

    /// Whether the task changes the handle.
    pub fn writes(self) -> bool {
        !matches!(self, AccessMode::Read)
    }

    /// The mode of a task that accesses one handle twice, as `self` and as `other`.
    pub fn merge(self, other: AccessMode) -> AccessMode {
        use AccessMode::*;
        match (self, other) {
            (a, b) if a == b => a,
            (Read, Write) | (Write, Read) => ReadWrite,
            // Any mix with a reduction or a read-write is a plain read-write: the task
            // both reads and changes the handle, in an order only it knows.
            _ => ReadWrite,
        }
    }

    /// The lowercase name (`read`, `write`, `read-write`, `reduce`).
    pub fn name(self) -> &'static str {
        match self {
            AccessMode::Read => "read",
            AccessMode::Write => "write",
            AccessMode::ReadWrite => "read-write",
            AccessMode::Reduce => "reduce",
        }
    }
}

/// The dependency state of one handle. `T` identifies tasks (the runtime uses task
/// indices).
#[derive(Debug, Clone)]
pub struct HandleDeps<T> {
    /// The tasks that produced the current version: the last writer, or the members of
    /// the reduction group.
    producers: Vec<T>,
    /// Tasks that read the current version.
    readers: Vec<T>,
    /// While a reduction group is open: what every member depends on.
    group_base: Option<Vec<T>>,
    /// The open group's operation.
    group_key: u64,
}

impl<T> Default for HandleDeps<T> {
    fn default() -> Self {
        HandleDeps {
            producers: Vec::new(),
            readers: Vec::new(),
            group_base: None,
            group_key: 0,
        }
    }
}

impl<T: Copy + Ord> HandleDeps<T> {
    /// Records that `task` accesses the handle as `mode`, adding to `deps` the tasks it
    /// must wait for. Reductions all count as one operation (see
    /// [`HandleDeps::access_keyed`]).
    pub fn access(&mut self, task: T, mode: AccessMode, deps: &mut BTreeSet<T>) {
        self.access_keyed(task, mode, 0, deps);
    }

    /// Like [`HandleDeps::access`], a reduction being by operation `key`: it joins the
    /// open group only if the group's reductions are by the same operation.
    pub fn access_keyed(&mut self, task: T, mode: AccessMode, key: u64, deps: &mut BTreeSet<T>) {
        match mode {
            AccessMode::Read => {
                deps.extend(self.producers.iter().copied());
                self.group_base = None;
                self.readers.push(task);
            }
            AccessMode::Write | AccessMode::ReadWrite => {
                deps.extend(self.producers.iter().copied());
                deps.extend(self.readers.iter().copied());
                self.producers.clear();
                self.producers.push(task);
                self.readers.clear();
                self.group_base = None;
            }
            AccessMode::Reduce => match &self.group_base {
                Some(base) if self.group_key == key => {
                    deps.extend(base.iter().copied());
                    self.producers.push(task);
                }
                _ => {
                    let base: Vec<T> = self
                        .producers
                        .iter()
                        .chain(self.readers.iter())
                        .copied()
                        .collect();
                    deps.extend(base.iter().copied());
                    self.producers.clear();
                    self.producers.push(task);
                    self.readers.clear();
                    self.group_base = Some(base);
                    self.group_key = key;
                }
            },
        }
        deps.remove(&task);
    }

    /// Records `task`'s access like [`HandleDeps::access`], for a task whose
    /// dependencies through this handle are already known (a replayed task whose access
    /// is not its graph's first to the handle): the state moves on; nothing is computed.
    pub fn advance(&mut self, task: T, mode: AccessMode) {
        self.advance_keyed(task, mode, 0);
    }

    /// [`HandleDeps::advance`] for a reduction by operation `key` (see
    /// [`HandleDeps::access_keyed`]).
    pub fn advance_keyed(&mut self, task: T, mode: AccessMode, key: u64) {
        match mode {
            AccessMode::Read => {
                self.group_base = None;
                self.readers.push(task);
            }
            AccessMode::Write | AccessMode::ReadWrite => {
                self.producers.clear();
                self.producers.push(task);
                self.readers.clear();
                self.group_base = None;
            }
            AccessMode::Reduce => {
                if self.group_base.is_none() || self.group_key != key {
                    let base: Vec<T> = self
                        .producers
                        .iter()
                        .chain(self.readers.iter())
                        .copied()
                        .collect();
                    self.producers.clear();
                    self.readers.clear();
                    self.group_base = Some(base);
                    self.group_key = key;
                }
                self.producers.push(task);
            }
        }
    }

    /// How many tasks the state lists.
    pub fn len(&self) -> usize {
        self.producers.len() + self.readers.len() + self.group_base.as_ref().map_or(0, Vec::len)
    }

    /// Whether it lists no task.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tasks a reader of the handle's current value would wait for.
    pub fn producers(&self) -> &[T] {
        &self.producers
    }

    /// The tasks that must finish before the handle may be changed or released: its
    /// producers and the readers of its current version.
    pub fn all_users(&self) -> impl Iterator<Item = T> + '_ {
        self.producers.iter().chain(self.readers.iter()).copied()
    }

    /// Forgets tasks for which `done` is true (they can no longer hold anyone back).
    pub fn prune(&mut self, done: impl Fn(T) -> bool) {
        self.readers.retain(|t| !done(*t));
        self.producers.retain(|t| !done(*t));
        if let Some(base) = &mut self.group_base {
            base.retain(|t| !done(*t));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AccessMode::*;

    /// Runs a program of accesses (task i accesses `program[i]`, a list of (handle,
    /// mode)) and returns each task's dependencies.
    fn infer(handles: usize, program: &[Vec<(usize, AccessMode)>]) -> Vec<BTreeSet<usize>> {
        let mut state: Vec<HandleDeps<usize>> = vec![HandleDeps::default(); handles];
        program
            .iter()
            .enumerate()
            .map(|(t, accesses)| {
                let mut deps = BTreeSet::new();
                for &(h, m) in accesses {
                    state[h].access(t, m, &mut deps);
                }
                deps
            })
            .collect()
    }

    /// The dependencies a sequential run demands, derived from scratch: task j must
    /// precede task i (j < i) when they touch a common handle and the order matters —
    /// at least one writes, and they are not both reductions of one unbroken group —
    /// and no task between them already carries the order (the transitive reduction
    /// is not required; we compare the orders the two graphs imply).
    fn must_precede(program: &[Vec<(usize, AccessMode)>], j: usize, i: usize) -> bool {
        program[j].iter().any(|&(hj, mj)| {
            program[i].iter().any(|&(hi, mi)| {
                if hj != hi || (!mj.writes() && !mi.writes()) {
                    return false;
                }
                if mj == Reduce && mi == Reduce {
                    // Ordered only if something other than a reduction of this handle
                    // came between them.
                    return program[j + 1..i]
                        .iter()
                        .any(|acc| acc.iter().any(|&(h, m)| h == hi && m != Reduce));
                }
                true
            })
        })
    }

    /// The transitive closure of `deps` as a reachability test.
    fn reaches(deps: &[BTreeSet<usize>], from: usize, to: usize) -> bool {
        // Whether `to` is an ancestor of `from`.
        let mut stack = vec![from];
        let mut seen = BTreeSet::new();
        while let Some(t) = stack.pop() {
            for &d in &deps[t] {
                if d == to {
                    return true;
                }
                if seen.insert(d) {
                    stack.push(d);
                }
            }
        }
        false
    }

    #[test]
    fn the_three_hazards() {
        // t0 writes A; t1 reads A (RAW); t2 reads A; t3 writes A (WAR on t1, t2; WAW t0).
        let deps = infer(
            1,
            &[
                vec![(0, Write)],
                vec![(0, Read)],
                vec![(0, Read)],
                vec![(0, Write)],
            ],
        );
        assert!(deps[0].is_empty());
        assert_eq!(deps[1], BTreeSet::from([0]));
        assert_eq!(deps[2], BTreeSet::from([0]));
        assert_eq!(deps[3], BTreeSet::from([0, 1, 2]));
    }

    #[test]
    fn reductions_commute_within_a_group_and_close_on_a_read() {
        // t0 writes A; t1..t3 reduce A; t4 reads A; t5 reduces A; t6 reduces A.
        let deps = infer(
            1,
            &[
                vec![(0, Write)],
                vec![(0, Reduce)],
                vec![(0, Reduce)],
                vec![(0, Reduce)],
                vec![(0, Read)],
                vec![(0, Reduce)],
                vec![(0, Reduce)],
            ],
        );
        assert_eq!(deps[1], BTreeSet::from([0]));
        assert_eq!(deps[2], BTreeSet::from([0]), "no order among the group");
        assert_eq!(deps[3], BTreeSet::from([0]));
        assert_eq!(deps[4], BTreeSet::from([1, 2, 3]), "the read waits for all");
        assert_eq!(deps[5], BTreeSet::from([1, 2, 3, 4]));
        assert_eq!(deps[6], BTreeSet::from([1, 2, 3, 4]));
    }

    #[test]
    fn advancing_leaves_the_state_that_access_leaves() {
        let modes = [Read, Write, ReadWrite, Reduce];
        for a in modes {
            for b in modes {
                for c in modes {
                    let (mut x, mut y) = (HandleDeps::default(), HandleDeps::default());
                    for (t, m) in [a, b, c].into_iter().enumerate() {
                        x.access(t, m, &mut BTreeSet::new());
                        y.advance(t, m);
                    }
                    // The same dependencies for every later access.
                    for m in modes {
                        let (mut dx, mut dy) = (BTreeSet::new(), BTreeSet::new());
                        x.clone().access(9, m, &mut dx);
                        y.clone().access(9, m, &mut dy);
                        assert_eq!(dx, dy, "{a:?} {b:?} {c:?} then {m:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn reductions_by_another_operation_start_a_new_group() {
        let mut h: HandleDeps<usize> = HandleDeps::default();
        let mut deps = BTreeSet::new();
        h.access_keyed(0, Write, 0, &mut deps);
        let mut d1 = BTreeSet::new();
        h.access_keyed(1, Reduce, 7, &mut d1);
        let mut d2 = BTreeSet::new();
        h.access_keyed(2, Reduce, 7, &mut d2);
        let mut d3 = BTreeSet::new();
        h.access_keyed(3, Reduce, 8, &mut d3);
        let mut d4 = BTreeSet::new();
        h.access_keyed(4, Reduce, 8, &mut d4);
        assert_eq!((d1.clone(), d2), (BTreeSet::from([0]), BTreeSet::from([0])));
        assert_eq!(
            d3,
            BTreeSet::from([1, 2]),
            "max after min waits for the min group"
        );
        assert_eq!(d4, BTreeSet::from([1, 2]), "and joins its own group");
        let mut y: HandleDeps<usize> = HandleDeps::default();
        for (t, m, k) in [
            (0, Write, 0),
            (1, Reduce, 7),
            (2, Reduce, 7),
            (3, Reduce, 8),
            (4, Reduce, 8),
        ] {
            y.advance_keyed(t, m, k);
        }
        let (mut a, mut b) = (BTreeSet::new(), BTreeSet::new());
        h.access(9, Read, &mut a);
        y.access(9, Read, &mut b);
        assert_eq!(a, b);
        assert_eq!(a, BTreeSet::from([3, 4]));
    }

    #[test]
    fn modes_merge_to_the_strongest() {
        assert_eq!(Read.merge(Read), Read);
        assert_eq!(Read.merge(Write), ReadWrite);
        assert_eq!(Write.merge(Write), Write);
        assert_eq!(Reduce.merge(Read), ReadWrite);
        assert_eq!(Reduce.merge(Reduce), Reduce);
    }

    /// Every program of up to 4 tasks over 2 handles, each task accessing one or two
    /// handles in every mode: the inferred graph orders exactly the pairs a sequential
    /// run must order (as reachability), and never more than a sequential run would.
    #[test]
    fn exhaustively_on_small_programs() {
        let modes = [Read, Write, ReadWrite, Reduce];
        // The access lists a task may have: one handle in any mode, or both.
        let mut choices: Vec<Vec<(usize, AccessMode)>> = Vec::new();
        for h in 0..2 {
            for m in modes {
                choices.push(vec![(h, m)]);
            }
        }
        for m0 in modes {
            for m1 in modes {
                choices.push(vec![(0, m0), (1, m1)]);
            }
        }
        let mut programs = 0u64;
        for len in 1..=4usize {
            let count = choices.len().pow(len as u32);
            for code in 0..count {
                let mut c = code;
                let program: Vec<Vec<(usize, AccessMode)>> = (0..len)
                    .map(|_| {
                        let pick = choices[c % choices.len()].clone();
                        c /= choices.len();
                        pick
                    })
                    .collect();
                let deps = infer(2, &program);
                for i in 0..len {
                    assert!(deps[i].iter().all(|&d| d < i), "{program:?}: {deps:?}");
                    for j in 0..i {
                        let needed = must_precede(&program, j, i);
                        let implied = reaches(&deps, i, j);
                        assert!(
                            !needed || implied,
                            "task {j} must precede task {i} in {program:?}; got {deps:?}"
                        );
                        // Nothing is ordered that a sequential run leaves free, except
                        // through a chain of needed orders.
                        if deps[i].contains(&j) {
                            assert!(needed, "{j} -> {i} is not needed in {program:?}");
                        }
                    }
                }
                programs += 1;
            }
        }
        assert!(programs > 100_000, "{programs} programs");
    }
}
