//! The judging machinery on real devices: expectations turn failures into xfail and
//! passes into xpass (which fails the run), and the reports are well formed.

use std::sync::Arc;
use std::time::Duration;

use xpu_conformance::{
    run, run_cases, Case, CaseContext, CaseError, CaseOutcome, Expectation, Expectations, Profile,
    Report, RunOptions, Status,
};
use xpu_hal::{Device, DeviceSelector, Registry};
use xpu_host::{HostBackend, HostConfig};

fn host_devices(n: u32) -> xpu_hal::Result<Vec<Device>> {
    let mut registry = Registry::new();
    registry.register(Arc::new(HostBackend::new(HostConfig {
        devices: n,
        capacity: 64 << 20,
    })))?;
    registry.devices(&DeviceSelector::parse("host:*")?)
}

fn always_fails(_: &CaseContext) -> CaseOutcome {
    Err(CaseError::fail("expected 1, found 2"))
}

fn always_skips(_: &CaseContext) -> CaseOutcome {
    Err(CaseError::skip("device lacks the flux capacitor"))
}

fn panics(_: &CaseContext) -> CaseOutcome {
    std::panic::resume_unwind(Box::new("a backend panicked"))
}

fn hangs(_: &CaseContext) -> CaseOutcome {
    std::thread::sleep(Duration::from_secs(5));
    Ok(())
}

fn passes(ctx: &CaseContext) -> CaseOutcome {
    let a = ctx.device.allocate(8)?;
    let s = ctx.device.create_stream()?;
    s.write(&a, &[1; 8])?;
    if s.read(&a)? == [1; 8] {
        Ok(())
    } else {
        Err(CaseError::fail("read back differs"))
    }
}

const CUSTOM: &[Case] = &[
    Case::core("custom.fails", "always fails", always_fails),
    Case::core("custom.skips", "always skips", always_skips),
    Case::core("custom.passes", "writes and reads 8 bytes", passes),
];

fn options(expectations: Expectations) -> RunOptions {
    let mut o = RunOptions::new(Profile::Core);
    o.expectations = expectations;
    o
}

#[test]
fn an_expected_failure_that_passes_fails_the_run() {
    let devices = host_devices(2).unwrap();
    let mut exp = Expectations::none();
    exp.push(Expectation::new(
        "host",
        "copy.roundtrip",
        "pretend it is broken",
    ));
    let mut o = options(exp);
    o.filter = Some("copy.roundtrip".to_string());
    let mut seen = 0;
    let report = run(&devices, &o, |_| seen += 1);
    assert_eq!(seen, 2);
    assert_eq!(report.results.len(), 2);
    assert!(report.results.iter().all(|r| r.status == Status::Xpass));
    assert_eq!(report.summary.xpass, 2);
    assert!(!report.success());
    let reason = report.results[0].reason.as_deref().unwrap();
    assert!(reason.contains("pretend it is broken"), "{reason}");
    assert!(report
        .closing_line()
        .starts_with("0 passed, 0 failed, 0 skipped"));
    assert!(report.closing_line().ends_with(", 2 xpass"));
}

#[test]
fn an_expected_failure_that_fails_is_xfail_and_the_run_succeeds() {
    let devices = host_devices(1).unwrap();
    let mut exp = Expectations::none();
    exp.push(Expectation::new("host*", "custom.f*", "known bug 123"));
    let report = run_cases(CUSTOM, &devices, &options(exp), |_| {});
    let status = |name: &str| {
        report
            .results
            .iter()
            .find(|r| r.case == name)
            .map(|r| r.status)
            .unwrap()
    };
    assert_eq!(status("custom.fails"), Status::Xfail);
    assert_eq!(status("custom.skips"), Status::Skip);
    assert_eq!(status("custom.passes"), Status::Pass);
    assert!(report.success());
    let xfail = report
        .results
        .iter()
        .find(|r| r.case == "custom.fails")
        .unwrap();
    let reason = xfail.reason.as_deref().unwrap();
    assert!(
        reason.contains("known bug 123") && reason.contains("expected 1, found 2"),
        "{reason}"
    );
    assert_eq!(
        report.closing_line(),
        "1 passed, 0 failed, 1 skipped, 1 xfail"
    );
}

