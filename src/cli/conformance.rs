//! `xpu conformance`: the conformance suite over the selected devices.

use std::io::Write;
use std::path::PathBuf;
use std::str::FromStr;

use xpu::{DeviceSelector, Error, Registry, Result};
use xpu_conformance::{Certificate, Expectations, Profile, RunContext, RunOptions, Status};

/// What `xpu conformance` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Which devices.
    pub selector: DeviceSelector,
    /// Which profile.
    pub profile: String,
    /// Where to write the JSON report.
    pub json: Option<PathBuf>,
    /// Where to write the JUnit XML report.
    pub junit: Option<PathBuf>,
    /// Extra expected failures.
    pub expectations: Vec<PathBuf>,
    /// Only case instances whose name contains this.
    pub filter: Option<String>,
    /// List the cases instead of running them.
    pub list: bool,
    /// Backends that must have at least one device in the run.
    pub required: Vec<String>,
    /// Where to write a certificate of the run.
    pub certificate: Option<PathBuf>,
    /// A certificate to check by running its profile again.
    pub check_certificate: Option<PathBuf>,
    /// How long one case may run before it is a failure.
    pub case_timeout: std::time::Duration,
}

fn write_file(path: &PathBuf, text: &str, what: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| {
        Error::invalid(format!(
            "could not write the {what} to {}: {e}",
            path.display()
        ))
    })
}

/// Runs the suite; `Ok(true)` when every case passed, was skipped or failed as
/// expected.
pub fn run(registry: &Registry, options: &Options) -> Result<bool> {
    let checked = match &options.check_certificate {
        Some(path) => Some(Certificate::read(path).map_err(Error::invalid)?),
        None => None,
    };
    let profile_name = checked
        .as_ref()
        .map_or(options.profile.as_str(), |c| c.profile.as_str());
    let profile = Profile::from_str(profile_name)?;
    let devices = registry.devices(&options.selector)?;
    let unmet = xpu_conformance::check_required(&options.required, &devices, &registry.backends());
    if devices.is_empty() && unmet.is_empty() {
        return Err(Error::invalid(format!(
            "the selector `{}` picks no device; run `xpu devices` to see what is available",
            options.selector
        )));
    }
    if options.list {
        for case in xpu_conformance::cases(profile) {
            println!("{:<40} {}", case.name, case.description);
        }
        return Ok(true);
    }
    let mut expectations = Expectations::builtin();
    for path in &options.expectations {
        expectations.merge(Expectations::from_json_file(path)?);
    }
    let mut run_options = RunOptions::new(profile);
    run_options.expectations = expectations;
    run_options.filter = options.filter.clone();
    run_options.case_timeout = options.case_timeout;

    println!(
        "conformance profile `{profile_name}` on {} device(s): {}",
        devices.len(),
        devices
            .iter()
            .map(|d| d.id().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut stdout = std::io::stdout();
    let mut print = |r: &xpu_conformance::CaseResult| {
        let tag = match r.status {
            Status::Pass => "ok",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
            Status::Xfail => "xfail",
            Status::Xpass => "XPASS",
        };
        let reason = r
            .reason
            .as_deref()
            .map(|s| format!(" ({s})"))
            .unwrap_or_default();
        let _ = writeln!(stdout, "{tag:<5} {}{reason}", r.display_name());
    };
    let mut report = xpu_conformance::run(&devices, &run_options, &mut print);
    let diagnostics = xpu_conformance::diagnostics_results(&registry.diagnostics());
    for r in unmet.into_iter().chain(diagnostics) {
        print(&r);
        report.push(r);
    }
    if let Some(path) = &options.json {
        let text = report
            .to_json()
            .map_err(|e| Error::backend_message("xpu", e.to_string()))?;
        write_file(path, &text, "JSON report")?;
    }
    if let Some(path) = &options.junit {
        let text = report
            .to_junit()
            .map_err(|e| Error::backend_message("xpu", e.to_string()))?;
        write_file(path, &text, "JUnit report")?;
    }
    let failures: Vec<_> = report.failures().collect();
    if !failures.is_empty() {
        println!();
        println!("failures:");
        for r in &failures {
            println!(
                "  {}: {}",
                r.display_name(),
                r.reason.as_deref().unwrap_or("(no message)")
            );
        }
    }
    println!();
    for (backend, verdict) in &report.backends {
        println!(
            "backend {backend}: {} the `{}` profile ({})",
            if verdict.passed { "passed" } else { "FAILED" },
            profile_name,
            verdict.summary
        );
    }
    println!("{}", report.closing_line());
    if options.certificate.is_none() && checked.is_none() {
        return Ok(report.success());
    }
    let suite = xpu_conformance::all_cases();
    let context = RunContext {
        xpu_version: env!("CARGO_PKG_VERSION"),
        host_plugin_abi: xpu::plugin::HOST_ABI_VERSION,
        command: std::env::args().collect(),
        profile: profile_name,
        suite: &suite,
    };
    let certificate = Certificate::new(&report, &devices, &context);
    if let Some(path) = &options.certificate {
        let text = certificate
            .to_json()
            .map_err(|e| Error::backend_message("xpu", e))?;
        write_file(path, &text, "certificate")?;
        println!(
            "certificate written to {} ({}; suite {})",
            path.display(),
            if certificate.passed {
                "passed"
            } else {
                "NOT passed: the failures above are in it"
            },
            certificate.suite_sha256
        );
    }
    let Some(checked) = checked else {
        return Ok(report.success());
    };
    let differences = checked.differences(&certificate);
    println!();
    if differences.is_empty() {
        println!(
            "the certificate of {} (xpu {}, suite {}) is confirmed: the same devices gave every certified result again",
            checked.issued, checked.xpu_version, checked.suite_sha256
        );
        Ok(report.success())
    } else {
        println!(
            "the certificate of {} (xpu {}) is NOT confirmed:",
            checked.issued, checked.xpu_version
        );
        for d in &differences {
            println!("  {d}");
        }
        Ok(false)
    }
}
