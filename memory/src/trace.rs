//! Trace file formats: reading allocation traces from other tools and writing them back.
//!
//! A [`Trace`] is a list of tensors, each allocated at the start of one op and freed at the end
//! of a later one. Three file formats convert to it:
//!
//! * **allocsim** ([`TraceFormat::Allocsim`]): one tensor per line, `start_op end_op bytes`,
//!   whitespace separated; blank lines and lines starting with `#` are skipped. This is the
//!   format of the allocatorSim traces (see [`Trace::parse`]) and the one
//!   [`Trace::to_allocsim`] writes.
//! * **rmm-csv** ([`TraceFormat::RmmCsv`]): the CSV log written by RAPIDS RMM's
//!   `logging_resource_adaptor`. The first line is the header
//!   `Thread,Time,Action,Pointer,Size,Stream`; columns are found by name, so their order may
//!   differ and extra columns are ignored (only `Action`, `Pointer` and `Size` are required).
//!   `Action` is `allocate`, `allocate failure` or `free` (`deallocate` is accepted as
//!   `free`); pointers are hexadecimal, with or without `0x`. Every logged allocate and free
//!   is one op, in file order; a free is paired with the live allocation of the same pointer
//!   (its size must match), failed allocations are skipped, and so are zero-byte allocations
//!   at the null pointer. A free of a pointer that is not live is an error. Allocations never
//!   freed stay live until one op past the last event.
//! * **xpu-json** ([`TraceFormat::XpuJson`]): this crate's own event log, a JSON document
//!
//!   ```json
//!   {"format":"xpu-json","version":1,"events":[
//!   {"action":"alloc","id":0,"size":1048576,"stream":0},
//!   {"action":"free","id":0}
//!   ]}
//!   ```
//!
//!   Each event is one op, in order. `id` names an allocation from its `alloc` to its `free`
//!   and may be reused afterwards; `stream` is optional. A free of an id that is not live is
//!   an error; allocations never freed stay live until one op past the last event. Unknown
//!   fields are ignored. [`Trace::to_xpu_json`] writes the document with one event per line,
//!   ids numbered in allocation order and no streams.
//!
//! Streams: a [`crate::TraceEntry`] has no stream, and [`crate::replay`] runs every tensor on
//! one stream, so the streams of rmm-csv and xpu-json files are read and ignored.
//!
//! The allocator's own history ([`crate::TraceEvent`]) records sizes, streams and times but
//! not which block an event concerns, so a free cannot be paired with its allocation; an
//! xpu-json file is written by the program that owns the allocations (with its own ids), or
//! converted from another [`Trace`].

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;

use crate::replay::{Trace, TraceEntry};

/// A trace file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    /// `start_op end_op bytes` per line (allocatorSim).
    Allocsim,
    /// The CSV log of RAPIDS RMM's `logging_resource_adaptor`.
    RmmCsv,
    /// This crate's JSON event log.
    XpuJson,
}

/// What each format expects, for error messages.
const RMM_EXPECTS: &str = "rmm-csv expects the header `Thread,Time,Action,Pointer,Size,Stream` \
     and rows whose Action is `allocate`, `allocate failure` or `free`, with a hexadecimal \
     Pointer and a decimal Size";
const XPU_JSON_EXPECTS: &str = "xpu-json expects {\"format\":\"xpu-json\",\"version\":1,\
     \"events\":[{\"action\":\"alloc\",\"id\":N,\"size\":N},{\"action\":\"free\",\"id\":N},...]}";

impl TraceFormat {
    /// Every format, in the order of their names.
    pub const ALL: [TraceFormat; 3] = [
        TraceFormat::Allocsim,
        TraceFormat::RmmCsv,
        TraceFormat::XpuJson,
    ];

