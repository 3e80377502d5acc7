//! Finding the CUDA libraries that real installs have: NVRTC and NCCL.
//!
//! The driver (`libcuda.so.1`) is always on the loader path, installed with the kernel
//! module. NVRTC and NCCL are not: a CUDA toolkit puts them under `/usr/local/cuda*`
//! (or wherever `CUDA_HOME` says), a distribution under its library directories, and a
//! Python environment inside its `nvidia-*` packages (`site-packages/nvidia/cu13/lib`,
//! `nvidia/cuda_nvrtc/lib`, `nvidia/nccl/lib`), which no loader path names. Their file
//! names carry the major version (`libnvrtc.so.13`, `libnccl.so.2`), and an unversioned
//! `libnvrtc.so` exists only where a development package is installed.
//!
//! [`search`] tries, in order, and takes the first candidate that loads, exports what
//! the caller needs and passes its check (for NVRTC: not newer than the driver):
//!
//! 1. the override variable ([`Spec::env`]): a file, or a directory to look in. When it
//!    is set nothing else is tried, so that a wrong override is an error, not a silent
//!    fallback;
//! 2. the versioned and unversioned names through the loader path (`LD_LIBRARY_PATH`,
//!    the `ld.so` cache, the default directories);
//! 3. the library directories of `CUDA_HOME`, `CUDA_PATH` and `CUDA_ROOT`, then of
//!    `/usr/local/cuda` and `/usr/local/cuda-*` (newest first) and `/opt/cuda`;
//! 4. the `nvidia` package directories of every Python environment it can see without
//!    running Python: `VIRTUAL_ENV`, `CONDA_PREFIX`, the entries of `PYTHONPATH`, the
//!    user's `~/.local`, `/opt/conda`, and the system's `python3*` directories.
//!
//! The outcome says which file was loaded (its real path, asked of the loader) and its
//! version, or every place looked and why each candidate was refused; the device
//! description shows either, so `xpu devices` answers "which NVRTC?" and "why none?".

use std::collections::HashSet;
use std::ffi::{c_void, OsStr};
use std::fmt;
use std::path::{Path, PathBuf};

use libloading::Library;

/// What to look for: one library, its names and where installs put it.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The library's name for messages (`NVRTC`).
    pub what: &'static str,
    /// The override variable: a file, or a directory to look in.
    pub env: &'static str,
    /// The file-name stem (`libnvrtc.so`): files named this, or this plus a version
    /// suffix, are candidates in a directory.
    pub stem: &'static str,
    /// Names tried through the loader path, most preferred first.
    pub sonames: &'static [&'static str],
    /// Directories under a Python environment's `site-packages` that hold it.
    pub python: &'static [&'static str],
}

/// NVRTC, the runtime compiler of CUDA C.
pub const NVRTC: Spec = Spec {
    what: "NVRTC",
    env: "XPU_CUDA_NVRTC",
    stem: "libnvrtc.so",
    sonames: &[
        "libnvrtc.so.13",
        "libnvrtc.so.12",
        "libnvrtc.so.11.2",
        "libnvrtc.so",
    ],
    python: &[
        "nvidia/cu13/lib",
        "nvidia/cuda_nvrtc/lib",
        "nvidia/cu12/lib",
    ],
};

/// NCCL, NVIDIA's collective communication library.
pub const NCCL: Spec = Spec {
    what: "NCCL",
    env: "XPU_NCCL_LIBRARY",
    stem: "libnccl.so",
    sonames: &["libnccl.so.2", "libnccl.so"],
    python: &["nvidia/nccl/lib", "nvidia/cu13/lib", "nvidia/cu12/lib"],
};

/// Where to look: the environment variables that steer the search, and the fixed
/// directories of a system. [`Places::from_env`] reads the real ones; tests build
/// their own.
#[derive(Debug, Clone, Default)]
pub struct Places {
    /// The value of [`Spec::env`], if set.
    pub override_path: Option<PathBuf>,
    /// Whether to try [`Spec::sonames`] through the loader path.
    pub loader_path: bool,
    /// Toolkit roots (`CUDA_HOME` …, `/usr/local/cuda` …), in order.
    pub toolkits: Vec<PathBuf>,
    /// `site-packages` (or `dist-packages`) directories, in order.
    pub site_packages: Vec<PathBuf>,
}

