//! `xpu bench placement`: eager, dmda and a replayed HEFT plan on devices of different
//! kinds, with the same results; and its refusals.

use super::{run, sim_npu, xpu};

#[test]
fn every_policy_gives_the_same_outputs_on_a_mixed_set() {
    let plugin = sim_npu();
    let (code, out, err) = run(xpu(&[
        "--plugin",
        plugin.to_str().unwrap(),
        "bench",
        "placement",
        "--devices",
        "host:0;plugin.simnpu:0",
        "--width",
        "3",
        "--steps",
        "6",
        "--kib",
        "64",
        "--rounds",
        "1",
        "--json",
    ])
    .env("XPU_SIMNPU_LATENCY_US", "50"));
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["wrong"], 0, "{v}");
    assert_eq!(v["tasks"], 18, "{v}");
    assert_eq!(
        v["devices"],
        serde_json::json!(["host:0", "plugin.simnpu:0"])
    );
    for key in ["eager_s", "dmda_s", "heft_predicted_s", "heft_replayed_s"] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    }
    for key in ["eager_placed", "dmda_placed", "heft_placed"] {
        let placed: u64 = v[key]
            .as_array()
            .expect("a list per device")
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .sum();
        assert_eq!(placed, 18, "{key}: {v}");
    }
}

#[test]
fn bad_input_is_refused_with_exit_code_2() {
    let cases: [(&[&str], &str); 4] = [
        (&["--devices", "host:0"], "at least two devices"),
        (&["--kib", "0"], "is not a size in KiB"),
        (&["--pattern", "stencil"], "unknown pattern `stencil`"),
        (&["--rounds", "0"], "between 1"),
    ];
    for (args, message) in cases {
        let mut all = vec!["bench", "placement"];
        all.extend_from_slice(args);
        if !args.contains(&"--devices") {
            all.extend(["--devices", "host:0,1"]);
        }
        let (code, out, err) = run(&mut xpu(&all));
        assert_eq!(code, 2, "{all:?}: {out}\n{err}");
        assert!(err.contains(message), "{all:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
