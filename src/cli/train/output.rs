//! What `xpu train` shows while it runs: a progress bar on a terminal, plain lines
//! otherwise, or one JSON object per logged step; and the run's timeline, profiled a
//! logging window at a time.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use xpu::scheduler::Profile;
use xpu::Result;
use xpu_train::elastic::Recovery;
use xpu_train::{StepReport, Trainer};

/// Where the lines go.
pub enum Reporter {
    /// One JSON object per line.
    Json,
    /// Plain lines (not a terminal).
    Plain,
    /// A progress bar with the lines printed above it.
    Bar(ProgressBar),
    /// Nothing: another process of a run across processes prints for all.
    Silent,
}

/// One logged step's figures.
pub struct Logged<'a> {
    pub report: &'a StepReport,
    pub steps: u64,
    pub examples_per_s: f64,
    pub tokens_per_s: f64,
    pub busy: Option<serde_json::Map<String, Value>>,
}

impl Reporter {
    /// JSON when asked for, a bar when stdout and stderr are terminals, plain lines
    /// otherwise; nothing unless `printing`.
    pub fn new(printing: bool, json: bool, steps: u64, done: u64) -> Reporter {
        if !printing {
            return Reporter::Silent;
        }
        if json {
            return Reporter::Json;
        }
        // The bar and the lines above it are drawn on stderr.
        if !(std::io::stdout().is_terminal() && std::io::stderr().is_terminal()) {
            return Reporter::Plain;
        }
        let bar = ProgressBar::new(steps);
        if let Ok(style) =
            ProgressStyle::with_template("{bar:30.cyan/blue} step {pos}/{len}  {msg}  ETA {eta}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_position(done);
        Reporter::Bar(bar)
    }

    /// A line of text (plain and bar modes only).
    pub fn line(&self, text: &str) {
        match self {
            Reporter::Json | Reporter::Silent => {}
            Reporter::Plain => println!("{text}"),
            Reporter::Bar(bar) => bar.println(text),
        }
    }

    /// An event: `text` as a line, or `object` as JSON.
    pub fn event(&self, text: &str, object: Value) {
        match self {
            Reporter::Json => println!("{object}"),
            Reporter::Silent => {}
            _ => self.line(text),
        }
    }

    /// Every step: moves the bar.
    pub fn tick(&self, report: &StepReport, tokens_per_s: f64) {
        if let Reporter::Bar(bar) = self {
            bar.set_position(report.step);
            bar.set_message(format!(
                "loss {:.4}  {tokens_per_s:.0} tokens/s",
                report.loss
            ));
        }
    }

    /// A logged step.
    pub fn logged(&self, l: &Logged<'_>) {
        let r = l.report;
        match self {
            Reporter::Json => println!(
                "{}",
                json!({
                    "step": r.step,
                    "loss": r.loss,
                    "tokens_per_s": l.tokens_per_s,
                    "examples_per_s": l.examples_per_s,
                    "shares": r.shares,
                    "devices": r.devices,
                    "busy_frac": l.busy,
                    "loss_scale": r.loss_scale,
                })
            ),
            Reporter::Silent => {}
            _ => {
                let shares: Vec<String> = r.shares.iter().map(u64::to_string).collect();
                self.line(&format!(
                    "step {:>6}/{}  loss {:.4}  {:>9.0} tokens/s  micro-batches {}",
                    r.step,
                    l.steps,
                    r.loss,
                    l.tokens_per_s,
                    shares.join("+")
                ));
            }
        }
    }

    /// A recovery from a device failure.
    pub fn recovered(&self, r: &Recovery) {
        let lost: Vec<String> = r
            .lost
            .iter()
            .map(|(d, why)| format!("{d} ({why})"))
            .collect();
        self.event(
            &format!(
                "step {} failed: lost {}; the group is re-formed on {} and continues from step {} ({:.2} s)",
                r.failed_step,
                lost.join(", "),
                r.survivors.join(", "),
                r.resumed_at,
                r.seconds
            ),
            json!({
                "step": r.failed_step,
                "recovered": {
                    "lost": r.lost.iter().map(|(d, why)| json!({"device": d, "error": why})).collect::<Vec<_>>(),
                    "survivors": r.survivors,
                    "resumed_at": r.resumed_at,
                    "seconds": r.seconds,
                }
            }),
        );
        if let Reporter::Bar(bar) = self {
            bar.set_position(r.resumed_at);
        }
    }

    /// Removes the bar before the summary.
    pub fn finish(&self) {
        if let Reporter::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// The run's timeline, profiled a logging window at a time.
pub struct Timeline {
    /// The windows so far, as one profile.
    pub whole: Option<Profile>,
    /// Whether replayed runs are split into their tasks (a span each).
    tasks: bool,
}

impl Timeline {
    /// Starts profiling `trainer`'s scheduler: every task (`tasks`), or replayed runs
    /// as one span each.
    pub fn start(trainer: &Trainer, tasks: bool) -> Result<Timeline> {
        let t = Timeline { whole: None, tasks };
        t.restart(trainer)?;
        Ok(t)
    }

    /// Starts a profile of the timeline's kind on `trainer`'s scheduler.
    pub fn restart(&self, trainer: &Trainer) -> Result<()> {
        if self.tasks {
            trainer.scheduler().start_profiling()
        } else {
            trainer.scheduler().start_profiling_runs()
        }
    }

    /// Ends the current window (returning it) and starts the next when `next`.
    pub fn window(&mut self, trainer: &Trainer, next: bool) -> Result<Profile> {
        let window = trainer.scheduler().stop_profiling()?;
        let offset = match &self.whole {
            None => 0.0,
            Some(w) => w.length,
        };
        match &mut self.whole {
            None => self.whole = Some(window.clone()),
            Some(w) => w.append(window.clone(), offset),
        }
        if next {
            self.restart(trainer)?;
        }
        Ok(window)
    }
}

/// Each device's busy share of `p`, by device id.
pub fn busy(p: &Profile) -> serde_json::Map<String, Value> {
    p.summary()
        .into_iter()
        .filter(|d| d.tasks > 0)
        .map(|d| (d.device, json!(d.busy_fraction)))
        .collect()
}

/// The largest replica memory each device held in `p`, by device id.
pub fn peak_memory(p: &Profile) -> serde_json::Map<String, Value> {
    let mut peak = vec![0u64; p.devices.len()];
    for m in &p.memory {
        if let Some(v) = peak.get_mut(m.device) {
            *v = (*v).max(m.bytes);
        }
    }
    p.devices
        .iter()
        .zip(peak)
        .map(|(d, b)| (d.clone(), json!(b)))
        .collect()
}

/// Whether a span is an all-reduce of the gradients.
pub fn is_all_reduce(s: &xpu::scheduler::profile::Span) -> bool {
    s.name == "all_reduce"
}
