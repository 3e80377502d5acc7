//! Trace formats: the allocsim, rmm-csv and xpu-json readers, format detection, the writers
//! and the GPT-2-style training trace kept with these tests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use xpu_memory::{replay, Policy, Trace, TraceEntry, TraceFormat};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(data(name)).unwrap()
}

/// The error of parsing `text` as `format`, which must fail.
fn error(text: &str, format: TraceFormat) -> String {
    match Trace::parse_as(text, format) {
        Ok(t) => panic!("parsed as {format}: {t:?}"),
        Err(e) => e,
    }
}

#[test]
fn format_names() {
    for f in TraceFormat::ALL {
        assert_eq!(TraceFormat::from_name(f.name()), Some(f));
        assert_eq!(f.to_string(), f.name());
    }
    assert_eq!(TraceFormat::from_name("rmm-csv"), Some(TraceFormat::RmmCsv));
    assert_eq!(TraceFormat::from_name("csv"), None);
}

#[test]
fn detection() {
    for (file, format) in [
        ("alexnet_train.log", TraceFormat::Allocsim),
        ("transformer_train.log", TraceFormat::Allocsim),
        ("rmm_log.csv", TraceFormat::RmmCsv),
        ("tiny_gpt_step.xpu.json", TraceFormat::XpuJson),
    ] {
        assert_eq!(TraceFormat::detect(&read(file)), Some(format), "{file}");
    }
    assert_eq!(
        TraceFormat::detect("\n# comment\n  1 2 3\n"),
        Some(TraceFormat::Allocsim)
    );
    assert_eq!(
        TraceFormat::detect("Time,Action,Size,Pointer,Extra\n"),
        Some(TraceFormat::RmmCsv)
    );
    assert_eq!(
        TraceFormat::detect("  {\"events\":[]}"),
        Some(TraceFormat::XpuJson)
    );
    assert_eq!(TraceFormat::detect(""), None);
    assert_eq!(TraceFormat::detect("hello world\n"), None);
    assert_eq!(TraceFormat::detect("a,b,c\n"), None);
    assert_eq!(TraceFormat::detect("1 2\n"), None);
}

#[test]
fn allocsim_sample_and_writer() {
    let trace = Trace::load_as(data("alexnet_train.log"), None).unwrap();
    assert_eq!(trace, Trace::load(data("alexnet_train.log")).unwrap());
    assert_eq!(trace.entries.len(), 193);
    assert_eq!(trace.peak_live(), 1_443_669_632);
    assert_eq!(Trace::parse(&trace.to_allocsim()).unwrap(), trace);
    let e = error("1 2 3\n4 x 6\n", TraceFormat::Allocsim);
    assert!(
        e.contains("line 2") && e.contains("start_op end_op bytes"),
        "{e}"
    );
}

#[test]
fn rmm_csv_sample() {
    let trace = Trace::load_as(data("rmm_log.csv"), Some(TraceFormat::RmmCsv)).unwrap();
    assert_eq!(trace, Trace::load_as(data("rmm_log.csv"), None).unwrap());
    // Nine successful allocations (the failure is skipped), seventeen events.
    assert_eq!(trace.entries.len(), 9);
    assert_eq!(
        trace.entries[0],
        TraceEntry {
            start_op: 0,
            end_op: 11,
            bytes: 8_000_000
        }
    );
    // The 16 MB temporary is freed right after it was allocated; its pointer is reused.
    assert_eq!(trace.entries[4].start_op + 1, trace.entries[4].end_op);
    assert_eq!(trace.entries[5].bytes, 2_000_000);
    // The last allocation is never freed: it lives one op past the last event.
    assert_eq!(
        trace.entries[8],
        TraceEntry {
            start_op: 13,
            end_op: 17,
            bytes: 12_000_000
        }
    );
    assert_eq!(trace.peak_live(), 36_001_024);
    let r = replay(&trace, Policy::Xpu).unwrap();
    assert_eq!(r.requests, 9);
}

#[test]
fn rmm_csv_variants() {
    // Pointers without `0x` (RMM's printf-style log), reordered and extra columns, quotes,
    // `deallocate`, zero-byte null allocations.
    let text = "Time,Thread,Pointer,Action,Size,Stream,Device\n\
                1,7,7f0000000000,allocate,100,0,0\n\
                2,7,\"7f0000000100\",\"allocate\",200,55aa00,0\n\
                3,7,0,allocate,0,0,0\n\
                4,7,7f0000000000,deallocate,100,0,0\n\
                5,7,0,free,0,0,0\n";
    let trace = Trace::parse_as(text, TraceFormat::RmmCsv).unwrap();
    assert_eq!(
        trace.entries,
        vec![
            TraceEntry {
                start_op: 0,
                end_op: 2,
                bytes: 100
            },
            TraceEntry {
                start_op: 1,
                end_op: 3,
                bytes: 200
            },
        ]
    );
}

