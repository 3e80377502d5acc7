//! `xpu compare`, tensor dumps and `xpu bench ops` through the command.

use xpu::DType;
use xpu_conformance::precision::TensorDump;

use super::{run, scratch, xpu};

#[test]
fn compare_runs_shared_operations_on_identical_inputs() {
    let (code, out, err) = run(&mut xpu(&[
        "compare",
        "--reference",
        "host:0",
        "--devices",
        "host:0,1",
        "--ops",
        "matmul,gelu,random",
        "--json",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let results = v["results"].as_array().unwrap();
    // Three operations on the four float dtypes, and random bits on i32 too.
    assert_eq!(results.len(), 13, "{out}");
    for r in results {
        assert_eq!(r["device"], "host:1");
        assert_eq!(r["metrics"]["within_tolerance"], true, "{r}");
        assert!(r["metrics"]["elements"].as_u64().unwrap() > 0);
        for key in [
            "max_abs_err",
            "max_rel_err",
            "cosine",
            "frac_rel_err_gt_1e-3",
            "frac_rel_err_gt_5e-3",
        ] {
            assert!(r["metrics"][key].is_number(), "{key} in {r}");
        }
    }
    let (code, _, err) = run(&mut xpu(&[
        "compare",
        "--devices",
        "host:0",
        "--ops",
        "matmul",
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("besides the reference"), "{err}");
    let (code, _, err) = run(&mut xpu(&[
        "compare",
        "--devices",
        "host:1",
        "--ops",
        "conv2d",
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("unknown operation `conv2d`"), "{err}");
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn compare_dumps_reports_each_tensor_and_fails_beyond_tolerance() {
    let (a, b, bad) = (scratch("a.xtd"), scratch("b.xtd"), scratch("bad.xtd"));
    let mut da = TensorDump::new();
    da.add("weights", DType::F32, &[2, 2], f32s(&[1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    da.add("loss", DType::F32, &[1], f32s(&[0.25])).unwrap();
    da.write(&a).unwrap();
    let mut db = TensorDump::new();
    for e in da.entries() {
        let data = if e.name == "weights" {
            f32s(&[1.0, 2.0, 3.0, 4.5])
        } else {
            e.data.clone()
        };
        db.add(&e.name, e.dtype, &e.dims, data).unwrap();
    }
    db.write(&b).unwrap();
    let (code, out, err) = run(&mut xpu(&[
        "compare",
        "--dumps",
        a.to_str().unwrap(),
        a.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = run(&mut xpu(&[
        "compare",
        "--dumps",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let weights = &v["tensors"][0];
    assert_eq!(weights["name"], "weights");
    assert_eq!(weights["metrics"]["within_tolerance"], false);
    assert!((weights["metrics"]["max_abs_err"].as_f64().unwrap() - 0.5).abs() < 1e-9);
    assert_eq!(v["tensors"][1]["metrics"]["within_tolerance"], true);
    std::fs::write(&bad, b"XPUTDMP1garbage").unwrap();
    let (code, _, err) = run(&mut xpu(&[
        "compare",
        "--dumps",
        a.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("not a valid tensor dump"), "{err}");
    for f in [a, b, bad] {
        std::fs::remove_file(f).ok();
    }
}

#[test]
fn bench_ops_prints_rates_beside_a_reference() {
    let (code, out, err) = run(&mut xpu(&[
        "bench", "ops", "--op", "softmax", "--shape", "64x128", "--rounds", "1", "--json",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = &v[0];
    assert_eq!(row["op"], "softmax");
    assert_eq!(row["unit"], "GB/s");
    assert!(row["rate"].as_f64().unwrap() > 0.0);
    assert!(row["reference_rate"].as_f64().unwrap() > 0.0);
    let (code, out, err) = run(&mut xpu(&[
        "bench", "ops", "--shape", "32x48x16", "-d", "half", "--rounds", "1", "--json",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["op"], "matmul");
    assert_eq!(v[0]["unit"], "GF/s");
    assert_eq!(v[0]["dtype"], "f16");
    for bad in [
        ["--shape", "12x0"],
        ["--shape", "axb"],
        ["-d", "complex"],
        ["--op", "conv"],
    ] {
        let (code, _, err) = run(&mut xpu(&["bench", "ops", bad[0], bad[1]]));
        assert_eq!(code, 2, "{bad:?}: {err}");
    }
}
