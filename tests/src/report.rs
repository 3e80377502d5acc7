//! The result of a run: one [`CaseResult`] per case and device, a [`Summary`], and
//! the report formats (JSON, JUnit XML, a closing line).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};
use serde::{Deserialize, Serialize};

use crate::case::instance_name;

/// How one case went on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Met the contract.
    Pass,
    /// Did not meet the contract, and no expectation covers it. Fails the run.
    Fail,
    /// Could not run on this device; the reason names what is missing.
    Skip,
    /// Failed, as an expectation says it does.
    Xfail,
    /// Passed although an expectation says it fails: the expectation is stale. Fails
    /// the run.
    Xpass,
}

impl Status {
    /// The lowercase name (`"pass"`, `"xfail"` …), as in the JSON report.
    pub const fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Skip => "skip",
            Status::Xfail => "xfail",
            Status::Xpass => "xpass",
        }
    }

    /// Whether this status fails the run (`fail` and `xpass`).
    pub const fn is_failure(self) -> bool {
        matches!(self, Status::Fail | Status::Xpass)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The result of one case on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    /// The case's name (`copy.h2d_offsets`).
    pub case: String,
    /// The device's id (`host:0`).
    pub device: String,
    /// The device's backend (`host`).
    pub backend: String,
    /// How it went.
    pub status: Status,
    /// For every status but `pass`: the failure message, the skip reason, or the
    /// expectation's reason.
    pub reason: Option<String>,
    /// Wall time of the case in seconds (`duration` in the JSON report).
    #[serde(rename = "duration")]
    pub duration_s: f64,
}

impl CaseResult {
    /// `[backend/device] case`, as test harnesses print it.
    pub fn display_name(&self) -> String {
        instance_name(&self.backend, &self.device, &self.case)
    }
}

/// Counts of each status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Cases that passed.
    pub passed: usize,
    /// Cases that failed unexpectedly.
    pub failed: usize,
    /// Cases skipped for a missing capability or resource.
    pub skipped: usize,
    /// Cases that failed as expected.
    pub xfail: usize,
    /// Cases that passed although expected to fail.
    pub xpass: usize,
}

impl Summary {
    /// Counts the statuses of `results`.
    pub fn of(results: &[CaseResult]) -> Self {
        let mut s = Summary::default();
        for r in results {
            s.add(r.status);
        }
        s
    }

    /// Counts one more result.
    pub fn add(&mut self, status: Status) {
        match status {
            Status::Pass => self.passed += 1,
            Status::Fail => self.failed += 1,
            Status::Skip => self.skipped += 1,
            Status::Xfail => self.xfail += 1,
            Status::Xpass => self.xpass += 1,
        }
    }

    /// Every result counted.
    pub fn total(&self) -> usize {
        self.passed + self.failed + self.skipped + self.xfail + self.xpass
    }
}

/// `N passed, N failed, N skipped`, then `, N xfail` and `, N xpass` when not zero.
impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )?;
        if self.xfail > 0 {
            write!(f, ", {} xfail", self.xfail)?;
        }
        if self.xpass > 0 {
            write!(f, ", {} xpass", self.xpass)?;
        }
        Ok(())
    }
}

/// A report could not be written out.
#[derive(Debug, Clone)]
pub struct ReportError(String);

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot write the conformance report: {}", self.0)
    }
}

impl std::error::Error for ReportError {}

/// How one backend did in a run: whether it passed the profile (no `fail`, no
/// `xpass`; skips and expected failures allowed) and its counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendVerdict {
    /// Whether the backend passed the run's profile.
    pub passed: bool,
    /// Its counts.
    pub summary: Summary,
}

/// Everything a run found. Serializes to JSON with the top-level keys `profile`,
/// `results`, `summary` and `backends` (a [`BackendVerdict`] per backend: which
/// backends passed the profile).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The profile that ran (`core` …), when known.
    #[serde(default)]
    pub profile: String,
    /// One entry per case and device, in the order they ran.
    pub results: Vec<CaseResult>,
    /// The counts of each status.
    pub summary: Summary,
    /// The verdict per backend.
    #[serde(default)]
    pub backends: BTreeMap<String, BackendVerdict>,
}

impl Report {
    /// A report of `results`, with the summary and verdicts counted from them.
    pub fn from_results(results: Vec<CaseResult>) -> Self {
        let mut report = Report::default();
        for r in results {
            report.push(r);
        }
        report
    }

    /// Adds one result and counts it.
    pub fn push(&mut self, result: CaseResult) {
        self.summary.add(result.status);
        let verdict = self
            .backends
            .entry(result.backend.clone())
            .or_insert(BackendVerdict {
                passed: true,
                summary: Summary::default(),
            });
        verdict.summary.add(result.status);
        verdict.passed &= !result.status.is_failure();
        self.results.push(result);
    }

