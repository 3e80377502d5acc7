//! The values that cross the boundary, as Rust types: element types, operators, device
//! properties, buffer ranges, builtin operations and kernel arguments.
//!
//! They mirror the ABI rather than the HAL (`xpu-hal`) on purpose: a plugin built with
//! this crate depends on nothing but `std`, and its build does not follow the HAL's
//! releases. The meaning is the HAL's; the header states the arithmetic rules.

use std::fmt;
use std::time::Duration;

use crate::abi;
use crate::handle::Handle;

/// `xpu_dtype`: the element types of builtin operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
}

impl DType {
    /// Every dtype of ABI 1.0, in the order of their C values.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
    ];

    /// The C value (`XPU_DTYPE_*`).
    pub const fn raw(self) -> u32 {
        match self {
            DType::F32 => abi::dtype::F32,
            DType::F64 => abi::dtype::F64,
            DType::F16 => abi::dtype::F16,
            DType::BF16 => abi::dtype::BF16,
            DType::I32 => abi::dtype::I32,
            DType::I64 => abi::dtype::I64,
            DType::U8 => abi::dtype::U8,
        }
    }

    /// The dtype of a C value, or `None` for a value this ABI version does not define.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        Some(match raw {
            abi::dtype::F32 => DType::F32,
            abi::dtype::F64 => DType::F64,
            abi::dtype::F16 => DType::F16,
            abi::dtype::BF16 => DType::BF16,
            abi::dtype::I32 => DType::I32,
            abi::dtype::I64 => DType::I64,
            abi::dtype::U8 => DType::U8,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub const fn size(self) -> u64 {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// The lowercase name (`"f32"`, `"bf16"` …).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
        }
    }

    /// This dtype's bit in `dtype_mask` (`1 << raw`).
    pub const fn mask_bit(self) -> u32 {
        1 << self.raw()
    }

    /// The `dtype_mask` of a set of dtypes.
    pub fn mask(dtypes: &[DType]) -> u32 {
        dtypes.iter().fold(0, |m, d| m | d.mask_bit())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One scalar value of a dtype: a fill value, a scale factor or a kernel argument.
///
/// `F16` and `BF16` carry their bit patterns, so that this crate needs no half-precision
/// library; convert with your own (`half::f16::from_bits`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// An `f32`.
    F32(f32),
    /// An `f64`.
    F64(f64),
    /// The bits of an IEEE binary16 value.
    F16(u16),
    /// The bits of a bfloat16 value.
    BF16(u16),
    /// An `i32`.
    I32(i32),
    /// An `i64`.
    I64(i64),
    /// A `u8`.
    U8(u8),
}

impl Scalar {
    /// The value of `dtype` stored little-endian in the first bytes of `bytes` (the
    /// ABI's `scalar[8]` fields).
    pub fn from_le_bytes(dtype: DType, bytes: [u8; 8]) -> Self {
        let [b0, b1, b2, b3, ..] = bytes;
        match dtype {
            DType::F32 => Scalar::F32(f32::from_le_bytes([b0, b1, b2, b3])),
            DType::F64 => Scalar::F64(f64::from_le_bytes(bytes)),
            DType::F16 => Scalar::F16(u16::from_le_bytes([b0, b1])),
            DType::BF16 => Scalar::BF16(u16::from_le_bytes([b0, b1])),
            DType::I32 => Scalar::I32(i32::from_le_bytes([b0, b1, b2, b3])),
            DType::I64 => Scalar::I64(i64::from_le_bytes(bytes)),
            DType::U8 => Scalar::U8(b0),
        }
    }

    /// The value as the ABI stores it: little-endian, zero-padded to 8 bytes.
    pub fn to_le_bytes(self) -> [u8; 8] {
        let mut out = [0u8; 8];
        let bytes: &[u8] = match &self {
            Scalar::F32(v) => &v.to_le_bytes(),
            Scalar::F64(v) => &v.to_le_bytes(),
            Scalar::F16(v) | Scalar::BF16(v) => &v.to_le_bytes(),
            Scalar::I32(v) => &v.to_le_bytes(),
            Scalar::I64(v) => &v.to_le_bytes(),
            Scalar::U8(v) => &[*v],
        };
        out[..bytes.len()].copy_from_slice(bytes);
        out
    }

