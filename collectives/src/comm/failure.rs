//! How a communicator fails: timeouts that name the ranks that never arrived, refusals
//! of invalid arguments reported on every rank, and the failed state that makes every
//! later call return the same error at once.

use super::*;

impl Shared {
    pub(super) fn timeout_error(&self, st: &State, seq: u64) -> Error {
        let Some(pending) = st.pending.as_ref().filter(|p| p.seq == seq) else {
            return Error::Timeout {
                message: format!(
                    "operation #{seq} did not finish within {:?}",
                    self.options.timeout
                ),
            };
        };
        let what = pending
            .arrivals
            .iter()
            .flatten()
            .find_map(|a| a.desc.as_ref().ok())
            .map_or_else(|| "the operation".to_string(), |d| d.to_string());
        let missing: Vec<usize> = pending
            .arrivals
            .iter()
            .enumerate()
            .filter(|(_, a)| a.is_none())
            .map(|(r, _)| r)
            .collect();
        self.timeout_message(&what, seq, &missing)
    }

    /// The timeout of operation `seq` (`what`) that the ranks `missing` never called.
    pub(super) fn timeout_message(&self, what: &str, seq: u64, missing: &[usize]) -> Error {
        let names: Vec<String> = missing.iter().map(|&r| self.rank_name(r)).collect();
        let waited: Vec<String> = (0..self.devices.len())
            .filter(|r| !missing.contains(r))
            .map(|r| r.to_string())
            .collect();
        Error::Timeout {
            message: format!(
                "{what} #{seq} timed out after {:.1} s: {} never called it (ranks {} waited); the communicator is now failed: abort it and make a new one",
                self.options.timeout.as_secs_f64(),
                names.join(", "),
                waited.join(", ")
            ),
        }
    }

    /// The error of operation `seq` on every rank when `rank` refused it (`why`), or did
    /// not run it (`why` is `Aborted`: its stream skipped it).
    pub(super) fn refused(&self, seq: u64, rank: usize, why: Option<&Error>) -> Error {
        if let Some(e @ Error::Aborted { .. }) = why {
            return Error::aborted(format!(
                "operation #{seq} failed on every rank because {} did not run it: {e}",
                self.rank_name(rank)
            ));
        }
        Error::invalid(format!(
            "operation #{seq} was refused on every rank because {} passed invalid arguments{}",
            self.rank_name(rank),
            why.map_or_else(String::new, |e| format!(": {e}"))
        ))
    }

    /// Fails the communicator with `error` (keeping an earlier failure).
    pub(super) fn set_failed(&self, st: &mut State, error: Error) {
        st.failed.get_or_insert(error);
        self.failed_flag.store(true, Ordering::Release);
    }

    /// Fails the communicator with `error` and wakes every waiting rank.
    pub(super) fn fail(&self, error: Error) {
        let mut st = self.lock();
        self.set_failed(&mut st, error);
        drop(st);
        self.arrived.notify_all();
    }

    /// Whether the communicator was aborted or failed (read without the lock).
    pub(super) fn stopping(&self) -> bool {
        self.aborted.load(Ordering::Acquire) || self.failed_flag.load(Ordering::Acquire)
    }

    /// Why the communicator can no longer be used.
    pub(super) fn failure(&self) -> Error {
        let st = self.lock();
        match self.check_failed(&st) {
            Err(e) => e,
            Ok(()) => Error::aborted("the communicator failed"),
        }
    }
}
