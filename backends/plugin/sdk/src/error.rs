//! [`Error`]: what a plugin returns when a call fails, and the heap object it becomes
//! at the C boundary.
//!
//! The codes are the header's `xpu_error_code` values, one [`ErrorCode`] variant each.
//! Like the HAL's errors they are remedies, not causes: `InvalidArgument` (the caller
//! must change the call), `OutOfMemory` (free something), `Unsupported` (the device
//! cannot do it), and so on. The cause goes in the message, which should say what was
//! asked, what was found and what to do.
//!
//! When an entry point returns an `Err`, the SDK moves the error into a heap object and
//! hands the host a pointer to it; the host reads it with `error_code` /
//! `error_message` and frees it with `error_destroy`, exactly once. A panic inside the
//! plugin becomes such an object too ([`ErrorCode::Internal`], with the panic message).

use std::any::Any;
use std::ffi::{c_char, CString};
use std::fmt;

use crate::abi::{self, xpu_error};

/// Result alias of the SDK.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `xpu_error_code`: what kind of failure, as a remedy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The caller's arguments are wrong; the same call fails again.
    InvalidArgument,
    /// An allocation did not fit; the device stays usable.
    OutOfMemory,
    /// The device cannot do this.
    Unsupported,
    /// The hardware or its driver is not present.
    Unavailable,
    /// The device stopped working.
    DeviceLost,
    /// A wait ran out of time.
    Timeout,
    /// Work did not run because something failed first.
    Aborted,
    /// Anything else, including a panic inside the plugin.
    Internal,
}

impl ErrorCode {
    /// The C value (`XPU_ERROR_*`).
    pub const fn raw(self) -> u32 {
        match self {
            ErrorCode::InvalidArgument => abi::error_code::INVALID_ARGUMENT,
            ErrorCode::OutOfMemory => abi::error_code::OUT_OF_MEMORY,
            ErrorCode::Unsupported => abi::error_code::UNSUPPORTED,
            ErrorCode::Unavailable => abi::error_code::UNAVAILABLE,
            ErrorCode::DeviceLost => abi::error_code::DEVICE_LOST,
            ErrorCode::Timeout => abi::error_code::TIMEOUT,
            ErrorCode::Aborted => abi::error_code::ABORTED,
            ErrorCode::Internal => abi::error_code::INTERNAL,
        }
    }

    /// The code of a C value, or `None` for a value this ABI version does not define.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        Some(match raw {
            abi::error_code::INVALID_ARGUMENT => ErrorCode::InvalidArgument,
            abi::error_code::OUT_OF_MEMORY => ErrorCode::OutOfMemory,
            abi::error_code::UNSUPPORTED => ErrorCode::Unsupported,
            abi::error_code::UNAVAILABLE => ErrorCode::Unavailable,
            abi::error_code::DEVICE_LOST => ErrorCode::DeviceLost,
            abi::error_code::TIMEOUT => ErrorCode::Timeout,
            abi::error_code::ABORTED => ErrorCode::Aborted,
            abi::error_code::INTERNAL => ErrorCode::Internal,
            _ => return None,
        })
    }

    /// A lowercase name for messages (`"invalid argument"` …).
    pub const fn name(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid argument",
            ErrorCode::OutOfMemory => "out of memory",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::DeviceLost => "device lost",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Aborted => "aborted",
            ErrorCode::Internal => "internal error",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failure: a code the host matches on and a message for people.
///
/// Cheap to clone, because one asynchronous failure is often reported several times
/// (to the next `synchronize` and to every event recorded after it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    code: ErrorCode,
    message: String,
}

impl Error {
    /// An error with a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }

    /// [`ErrorCode::InvalidArgument`].
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::InvalidArgument, message)
    }

    /// [`ErrorCode::OutOfMemory`].
    pub fn out_of_memory(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::OutOfMemory, message)
    }

    /// [`ErrorCode::Unsupported`].
    pub fn unsupported(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::Unsupported, message)
    }

    /// [`ErrorCode::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::Unavailable, message)
    }

    /// [`ErrorCode::DeviceLost`].
    pub fn device_lost(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::DeviceLost, message)
    }

    /// [`ErrorCode::Timeout`].
    pub fn timeout(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::Timeout, message)
    }

    /// [`ErrorCode::Aborted`].
    pub fn aborted(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::Aborted, message)
    }

    /// [`ErrorCode::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::Internal, message)
    }

    /// An error describing a caught panic: `code`, and a message made of `context` and
    /// the panic's own message. Worker threads use it with [`ErrorCode::Aborted`] for
    /// work that panicked; the SDK uses it with [`ErrorCode::Internal`] for a panic in
    /// an entry point.
    pub fn from_panic(code: ErrorCode, context: &str, payload: &(dyn Any + Send)) -> Self {
        Error::new(
            code,
            format!("{context} panicked: {}", panic_message(payload)),
        )
    }

    /// The code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error with `context: ` put before its message.
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error {
            code: self.code,
            message: format!("{context}: {}", self.message),
        }
    }

    /// Moves the error into a heap object for the host, which frees it with
    /// `error_destroy` ([`error_destroy`]).
    pub fn into_raw(self) -> *mut xpu_error {
        let message = CString::new(self.message.replace('\0', "\u{fffd}"))
            .unwrap_or_else(|_| CString::from(c"(an error message that could not be stored)"));
        Box::into_raw(Box::new(RawError {
            magic: ERROR_MAGIC,
            code: self.code.raw(),
            message,
        }))
        .cast()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

/// The text of a panic payload (`panic!` with a literal or with format arguments).
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic with a payload that is not a string"
    }
}

