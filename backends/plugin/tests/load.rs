//! Loading: the example C plugin in every ABI minor variant, every kind of broken
//! plugin (each a real shared library built here), the permission checks, discovery
//! through `XPU_PLUGIN_PATH`, and the time it takes to load a plugin and open a device.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use xpu_hal::backend::{Backend, DeviceImpl};
use xpu_hal::ops::OpKind;
use xpu_hal::{DType, Error, KernelFormat};
use xpu_plugin::{discover_from, LoadError, LoadErrorKind, PluginBackend};

/// A fresh folder of this test binary's output folder, safe to load from.
fn scratch(name: &str) -> PathBuf {
    let dir = support::out_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Copies a built library into `dir` under `file`.
fn copy_into(lib: &Path, dir: &Path, file: &str) -> PathBuf {
    let to = dir.join(file);
    std::fs::copy(lib, &to).unwrap();
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    to
}

/// Loads `path`, expecting a refusal; checks that the message names the file, and
/// prints it (these messages are what users see).
fn refused(path: &Path) -> LoadError {
    let e = match PluginBackend::load(path) {
        Ok(b) => panic!("{} loaded as {}", path.display(), b.name()),
        Err(e) => e,
    };
    let text = e.to_string();
    assert!(
        text.contains(&path.display().to_string()),
        "the message does not name the file: {text}"
    );
    assert_eq!(e.path(), path);
    println!("{text}");
    e
}

#[test]
fn the_minimal_plugin_loads_and_describes_its_devices() {
    let backend = PluginBackend::load(support::minimal()).unwrap();
    assert_eq!(backend.name(), "plugin.minimal");
    assert_eq!(backend.plugin_name(), "minimal");
    assert_eq!(backend.version(), "1.0.0");
    assert_eq!(backend.abi_version(), (1, 4));
    assert!(backend.has_kernels());
    let devices = backend.enumerate().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1].index, 1);
    let device = backend.create_plugin_device(1).unwrap();
    assert_eq!(device.id(), "plugin.minimal:1");
    assert_eq!(device.kernel_format(), Some("xpu-minimal-v1"));
    assert_eq!(
        device.extra_capabilities(),
        ["execution=worker-thread-per-stream", "memory=host"]
    );
    let info = xpu_hal::backend::DeviceImpl::info(&device);
    assert_eq!(info.name, "xpu minimal C device 1");
    assert_eq!(info.vendor, "xpu example");
    assert_eq!(info.capabilities.dtypes, DType::ALL.to_vec());
    assert_eq!(
        info.capabilities.kernel_formats,
        vec![KernelFormat::PluginNative]
    );
    assert_eq!(info.capabilities.kernel_arg_alignment, 4);
    assert!(info.capabilities.event_timing);
    assert!(backend.diagnostics().is_empty());
}

/// Round-trips data through a device of `backend`, through the HAL's handles.
fn round_trip(backend: PluginBackend) {
    let mut registry = xpu_hal::Registry::new();
    let name = backend.name().to_string();
    registry.register(std::sync::Arc::new(backend)).unwrap();
    let device = registry.device(&xpu_hal::DeviceId::new(name, 0)).unwrap();
    let a = device.allocate(1000).unwrap();
    let s = device.create_stream().unwrap();
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    s.write(&a, &data).unwrap();
    assert_eq!(s.read(&a).unwrap(), data);
}

/// The standard operations a plugin's first device lists.
fn listed_ops(backend: &PluginBackend) -> Vec<(OpKind, Vec<DType>)> {
    let device = backend.create_plugin_device(0).unwrap();
    device
        .info()
        .capabilities
        .ops
        .into_iter()
        .map(|s| (s.kind, s.dtypes))
        .collect()
}

/// A plugin of ABI 1.0 has the smallest table a host accepts: whatever a newer host
/// appended reads as absent — here the standard operations, whose functions lie in
/// memory beyond its `struct_size` — and it works as before. A plugin claiming 1.5
/// appends members this 1.4 host must ignore.
#[test]
fn older_and_newer_minor_versions_load() {
    let old = PluginBackend::load(support::minimal_1_0()).unwrap();
    assert_eq!(old.abi_version(), (1, 0));
    assert!(listed_ops(&old).is_empty());
    round_trip(old);
    let current = PluginBackend::load(support::minimal()).unwrap();
    assert_eq!(current.abi_version(), (1, 4));
    let f32_only = vec![DType::F32];
    assert_eq!(
        listed_ops(&current),
        vec![
            (OpKind::BiasAdd, f32_only.clone()),
            (OpKind::Relu, f32_only.clone()),
            (OpKind::ReluBackward, f32_only)
        ]
    );
    round_trip(current);
    let new = PluginBackend::load(support::minimal_minor(5)).unwrap();
    assert_eq!(new.abi_version(), (1, 5));
    assert_eq!(new.name(), "plugin.minimal");
    round_trip(new);
}

