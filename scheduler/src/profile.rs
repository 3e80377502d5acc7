//! Profiling: what ran where and when, as a Chrome/Perfetto trace and a summary.
//!
//! While profiling is on ([`crate::Scheduler::start_profiling`], or `XPU_PROFILE=FILE`,
//! which writes the trace when the scheduler is dropped), every task, copy and
//! write-back records an event before and after it on its stream. Times are device
//! timestamps: each device gets an origin event when profiling starts, whose completion
//! is taken as the device's time zero on the host's clock, so all devices share one
//! timeline (to the accuracy of one event wait). Devices that cannot time events keep
//! their work out of the timeline and are named in the summary.
//!
//! The trace ([`Profile::to_chrome_json`]) has one process per device and one thread per
//! stream (`tasks`, `copies in`), a complete event (`ph: X`) per task or copy with its
//! handles and bytes, flow arrows (`ph: s`/`f`) from each task to the tasks that
//! depended on it, and a counter (`ph: C`) of the bytes of replicas each device holds.
//! It opens in ui.perfetto.dev or chrome://tracing.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;
use serde_json::{json, Value};

/// What a span is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// A task.
    Task,
    /// A copy bringing a handle to a device.
    Fetch,
    /// A copy of a handle back to its home.
    WriteBack,
}

/// One piece of work on one stream.
#[derive(Debug, Clone, Serialize)]
pub struct Span {
    /// What it is.
    pub kind: SpanKind,
    /// The task's name, or the handle copied.
    pub name: String,
    /// The task's id (tasks only).
    pub task: Option<u64>,
    /// The device's index in the scheduler.
    pub device: usize,
    /// 0 for the task stream, 1 for the copy stream, 2 for the collectives' stream.
    pub stream: usize,
    /// Seconds from the profile's start.
    pub start: f64,
    /// Seconds from the profile's start.
    pub end: f64,
    /// Bytes moved (copies) or touched (tasks).
    pub bytes: u64,
    /// Tasks this one waited for (tasks only).
    pub deps: Vec<u64>,
}

/// A sample of the bytes of replicas a device held.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MemorySample {
    /// The device's index.
    pub device: usize,
    /// Seconds from the profile's start (host clock, when the change was made).
    pub at: f64,
    /// Bytes of replicas held there.
    pub bytes: u64,
}

/// Per-device figures of a profile.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceSummary {
    /// The device's id.
    pub device: String,
    /// Tasks run there.
    pub tasks: u64,
    /// Seconds its task stream was busy (tasks only, overlaps merged).
    pub busy_s: f64,
    /// `busy_s` over the profile's length.
    pub busy_fraction: f64,
    /// Seconds its task stream was idle within the profile.
    pub idle_s: f64,
    /// Bytes copied to it.
    pub bytes_in: u64,
    /// Bytes copied from it to homes.
    pub bytes_out: u64,
    /// Whether its work is on the timeline (the device times events).
    pub timed: bool,
}

/// A finished profile.
#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    /// Device ids, in scheduler order.
    pub devices: Vec<String>,
    /// Whether each device times events.
    pub timed: Vec<bool>,
    /// Every span, in submission order.
    pub spans: Vec<Span>,
    /// Replica memory over time.
    pub memory: Vec<MemorySample>,
    /// Seconds from the start to the end of the last span.
    pub length: f64,
}

/// Merged length of `intervals`.
fn covered(mut intervals: Vec<(f64, f64)>) -> f64 {
    intervals.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut current: Option<(f64, f64)> = None;
    for (s, e) in intervals {
        match &mut current {
            Some((_, ce)) if s <= *ce => *ce = ce.max(e),
            _ => {
                if let Some((cs, ce)) = current {
                    total += ce - cs;
                }
                current = Some((s, e));
            }
        }
    }
    if let Some((cs, ce)) = current {
        total += ce - cs;
    }
    total
}

