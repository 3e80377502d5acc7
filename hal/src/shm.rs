//! A step exchange in POSIX shared memory, for parties in several processes of one
//! machine: each party posts its data in its own slot, the others read it, and steps
//! follow one another in lockstep. The collectives use it between the processes of a
//! machine, and the simulated NPU's collective library (`simccl`) between its ranks in
//! several processes; any backend whose library meets in host memory may.
//!
//! The segment is a file under `/dev/shm` (the temporary folder where there is none),
//! named by [`Exchange::fresh_name`] in one process and handed to the others. Every
//! party joins it ([`Exchange::join`]); once all have, the process holding party 0
//! removes the name, so nothing is left behind however the processes end. Its layout:
//!
//! ```text
//! header   magic, parties, slot bytes, parties joined
//! record   per party, on cache lines of their own:
//!            step posted, pid, broken | what it posted with an even step (8 words)
//!            | with an odd step (8 words) | step done
//! slots    per party: `slot` bytes, 64-byte aligned
//! ```
//!
//! The protocol, step `s` (steps start at 1): a party waits until every party is done
//! with step `s − 1` (its slot is then free), writes its slot, and posts `s` with eight
//! words describing what it posted; it waits for the parties it reads to post `s`,
//! compares their words with its own (different ones: the parties disagree), reads
//! their slots, and marks itself done with `s`. A party that fails marks itself broken,
//! and every wait of every other party then ends at once. Waits spin briefly, then
//! yield, then sleep a little, and end at their deadline naming the parties missing.
//!
//! Parties may also run one step ahead (double buffering): a party that writes step `s`
//! once every party is done with `s − 2`, into the half of its slot that step `s − 2`
//! used, can fill the next step while the others still read this one. The words of a
//! party's last two steps are kept apart for that ([`Exchange::words`] takes the step).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// The words a party posts with its data, which every reader compares with its own.
pub type Words = [u64; 8];

/// `b"xpu-shm2"`: an initialised segment.
const MAGIC: u64 = u64::from_le_bytes(*b"xpu-shm2");
/// A segment whose first party is initialising it.
const INITIALISING: u64 = u64::MAX;

const HEADER: usize = 64;
const RECORD: usize = 256;
// Header words.
const H_MAGIC: usize = 0;
const H_PARTIES: usize = 8;
const H_SLOT: usize = 16;
const H_JOINED: usize = 24;
// Record fields, by byte offset.
const R_POSTED: usize = 0;
const R_PID: usize = 8;
const R_BROKEN: usize = 16;
/// The words of even steps; those of odd ones follow on the next cache line.
const R_WORDS: usize = 64;
const R_DONE: usize = 192;

/// The most parties an exchange has (far above any machine's processes or devices).
pub const MAX_PARTIES: usize = 4096;

/// What a wait is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The parties have posted this step.
    Posted(u64),
    /// The parties are done with this step.
    Done(u64),
}

/// Why a wait ended without its parties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The deadline passed; these parties had not come.
    Deadline(Vec<usize>),
    /// A party had failed (or was aborted) and marked itself broken, with its reason's
    /// code; `missing` had not reached what the wait was for.
    Broken {
        /// The broken party.
        party: usize,
        /// The code it gave ([`Exchange::set_broken`]).
        why: u64,
        /// The parties waited for that had not come.
        missing: Vec<usize>,
    },
    /// The caller's own condition said to stop (an abort here).
    Cancelled,
}

/// One process's mapping of a step exchange.
pub struct Exchange {
    base: *mut u8,
    len: usize,
    parties: usize,
    slot: usize,
    data: usize,
}

// SAFETY: the mapping is shared memory reached through atomics (header and records)
// or under the step protocol (slots: written only by their party while no one reads
// them); the pointer may move between threads.
unsafe impl Send for Exchange {}
// SAFETY: as above.
unsafe impl Sync for Exchange {}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("parties", &self.parties)
            .field("slot", &self.slot)
            .finish()
    }
}