const ERROR_MAGIC: u64 = 0x7870_755f_6572_7230; // "xpu_err0"

/// The heap object behind an `xpu_error*` made by this SDK.
#[repr(C)]
struct RawError {
    magic: u64,
    code: u32,
    message: CString,
}

/// The error object behind `error`, if it is one of ours.
///
/// # Safety
/// `error` is null or a pointer returned by [`Error::into_raw`] and not yet destroyed.
unsafe fn raw_error<'a>(error: *const xpu_error) -> Option<&'a RawError> {
    if error.is_null() {
        return None;
    }
    // SAFETY: per the contract, a non-null `error` points to a live `RawError`.
    let raw = unsafe { &*error.cast::<RawError>() };
    (raw.magic == ERROR_MAGIC).then_some(raw)
}

/// `error_code`: the code of an error object. Never fails; a null (or foreign) pointer
/// reads as `XPU_ERROR_INTERNAL`.
///
/// # Safety
/// `error` is null or an error object of this plugin that has not been destroyed.
pub unsafe extern "C" fn error_code(error: *const xpu_error) -> u32 {
    // SAFETY: forwarded contract.
    match unsafe { raw_error(error) } {
        Some(raw) => raw.code,
        None => abi::error_code::INTERNAL,
    }
}

/// `error_message`: the message of an error object, valid until it is destroyed.
/// Never fails; a null (or foreign) pointer gives a static message saying so.
///
/// # Safety
/// `error` is null or an error object of this plugin that has not been destroyed.
pub unsafe extern "C" fn error_message(error: *const xpu_error) -> *const c_char {
    // SAFETY: forwarded contract.
    match unsafe { raw_error(error) } {
        Some(raw) => raw.message.as_ptr(),
        None => c"error_message was given a NULL or unknown error object".as_ptr(),
    }
}

/// `error_destroy`: frees an error object. Null is ignored.
///
/// # Safety
/// `error` is null or an error object of this plugin, destroyed exactly once.
pub unsafe extern "C" fn error_destroy(error: *mut xpu_error) {
    // SAFETY: forwarded contract; the object came from `Box::into_raw` in `into_raw`.
    if unsafe { raw_error(error) }.is_some() {
        // SAFETY: as above; this is the one release of the box.
        drop(unsafe { Box::from_raw(error.cast::<RawError>()) });
    }
}

/// Takes an error object back into an [`Error`] and frees it: for tests and Rust
/// hosts that call a table directly. Null gives `None`.
///
/// # Safety
/// `error` is null or an error object of this plugin that has not been destroyed; it
/// is destroyed by this call.
pub unsafe fn take_raw(error: *mut xpu_error) -> Option<Error> {
    // SAFETY: forwarded contract.
    let raw = unsafe { raw_error(error) }?;
    let taken = Error::new(
        ErrorCode::from_raw(raw.code).unwrap_or(ErrorCode::Internal),
        raw.message.to_string_lossy().into_owned(),
    );
    // SAFETY: forwarded contract; this is the one release.
    unsafe { error_destroy(error) };
    Some(taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_round_trip_through_raw_objects() {
        let raw = Error::out_of_memory("no room\0here").into_raw();
        // SAFETY: `raw` is a live error object.
        unsafe {
            assert_eq!(error_code(raw), abi::error_code::OUT_OF_MEMORY);
            let msg = std::ffi::CStr::from_ptr(error_message(raw));
            assert_eq!(msg.to_str().unwrap(), "no room\u{fffd}here");
            error_destroy(raw);
        }
        // SAFETY: null is allowed.
        unsafe {
            assert_eq!(error_code(std::ptr::null()), abi::error_code::INTERNAL);
            assert!(!error_message(std::ptr::null()).is_null());
            error_destroy(std::ptr::null_mut());
        }
    }

    #[test]
    fn codes_map_both_ways() {
        for raw in 1..=8 {
            assert_eq!(ErrorCode::from_raw(raw).map(ErrorCode::raw), Some(raw));
        }
        assert_eq!(ErrorCode::from_raw(0), None);
        assert_eq!(ErrorCode::from_raw(9), None);
    }

    #[test]
    fn panic_messages_are_extracted() {
        let payload = std::panic::catch_unwind(|| panic!("boom {}", 7)).unwrap_err();
        let e = Error::from_panic(ErrorCode::Internal, "device_open", &*payload);
        assert_eq!(e.message(), "device_open panicked: boom 7");
    }
}