impl Places {
    /// The places of this process's environment for `spec`.
    pub fn from_env(spec: &Spec) -> Places {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let mut toolkits: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
            .iter()
            .filter_map(|k| var(k).map(PathBuf::from))
            .collect();
        toolkits.push(PathBuf::from("/usr/local/cuda"));
        toolkits.extend(versioned_dirs(Path::new("/usr/local"), "cuda-"));
        toolkits.push(PathBuf::from("/opt/cuda"));

        let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
            .iter()
            .filter_map(|k| var(k).map(PathBuf::from))
            .collect();
        if let Some(home) = var("HOME") {
            prefixes.push(PathBuf::from(home).join(".local"));
        }
        prefixes.extend(["/opt/conda", "/usr/local", "/usr"].map(PathBuf::from));
        let mut site_packages: Vec<PathBuf> = var("PYTHONPATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default();
        for prefix in &prefixes {
            site_packages.extend(python_site_dirs(prefix));
        }
        site_packages.push(PathBuf::from("/usr/lib/python3/dist-packages"));
        Places {
            override_path: var(spec.env).map(PathBuf::from),
            loader_path: true,
            toolkits,
            site_packages,
        }
    }
}

/// `dir/PREFIX*` directories, newest version first (`cuda-13.0` before `cuda-12.6`).
fn versioned_dirs(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(Vec<u64>, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let version = name.strip_prefix(prefix)?;
            let key = version
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|p| p.parse().ok())
                .collect();
            Some((key, e.path()))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The `lib/python3*/{site,dist}-packages` directories of a prefix, newest first.
fn python_site_dirs(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        for py in versioned_dirs(&prefix.join(lib), "python3") {
            for packages in ["site-packages", "dist-packages"] {
                let dir = py.join(packages);
                if dir.is_dir() {
                    out.push(dir);
                }
            }
        }
    }
    out
}

/// The library directories of a toolkit root.
fn toolkit_lib_dirs(root: &Path) -> [PathBuf; 4] {
    [
        root.join("lib64"),
        root.join("lib"),
        root.join(format!("targets/{}-linux/lib", std::env::consts::ARCH)),
        root.join("nvvm/lib64"),
    ]
}

/// Files in `dir` named `stem` or `stem.VERSION`, shortest name first (the soname
/// link before the fully versioned file it points to; duplicates are dropped later).
fn files_in(dir: &Path, stem: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name == stem
                || name
                    .strip_prefix(stem)
                    .and_then(|rest| rest.strip_prefix('.'))
                    .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
        })
        .map(|e| e.path())
        .collect();
    found.sort_by_key(|p| (p.as_os_str().len(), p.clone()));
    found
}

/// One library that loaded and passed its checks.
pub struct Found<T> {
    /// What the caller made of it (its function table, say).
    pub value: T,
    /// The file the loader mapped, as the loader reports it.
    pub path: String,
    /// Its version, as the library reports it.
    pub version: String,
    /// What was tried and refused before it, in order.
    pub refused: Vec<String>,
}

impl<T> fmt::Debug for Found<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Found")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("refused", &self.refused)
            .finish()
    }
}

/// Why no library was found: every place looked at and every candidate refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound {
    /// The library's name.
    pub what: &'static str,
    /// The override variable.
    pub env: &'static str,
    /// Candidates that existed but were refused, each with its reason.
    pub refused: Vec<String>,
    /// Where the search looked (names through the loader path, directories).
    pub looked: Vec<String>,
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} not found", self.what)?;
        if !self.refused.is_empty() {
            write!(f, "; refused: {}", self.refused.join("; "))?;
        }
        write!(
            f,
            "; looked in: {}; set {} to the library's path",
            self.looked.join(", "),
            self.env
        )
    }
}