    /// The format called `name` (`allocsim`, `rmm-csv` or `xpu-json`).
    pub fn from_name(name: &str) -> Option<TraceFormat> {
        TraceFormat::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The format's name, as accepted by [`TraceFormat::from_name`].
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Allocsim => "allocsim",
            TraceFormat::RmmCsv => "rmm-csv",
            TraceFormat::XpuJson => "xpu-json",
        }
    }

    /// Guesses the format from a file's content: a JSON object is xpu-json, a first line
    /// naming `Action`, `Pointer` and `Size` columns is rmm-csv, and a first non-comment line
    /// of three unsigned integers is allocsim. `None` when nothing fits.
    pub fn detect(text: &str) -> Option<TraceFormat> {
        let text = text.trim_start_matches('\u{feff}');
        if text.trim_start().starts_with('{') {
            return Some(TraceFormat::XpuJson);
        }
        let first = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))?;
        if first.contains(',') {
            let columns = split_csv(first);
            let has = |name: &str| columns.iter().any(|c| c.eq_ignore_ascii_case(name));
            if has("Action") && has("Pointer") && has("Size") {
                return Some(TraceFormat::RmmCsv);
            }
            return None;
        }
        let fields: Vec<&str> = first.split_whitespace().collect();
        (fields.len() == 3 && fields.iter().all(|f| f.parse::<u64>().is_ok()))
            .then_some(TraceFormat::Allocsim)
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Trace {
    /// Parses `text` in `format`; the error names the line and what the format expects.
    pub fn parse_as(text: &str, format: TraceFormat) -> Result<Trace, String> {
        match format {
            TraceFormat::Allocsim => Trace::parse(text),
            TraceFormat::RmmCsv => parse_rmm_csv(text),
            TraceFormat::XpuJson => parse_xpu_json(text),
        }
    }

    /// Reads and parses the trace file at `path` in `format`, or in the format detected from
    /// its content when `format` is `None`. Errors start with the file's path.
    pub fn load_as(path: impl AsRef<Path>, format: Option<TraceFormat>) -> Result<Trace, String> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
        let format = match format.or_else(|| TraceFormat::detect(&text)) {
            Some(f) => f,
            None => {
                return Err(format!(
                    "{}: cannot tell the trace format from the content; name it: allocsim \
                     (`start_op end_op bytes` per line), rmm-csv (RMM logging_resource_adaptor \
                     CSV with header `Thread,Time,Action,Pointer,Size,Stream`) or xpu-json \
                     (a JSON object with \"format\":\"xpu-json\")",
                    path.display()
                ))
            }
        };
        Trace::parse_as(&text, format).map_err(|e| format!("{} ({format}): {e}", path.display()))
    }

    /// The trace in the allocsim format: one `start_op end_op bytes` line per entry, in order.
    pub fn to_allocsim(&self) -> String {
        let mut out = String::with_capacity(self.entries.len() * 24);
        for e in &self.entries {
            out.push_str(&format!("{} {} {}\n", e.start_op, e.end_op, e.bytes));
        }
        out
    }

    /// The trace as an xpu-json document, one event per line.
    ///
    /// Events follow the replay order: by op, the allocations starting at an op (in entry
    /// order) before the frees ending there. Ids are numbered in allocation order and every
    /// entry gets its free, so parsing the result gives the same allocate/free sequence (with
    /// ops renumbered one per event).
    pub fn to_xpu_json(&self) -> String {
        let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(self.entries.len() * 2);
        for (i, e) in self.entries.iter().enumerate() {
            events.push((e.start_op, 0, i));
            events.push((e.end_op, 1, i));
        }
        events.sort_unstable();
        let mut ids = vec![0u64; self.entries.len()];
        let mut next_id = 0u64;
        let mut out = String::with_capacity(self.entries.len() * 80 + 64);
        out.push_str("{\"format\":\"xpu-json\",\"version\":1,\"events\":[");
        for (n, &(_, kind, i)) in events.iter().enumerate() {
            out.push_str(if n == 0 { "\n" } else { ",\n" });
            if kind == 0 {
                ids[i] = next_id;
                next_id += 1;
                out.push_str(&format!(
                    "{{\"action\":\"alloc\",\"id\":{},\"size\":{}}}",
                    ids[i], self.entries[i].bytes
                ));
            } else {
                out.push_str(&format!("{{\"action\":\"free\",\"id\":{}}}", ids[i]));
            }
        }
        out.push_str("\n]}\n");
        out
    }
}

