//! What a conformance case is: [`Case`], the [`CaseContext`] it runs in, and the
//! [`CaseError`] it returns when it does not pass.

use std::fmt;
use std::str::FromStr;

use xpu_hal::{DType, Device, KernelFormat};

/// A group of cases a qualifier runs together.
///
/// A profile is a level of qualification: `core` is what every device must meet to be
/// driven by xpu at all; the others add what collectives and training need on top.
/// Each case belongs to exactly one profile, and running a profile runs the cases of
/// that profile only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Profile {
    /// Device properties, memory, copies, builtin operations, kernels, streams and
    /// events: the contract of the HAL itself.
    Core,
    /// Communicators (`xpu-collectives`) over the device alone, with devices of its
    /// backend and with devices of every other backend: every operation and algorithm,
    /// and the failure paths (timeouts, desyncs, abort).
    Collectives,
    /// The standard operations a training step is made of ([`xpu_hal::ops`]), each the
    /// device lists checked against the reference on every dtype it claims.
    Training,
    /// The contract beneath the HAL, called directly: a plugin device's C table
    /// (`xpu_plugin.h`) with argument structs of other sizes, NULL arguments, values
    /// the ABI does not define, and the exact error codes, where the host's own
    /// validation cannot stand in for the plugin's. Devices of other backends skip it.
    Abi,
}

impl Profile {
    /// Every profile, in a stable order.
    pub const ALL: [Profile; 4] = [
        Profile::Core,
        Profile::Collectives,
        Profile::Training,
        Profile::Abi,
    ];

    /// The lowercase name used on the command line (`"core"` …).
    pub const fn name(self) -> &'static str {
        match self {
            Profile::Core => "core",
            Profile::Collectives => "collectives",
            Profile::Training => "training",
            Profile::Abi => "abi",
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Profile {
    type Err = xpu_hal::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                xpu_hal::Error::invalid(format!(
                    "unknown conformance profile `{s}`; expected one of core, collectives, training, abi"
                ))
            })
    }
}

/// Why a case did not pass.
///
/// Both variants carry a sentence for the report. A failure says what was expected and
/// what was found; a skip names the capability or resource that is missing ("device
/// lacks dtype bf16", "needs a second device"), so that a skip is never a silent pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseError {
    /// The device does not meet the contract.
    Fail(String),
    /// The case cannot run on this device; the reason names what is missing.
    Skip(String),
}

impl CaseError {
    /// A failure with this message.
    pub fn fail(message: impl Into<String>) -> Self {
        CaseError::Fail(message.into())
    }

    /// A skip with this reason.
    pub fn skip(reason: impl Into<String>) -> Self {
        CaseError::Skip(reason.into())
    }

    /// The message or reason.
    pub fn message(&self) -> &str {
        match self {
            CaseError::Fail(m) | CaseError::Skip(m) => m,
        }
    }

    /// The same error with `context` in front of its message ("f16: …").
    pub fn context(self, context: impl fmt::Display) -> Self {
        match self {
            CaseError::Fail(m) => CaseError::Fail(format!("{context}: {m}")),
            CaseError::Skip(m) => CaseError::Skip(format!("{context}: {m}")),
        }
    }
}

impl fmt::Display for CaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseError::Fail(m) => write!(f, "failed: {m}"),
            CaseError::Skip(m) => write!(f, "skipped: {m}"),
        }
    }
}

impl std::error::Error for CaseError {}

/// An error from a HAL call the case did not expect to fail is a failure of the
/// device, reported with the error's kind and message.
impl From<xpu_hal::Error> for CaseError {
    fn from(e: xpu_hal::Error) -> Self {
        CaseError::Fail(format!("unexpected {} error: {e}", e.kind()))
    }
}

/// What a case returns: `Ok(())` when the device meets the contract.
pub type CaseOutcome = Result<(), CaseError>;

/// The world a case runs in: the device under test and the other devices of the run.
///
/// Owned by the runner for the duration of one case; cheap to clone (devices are
/// handles).
#[derive(Debug, Clone)]
pub struct CaseContext {
    /// The device under test.
    pub device: Device,
    /// The other devices of the run, of any backend, for cases that need a second
    /// device. May be empty; such cases skip.
    pub peers: Vec<Device>,
}