/// A candidate: a name for the loader path, or a file.
enum Candidate {
    Name(&'static str),
    File(PathBuf),
}

/// Every candidate of `spec` in `places`, in search order, with what was looked at.
fn candidates(spec: &Spec, places: &Places) -> (Vec<Candidate>, Vec<String>) {
    let mut out = Vec::new();
    let mut looked = Vec::new();
    if let Some(path) = &places.override_path {
        looked.push(format!("{}={}", spec.env, path.display()));
        if path.is_dir() {
            out.extend(files_in(path, spec.stem).into_iter().map(Candidate::File));
        } else {
            out.push(Candidate::File(path.clone()));
        }
        return (out, looked);
    }
    if places.loader_path {
        looked.push(format!("the loader path ({})", spec.sonames.join(", ")));
        out.extend(spec.sonames.iter().map(|n| Candidate::Name(n)));
    }
    let mut dirs: Vec<PathBuf> = places
        .toolkits
        .iter()
        .flat_map(|r| toolkit_lib_dirs(r))
        .collect();
    for site in &places.site_packages {
        dirs.extend(spec.python.iter().map(|p| site.join(p)));
    }
    let mut seen = HashSet::new();
    for dir in dirs {
        if !seen.insert(dir.clone()) {
            continue;
        }
        let files = files_in(&dir, spec.stem);
        if files.is_empty() {
            continue;
        }
        looked.push(dir.display().to_string());
        out.extend(files.into_iter().map(Candidate::File));
    }
    if looked.len() <= usize::from(places.loader_path) {
        looked.push(format!(
            "no toolkit or Python package directory holding {}* ({} toolkit roots, {} site-packages directories)",
            spec.stem,
            places.toolkits.len(),
            places.site_packages.len()
        ));
    }
    (out, looked)
}

/// The file the loader mapped for `symbol`, a symbol of a loaded library.
fn mapped_path(symbol: *const c_void) -> Option<String> {
    // SAFETY: `Dl_info` is plain data; all-zero is a valid value to be overwritten.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `symbol` is an address inside a library loaded by this process; `dladdr`
    // only reads the loader's tables and fills `info`.
    if unsafe { libc::dladdr(symbol, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: `dli_fname` is a NUL-terminated string owned by the loader, valid while
    // the library stays loaded (it is, for the length of this call).
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let name = name.to_string_lossy().into_owned();
    Some(
        std::fs::canonicalize(&name)
            .map(|p| p.display().to_string())
            .unwrap_or(name),
    )
}

/// What a caller makes of a loaded library: its function table and version, and a
/// symbol's address (to ask the loader which file it is), or why it is unusable.
pub struct Opened<T> {
    /// The caller's value.
    pub value: T,
    /// The library's version, for messages.
    pub version: String,
    /// The address of one of its symbols.
    pub symbol: *const c_void,
}

/// Searches `places` for `spec`. `open` turns a loaded library into the caller's value
/// (or refuses it, saying why); the library stays loaded for the life of the process
/// once accepted, and refused ones are unloaded.
///
/// # Safety
/// Loading a library runs its initialisers. The caller vouches that the candidates
/// `places` leads to are libraries it means to load (which is what discovery is for),
/// and that `open` uses the library only as its ABI says.
pub unsafe fn search<T>(
    spec: &Spec,
    places: &Places,
    open: impl Fn(&Library) -> Result<Opened<T>, String>,
) -> Result<Found<T>, NotFound> {
    let (candidates, looked) = candidates(spec, places);
    let mut refused = Vec::new();
    let mut tried_files = HashSet::new();
    for candidate in candidates {
        let (label, loaded) = match &candidate {
            Candidate::Name(name) => {
                // SAFETY: the caller's contract (loading runs initialisers).
                (name.to_string(), unsafe { Library::new(OsStr::new(name)) })
            }
            Candidate::File(path) => {
                let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                if !tried_files.insert(real.clone()) {
                    continue;
                }
                // SAFETY: the caller's contract (loading runs initialisers).
                (path.display().to_string(), unsafe { Library::new(&real) })
            }
        };
        let lib = match loaded {
            Ok(lib) => lib,
            // Names absent from the loader path are expected; they are in `looked`.
            Err(_) if matches!(candidate, Candidate::Name(_)) => continue,
            Err(e) => {
                refused.push(format!("{label}: {e}"));
                continue;
            }
        };
        match open(&lib) {
            Ok(opened) => {
                let path = mapped_path(opened.symbol).unwrap_or(label);
                if let Candidate::Name(_) = candidate {
                    if let Ok(real) = std::fs::canonicalize(&path) {
                        tried_files.insert(real);
                    }
                }
                // Accepted: the function table points into the library, which stays
                // loaded for the rest of the process.
                std::mem::forget(lib);
                return Ok(Found {
                    value: opened.value,
                    path,
                    version: opened.version,
                    refused,
                });
            }
            Err(reason) => {
                let path = lib_path_for_message(&lib, &label);
                refused.push(format!("{path}: {reason}"));
            }
        }
    }
    Err(NotFound {
        what: spec.what,
        env: spec.env,
        refused,
        looked,
    })
}

/// A refused library's file for messages: the label (a file already), or what the
/// loader mapped for a name.
fn lib_path_for_message(lib: &Library, label: &str) -> String {
    if label.contains('/') {
        return label.to_string();
    }
    // SAFETY: the symbol is only looked up to learn its address, never called.
    let any = unsafe { lib.get::<*const c_void>(b"_init\0") }
        .ok()
        .map(|s| *s);
    any.and_then(mapped_path)
        .map(|p| format!("{label} ({p})"))
        .unwrap_or_else(|| label.to_string())
}

/// Looks up `name` in `lib` as a function pointer of type `F`, or says it is missing.
///
/// # Safety
/// `F` must be the C type of the function `name` as the library's ABI declares it.
pub unsafe fn symbol<F: Copy>(lib: &Library, what: &str, name: &str) -> Result<F, String> {
    // SAFETY: the caller's contract: `F` is the symbol's true type.
    unsafe { lib.get::<F>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|_| format!("it lacks {name} (a {what} too old, or not {what})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_files_are_candidates_and_other_libraries_are_not() {
        let dir = std::env::temp_dir().join(format!("xpu-cuda-libs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "libnvrtc.so",
            "libnvrtc.so.13",
            "libnvrtc.so.13.0.48",
            "libnvrtc-builtins.so.13.0",
            "libnvrtc.so.13.bak",
            "libnvrtc.a",
        ] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let names: Vec<String> = files_in(&dir, "libnvrtc.so")
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.13.0.48"]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn newer_toolkits_come_first() {
        let dir = std::env::temp_dir().join(format!("xpu-cuda-dirs-{}", std::process::id()));
        for d in ["cuda-12.6", "cuda-13.0", "cuda-12.10", "other"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let found: Vec<String> = versioned_dirs(&dir, "cuda-")
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(found, ["cuda-13.0", "cuda-12.10", "cuda-12.6"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn python_environments_are_searched_newest_python_first() {
        let prefix = std::env::temp_dir().join(format!("xpu-cuda-venv-{}", std::process::id()));
        for d in [
            "lib/python3.10/site-packages",
            "lib/python3.12/site-packages",
            "lib/python3.12/dist-packages",
            "lib/python2.7/site-packages",
        ] {
            std::fs::create_dir_all(prefix.join(d)).unwrap();
        }
        let found: Vec<String> = python_site_dirs(&prefix)
            .iter()
            .map(|p| p.strip_prefix(&prefix).unwrap().display().to_string())
            .collect();
        assert_eq!(
            found,
            [
                "lib/python3.12/site-packages",
                "lib/python3.12/dist-packages",
                "lib/python3.10/site-packages"
            ]
        );
        std::fs::remove_dir_all(&prefix).unwrap();
    }

    #[test]
    fn an_override_is_the_only_place_looked() {
        let places = Places {
            override_path: Some(PathBuf::from("/nonexistent/libnvrtc.so.13")),
            loader_path: true,
            toolkits: vec![PathBuf::from("/usr/local/cuda")],
            site_packages: Vec::new(),
        };
        // SAFETY: the only candidate does not exist, so nothing is loaded.
        let e = unsafe { search(&NVRTC, &places, |_| Err::<Opened<()>, _>("unused".into())) }
            .unwrap_err();
        assert_eq!(e.looked, ["XPU_CUDA_NVRTC=/nonexistent/libnvrtc.so.13"]);
        assert_eq!(e.refused.len(), 1, "{e}");
        assert!(e.to_string().contains("set XPU_CUDA_NVRTC"), "{e}");
    }
}
