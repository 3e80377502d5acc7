//! Finding NVRTC and NCCL where real installs put them, with stand-in libraries built
//! here from `fixtures/` (they export the entry points and answer the version queries;
//! see their sources): a CUDA toolkit's `lib64`, a Python environment's
//! `nvidia/*/lib`, an override, and the refusals — an NVRTC newer than the driver, one
//! lacking an entry point, an NCCL too old. Runs on every machine; no GPU involved.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use xpu_cuda::libs::Places;
use xpu_cuda::nccl::Nccl;
use xpu_cuda::nvrtc::Nvrtc;

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xpu-cuda-libs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The stand-ins' sources, built into the test so that it runs from a prebuilt
/// executable anywhere (the GPU check carries it without the source tree).
const FIXTURES: [(&str, &str); 2] = [
    ("fake_nvrtc", include_str!("fixtures/fake_nvrtc.c")),
    ("fake_nccl", include_str!("fixtures/fake_nccl.c")),
];

/// Compiles `fixtures/<fixture>.c` with `defines` into `dir/<file>`.
fn build(fixture: &str, defines: &[&str], dir: &Path, file: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let (_, text) = FIXTURES.iter().find(|(n, _)| *n == fixture).unwrap();
    let src = dir.join(format!("{fixture}-{}.c", file.replace('.', "_")));
    std::fs::write(&src, text).unwrap();
    let out = dir.join(file);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut cmd = Command::new(&cc);
    cmd.args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&src);
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("could not run the C compiler `{cc}`: {e}"));
    assert!(status.success(), "`{cc}` failed on {}", src.display());
    out
}

/// Places with nothing but the given toolkits and site-packages directories.
fn places(toolkits: &[&Path], site_packages: &[&Path]) -> Places {
    Places {
        override_path: None,
        loader_path: false,
        toolkits: toolkits.iter().map(|p| p.to_path_buf()).collect(),
        site_packages: site_packages.iter().map(|p| p.to_path_buf()).collect(),
    }
}

const CUDA_13_0: i32 = 13000;

#[test]
fn nvrtc_is_found_in_a_python_environments_nvidia_package() {
    let root = scratch("python");
    let site = root.join("venv/lib/python3.12/site-packages");
    let lib = build(
        "fake_nvrtc",
        &["MAJOR=13", "MINOR=0"],
        &site.join("nvidia/cu13/lib"),
        "libnvrtc.so.13",
    );
    let found = Nvrtc::find(CUDA_13_0, Some(places(&[], &[&site]))).unwrap();
    assert_eq!(found.version, "13.0");
    assert_eq!(found.value.version, (13, 0));
    assert_eq!(
        Path::new(&found.path),
        std::fs::canonicalize(&lib).unwrap(),
        "the loader's own answer for the file"
    );
    assert_eq!(found.value.archs, [75, 80, 90], "sorted");
    assert!(found.refused.is_empty(), "{:?}", found.refused);
}

#[test]
fn nvrtc_is_found_in_a_toolkit_and_one_newer_than_the_driver_is_passed_over() {
    let root = scratch("toolkit");
    let newer = root.join("cuda-13.1");
    build(
        "fake_nvrtc",
        &["MAJOR=13", "MINOR=1"],
        &newer.join("lib64"),
        "libnvrtc.so.13",
    );
    let site = root.join("site-packages");
    build(
        "fake_nvrtc",
        &["MAJOR=12", "MINOR=6"],
        &site.join("nvidia/cuda_nvrtc/lib"),
        "libnvrtc.so.12",
    );
    let found = Nvrtc::find(CUDA_13_0, Some(places(&[&newer], &[&site]))).unwrap();
    assert_eq!(found.version, "12.6", "the newest NVRTC the driver takes");
    assert_eq!(found.refused.len(), 1, "{:?}", found.refused);
    assert!(
        found.refused[0].contains("NVRTC 13.1 is newer than the driver (CUDA 13.0)"),
        "{}",
        found.refused[0]
    );

    // With only the newer one there is none, and the reason says why and where.
    let e = Nvrtc::find(CUDA_13_0, Some(places(&[&newer], &[]))).unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("NVRTC not found"), "{text}");
    assert!(text.contains("newer than the driver"), "{text}");
    assert!(text.contains("cuda-13.1/lib64"), "{text}");
    assert!(text.contains("set XPU_CUDA_NVRTC"), "{text}");
}

