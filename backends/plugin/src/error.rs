//! The loader's errors: [`LoadError`] for a plugin that cannot be used at all, and
//! [`PluginError`], a plugin's own error object copied out of the ABI, which becomes the
//! source of an [`xpu_hal::Error::Backend`] when its code has no better HAL variant.

use std::fmt;
use std::path::{Path, PathBuf};

use xpu_plugin_sdk::abi::error_code;

/// Why one plugin (or one entry of the search path) was not loaded. The host process
/// goes on without it; the message names the file and says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    path: PathBuf,
    cause: LoadErrorKind,
}

impl LoadError {
    pub(crate) fn new(path: impl Into<PathBuf>, cause: LoadErrorKind) -> Self {
        LoadError {
            path: path.into(),
            cause,
        }
    }

    /// The file or folder concerned, as it was given (or as it was found in a folder).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What was wrong.
    pub fn cause(&self) -> &LoadErrorKind {
        &self.cause
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot load xpu plugin {}: {}",
            self.path.display(),
            self.cause
        )
    }
}

impl std::error::Error for LoadError {}

impl From<LoadError> for xpu_hal::Error {
    /// An [`xpu_hal::Error::Unavailable`] of the backend `plugin`, whose reason is the
    /// whole message.
    fn from(e: LoadError) -> Self {
        xpu_hal::Error::unavailable("plugin", e.to_string())
    }
}

/// The causes of a [`LoadError`]. Each message says what was found and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadErrorKind {
    /// An entry of `XPU_PLUGIN_PATH` is a relative path. Plugins are never looked up
    /// relative to the current directory, which an attacker may control.
    RelativeSearchPath,
    /// The file or folder does not exist or cannot be read.
    Io {
        /// The operating system's message.
        message: String,
    },
    /// The path is neither a regular file nor a folder.
    NotAFile,
    /// The file or its folder could be replaced by another user.
    InsecurePermissions {
        /// The file or folder that failed the check.
        offender: PathBuf,
        /// What is wrong with it, naming it.
        problem: String,
    },
    /// The dynamic loader refused the file (not a shared library, wrong architecture,
    /// a missing dependency or an unresolved symbol …).
    NotALibrary {
        /// The dynamic loader's message.
        message: String,
    },
    /// The library does not export `xpu_plugin_get_api`.
    MissingEntryPoint,
    /// `xpu_plugin_get_api` returned NULL.
    Refused {
        /// The ABI version the host offered.
        host: (u32, u32),
    },
    /// The plugin was built for another major ABI version.
    IncompatibleMajor {
        /// The plugin's `abi_major.abi_minor`.
        plugin: (u32, u32),
        /// The host's.
        host: (u32, u32),
    },
    /// The function table is smaller than ABI 1.0's.
    TableTooSmall {
        /// The table's `struct_size`.
        size: usize,
        /// `XPU_PLUGIN_API_MIN_SIZE`.
        min: usize,
    },
    /// A function the ABI requires is NULL.
    MissingFunction {
        /// The field's name in `xpu_plugin_api`.
        function: &'static str,
    },
    /// The plugin's name is NULL or not of the form `[a-z0-9_-]+`.
    InvalidName {
        /// The name as far as it could be read, or `None` for NULL.
        name: Option<String>,
    },
    /// Another plugin with the same name was loaded first.
    DuplicateName {
        /// The name.
        name: String,
        /// The file that provides it already.
        first: PathBuf,
    },
}

