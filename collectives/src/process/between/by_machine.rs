//! Steps between processes on several machines, grouped by machine, so that what crosses
//! machines — the slower links — is as little as the operation allows.
//!
//! - **Small all-reduces** go through each machine's leader (its first process): the
//!   machine's processes send it their data, the leaders exchange their machines' sums,
//!   and each leader hands the result back. One message per process crosses machines.
//! - **Large all-reduces** where every machine holds as many processes (`m`) run in two
//!   dimensions, as NCCL's and MPI's hierarchical algorithms do: a reduce-scatter within
//!   each machine leaves process `i` of each machine with block `i` of its machine's sum;
//!   the processes `i` of every machine all-reduce that block among themselves (a
//!   reduce-scatter, then an all-gather); an all-gather within each machine brings the
//!   blocks together. Each process sends `2 × (machines − 1) / machines × len / m` bytes
//!   to other machines, against `2 × (machines − 1) × m / processes × len` for the flat
//!   algorithm: `m` times less.
//! - **Large all-reduces on machines of unequal sizes** reduce at each machine's leader
//!   (a reduce-scatter within the machine, then the blocks to the leader), all-reduce
//!   among the leaders, and hand the result back.
//! - **Reduces** combine each machine's data at one of its processes (the root on the
//!   root's machine, the first process on the others), which send their machines' sums
//!   to the root: one message per other machine crosses machines, instead of one per
//!   process on them.
//! - **Large broadcasts** send once to each other machine's first process, which
//!   forwards to its machine.
//! - **Large reduce-scatters and all-gathers** where every machine holds as many
//!   processes run in two dimensions too: the process at place `i` of a machine sums
//!   (or gathers) within its machine the blocks of the processes at place `i` of every
//!   machine, and those processes swap them across machines — `m` times fewer bytes
//!   across machines than the flat algorithm.
//!
//! Every process ends with the same bits: each block is combined within each machine in
//! process order, then across machines in machine order, by the same processes.

use xpu_hal::{Error, Result};

use super::{even_blocks, from_others, split_blocks, Between, Failure};

