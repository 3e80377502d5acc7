//! `xpu sched simulate`: planning a task graph from the command line.

use super::{run, scratch, xpu};

fn topcuoglu() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scheduler/tests/data/topcuoglu2002.json"
    )
    .to_string()
}

#[test]
fn sched_simulate_heft_gives_the_papers_makespan() {
    let graph = topcuoglu();
    let (code, out, err) = run(&mut xpu(&[
        "sched", "simulate", "--graph", &graph, "--policy", "heft", "--json",
    ]));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["makespan"].as_f64(), Some(80.0), "{out}");
    assert_eq!(v["policy"], "heft");
    let tasks = v["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 10);
    assert_eq!(tasks[0]["id"], "t1");
    assert_eq!(tasks[9]["id"], "t10");
    assert_eq!(tasks[9]["finish"].as_f64(), Some(80.0));

    // The table, and every policy side by side; `best` is the default.
    let (code, out, err) = run(&mut xpu(&[
        "sched",
        "simulate",
        "--graph",
        &graph,
        "--compare",
    ]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("processor") && out.contains("t10"), "{out}");
    assert!(out.contains("makespan"), "{out}");
    for policy in ["heft", "heft-la", "peft", "dmda", "eager", "ws"] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{policy} "))),
            "{policy} missing from {out}"
        );
    }
    assert!(out.contains("<- chosen"), "{out}");
}

#[test]
fn sched_simulate_refuses_a_bad_graph_with_exit_code_2() {
    let bad = scratch("cyclic-graph.json");
    std::fs::write(
        &bad,
        r#"{"processors": 2,
            "tasks": [{"id": "load", "cost": [1, 2]}, {"id": "train", "cost": [3, 1]}],
            "edges": [{"from": "load", "to": "train", "cost": 1},
                      {"from": "train", "to": "load", "cost": 1}]}"#,
    )
    .unwrap();
    let (code, out, err) = run(&mut xpu(&[
        "sched",
        "simulate",
        "--graph",
        bad.to_str().unwrap(),
    ]));
    assert_eq!(code, 2, "{out}");
    assert!(err.contains("cycle") && err.contains("\"load\""), "{err}");
    assert!(err.contains("cyclic-graph.json"), "{err}");

    std::fs::write(
        &bad,
        r#"{"processors": 2, "tasks": [{"id": "a", "cost": [1, 2, 3]}]}"#,
    )
    .unwrap();
    let (code, _, err) = run(&mut xpu(&[
        "sched",
        "simulate",
        "--graph",
        bad.to_str().unwrap(),
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("\"a\"") && err.contains("3 costs"), "{err}");

    std::fs::write(&bad, "{\"processors\": 2,\n \"tasks\": [").unwrap();
    let (code, _, err) = run(&mut xpu(&[
        "sched",
        "simulate",
        "--graph",
        bad.to_str().unwrap(),
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("line 2"), "{err}");

    let (code, _, err) = run(&mut xpu(&[
        "sched",
        "simulate",
        "--graph",
        &topcuoglu(),
        "--policy",
        "fastest",
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("fastest") && err.contains("heft"), "{err}");

    let missing = scratch("no-such-graph.json");
    let (code, _, err) = run(&mut xpu(&[
        "sched",
        "simulate",
        "--graph",
        missing.to_str().unwrap(),
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("no-such-graph.json"), "{err}");
}