    /// The dtype of the value.
    pub const fn dtype(&self) -> DType {
        match self {
            Scalar::F32(_) => DType::F32,
            Scalar::F64(_) => DType::F64,
            Scalar::F16(_) => DType::F16,
            Scalar::BF16(_) => DType::BF16,
            Scalar::I32(_) => DType::I32,
            Scalar::I64(_) => DType::I64,
            Scalar::U8(_) => DType::U8,
        }
    }
}

/// `xpu_fault` (ABI 1.2): a failure [`Device::inject_fault`](crate::Device::inject_fault)
/// makes a device suffer, for testing what runs above the plugin.
///
/// Later minor versions may add faults, so a `match` on it needs a wildcard arm, which
/// should refuse with [`ErrorCode::Unsupported`](crate::ErrorCode::Unsupported).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// `XPU_FAULT_LOST`: the device is lost for good. Every later call on it, its
    /// streams and events fails with
    /// [`ErrorCode::DeviceLost`](crate::ErrorCode::DeviceLost) (the release functions
    /// keep working), work enqueued and not yet run fails with it, and it never comes
    /// back.
    Lost,
    /// `XPU_FAULT_SLOW` with its `delay_ns`: the device becomes a straggler. Every
    /// operation its streams run from now on (work enqueued earlier and not yet started
    /// included) takes this much longer, spent where the work runs and never in the
    /// enqueueing call; results do not change. It replaces an earlier slowdown, and
    /// [`Duration::ZERO`] ends it. A lost device stays lost.
    Slow(Duration),
}

impl Fault {
    /// The C value (`XPU_FAULT_*`); [`delay_ns`](Fault::delay_ns) is the struct's other
    /// field.
    pub const fn raw(self) -> u32 {
        match self {
            Fault::Lost => abi::fault::LOST,
            Fault::Slow(_) => abi::fault::SLOW,
        }
    }

    /// The C struct's `delay_ns`: the delay of [`Fault::Slow`] in nanoseconds
    /// (saturating at `u64::MAX`), and 0 for every other fault.
    pub const fn delay_ns(self) -> u64 {
        match self {
            Fault::Slow(delay) => {
                let ns = delay.as_nanos();
                if ns > u64::MAX as u128 {
                    u64::MAX
                } else {
                    ns as u64
                }
            }
            Fault::Lost => 0,
        }
    }

    /// The fault of a C value and the struct's `delay_ns` (read by
    /// [`Fault::Slow`] only), or `None` for a value this ABI version does not define.
    pub const fn from_raw(raw: u32, delay_ns: u64) -> Option<Self> {
        match raw {
            abi::fault::LOST => Some(Fault::Lost),
            abi::fault::SLOW => Some(Fault::Slow(Duration::from_nanos(delay_ns))),
            _ => None,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Lost => f.write_str("lost"),
            Fault::Slow(delay) => write!(f, "slow by {delay:?} per operation"),
        }
    }
}

/// `xpu_binary_op`: the operators of `binary` and `accumulate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Sum,
    /// `a * b`.
    Prod,
    /// The smaller; a NaN operand is ignored.
    Min,
    /// The larger; a NaN operand is ignored.
    Max,
}

impl BinaryOp {
    /// Every operator of ABI 1.0.
    pub const ALL: [BinaryOp; 4] = [BinaryOp::Sum, BinaryOp::Prod, BinaryOp::Min, BinaryOp::Max];

    /// The C value (`XPU_BINARY_*`).
    pub const fn raw(self) -> u32 {
        match self {
            BinaryOp::Sum => abi::binary_op::SUM,
            BinaryOp::Prod => abi::binary_op::PROD,
            BinaryOp::Min => abi::binary_op::MIN,
            BinaryOp::Max => abi::binary_op::MAX,
        }
    }

    /// The operator of a C value, or `None` for a value this ABI version does not define.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        Some(match raw {
            abi::binary_op::SUM => BinaryOp::Sum,
            abi::binary_op::PROD => BinaryOp::Prod,
            abi::binary_op::MIN => BinaryOp::Min,
            abi::binary_op::MAX => BinaryOp::Max,
            _ => return None,
        })
    }
}