    /// Whether the run succeeded: no `fail` and no `xpass`.
    pub fn success(&self) -> bool {
        !self.results.iter().any(|r| r.status.is_failure())
    }

    /// The results that fail the run.
    pub fn failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.results.iter().filter(|r| r.status.is_failure())
    }

    /// The closing line: `N passed, N failed, N skipped`, then `, N xfail` and
    /// `, N xpass` when they are not zero.
    pub fn closing_line(&self) -> String {
        self.summary.to_string()
    }

    /// The report as pretty-printed JSON: `{"results": [...], "summary": {...}}`, with
    /// statuses written as `pass`, `fail`, `skip`, `xfail` and `xpass`.
    pub fn to_json(&self) -> Result<String, ReportError> {
        serde_json::to_string_pretty(self).map_err(|e| ReportError(e.to_string()))
    }

    /// Parses a report written by [`Report::to_json`].
    pub fn from_json(text: &str) -> Result<Self, ReportError> {
        serde_json::from_str(text).map_err(|e| ReportError(e.to_string()))
    }

    /// The report as JUnit XML: one `<testsuite>` per device (named by its id), one
    /// `<testcase>` per case. `fail` and `xpass` are `<failure>`s; `skip` and `xfail`
    /// are `<skipped>` with the reason as the message.
    pub fn to_junit(&self) -> Result<String, ReportError> {
        let mut suites: BTreeMap<&str, Vec<&CaseResult>> = BTreeMap::new();
        for r in &self.results {
            suites.entry(r.device.as_str()).or_default().push(r);
        }
        let mut junit = quick_junit::Report::new("xpu-conformance");
        let mut total = Duration::ZERO;
        for (device, results) in suites {
            let mut suite = TestSuite::new(device);
            let mut suite_time = Duration::ZERO;
            for r in results {
                let reason = r.reason.clone().unwrap_or_default();
                let status = match r.status {
                    Status::Pass => TestCaseStatus::success(),
                    Status::Fail => {
                        let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                        s.set_type("fail").set_message(reason);
                        s
                    }
                    Status::Xpass => {
                        let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                        s.set_type("xpass").set_message(reason);
                        s
                    }
                    Status::Skip => {
                        let mut s = TestCaseStatus::skipped();
                        s.set_type("skip").set_message(reason);
                        s
                    }
                    Status::Xfail => {
                        let mut s = TestCaseStatus::skipped();
                        s.set_type("xfail").set_message(reason);
                        s
                    }
                };
                let time = Duration::try_from_secs_f64(r.duration_s).unwrap_or_default();
                suite_time += time;
                let mut case = TestCase::new(r.case.as_str(), status);
                case.set_classname(format!("{}.{}", r.backend, r.device))
                    .set_time(time);
                suite.add_test_case(case);
            }
            suite.set_time(suite_time);
            total += suite_time;
            junit.add_test_suite(suite);
        }
        junit.set_time(total);
        junit.to_string().map_err(|e| ReportError(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(case: &str, device: &str, status: Status) -> CaseResult {
        CaseResult {
            case: case.to_string(),
            device: device.to_string(),
            backend: "host".to_string(),
            status,
            reason: (status != Status::Pass).then(|| format!("why <{case}> & \"so\"")),
            duration_s: 0.001,
        }
    }

    #[test]
    fn closing_line_starts_with_the_plain_counts() {
        let mut r = Report::default();
        r.push(result("a.b", "host:0", Status::Pass));
        r.push(result("a.c", "host:0", Status::Skip));
        assert_eq!(r.closing_line(), "1 passed, 0 failed, 1 skipped");
        r.push(result("a.d", "host:0", Status::Xfail));
        r.push(result("a.e", "host:0", Status::Xpass));
        assert_eq!(
            r.closing_line(),
            "1 passed, 0 failed, 1 skipped, 1 xfail, 1 xpass"
        );
        assert!(!r.success());
    }

    #[test]
    fn json_round_trips() {
        let r = Report::from_results(vec![
            result("a.b", "host:0", Status::Pass),
            result("a.b", "host:1", Status::Fail),
        ]);
        let text = r.to_json().unwrap();
        assert!(text.contains("\"status\": \"fail\""));
        assert_eq!(Report::from_json(&text).unwrap(), r);
    }

    #[test]
    fn junit_escapes_and_groups_by_device() {
        let r = Report::from_results(vec![
            result("a.b", "host:0", Status::Pass),
            result("a.c", "host:0", Status::Skip),
            result("a.b", "host:1", Status::Fail),
        ]);
        let xml = r.to_junit().unwrap();
        assert_eq!(xml.matches("<testsuite ").count(), 2);
        assert_eq!(xml.matches("<testcase ").count(), 3);
        assert_eq!(xml.matches("<failure").count(), 1);
        assert_eq!(xml.matches("<skipped").count(), 1);
        assert!(xml.contains("&lt;a.c&gt; &amp;"));
    }
}
