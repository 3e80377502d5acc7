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
//! - **Large broadcasts** send once to each other machine's first process, which
//!   forwards to its machine.
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
        if !members.is_empty() {
            let mut recvs = from_others(members, extra, len)?;
            self.swap(&[], &mut recvs)?;
            let own = data.as_mut_ptr();
            let mut sources = vec![own];
            sources.extend(recvs.iter_mut().map(|(_, b)| b.as_mut_ptr()));
            // SAFETY: as in `all_reduce`: every source is `len` live, aligned bytes that
            // only the reduction touches, and the destination is this process's own.
            unsafe { self.reduce(&sources, own, len) }?;
        }
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
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    use xpu_hal::DType;

    use super::super::{Between, ONE_ROUND};
    use crate::comm::op::{Collective, OpDesc, ReduceOp};
    use crate::process::loopback::Wire;
    use crate::process::ProcessInfo;

    /// 40,003 f32: over [`ONE_ROUND`], in blocks of odd sizes.
    const ELEMS: usize = 40_003;

    /// Process `p`'s values: small integers, so that every order of sums is exact.
    fn values(p: usize) -> Vec<f32> {
        (0..ELEMS)
            .map(|i| ((i * 7 + p * 13) % 101) as f32)
            .collect()
    }

    /// Runs one all-reduce (or, with `root`, a broadcast) of [`ELEMS`] f32 over
    /// processes on `hosts` (threads over a loopback wire); returns every process's
    /// result and the bytes each process sent to processes on other machines of
    /// `machine_of`.
    fn run(hosts: &[&str], machine_of: &[&str], root: Option<usize>) -> (Vec<Vec<f32>>, Vec<u64>) {
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
        let desc = OpDesc {
            kind: root.map_or(Collective::AllReduce, |_| Collective::Broadcast),
            bytes: (ELEMS * 4) as u64,
            dtype: root.is_none().then_some(DType::F32),
            op: root.is_none().then_some(ReduceOp::Sum),
            root,
        };
        let results = std::thread::scope(|s| {
            let handles: Vec<_> = peers
                .iter()
                .map(|peers| {
                    let procs = &procs;
                    s.spawn(move || {
                        let me = crate::process::Peers::index(peers);
                        let mut data: Vec<u8> =
                            values(me).iter().flat_map(|v| v.to_le_bytes()).collect();
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
                        let done = match root {
                            Some(r) => b.broadcast(&mut data, r),
                            None => b.all_reduce(&mut data, &mut extra, 4),
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

    /// The sum of the first `n` processes' values.
    fn sum(n: usize) -> Vec<f32> {
        let all: Vec<Vec<f32>> = (0..n).map(values).collect();
        (0..ELEMS).map(|i| all.iter().map(|v| v[i]).sum()).collect()
    }

    #[test]
    fn a_large_all_reduce_on_machines_of_two_sends_half_as_much_across_them() {
        const { assert!(ELEMS * 4 > ONE_ROUND) };
        let machines = ["a", "b", "a", "b"];
        let (grouped, grouped_across) = run(&machines, &machines, None);
        // The flat algorithm, on the same placement: processes that do not say where
        // they run.
        let (flat, flat_across) = run(&["x"; 4], &machines, None);
        let want = sum(4);
        for r in grouped.iter().chain(&flat) {
            assert_eq!(r, &want);
        }
        for p in 0..4 {
            // Flat: a quarter of the data to each of 2 processes elsewhere, twice (len);
            // grouped: half of this process's half, twice (len / 2). Plus headers.
            let len = (ELEMS * 4) as u64;
            assert!(flat_across[p] >= len, "flat {flat_across:?}");
            assert!(
                grouped_across[p] <= len / 2 + 1024,
                "grouped {grouped_across:?} flat {flat_across:?}"
            );
        }
    }

    #[test]
    fn a_large_all_reduce_on_machines_of_unequal_sizes_goes_through_their_leaders() {
        let machines = ["a", "a", "b", "a"];
        let (results, across) = run(&machines, &machines, None);
        let want = sum(4);
        for r in &results {
            assert_eq!(r, &want);
        }
        // Only the leaders (0 and 2) send across machines, each its data once in the
        // leaders' reduce-scatter and once in their all-gather (half of it each time).
        let len = (ELEMS * 4) as u64;
        assert_eq!(across[1], 0);
        assert_eq!(across[3], 0);
        assert!(
            across[0] <= len + 1024 && across[2] <= len + 1024,
            "{across:?}"
        );
    }

    #[test]
    fn a_large_broadcast_crosses_to_each_other_machine_once() {
        let machines = ["a", "b", "a", "b", "b"];
        let (results, across) = run(&machines, &machines, Some(2));
        for r in &results {
            assert_eq!(r, &values(2));
        }
        let len = (ELEMS * 4) as u64;
        // The root sends machine b's first process the data, once; nobody else crosses.
        assert!(across[2] >= len && across[2] <= len + 1024, "{across:?}");
        assert_eq!(across.iter().sum::<u64>(), across[2]);
    }
}