/// `xpu_device_kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A CPU.
    Cpu,
    /// A GPU.
    Gpu,
    /// An NPU or other fixed-function accelerator.
    Npu,
    /// Anything else.
    Other,
}

impl DeviceKind {
    /// The C value (`XPU_DEVICE_KIND_*`).
    pub const fn raw(self) -> u32 {
        match self {
            DeviceKind::Cpu => abi::device_kind::CPU,
            DeviceKind::Gpu => abi::device_kind::GPU,
            DeviceKind::Npu => abi::device_kind::NPU,
            DeviceKind::Other => abi::device_kind::OTHER,
        }
    }
}

/// `xpu_access`: how a kernel uses a buffer argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Reads only.
    Read,
    /// Writes only.
    Write,
    /// Reads and writes.
    ReadWrite,
}

impl Access {
    /// The access of a C value, or `None` for a value this ABI version does not define.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        Some(match raw {
            abi::access::READ => Access::Read,
            abi::access::WRITE => Access::Write,
            abi::access::READ_WRITE => Access::ReadWrite,
            _ => return None,
        })
    }

    /// The C value (`XPU_ACCESS_*`).
    pub const fn raw(self) -> u32 {
        match self {
            Access::Read => abi::access::READ,
            Access::Write => abi::access::WRITE,
            Access::ReadWrite => abi::access::READ_WRITE,
        }
    }

    /// Whether the kernel may read the buffer.
    pub const fn reads(self) -> bool {
        !matches!(self, Access::Write)
    }

    /// Whether the kernel may write the buffer.
    pub const fn writes(self) -> bool {
        !matches!(self, Access::Read)
    }
}

/// A device's static description, returned once by
/// [`Device::properties`](crate::Device::properties) when the device is opened; the SDK
/// keeps the C strings alive until the device is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProperties {
    /// A human-readable name.
    pub name: String,
    /// The vendor.
    pub vendor: String,
    /// The driver or firmware version.
    pub driver: String,
    /// The broad kind.
    pub kind: DeviceKind,
    /// The dtypes builtin operations support.
    pub dtypes: Vec<DType>,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// The largest single allocation in bytes.
    pub max_allocation: u64,
    /// Byte alignment a kernel's buffer arguments must start at (1: any).
    pub kernel_arg_alignment: u64,
    /// Whether waits on events cost no host thread.
    pub timeline_events: bool,
    /// Whether [`Event::elapsed_since`](crate::Event::elapsed_since) works. Reported as
    /// false when the plugin sets [`Plugin::EVENT_TIMING`](crate::Plugin::EVENT_TIMING)
    /// to false.
    pub event_timing: bool,
    /// The native kernel format's name, or `None`. Reported as `None` when the plugin
    /// sets [`Plugin::KERNELS`](crate::Plugin::KERNELS) to false.
    pub kernel_format: Option<String>,
}

/// A device's memory use at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Total bytes.
    pub total: u64,
    /// Bytes free for new allocations.
    pub free: u64,
}

/// `(buffer, offset, length)`: bytes of one device buffer.
///
/// Guaranteed by the SDK: the range lies within the buffer, and the buffer belongs to
/// the device of the stream the range was given to. The [`Handle`] keeps the buffer
/// alive, so a stream may keep the range until its work is done.
pub struct BufferRange<B> {
    /// The buffer.
    pub buffer: Handle<B>,
    /// Offset in bytes.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
}

impl<B> BufferRange<B> {
    /// Whether `other` is the very same bytes (same buffer, offset and length).
    pub fn same_as(&self, other: &BufferRange<B>) -> bool {
        Handle::ptr_eq(&self.buffer, &other.buffer)
            && self.offset == other.offset
            && self.length == other.length
    }

    /// Whether `other` lies in the same buffer.
    pub fn buffer_eq(&self, other: &BufferRange<B>) -> bool {
        Handle::ptr_eq(&self.buffer, &other.buffer)
    }

    /// Whether the two ranges share at least one byte.
    pub fn overlaps(&self, other: &BufferRange<B>) -> bool {
        Handle::ptr_eq(&self.buffer, &other.buffer)
            && self.length > 0
            && other.length > 0
            && self.offset < other.offset.saturating_add(other.length)
            && other.offset < self.offset.saturating_add(self.length)
    }