impl Exchange {
    /// A name no exchange uses yet, starting with `prefix` (letters, digits and `-`):
    /// a path under `/dev/shm`, or the temporary folder where there is none.
    pub fn fresh_name(prefix: &str) -> PathBuf {
        use std::sync::atomic::AtomicU64 as Counter;
        static COUNTER: Counter = Counter::new(0);
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        dir.join(format!(
            "{prefix}{}-{nanos}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Whether `path` is a name [`Exchange::fresh_name`] could have made with `prefix`:
    /// absolute, no `..`, a file name of the prefix then letters, digits and `-`. For
    /// names that come from another process.
    pub fn is_fresh_name(path: &Path, prefix: &str) -> bool {
        path.is_absolute()
            && path
                .components()
                .all(|c| !matches!(c, std::path::Component::ParentDir))
            && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_prefix(prefix).is_some_and(|rest| {
                    !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                })
            })
    }

    /// Joins the exchange at `path` of `parties` parties with slots of `slot` bytes, as
    /// the parties `mine` (this process's): maps it (creating it if this process is the
    /// first), checks that every process agrees on its shape, registers this process's
    /// parties and waits until every party has joined, or fails with a timeout naming
    /// those that did not within `timeout`. The process holding party 0 then removes
    /// the name.
    pub fn join(
        path: &Path,
        parties: usize,
        slot: usize,
        mine: &[usize],
        timeout: Duration,
    ) -> Result<Exchange> {
        if parties == 0 || parties > MAX_PARTIES || mine.iter().any(|&p| p >= parties) {
            return Err(Error::invalid(format!(
                "a shared-memory exchange of {parties} parties joined as {mine:?}; give 1 to {MAX_PARTIES} parties and this process's among them"
            )));
        }
        let ex = Exchange::map(path, parties, slot.next_multiple_of(64))?;
        let joined = ex.register(mine, timeout);
        if joined.is_err() || mine.contains(&0) {
            // Every party has mapped it (or the group failed): the name is not needed.
            let _ = std::fs::remove_file(path);
        }
        joined.map(|()| ex)
    }

    fn map(path: &Path, parties: usize, slot: usize) -> Result<Exchange> {
        let data = (HEADER + parties * RECORD).next_multiple_of(4096);
        let len = parties
            .checked_mul(slot)
            .and_then(|s| s.checked_add(data))
            .ok_or_else(|| Error::invalid("a shared-memory exchange that large does not fit"))?;
        let what = |doing: &str, e: std::io::Error| {
            Error::unavailable(
                "shared memory",
                format!("could not {doing} {}: {e}", path.display()),
            )
        };
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
        }
        .map_err(|e| what("open", e))?;
        // Every process sets the same length, so their order does not matter.
        file.set_len(len as u64).map_err(|e| what("size", e))?;
        use std::os::fd::AsRawFd;
        // SAFETY: maps `len` bytes of an open file just sized to `len`, shared, readable
        // and writable; the result is checked before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(what("map", std::io::Error::last_os_error()));
        }
        Ok(Exchange {
            base: base.cast(),
            len,
            parties,
            slot,
            data,
        })
    }

    /// Initialises or checks the header, registers `mine`, and waits for every party.
    fn register(&self, mine: &[usize], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let magic = self.word(H_MAGIC);
        if magic
            .compare_exchange(0, INITIALISING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.word(H_PARTIES)
                .store(self.parties as u64, Ordering::Relaxed);
            self.word(H_SLOT).store(self.slot as u64, Ordering::Relaxed);
            magic.store(MAGIC, Ordering::Release);
        }
        let mut backoff = Backoff::default();
        while magic.load(Ordering::Acquire) != MAGIC {
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    message:
                        "the shared memory was never initialised by the process that created it"
                            .to_string(),
                });
            }
            backoff.pause();
        }
        let (parties, slot) = (
            self.word(H_PARTIES).load(Ordering::Relaxed),
            self.word(H_SLOT).load(Ordering::Relaxed),
        );
        if parties != self.parties as u64 || slot != self.slot as u64 {
            return Err(Error::invalid(format!(
                "the processes disagree on the shared memory: another joined {parties} parties with {slot}-byte slots, this one {} with {}",
                self.parties, self.slot
            )));
        }
        let pid = u64::from(std::process::id());
        for &p in mine {
            if self
                .record(p, R_PID)
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return Err(Error::invalid(format!(
                    "party {p} of the shared memory has joined already (process {}); give each party to one process",
                    self.pid(p)
                )));
            }
            self.word(H_JOINED).fetch_add(1, Ordering::AcqRel);
        }
        let mut backoff = Backoff::default();
        while self.word(H_JOINED).load(Ordering::Acquire) < self.parties as u64 {
            if Instant::now() >= deadline {
                let missing: Vec<usize> = (0..self.parties).filter(|&q| self.pid(q) == 0).collect();
                return Err(Error::Timeout {
                    message: format!(
                        "waited {timeout:?} for parties {missing:?} of {} to join the shared memory; every process must join",
                        self.parties
                    ),
                });
            }
            backoff.pause();
        }
        Ok(())
    }

    /// The number of parties.
    pub fn parties(&self) -> usize {
        self.parties
    }

    /// Bytes per slot.
    pub fn slot_len(&self) -> usize {
        self.slot
    }

    /// The process id of party `p` (0 before it joined).
    pub fn pid(&self, p: usize) -> u64 {
        self.record(p, R_PID).load(Ordering::Acquire)
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.data);
        // SAFETY: `offset` is 8-byte aligned and within the first `data` bytes of the
        // page-aligned mapping, which lives as long as `self`; shared words are only
        // ever accessed through atomics.
        unsafe { &*self.base.add(offset).cast::<AtomicU64>() }
    }

    fn record(&self, p: usize, field: usize) -> &AtomicU64 {
        self.word(HEADER + p.min(self.parties - 1) * RECORD + field)
    }

    /// The start of party `p`'s slot (64-byte aligned, `slot_len` bytes). Party `p`
    /// may write it between its wait for [`Until::Done`] of the step before and its
    /// [`Exchange::post`]; the others may read it between their wait for its post and
    /// their [`Exchange::done`].
    pub fn slot_ptr(&self, p: usize) -> *mut u8 {
        // SAFETY: the slot of a party below `parties` lies within the mapping.
        unsafe {
            self.base
                .add(self.data + p.min(self.parties - 1) * self.slot)
        }
    }

    /// The first `len` bytes of party `p`'s slot, to read.
    ///
    /// # Safety
    /// Party `p` has posted the current step and this party is not done with it: no one
    /// writes the slot while the slice lives.
    pub unsafe fn slot(&self, p: usize, len: usize) -> &[u8] {
        // SAFETY: within the mapping (at most `slot` bytes); the caller keeps writers
        // away.
        unsafe { std::slice::from_raw_parts(self.slot_ptr(p), len.min(self.slot)) }
    }

    /// Party `me` posts `step`, with `words` describing it.
    pub fn post(&self, me: usize, step: u64, words: &Words) {
        let at = Self::words_at(step);
        for (i, w) in words.iter().enumerate() {
            self.record(me, at + 8 * i).store(*w, Ordering::Relaxed);
        }
        self.record(me, R_POSTED).store(step, Ordering::Release);
    }

    /// What party `p` posted with `step` (read after waiting for that post, and before
    /// this party is done with the step, so that `p` cannot post `step + 2`).
    pub fn words(&self, p: usize, step: u64) -> Words {
        let at = Self::words_at(step);
        std::array::from_fn(|i| self.record(p, at + 8 * i).load(Ordering::Relaxed))
    }

    /// Where a record keeps the words of `step`.
    fn words_at(step: u64) -> usize {
        R_WORDS + 64 * (step % 2) as usize
    }

    /// Party `me` is done with `step`.
    pub fn done(&self, me: usize, step: u64) {
        self.record(me, R_DONE).store(step, Ordering::Release);
    }

    /// Party `me` failed, for a reason whose code is `why` (any value but 0, which
    /// reads as 1): every wait of every party ends.
    pub fn set_broken(&self, me: usize, why: u64) {
        self.record(me, R_BROKEN)
            .store(why.max(1), Ordering::Release);
    }

    /// The first party marked broken, if any, with its reason's code.
    pub fn broken(&self) -> Option<(usize, u64)> {
        (0..self.parties).find_map(|q| {
            let why = self.record(q, R_BROKEN).load(Ordering::Acquire);
            (why != 0).then_some((q, why))
        })
    }

    /// Whether party `p` has reached `until`.
    pub fn reached(&self, p: usize, until: Until) -> bool {
        match until {
            Until::Posted(s) => self.record(p, R_POSTED).load(Ordering::Acquire) >= s,
            Until::Done(s) => self.record(p, R_DONE).load(Ordering::Acquire) >= s,
        }
    }

    /// Waits until every party of `of` has reached `until`, a party is broken, `cancel`
    /// says to stop, or `deadline` passes. A broken party ends the wait even when the
    /// others have come: a party that gave up must not see the others go on. Waits as
    /// [`Backoff::default`] does.
    pub fn wait(
        &self,
        of: &[usize],
        until: Until,
        deadline: Instant,
        cancel: &dyn Fn() -> bool,
    ) -> std::result::Result<(), Stopped> {
        self.wait_with(of, until, deadline, cancel, Backoff::default())
    }

    /// [`Exchange::wait`], pausing between looks as `backoff` does.
    pub fn wait_with(
        &self,
        of: &[usize],
        until: Until,
        deadline: Instant,
        cancel: &dyn Fn() -> bool,
        mut backoff: Backoff,
    ) -> std::result::Result<(), Stopped> {
        let missing = |of: &[usize]| -> Vec<usize> {
            of.iter()
                .copied()
                .filter(|&q| !self.reached(q, until))
                .collect()
        };
        loop {
            if let Some((party, why)) = self.broken() {
                return Err(Stopped::Broken {
                    party,
                    why,
                    missing: missing(of),
                });
            }
            if of.iter().all(|&q| self.reached(q, until)) {
                return Ok(());
            }
            if cancel() {
                return Err(Stopped::Cancelled);
            }
            if Instant::now() >= deadline {
                return Err(Stopped::Deadline(missing(of)));
            }
            backoff.pause();
        }
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `map`; nothing uses it any more (its users
        // hold the exchange).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// How a waiter pauses between looks: it spins a number of times, then yields its core
/// at each look, then (unless told not to) sleeps 50 µs at each. The default spins
/// briefly, yields 4,000 times, then sleeps: waits that are usually short stay cheap,
/// and long ones leave the cores to others.
pub struct Backoff {
    calls: u32,
    spins: u32,
    yields: Option<u32>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            calls: 0,
            spins: 64,
            yields: Some(4000),
        }
    }
}

