//! Finding plugin files: explicit paths and `XPU_PLUGIN_PATH`, and the checks a file
//! must pass before it is loaded.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backend::PluginBackend;
use crate::error::{LoadError, LoadErrorKind};

/// The environment variable listing plugin files and folders, separated like `PATH`
/// (`:` on Unix, `;` on Windows).
pub const PATH_ENV: &str = "XPU_PLUGIN_PATH";

/// File name extensions a folder entry of the search path is scanned for.
pub const LIBRARY_EXTENSIONS: &[&str] = if cfg!(target_os = "windows") {
    &["dll"]
} else if cfg!(target_os = "macos") {
    &["dylib", "so"]
} else {
    &["so"]
};

/// The outcome of [`discover`]: the plugins that loaded, as backends ready to be
/// registered, and an error for each file or search-path entry that did not.
#[derive(Default)]
pub struct Discovery {
    /// One backend per plugin, in the order found (explicit paths first).
    pub backends: Vec<Arc<PluginBackend>>,
    /// One error per file or entry that was refused; each names its path.
    pub errors: Vec<LoadError>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field(
                "backends",
                &self
                    .backends
                    .iter()
                    .map(|b| b.path().display().to_string())
                    .collect::<Vec<_>>(),
            )
            .field("errors", &self.errors)
            .finish()
    }
}

/// Loads the plugins named by `explicit` (files or folders) and by `XPU_PLUGIN_PATH`.
///
/// Never fails as a whole and never panics: a file that cannot be used becomes an entry
/// of [`Discovery::errors`] and the others load. See [`discover_from`] for the rules.
pub fn discover(explicit: &[PathBuf]) -> Discovery {
    discover_from(explicit, std::env::var_os(PATH_ENV).as_deref())
}

/// [`discover`] with the search path given instead of read from the environment.
///
/// - `explicit` entries are files or folders the user named (a `--plugin PATH` flag). A
///   relative one is resolved against the current directory, explicitly, because the
///   user typed it there.
/// - `search_path` is split like `PATH`. Empty entries are skipped (they do *not* mean
///   the current directory, as they would in `PATH`) and relative entries are refused
///   ([`LoadErrorKind::RelativeSearchPath`]): an inherited environment variable must not
///   make the process load code from wherever it happens to be started.
/// - A folder contributes every file in it whose extension is in
///   [`LIBRARY_EXTENSIONS`], in name order; sub-folders are not searched.
/// - A file reached twice (by two entries, or through a symbolic link) is loaded once.
///   A second plugin with a name already taken is refused, naming the first file.
/// - Each file must pass [`check_file`] before it is loaded.
pub fn discover_from(explicit: &[PathBuf], search_path: Option<&OsStr>) -> Discovery {
    let mut out = Discovery::default();
    let mut files = Vec::new();
    for path in explicit {
        let path = match std::path::absolute(path) {
            Ok(p) => p,
            Err(e) => {
                out.errors.push(LoadError::new(
                    path.clone(),
                    LoadErrorKind::Io {
                        message: format!("cannot resolve it against the current directory: {e}"),
                    },
                ));
                continue;
            }
        };
        expand(&path, &mut files, &mut out.errors);
    }
    if let Some(search_path) = search_path {
        for entry in std::env::split_paths(search_path) {
            if entry.as_os_str().is_empty() {
                continue;
            }
            if entry.is_relative() {
                out.errors
                    .push(LoadError::new(entry, LoadErrorKind::RelativeSearchPath));
                continue;
            }
            expand(&entry, &mut files, &mut out.errors);
        }
    }
    let mut seen = HashSet::new();
    let mut names: HashMap<String, PathBuf> = HashMap::new();
    for file in files {
        let canonical = match check_file(&file) {
            Ok(c) => c,
            Err(cause) => {
                out.errors.push(LoadError::new(file, cause));
                continue;
            }
        };
        if !seen.insert(canonical.clone()) {
            continue;
        }
        match PluginBackend::open_checked(&canonical, &file) {
            Ok(backend) => {
                if let Some(first) = names.get(backend.plugin_name()) {
                    out.errors.push(LoadError::new(
                        file,
                        LoadErrorKind::DuplicateName {
                            name: backend.plugin_name().to_string(),
                            first: first.clone(),
                        },
                    ));
                    continue;
                }
                names.insert(backend.plugin_name().to_string(), file);
                out.backends.push(Arc::new(backend));
            }
            Err(e) => out.errors.push(e),
        }
    }
    out
}

