//! The planning core: known schedules from the papers, every policy valid on random
//! graphs, input validation, JSON.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use xpu_hal::Error;
use xpu_scheduler::sim::{
    self, best, heft, heft_order, optimistic_cost_table, upward_ranks, CostGraph, Edge, Placed,
    Policy, Schedule, Task,
};

fn data(name: &str) -> CostGraph {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    CostGraph::from_json(&text).unwrap()
}

fn placement(s: &Schedule, id: &str) -> (usize, f64, f64) {
    let p = s.tasks.iter().find(|t| t.id == id).unwrap();
    (p.processor, p.start, p.finish)
}

#[test]
fn heft_reproduces_topcuoglu_2002() {
    let g = data("topcuoglu2002.json");
    // The upward ranks the paper lists.
    let ranks = upward_ranks(&g);
    let expected = [
        108.0, 77.0, 80.0, 80.0, 69.0, 63.333, 42.667, 35.667, 44.333, 14.667,
    ];
    for (i, (r, e)) in ranks.iter().zip(expected).enumerate() {
        assert!((r - e).abs() < 1e-3, "rank of t{}: {r}, paper {e}", i + 1);
    }
    // The paper's order: t3 and t4 tie at 80 and go in input order.
    let order: Vec<&str> = heft_order(&g)
        .into_iter()
        .map(|t| g.tasks()[t].id.as_str())
        .collect();
    assert_eq!(
        order,
        ["t1", "t3", "t4", "t2", "t5", "t6", "t9", "t7", "t8", "t10"]
    );
    // The paper's HEFT schedule (its processors P1..P3 are 0..2 here).
    let s = heft(&g);
    s.validate(&g).unwrap();
    assert_eq!(s.makespan, 80.0);
    let paper = [
        ("t1", 2, 0.0, 9.0),
        ("t2", 0, 27.0, 40.0),
        ("t3", 2, 9.0, 28.0),
        ("t4", 1, 18.0, 26.0),
        ("t5", 2, 28.0, 38.0),
        ("t6", 1, 26.0, 42.0),
        ("t7", 2, 38.0, 49.0),
        ("t8", 0, 57.0, 62.0),
        ("t9", 1, 56.0, 68.0),
        ("t10", 1, 73.0, 80.0),
    ];
    for (id, p, start, finish) in paper {
        assert_eq!(placement(&s, id), (p, start, finish), "{id}");
    }
}

#[test]
fn peft_reproduces_arabnejad_barbosa_2014() {
    // The sample DAG of the PEFT paper, its Optimistic Cost Table and PEFT's schedule,
    // makespan 122, where HEFT takes 133.
    let g = data("arabnejad2014.json");
    let oct = optimistic_cost_table(&g);
    let expected = [
        [64.0, 68.0, 86.0],
        [42.0, 39.0, 42.0],
        [27.0, 41.0, 43.0],
        [42.0, 39.0, 50.0],
        [28.0, 37.0, 28.0],
        [42.0, 39.0, 44.0],
        [13.0, 16.0, 22.0],
        [13.0, 16.0, 33.0],
        [13.0, 16.0, 20.0],
        [0.0, 0.0, 0.0],
    ];
    for (i, (row, e)) in oct.iter().zip(expected).enumerate() {
        assert_eq!(row.as_slice(), e.as_slice(), "OCT of t{}", i + 1);
    }
    let s = sim::peft(&g);
    s.validate(&g).unwrap();
    assert_eq!(s.makespan, 122.0);
    let reference = [
        ("t1", 0, 0.0, 22.0),
        ("t2", 0, 29.0, 51.0),
        ("t3", 0, 51.0, 83.0),
        ("t4", 0, 22.0, 29.0),
        ("t5", 2, 35.0, 70.0),
        ("t6", 1, 29.0, 46.0),
        ("t7", 0, 83.0, 97.0),
        ("t8", 1, 54.0, 77.0),
        ("t9", 2, 81.0, 89.0),
        ("t10", 1, 106.0, 122.0),
    ];
    for (id, p, start, finish) in reference {
        assert_eq!(placement(&s, id), (p, start, finish), "{id}");
    }
    assert_eq!(heft(&g).makespan, 133.0);
}