/// Splits one CSV line into trimmed fields; double quotes group a field and `""` inside
/// quotes is a quote.
fn split_csv(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field).trim().to_string()),
            _ => field.push(c),
        }
    }
    fields.push(field.trim().to_string());
    fields
}

/// Parses a hexadecimal pointer, with or without `0x`.
fn parse_pointer(s: &str) -> Option<u64> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// Pairs allocations and frees keyed by some id into trace entries, one op per event.
#[derive(Default)]
struct Pairing {
    entries: Vec<TraceEntry>,
    /// Live id → (entry index, line or event where it was allocated).
    live: HashMap<u64, (usize, usize)>,
    op: u64,
}

impl Pairing {
    /// An allocation of `bytes` named `key`, seen at `place`; the error names the earlier
    /// allocation still holding `key`.
    fn alloc(&mut self, key: u64, bytes: u64, place: usize) -> Result<(), usize> {
        if let Some(&(_, at)) = self.live.get(&key) {
            return Err(at);
        }
        self.live.insert(key, (self.entries.len(), place));
        self.entries.push(TraceEntry {
            start_op: self.op,
            end_op: self.op,
            bytes,
        });
        self.op += 1;
        Ok(())
    }

    /// The free of `key`; returns its entry, or `None` when `key` is not live.
    fn free(&mut self, key: u64) -> Option<&TraceEntry> {
        let (index, _) = self.live.remove(&key)?;
        let op = self.op;
        self.op += 1;
        let entry = self.entries.get_mut(index)?;
        entry.end_op = op;
        Some(entry)
    }

    /// The trace, with allocations never freed live until one op past the last event.
    fn finish(mut self) -> Trace {
        for (index, _) in self.live.into_values() {
            if let Some(e) = self.entries.get_mut(index) {
                e.end_op = self.op;
            }
        }
        Trace {
            entries: self.entries,
        }
    }
}

/// Parses an RMM `logging_resource_adaptor` CSV log.
fn parse_rmm_csv(text: &str) -> Result<Trace, String> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(n, l)| (n + 1, l.trim_start_matches('\u{feff}').trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let (header_line, header) = lines
        .next()
        .ok_or_else(|| format!("the file has no header line ({RMM_EXPECTS})"))?;
    let columns = split_csv(header);
    let column = |name: &str| -> Result<usize, String> {
        columns
            .iter()
            .position(|c| c.eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                format!(
                    "line {header_line}: the header `{header}` has no `{name}` column \
                     ({RMM_EXPECTS})"
                )
            })
    };
    let (action_col, pointer_col, size_col) =
        (column("Action")?, column("Pointer")?, column("Size")?);
    let needed = action_col.max(pointer_col).max(size_col) + 1;
    let mut pairing = Pairing::default();
    for (n, line) in lines {
        let fields = split_csv(line);
        if fields.len() < needed {
            return Err(format!(
                "line {n}: {} fields where the header has {} (`{line}`; {RMM_EXPECTS})",
                fields.len(),
                columns.len()
            ));
        }
        let action = fields[action_col].to_ascii_lowercase();
        let pointer = parse_pointer(&fields[pointer_col]).ok_or_else(|| {
            format!(
                "line {n}: Pointer `{}` is not a hexadecimal address ({RMM_EXPECTS})",
                fields[pointer_col]
            )
        })?;
        let size: u64 = fields[size_col].parse().map_err(|_| {
            format!(
                "line {n}: Size `{}` is not an unsigned integer ({RMM_EXPECTS})",
                fields[size_col]
            )
        })?;
        match action.as_str() {
            "allocate failure" => {}
            "allocate" | "free" | "deallocate" if pointer == 0 && size == 0 => {}
            "allocate" => pairing.alloc(pointer, size, n).map_err(|at| {
                format!(
                    "line {n}: allocate returned pointer {pointer:#x}, which is still live \
                     since line {at} (a pointer is allocated again only after its free)"
                )
            })?,
            "free" | "deallocate" => match pairing.free(pointer) {
                None => {
                    return Err(format!(
                        "line {n}: free of pointer {pointer:#x}, which no earlier allocate \
                         returned or which was already freed (rmm-csv pairs each free with \
                         the live allocate of the same pointer)"
                    ))
                }
                Some(e) if e.bytes != size => {
                    return Err(format!(
                        "line {n}: free of pointer {pointer:#x} with Size {size}, but it was \
                         allocated with Size {}",
                        e.bytes
                    ))
                }
                Some(_) => {}
            },
            other => {
                return Err(format!(
                    "line {n}: unknown Action `{other}` ({RMM_EXPECTS})"
                ))
            }
        }
    }
    Ok(pairing.finish())
}

