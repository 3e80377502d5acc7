//! Tools the cases share: a pseudo-random pattern generator, typed element encoding,
//! comparisons that explain a mismatch, error-kind checks, host-function kernels that
//! let a case hold a stream at a known point (its own, or a peer's that the stream
//! waits on), and kernels written both as host functions and in WGSL.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use xpu_hal::{
    bf16, f16, Allocation, DType, Device, Error, HostArg, Kernel, KernelDesc, KernelParam,
    KernelSource, LaunchDims, Scalar, Stream, UserEvent,
};

use crate::case::{CaseContext, CaseError, CaseOutcome};

/// 1 MiB, the size of the larger buffers (kept small so the suite stays fast).
pub(crate) const MIB: u64 = 1 << 20;

/// How often a measurement of the device's free memory is repeated before it counts as
/// wrong: other work on the device (other cases of the run) may allocate or free
/// between two snapshots.
pub(crate) const ACCOUNTING_ATTEMPTS: usize = 20;

// ---------------------------------------------------------------------------------
// Pseudo-random data
// ---------------------------------------------------------------------------------

/// xorshift64*: small, fast, deterministic, and good enough to make every byte of a
/// copy distinguishable from its neighbours.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A float in `[-range, range]` on a grid of `1/step` (exact in every float type
    /// whose precision allows).
    pub(crate) fn grid(&mut self, range: f64, step: f64) -> f64 {
        let steps = (range * step) as u64;
        (self.below(2 * steps + 1) as f64 - steps as f64) / step
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

/// `len` pseudo-random bytes from `seed`.
pub(crate) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

// ---------------------------------------------------------------------------------
// Typed elements
// ---------------------------------------------------------------------------------

/// Little-endian bytes of `values` (written here rather than borrowed from the HAL so
/// that the reference does not share code with what it checks).
pub(crate) fn encode(values: &[Scalar]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        match *v {
            Scalar::F32(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
            Scalar::F64(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
            Scalar::F16(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
            Scalar::BF16(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
            Scalar::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Scalar::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Scalar::U8(x) => out.push(x),
        }
    }
    out
}

fn array<const N: usize>(chunk: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&chunk[..N]);
    a
}

/// The elements of `bytes` read as `dtype` (a trailing partial element is ignored).
pub(crate) fn decode(dtype: DType, bytes: &[u8]) -> Vec<Scalar> {
    bytes
        .chunks_exact(dtype.size())
        .map(|c| match dtype {
            DType::F32 => Scalar::F32(f32::from_bits(u32::from_le_bytes(array(c)))),
            DType::F64 => Scalar::F64(f64::from_bits(u64::from_le_bytes(array(c)))),
            DType::F16 => Scalar::F16(f16::from_bits(u16::from_le_bytes(array(c)))),
            DType::BF16 => Scalar::BF16(bf16::from_bits(u16::from_le_bytes(array(c)))),
            DType::I32 => Scalar::I32(i32::from_le_bytes(array(c))),
            DType::I64 => Scalar::I64(i64::from_le_bytes(array(c))),
            DType::U8 => Scalar::U8(c[0]),
        })
        .collect()
}

/// Pseudo-random values of `dtype` chosen so that sums and products stay finite in the
/// float types: integers span their whole range (so sums and products wrap), floats
/// lie in a range that suits their precision.
pub(crate) fn random_values(rng: &mut Rng, dtype: DType, n: usize) -> Vec<Scalar> {
    (0..n)
        .map(|_| match dtype {
            DType::F32 => Scalar::F32(rng.grid(1000.0, 64.0) as f32),
            DType::F64 => Scalar::F64(rng.grid(1.0e6, 1024.0)),
            DType::F16 => Scalar::F16(f16::from_f64(rng.grid(100.0, 16.0))),
            DType::BF16 => Scalar::BF16(bf16::from_f64(rng.grid(1000.0, 8.0))),
            DType::I32 => Scalar::I32(rng.next_u64() as i32),
            DType::I64 => Scalar::I64(rng.next_u64() as i64),
            DType::U8 => Scalar::U8(rng.next_u64() as u8),
        })
        .collect()
}

/// Small values of `dtype` (exact in every dtype): for cases whose point is not
/// arithmetic range.
pub(crate) fn small_values(rng: &mut Rng, dtype: DType, n: usize) -> Vec<Scalar> {
    (0..n)
        .map(|_| crate::reference::from_i64(dtype, rng.below(100) as i64))
        .collect()
}

/// Whether two values are the same for a comparison: NaN matches NaN, `-0` matches
/// `0`, and 16-bit floats may differ by `half_ulps` units in the last place.
pub(crate) fn same_value(got: Scalar, want: Scalar, half_ulps: u32) -> bool {
    fn ordered16(bits: u16) -> i32 {
        if bits & 0x8000 != 0 {
            -((bits & 0x7fff) as i32)
        } else {
            bits as i32
        }
    }
    fn close16(a: u16, b: u16, ulps: u32) -> bool {
        (ordered16(a) - ordered16(b)).unsigned_abs() <= ulps
    }
    match (got, want) {
        (Scalar::F32(a), Scalar::F32(b)) => a == b || (a.is_nan() && b.is_nan()),
        (Scalar::F64(a), Scalar::F64(b)) => a == b || (a.is_nan() && b.is_nan()),
        (Scalar::F16(a), Scalar::F16(b)) => {
            a == b
                || (a.is_nan() && b.is_nan())
                || (!a.is_nan()
                    && !b.is_nan()
                    && a.is_infinite() == b.is_infinite()
                    && close16(a.to_bits(), b.to_bits(), half_ulps))
        }
        (Scalar::BF16(a), Scalar::BF16(b)) => {
            a == b
                || (a.is_nan() && b.is_nan())
                || (!a.is_nan()
                    && !b.is_nan()
                    && a.is_infinite() == b.is_infinite()
                    && close16(a.to_bits(), b.to_bits(), half_ulps))
        }
        (a, b) => a == b,
    }
}

/// The tolerance stated in failure messages for results of `dtype` compared with
/// `half_ulps`.
fn tolerance_text(dtype: DType, half_ulps: u32) -> String {
    match dtype {
        DType::F16 | DType::BF16 if half_ulps > 0 => format!(
            "within {half_ulps} ulp of a reference computed in f32 and rounded once to {dtype}"
        ),
        DType::F16 | DType::BF16 => {
            format!("exactly (computed in f32, rounded once to {dtype} to nearest, ties to even)")
        }
        d if d.is_float() => {
            "exactly (IEEE 754, round to nearest even; NaN matches any NaN)".to_string()
        }
        _ => "exactly".to_string(),
    }
}

/// Checks the elements in `got` against `want`; the message names the first
/// mismatching element, the inputs that produced it (from `inputs`), and the tolerance.
pub(crate) fn check_values(
    dtype: DType,
    got: &[u8],
    want: &[Scalar],
    half_ulps: u32,
    what: &str,
    inputs: impl Fn(usize) -> String,
) -> CaseOutcome {
    let got_values = decode(dtype, got);
    if got_values.len() != want.len() || got.len() != want.len() * dtype.size() {
        return Err(CaseError::fail(format!(
            "{what}: expected {} {dtype} elements, read back {} bytes",
            want.len(),
            got.len()
        )));
    }
    let bad: Vec<usize> = got_values
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !same_value(**g, **w, half_ulps))
        .map(|(i, _)| i)
        .collect();
    if let Some(&i) = bad.first() {
        return Err(CaseError::fail(format!(
            "{what}: {} of {} {dtype} elements are wrong; element {i} ({}) should be {} {}, found {}",
            bad.len(),
            want.len(),
            inputs(i),
            want[i],
            tolerance_text(dtype, half_ulps),
            got_values[i]
        )));
    }
    Ok(())
}

/// Checks bytes for equality; the message names the first differing byte.
pub(crate) fn check_bytes(got: &[u8], want: &[u8], what: &str) -> CaseOutcome {
    if got.len() != want.len() {
        return Err(CaseError::fail(format!(
            "{what}: expected {} bytes, found {}",
            want.len(),
            got.len()
        )));
    }
    let mut bad = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| g != w);
    if let Some((i, (g, w))) = bad.next() {
        let count = 1 + bad.count();
        return Err(CaseError::fail(format!(
            "{what}: {count} of {} bytes differ; byte {i} should be {w:#04x}, found {g:#04x}",
            want.len()
        )));
    }
    Ok(())
}

/// Fails with `message` unless `condition` holds.
pub(crate) fn ensure(condition: bool, message: impl FnOnce() -> String) -> CaseOutcome {
    if condition {
        Ok(())
    } else {
        Err(CaseError::fail(message()))
    }
}

// ---------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------

fn expect_error<T>(
    result: xpu_hal::Result<T>,
    what: &str,
    expected: &str,
    is: impl Fn(&Error) -> bool,
) -> CaseOutcome {
    match result {
        Err(e) if is(&e) => Ok(()),
        Err(e) => Err(CaseError::fail(format!(
            "{what}: expected {expected}, got a {} error: {e}",
            e.kind()
        ))),
        Ok(_) => Err(CaseError::fail(format!(
            "{what}: expected {expected}, but the call succeeded"
        ))),
    }
}

/// Checks that `result` is an [`Error::InvalidArgument`].
pub(crate) fn expect_invalid<T>(result: xpu_hal::Result<T>, what: &str) -> CaseOutcome {
    expect_error(result, what, "an invalid-argument error", |e| {
        matches!(e, Error::InvalidArgument { .. })
    })
}

/// Checks that `result` is an [`Error::Unsupported`].
pub(crate) fn expect_unsupported<T>(result: xpu_hal::Result<T>, what: &str) -> CaseOutcome {
    expect_error(result, what, "an unsupported error", |e| {
        matches!(e, Error::Unsupported { .. })
    })
}

/// Checks that `result` is an [`Error::OutOfMemory`].
pub(crate) fn expect_oom<T>(result: xpu_hal::Result<T>, what: &str) -> CaseOutcome {
    expect_error(result, what, "an out-of-memory error", |e| {
        matches!(e, Error::OutOfMemory { .. })
    })
}

/// Checks that `result` is an [`Error::Timeout`].
pub(crate) fn expect_timeout<T>(result: xpu_hal::Result<T>, what: &str) -> CaseOutcome {
    expect_error(result, what, "a timeout error", |e| {
        matches!(e, Error::Timeout { .. })
    })
}

/// The error's message with its whole source chain, for checks that a detail survived.
pub(crate) fn full_message(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The dtypes of builtin operations, for cases that run on whichever the device has.
pub(crate) const NUMERIC: [DType; 7] = [
    DType::I32,
    DType::F32,
    DType::I64,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::U8,
];

// ---------------------------------------------------------------------------------
// Device helpers
// ---------------------------------------------------------------------------------

/// A new allocation holding `data`, written through `stream`.
pub(crate) fn upload(
    device: &Device,
    stream: &Stream,
    data: &[u8],
) -> Result<Allocation, CaseError> {
    let a = device.allocate(data.len() as u64)?;
    stream.write(&a, data)?;
    Ok(a)
}

// ---------------------------------------------------------------------------------
// Host-function kernels
// ---------------------------------------------------------------------------------

/// How long a gated kernel waits before giving up, so that a backend that runs
/// kernels on the caller's thread fails the case instead of hanging it.
const GATE_LIMIT: Duration = Duration::from_secs(10);

/// A latch a host-function kernel waits on: the case decides when the kernel finishes,
/// so "not yet complete" can be checked without relying on timing.
#[derive(Clone, Default)]
pub(crate) struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    pub(crate) fn open(&self) {
        let (lock, cvar) = &*self.0;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cvar.notify_all();
    }

    fn wait(&self) -> Result<(), String> {
        let (lock, cvar) = &*self.0;
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = cvar
            .wait_timeout_while(guard, GATE_LIMIT, |open| !*open)
            .unwrap_or_else(|p| p.into_inner());
        if *guard {
            Ok(())
        } else {
            Err(format!(
                "the gate kernel waited {} s and was never released: the launch probably ran it on the caller's thread instead of enqueuing it",
                GATE_LIMIT.as_secs()
            ))
        }
    }
}

/// Opens its gate when dropped, so that an early return never leaves a kernel waiting.
pub(crate) struct GateGuard(Gate);

impl GateGuard {
    pub(crate) fn open(&self) {
        self.0.open();
    }
}

impl Drop for GateGuard {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// Skips unless the device loads host-function kernels.
pub(crate) fn require_host_functions(ctx: &CaseContext) -> CaseOutcome {
    ctx.require_kernel_format(xpu_hal::KernelFormat::HostFunction)
}

/// Loads a host-function kernel with the given parameters.
pub(crate) fn host_kernel<F>(
    device: &Device,
    name: &str,
    params: Vec<KernelParam>,
    f: F,
) -> Result<Kernel, CaseError>
where
    F: Fn(&mut xpu_hal::HostKernelContext<'_>) -> Result<(), String> + Send + Sync + 'static,
{
    Ok(device.load_kernel(KernelDesc {
        name: name.to_string(),
        entry_point: "main".to_string(),
        source: KernelSource::host_fn(f),
        params,
    })?)
}

/// Enqueues a kernel on `stream` that waits until the returned guard is opened or
/// dropped. The device must load host functions.
pub(crate) fn hold_with_gate(stream: &Stream) -> Result<GateGuard, CaseError> {
    let gate = Gate::default();
    let inner = gate.clone();
    let kernel = host_kernel(stream.device(), "conformance.gate", vec![], move |_| {
        inner.wait()
    })?;
    let guard = GateGuard(gate);
    stream.launch(&kernel, LaunchDims::linear(1, 1), &[])?;
    Ok(guard)
}

/// Enqueues a kernel on `stream` that sleeps for `ms` milliseconds.
pub(crate) fn enqueue_sleep(stream: &Stream, ms: u64) -> CaseOutcome {
    let kernel = host_kernel(stream.device(), "conformance.sleep", vec![], move |_| {
        std::thread::sleep(Duration::from_millis(ms));
        Ok(())
    })?;
    stream.launch(&kernel, LaunchDims::linear(1, 1), &[])?;
    Ok(())
}

/// Enqueues a kernel on `stream` that fails with `message`.
pub(crate) fn enqueue_failure(stream: &Stream, message: &'static str) -> CaseOutcome {
    let kernel = host_kernel(stream.device(), "conformance.fail", vec![], move |_| {
        Err(message.to_string())
    })?;
    stream.launch(&kernel, LaunchDims::linear(1, 1), &[])?;
    Ok(())
}

/// Writes `data` into buffer argument 0 of a host kernel, after sleeping `ms`.
pub(crate) fn enqueue_slow_write(
    stream: &Stream,
    dst: &Allocation,
    data: Vec<u8>,
    ms: u64,
) -> CaseOutcome {
    let kernel = host_kernel(
        stream.device(),
        "conformance.slow_write",
        vec![KernelParam::Buffer(xpu_hal::Access::Write)],
        move |k| {
            std::thread::sleep(Duration::from_millis(ms));
            match k.split() {
                [HostArg::Write(out)] if out.len() == data.len() => {
                    out.copy_from_slice(&data);
                    Ok(())
                }
                _ => Err(
                    "conformance.slow_write: expected one writable buffer of the pattern's size"
                        .to_string(),
                ),
            }
        },
    )?;
    stream.launch(
        &kernel,
        LaunchDims::linear(1, 1),
        &[xpu_hal::KernelArg::Buffer(dst.whole())],
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------
// Holding a stream, and failing its work, on any device
// ---------------------------------------------------------------------------------

/// A stream held at a known point until [`Hold::open`] is called or the hold dropped.
///
/// On a device with host functions, a gate kernel on the stream itself; on every other
/// device, a wait on a [`UserEvent`] completed when the hold opens — the contract's own
/// path for waits on what the device did not record (`stream_wait_external` for a
/// plugin), so a device alone in the run is held too.
pub(crate) struct Hold {
    gate: HoldGate,
    how: &'static str,
}

enum HoldGate {
    Kernel(GateGuard),
    User(UserEvent),
}

impl Hold {
    /// Releases the stream.
    pub(crate) fn open(&self) {
        match &self.gate {
            HoldGate::Kernel(g) => g.open(),
            // Opening twice is fine: the second completion is refused, harmlessly.
            HoldGate::User(e) => {
                let _ = e.complete();
            }
        }
    }

    /// How the stream is held, for messages.
    pub(crate) fn how(&self) -> &str {
        self.how
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // Released, not failed (a user event dropped pending fails).
        self.open();
    }
}

/// Holds `stream` at its current end.
pub(crate) fn hold(stream: &Stream) -> Result<Hold, CaseError> {
    if stream
        .device()
        .capabilities()
        .supports_kernel_format(xpu_hal::KernelFormat::HostFunction)
    {
        return Ok(Hold {
            gate: HoldGate::Kernel(hold_with_gate(stream)?),
            how: "a host-function kernel waiting on a latch",
        });
    }
    let event = UserEvent::new();
    stream.wait_user_event(&event)?;
    Ok(Hold {
        gate: HoldGate::User(event),
        how: "a wait on a user event not yet completed",
    })
}

/// Failed work put on a stream by [`inject_failure`].
pub(crate) struct Failure {
    /// What failed, for messages ("a failed kernel" …).
    pub(crate) what: &'static str,
}

/// Enqueues work on `stream` that fails with an error whose message contains
/// `message`: a failing host-function kernel where the device loads them, elsewhere a
/// wait on a user event that is failed with `message` (its later work then fails as
/// aborted).
pub(crate) fn inject_failure(stream: &Stream, message: &'static str) -> Result<Failure, CaseError> {
    if stream
        .device()
        .capabilities()
        .supports_kernel_format(xpu_hal::KernelFormat::HostFunction)
    {
        enqueue_failure(stream, message)?;
        return Ok(Failure {
            what: "a failed kernel",
        });
    }
    let event = UserEvent::new();
    stream.wait_user_event(&event)?;
    event.fail(message)?;
    Ok(Failure {
        what: "a wait on a user event that was failed",
    })
}

// ---------------------------------------------------------------------------------
// Kernels in more than one format
// ---------------------------------------------------------------------------------

/// The format a case writes its kernels in for a device: host functions where the
/// device loads them (the strongest checks: the kernel sees its arguments directly),
/// else WGSL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelKind {
    /// A Rust closure.
    HostFunction,
    /// WGSL text: buffer parameters at `@group(0) @binding(0..)` in the order of the
    /// buffer parameters, scalar parameters as the fields of a `var<immediate>` struct.
    Wgsl,
}

impl KernelKind {
    /// The format to use on `device`, if it loads one of them.
    pub(crate) fn of(device: &Device) -> Option<KernelKind> {
        let caps = device.capabilities();
        if caps.supports_kernel_format(xpu_hal::KernelFormat::HostFunction) {
            Some(KernelKind::HostFunction)
        } else if caps.supports_kernel_format(xpu_hal::KernelFormat::Wgsl) {
            Some(KernelKind::Wgsl)
        } else {
            None
        }
    }
}

impl std::fmt::Display for KernelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = match self {
            KernelKind::HostFunction => xpu_hal::KernelFormat::HostFunction,
            KernelKind::Wgsl => xpu_hal::KernelFormat::Wgsl,
        };
        write!(f, "{format}")
    }
}

/// The kernel format for the device under test, or a skip naming the formats the
/// cases are written in.
pub(crate) fn kernel_kind(ctx: &CaseContext) -> Result<KernelKind, CaseError> {
    KernelKind::of(&ctx.device)
        .ok_or_else(|| CaseError::skip("device loads neither host-function nor wgsl kernels"))
}

/// Loads a kernel written both ways: `host` where `kind` is a host function, else the
/// WGSL `wgsl` with entry point `entry`.
pub(crate) fn portable_kernel<F>(
    device: &Device,
    kind: KernelKind,
    name: &str,
    params: Vec<KernelParam>,
    entry: &str,
    wgsl: &str,
    host: F,
) -> Result<Kernel, CaseError>
where
    F: Fn(&mut xpu_hal::HostKernelContext<'_>) -> Result<(), String> + Send + Sync + 'static,
{
    let source = match kind {
        KernelKind::HostFunction => KernelSource::host_fn(host),
        KernelKind::Wgsl => KernelSource::Wgsl(wgsl.to_string()),
    };
    Ok(device.load_kernel(KernelDesc {
        name: name.to_string(),
        entry_point: entry.to_string(),
        source,
        params,
    })?)
}

/// The WGSL type a scalar parameter of `dtype` has in the `var<immediate>` struct:
/// 8-byte dtypes natively, `u8`, `f16` and `bf16` as a `u32` holding their bits.
pub(crate) fn wgsl_scalar_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::U8 | DType::F16 | DType::BF16 => "u32",
    }
}

/// The WGSL declarations for `params`: a `Params` struct with fields `s0, s1 …` (one
/// per scalar, in order) as `var<immediate> params`, and buffers `b0, b1 …` of
/// `array<u32>` at bindings 0, 1 … (in the order of the buffer parameters).
pub(crate) fn wgsl_interface(params: &[KernelParam]) -> String {
    let mut fields = Vec::new();
    let mut buffers = Vec::new();
    for p in params {
        match p {
            KernelParam::Scalar(d) => {
                fields.push(format!("s{}: {}", fields.len(), wgsl_scalar_type(*d)));
            }
            KernelParam::Buffer(access) => {
                let mode = if access.writes() {
                    "read_write"
                } else {
                    "read"
                };
                buffers.push(format!(
                    "@group(0) @binding({0}) var<storage, {mode}> b{0}: array<u32>;",
                    buffers.len()
                ));
            }
        }
    }
    let mut out = String::new();
    if !fields.is_empty() {
        out.push_str(&format!(
            "struct Params {{ {} }}\nvar<immediate> params: Params;\n",
            fields.join(", ")
        ));
    }
    for b in buffers {
        out.push_str(&b);
        out.push('\n');
    }
    out
}

/// A kernel with `params` that does nothing, as a host function or in WGSL.
pub(crate) fn nop_kernel(
    device: &Device,
    kind: KernelKind,
    params: Vec<KernelParam>,
) -> Result<Kernel, CaseError> {
    let wgsl = format!(
        "{}@compute @workgroup_size(1)\nfn main() {{}}\n",
        wgsl_interface(&params)
    );
    portable_kernel(
        device,
        kind,
        "conformance.nop",
        params,
        "main",
        &wgsl,
        |_| Ok(()),
    )
}

/// The smallest nonzero offset that is a multiple of both the device's
/// `kernel_arg_alignment` and 4 bytes (the element size of WGSL's `u32`, `i32`, `f32`).
pub(crate) fn kernel_offset_unit(device: &Device) -> u64 {
    let align = device.capabilities().kernel_arg_alignment.max(1);
    let mut unit = align;
    while !unit.is_multiple_of(4) {
        unit += align;
    }
    unit
}