#[test]
fn every_policy_is_valid_on_the_papers_graphs() {
    for file in ["topcuoglu2002.json", "arabnejad2014.json"] {
        let g = data(file);
        let mut line = String::new();
        for policy in Policy::ALL {
            let s = policy.schedule(&g);
            s.validate(&g)
                .unwrap_or_else(|e| panic!("{policy} on {file}: {e}"));
            assert!(s.makespan >= g.lower_bound());
            line += &format!(" {policy}={}", s.makespan);
        }
        eprintln!("{file}:{line}");
        let (chosen, s) = best(&g);
        for policy in Policy::BEST_OF {
            assert!(
                s.makespan <= policy.schedule(&g).makespan,
                "{file}: {chosen}"
            );
        }
        assert_eq!(chosen.schedule(&g), s);
    }
}

/// xorshift64, seeded through SplitMix64 from the run number and `XPU_TEST_SEED`.
struct Rng(u64);

impl Rng {
    fn for_run(run: u64) -> (Self, u64) {
        let base = match std::env::var("XPU_TEST_SEED") {
            Ok(v) => v
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("XPU_TEST_SEED={v:?} is not a decimal u64: {e}")),
            Err(_) => 0,
        };
        let seed = splitmix(run ^ splitmix(base)) | 1;
        (Rng(seed), seed)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A random DAG: 1–60 tasks listed in random order (so input order is not
/// topological), 1–6 processors, costs with zeros, integers and fractions, some tasks
/// unable to run on some processors, random edge density and costs, random links half
/// the time.
fn random_graph(rng: &mut Rng) -> CostGraph {
    let n = 1 + rng.below(60) as usize;
    let p = 1 + rng.below(6) as usize;
    let unrunnable = rng.unit() * 0.5;
    let cost_of = |rng: &mut Rng| match rng.below(10) {
        0 => 0.0,
        1..=4 => (1 + rng.below(30)) as f64,
        _ => rng.unit() * 100.0,
    };
    let tasks: Vec<Task> = (0..n)
        .map(|i| {
            let mut cost: Vec<f64> = (0..p)
                .map(|_| {
                    if rng.chance(unrunnable) {
                        f64::INFINITY
                    } else {
                        cost_of(rng)
                    }
                })
                .collect();
            if cost.iter().all(|c| c.is_infinite()) {
                cost[rng.below(p as u64) as usize] = cost_of(rng);
            }
            Task {
                id: format!("task{i}"),
                cost,
            }
        })
        .collect();
    // Position in a hidden topological order.
    let mut level: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        level.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let density = rng.unit() * 0.3;
    let mut edges = Vec::new();
    for a in 0..n {
        for b in 0..n {
            if level[a] < level[b] && rng.chance(density) {
                edges.push(Edge {
                    from: a,
                    to: b,
                    cost: cost_of(rng) * 0.5,
                });
            }
        }
    }
    let links = rng.chance(0.5).then(|| {
        (0..p)
            .map(|a| {
                (0..p)
                    .map(|b| {
                        if a == b && rng.chance(0.7) {
                            0.0
                        } else {
                            rng.unit() * 3.0
                        }
                    })
                    .collect()
            })
            .collect()
    });
    CostGraph::new(CostGraph::default_processor_names(p), tasks, edges, links).unwrap()
}

/// `a` and `b` are the same graph, numbers equal to within serde_json's parsing (which
/// may be off in the last digit without its `float_roundtrip` feature).
fn same_graph(a: &CostGraph, b: &CostGraph, context: &str) {
    let close = |x: f64, y: f64| x == y || (x - y).abs() <= 1e-14 * x.abs().max(y.abs());
    assert_eq!(a.processors(), b.processors(), "{context}");
    assert_eq!(a.num_tasks(), b.num_tasks(), "{context}");
    for (s, t) in a.tasks().iter().zip(b.tasks()) {
        assert_eq!(s.id, t.id, "{context}");
        assert!(
            s.cost.iter().zip(&t.cost).all(|(&x, &y)| close(x, y)),
            "{context}"
        );
    }
    assert_eq!(a.edges().len(), b.edges().len(), "{context}");
    for (e, f) in a.edges().iter().zip(b.edges()) {
        assert_eq!((e.from, e.to), (f.from, f.to), "{context}");
        assert!(close(e.cost, f.cost), "{context}");
    }
    assert_eq!(a.links().is_some(), b.links().is_some(), "{context}");
    for p in 0..a.num_processors() {
        for q in 0..a.num_processors() {
            assert!(close(a.link(p, q), b.link(p, q)), "{context}");
        }
    }
    assert_eq!(a.topological_order(), b.topological_order(), "{context}");
}

#[test]
fn every_policy_is_valid_on_random_graphs() {
    let mut wins = [0usize; 7];
    for run in 0..400 {
        let (mut rng, seed) = Rng::for_run(run);
        let g = random_graph(&mut rng);
        let context = format!(
            "run {run}, seed {seed:#x} ({} tasks, {} processors, {} edges; rerun with the same XPU_TEST_SEED)",
            g.num_tasks(),
            g.num_processors(),
            g.edges().len()
        );
        // The JSON form carries the same graph.
        same_graph(&CostGraph::from_json(&g.to_json()).unwrap(), &g, &context);
        let bound = g.lower_bound();
        assert!(g.critical_path_lower_bound() <= bound);
        let mut makespans = Vec::new();
        for policy in Policy::ALL {
            let s = policy.schedule(&g);
            if let Err(e) = s.validate(&g) {
                panic!("{policy}: {e}; {context}\n{}", g.to_json());
            }
            assert!(s.makespan.is_finite(), "{policy}: {context}");
            assert!(
                s.makespan >= bound * (1.0 - 1e-9),
                "{policy}: makespan {} under the lower bound {bound}; {context}",
                s.makespan
            );
            makespans.push(s.makespan);
        }
        let best_of = makespans[..3].iter().copied().fold(f64::INFINITY, f64::min);
        // best prefers heft, then heft-la, then peft within one part in 10^12.
        assert!(makespans[6] <= best_of * (1.0 + 1e-12), "best: {context}");
        let least = makespans.iter().copied().fold(f64::INFINITY, f64::min);
        for (i, m) in makespans.iter().enumerate() {
            if *m == least {
                wins[i] += 1;
            }
        }
        // Deterministic.
        assert_eq!(sim::peft(&g), sim::peft(&g), "{context}");
        assert_eq!(sim::ws(&g), sim::ws(&g), "{context}");
    }
    eprintln!(
        "smallest makespan (ties count for each): {:?}",
        Policy::ALL.iter().zip(wins).collect::<Vec<_>>()
    );
}

#[test]
fn zero_cost_tasks_listed_before_their_predecessors_keep_the_order_valid() {
    // Equal ranks everywhere: the tie-break must still respect the edges.
    let g = CostGraph::from_json(
        r#"{"processors": 2,
            "tasks": [{"id": "c", "cost": [0, 0]}, {"id": "b", "cost": [0, 0]},
                      {"id": "a", "cost": [0, 0]}, {"id": "d", "cost": [0, null]}],
            "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"},
                      {"from": "d", "to": "c", "cost": 0}]}"#,
    )
    .unwrap();
    let order: Vec<&str> = g
        .topological_order()
        .iter()
        .map(|&t| g.tasks()[t].id.as_str())
        .collect();
    assert_eq!(order, ["a", "b", "d", "c"]);
    for policy in Policy::ALL {
        let s = policy.schedule(&g);
        s.validate(&g).unwrap_or_else(|e| panic!("{policy}: {e}"));
        assert_eq!(s.makespan, 0.0);
    }
}