#[test]
fn rmm_csv_errors() {
    let header = "Thread,Time,Action,Pointer,Size,Stream\n";
    let e = error(
        &format!("{header}1,t,allocate,0x100,64,0x0\n1,t,free,0x200,64,0x0\n"),
        TraceFormat::RmmCsv,
    );
    assert!(e.contains("line 3") && e.contains("0x200"), "{e}");
    let e = error(
        &format!("{header}1,t,allocate,0x100,64,0x0\n1,t,free,0x100,32,0x0\n"),
        TraceFormat::RmmCsv,
    );
    assert!(
        e.contains("line 3") && e.contains("allocated with Size 64"),
        "{e}"
    );
    let e = error(
        &format!("{header}1,t,allocate,0x100,64,0x0\n1,t,allocate,0x100,64,0x0\n"),
        TraceFormat::RmmCsv,
    );
    assert!(e.contains("line 3") && e.contains("since line 2"), "{e}");
    let e = error(
        &format!("{header}1,t,reserve,0x100,64,0x0\n"),
        TraceFormat::RmmCsv,
    );
    assert!(
        e.contains("line 2") && e.contains("unknown Action `reserve`"),
        "{e}"
    );
    let e = error(
        &format!("{header}1,t,allocate,zz,64,0x0\n"),
        TraceFormat::RmmCsv,
    );
    assert!(e.contains("line 2") && e.contains("Pointer `zz`"), "{e}");
    let e = error(
        &format!("{header}1,t,allocate,0x100,-4,0x0\n"),
        TraceFormat::RmmCsv,
    );
    assert!(e.contains("line 2") && e.contains("Size `-4`"), "{e}");
    let e = error(&format!("{header}1,t,allocate\n"), TraceFormat::RmmCsv);
    assert!(e.contains("line 2") && e.contains("fields"), "{e}");
    let e = error("Thread,Time,Pointer,Size\n", TraceFormat::RmmCsv);
    assert!(e.contains("line 1") && e.contains("`Action`"), "{e}");
    let e = error("", TraceFormat::RmmCsv);
    assert!(e.contains("header"), "{e}");
}

#[test]
fn xpu_json_sample_round_trip() {
    let path = data("tiny_gpt_step.xpu.json");
    let text = read("tiny_gpt_step.xpu.json");
    let trace = Trace::load_as(&path, None).unwrap();
    assert_eq!(trace, Trace::parse_as(&text, TraceFormat::XpuJson).unwrap());
    assert_eq!(trace.entries.len(), 162);
    assert_eq!(trace.peak_live(), 1_187_588);
    // xpu-json -> Trace -> xpu-json is the same document, and back to the same trace.
    assert_eq!(trace.to_xpu_json(), text);
    assert_eq!(
        Trace::parse_as(&trace.to_xpu_json(), TraceFormat::XpuJson).unwrap(),
        trace
    );
}

#[test]
fn xpu_json_from_other_traces() {
    // An allocsim trace through xpu-json keeps its allocate/free sequence: same requests,
    // same peak, same replay.
    let alexnet = Trace::load(data("alexnet_train.log")).unwrap();
    let json = alexnet.to_xpu_json();
    assert_eq!(TraceFormat::detect(&json), Some(TraceFormat::XpuJson));
    let back = Trace::parse_as(&json, TraceFormat::XpuJson).unwrap();
    assert_eq!(back.entries.len(), alexnet.entries.len());
    assert_eq!(back.peak_live(), alexnet.peak_live());
    let (a, b) = (
        replay(&alexnet, Policy::PyTorch).unwrap(),
        replay(&back, Policy::PyTorch).unwrap(),
    );
    assert_eq!(
        (
            a.peak_reserved_bytes,
            a.device_allocs,
            a.stats.allocated_bytes
        ),
        (
            b.peak_reserved_bytes,
            b.device_allocs,
            b.stats.allocated_bytes
        )
    );
    assert_eq!(back.to_xpu_json(), json);

    // rmm-csv through xpu-json.
    let rmm = Trace::load_as(data("rmm_log.csv"), None).unwrap();
    let back = Trace::parse_as(&rmm.to_xpu_json(), TraceFormat::XpuJson).unwrap();
    assert_eq!(back, rmm);
}