impl Between<'_> {
    /// The processes grouped by machine, in process order, when that makes a hierarchy:
    /// more than one machine, and one of them holding more than one process.
    pub(super) fn machines(&self) -> Option<Vec<Vec<usize>>> {
        let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
        for (q, p) in self.procs.iter().enumerate() {
            match groups.iter_mut().find(|(h, _)| *h == p.host) {
                Some((_, g)) => g.push(q),
                None => groups.push((&p.host, vec![q])),
            }
        }
        (groups.len() > 1 && groups.iter().any(|(_, g)| g.len() > 1))
            .then(|| groups.into_iter().map(|(_, g)| g).collect())
    }

    /// A small all-reduce over several machines: each machine's processes send their
    /// data to its first process (its leader), which combines them in process order;
    /// the leaders exchange their machines' sums and combine them in machine order; each
    /// leader hands the result to its machine. Only one message per process crosses
    /// machines, instead of one to every process of every other machine, and every
    /// process ends with the same bits.
    pub(super) fn all_reduce_by_machine(
        &mut self,
        data: &mut [u8],
        extra: &mut [u8],
        machines: &[Vec<usize>],
    ) -> std::result::Result<(), Failure> {
        let me = self.me();
        let len = data.len();
        let (mine, _) = self.machine_of(machines)?;
        let (leader, members) = (mine[0], &mine[1..]);
        if me != leader {
            self.swap(&[(leader, &*data)], &mut [])?;
            return self.swap(&[], &mut [(leader, data)]);
        }
        // Within the machine, to the leader.
        self.receive_and_reduce(members, 0, data, extra)?;
        // Among the machines' leaders.
        let leaders: Vec<usize> = machines.iter().map(|g| g[0]).collect();
        let others: Vec<usize> = leaders.iter().copied().filter(|&q| q != me).collect();
        let mut recvs = from_others(&others, extra, len)?;
        self.swap(
            &others.iter().map(|&q| (q, &*data)).collect::<Vec<_>>(),
            &mut recvs,
        )?;
        let own = data.as_mut_ptr();
        let mut sources: Vec<*mut u8> = recvs.iter_mut().map(|(_, b)| b.as_mut_ptr()).collect();
        let at = leaders.iter().position(|&q| q == me).unwrap_or(0);
        sources.insert(at, own);
        // SAFETY: as above.
        unsafe { self.reduce(&sources, own, len) }?;
        // Back to the machine.
        if members.is_empty() {
            return Ok(());
        }
        self.swap(
            &members.iter().map(|&q| (q, &*data)).collect::<Vec<_>>(),
            &mut [],
        )
    }

    /// Process `root`'s `data` becomes the reduction of every process's `data`, combined
    /// within each machine (in process order) at the root on its machine and at the
    /// first process on the others, which send their machines' sums to the root; the
    /// root combines those in machine order (the bits of the all-reduce). `extra` holds
    /// `(processes on this machine − 1) × data.len()` bytes, and at the root
    /// `(processes − 1) × data.len()`.
    pub(super) fn reduce_by_machine(
        &mut self,
        data: &mut [u8],
        extra: &mut [u8],
        root: usize,
        machines: &[Vec<usize>],
    ) -> std::result::Result<(), Failure> {
        let me = self.me();
        let (mine, at) = self.machine_of(machines)?;
        // Where this machine's data meets.
        let target = if mine.contains(&root) { root } else { mine[0] };
        if me != target {
            return self.swap(&[(target, &*data)], &mut []);
        }
        let members: Vec<usize> = mine.iter().copied().filter(|&q| q != me).collect();
        self.receive_and_reduce(&members, at, data, extra)?;
        if me != root {
            return self.swap(&[(root, &*data)], &mut []);
        }
        // The other machines' sums, in machine order around this one's.
        let senders: Vec<usize> = machines
            .iter()
            .filter(|g| !g.contains(&root))
            .map(|g| g[0])
            .collect();
        let place = machines.iter().position(|g| g.contains(&root)).unwrap_or(0);
        self.receive_and_reduce(&senders, place, data, extra)
    }

    /// Receives `data.len()` bytes from each of `senders` (into `extra`) and combines
    /// them into `data` with this process's own, which stands at `place` among them, in
    /// that order.
    fn receive_and_reduce(
        &mut self,
        senders: &[usize],
        place: usize,
        data: &mut [u8],
        extra: &mut [u8],
    ) -> std::result::Result<(), Failure> {
        if senders.is_empty() {
            return Ok(());
        }
        let len = data.len();
        let mut recvs = from_others(senders, extra, len)?;
        self.swap(&[], &mut recvs)?;
        let own = data.as_mut_ptr();
        let mut sources: Vec<*mut u8> = recvs.iter_mut().map(|(_, b)| b.as_mut_ptr()).collect();
        sources.insert(place.min(sources.len()), own);
        // SAFETY: as in `all_reduce`: every source is `len` live, aligned bytes that only
        // the reduction touches (this process's data, or a chunk of `extra` that received
        // as much), and the destination is this process's own.
        unsafe { self.reduce(&sources, own, len) }?;
        Ok(())
    }

    /// The machine of `machines` that holds this process, and this process's place in it.
    fn machine_of<'m>(&self, machines: &'m [Vec<usize>]) -> Result<(&'m [usize], usize)> {
        let me = self.me();
        machines
            .iter()
            .find_map(|g| g.iter().position(|&q| q == me).map(|at| (g.as_slice(), at)))
            .ok_or_else(|| {
                Error::backend_message(
                    "collectives",
                    "internal error: this process is on no machine",
                )
            })
    }

    /// A large all-reduce over several machines: in two dimensions where every machine
    /// holds as many processes, else through each machine's leader (see the module's
    /// doc). `extra` holds at least `(processes - 1) × data.len()` bytes.
    pub(super) fn large_all_reduce_by_machine(
        &mut self,
        data: &mut [u8],
        extra: &mut [u8],
        elem: usize,
        machines: &[Vec<usize>],
    ) -> std::result::Result<(), Failure> {
        let len = data.len();
        let (mine, at) = self.machine_of(machines)?;
        let m = mine.len();
        let blocks = even_blocks(len, elem, m);
        if m > 1 {
            self.reduce_scatter_among(mine, data, extra, &blocks)?;
        }
        if machines.iter().all(|g| g.len() == m) {
            // Block `at` holds this machine's sum: all-reduce it with the processes at
            // the same place on the other machines, in machine order.
            let (off, part_len) = blocks[at];
            let part = &mut data[off..off + part_len];
            let peers: Vec<usize> = machines.iter().map(|g| g[at]).collect();
            let sub = even_blocks(part_len, elem, peers.len());
            self.reduce_scatter_among(&peers, part, extra, &sub)?;
            self.all_gather_among(&peers, part, &sub)?;
            if m > 1 {
                self.all_gather_among(mine, data, &blocks)?;
            }
            return Ok(());
        }
        let leader = mine[0];
        if self.me() != leader {
            let (off, part_len) = blocks[at];
            self.swap(&[(leader, &data[off..off + part_len])], &mut [])?;
            return self.swap(&[], &mut [(leader, data)]);
        }
        if m > 1 {
            let parts = split_blocks(data, &blocks)?;
            let mut recvs: Vec<(usize, &mut [u8])> =
                mine.iter().copied().zip(parts).skip(1).collect();
            self.swap(&[], &mut recvs)?;
        }
        let leaders: Vec<usize> = machines.iter().map(|g| g[0]).collect();
        let among = even_blocks(len, elem, leaders.len());
        self.reduce_scatter_among(&leaders, data, extra, &among)?;
        self.all_gather_among(&leaders, data, &among)?;
        if m > 1 {
            let sends: Vec<(usize, &[u8])> = mine[1..].iter().map(|&q| (q, &*data)).collect();
            self.swap(&sends, &mut [])?;
        }
        Ok(())
    }

    /// A large broadcast over several machines: the root sends to its own machine's
    /// processes and to the first process of every other machine, which forwards to
    /// its machine's others.
    pub(super) fn broadcast_by_machine(
        &mut self,
        data: &mut [u8],
        root: usize,
        machines: &[Vec<usize>],
    ) -> std::result::Result<(), Failure> {
        let me = self.me();
        let (mine, _) = self.machine_of(machines)?;
        if me == root {
            let mut to: Vec<usize> = mine.iter().copied().filter(|&q| q != root).collect();
            to.extend(machines.iter().filter(|g| !g.contains(&root)).map(|g| g[0]));
            let sends: Vec<(usize, &[u8])> = to.into_iter().map(|q| (q, &*data)).collect();
            return self.swap(&sends, &mut []);
        }
        if mine.contains(&root) {
            return self.swap(&[], &mut [(root, data)]);
        }
        let entry = mine[0];
        if me != entry {
            return self.swap(&[], &mut [(entry, data)]);
        }
        self.swap(&[], &mut [(root, &mut *data)])?;
        if mine.len() > 1 {
            let sends: Vec<(usize, &[u8])> = mine[1..].iter().map(|&q| (q, &*data)).collect();
            self.swap(&sends, &mut [])?;
        }
        Ok(())
    }

    /// The processes at place `at` of every machine, in machine order (machines of
    /// equal sizes).
    fn place(machines: &[Vec<usize>], at: usize) -> Vec<usize> {
        machines.iter().map(|g| g[at]).collect()
    }

    /// This process's machine, its place there, and the processes at that place of
    /// every machine (machines of equal sizes).
    fn grid<'m>(&self, machines: &'m [Vec<usize>]) -> Result<(&'m [usize], usize, Vec<usize>)> {
        let (mine, at) = self.machine_of(machines)?;
        Ok((mine, at, Self::place(machines, at)))
    }

    /// A large reduce-scatter over machines of equal sizes, in two dimensions: within
    /// each machine, the process at place `i` sums its machine's copies of the blocks of
    /// the processes at place `i` of every machine; those processes then swap the sums
    /// and each combines its own block's in machine order. `extra` holds
    /// `(processes - 1) ×` the largest block.
    pub(super) fn reduce_scatter_by_machine(
        &mut self,
        data: &mut [u8],
        extra: &mut [u8],
        blocks: &[(usize, usize)],
        machines: &[Vec<usize>],
    ) -> std::result::Result<(), Failure> {
        let me = self.me();
        let (mine, at, ours) = self.grid(machines)?;
        if mine.len() > 1 {
            let need = (mine.len() - 1) * ours.iter().map(|&p| blocks[p].1).sum::<usize>();
            if extra.len() < need {
                return Err(Error::backend_message(
                    "collectives",
                    "internal error: the scratch for a machine's blocks is too small",
                )
                .into());
            }
            // To each other process of the machine, this process's copies of the blocks
            // it sums; from each, its copies of the blocks this one sums.
            let mut sends: Vec<(usize, &[u8])> = Vec::new();
            for (j, &q) in mine.iter().enumerate().filter(|(_, &q)| q != me) {
                for p in Self::place(machines, j) {
                    let (off, len) = blocks[p];
                    sends.push((q, &data[off..off + len]));
                }
            }
            let mut recvs: Vec<(usize, &mut [u8])> = Vec::new();
            let mut rest = &mut extra[..need];
            for &q in mine.iter().filter(|&&q| q != me) {
                for &p in &ours {
                    let (chunk, tail) = std::mem::take(&mut rest).split_at_mut(blocks[p].1);
                    recvs.push((q, chunk));
                    rest = tail;
                }
            }
            self.swap(&sends, &mut recvs)?;
            drop(sends);
            for (x, &p) in ours.iter().enumerate() {
                let (off, len) = blocks[p];
                let own = data[off..off + len].as_mut_ptr();
                let mut sources: Vec<*mut u8> = recvs
                    .iter_mut()
                    .skip(x)
                    .step_by(ours.len())
                    .map(|(_, b)| b.as_mut_ptr())
                    .collect();
                sources.insert(at, own);
                // SAFETY: as in `all_reduce`: every source is `len` live, aligned bytes
                // (a block starts at an element boundary, and so does every chunk of
                // `extra`, cut in whole blocks) that only the reduction touches, and the
                // destination is this process's own.
                unsafe { self.reduce(&sources, own, len) }?;
            }
        }
        let theirs: Vec<(usize, usize)> = ours.iter().map(|&p| blocks[p]).collect();
        self.reduce_scatter_among(&ours, data, extra, &theirs)
    }

    /// A large all-gather over machines of equal sizes, in two dimensions: the processes
    /// at place `i` of every machine gather their blocks, then each machine's processes
    /// swap what they gathered.
    pub(super) fn all_gather_by_machine(
        &mut self,
        data: &mut [u8],
        blocks: &[(usize, usize)],
        machines: &[Vec<usize>],
    ) -> std::result::Result<(), Failure> {
        let me = self.me();
        let (mine, _, ours) = self.grid(machines)?;
        let theirs: Vec<(usize, usize)> = ours.iter().map(|&p| blocks[p]).collect();
        self.all_gather_among(&ours, data, &theirs)?;
        if mine.len() == 1 {
            return Ok(());
        }
        let mut parts: Vec<Option<&mut [u8]>> =
            split_blocks(data, blocks)?.into_iter().map(Some).collect();
        let mut recvs: Vec<(usize, &mut [u8])> = Vec::new();
        for (j, &q) in mine.iter().enumerate().filter(|(_, &q)| q != me) {
            for p in Self::place(machines, j) {
                if let Some(part) = parts[p].take() {
                    recvs.push((q, part));
                }
            }
        }
        let gathered: Vec<&[u8]> = ours
            .iter()
            .filter_map(|&p| parts[p].take().map(|part| &*part))
            .collect();
        let sends: Vec<(usize, &[u8])> = mine
            .iter()
            .filter(|&&q| q != me)
            .flat_map(|&q| gathered.iter().map(move |&g| (q, g)))
            .collect();
        self.swap(&sends, &mut recvs)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    use xpu_hal::DType;

    use super::super::{even_blocks, Between, ONE_ROUND};
    use crate::comm::op::{Collective, OpDesc, ReduceOp};
    use crate::process::loopback::Wire;
    use crate::process::ProcessInfo;

    /// 40,003 f32: over [`ONE_ROUND`], in blocks of odd sizes.
    const ELEMS: usize = 40_003;
    const LEN: u64 = (ELEMS * 4) as u64;

    /// What the processes run.
    #[derive(Clone, Copy)]
    enum Op {
        AllReduce,
        Broadcast(usize),
        Reduce(usize),
        ReduceScatter,
        AllGather,
    }

    /// Process `p`'s values: small integers, so that every order of sums is exact.
    fn values(p: usize) -> Vec<f32> {
        (0..ELEMS)
            .map(|i| ((i * 7 + p * 13) % 101) as f32)
            .collect()
    }

    /// The sum of the first `n` processes' values.
    fn sum(n: usize) -> Vec<f32> {
        let all: Vec<Vec<f32>> = (0..n).map(values).collect();
        (0..ELEMS).map(|i| all.iter().map(|v| v[i]).sum()).collect()
    }

    /// The f32 blocks of each of `n` processes.
    fn blocks(n: usize) -> Vec<(usize, usize)> {
        even_blocks(ELEMS * 4, 4, n)
    }

    /// Runs `op` on [`ELEMS`] f32 over processes on `hosts` (threads over a loopback
    /// wire); returns every process's data afterwards and the bytes each process sent
    /// to processes on other machines of `machine_of`. Each process starts with its
    /// [`values`] (an all-gather: in its own block only).
    fn run(hosts: &[&str], machine_of: &[&str], op: Op) -> (Vec<Vec<f32>>, Vec<u64>) {
        let n = hosts.len();
        let (wire, peers) = Wire::processes(n);
        let procs: Vec<ProcessInfo> = hosts
            .iter()
            .enumerate()
            .map(|(q, h)| ProcessInfo {
                index: q,
                host: (*h).to_string(),
                pid: q as u32,
                first_rank: q,
                devices: vec![format!("host:{q}")],
            })
            .collect();
        let (kind, reducing, root) = match op {
            Op::AllReduce => (Collective::AllReduce, true, None),
            Op::Broadcast(r) => (Collective::Broadcast, false, Some(r)),
            Op::Reduce(r) => (Collective::Reduce, true, Some(r)),
            Op::ReduceScatter => (Collective::ReduceScatter, true, None),
            Op::AllGather => (Collective::AllGather, false, None),
        };
        let desc = OpDesc {
            kind,
            bytes: LEN,
            dtype: reducing.then_some(DType::F32),
            op: reducing.then_some(ReduceOp::Sum),
            root,
        };
        let blocks = blocks(n);
        let results = std::thread::scope(|s| {
            let handles: Vec<_> = peers
                .iter()
                .map(|peers| {
                    let (procs, blocks) = (&procs, &blocks);
                    s.spawn(move || {
                        let me = crate::process::Peers::index(peers);
                        let mut data: Vec<u8> =
                            values(me).iter().flat_map(|v| v.to_le_bytes()).collect();
                        if let Op::AllGather = op {
                            let (off, len) = blocks[me];
                            let kept = data[off..off + len].to_vec();
                            data.fill(0);
                            data[off..off + len].copy_from_slice(&kept);
                        }
                        let mut extra = vec![0u8; data.len() * (n - 1)];
                        let abort = AtomicBool::new(false);
                        let mut heads = Vec::new();
                        let mut b = Between {
                            input: None,
                            shm: None,
                            peers,
                            procs,
                            seq: 1,
                            desc,
                            timeout: Duration::from_secs(30),
                            deadline: Instant::now() + Duration::from_secs(30),
                            abort: &abort,
                            heads: &mut heads,
                        };
                        let done = match op {
                            Op::AllReduce => b.all_reduce(&mut data, &mut extra, 4),
                            Op::Broadcast(r) => b.broadcast(&mut data, r),
                            Op::Reduce(r) => b.reduce_to(&mut data, &mut extra, r),
                            Op::ReduceScatter => b.reduce_scatter(&mut data, &mut extra, blocks),
                            Op::AllGather => b.all_gather(&mut data, blocks),
                        };
                        assert!(done.is_ok(), "process {me} failed");
                        data.chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect::<Vec<f32>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        let across = (0..n)
            .map(|p| {
                (0..n)
                    .filter(|&q| machine_of[q] != machine_of[p])
                    .map(|q| wire.sent(p, q))
                    .sum()
            })
            .collect();
        (results, across)
    }

    /// Process `p`'s block of `v`, in elements.
    fn block_of(v: &[f32], n: usize, p: usize) -> &[f32] {
        let (off, len) = blocks(n)[p];
        &v[off / 4..(off + len) / 4]
    }

    #[test]
    fn a_large_all_reduce_on_machines_of_two_sends_half_as_much_across_them() {
        const { assert!(ELEMS * 4 > ONE_ROUND) };
        let machines = ["a", "b", "a", "b"];
        let (grouped, grouped_across) = run(&machines, &machines, Op::AllReduce);
        // The flat algorithm, on the same placement: processes that do not say where
        // they run.
        let (flat, flat_across) = run(&["x"; 4], &machines, Op::AllReduce);
        let want = sum(4);
        for r in grouped.iter().chain(&flat) {
            assert_eq!(r, &want);
        }
        for p in 0..4 {
            // Flat: a quarter of the data to each of 2 processes elsewhere, twice (len);
            // grouped: half of this process's half, twice (len / 2). Plus headers.
            assert!(flat_across[p] >= LEN, "flat {flat_across:?}");
            assert!(
                grouped_across[p] <= LEN / 2 + 1024,
                "grouped {grouped_across:?} flat {flat_across:?}"
            );
        }
    }

    #[test]
    fn a_large_all_reduce_on_machines_of_unequal_sizes_goes_through_their_leaders() {
        let machines = ["a", "a", "b", "a"];
        let (results, across) = run(&machines, &machines, Op::AllReduce);
        let want = sum(4);
        for r in &results {
            assert_eq!(r, &want);
        }
        // Only the leaders (0 and 2) send across machines, each half its data in the
        // leaders' reduce-scatter and half in their all-gather.
        assert_eq!(across[1], 0);
        assert_eq!(across[3], 0);
        assert!(
            across[0] <= LEN + 1024 && across[2] <= LEN + 1024,
            "{across:?}"
        );
    }

    #[test]
    fn a_large_broadcast_crosses_to_each_other_machine_once() {
        let machines = ["a", "b", "a", "b", "b"];
        let (results, across) = run(&machines, &machines, Op::Broadcast(2));
        for r in &results {
            assert_eq!(r, &values(2));
        }
        // The root sends machine b's first process the data, once; nobody else crosses.
        assert!(across[2] >= LEN && across[2] <= LEN + 1024, "{across:?}");
        assert_eq!(across.iter().sum::<u64>(), across[2]);
    }

    #[test]
    fn a_reduce_crosses_machines_once_per_other_machine() {
        let machines = ["a", "b", "a", "b", "b", "a"];
        // The root first on its machine or not, and on either machine.
        for root in [0, 3, 4, 5] {
            let (results, across) = run(&machines, &machines, Op::Reduce(root));
            assert_eq!(results[root], sum(6), "root {root}");
            // Only the other machine's meeting point (its first process) crosses, once.
            let other = if machines[root] == "a" { 1 } else { 0 };
            assert!(
                across[other] >= LEN && across[other] <= LEN + 1024,
                "root {root}: {across:?}"
            );
            assert_eq!(across.iter().sum::<u64>(), across[other], "root {root}");
        }
        // The flat algorithm on the same placement sends one message per process on
        // the other machine.
        let (flat, flat_across) = run(&["x"; 6], &machines, Op::Reduce(3));
        assert_eq!(flat[3], sum(6));
        assert!(
            flat_across.iter().sum::<u64>() >= 3 * LEN,
            "{flat_across:?}"
        );
    }

    #[test]
    fn large_reduce_scatters_and_all_gathers_on_three_machines_of_two_cross_them_half_as_much() {
        // Machines' processes interleaved and out of order: places differ from indices.
        let machines = ["a", "b", "c", "c", "b", "a"];
        let n = machines.len();
        let want = sum(n);
        let (grouped, grouped_across) = run(&machines, &machines, Op::ReduceScatter);
        let (flat, flat_across) = run(&["x"; 6], &machines, Op::ReduceScatter);
        for (p, (g, f)) in grouped.iter().zip(&flat).enumerate() {
            assert_eq!(block_of(g, n, p), block_of(&want, n, p), "process {p}");
            assert_eq!(block_of(f, n, p), block_of(&want, n, p), "process {p}");
        }
        // Flat: the blocks of the 4 processes elsewhere; grouped: 2 blocks.
        for p in 0..n {
            assert!(flat_across[p] >= 4 * (LEN / 6) - 8, "{flat_across:?}");
            assert!(
                grouped_across[p] <= 2 * (LEN / 6) + 1024,
                "{grouped_across:?}"
            );
        }
        let (grouped, grouped_across) = run(&machines, &machines, Op::AllGather);
        let (flat, flat_across) = run(&["x"; 6], &machines, Op::AllGather);
        let whole: Vec<f32> = (0..n)
            .flat_map(|p| block_of(&values(p), n, p).to_vec())
            .collect();
        for r in grouped.iter().chain(&flat) {
            assert_eq!(r, &whole);
        }
        for p in 0..n {
            assert!(flat_across[p] >= 4 * (LEN / 6) - 8, "{flat_across:?}");
            assert!(
                grouped_across[p] <= 2 * (LEN / 6) + 1024,
                "{grouped_across:?}"
            );
        }
    }
}