#[test]
fn an_nvrtc_lacking_an_entry_point_is_refused_by_name() {
    let root = scratch("old");
    let dir = root.join("lib64");
    build(
        "fake_nvrtc",
        &["MAJOR=11", "MINOR=0", "OMIT_CUBIN"],
        &dir,
        "libnvrtc.so",
    );
    let e = Nvrtc::find(CUDA_13_0, Some(places(&[&root], &[]))).unwrap_err();
    assert_eq!(e.refused.len(), 1, "{e}");
    assert!(e.refused[0].contains("lacks nvrtcGetCUBINSize"), "{e}");
}

#[test]
fn an_override_names_the_file_or_directory_and_nothing_else_is_tried() {
    let root = scratch("override");
    let chosen = build(
        "fake_nvrtc",
        &["MAJOR=12", "MINOR=8"],
        &root.join("chosen"),
        "libnvrtc.so.12",
    );
    let elsewhere = root.join("toolkit");
    build(
        "fake_nvrtc",
        &["MAJOR=13", "MINOR=0"],
        &elsewhere.join("lib64"),
        "libnvrtc.so.13",
    );
    for target in [chosen.clone(), root.join("chosen")] {
        let mut p = places(&[&elsewhere], &[]);
        p.override_path = Some(target.clone());
        let found = Nvrtc::find(CUDA_13_0, Some(p)).unwrap();
        assert_eq!(found.version, "12.8", "override {}", target.display());
    }
    let mut p = places(&[&elsewhere], &[]);
    p.override_path = Some(root.join("missing/libnvrtc.so.13"));
    let e = Nvrtc::find(CUDA_13_0, Some(p)).unwrap_err();
    assert_eq!(e.looked.len(), 1, "only the override: {e}");
    assert!(e.to_string().contains("missing/libnvrtc.so.13"), "{e}");
}

#[test]
fn nccl_is_found_as_pythons_nvidia_nccl_and_an_old_one_is_refused() {
    let root = scratch("nccl");
    let old = root.join("old");
    build(
        "fake_nccl",
        &["VERSION=20905"],
        &old.join("lib"),
        "libnccl.so.2",
    );
    let site = root.join("site-packages");
    let lib = build(
        "fake_nccl",
        &["VERSION=22805"],
        &site.join("nvidia/nccl/lib"),
        "libnccl.so.2",
    );
    let found = Nccl::find(Some(places(&[&old], &[&site]))).unwrap();
    assert_eq!(found.version, "2.28.5");
    assert_eq!(found.value.version, 22805);
    assert_eq!(Path::new(&found.path), std::fs::canonicalize(&lib).unwrap());
    assert_eq!(found.refused.len(), 1, "{:?}", found.refused);
    assert!(
        found.refused[0].contains("NCCL 2.9.5 is older than 2.10"),
        "{}",
        found.refused[0]
    );
}

#[test]
fn an_nccl_without_the_calls_across_processes_serves_this_process_only() {
    let root = scratch("nccl-across");
    build(
        "fake_nccl",
        &["VERSION=21305", "OMIT_ACROSS"],
        &root.join("old/lib"),
        "libnccl.so.2",
    );
    let found = Nccl::find(Some(places(&[&root.join("old")], &[]))).unwrap();
    assert_eq!(
        found.version, "2.13.5",
        "found: it still serves groups in-process"
    );
    let reason = found.value.across().unwrap_err();
    assert!(reason.contains("lacks ncclGetUniqueId"), "{reason}");
    assert!(reason.contains("NCCL 2.14 or newer"), "{reason}");
    assert!(reason.contains("libnccl.so.2"), "names the file: {reason}");

    // The entry points of a 2.13 are not enough: across processes needs 2.14.
    build(
        "fake_nccl",
        &["VERSION=21304"],
        &root.join("symbols/lib"),
        "libnccl.so.2",
    );
    let found = Nccl::find(Some(places(&[&root.join("symbols")], &[]))).unwrap();
    let reason = found.value.across().unwrap_err();
    assert!(
        reason.contains("2.13.4") && reason.contains("older than 2.14"),
        "{reason}"
    );

    build(
        "fake_nccl",
        &["VERSION=21403"],
        &root.join("new/lib"),
        "libnccl.so.2",
    );
    let found = Nccl::find(Some(places(&[&root.join("new")], &[]))).unwrap();
    assert_eq!(found.value.across(), Ok(()));
}

#[test]
fn nothing_found_lists_where_it_looked() {
    let root = scratch("empty");
    let e = Nccl::find(Some(places(&[&root], &[&root.join("site")]))).unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("NCCL not found"), "{text}");
    assert!(
        text.contains("no toolkit or Python package directory"),
        "{text}"
    );
    assert!(text.contains("set XPU_NCCL_LIBRARY"), "{text}");
}