/// The xpu-json document; events are checked one by one so that errors can name them.
#[derive(Deserialize)]
struct XpuJsonDoc {
    format: String,
    version: u64,
    events: Vec<serde_json::Value>,
}

/// One xpu-json event.
#[derive(Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
enum XpuJsonEvent {
    Alloc {
        id: u64,
        size: u64,
        #[serde(default, rename = "stream")]
        _stream: u64,
    },
    Free {
        id: u64,
    },
}

/// Parses an xpu-json document.
fn parse_xpu_json(text: &str) -> Result<Trace, String> {
    let doc: XpuJsonDoc = serde_json::from_str(text.trim_start_matches('\u{feff}'))
        .map_err(|e| format!("{e} ({XPU_JSON_EXPECTS})"))?;
    if doc.format != "xpu-json" {
        return Err(format!(
            "\"format\" is \"{}\", not \"xpu-json\" ({XPU_JSON_EXPECTS})",
            doc.format
        ));
    }
    if doc.version != 1 {
        return Err(format!(
            "\"version\" is {}; this reader knows version 1 ({XPU_JSON_EXPECTS})",
            doc.version
        ));
    }
    let lines = event_lines(text);
    let place = |i: usize| match lines.get(i) {
        Some(line) => format!("line {line}: event {i}"),
        None => format!("event {i}"),
    };
    let mut pairing = Pairing::default();
    for (i, value) in doc.events.iter().enumerate() {
        let event = XpuJsonEvent::deserialize(value)
            .map_err(|e| format!("{}: {e} ({XPU_JSON_EXPECTS})", place(i)))?;
        match event {
            XpuJsonEvent::Alloc { id, size, .. } => pairing.alloc(id, size, i).map_err(|at| {
                format!(
                    "{}: alloc of id {id}, which is still live since {} (an id is allocated \
                     again only after its free)",
                    place(i),
                    place(at)
                )
            })?,
            XpuJsonEvent::Free { id } => {
                if pairing.free(id).is_none() {
                    return Err(format!(
                        "{}: free of id {id}, which no earlier alloc named or which was \
                         already freed (xpu-json pairs each free with the live alloc of the \
                         same id)",
                        place(i)
                    ));
                }
            }
        }
    }
    Ok(pairing.finish())
}

/// The 1-based line on which each element of the top-level `"events"` array starts.
fn event_lines(text: &str) -> Vec<usize> {
    let mut lines = Vec::new();
    let (mut line, mut depth) = (1usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    let mut string = String::new();
    let mut last_key = String::new();
    let mut events_depth = None;
    for c in text.chars() {
        if c == '\n' {
            line += 1;
        }
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
                if depth == 1 {
                    last_key = std::mem::take(&mut string);
                }
            } else if depth == 1 {
                string.push(c);
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                string.clear();
            }
            '{' | '[' => {
                if events_depth == Some(depth) {
                    lines.push(line);
                }
                if c == '[' && depth == 1 && last_key == "events" {
                    events_depth = Some(depth + 1);
                }
                depth += 1;
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                if events_depth.is_some_and(|d| depth < d) {
                    events_depth = None;
                }
            }
            _ => {}
        }
    }
    lines
}