impl fmt::Display for LoadErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadErrorKind::RelativeSearchPath => write!(
                f,
                "the {} entry is a relative path; plugins are never looked up relative to the current directory, so give an absolute path",
                crate::PATH_ENV
            ),
            LoadErrorKind::Io { message } => write!(f, "{message}"),
            LoadErrorKind::NotAFile => {
                write!(f, "it is neither a regular file nor a folder")
            }
            LoadErrorKind::InsecurePermissions { problem, .. } => write!(
                f,
                "{problem}, so another user could replace the plugin with their own code; plugins are loaded only from files and folders that you or root own and that not every user may write to (chmod o-w, chown)"
            ),
            LoadErrorKind::NotALibrary { message } => {
                write!(f, "the dynamic loader refused it (not a shared library for this machine, or a dependency or symbol is missing): {message}")
            }
            LoadErrorKind::MissingEntryPoint => write!(
                f,
                "it does not export the entry point `xpu_plugin_get_api`; build it against xpu_plugin.h and export the entry point with XPU_PLUGIN_EXPORT"
            ),
            LoadErrorKind::Refused { host } => write!(
                f,
                "its entry point returned NULL: the plugin refused this host's plugin ABI {}.{} or could not initialise; see the plugin's documentation",
                host.0, host.1
            ),
            LoadErrorKind::IncompatibleMajor { plugin, host } => {
                let (relation, remedy) = if plugin.0 > host.0 {
                    ("newer than", "use an xpu release that supports it, or a build of the plugin for this ABI")
                } else {
                    ("older than", "rebuild the plugin against this xpu's xpu_plugin.h")
                };
                write!(
                    f,
                    "it was built for plugin ABI {}.{}, {relation} this host's ABI {}.{} (major versions must be equal); {remedy}",
                    plugin.0, plugin.1, host.0, host.1
                )
            }
            LoadErrorKind::TableTooSmall { size, min } => write!(
                f,
                "its function table declares struct_size {size} bytes, less than the {min} bytes of ABI 1.0 (XPU_PLUGIN_API_MIN_SIZE); set struct_size with XPU_STRUCT_SIZE(xpu_plugin_api, <last member>)"
            ),
            LoadErrorKind::MissingFunction { function } => write!(
                f,
                "its function table has no `{function}` (NULL), which the plugin ABI requires"
            ),
            LoadErrorKind::InvalidName { name: None } => {
                write!(f, "its name is NULL; give it a name of the form [a-z0-9_-]+")
            }
            LoadErrorKind::InvalidName { name: Some(name) } => write!(
                f,
                "its name {name:?} is not of the form [a-z0-9_-]+ (lowercase ASCII letters, digits, `_`, `-`, at most {} characters)",
                crate::load::MAX_NAME_LEN
            ),
            LoadErrorKind::DuplicateName { name, first } => write!(
                f,
                "a plugin named `{name}` was already loaded from {}; remove one of the two",
                first.display()
            ),
        }
    }
}

/// A plugin's error object, copied out of the ABI before it was destroyed: which
/// function failed, the raw code and the plugin's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginError {
    /// The function of `xpu_plugin_api` that returned it.
    pub function: &'static str,
    /// The raw `xpu_error_code` (possibly a value the ABI does not define).
    pub code: u32,
    /// The plugin's message.
    pub message: String,
}

impl PluginError {
    /// The name of a known code (`"XPU_ERROR_INTERNAL"` …), or `None` for a value the ABI
    /// does not define.
    pub fn code_name(&self) -> Option<&'static str> {
        code_name(self.code)
    }
}

/// The name of an `xpu_error_code`, or `None` for a value ABI 1.x does not define.
pub(crate) fn code_name(code: u32) -> Option<&'static str> {
    Some(match code {
        error_code::INVALID_ARGUMENT => "XPU_ERROR_INVALID_ARGUMENT",
        error_code::OUT_OF_MEMORY => "XPU_ERROR_OUT_OF_MEMORY",
        error_code::UNSUPPORTED => "XPU_ERROR_UNSUPPORTED",
        error_code::UNAVAILABLE => "XPU_ERROR_UNAVAILABLE",
        error_code::DEVICE_LOST => "XPU_ERROR_DEVICE_LOST",
        error_code::TIMEOUT => "XPU_ERROR_TIMEOUT",
        error_code::ABORTED => "XPU_ERROR_ABORTED",
        error_code::INTERNAL => "XPU_ERROR_INTERNAL",
        _ => return None,
    })
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code_name() {
            Some(name) => write!(f, "{} failed with {name}: {}", self.function, self.message),
            None => write!(
                f,
                "{} failed with the unknown error code {} ({:#x}), which is not an xpu_error_code of plugin ABI 1.x (a plugin bug): {}",
                self.function, self.code, self.code, self.message
            ),
        }
    }
}

impl std::error::Error for PluginError {}
