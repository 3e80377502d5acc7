//! End-to-end tests of the `xpu` command: real processes, real output, real exit codes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Command, Output};

mod mpi;
mod ops;
mod placement;
mod sched;
mod sched_bench;
mod train;

fn xpu(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_xpu"));
    c.args(args);
    for var in [
        "XPU_DEVICES",
        "XPU_HOST_DEVICES",
        "XPU_HOST_MEMORY",
        "XPU_REQUIRE",
        "XPU_VULKAN_LIBRARY",
        "XPU_VULKAN_VALIDATION",
        "XPU_PLUGIN_PATH",
    ] {
        c.env_remove(var);
    }
    c
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("the xpu binary runs");
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{}-{name}", std::process::id()))
}

#[test]
fn devices_json_lists_the_four_host_devices() {
    let (code, out, err) = run(&mut xpu(&["devices", "--json"]));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    let hosts: Vec<&serde_json::Value> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["backend"] == "host")
        .collect();
    let ids: Vec<&str> = hosts.iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["host:0", "host:1", "host:2", "host:3"]);
    for d in hosts {
        assert_eq!(d["backend"], "host");
        assert!(d["memory_bytes"].as_u64().unwrap() > 0);
        assert!(!d["name"].as_str().unwrap().is_empty());
        // Host devices grow allocations in pages.
        let granularity = d["capabilities"]["virtual_memory_granularity"].as_u64();
        assert!(granularity.is_some_and(|g| g.is_power_of_two()), "{d}");
    }
    let backends = v["backends"].as_array().unwrap();
    assert!(backends
        .iter()
        .any(|b| b["name"] == "host" && b["available"] == true));
}

#[test]
fn devices_table_honours_the_selector_and_the_environment() {
    let (code, out, _) = run(&mut xpu(&["devices", "--devices", "host:1,3"]));
    assert_eq!(code, 0);
    assert!(out.contains("host:1") && out.contains("host:3"), "{out}");
    assert!(
        !out.contains("host:0 ") && !out.contains("host:2 "),
        "{out}"
    );
    assert!(out.contains("backends:"), "{out}");
    assert!(out.contains("GROWABLE"), "{out}");

    let (code, out, _) =
        run(xpu(&["devices", "--json", "--devices", "host:*"]).env("XPU_HOST_DEVICES", "2"));
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["devices"].as_array().unwrap().len(), 2);

    let (code, out, _) = run(xpu(&["devices", "--json"]).env("XPU_DEVICES", "host:2"));
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["devices"][0]["id"], "host:2");
    assert_eq!(v["devices"].as_array().unwrap().len(), 1);
}

