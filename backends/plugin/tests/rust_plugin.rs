//! A plugin written in Rust with xpu-plugin-sdk whose initialisation panics (built here
//! with Cargo from `tests/fixtures/panicking.rs`): the SDK turns the panic into an error
//! at the C boundary, and the loader reports it, naming the file, while the process
//! lives on.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::PathBuf;
use std::process::Command;

use xpu_hal::backend::Backend;
use xpu_plugin::PluginBackend;

const MESSAGE: &str = "panicky plugin: initialisation panicked on purpose 0x9a1c";

/// Builds the fixture as a `cdylib` in its own workspace under the test's folder.
fn build_panicking_plugin() -> PathBuf {
    let dir = support::out_dir().join("panicking-crate");
    std::fs::create_dir_all(&dir).unwrap();
    let crate_dir = support::crate_dir();
    let manifest = format!(
        "[package]\nname = \"xpu-panicking-plugin\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
         [lib]\ncrate-type = [\"cdylib\"]\npath = {:?}\n\n\
         [dependencies]\nxpu-plugin-sdk = {{ path = {:?} }}\n\n[workspace]\n",
        crate_dir.join("tests/fixtures/panicking.rs"),
        crate_dir.join("sdk"),
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    let output = Command::new(env!("CARGO"))
        .args(["build", "--offline", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(dir.join("target"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "building the panicking plugin failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out = dir.join("target/debug");
    let library = out.join(support::library_file("xpu_panicking_plugin"));
    support::restrict(&out);
    support::restrict(&library);
    library
}

#[test]
fn a_panicking_rust_plugin_is_reported_and_the_host_lives_on() {
    let path = build_panicking_plugin();
    let backend = PluginBackend::load(&path).unwrap();
    assert_eq!(backend.name(), "plugin.panicky");
    let e = backend.enumerate().unwrap_err();
    println!("{e}");
    assert_eq!(e.kind(), "unavailable", "{e}");
    let text = e.to_string();
    assert!(text.contains(MESSAGE), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    // Again, and through device creation: the same error, no crash.
    let e = backend.create_device(0).err().unwrap();
    println!("{e}");
    assert!(e.to_string().contains(MESSAGE), "{e}");
    assert!(backend.enumerate().is_err());
}
