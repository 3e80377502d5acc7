//! Builds the test plugins from C source, with the C compiler the `cc` crate finds,
//! into a folder of `CARGO_TARGET_TMPDIR` owned by this test binary.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The crate's root folder.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where this test binary's plugins go (one folder per binary, so that two binaries
/// running at once never overwrite a library the other has loaded).
pub fn out_dir() -> PathBuf {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "tests".to_string());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("xpu-plugin")
        .join(binary);
    std::fs::create_dir_all(&dir).unwrap();
    // The loader refuses folders anyone may write to, whatever the umask made them.
    restrict(&dir);
    dir
}

/// Makes `path` writable by its owner only (`chmod 755`).
pub fn restrict(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The target triple `cc` needs outside a build script (which would get it from Cargo).
fn triple() -> String {
    let arch = std::env::consts::ARCH;
    if cfg!(target_os = "macos") {
        format!("{arch}-apple-darwin")
    } else if cfg!(target_env = "musl") {
        format!("{arch}-unknown-linux-musl")
    } else {
        format!("{arch}-unknown-linux-gnu")
    }
}

/// The C compiler command, with `cc`'s default flags for this target.
pub fn compiler() -> Command {
    let mut build = cc::Build::new();
    build
        .target(&triple())
        .host(&triple())
        .opt_level(2)
        .cargo_metadata(false)
        .cargo_warnings(false);
    match build.try_get_compiler() {
        Ok(tool) => tool.to_command(),
        Err(_) => Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_string())),
    }
}

/// A shared library's file name for `name` on this platform.
pub fn library_file(name: &str) -> String {
    format!("lib{name}.{}", std::env::consts::DLL_EXTENSION)
}

static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);

/// Compiles `source` with `defines` into the shared library `lib<name>.so` in
/// [`out_dir`], once per process.
pub fn build(name: &str, source: &Path, defines: &[&str]) -> PathBuf {
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(p) = built.get(name) {
        return p.clone();
    }
    let out = out_dir().join(library_file(name));
    let partial = out.with_extension("partial");
    let mut cmd = compiler();
    cmd.args([
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
        "-std=c11",
        "-O2",
        "-pthread",
        "-Wall",
        "-Wextra",
        "-pedantic",
        "-Werror",
        "-I",
    ])
    .arg(crate_dir().join("include"));
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    // Extra flags, for instance a sanitizer: XPU_PLUGIN_TEST_CFLAGS="-fsanitize=address".
    if let Ok(extra) = std::env::var("XPU_PLUGIN_TEST_CFLAGS") {
        cmd.args(extra.split_whitespace());
    }
    cmd.arg(source).arg("-o").arg(&partial);
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("could not run the C compiler ({cmd:?}): {e}"));
    assert!(
        output.status.success(),
        "compiling {} failed ({cmd:?}):\n{}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::rename(&partial, &out).unwrap();
    restrict(&out);
    built.insert(name.to_string(), out.clone());
    out
}

/// The example C plugin, as shipped (ABI 1.2, with its standard operations and without
/// fault injection).
pub fn minimal() -> PathBuf {
    build(
        "xpu_minimal",
        &crate_dir().join("examples/c-minimal/minimal.c"),
        &[],
    )
}

/// The example C plugin as a plugin built against the ABI 1.0 header presents itself:
/// version 1.0, the 1.0 table (its standard-operation functions lie beyond
/// `struct_size`).
pub fn minimal_1_0() -> PathBuf {
    build(
        "xpu_minimal_1_0",
        &crate_dir().join("examples/c-minimal/minimal.c"),
        &["XPU_TEST_ABI_1_0"],
    )
}

/// The example C plugin claiming ABI 1.`minor` with a larger table.
pub fn minimal_minor(minor: u32) -> PathBuf {
    build(
        &format!("xpu_minimal_1_{minor}"),
        &crate_dir().join("examples/c-minimal/minimal.c"),
        &[&format!("XPU_TEST_MINOR={minor}")],
    )
}

/// The sim-npu plugin library next to this test binary (Cargo builds it into `deps/`,
/// as a dev-dependency of this package).
pub fn sim_npu() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let name = library_file("xpu_sim_npu");
    [deps.join(&name), deps.join("..").join(&name)]
        .into_iter()
        .find(|p| p.exists())
        .expect("the xpu-sim-npu plugin is built (it is a dev-dependency)")
}

/// One of the broken plugins of `tests/fixtures/bad.c` (`defect` is the macro without
/// its `BAD_` prefix).
pub fn bad(defect: &str) -> PathBuf {
    build(
        &format!("xpu_bad_{}", defect.to_lowercase()),
        &crate_dir().join("tests/fixtures/bad.c"),
        &[&format!("BAD_{defect}")],
    )
}

/// A registry with one plugin (its library at `library`) and one host device; when
/// dropped outside a panic, it checks that the plugin reported no diagnostics.
pub struct Setup {
    /// The plugin's backend.
    pub plugin: std::sync::Arc<xpu_plugin::PluginBackend>,
    /// The registry holding it and the host backend.
    pub registry: xpu_hal::Registry,
}

impl Setup {
    /// Loads `library` and registers it beside one host device of 64 MiB.
    pub fn new(library: PathBuf) -> Setup {
        use std::sync::Arc;
        let plugin = Arc::new(xpu_plugin::PluginBackend::load(library).unwrap());
        let mut registry = xpu_hal::Registry::new();
        registry.register(plugin.clone()).unwrap();
        registry
            .register(Arc::new(xpu_host::HostBackend::new(xpu_host::HostConfig {
                devices: 1,
                capacity: 64 << 20,
            })))
            .unwrap();
        Setup { plugin, registry }
    }

    /// Device `index` of `backend`.
    pub fn device(&self, backend: &str, index: u32) -> xpu_hal::Device {
        self.registry
            .device(&xpu_hal::DeviceId::new(backend, index))
            .unwrap()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        use xpu_hal::backend::Backend;
        if !std::thread::panicking() {
            assert!(
                self.plugin.diagnostics().is_empty(),
                "{:?}",
                self.plugin.diagnostics()
            );
        }
    }
}