#[test]
fn conformance_passes_on_a_host_device_and_writes_reports() {
    let json = scratch("report.json");
    let junit = scratch("report.xml");
    let (code, out, err) = run(&mut xpu(&[
        "conformance",
        "--devices",
        "host:0,1",
        "--json",
        json.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("ok    [host/host:0] "), "{out}");
    let closing = out.lines().last().unwrap();
    assert!(
        closing.contains(" passed, 0 failed, ") && closing.contains(" skipped"),
        "{closing}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let passed = report["summary"]["passed"].as_u64().unwrap();
    assert!(
        passed >= 80,
        "at least 40 cases on each of 2 devices, got {passed}"
    );
    assert_eq!(report["summary"]["failed"], 0);
    let first = &report["results"][0];
    for key in ["case", "device", "status", "reason", "duration"] {
        assert!(first.get(key).is_some(), "result lacks `{key}`: {first}");
    }
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.starts_with("<?xml"), "{xml}");
    assert_eq!(
        xml.matches("<testsuite ").count(),
        2,
        "one suite per device"
    );
}

#[test]
fn the_collectives_profile_runs_communicators_on_host_devices() {
    let json = scratch("collectives.json");
    let (code, out, err) = run(&mut xpu(&[
        "conformance",
        "--profile",
        "collectives",
        "--devices",
        "host:0,1",
        "--json",
        json.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("conformance profile `collectives`"), "{out}");
    assert!(
        out.contains("ok    [host/host:0] collectives.allreduce_self"),
        "{out}"
    );
    assert!(
        out.contains("ok    [host/host:1] collectives.allreduce_backend"),
        "{out}"
    );
    // With one backend in the run, the mixed sets skip and say why.
    assert!(
        out.contains("skip  [host/host:0] collectives.allreduce_mixed (needs a device of a backend other than `host`"),
        "{out}"
    );
    assert!(
        out.contains("backend host: passed the `collectives` profile"),
        "{out}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["profile"], "collectives");
    assert_eq!(report["summary"]["failed"], 0);
    let results = report["results"].as_array().unwrap();
    assert!(results
        .iter()
        .all(|r| r["case"].as_str().unwrap().starts_with("collectives.")));
    let passed = report["summary"]["passed"].as_u64().unwrap();
    assert!(
        passed >= 2 * 19,
        "the self, backend and failure cases on each of 2 devices, got {passed}"
    );

    let (code, out, _) = run(&mut xpu(&[
        "conformance",
        "--profile",
        "collectives",
        "--devices",
        "host:0",
        "--list",
    ]));
    assert_eq!(code, 0);
    assert!(out.lines().all(|l| l.starts_with("collectives.")), "{out}");
    assert!(out.lines().count() >= 27, "{out}");
}

#[test]
fn an_expected_failure_that_passes_fails_the_run() {
    let file = scratch("expect.json");
    std::fs::write(
        &file,
        r#"[{"backend": "host", "case": "copy.h2d_offsets", "reason": "pretend it is broken"}]"#,
    )
    .unwrap();
    let (code, out, _) = run(&mut xpu(&[
        "conformance",
        "--devices",
        "host:0",
        "--filter",
        "copy.",
        "--expectations",
        file.to_str().unwrap(),
    ]));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("XPASS [host/host:0] copy.h2d_offsets"),
        "{out}"
    );
    assert!(out.lines().last().unwrap().contains("1 xpass"), "{out}");
}

#[test]
fn a_required_backend_without_devices_fails_the_run() {
    let (code, out, _) = run(&mut xpu(&[
        "conformance",
        "--devices",
        "host:0",
        "--filter",
        "device.",
        "--require",
        "host,nosuch",
    ]));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("backend.required"), "{out}");
    assert!(
        out.contains("no registered backend matches `nosuch`"),
        "{out}"
    );

    let (code, out, _) = run(
        xpu(&["conformance", "--devices", "host:0", "--filter", "device."])
            .env("XPU_REQUIRE", "host"),
    );
    assert_eq!(code, 0, "{out}");
}

#[test]
fn bad_input_is_a_clear_error_with_exit_code_2() {
    let (code, _, err) = run(&mut xpu(&["conformance", "--devices", "host:x"]));
    assert_eq!(code, 2);
    assert!(err.contains("not a device index"), "{err}");

    let (code, _, err) = run(&mut xpu(&["conformance", "--devices", "host:9"]));
    assert_eq!(code, 2);
    assert!(err.contains("host:9 does not exist"), "{err}");

    let (code, _, err) = run(&mut xpu(&["conformance", "--profile", "nope"]));
    assert_eq!(code, 2);
    assert!(err.contains("nope"), "{err}");

    let (code, _, err) = run(xpu(&["devices"]).env("XPU_HOST_DEVICES", "lots"));
    assert_eq!(code, 2);
    assert!(err.contains("XPU_HOST_DEVICES"), "{err}");

    let (code, _, err) = run(xpu(&["devices"]).env("XPU_HOST_MEMORY", "12Q"));
    assert_eq!(code, 2);
    assert!(err.contains("XPU_HOST_MEMORY"), "{err}");

    let missing = scratch("missing.json");
    let (code, _, err) = run(&mut xpu(&[
        "conformance",
        "--expectations",
        missing.to_str().unwrap(),
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("missing.json"), "{err}");

    // Times and counts past what can be honoured are refused, not a panic or an abort.
    let bench = [
        "bench",
        "collectives",
        "--devices",
        "host:0,1",
        "-b",
        "8",
        "-e",
        "8",
    ];
    for t in ["inf", "1e300", "NaN", "0", "-3"] {
        let (code, _, err) = run(xpu(&bench).env("XPU_COLL_TIMEOUT", t));
        assert_eq!(code, 2, "XPU_COLL_TIMEOUT={t}: {err}");
        assert!(err.contains("XPU_COLL_TIMEOUT"), "{err}");
    }
    let mut many = bench.to_vec();
    many.extend(["-n", "100000000000000"]);
    let (code, _, err) = run(&mut xpu(&many));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("at most 10000000 iterations"), "{err}");
    for t in ["0", "inf", "1e300"] {
        let (code, _, err) = run(&mut xpu(&["conformance", "--case-timeout", t]));
        assert_eq!(code, 2, "--case-timeout {t}: {err}");
        assert!(err.contains("--case-timeout"), "{err}");
    }
}

#[test]
fn a_missing_vulkan_library_makes_the_backend_unavailable() {
    let (code, out, err) =
        run(xpu(&["devices", "--json"]).env("XPU_VULKAN_LIBRARY", "/nonexistent/libvulkan.so.1"));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let vk = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "vulkan")
        .expect("the vulkan backend is listed");
    assert_eq!(vk["available"], false);
    assert!(
        vk["reason"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/libvulkan.so.1"),
        "{vk}"
    );
    assert!(v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["backend"] != "vulkan"));
    // Naming a device of the unavailable backend is an error that gives the reason.
    let (code, _, err) = run(xpu(&["conformance", "--devices", "vulkan:0"])
        .env("XPU_VULKAN_LIBRARY", "/nonexistent/libvulkan.so.1"));
    assert_eq!(code, 2);
    assert!(err.contains("unavailable"), "{err}");
}

/// The sim-npu example plugin, built as a dev-dependency of this package.
fn sim_npu() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_xpu"));
    let dir = bin.parent().unwrap();
    let name = format!(
        "{}xpu_sim_npu{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [dir.join("deps").join(&name), dir.join(&name)]
        .into_iter()
        .find(|p| p.exists())
        .expect("the xpu-sim-npu plugin is built (it is a dev-dependency)")
}

fn device_ids(json: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn plugins_load_from_the_flag_and_from_the_path_variable() {
    let plugin = sim_npu();
    let (code, out, err) = run(&mut xpu(&[
        "devices",
        "--json",
        "--plugin",
        plugin.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{err}");
    let ids = device_ids(&out);
    assert!(ids.contains(&"plugin.simnpu:0".to_string()), "{ids:?}");
    assert!(ids.contains(&"plugin.simnpu:1".to_string()), "{ids:?}");

    let (code, out, err) = run(xpu(&["devices", "--json"]).env("XPU_PLUGIN_PATH", &plugin));
    assert_eq!(code, 0, "{err}");
    assert!(device_ids(&out).contains(&"plugin.simnpu:0".to_string()));

    // A file that is not a plugin: listed as an unavailable backend with the reason …
    let junk = scratch("junk.so");
    std::fs::write(&junk, b"not a library").unwrap();
    let (code, out, _) = run(xpu(&["devices"]).env("XPU_PLUGIN_PATH", &junk));
    assert_eq!(code, 0);
    assert!(out.contains("cannot load xpu plugin"), "{out}");
    // … and refused outright when named with --plugin for a conformance run.
    let (code, _, err) = run(&mut xpu(&[
        "conformance",
        "--plugin",
        junk.to_str().unwrap(),
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("junk.so"), "{err}");
}

#[test]
fn a_plugin_passes_the_core_profile_through_the_command() {
    let plugin = sim_npu();
    let json = scratch("plugin.json");
    let (code, out, err) = run(&mut xpu(&[
        "conformance",
        "--plugin",
        plugin.to_str().unwrap(),
        "--devices",
        "plugin.simnpu:*;host:0",
        "--require",
        "plugin.simnpu",
        "--json",
        json.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("backend plugin.simnpu: passed the `core` profile"),
        "{out}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["profile"], "core");
    assert_eq!(report["backends"]["plugin.simnpu"]["passed"], true);
}

#[test]
fn the_memory_bench_replays_a_trace_beside_the_pytorch_baseline() {
    let trace =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("memory/tests/data/alexnet_train.log");
    assert!(
        trace.exists(),
        "the AlexNet trace is at {}",
        trace.display()
    );
    let (code, out, err) = run(&mut xpu(&[
        "bench",
        "memory",
        "--trace",
        trace.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        for key in [
            "requests",
            "peak_live_bytes",
            "peak_reserved_bytes",
            "utilization",
            "device_alloc_calls",
            "alloc_free_p50_ns",
            "alloc_free_p99_ns",
        ] {
            assert!(row.get(key).is_some(), "{key} missing: {row}");
        }
        assert_eq!(row["requests"], 193);
        let u = row["utilization"].as_f64().unwrap();
        assert!(u > 0.0 && u <= 1.0, "{u}");
    }
    let (code, _, err) = run(&mut xpu(&[
        "bench",
        "memory",
        "--trace",
        "/nonexistent/trace",
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/trace"), "{err}");
}

#[test]
fn version_and_case_list() {
    let (code, out, _) = run(&mut xpu(&["--version"]));
    assert_eq!(code, 0);
    assert!(out.starts_with("xpu "), "{out}");
    let (code, out, _) = run(&mut xpu(&["conformance", "--devices", "host:0", "--list"]));
    assert_eq!(code, 0);
    assert!(out.lines().count() >= 40, "{out}");
}

#[test]
fn the_collectives_bench_stops_at_a_maximum_that_is_not_whole_elements() {
    // 4099 bytes round down to 4096 (1024 floats); the sweep must end there, checked.
    let (code, out, err) = run(xpu(&[
        "bench",
        "collectives",
        "-b",
        "1K",
        "-e",
        "4099",
        "-n",
        "2",
        "-w",
        "1",
        "--json",
    ])
    .env("XPU_COLL_TIMEOUT", "60"));
    assert_eq!(code, 0, "{out}{err}");
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sizes: Vec<u64> = rows.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, vec![1024, 2048, 4096], "{out}");
    assert!(
        rows.iter().all(|r| r["out_of_place"]["wrong"] == 0),
        "{out}"
    );
}

/// `xpu bench collectives` over sim-npu devices hands the operations to the devices'
/// own library (`simccl`, plugin ABI 1.3) when it states no figures, runs xpu's own
/// algorithms when the library is turned off, and checks every result either way.
#[test]
fn the_collectives_bench_uses_a_plugins_own_library_where_it_has_one() {
    let plugin = sim_npu();
    let bench = |vars: &[(&str, &str)]| {
        let mut c = xpu(&[
            "--plugin",
            plugin.to_str().unwrap(),
            "bench",
            "collectives",
            "--devices",
            "plugin.simnpu:0,1",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "64",
            "-n",
            "2",
            "-w",
            "1",
            "--json",
        ]);
        c.env("XPU_COLL_TIMEOUT", "60");
        for (k, v) in vars {
            c.env(k, v);
        }
        let (code, out, err) = run(&mut c);
        assert_eq!(code, 0, "{out}{err}");
        let rows: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 4, "8 B to 64 KiB by 64, and the end: {out}");
        for r in &rows {
            assert_eq!(r["out_of_place"]["wrong"], 0, "{out}");
            assert_eq!(r["in_place"]["wrong"], 0, "{out}");
        }
        rows.iter()
            .map(|r| r["algorithm"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let native = bench(&[("XPU_SIMNPU_CCL_LATENCY_US", "none")]);
    assert!(native.iter().all(|a| a == "native"), "{native:?}");
    let own = bench(&[("XPU_SIMNPU_CCL", "off")]);
    assert!(own.iter().all(|a| a != "native"), "{own:?}");
}

#[test]
fn a_conformance_certificate_is_written_and_checked_by_a_rerun() {
    let cert = scratch("certificate.json");
    let (code, out, err) = run(&mut xpu(&[
        "conformance",
        "--devices",
        "host:0",
        "--certificate",
        cert.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("certificate written to"), "{out}");
    let text = std::fs::read_to_string(&cert).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["format"], "xpu-conformance-certificate/1");
    assert_eq!(v["passed"], true);
    assert_eq!(v["profile"], "core");
    assert_eq!(v["suite_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(v["devices"][0]["id"], "host:0");
    assert!(v["issued"].as_str().unwrap().ends_with('Z'));
    let results = v["results"].as_array().unwrap();
    assert!(results.len() >= 80, "{}", results.len());
    for r in results.iter().filter(|r| r["status"] == "skip") {
        assert!(r["reason"].as_str().is_some_and(|s| !s.is_empty()), "{r}");
    }

    // The same device confirms it.
    let (code, out, err) = run(&mut xpu(&[
        "conformance",
        "--devices",
        "host:0",
        "--check-certificate",
        cert.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("is confirmed"), "{out}");

    // Another device (another name) does not.
    let (code, out, _) = run(&mut xpu(&[
        "conformance",
        "--devices",
        "host:1",
        "--check-certificate",
        cert.to_str().unwrap(),
    ]));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("NOT confirmed") && out.contains("no device of the rerun is host:0"),
        "{out}"
    );

    // A certified result the device does not give again is named.
    let mut tampered = v.clone();
    let first_pass = tampered["results"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|r| r["status"] == "pass")
        .unwrap();
    first_pass["status"] = "fail".into();
    let case = first_pass["case"].as_str().unwrap().to_string();
    let bad = scratch("tampered.json");
    std::fs::write(&bad, tampered.to_string()).unwrap();
    let (code, out, _) = run(&mut xpu(&[
        "conformance",
        "--devices",
        "host:0",
        "--check-certificate",
        bad.to_str().unwrap(),
    ]));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("{case} on host:0: certified fail, now pass")),
        "{out}"
    );

    // Bad input: no file, not a certificate, a filtered run.
    let (code, _, err) = run(&mut xpu(&[
        "conformance",
        "--check-certificate",
        "/nonexistent/c.json",
    ]));
    assert_ne!(code, 0);
    assert!(err.contains("cannot read the certificate"), "{err}");
    std::fs::write(&bad, "{\"format\": 1}").unwrap();
    let (code, _, err) = run(&mut xpu(&[
        "conformance",
        "--check-certificate",
        bad.to_str().unwrap(),
    ]));
    assert_ne!(code, 0);
    assert!(err.contains("not a conformance certificate"), "{err}");
    let (code, _, err) = run(&mut xpu(&[
        "conformance",
        "--filter",
        "copy",
        "--certificate",
        cert.to_str().unwrap(),
    ]));
    assert_eq!(code, 2, "{err}");
}