#[test]
fn a_text_file_is_not_a_library() {
    let dir = scratch("text");
    let path = dir.join("libnot_a_plugin.so");
    std::fs::write(&path, "this is not a shared library\n").unwrap();
    support::restrict(&path);
    let e = refused(&path);
    assert!(
        matches!(e.cause(), LoadErrorKind::NotALibrary { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("dynamic loader refused"), "{e}");
}

/// Bound at load time, an unresolved symbol is an error, not a crash at the first call.
#[test]
fn a_library_with_an_unresolved_symbol() {
    let e = refused(&support::bad("UNDEFINED"));
    assert!(
        matches!(e.cause(), LoadErrorKind::NotALibrary { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("xpu_test_no_such_function"), "{e}");
}

#[test]
fn a_missing_file_is_reported() {
    let path = support::out_dir().join("libnowhere.so");
    let e = refused(&path);
    assert!(e.to_string().contains("does not exist"), "{e}");
}

#[test]
fn a_library_without_the_entry_point() {
    let e = refused(&support::bad("NO_ENTRY"));
    assert_eq!(e.cause(), &LoadErrorKind::MissingEntryPoint);
    assert!(e.to_string().contains("xpu_plugin_get_api"), "{e}");
}

#[test]
fn an_entry_point_returning_null() {
    let e = refused(&support::bad("NULL_TABLE"));
    assert_eq!(e.cause(), &LoadErrorKind::Refused { host: (1, 4) });
    assert!(e.to_string().contains("returned NULL"), "{e}");
}

#[test]
fn a_newer_major_version() {
    let e = refused(&support::bad("NEWER_MAJOR"));
    assert_eq!(
        e.cause(),
        &LoadErrorKind::IncompatibleMajor {
            plugin: (2, 7),
            host: (1, 4)
        }
    );
    let text = e.to_string();
    assert!(
        text.contains("ABI 2.7") && text.contains("ABI 1.4"),
        "{text}"
    );
    assert!(text.contains("newer"), "{text}");
}

#[test]
fn an_older_major_version() {
    let e = refused(&support::bad("OLDER_MAJOR"));
    let text = e.to_string();
    assert!(
        text.contains("ABI 0.7") && text.contains("ABI 1.4"),
        "{text}"
    );
    assert!(text.contains("older") && text.contains("rebuild"), "{text}");
}

#[test]
fn a_table_smaller_than_abi_1_0() {
    let e = refused(&support::bad("SMALL_TABLE"));
    let LoadErrorKind::TableTooSmall { size, min } = e.cause() else {
        panic!("{e}");
    };
    assert!(size < min);
    let text = e.to_string();
    assert!(
        text.contains(&size.to_string()) && text.contains(&min.to_string()),
        "{text}"
    );
}

#[test]
fn a_null_required_function() {
    let e = refused(&support::bad("NULL_FUNCTION"));
    assert_eq!(
        e.cause(),
        &LoadErrorKind::MissingFunction {
            function: "device_open"
        }
    );
    assert!(e.to_string().contains("`device_open`"), "{e}");
}

#[test]
fn an_invalid_name() {
    let e = refused(&support::bad("NAME"));
    assert!(e.to_string().contains("\"Bad Name!\""), "{e}");
}

/// A plugin claiming 2^32 - 1 devices is an unavailable backend, with the reason,
/// rather than four billion device summaries.
#[test]
fn a_plugin_claiming_billions_of_devices_is_unavailable() {
    let backend = PluginBackend::load(support::bad("HUGE_COUNT")).unwrap();
    let e = backend.enumerate().unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(e.to_string().contains("claims 4294967295 devices"), "{e}");
}

/// Unknown error codes become backend errors carrying the raw code; a NULL message is
/// survived.
#[test]
fn garbage_error_codes_become_backend_errors() {
    let backend = PluginBackend::load(support::bad("GARBAGE_CODES")).unwrap();
    assert_eq!(backend.enumerate().unwrap().len(), 1);
    let e = match backend.create_device(0) {
        Ok(_) => panic!("device_open succeeded"),
        Err(e) => e,
    };
    println!("{e}");
    let Error::Backend {
        backend: name,
        source,
    } = &e
    else {
        panic!("expected a backend error, got {e:?}");
    };
    assert_eq!(name, "plugin.bad");
    let plugin_error = source
        .downcast_ref::<xpu_plugin::PluginError>()
        .expect("the source is the plugin's error");
    assert_eq!(plugin_error.code, 0xDEAD_BEEF);
    assert_eq!(plugin_error.code_name(), None);
    let text = e.to_string();
    assert!(
        text.contains("3735928559") && text.contains("0xdeadbeef"),
        "{text}"
    );
    assert!(text.contains("device_open"), "{text}");
    assert!(text.contains("no message"), "{text}");
}

/// A plugin whose every call fails: it loads (its table is fine), but the backend is
/// unavailable with the file and the plugin's message as the reason, and nothing
/// else breaks.
#[test]
fn a_plugin_that_fails_every_call() {
    let path = support::bad("ALWAYS_ERROR");
    let backend = std::sync::Arc::new(PluginBackend::load(&path).unwrap());
    let e = backend.enumerate().unwrap_err();
    println!("{e}");
    assert_eq!(e.kind(), "unavailable");
    let text = e.to_string();
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("the device is on fire"), "{text}");
    assert!(text.contains("device_count"), "{text}");
    let mut registry = xpu_hal::Registry::new();
    registry.register(backend.clone()).unwrap();
    let status = registry.backends();
    assert!(matches!(
        &status[0].availability,
        xpu_hal::Availability::Unavailable(r) if r.contains("the device is on fire")
    ));
    assert!(registry
        .devices(&xpu_hal::DeviceSelector::all())
        .unwrap()
        .is_empty());
    // Asked directly, device creation fails the same way, as an internal error.
    let e = backend.create_device(0).err().unwrap();
    assert_eq!(e.kind(), "backend", "{e}");
    assert!(e.to_string().contains("XPU_ERROR_INTERNAL"), "{e}");
}

#[test]
fn a_world_writable_file_is_refused() {
    let dir = scratch("world-writable-file");
    let path = copy_into(&support::minimal(), &dir, "libxpu_minimal.so");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = refused(&path);
    assert!(
        matches!(e.cause(), LoadErrorKind::InsecurePermissions { offender, .. } if offender == &path.canonicalize().unwrap()),
        "{e}"
    );
    assert!(e.to_string().contains("writable by every user"), "{e}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    PluginBackend::load(&path).unwrap();
}

#[test]
fn a_file_in_a_world_writable_folder_is_refused() {
    let dir = scratch("world-writable-folder");
    let path = copy_into(&support::minimal(), &dir, "libxpu_minimal.so");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = refused(&path);
    assert!(e.to_string().contains("its folder"), "{e}");
    // Through the search path, the folder is refused once, as a folder.
    let found = discover_from(&[], Some(dir.as_os_str()));
    assert!(found.backends.is_empty());
    assert_eq!(found.errors.len(), 1, "{:?}", found.errors);
    assert!(found.errors[0].to_string().contains("the folder"));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_file_of_another_user_is_refused() {
    use std::os::unix::fs::MetadataExt;
    let dir = scratch("other-owner");
    let path = copy_into(&support::minimal(), &dir, "libxpu_minimal.so");
    // Only root can give a file away; elsewhere the check is still exercised on a
    // file the current user owns (accepted).
    let status = std::process::Command::new("chown")
        .arg("65534")
        .arg(&path)
        .status();
    if status.is_ok_and(|s| s.success()) {
        assert_eq!(std::fs::metadata(&path).unwrap().uid(), 65534);
        let e = refused(&path);
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    } else {
        println!("chown is not permitted here; checked only that an own file loads");
        PluginBackend::load(&path).unwrap();
    }
}

#[test]
fn discovery_loads_what_it_can_and_names_the_rest() {
    let dir = scratch("search");
    copy_into(&support::minimal(), &dir, "libgood.so");
    copy_into(&support::bad("NEWER_MAJOR"), &dir, "libnewer.so");
    std::fs::write(dir.join("libtext.so"), "not a library").unwrap();
    support::restrict(&dir.join("libtext.so"));
    std::fs::write(dir.join("README.txt"), "ignored: not a library name").unwrap();
    let missing = support::out_dir().join("no-such-folder");
    let mut search = OsString::new();
    for (i, entry) in [
        dir.as_os_str(),
        "".as_ref(),
        "relative/plugins".as_ref(),
        missing.as_os_str(),
    ]
    .iter()
    .enumerate()
    {
        if i > 0 {
            search.push(":");
        }
        search.push(entry);
    }
    let found = discover_from(&[], Some(&search));
    let names: Vec<&str> = found.backends.iter().map(|b| b.name()).collect();
    assert_eq!(names, ["plugin.minimal"]);
    let errors: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
    for e in &errors {
        println!("{e}");
    }
    assert_eq!(errors.len(), 4, "{errors:#?}");
    let has = |a: &str, b: &str| errors.iter().any(|e| e.contains(a) && e.contains(b));
    assert!(has("libnewer.so", "ABI 2.7"), "{errors:#?}");
    assert!(has("libtext.so", "dynamic loader refused"), "{errors:#?}");
    assert!(has("relative/plugins", "relative path"), "{errors:#?}");
    assert!(has("no-such-folder", "does not exist"), "{errors:#?}");
}

#[test]
fn discovery_loads_a_file_once_and_refuses_a_second_name() {
    let dir = scratch("duplicates");
    let first = copy_into(&support::minimal(), &dir, "libfirst.so");
    let other = copy_into(&support::minimal_minor(5), &dir, "libsecond.so");
    // The same file named twice (and by its folder) is loaded once; a second file
    // with the same plugin name is refused, naming the first.
    let found = discover_from(&[first.clone(), first.clone()], Some(dir.as_os_str()));
    assert_eq!(found.backends.len(), 1);
    assert_eq!(found.backends[0].path(), first);
    assert_eq!(found.errors.len(), 1, "{:?}", found.errors);
    let text = found.errors[0].to_string();
    println!("{text}");
    assert!(text.contains(&other.display().to_string()), "{text}");
    assert!(text.contains(&first.display().to_string()), "{text}");
    assert!(text.contains("`minimal`"), "{text}");
}

#[test]
fn an_explicit_relative_path_is_resolved_against_the_current_directory() {
    let lib = support::minimal();
    let cwd = std::env::current_dir().unwrap();
    let relative = pathdiff(&lib, &cwd);
    assert!(relative.is_relative());
    let found = discover_from(&[relative], None);
    assert_eq!(found.backends.len(), 1, "{:?}", found.errors);
}

/// `target` relative to `base` (both absolute), with `..` steps.
fn pathdiff(target: &Path, base: &Path) -> PathBuf {
    let t: Vec<_> = target.components().collect();
    let b: Vec<_> = base.components().collect();
    let common = t.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    out
}

/// Loading a plugin and opening a device works for many fresh copies of a plugin, and
/// the time it takes (dlopen, entry point, table checks, device_open and
/// device_properties) is printed. Each sample loads a distinct copy of the file, so
/// that every dlopen maps a library for the first time.
#[test]
fn load_and_open_time() {
    let dir = scratch("timing");
    let lib = support::minimal();
    const SAMPLES: usize = 20;
    let copies: Vec<PathBuf> = (0..SAMPLES)
        .map(|i| copy_into(&lib, &dir, &format!("libminimal{i}.so")))
        .collect();
    let mut times = Vec::with_capacity(SAMPLES);
    for path in &copies {
        let start = Instant::now();
        let backend = PluginBackend::load(path).unwrap();
        let device = backend.create_plugin_device(0).unwrap();
        let elapsed = start.elapsed();
        drop(device);
        times.push(elapsed);
    }
    times.sort();
    let median = times[SAMPLES / 2];
    println!(
        "load + validate + device_open + device_properties: median {:.1} µs, min {:.1} µs, max {:.1} µs ({SAMPLES} fresh copies)",
        median.as_secs_f64() * 1e6,
        times[0].as_secs_f64() * 1e6,
        times[SAMPLES - 1].as_secs_f64() * 1e6
    );
    // A figure to read, not an assertion: speed is measured, not asserted in tests.
}

#[test]
fn a_refused_plugin_whose_thread_runs_its_code_is_not_unmapped() {
    // Its constructor started a thread that runs the library's code for half a second
    // after the refusal; unmapping the library under it would crash this process.
    let e = refused(&support::bad("THREAD_REFUSED"));
    assert_eq!(e.cause(), &LoadErrorKind::Refused { host: (1, 4) });
    std::thread::sleep(std::time::Duration::from_millis(700));
}