impl Backoff {
    /// Spins `spins` times, then yields at every look and never sleeps: for waiters
    /// that have a core each (spinning long keeps it; yielding it to a busy neighbour
    /// can cost a whole time slice) and for those whose peers need theirs.
    pub fn spin_then_yield(spins: u32) -> Self {
        Backoff {
            calls: 0,
            spins,
            yields: None,
        }
    }

    /// Waits a little, longer the more often it was called.
    pub fn pause(&mut self) {
        self.calls = self.calls.saturating_add(1);
        if self.calls <= self.spins {
            std::hint::spin_loop();
        } else if self
            .yields
            .is_none_or(|y| self.calls <= self.spins.saturating_add(y))
        {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parties_in_two_threads_post_read_and_step_in_lockstep() {
        let path = Exchange::fresh_name("xpu-shm-test-");
        let deadline = || Instant::now() + Duration::from_secs(30);
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2usize)
                .map(|me| {
                    let path = &path;
                    s.spawn(move || {
                        let ex =
                            Exchange::join(path, 2, 64, &[me], Duration::from_secs(30)).unwrap();
                        let mut total = 0;
                        for step in 1..=50u64 {
                            ex.wait(&[0, 1], Until::Done(step - 1), deadline(), &|| false)
                                .unwrap();
                            // SAFETY: this party's slot, free until it posts.
                            unsafe { *ex.slot_ptr(me).cast::<u64>() = step * (me as u64 + 1) };
                            ex.post(me, step, &[step; 8]);
                            ex.wait(&[0, 1], Until::Posted(step), deadline(), &|| false)
                                .unwrap();
                            assert_eq!(ex.words(1 - me, step), [step; 8]);
                            for q in 0..2 {
                                // SAFETY: posted, and this party is not done yet.
                                let b = unsafe { ex.slot(q, 8) };
                                total += u64::from_le_bytes(b.try_into().unwrap());
                            }
                            ex.done(me, step);
                        }
                        total
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want: u64 = (1..=50).map(|s| s * 3).sum();
        assert_eq!(sums, vec![want, want]);
        assert!(!path.exists(), "the name is removed once all joined");
    }

    #[test]
    fn parties_one_step_ahead_keep_each_steps_words_and_half_slot() {
        let path = Exchange::fresh_name("xpu-shm-test-");
        let deadline = || Instant::now() + Duration::from_secs(30);
        const HALF: usize = 64;
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..2usize)
                .map(|me| {
                    let path = &path;
                    s.spawn(move || {
                        let ex = Exchange::join(path, 2, 2 * HALF, &[me], Duration::from_secs(30))
                            .unwrap();
                        let half = |step: u64| HALF * (step % 2) as usize;
                        for step in 1..=200u64 {
                            // Double buffering: this half was last used two steps ago.
                            ex.wait(
                                &[0, 1],
                                Until::Done(step.saturating_sub(2)),
                                deadline(),
                                &|| false,
                            )
                            .unwrap();
                            let value = step * 10 + me as u64;
                            // SAFETY: this party's half for the step, free since every
                            // party is done with the step that used it last.
                            unsafe { *ex.slot_ptr(me).add(half(step)).cast::<u64>() = value };
                            ex.post(me, step, &[value; 8]);
                            let other = 1 - me;
                            ex.wait(&[other], Until::Posted(step), deadline(), &|| false)
                                .unwrap();
                            let want = step * 10 + other as u64;
                            assert_eq!(ex.words(other, step), [want; 8]);
                            // SAFETY: posted, and this party is not done with the step.
                            let got = unsafe { *ex.slot_ptr(other).add(half(step)).cast::<u64>() };
                            assert_eq!(got, want);
                            ex.done(me, step);
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
        });
    }

    #[test]
    fn a_party_alone_times_out_and_a_broken_one_ends_every_wait() {
        let path = Exchange::fresh_name("xpu-shm-test-");
        let e = Exchange::join(&path, 3, 64, &[0], Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("[1, 2]"), "{e}");
        assert!(!path.exists());
        let path = Exchange::fresh_name("xpu-shm-test-");
        let ex = Exchange::join(&path, 1, 64, &[0], Duration::from_secs(5)).unwrap();
        ex.set_broken(0, 3);
        let far = Instant::now() + Duration::from_secs(30);
        assert_eq!(
            ex.wait(&[0], Until::Posted(1), far, &|| false),
            Err(Stopped::Broken {
                party: 0,
                why: 3,
                missing: vec![0]
            })
        );
    }

    #[test]
    fn names_from_elsewhere_are_checked() {
        let good = Exchange::fresh_name("xpu-x-");
        assert!(Exchange::is_fresh_name(&good, "xpu-x-"));
        for bad in [
            "/etc/passwd",
            "relative/xpu-x-1",
            "/dev/shm/xpu-x-",
            "/dev/shm/../xpu-x-1",
            "/dev/shm/xpu-x-1/../a",
        ] {
            assert!(!Exchange::is_fresh_name(Path::new(bad), "xpu-x-"), "{bad}");
        }
    }
}