#[test]
fn an_unexpected_failure_fails_the_run_and_a_skip_keeps_its_reason() {
    let devices = host_devices(1).unwrap();
    let report = run_cases(CUSTOM, &devices, &options(Expectations::none()), |_| {});
    assert!(!report.success());
    assert_eq!(report.summary.failed, 1);
    let skip = report
        .results
        .iter()
        .find(|r| r.status == Status::Skip)
        .unwrap();
    assert_eq!(
        skip.reason.as_deref(),
        Some("device lacks the flux capacitor")
    );
    assert_eq!(skip.display_name(), "[host/host:0] custom.skips");
    assert_eq!(report.failures().count(), 1);
}

#[test]
fn a_panic_or_a_hang_is_a_failure_not_an_abort() {
    let devices = host_devices(1).unwrap();
    let cases = [
        Case::core("custom.panics", "panics", panics),
        Case::core("custom.hangs", "sleeps past the limit", hangs),
    ];
    let mut o = options(Expectations::none());
    o.case_timeout = Duration::from_millis(200);
    let report = run_cases(&cases, &devices, &o, |_| {});
    assert_eq!(report.summary.failed, 2);
    let reasons: Vec<&str> = report
        .results
        .iter()
        .map(|r| r.reason.as_deref().unwrap())
        .collect();
    assert!(reasons[0].contains("a backend panicked"), "{}", reasons[0]);
    assert!(reasons[1].contains("did not finish"), "{}", reasons[1]);
    assert!(report.results[1].duration_s < 2.0);
}

#[test]
fn json_report_parses_and_has_the_keys() {
    let devices = host_devices(2).unwrap();
    let report = run_cases(CUSTOM, &devices, &options(Expectations::none()), |_| {});
    let text = report.to_json().unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let obj = value.as_object().unwrap();
    assert!(obj.contains_key("results") && obj.contains_key("summary"));
    let results = obj["results"].as_array().unwrap();
    assert_eq!(results.len(), 6);
    for r in results {
        for key in ["case", "device", "backend", "status", "reason", "duration"] {
            assert!(r.get(key).is_some(), "result lacks {key}: {r}");
        }
        let status = r["status"].as_str().unwrap();
        assert!(["pass", "fail", "skip", "xfail", "xpass"].contains(&status));
    }
    let summary = &obj["summary"];
    assert_eq!(summary["passed"], 2);
    assert_eq!(summary["failed"], 2);
    assert_eq!(summary["skipped"], 2);
    assert_eq!(Report::from_json(&text).unwrap(), report);
}

#[test]
fn junit_report_is_well_formed() {
    let devices = host_devices(2).unwrap();
    let mut exp = Expectations::none();
    exp.push(Expectation::new(
        "host",
        "custom.fails",
        "known <bug> & \"co\"",
    ));
    let report = run_cases(CUSTOM, &devices, &options(exp), |_| {});
    let xml = report.to_junit().unwrap();
    assert!(xml.starts_with("<?xml"));
    assert_eq!(xml.matches("<testsuites").count(), 1);
    assert_eq!(xml.matches("<testsuite ").count(), 2);
    assert_eq!(xml.matches("<testcase ").count(), 6);
    assert_eq!(xml.matches("<skipped").count(), 4);
    assert_eq!(xml.matches("<failure").count(), 0);
    assert!(xml.contains("name=\"host:0\"") && xml.contains("name=\"host:1\""));
    assert!(xml.contains("known &lt;bug&gt; &amp;"));
    // Every element that opens is closed: a crude but real well-formedness check.
    for tag in ["testsuites", "testsuite", "testcase"] {
        let open =
            xml.matches(&format!("<{tag} ")).count() + xml.matches(&format!("<{tag}>")).count();
        let closed = xml.matches(&format!("</{tag}>")).count()
            + xml
                .split(&format!("<{tag} "))
                .skip(1)
                .filter(|rest| rest.split('>').next().is_some_and(|t| t.ends_with('/')))
                .count();
        assert_eq!(open, closed, "<{tag}> opened {open} times, closed {closed}");
    }
}