/// Adds `path` (a file) or the plugin files in it (a folder) to `files`.
fn expand(path: &Path, files: &mut Vec<PathBuf>, errors: &mut Vec<LoadError>) {
    let metadata = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            errors.push(LoadError::new(path, io_error(&e)));
            return;
        }
    };
    if metadata.is_file() {
        files.push(path.to_path_buf());
        return;
    }
    if !metadata.is_dir() {
        errors.push(LoadError::new(path, LoadErrorKind::NotAFile));
        return;
    }
    // A folder anyone may write to is refused once, not once per file in it.
    if let Err(cause) = path
        .canonicalize()
        .map_err(|e| io_error(&e))
        .and_then(|c| check_owner_and_mode(&c, "the folder"))
    {
        errors.push(LoadError::new(path, cause));
        return;
    }
    let entries = match std::fs::read_dir(path) {
        Ok(e) => e,
        Err(e) => {
            errors.push(LoadError::new(path, io_error(&e)));
            return;
        }
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(OsStr::to_str)
                .is_some_and(|ext| LIBRARY_EXTENSIONS.contains(&ext))
                && p.is_file()
        })
        .collect();
    found.sort();
    files.extend(found);
}

fn io_error(e: &std::io::Error) -> LoadErrorKind {
    LoadErrorKind::Io {
        message: if e.kind() == std::io::ErrorKind::NotFound {
            "it does not exist".to_string()
        } else {
            e.to_string()
        },
    }
}

/// The checks a file passes before it is loaded; returns its canonical path, which is
/// what gets loaded (so a symbolic link swapped after the check changes nothing).
///
/// On Unix, the file and the folder it is in (after resolving links) must be owned by
/// the current user or by root and must not be writable by every user: otherwise
/// another user could put their code into this process. Other platforms only check
/// that the file exists and is a regular file.
pub fn check_file(path: &Path) -> Result<PathBuf, LoadErrorKind> {
    let canonical = path.canonicalize().map_err(|e| io_error(&e))?;
    let metadata = std::fs::metadata(&canonical).map_err(|e| io_error(&e))?;
    if !metadata.is_file() {
        return Err(LoadErrorKind::NotAFile);
    }
    check_owner_and_mode(&canonical, "the file")?;
    if let Some(parent) = canonical.parent() {
        check_owner_and_mode(parent, "its folder")?;
    }
    Ok(canonical)
}

#[cfg(unix)]
fn check_owner_and_mode(path: &Path, what: &str) -> Result<(), LoadErrorKind> {
    use std::os::unix::fs::MetadataExt;

    extern "C" {
        fn geteuid() -> u32;
    }
    let metadata = std::fs::metadata(path).map_err(|e| io_error(&e))?;
    let mode = metadata.mode() & 0o7777;
    let offender = |problem: String| LoadErrorKind::InsecurePermissions {
        offender: path.to_path_buf(),
        problem: format!("{what} {} {problem}", path.display()),
    };
    if mode & 0o002 != 0 {
        return Err(offender(format!(
            "is writable by every user (mode {mode:o})"
        )));
    }
    // SAFETY: `geteuid` has no preconditions and cannot fail (POSIX).
    let me = unsafe { geteuid() };
    let owner = metadata.uid();
    if owner != me && owner != 0 {
        return Err(offender(format!(
            "is owned by uid {owner}, neither the current user (uid {me}) nor root"
        )));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_owner_and_mode(_path: &Path, _what: &str) -> Result<(), LoadErrorKind> {
    Ok(())
}
