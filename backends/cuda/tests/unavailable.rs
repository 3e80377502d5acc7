//! The CUDA backend without a usable driver: it must be `Unavailable` with a reason,
//! list no devices, and never panic — with no libcuda at all, with a file that is not
//! a library, with a library that lacks the driver's symbols, with a driver too old
//! for CUDA 12.6, and with a driver that finds no device.
//!
//! The fake libraries are found through `LD_LIBRARY_PATH`, which the dynamic loader
//! reads at process start, so each case re-runs this test binary in a subprocess (the
//! ignored test `child_probe`) with the variable set.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use xpu_cuda::CudaBackend;
use xpu_hal::backend::Backend;

const CHILD_ENV: &str = "XPU_CUDA_TEST_CHILD";
const EXPECT_ENV: &str = "XPU_CUDA_TEST_EXPECT";

fn required() -> bool {
    std::env::var("XPU_REQUIRE").is_ok_and(|v| v.split(',').any(|p| p.trim() == "cuda"))
}

#[test]
fn without_a_driver_the_backend_is_unavailable_and_lists_nothing() {
    let backend = CudaBackend::new();
    match backend.enumerate() {
        Ok(devices) => {
            assert!(!devices.is_empty());
            eprintln!("a CUDA driver is present: {devices:?}");
        }
        Err(e) => {
            assert!(!required(), "CUDA is required here: {e}");
            assert_eq!(e.kind(), "unavailable", "{e}");
            assert!(backend.create_device(0).is_err());
        }
    }
}

/// Run by the other tests in a subprocess; checks what `XPU_CUDA_TEST_EXPECT` says.
#[test]
#[ignore = "run in a subprocess by the fake-library tests"]
fn child_probe() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let expect = std::env::var(EXPECT_ENV).unwrap_or_default();
    let backend = CudaBackend::new();
    let err = backend
        .enumerate()
        .expect_err("a fake libcuda must not yield devices");
    assert_eq!(err.kind(), "unavailable", "{err}");
    let text = err.to_string();
    assert!(text.contains(&expect), "expected `{expect}` in: {text}");
    assert!(backend.create_device(0).is_err());
    println!("CHILD-OK: {text}");
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xpu-cuda-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `child_probe` with `dir` first on `LD_LIBRARY_PATH`; asserts it passed and
/// nothing panicked.
fn run_child(dir: &Path, expect: &str) {
    let exe = std::env::current_exe().unwrap();
    let path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    };
    let out = Command::new(exe)
        .args(["--exact", "child_probe", "--ignored", "--nocapture"])
        .env(CHILD_ENV, "1")
        .env(EXPECT_ENV, expect)
        .env("LD_LIBRARY_PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("CHILD-OK"),
        "child failed:\n{stdout}\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "something panicked:\n{stderr}"
    );
}

/// Builds `source` into `dir/libcuda.so` with the C compiler; `false` (with a message)
/// when there is none.
fn build_library(dir: &Path, source: &str) -> bool {
    let c = dir.join("fake.c");
    std::fs::write(&c, source).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    match Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so"))
        .arg(&c)
        .status()
    {
        Ok(s) if s.success() => true,
        other => {
            eprintln!("skipped: no working C compiler `{cc}` ({other:?})");
            false
        }
    }
}

#[test]
fn an_empty_file_named_libcuda_is_not_a_driver() {
    let dir = temp_dir("empty");
    std::fs::write(dir.join("libcuda.so"), b"").unwrap();
    std::fs::write(dir.join("libcuda.so.1"), b"").unwrap();
    run_child(&dir, "libcuda.so not found");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_library_without_the_driver_symbols_is_unavailable() {
    let dir = temp_dir("nosym");
    if build_library(&dir, "int xpu_not_cuda(void) { return 0; }\n") {
        run_child(&dir, "lacks cuInit");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A fake driver exporting every symbol the backend checks for: `cuDriverGetVersion`
/// reports `version`, `cuInit` returns `init`, everything else does nothing.
fn stub_driver(version: i32, init: u32) -> String {
    let mut s = String::new();
    for sym in xpu_cuda::driver::REQUIRED_SYMBOLS {
        match *sym {
            "cuDriverGetVersion" => s.push_str(&format!(
                "int cuDriverGetVersion(int* v) {{ *v = {version}; return 0; }}\n"
            )),
            "cuInit" => s.push_str(&format!(
                "int cuInit(unsigned f) {{ (void)f; return {init}; }}\n"
            )),
            other => s.push_str(&format!("int {other}(void) {{ return 999; }}\n")),
        }
    }
    s
}

#[test]
fn a_driver_older_than_cuda_12_6_is_unavailable() {
    let dir = temp_dir("old");
    if build_library(&dir, &stub_driver(11080, 0)) {
        run_child(&dir, "supports CUDA 11.8 but xpu needs CUDA 12.6");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_driver_without_devices_is_unavailable() {
    let dir = temp_dir("nodev");
    // 100 = CUDA_ERROR_NO_DEVICE.
    if build_library(&dir, &stub_driver(12080, 100)) {
        run_child(&dir, "no CUDA device");
    }
    std::fs::remove_dir_all(&dir).ok();
}
