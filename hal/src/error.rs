//! The error type every fallible HAL call returns.
//!
//! The enum is deliberately small so that callers can match on it: each variant is a
//! distinct *remedy* (fix the arguments, free memory, pick another device, retry …),
//! not a distinct cause. Causes live in the message, which always says what was asked,
//! what was found and what to do about it. Backend-specific detail (a Vulkan result
//! code, a CUDA error name, a plugin's own error object) travels in
//! [`Error::Backend`]'s `source` chain.
//!
//! Errors are `Clone` because one asynchronous failure may have to be reported to
//! several waiters (every event recorded after it, and the next `synchronize`).

use std::fmt;
use std::sync::Arc;

/// Result alias used throughout xpu.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error an xpu call can return.
///
/// Out-of-tree backends construct these directly; the helper constructors
/// ([`Error::invalid`], [`Error::unsupported`] …) only save typing.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument is wrong: out of bounds, wrong device, wrong dtype, freed memory …
    /// The message names the argument and the fix. Retrying the same call fails again.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// What was wrong and what to do instead.
        message: String,
    },
    /// The device could not satisfy an allocation. The device stays usable.
    #[error(
        "out of memory on {device}: requested {requested} bytes, {free} of {capacity} bytes free; {hint}"
    )]
    OutOfMemory {
        /// The device that ran out, as `backend:index`.
        device: String,
        /// Bytes that were asked for.
        requested: u64,
        /// Bytes that were free when the request failed.
        free: u64,
        /// Total bytes the device can hold.
        capacity: u64,
        /// What the caller can do about it.
        hint: String,
    },
    /// The device or backend cannot do this at all (a missing capability).
    #[error("unsupported: {message}")]
    Unsupported {
        /// What was asked and which capability is missing.
        message: String,
    },
    /// A backend is not present on this machine (no driver, no library, no device).
    #[error("backend `{backend}` is unavailable: {reason}")]
    Unavailable {
        /// The backend's name.
        backend: String,
        /// Why it is unavailable, for instance the loader's message.
        reason: String,
    },
    /// The device stopped working; every later call on it fails the same way.
    #[error("device {device} was lost: {message}")]
    DeviceLost {
        /// The device, as `backend:index`.
        device: String,
        /// What the driver reported.
        message: String,
    },
    /// A wait ran out of time before the work finished.
    #[error("timed out: {message}")]
    Timeout {
        /// What was being waited for, and for how long.
        message: String,
    },
    /// The work did not run, or did not finish, because something else failed first
    /// (an earlier operation on the stream, a waited-on event, a panic in a worker).
    #[error("aborted: {message}")]
    Aborted {
        /// What failed first.
        message: String,
    },
    /// A backend-specific failure with its original error in the source chain.
    #[error("{backend} backend error: {source}")]
    Backend {
        /// The backend's name.
        backend: String,
        /// The backend's own error.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`] with the given message.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            message: message.into(),
        }
    }

    /// An [`Error::Unsupported`] with the given message.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Error::Unsupported {
            message: message.into(),
        }
    }

    /// An [`Error::Aborted`] with the given message.
    pub fn aborted(message: impl Into<String>) -> Self {
        Error::Aborted {
            message: message.into(),
        }
    }

    /// An [`Error::Unavailable`] for `backend`.
    pub fn unavailable(backend: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Unavailable {
            backend: backend.into(),
            reason: reason.into(),
        }
    }

    /// An [`Error::Backend`] wrapping any error type.
    pub fn backend(
        backend: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Backend {
            backend: backend.into(),
            source: Arc::new(source),
        }
    }

    /// An [`Error::Backend`] carrying only a message.
    pub fn backend_message(backend: impl Into<String>, message: impl Into<String>) -> Self {
        Error::backend(backend, MessageError(message.into()))
    }

    /// The error a panic payload turns into when it is caught at a thread or ABI boundary.
    pub fn from_panic(context: &str, payload: &(dyn std::any::Any + Send)) -> Self {
        let what = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "a panic with a non-string payload".to_string()
        };
        Error::aborted(format!("{context} panicked: {what}"))
    }

    /// A short, stable name for the variant (`"invalid-argument"`, `"out-of-memory"` …),
    /// useful in reports and for matching in scripts.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidArgument { .. } => "invalid-argument",
            Error::OutOfMemory { .. } => "out-of-memory",
            Error::Unsupported { .. } => "unsupported",
            Error::Unavailable { .. } => "unavailable",
            Error::DeviceLost { .. } => "device-lost",
            Error::Timeout { .. } => "timeout",
            Error::Aborted { .. } => "aborted",
            Error::Backend { .. } => "backend",
        }
    }
}

/// A plain message used as the source of [`Error::Backend`] when there is no richer error.
#[derive(Debug, Clone)]
pub struct MessageError(pub String);

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MessageError {}