    /// The end offset (`offset + length`; cannot overflow, the SDK checked it).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.length)
    }
}

impl<B> Clone for BufferRange<B> {
    fn clone(&self) -> Self {
        BufferRange {
            buffer: self.buffer.clone(),
            offset: self.offset,
            length: self.length,
        }
    }
}

impl<B> fmt::Debug for BufferRange<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BufferRange({:p}, offset {}, length {})",
            Handle::as_ptr(&self.buffer),
            self.offset,
            self.length
        )
    }
}

/// A builtin operation, checked by the SDK.
///
/// Guaranteed by the SDK for every variant: each range is in bounds of a buffer of the
/// stream's device, starts at a multiple of its dtype's size and holds a whole number
/// of elements; the element counts of all operands agree; two ranges of one operation
/// are either identical ([`BufferRange::same_as`]) or disjoint. Ranges may be empty.
/// Arithmetic follows the header: integers wrap; `f16`/`bf16` are computed in `f32` and
/// rounded once to nearest even; `min`/`max` ignore a NaN operand; casts follow Rust's
/// `as` (rounding once).
pub enum Builtin<B> {
    /// `dst[i] = value`; the dtype is the value's.
    Fill {
        /// Destination.
        dst: BufferRange<B>,
        /// The value.
        value: Scalar,
    },
    /// `dst[i] = a[i] op b[i]`; `dst` may be identical to `a` and/or `b`.
    Binary {
        /// The operator.
        op: BinaryOp,
        /// Element type of all three ranges.
        dtype: DType,
        /// Left operand.
        a: BufferRange<B>,
        /// Right operand.
        b: BufferRange<B>,
        /// Destination.
        dst: BufferRange<B>,
    },
    /// `dst[i] = dst[i] op src[i]`; `src` may be identical to `dst`.
    Accumulate {
        /// The operator.
        op: BinaryOp,
        /// Element type of both ranges.
        dtype: DType,
        /// Accumulator.
        dst: BufferRange<B>,
        /// Operand.
        src: BufferRange<B>,
    },
    /// `dst[i] = src[i] * alpha`; the dtype is `alpha`'s; `dst` may be identical to `src`.
    Scale {
        /// The factor.
        alpha: Scalar,
        /// Source.
        src: BufferRange<B>,
        /// Destination.
        dst: BufferRange<B>,
    },
    /// `dst[i] = src[i] as dst_dtype`; identical ranges only when both dtypes have the
    /// same size.
    Cast {
        /// Source.
        src: BufferRange<B>,
        /// Source element type.
        src_dtype: DType,
        /// Destination.
        dst: BufferRange<B>,
        /// Destination element type.
        dst_dtype: DType,
    },
}

/// The code of a kernel to load, borrowed for the duration of
/// [`Device::load_kernel`](crate::Device::load_kernel).
#[derive(Debug, Clone, Copy)]
pub struct KernelCode<'a> {
    /// The format's name as the host passed it (the device's `kernel_format`).
    pub format: &'a str,
    /// The code.
    pub code: &'a [u8],
    /// The function to run.
    pub entry_point: &'a str,
}

/// The grid of a launch: `grid` workgroups of `block` invocations, per dimension; every
/// entry is at least 1 (checked by the SDK).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchDims {
    /// Workgroups per dimension.
    pub grid: [u32; 3],
    /// Invocations per workgroup per dimension.
    pub block: [u32; 3],
}

impl LaunchDims {
    /// The total number of invocations (saturating).
    pub fn invocations(&self) -> u64 {
        self.grid
            .iter()
            .chain(self.block.iter())
            .fold(1u64, |n, &d| n.saturating_mul(u64::from(d)))
    }
}

/// One argument of a kernel launch.
pub enum KernelArg<B> {
    /// A buffer range (`None` for an empty range) and how the kernel uses it.
    Buffer {
        /// The range; in bounds of a buffer of the stream's device.
        range: Option<BufferRange<B>>,
        /// How the kernel uses it.
        access: Access,
    },
    /// A scalar.
    Scalar(Scalar),
}

// `Clone` and `Debug` by hand: derived ones would require them of the plugin's buffer
// type, which only the handle needs.

