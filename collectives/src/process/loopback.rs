//! A transport between "processes" that are threads of one test process: every message
//! goes through a queue per sender, receiver and tag, and the bytes each process sends
//! each other are counted. It lets the tests run the steps between processes without
//! MPI, and measure what they send where.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::{GiveUp, Incomplete, Peers};

/// The messages in flight, by (sender, receiver, tag), oldest first.
type Queues = HashMap<(usize, usize, u32), VecDeque<Vec<u8>>>;

/// What the processes share: the queues and the byte counts.
#[derive(Default)]
pub(crate) struct Wire {
    queues: Mutex<Queues>,
    arrived: Condvar,
    /// Bytes sent, by (sender, receiver).
    sent: Mutex<HashMap<(usize, usize), u64>>,
}

impl Wire {
    /// `n` processes over one wire.
    pub fn processes(n: usize) -> (Arc<Wire>, Vec<Loopback>) {
        let wire = Arc::new(Wire::default());
        let peers = (0..n)
            .map(|me| Loopback {
                me,
                n,
                wire: Arc::clone(&wire),
            })
            .collect();
        (wire, peers)
    }

    /// The bytes `from` sent `to` so far.
    pub fn sent(&self, from: usize, to: usize) -> u64 {
        let sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        sent.get(&(from, to)).copied().unwrap_or(0)
    }

    fn push(&self, from: usize, to: usize, tag: u32, data: Vec<u8>) {
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        *sent.entry((from, to)).or_default() += data.len() as u64;
        drop(sent);
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.entry((from, to, tag)).or_default().push_back(data);
        self.arrived.notify_all();
    }

    /// The oldest message of `tag` from `from` to `to`, waiting until `deadline`.
    fn pop(&self, from: usize, to: usize, tag: u32, deadline: Instant) -> Option<Vec<u8>> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(m) = queues
                .get_mut(&(from, to, tag))
                .and_then(VecDeque::pop_front)
            {
                return Some(m);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            queues = self
                .arrived
                .wait_timeout(queues, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// One process's end of a [`Wire`].
pub(crate) struct Loopback {
    me: usize,
    n: usize,
    wire: Arc<Wire>,
}

impl Loopback {
    fn take(
        &self,
        tag: u32,
        peer: usize,
        data: &mut [u8],
        deadline: Instant,
    ) -> Result<(), Incomplete> {
        let Some(m) = self.wire.pop(peer, self.me, tag, deadline) else {
            return Err(Incomplete::Deadline { peers: vec![peer] });
        };
        if m.len() != data.len() {
            return Err(Incomplete::Failed {
                peer,
                message: format!("{} bytes came for a receive of {}", m.len(), data.len()),
                settled: true,
            });
        }
        data.copy_from_slice(&m);
        Ok(())
    }
}

impl Peers for Loopback {
    fn index(&self) -> usize {
        self.me
    }

    fn count(&self) -> usize {
        self.n
    }

    unsafe fn exchange(
        &self,
        tag: u32,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
        deadline: Instant,
        abort: &AtomicBool,
    ) -> Result<(), Incomplete> {
        for (to, data) in sends {
            self.wire.push(self.me, *to, tag, data.to_vec());
        }
        for (from, data) in recvs.iter_mut() {
            if abort.load(Ordering::Acquire) {
                return Err(Incomplete::AbortedHere);
            }
            self.take(tag, *from, data, deadline)?;
        }
        Ok(())
    }

    fn post(&self, tag: u32, peer: usize, data: Vec<u8>) -> Result<(), Incomplete> {
        self.wire.push(self.me, peer, tag, data);
        Ok(())
    }

    fn receive(
        &self,
        tag: u32,
        peer: usize,
        data: &mut Vec<u8>,
        deadline: Instant,
        _abort: &AtomicBool,
    ) -> Result<(), Incomplete> {
        self.take(tag, peer, data, deadline)
    }

    fn abort_others(&self, _why: GiveUp) {}

    fn swap_after_failure(
        &self,
        _tag: u32,
        _mine: &[u8],
        with: &[usize],
        _deadline: Instant,
        _arrived: &mut dyn FnMut(usize, &[u8]) -> Vec<usize>,
    ) -> Vec<Option<Vec<u8>>> {
        vec![None; with.len()]
    }

    fn subset(&self, _keep: &[usize]) -> xpu_hal::Result<Box<dyn Peers>> {
        Err(xpu_hal::Error::unsupported(
            "a loopback transport between threads makes no subsets",
        ))
    }
}