#[test]
fn xpu_json_fields() {
    // Streams and unknown fields are accepted; an id may be reused after its free; an
    // allocation never freed lives one op past the last event.
    let text = r#"{"format":"xpu-json","version":1,"device":"h100","events":[
        {"action":"alloc","id":7,"size":10,"stream":3,"time_ns":5},
        {"action":"free","id":7},
        {"action":"alloc","id":7,"size":20},
        {"action":"alloc","id":9,"size":30,"stream":0}
    ]}"#;
    let trace = Trace::parse_as(text, TraceFormat::XpuJson).unwrap();
    assert_eq!(
        trace.entries,
        vec![
            TraceEntry {
                start_op: 0,
                end_op: 1,
                bytes: 10
            },
            TraceEntry {
                start_op: 2,
                end_op: 4,
                bytes: 20
            },
            TraceEntry {
                start_op: 3,
                end_op: 4,
                bytes: 30
            },
        ]
    );
    assert_eq!(trace.peak_live(), 50);
    let empty = Trace::parse_as(
        r#"{"format":"xpu-json","version":1,"events":[]}"#,
        TraceFormat::XpuJson,
    )
    .unwrap();
    assert!(empty.entries.is_empty());
    assert_eq!(
        Trace::parse_as(&empty.to_xpu_json(), TraceFormat::XpuJson).unwrap(),
        empty
    );
}

#[test]
fn xpu_json_errors() {
    let e = error(
        "{\"format\":\"xpu-json\",\"version\":1,\"events\":[\n\
         {\"action\":\"alloc\",\"id\":1,\"size\":8},\n\
         {\"action\":\"free\",\"id\":2}\n]}",
        TraceFormat::XpuJson,
    );
    assert!(
        e.contains("line 3") && e.contains("event 1") && e.contains("id 2"),
        "{e}"
    );
    let e = error(
        "{\"format\":\"xpu-json\",\"version\":1,\"events\":[\n\
         {\"action\":\"alloc\",\"id\":1,\"size\":8},\n\
         {\"action\":\"alloc\",\"id\":1,\"size\":8}\n]}",
        TraceFormat::XpuJson,
    );
    assert!(e.contains("line 3") && e.contains("since line 2"), "{e}");
    let e = error(
        "{\"format\":\"xpu-json\",\"version\":1,\"events\":[\n\
         {\"action\":\"alloc\",\"id\":1}\n]}",
        TraceFormat::XpuJson,
    );
    assert!(e.contains("line 2") && e.contains("size"), "{e}");
    let e = error(
        "{\"format\":\"xpu-json\",\"version\":1,\"events\":[\n\
         {\"action\":\"resize\",\"id\":1}\n]}",
        TraceFormat::XpuJson,
    );
    assert!(
        e.contains("resize") && e.contains("xpu-json expects"),
        "{e}"
    );
    let e = error(
        "{\"format\":\"xpu-json\",\"version\":1,\"events\":[\n{\"action\":\"alloc\",,}\n]}",
        TraceFormat::XpuJson,
    );
    assert!(e.contains("line 2"), "{e}");
    let e = error(
        r#"{"format":"other","version":1,"events":[]}"#,
        TraceFormat::XpuJson,
    );
    assert!(e.contains("\"other\""), "{e}");
    let e = error(
        r#"{"format":"xpu-json","version":2,"events":[]}"#,
        TraceFormat::XpuJson,
    );
    assert!(e.contains("version"), "{e}");
}

#[test]
fn load_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("xpu-memory-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unknown = dir.join("unknown.txt");
    std::fs::write(&unknown, "not a trace\n").unwrap();
    let e = Trace::load_as(&unknown, None).unwrap_err();
    assert!(e.contains("unknown.txt") && e.contains("rmm-csv"), "{e}");
    let bad = dir.join("bad.csv");
    std::fs::write(
        &bad,
        "Thread,Time,Action,Pointer,Size,Stream\n1,t,free,0x10,8,0x0\n",
    )
    .unwrap();
    let e = Trace::load_as(&bad, None).unwrap_err();
    assert!(
        e.contains("bad.csv") && e.contains("rmm-csv") && e.contains("line 2"),
        "{e}"
    );
    let e = Trace::load_as(dir.join("missing.log"), None).unwrap_err();
    assert!(e.contains("missing.log"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn transformer_trace() {
    // The numbers `cargo run -p xpu-memory --example transformer_trace` prints for the
    // kept trace's shape (GPT-2 small, batch 2, seq 512, bf16 activations, 3 steps).
    let trace = Trace::load_as(data("transformer_train.log"), None).unwrap();
    assert_eq!(trace.entries.len(), 3885);
    assert_eq!(trace.peak_live(), 2_643_729_412);
    let pt = replay(&trace, Policy::PyTorch).unwrap();
    let xpu = replay(&trace, Policy::Xpu).unwrap();
    for (name, r) in [("pytorch", &pt), ("xpu", &xpu)] {
        eprintln!(
            "{name}: requests {} peak_live {} peak_reserved {} util {:.4} device_allocs {} frees {}",
            r.requests,
            r.peak_live_bytes,
            r.peak_reserved_bytes,
            r.utilization,
            r.device_allocs,
            r.device_frees
        );
        assert_eq!(r.requests, 3885);
        assert_eq!(r.peak_live_bytes, 2_643_729_412);
        assert!(r.utilization <= 1.0 && r.utilization > 0.5, "{name}");
    }
}