/// Merges `intervals` into disjoint, sorted ones.
fn merged(mut intervals: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    intervals.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(intervals.len());
    for (s, e) in intervals {
        match out.last_mut() {
            Some((_, ce)) if s <= *ce => *ce = ce.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// The length of the intersection of two sets of disjoint, sorted intervals.
fn intersection(a: &[(f64, f64)], b: &[(f64, f64)]) -> f64 {
    let (mut i, mut j, mut total) = (0, 0, 0.0);
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if e > s {
            total += e - s;
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    total
}

impl Profile {
    /// Appends `later`, a profile recorded after this one, its times shifted by
    /// `offset` seconds (where it started in this one's time): one timeline out of
    /// profiles taken in turn. Devices are matched by name, so `later` may come from
    /// another scheduler over other devices (a group re-formed after a failure); its
    /// devices this one lacks are added.
    pub fn append(&mut self, later: Profile, offset: f64) {
        let index: Vec<usize> = later
            .devices
            .iter()
            .map(|name| match self.devices.iter().position(|d| d == name) {
                Some(i) => i,
                None => {
                    self.devices.push(name.clone());
                    self.devices.len() - 1
                }
            })
            .collect();
        for mut s in later.spans {
            s.start += offset;
            s.end += offset;
            s.device = index.get(s.device).copied().unwrap_or(s.device);
            self.spans.push(s);
        }
        for mut m in later.memory {
            m.at += offset;
            m.device = index.get(m.device).copied().unwrap_or(m.device);
            self.memory.push(m);
        }
        self.length = self.length.max(later.length + offset);
    }

    /// The share of the time of the tasks `is_comm` picks (communication) during which
    /// other tasks ran on any device: per device, the merged communication intervals
    /// against the merged intervals of every other task, summed over the devices. 0
    /// when there is no communication.
    pub fn overlap_fraction(&self, is_comm: impl Fn(&Span) -> bool) -> f64 {
        let tasks = || self.spans.iter().filter(|s| s.kind == SpanKind::Task);
        let compute = merged(
            tasks()
                .filter(|s| !is_comm(s))
                .map(|s| (s.start, s.end))
                .collect(),
        );
        let (mut comm_total, mut hidden) = (0.0, 0.0);
        for d in 0..self.devices.len() {
            let comm = merged(
                tasks()
                    .filter(|s| s.device == d && is_comm(s))
                    .map(|s| (s.start, s.end))
                    .collect(),
            );
            comm_total += comm.iter().map(|(s, e)| e - s).sum::<f64>();
            hidden += intersection(&comm, &compute);
        }
        if comm_total > 0.0 {
            hidden / comm_total
        } else {
            0.0
        }
    }

    /// Per-device figures.
    pub fn summary(&self) -> Vec<DeviceSummary> {
        let length = self.length.max(f64::MIN_POSITIVE);
        self.devices
            .iter()
            .enumerate()
            .map(|(d, id)| {
                let tasks: Vec<&Span> = self
                    .spans
                    .iter()
                    .filter(|s| s.device == d && s.kind == SpanKind::Task)
                    .collect();
                let busy = covered(tasks.iter().map(|s| (s.start, s.end)).collect());
                let bytes = |k: SpanKind| -> u64 {
                    self.spans
                        .iter()
                        .filter(|s| s.device == d && s.kind == k)
                        .map(|s| s.bytes)
                        .sum()
                };
                DeviceSummary {
                    device: id.clone(),
                    tasks: tasks.len() as u64,
                    busy_s: busy,
                    busy_fraction: busy / length,
                    idle_s: (self.length - busy).max(0.0),
                    bytes_in: bytes(SpanKind::Fetch),
                    bytes_out: bytes(SpanKind::WriteBack),
                    timed: self.timed.get(d).copied().unwrap_or(false),
                }
            })
            .collect()
    }

    /// The Chrome trace-event JSON (see the module docs).
    pub fn to_chrome_json(&self) -> Value {
        let us = |s: f64| s * 1e6;
        let mut events: Vec<Value> = Vec::new();
        for (d, id) in self.devices.iter().enumerate() {
            events.push(json!({"name": "process_name", "ph": "M", "pid": d, "args": {"name": id}}));
            events.push(json!({"name": "process_sort_index", "ph": "M", "pid": d, "args": {"sort_index": d}}));
            for (t, name) in [(0, "tasks"), (1, "copies in")] {
                events.push(json!({"name": "thread_name", "ph": "M", "pid": d, "tid": t, "args": {"name": name}}));
            }
        }
        let mut where_task: HashMap<u64, &Span> = HashMap::new();
        for s in &self.spans {
            let mut args = json!({"bytes": s.bytes});
            if let Some(t) = s.task {
                args["task"] = json!(t);
                where_task.insert(t, s);
            }
            events.push(json!({
                "name": s.name,
                "cat": match s.kind { SpanKind::Task => "task", SpanKind::Fetch => "fetch", SpanKind::WriteBack => "write_back" },
                "ph": "X",
                "ts": us(s.start),
                "dur": us((s.end - s.start).max(0.0)),
                "pid": s.device,
                "tid": s.stream,
                "args": args,
            }));
        }
        let mut flow = 0u64;
        for s in self.spans.iter().filter(|s| s.kind == SpanKind::Task) {
            for dep in &s.deps {
                let Some(from) = where_task.get(dep) else {
                    continue;
                };
                flow += 1;
                events.push(
                    json!({"name": "dependency", "cat": "dependency", "ph": "s", "id": flow,
                    "ts": us(from.end), "pid": from.device, "tid": from.stream}),
                );
                events.push(json!({"name": "dependency", "cat": "dependency", "ph": "f", "bp": "e", "id": flow,
                    "ts": us(s.start.max(from.end)), "pid": s.device, "tid": s.stream}));
            }
        }
        for m in &self.memory {
            events.push(
                json!({"name": "replica bytes", "ph": "C", "ts": us(m.at), "pid": m.device,
                "args": {"bytes": m.bytes}}),
            );
        }
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {"summary": self.summary()},
        })
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<20} {:>7} {:>10} {:>6} {:>10} {:>12} {:>12}",
            "device", "tasks", "busy ms", "busy%", "idle ms", "bytes in", "bytes out"
        )?;
        for s in self.summary() {
            writeln!(
                f,
                "{:<20} {:>7} {:>10.3} {:>5.1}% {:>10.3} {:>12} {:>12}{}",
                s.device,
                s.tasks,
                s.busy_s * 1e3,
                s.busy_fraction * 100.0,
                s.idle_s * 1e3,
                s.bytes_in,
                s.bytes_out,
                if s.timed { "" } else { "  (no event timing)" }
            )?;
        }
        write!(f, "length {:.3} ms", self.length * 1e3)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn overlap_counts_communication_hidden_under_other_tasks() {
        let span = |name: &str, device, start, end| Span {
            kind: SpanKind::Task,
            name: name.into(),
            task: None,
            device,
            stream: 0,
            start,
            end,
            bytes: 0,
            deps: Vec::new(),
        };
        let mut p = Profile {
            devices: vec!["a".into(), "b".into()],
            timed: vec![true, true],
            spans: vec![
                span("all_reduce", 0, 1.0, 3.0),
                span("matmul", 1, 0.0, 2.0),
                span("all_reduce", 1, 2.0, 3.0),
            ],
            memory: Vec::new(),
            length: 3.0,
        };
        let comm = |s: &Span| s.name == "all_reduce";
        // Device 0: 1 of its 2 s under device 1's matmul; device 1: none of its 1 s.
        assert!((p.overlap_fraction(comm) - 1.0 / 3.0).abs() < 1e-12);
        let later = Profile {
            spans: vec![span("matmul", 0, 0.0, 1.0)],
            length: 1.0,
            ..p.clone()
        };
        p.append(later, 2.5);
        assert_eq!(p.spans.last().map(|s| (s.start, s.end)), Some((2.5, 3.5)));
        assert_eq!(p.length, 3.5);
        // Device 0's all-reduce from 2.5 to 3 and device 1's are now under device 0's
        // later matmul too: 1.5 + 0.5 of 3 s.
        assert!((p.overlap_fraction(comm) - 2.0 / 3.0).abs() < 1e-12);
    }

    use super::*;

    fn span(
        kind: SpanKind,
        device: usize,
        start: f64,
        end: f64,
        task: Option<u64>,
        deps: Vec<u64>,
    ) -> Span {
        Span {
            kind,
            name: "x".into(),
            task,
            device,
            stream: usize::from(kind != SpanKind::Task),
            start,
            end,
            bytes: 10,
            deps,
        }
    }

    #[test]
    fn busy_time_merges_overlaps_and_the_trace_has_flows() {
        let p = Profile {
            devices: vec!["host:0".into(), "host:1".into()],
            timed: vec![true, true],
            spans: vec![
                span(SpanKind::Task, 0, 0.0, 1.0, Some(0), vec![]),
                span(SpanKind::Task, 0, 0.5, 2.0, Some(1), vec![]),
                span(SpanKind::Fetch, 1, 2.0, 2.5, None, vec![]),
                span(SpanKind::Task, 1, 2.5, 4.0, Some(2), vec![0, 1]),
            ],
            memory: vec![MemorySample {
                device: 1,
                at: 2.0,
                bytes: 10,
            }],
            length: 4.0,
        };
        let s = p.summary();
        assert!((s[0].busy_s - 2.0).abs() < 1e-12);
        assert!((s[0].busy_fraction - 0.5).abs() < 1e-12);
        assert_eq!(s[1].bytes_in, 10);
        let trace = p.to_chrome_json();
        let events = trace["traceEvents"].as_array().unwrap();
        assert_eq!(events.iter().filter(|e| e["ph"] == "s").count(), 2);
        assert_eq!(events.iter().filter(|e| e["ph"] == "X").count(), 4);
        assert_eq!(events.iter().filter(|e| e["ph"] == "C").count(), 1);
        assert!(p.to_string().contains("host:1"));
    }
}
