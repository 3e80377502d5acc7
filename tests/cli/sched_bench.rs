//! `xpu bench scheduler`: Task Bench's patterns on the scheduler, checked, and its refusals.

use super::{run, sim_npu, xpu};

fn bench(extra: &[&str]) -> (i32, String, String) {
    let mut args = vec![
        "bench",
        "scheduler",
        "--devices",
        "host:0,1",
        "--iterations",
        "1",
    ];
    args.extend_from_slice(extra);
    run(&mut xpu(&args))
}

#[test]
fn a_checked_stencil_runs_every_task_after_its_dependencies() {
    let (code, out, err) = bench(&[
        "--pattern",
        "stencil_1d",
        "--width",
        "4",
        "--steps",
        "5",
        "--check",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["wrong"], 0, "{v}");
    assert_eq!(v["checked"], true);
    assert_eq!(v["tasks"], 20);
    // Steps 1–4, each: 2 + 3 + 3 + 2 neighbours.
    assert_eq!(v["edges"], 40);
    assert_eq!(v["pattern"], "stencil_1d");
    assert_eq!(v["devices"], serde_json::json!(["host:0", "host:1"]));
    for key in ["wall_s", "per_task_ns", "efficiency"] {
        assert!(v[key].as_f64().is_some_and(|x| x >= 0.0), "{key}: {v}");
    }
    assert!(v.get("metg_us").is_none(), "{v}");
}

#[test]
fn a_recorded_graph_replays_checked_beside_submission() {
    for policy in ["dmda", "eager", "heft"] {
        let (code, out, err) = bench(&[
            "--pattern",
            "stencil_1d",
            "--width",
            "4",
            "--steps",
            "6",
            "--policy",
            policy,
            "--replay",
            "--check",
            "--json",
        ]);
        assert_eq!(code, 0, "{policy}: {out}\n{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
        // Every submitted and replayed run ran each task once, after its dependencies,
        // and left the right final values.
        assert_eq!(v["wrong"], 0, "{policy}: {v}");
        let r = &v["replay"];
        assert_eq!(r["rounds"], 1, "{policy}: {v}");
        for key in [
            "submit_s",
            "replay_s",
            "ratio",
            "submit_wall_s",
            "replay_wall_s",
        ] {
            assert!(
                r[key].as_f64().is_some_and(|x| x > 0.0),
                "{policy} {key}: {v}"
            );
        }
    }
}

#[test]
fn every_pattern_runs_checked_under_every_policy() {
    for (pattern, policy) in [
        ("trivial", "ws"),
        ("no_comm", "dmda"),
        ("stencil_1d_periodic", "ws"),
        ("dom", "dmda"),
        ("tree", "eager"),
        ("fft", "dmda"),
        ("all_to_all", "ws"),
        ("nearest", "dmda"),
        ("spread", "eager"),
        ("random_nearest", "dmda"),
    ] {
        let (code, out, err) = bench(&[
            "--pattern",
            pattern,
            "--width",
            "5",
            "--steps",
            "6",
            "--check",
            "--policy",
            policy,
        ]);
        assert_eq!(code, 0, "{pattern}: {out}\n{err}");
        assert!(out.contains("wrong 0 (checked)"), "{pattern}: {out}");
    }
}

#[test]
fn metg_is_searched_from_1000_us_down() {
    let (code, out, err) = bench(&[
        "--pattern",
        "no_comm",
        "--width",
        "2",
        "--steps",
        "4",
        "--metg",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    let probes = v["metg"]["probes"].as_array().unwrap();
    assert_eq!(probes[0]["grain_us"], 1000.0, "{v}");
    // Under load no grain may reach 50%; then metg_us is null.
    match v["metg_us"].as_f64() {
        Some(metg) => {
            assert!(metg > 0.0 && metg <= 4000.0, "{v}");
            assert!(v["metg"]["found"]["efficiency"].as_f64().unwrap() >= 0.5);
        }
        None => assert!(v["metg_us"].is_null(), "{v}"),
    }
}

#[test]
fn bad_input_is_refused_with_exit_code_2() {
    let cases: [(&[&str], &str); 9] = [
        (&["--pattern", "stencil"], "unknown pattern `stencil`"),
        (
            &["--pattern", "dom", "--width", "0"],
            "the width must be between 1",
        ),
        (
            &["--pattern", "dom", "--width", "-3"],
            "the width must be between 1",
        ),
        (
            &["--pattern", "dom", "--steps", "0"],
            "the number of steps must be between 1",
        ),
        (
            &["--pattern", "fft", "--grain-us", "-5"],
            "the grain must be between 0",
        ),
        (
            &["--pattern", "fft", "--policy", "fastest"],
            "unknown scheduling policy `fastest`",
        ),
        (
            &["--pattern", "spread", "--period", "0"],
            "the period must be between 1",
        ),
        (
            &["--pattern", "random_nearest", "--fraction", "1.5"],
            "the fraction must be between 0 and 1",
        ),
        (
            &["--pattern", "nearest", "--radix", "-1"],
            "the radix must be between 0 and",
        ),
    ];
    for (args, message) in cases {
        // The valid shape, unless the case gives its own (clap refuses an option twice).
        let mut all = args.to_vec();
        for (flag, value) in [("--width", "4"), ("--steps", "5")] {
            if !args.contains(&flag) {
                all.extend([flag, value]);
            }
        }
        let (code, out, err) = bench(&all);
        assert_eq!(code, 2, "{all:?}: {out}\n{err}");
        assert!(err.contains(message), "{all:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn devices_that_cannot_run_host_functions_are_refused_with_the_reason() {
    let plugin = sim_npu();
    let (code, out, err) = run(&mut xpu(&[
        "--plugin",
        plugin.to_str().unwrap(),
        "bench",
        "scheduler",
        "--devices",
        "plugin.simnpu:0",
        "--pattern",
        "trivial",
        "--width",
        "2",
        "--steps",
        "2",
    ]));
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("plugin.simnpu:0 cannot load host functions") && err.contains("host:0,1"),
        "{err}"
    );
}