#[test]
fn one_processor_runs_everything_back_to_back() {
    let g = CostGraph::from_json(
        r#"{"processors": ["cpu"],
            "tasks": [{"id": "a", "cost": [3]}, {"id": "b", "cost": {"cpu": 4}},
                      {"id": "c", "cost": [5]}],
            "edges": [{"from": "a", "to": "c", "cost": 100}]}"#,
    )
    .unwrap();
    for policy in Policy::ALL {
        let s = policy.schedule(&g);
        s.validate(&g).unwrap();
        assert_eq!(s.makespan, 12.0, "{policy}");
    }
}

#[test]
fn links_scale_transfers_and_steer_placement() {
    // Two children of `a`, each a bit faster on p1 than p0; the p0 → p1 link is slow,
    // the p0 → p2 link free: HEFT must send the children to p0 and p2, not to p1.
    let text = r#"{"processors": 3,
        "tasks": [{"id": "a", "cost": [1, null, null]},
                  {"id": "b", "cost": [10, 9, 10]},
                  {"id": "c", "cost": [10, 9, 10]}],
        "edges": [{"from": "a", "to": "b", "cost": 5}, {"from": "a", "to": "c", "cost": 5}],
        "links": [[0, 4, 0], [4, 0, 1], [0, 1, 0]]}"#;
    let g = CostGraph::from_json(text).unwrap();
    assert_eq!(g.comm(0, 0, 1), 20.0);
    assert_eq!(g.comm(0, 0, 2), 0.0);
    assert_eq!(g.link(1, 2), 1.0);
    let s = heft(&g);
    s.validate(&g).unwrap();
    assert_eq!(s.makespan, 11.0);
    let mut procs: Vec<usize> = s.tasks[1..].iter().map(|t| t.processor).collect();
    procs.sort_unstable();
    assert_eq!(procs, [0, 2]);
    for policy in Policy::ALL {
        policy.schedule(&g).validate(&g).unwrap();
    }
}

