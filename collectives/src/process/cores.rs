//! Whether the processes of one machine can each run on a core of their own: what
//! decides how their waits behave. Where they can, a waiting process spins as MPI's own
//! waits do, for giving its core away costs a whole time slice when another program
//! runs beside it; where they cannot, it yields soon, so that the process it waits for
//! gets the core.
//!
//! Launchers bind processes (`mpirun` binds each of a few processes to a core of its
//! own), so a process's own view of the machine — its affinity, which
//! `available_parallelism` reports — says one core even when every process has one. The
//! answer therefore comes from every process's allowed cores together: they fit when
//! each process can be given a distinct core it may run on (a matching), which is what a
//! launcher's binding, or no binding at all, gives.

/// Polls a waiter between processes makes before it yields its core, when each process
/// of its machine can have a core of its own (`fitting`): then many (about 1.6 ms
/// here), as MPI's own waits keep their core, since yielding it to a busy neighbour
/// costs a whole time slice; else few, so that the awaited process gets the core.
pub(crate) fn spins(fitting: bool) -> u32 {
    if fitting {
        1 << 16
    } else {
        64
    }
}

/// The cores this process may run on, in increasing order; empty where the system does
/// not say.
pub(crate) fn allowed() -> Vec<u32> {
    let Some(set) = allowed_set() else {
        return Vec::new();
    };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: a plain read of the set, at an index below its size.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .filter_map(|c| u32::try_from(c).ok())
        .collect()
}

/// This thread's affinity mask, where the system gives it.
pub(crate) fn allowed_set() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data, and all-zero is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid cpu_set_t of `size` bytes; pid 0 is the calling thread.
    (unsafe { libc::sched_getaffinity(0, size, &mut set) } == 0).then_some(set)
}

/// The cores online on this machine, whatever this process is bound to (at least 1).
pub(crate) fn online() -> usize {
    // SAFETY: sysconf only reads a system setting.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(0).max(1)
}

/// Whether processes allowed the cores in `sets` (one list per process) can each run on
/// a distinct core: a matching of processes to cores that covers every process. A
/// process whose list is empty (its system did not say) counts as allowed every core of
/// the others, or one core of its own when none said.
pub(crate) fn each_has_one(sets: &[Vec<u32>]) -> bool {
    let known: Vec<u32> = {
        let mut all: Vec<u32> = sets.iter().flatten().copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    };
    if known.is_empty() {
        return sets.len() <= online();
    }
    let sets: Vec<&[u32]> = sets
        .iter()
        .map(|s| if s.is_empty() { &known[..] } else { &s[..] })
        .collect();
    if sets.len() > known.len() {
        return false;
    }
    // Kuhn's augmenting paths: `holder[k]` is the process given core `known[k]`.
    let mut holder: Vec<Option<usize>> = vec![None; known.len()];
    let index = |core: u32| known.binary_search(&core).ok();
    fn place(
        p: usize,
        sets: &[&[u32]],
        index: &dyn Fn(u32) -> Option<usize>,
        holder: &mut [Option<usize>],
        seen: &mut [bool],
    ) -> bool {
        for &core in sets[p] {
            let Some(k) = index(core) else { continue };
            if seen[k] {
                continue;
            }
            seen[k] = true;
            let free = match holder[k] {
                None => true,
                Some(q) => place(q, sets, index, holder, seen),
            };
            if free {
                holder[k] = Some(p);
                return true;
            }
        }
        false
    }
    (0..sets.len()).all(|p| {
        let mut seen = vec![false; known.len()];
        place(p, &sets, &index, &mut holder, &mut seen)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_bound_to_distinct_cores_fit_and_shared_ones_do_not() {
        // mpirun's binding: one core each.
        assert!(each_has_one(&[vec![0], vec![1]]));
        // No binding: both may run anywhere.
        assert!(each_has_one(&[vec![0, 1], vec![0, 1]]));
        // Both bound to one core, or more processes than cores.
        assert!(!each_has_one(&[vec![0], vec![0]]));
        assert!(!each_has_one(&[vec![0, 1], vec![0, 1], vec![0, 1]]));
        // Enough cores in all, but two processes may use only the same one.
        assert!(!each_has_one(&[vec![1], vec![1], vec![2, 3]]));
        // A matching that a greedy first choice would miss.
        assert!(each_has_one(&[vec![0, 1], vec![0]]));
        // A process that could not say takes the others' cores.
        assert!(each_has_one(&[vec![0, 1], vec![]]));
        assert!(!each_has_one(&[vec![0], vec![]]));
    }

    #[test]
    fn this_process_may_run_somewhere() {
        let mine = allowed();
        assert!(!mine.is_empty());
        assert!(mine
            .iter()
            .all(|&c| (c as usize) < libc::CPU_SETSIZE as usize));
        assert!(each_has_one(&[mine]));
    }
}