impl<B> Clone for Builtin<B> {
    fn clone(&self) -> Self {
        match self {
            Builtin::Fill { dst, value } => Builtin::Fill {
                dst: dst.clone(),
                value: *value,
            },
            Builtin::Binary {
                op,
                dtype,
                a,
                b,
                dst,
            } => Builtin::Binary {
                op: *op,
                dtype: *dtype,
                a: a.clone(),
                b: b.clone(),
                dst: dst.clone(),
            },
            Builtin::Accumulate {
                op,
                dtype,
                dst,
                src,
            } => Builtin::Accumulate {
                op: *op,
                dtype: *dtype,
                dst: dst.clone(),
                src: src.clone(),
            },
            Builtin::Scale { alpha, src, dst } => Builtin::Scale {
                alpha: *alpha,
                src: src.clone(),
                dst: dst.clone(),
            },
            Builtin::Cast {
                src,
                src_dtype,
                dst,
                dst_dtype,
            } => Builtin::Cast {
                src: src.clone(),
                src_dtype: *src_dtype,
                dst: dst.clone(),
                dst_dtype: *dst_dtype,
            },
        }
    }
}

impl<B> fmt::Debug for Builtin<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Builtin::Fill { dst, value } => f
                .debug_struct("Fill")
                .field("dst", dst)
                .field("value", value)
                .finish(),
            Builtin::Binary {
                op,
                dtype,
                a,
                b,
                dst,
            } => f
                .debug_struct("Binary")
                .field("op", op)
                .field("dtype", dtype)
                .field("a", a)
                .field("b", b)
                .field("dst", dst)
                .finish(),
            Builtin::Accumulate {
                op,
                dtype,
                dst,
                src,
            } => f
                .debug_struct("Accumulate")
                .field("op", op)
                .field("dtype", dtype)
                .field("dst", dst)
                .field("src", src)
                .finish(),
            Builtin::Scale { alpha, src, dst } => f
                .debug_struct("Scale")
                .field("alpha", alpha)
                .field("src", src)
                .field("dst", dst)
                .finish(),
            Builtin::Cast {
                src,
                src_dtype,
                dst,
                dst_dtype,
            } => f
                .debug_struct("Cast")
                .field("src", src)
                .field("src_dtype", src_dtype)
                .field("dst", dst)
                .field("dst_dtype", dst_dtype)
                .finish(),
        }
    }
}

impl<B> Clone for KernelArg<B> {
    fn clone(&self) -> Self {
        match self {
            KernelArg::Buffer { range, access } => KernelArg::Buffer {
                range: range.clone(),
                access: *access,
            },
            KernelArg::Scalar(s) => KernelArg::Scalar(*s),
        }
    }
}

impl<B> fmt::Debug for KernelArg<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelArg::Buffer { range, access } => f
                .debug_struct("Buffer")
                .field("range", range)
                .field("access", access)
                .finish(),
            KernelArg::Scalar(s) => f.debug_tuple("Scalar").field(s).finish(),
        }
    }
}

/// A wait's limit: `None` waits for ever (the ABI's `UINT64_MAX`).
pub(crate) fn timeout_from_ns(ns: u64) -> Option<Duration> {
    (ns != u64::MAX).then(|| Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_map_both_ways() {
        for d in DType::ALL {
            assert_eq!(DType::from_raw(d.raw()), Some(d));
        }
        assert_eq!(DType::from_raw(7), None);
        assert_eq!(DType::mask(&DType::ALL), 0x7f);
    }

    #[test]
    fn scalars_round_trip() {
        let values = [
            Scalar::F32(-1.5),
            Scalar::F64(1e300),
            Scalar::F16(0x3c00),
            Scalar::BF16(0x3f80),
            Scalar::I32(-7),
            Scalar::I64(i64::MIN),
            Scalar::U8(200),
        ];
        for v in values {
            assert_eq!(Scalar::from_le_bytes(v.dtype(), v.to_le_bytes()), v);
        }
        assert_eq!(Scalar::U8(9).to_le_bytes(), [9, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn launch_dims_count_invocations() {
        let d = LaunchDims {
            grid: [2, 3, 1],
            block: [64, 1, 2],
        };
        assert_eq!(d.invocations(), 768);
    }
}
