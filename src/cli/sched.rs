//! `xpu sched`: plan a task graph on given processors without running it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde::Serialize;
use xpu::scheduler::sim::{self, CostGraph, Policy, Schedule};
use xpu::{Error, Result};

/// The `xpu sched` subcommands.
#[derive(Subcommand, Debug)]
pub enum SchedCommand {
    /// Schedule a task graph with known costs on given processors, executing nothing,
    /// and print where and when each task runs and the makespan.
    Simulate {
        /// The graph, JSON: {"processors": P or ["name", …], "tasks": [{"id", "cost":
        /// [per processor, null where it cannot run]}], "edges": [{"from", "to",
        /// "cost"}], "links": optional P×P multipliers of edge costs}.
        #[arg(long, value_name = "FILE")]
        graph: PathBuf,
        /// The policy: heft, heft-la, peft, dmda, eager, ws, or best (the smallest
        /// makespan of heft, heft-la and peft).
        #[arg(long, default_value = "best")]
        policy: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Also print the makespan of every policy side by side.
        #[arg(long)]
        compare: bool,
    },
}

/// One policy's makespan, for `--compare`.
#[derive(Serialize)]
struct Compared {
    policy: &'static str,
    makespan: f64,
}

/// What `xpu sched simulate --json` prints.
#[derive(Serialize)]
struct SimulateJson<'a> {
    /// The policy asked for.
    policy: &'static str,
    /// The policy that made the schedule (differs from `policy` for `best`).
    chosen: &'static str,
    processors: &'a [String],
    lower_bound: f64,
    #[serde(flatten)]
    schedule: &'a Schedule,
    #[serde(skip_serializing_if = "Option::is_none")]
    compare: Option<Vec<Compared>>,
}

/// Runs an `xpu sched` subcommand.
pub fn run(command: &SchedCommand) -> Result<bool> {
    match command {
        SchedCommand::Simulate {
            graph,
            policy,
            json,
            compare,
        } => simulate(graph, policy, *json, *compare),
    }
}

/// The graph in `path`; errors name the file.
fn load(path: &Path) -> Result<CostGraph> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::invalid(format!(
            "cannot read the graph file {}: {e}",
            path.display()
        ))
    })?;
    CostGraph::from_json(&text).map_err(|e| match e {
        Error::InvalidArgument { message } => {
            Error::invalid(format!("{}: {message}", path.display()))
        }
        other => other,
    })
}

fn simulate(path: &Path, policy: &str, json: bool, compare: bool) -> Result<bool> {
    let policy: Policy = policy.parse()?;
    let graph = load(path)?;
    let (chosen, schedule) = match policy {
        Policy::Best => sim::best(&graph),
        other => (other, other.schedule(&graph)),
    };
    let compared = compare.then(|| {
        Policy::ALL
            .iter()
            .filter(|&&p| p != Policy::Best)
            .map(|&p| Compared {
                policy: p.name(),
                makespan: if p == chosen {
                    schedule.makespan
                } else {
                    p.schedule(&graph).makespan
                },
            })
            .collect::<Vec<_>>()
    });
    if json {
        let out = SimulateJson {
            policy: policy.name(),
            chosen: chosen.name(),
            processors: graph.processors(),
            lower_bound: graph.lower_bound(),
            schedule: &schedule,
            compare: compared,
        };
        let text = serde_json::to_string_pretty(&out)
            .map_err(|e| Error::invalid(format!("cannot write the schedule as JSON: {e}")))?;
        println!("{text}");
    } else {
        print!(
            "{}",
            table(&graph, &schedule, policy, chosen, compared.as_deref())
        );
    }
    Ok(true)
}

/// A time with at most six significant digits: `80`, `63.3333`, `1.5e-7`.
fn time(t: f64) -> String {
    let rounded: f64 = format!("{t:.5e}").parse().unwrap_or(t);
    format!("{rounded}")
}

/// The readable form: per processor, its tasks in order with start and finish; then
/// the makespan; then, with `--compare`, every policy's makespan.
fn table(
    graph: &CostGraph,
    schedule: &Schedule,
    policy: Policy,
    chosen: Policy,
    compared: Option<&[Compared]>,
) -> String {
    let mut rows: Vec<[String; 4]> = Vec::new();
    for (p, tasks) in schedule
        .by_processor(graph.num_processors())
        .iter()
        .enumerate()
    {
        let name = graph.processors()[p].clone();
        if tasks.is_empty() {
            rows.push([name.clone(), "(idle)".into(), String::new(), String::new()]);
        }
        for (k, &t) in tasks.iter().enumerate() {
            let placed = &schedule.tasks[t];
            rows.push([
                if k == 0 { name.clone() } else { String::new() },
                placed.id.clone(),
                time(placed.start),
                time(placed.finish),
            ]);
        }
    }
    let header = ["processor", "task", "start", "finish"];
    let mut width = header.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: [&str; 4]| {
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2],
            w3 = width[3]
        );
    };
    line(&mut out, header);
    for row in &rows {
        line(&mut out, [&row[0], &row[1], &row[2], &row[3]]);
    }
    let by = if policy == chosen {
        policy.name().to_string()
    } else {
        format!("{policy}: {chosen}")
    };
    let _ = writeln!(
        out,
        "\nmakespan {} ({by}); lower bound {}; {} tasks on {} processors",
        time(schedule.makespan),
        time(graph.lower_bound()),
        graph.num_tasks(),
        graph.num_processors()
    );
    if let Some(compared) = compared {
        let w = compared
            .iter()
            .map(|c| c.policy.len())
            .fold("policy".len(), usize::max);
        let _ = writeln!(out, "\n{:<w$}  makespan", "policy");
        for c in compared {
            let mark = if c.policy == chosen.name() {
                "  <- chosen"
            } else {
                ""
            };
            let _ = writeln!(out, "{:<w$}  {:>8}{mark}", c.policy, time(c.makespan));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::time;

    #[test]
    fn times_keep_six_significant_digits() {
        assert_eq!(time(80.0), "80");
        assert_eq!(time(63.333_333_333), "63.3333");
        assert_eq!(time(0.0), "0");
        assert_eq!(time(1.234_567_8e-7), "0.000000123457");
    }
}