impl CaseContext {
    /// A context for `device` with `peers` as the other devices.
    pub fn new(device: Device, peers: Vec<Device>) -> Self {
        CaseContext { device, peers }
    }

    /// Skips unless the device supports builtin operations on `dtype`.
    pub fn require_dtype(&self, dtype: DType) -> CaseOutcome {
        if self.device.capabilities().supports_dtype(dtype) {
            Ok(())
        } else {
            Err(CaseError::skip(format!("device lacks dtype {dtype}")))
        }
    }

    /// Skips unless the device loads kernels of `format`.
    pub fn require_kernel_format(&self, format: KernelFormat) -> CaseOutcome {
        if self.device.capabilities().supports_kernel_format(format) {
            Ok(())
        } else {
            Err(CaseError::skip(format!(
                "device does not load {format} kernels"
            )))
        }
    }

    /// Whether the device loads host-function kernels.
    pub fn has_host_functions(&self) -> bool {
        self.device
            .capabilities()
            .supports_kernel_format(KernelFormat::HostFunction)
    }

    /// The first dtype of `preferred` that the device supports, or a skip naming them.
    pub fn pick_dtype(&self, preferred: &[DType]) -> Result<DType, CaseError> {
        preferred
            .iter()
            .copied()
            .find(|d| self.device.capabilities().supports_dtype(*d))
            .ok_or_else(|| {
                CaseError::skip(format!(
                    "device lacks every dtype this case can use ({})",
                    preferred
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// Skips unless the device supports `n` streams at once.
    pub fn require_streams(&self, n: u32) -> CaseOutcome {
        let max = self.device.capabilities().max_streams;
        if max >= n {
            Ok(())
        } else {
            Err(CaseError::skip(format!(
                "device supports {max} stream(s) at once; the case needs {n}"
            )))
        }
    }

    /// The first peer device, or a skip saying a second device is needed.
    pub fn require_peer(&self) -> Result<&Device, CaseError> {
        self.peers
            .first()
            .ok_or_else(|| CaseError::skip("needs a second device in the run"))
    }
}

/// One conformance case: a named check of one part of the contract, run once per device.
///
/// Cases are plain data (a function pointer and its descriptions), so vendors and tests
/// can define their own next to the built-in ones and pass them to
/// [`crate::run_cases`].
#[derive(Clone, Copy)]
pub struct Case {
    /// A dotted, lowercase name, unique in the suite: `area.what` (`copy.h2d_offsets`).
    pub name: &'static str,
    /// The profile the case belongs to.
    pub profile: Profile,
    /// One sentence saying what the case checks.
    pub description: &'static str,
    /// The check. It must not panic (the runner turns a panic into a failure anyway)
    /// and must leave the device usable for the next case.
    pub run: fn(&CaseContext) -> CaseOutcome,
    /// Whether the case needs the devices to itself: it measures the devices' free
    /// memory to the byte, or takes all of it. Harnesses that run cases in parallel
    /// ([`crate::harness`]) run it alone.
    pub exclusive: bool,
}

impl Case {
    /// A core-profile case.
    pub const fn core(
        name: &'static str,
        description: &'static str,
        run: fn(&CaseContext) -> CaseOutcome,
    ) -> Self {
        Case {
            name,
            profile: Profile::Core,
            description,
            run,
            exclusive: false,
        }
    }

    /// This case, run alone where cases run in parallel (see [`Case::exclusive`]).
    pub const fn alone(mut self) -> Self {
        self.exclusive = true;
        self
    }

    /// The name of this case run on `device`, as reports and test harnesses print it:
    /// `[backend/device] case` (`[host/host:0] copy.h2d_offsets`).
    pub fn display_name(&self, device: &Device) -> String {
        instance_name(device.backend(), &device.id().to_string(), self.name)
    }
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("profile", &self.profile)
            .finish()
    }
}

/// `[backend/device] case`.
pub(crate) fn instance_name(backend: &str, device: &str, case: &str) -> String {
    format!("[{backend}/{device}] {case}")
}