#[test]
fn a_graph_without_tasks_has_makespan_zero() {
    let g = CostGraph::from_json(r#"{"processors": 2, "tasks": []}"#).unwrap();
    for policy in Policy::ALL {
        let s = policy.schedule(&g);
        assert_eq!(
            s,
            Schedule {
                makespan: 0.0,
                tasks: vec![]
            }
        );
    }
}

fn refused(text: &str) -> String {
    match CostGraph::from_json(text) {
        Err(Error::InvalidArgument { message }) => message,
        Err(e) => panic!("not InvalidArgument: {e:?} for {text}"),
        Ok(_) => panic!("accepted: {text}"),
    }
}

#[test]
fn bad_graphs_are_refused_naming_the_culprit() {
    let cases: &[(&str, &[&str])] = &[
        (r#"{"processors": 2, "tasks": ["#, &["not valid JSON", "line 1", "column"]),
        (
            "{\"processors\": 2,\n \"tasks\": [{\"id\": \"t1\", \"cost\": [1, 2]}],\n \"edges\": [{\"from\": \"t1\" \"to\": \"t1\"}]}",
            &["line 3", "column"],
        ),
        (r#"{"processors": 2, "tasks": [{"id": "t1", "cots": [1, 2]}]}"#, &["cots"]),
        (r#"{"tasks": []}"#, &["processors"]),
        (r#"{"processors": 0, "tasks": []}"#, &["no processors"]),
        (r#"{"processors": [], "tasks": []}"#, &["no processors"]),
        (r#"{"processors": -1, "tasks": []}"#, &["-1", "not a count"]),
        (r#"{"processors": "gpu", "tasks": []}"#, &["\"gpu\"", "count"]),
        (r#"{"processors": 1000000000, "tasks": []}"#, &["1000000000"]),
        (r#"{"processors": ["a", "a"], "tasks": []}"#, &["\"a\"", "own name"]),
        (
            r#"{"processors": 1, "tasks": [{"id": "t1", "cost": [1]}, {"id": "t1", "cost": [2]}]}"#,
            &["\"t1\"", "tasks 0 and 1"],
        ),
        (
            r#"{"processors": 1, "tasks": [{"id": "", "cost": [1]}]}"#,
            &["task 0", "empty id"],
        ),
        (
            r#"{"processors": 3, "tasks": [{"id": "t7", "cost": [1, 2]}]}"#,
            &["\"t7\"", "2 costs", "3 processors"],
        ),
        (
            r#"{"processors": 2, "tasks": [{"id": "t7", "cost": [1, -2]}]}"#,
            &["\"t7\"", "-2", "processor 1"],
        ),
        (
            r#"{"processors": 2, "tasks": [{"id": "t7", "cost": [1, "fast"]}]}"#,
            &["\"t7\"", "fast"],
        ),
        (
            r#"{"processors": 2, "tasks": [{"id": "t7", "cost": [null, null]}]}"#,
            &["\"t7\"", "cannot run on any processor"],
        ),
        (
            r#"{"processors": ["cpu"], "tasks": [{"id": "t7", "cost": {"gpu": 1}}]}"#,
            &["\"t7\"", "\"gpu\""],
        ),
        (
            r#"{"processors": ["cpu", "gpu"], "tasks": [{"id": "t7", "cost": {}}]}"#,
            &["\"t7\"", "cannot run on any processor"],
        ),
        (
            r#"{"processors": 1, "tasks": [{"id": "t7", "cost": 3}]}"#,
            &["\"t7\"", "one cost per processor"],
        ),
        (
            r#"{"processors": 1, "tasks": [{"id": "a", "cost": [1]}],
                "edges": [{"from": "a", "to": "zz", "cost": 1}]}"#,
            &["\"zz\"", "edge 0"],
        ),
        (
            r#"{"processors": 1, "tasks": [{"id": "a", "cost": [1]}],
                "edges": [{"from": "a", "to": "a", "cost": 1}]}"#,
            &["\"a\"", "itself"],
        ),
        (
            r#"{"processors": 1, "tasks": [{"id": "a", "cost": [1]}, {"id": "b", "cost": [1]}],
                "edges": [{"from": "a", "to": "b", "cost": -1}]}"#,
            &["edge 0", "\"a\"", "\"b\"", "-1"],
        ),
        (
            r#"{"processors": 1, "tasks": [{"id": "a", "cost": [1]}, {"id": "b", "cost": [1]}],
                "edges": [{"from": "a", "to": "b"}, {"from": "a", "to": "b", "cost": 2}]}"#,
            &["edges 0 and 1", "\"a\"", "\"b\""],
        ),
        (
            r#"{"processors": 1,
                "tasks": [{"id": "s", "cost": [1]}, {"id": "x", "cost": [1]},
                          {"id": "y", "cost": [1]}, {"id": "z", "cost": [1]}],
                "edges": [{"from": "s", "to": "x"}, {"from": "x", "to": "y"},
                          {"from": "y", "to": "z"}, {"from": "z", "to": "x"}]}"#,
            &["cycle", "\"x\" -> \"y\" -> \"z\" -> \"x\""],
        ),
        (
            r#"{"processors": 2, "tasks": [], "links": [[0, 1]]}"#,
            &["links", "2 × 2"],
        ),
        (
            r#"{"processors": 2, "tasks": [], "links": [[0, -1], [1, 0]]}"#,
            &["links[0][1]", "-1"],
        ),
    ];
    for (text, needles) in cases {
        let message = refused(text);
        for needle in *needles {
            assert!(
                message.contains(needle),
                "{needle:?} not in {message:?} (input {text})"
            );
        }
    }
}

#[test]
fn bad_graphs_built_in_rust_are_refused_too() {
    let names = CostGraph::default_processor_names(2);
    let task = |id: &str, cost: Vec<f64>| Task {
        id: id.into(),
        cost,
    };
    let message = |r: xpu_hal::Result<CostGraph>| match r {
        Err(Error::InvalidArgument { message }) => message,
        other => panic!("{other:?}"),
    };
    let m = message(CostGraph::new(
        names.clone(),
        vec![task("t1", vec![f64::NAN, 1.0])],
        vec![],
        None,
    ));
    assert!(m.contains("\"t1\"") && m.contains("NaN"), "{m}");
    let m = message(CostGraph::new(
        names.clone(),
        vec![task("t1", vec![1.0, 1.0])],
        vec![Edge {
            from: 0,
            to: 5,
            cost: 1.0,
        }],
        None,
    ));
    assert!(m.contains("edge 0") && m.contains('5'), "{m}");
    let m = message(CostGraph::new(
        names.clone(),
        vec![task("a", vec![1.0, 1.0]), task("b", vec![1.0, 1.0])],
        vec![Edge {
            from: 0,
            to: 1,
            cost: f64::INFINITY,
        }],
        None,
    ));
    assert!(m.contains("edge 0") && m.contains("inf"), "{m}");
    let m = message(CostGraph::new(
        names.clone(),
        vec![],
        vec![],
        Some(vec![vec![0.0, f64::NAN], vec![1.0, 0.0]]),
    ));
    assert!(m.contains("links[0][1]"), "{m}");
    let m = message(CostGraph::new(vec![], vec![], vec![], None));
    assert!(m.contains("no processors"), "{m}");
}

#[test]
fn schedules_round_trip_through_json() {
    let g = data("topcuoglu2002.json");
    for policy in Policy::ALL {
        let s = policy.schedule(&g);
        let text = s.to_json();
        let back: Schedule = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        back.validate(&g).unwrap();
    }
    let s = heft(&g);
    let v: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
    assert_eq!(v["makespan"], 80.0);
    let first = &v["tasks"][0];
    let mut keys: Vec<&str> = first
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["finish", "id", "processor", "start"]);
    assert_eq!(first["id"], "t1");
    assert_eq!(first["processor"], 2);
    // The graph itself round-trips too.
    assert_eq!(CostGraph::from_json(&g.to_json()).unwrap(), g);
}

#[test]
fn validate_catches_each_kind_of_violation() {
    let g = data("topcuoglu2002.json");
    let good = heft(&g);
    let broken = |f: &dyn Fn(&mut Vec<Placed>)| {
        let mut s = good.clone();
        f(&mut s.tasks);
        s.validate(&g).unwrap_err()
    };
    let e = broken(&|t| t[1].processor = 7);
    assert!(e.contains("\"t2\"") && e.contains("processor 7"), "{e}");
    let e = broken(&|t| t[1].finish += 1.0);
    assert!(e.contains("\"t2\"") && e.contains("cost"), "{e}");
    // t8 on P1 from 57: move it earlier than t2's output (t2 ends at 40 on P1, t4's
    // output from P2 arrives at 26 + 27 = 53).
    let e = broken(&|t| {
        t[7].start = 45.0;
        t[7].finish = 50.0;
    });
    assert!(e.contains("\"t8\"") && e.contains("\"t4\""), "{e}");
    // t5 on P3 [28, 38] moved onto P2 over t6 [26, 42] (P2 cost 13).
    let e = broken(&|t| {
        t[4].processor = 1;
        t[4].finish = 41.0;
    });
    assert!(e.contains("overlap") && e.contains("\"t5\""), "{e}");
    let e = broken(&|t| t.swap(0, 1));
    assert!(e.contains("entry 0"), "{e}");
    let mut s = good.clone();
    s.makespan = 81.0;
    assert!(s.validate(&g).unwrap_err().contains("makespan"));
}

#[test]
fn policies_parse_by_name() {
    for policy in Policy::ALL {
        assert_eq!(policy.name().parse::<Policy>().unwrap(), policy);
    }
    assert_eq!("HEFT_LA".parse::<Policy>().unwrap(), Policy::HeftLa);
    let Err(Error::InvalidArgument { message }) = "fastest".parse::<Policy>() else {
        panic!("accepted");
    };
    assert!(
        message.contains("fastest") && message.contains("heft-la"),
        "{message}"
    );
}
