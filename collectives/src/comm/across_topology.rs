//! The topology of a communicator across processes: every process's devices, named
//! `ID@pQ`, with their process and machine, so that links between processes are
//! [`LinkClass::CrossProcess`](crate::topology::LinkClass::CrossProcess) within a
//! machine and [`LinkClass::Network`](crate::topology::LinkClass::Network) between
//! machines; and the measurement of those links over the communicator's own transport
//! ([`crate::process::links`]).

use std::time::Instant;

use xpu_hal::{Error, Result};

use super::Communicator;
use crate::process::links::{self, Measured, LINKS_TAG};
use crate::process::swap_with_all;
use crate::process::{Incomplete, ProcessInfo};
use crate::topology::{TopoDevice, Topology};

/// The tag on which the processes share what they measured.
const SHARE_TAG: u32 = LINKS_TAG + 1;

/// The topology over every process's devices (`topo[q]`: process `q`'s, in rank order),
/// on this machine's host description (`local`'s).
pub(super) fn global(
    local: &Topology,
    procs: &[ProcessInfo],
    topo: Vec<Vec<TopoDevice>>,
) -> Topology {
    let mut hosts: Vec<&str> = Vec::new();
    let mut devices = Vec::new();
    for (q, (p, mine)) in procs.iter().zip(topo).enumerate() {
        let node = match hosts.iter().position(|h| *h == p.host) {
            Some(i) => i,
            None => {
                hosts.push(&p.host);
                hosts.len() - 1
            }
        };
        for mut d in mine {
            d.id = format!("{}@p{q}", d.id);
            d.process = q as u32;
            d.node = node as u32;
            devices.push(d);
        }
    }
    Topology::from_parts(local.host.clone(), devices)
}

fn failed(what: &str, e: Incomplete) -> Error {
    Error::Timeout {
        message: format!(
            "measuring the links between processes failed while {what}: {e:?}; every process must call calibrate_processes, in the same order as its other operations"
        ),
    }
}

impl Communicator {
    /// The topology over every rank. For a communicator across processes: every
    /// process's devices (named `ID@pQ`, in rank order), their processes and machines,
    /// with the links between processes estimated from their class until
    /// [`Communicator::calibrate_processes`] measures them. Within one process: the
    /// topology the algorithms are chosen from ([`Communicator::topology`]).
    pub fn global_topology(&self) -> Topology {
        match &self.span {
            Some(span) => span
                .topology
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            None => self.shared.topology.clone(),
        }
    }

    /// Measures the path between every pair of processes over the communicator's own
    /// transport — 8-byte messages for the latency, `bytes`-byte ones for the
    /// bandwidth — and puts the figures on the links between their devices in
    /// [`Communicator::global_topology`]. Every process must call it, as it calls an
    /// operation. Returns every pair's figures; none within one process.
    pub fn calibrate_processes(&self, bytes: usize) -> Result<Vec<Measured>> {
        let Some(span) = &self.span else {
            return Ok(Vec::new());
        };
        let peers = &*span.peers;
        let n = peers.count();
        let deadline = Instant::now() + span.timeout;
        let mine = links::measure(peers, bytes, deadline).map_err(|e| failed("measuring", e))?;
        // Lengths first, then each process's pairs.
        let encoded = links::encode(&mine);
        let len = (encoded.len() as u64).to_le_bytes().to_vec();
        let lens = swap_with_all(peers, SHARE_TAG, len, vec![8; n], deadline)
            .map_err(|e| failed("sharing their sizes", e))?;
        let sizes = lens
            .iter()
            .enumerate()
            .map(|(q, l)| {
                let word: [u8; 8] = l.as_slice().try_into().unwrap_or([0; 8]);
                let len = usize::try_from(u64::from_le_bytes(word)).unwrap_or(usize::MAX);
                match q == span.me {
                    true => Ok(0),
                    false if len <= 32 * n => Ok(len),
                    false => Err(Error::invalid(format!(
                        "process {q} measured {len} bytes of pairs; is it running the same program?"
                    ))),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let theirs = swap_with_all(peers, SHARE_TAG, encoded, sizes, deadline)
            .map_err(|e| failed("sharing the figures", e))?;
        let mut all = mine.clone();
        for (q, bytes) in theirs.iter().enumerate().filter(|(q, _)| *q != span.me) {
            let pairs = links::decode(bytes).ok_or_else(|| {
                Error::invalid(format!("process {q} sent figures this process cannot read"))
            })?;
            all.extend(pairs.into_iter().filter(|m| m.a == q));
        }
        all.retain(|m| m.a < m.b && m.b < n);
        all.sort_by_key(|m| (m.a, m.b));
        all.dedup_by_key(|m| (m.a, m.b));
        let mut topology = span.topology.lock().unwrap_or_else(|p| p.into_inner());
        let ranks = |q: usize| {
            let p = &span.procs[q];
            p.first_rank..p.first_rank + p.ranks()
        };
        for m in &all {
            for i in ranks(m.a) {
                for j in ranks(m.b) {
                    topology.set_measured(i, j, m.latency_us, m.bandwidth_gbps)?;
                    topology.set_measured(j, i, m.latency_us, m.bandwidth_gbps)?;
                }
            }
        }
        Ok(all)
    }
}