#[test]
fn expectations_files_merge() {
    let dir = std::env::temp_dir().join(format!("xpu-conformance-exp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("exp.json");
    std::fs::write(
        &path,
        r#"{"expectations":[{"backend":"vulkan","case":"event.*","reason":"waits are not bridged yet"}]}"#,
    )
    .unwrap();
    let mut exp = Expectations::builtin();
    exp.merge(Expectations::from_json_file(&path).unwrap());
    assert!(exp.lookup("vulkan", "event.query_pending").is_some());
    assert!(exp.lookup("host", "event.query_pending").is_none());
    assert!(Expectations::from_json_file(dir.join("missing.json")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn profiles_parse_and_select() {
    assert_eq!("core".parse::<Profile>().unwrap(), Profile::Core);
    assert_eq!("Training".parse::<Profile>().unwrap(), Profile::Training);
    assert!("nope".parse::<Profile>().is_err());
    assert!(xpu_conformance::cases(Profile::Core).len() >= 45);
    let collectives = xpu_conformance::cases(Profile::Collectives);
    assert!(
        collectives.len() >= 27,
        "{} collectives cases",
        collectives.len()
    );
    assert!(collectives
        .iter()
        .all(|c| c.name.starts_with("collectives.") && c.profile == Profile::Collectives));
    assert!(xpu_conformance::cases(Profile::Core)
        .iter()
        .all(|c| !c.name.starts_with("collectives.")));
    let training = xpu_conformance::cases(Profile::Training);
    assert_eq!(training.len(), xpu_hal::ops::OpKind::ALL.len() + 1);
    assert!(training.iter().all(|c| c.name.starts_with("training.")));
}

#[test]
fn an_expectation_singles_out_a_device_and_a_failure() {
    let devices = host_devices(2).unwrap();
    let status = |exp: Expectations, case: &str| -> Vec<(String, Status, String)> {
        run_cases(CUSTOM, &devices, &options(exp), |_| {})
            .results
            .into_iter()
            .filter(|r| r.case == case)
            .map(|r| (r.device, r.status, r.reason.unwrap_or_default()))
            .collect()
    };
    // One device by name: the other's failure stays a failure.
    let mut e = Expectation::new("host", "custom.fails", "only device 1 is broken");
    e.device = Some("* (virtual device 1)".into());
    let got = status(Expectations { entries: vec![e] }, "custom.fails");
    assert_eq!(got[0].1, Status::Fail, "{got:?}");
    assert_eq!(got[1].1, Status::Xfail, "{got:?}");
    // A driver the devices do not have: no device is covered.
    let mut e = Expectation::new("host", "custom.fails", "driver 9 regressed");
    e.driver = Some("xpu-host 9.*".into());
    let got = status(Expectations { entries: vec![e] }, "custom.fails");
    assert!(got.iter().all(|g| g.1 == Status::Fail), "{got:?}");
    // The failure it expects, and another one.
    let mut e = Expectation::new("host", "custom.fails", "off by one");
    e.message = Some("expected 1, found *".into());
    let got = status(
        Expectations {
            entries: vec![e.clone()],
        },
        "custom.fails",
    );
    assert!(got.iter().all(|g| g.1 == Status::Xfail), "{got:?}");
    e.message = Some("*timed out*".into());
    let got = status(Expectations { entries: vec![e] }, "custom.fails");
    assert!(got.iter().all(|g| g.1 == Status::Fail), "{got:?}");
    assert!(
        got[0].2.contains("expected 1, found 2") && got[0].2.contains("*timed out*"),
        "{got:?}"
    );
    // Flaky: a pass is a pass, a failure an expected failure.
    let mut e = Expectation::new("host", "custom.*", "sometimes fails");
    e.flaky = true;
    let exp = Expectations { entries: vec![e] };
    let report = run_cases(CUSTOM, &devices, &options(exp), |_| {});
    assert!(report.success());
    for r in &report.results {
        let want = match r.case.as_str() {
            "custom.fails" => Status::Xfail,
            "custom.skips" => Status::Skip,
            _ => Status::Pass,
        };
        assert_eq!(r.status, want, "{r:?}");
    }
}
