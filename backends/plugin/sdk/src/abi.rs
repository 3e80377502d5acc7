//! The Rust mirror of `xpu_plugin.h`: every type, constant and struct of the C ABI,
//! `#[repr(C)]` and field for field. `tests/layout.rs` compiles the header with the
//! system C compiler and proves that sizes, alignments and field offsets agree.
//!
//! The doc comments are short; the header is the normative text.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// `XPU_PLUGIN_ABI_MAJOR`.
pub const XPU_PLUGIN_ABI_MAJOR: u32 = 1;
/// `XPU_PLUGIN_ABI_MINOR`.
pub const XPU_PLUGIN_ABI_MINOR: u32 = 4;
/// `XPU_PLUGIN_ENTRY_SYMBOL`, NUL-terminated.
pub const XPU_PLUGIN_ENTRY_SYMBOL: &[u8] = b"xpu_plugin_get_api\0";

/// `XPU_STRUCT_SIZE(type, last)` for a struct's last field.
#[macro_export]
macro_rules! struct_size {
    ($t:ty, $last:ident) => {{
        let u = ::std::mem::MaybeUninit::<$t>::uninit();
        let p = u.as_ptr();
        // SAFETY: `addr_of!` computes a field address without reading or creating a
        // reference; the struct is never read.
        let f = unsafe { ::std::ptr::addr_of!((*p).$last) };
        ::std::mem::offset_of!($t, $last) + $crate::abi::size_of_pointee(f)
    }};
}

/// The size of the value `_p` points to (a helper of [`struct_size!`]).
pub const fn size_of_pointee<T>(_p: *const T) -> usize {
    std::mem::size_of::<T>()
}

/// `xpu_error_code`.
pub mod error_code {
    /// The caller's arguments are wrong.
    pub const INVALID_ARGUMENT: u32 = 1;
    /// An allocation did not fit.
    pub const OUT_OF_MEMORY: u32 = 2;
    /// The device cannot do this.
    pub const UNSUPPORTED: u32 = 3;
    /// The hardware or its driver is not present.
    pub const UNAVAILABLE: u32 = 4;
    /// The device stopped working.
    pub const DEVICE_LOST: u32 = 5;
    /// A wait ran out of time.
    pub const TIMEOUT: u32 = 6;
    /// Work did not run because something failed first.
    pub const ABORTED: u32 = 7;
    /// Anything else.
    pub const INTERNAL: u32 = 8;
}

/// `xpu_dtype` values.
pub mod dtype {
    /// f32.
    pub const F32: u32 = 0;
    /// f64.
    pub const F64: u32 = 1;
    /// f16.
    pub const F16: u32 = 2;
    /// bf16.
    pub const BF16: u32 = 3;
    /// i32.
    pub const I32: u32 = 4;
    /// i64.
    pub const I64: u32 = 5;
    /// u8.
    pub const U8: u32 = 6;
}

/// `xpu_device_kind` values.
pub mod device_kind {
    /// A CPU.
    pub const CPU: u32 = 0;
    /// A GPU.
    pub const GPU: u32 = 1;
    /// An NPU.
    pub const NPU: u32 = 2;
    /// Anything else.
    pub const OTHER: u32 = 3;
}

/// `xpu_builtin_kind` values.
pub mod builtin_kind {
    /// `dst[i] = scalar`.
    pub const FILL: u32 = 0;
    /// `dst[i] = a[i] op b[i]`.
    pub const BINARY: u32 = 1;
    /// `dst[i] = dst[i] op a[i]`.
    pub const ACCUMULATE: u32 = 2;
    /// `dst[i] = a[i] * scalar`.
    pub const SCALE: u32 = 3;
    /// `dst[i] = (dst_dtype) a[i]`.
    pub const CAST: u32 = 4;
}

/// `xpu_binary_op` values.
pub mod binary_op {
    /// Sum.
    pub const SUM: u32 = 0;
    /// Product.
    pub const PROD: u32 = 1;
    /// Minimum.
    pub const MIN: u32 = 2;
    /// Maximum.
    pub const MAX: u32 = 3;
}

/// `xpu_kernel_arg_kind` values.
pub mod kernel_arg_kind {
    /// A buffer range.
    pub const BUFFER: u32 = 0;
    /// A scalar.
    pub const SCALAR: u32 = 1;
}

/// `xpu_access` values.
pub mod access {
    /// Read only.
    pub const READ: u32 = 0;
    /// Write only.
    pub const WRITE: u32 = 1;
    /// Read and write.
    pub const READ_WRITE: u32 = 2;
}

/// `xpu_extension_type` values.
pub mod extension_type {
    /// [`super::xpu_capabilities_extension`].
    pub const CAPABILITIES: u32 = 1;
}

macro_rules! opaque {
    ($($name:ident),*) => {$(
        /// An opaque object owned by the plugin.
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}
opaque!(xpu_error, xpu_device, xpu_buffer, xpu_stream, xpu_event, xpu_kernel);

/// `xpu_extension_base`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xpu_extension_base {
    /// Size of the whole extension struct.
    pub struct_size: usize,
    /// An [`extension_type`] value.
    pub type_: u32,
    /// The next extension, or null.
    pub next: *const xpu_extension_base,
}

/// `xpu_buffer_range`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xpu_buffer_range {
    /// The buffer.
    pub buffer: *mut xpu_buffer,
    /// Byte offset.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
}

/// `xpu_host_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xpu_host_info {
    /// Size as allocated.
    pub struct_size: usize,
    /// Extensions.
    pub extensions: *const xpu_extension_base,
    /// The host's major version.
    pub abi_major: u32,
    /// The highest minor version the host understands.
    pub abi_minor: u32,
}

/// `xpu_plugin_get_api_fn`.
pub type xpu_plugin_get_api_fn =
    unsafe extern "C" fn(host: *const xpu_host_info) -> *const xpu_plugin_api;

macro_rules! args_struct {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy)]
        pub struct $name {
            /// Size as allocated by the caller.
            pub struct_size: usize,
            /// Extensions, or null.
            pub extensions: *const xpu_extension_base,
            $($(#[$fdoc])* pub $field: $ty,)*
        }
    };
}

args_struct!(
    /// `xpu_device_count_args`.
    xpu_device_count_args {
        /// out
        count: u32,
    }
);
args_struct!(
    /// `xpu_device_open_args`.
    xpu_device_open_args {
        /// in
        index: u32,
        /// out
        device: *mut xpu_device,
    }
);
args_struct!(
    /// `xpu_device_close_args`.
    xpu_device_close_args {
        /// in
        device: *mut xpu_device,
    }
);
args_struct!(
    /// `xpu_device_properties_args`.
    xpu_device_properties_args {
        /// in
        device: *mut xpu_device,
        /// out
        name: *const c_char,
        /// out
        vendor: *const c_char,
        /// out
        driver: *const c_char,
        /// out: `xpu_device_kind`
        kind: u32,
        /// out: bit per supported dtype
        dtype_mask: u32,
        /// out
        memory_bytes: u64,
        /// out
        max_allocation: u64,
        /// out
        kernel_arg_alignment: u64,
        /// out
        timeline_events: u32,
        /// out
        event_timing: u32,
        /// out
        kernel_format: *const c_char,
    }
);
args_struct!(
    /// `xpu_memory_info_args`.
    xpu_memory_info_args {
        /// in
        device: *mut xpu_device,
        /// out
        total: u64,
        /// out
        free: u64,
    }
);
args_struct!(
    /// `xpu_buffer_allocate_args`.
    xpu_buffer_allocate_args {
        /// in
        device: *mut xpu_device,
        /// in
        size: u64,
        /// out
        buffer: *mut xpu_buffer,
    }
);
args_struct!(
    /// `xpu_buffer_free_args`.
    xpu_buffer_free_args {
        /// in
        buffer: *mut xpu_buffer,
    }
);
args_struct!(
    /// `xpu_stream_create_args`.
    xpu_stream_create_args {
        /// in
        device: *mut xpu_device,
        /// out
        stream: *mut xpu_stream,
    }
);
args_struct!(
    /// `xpu_stream_args`.
    xpu_stream_args {
        /// in
        stream: *mut xpu_stream,
    }
);
args_struct!(
    /// `xpu_stream_query_args`.
    xpu_stream_query_args {
        /// in
        stream: *mut xpu_stream,
        /// out
        done: u32,
    }
);
args_struct!(
    /// `xpu_copy_args`.
    xpu_copy_args {
        /// in
        stream: *mut xpu_stream,
        /// in
        src: xpu_buffer_range,
        /// in
        dst: xpu_buffer_range,
        /// in
        host: *mut c_void,
        /// in
        length: u64,
    }
);
args_struct!(
    /// `xpu_builtin_args`.
    xpu_builtin_args {
        /// in
        stream: *mut xpu_stream,
        /// in: `xpu_builtin_kind`
        kind: u32,
        /// in: `xpu_binary_op`
        op: u32,
        /// in: `xpu_dtype`
        dtype: u32,
        /// in: `xpu_dtype` of the cast's destination
        dst_dtype: u32,
        /// in
        dst: xpu_buffer_range,
        /// in
        a: xpu_buffer_range,
        /// in
        b: xpu_buffer_range,
        /// in: little-endian scalar
        scalar: [u8; 8],
    }
);
args_struct!(
    /// `xpu_event_record_args`.
    xpu_event_record_args {
        /// in
        stream: *mut xpu_stream,
        /// out
        event: *mut xpu_event,
    }
);
args_struct!(
    /// `xpu_event_args`.
    xpu_event_args {
        /// in
        event: *mut xpu_event,
    }
);
args_struct!(
    /// `xpu_event_query_args`.
    xpu_event_query_args {
        /// in
        event: *mut xpu_event,
        /// out
        done: u32,
    }
);
args_struct!(
    /// `xpu_event_wait_args`.
    xpu_event_wait_args {
        /// in
        event: *mut xpu_event,
        /// in
        timeout_ns: u64,
    }
);
args_struct!(
    /// `xpu_event_elapsed_args`.
    xpu_event_elapsed_args {
        /// in
        start: *mut xpu_event,
        /// in
        end: *mut xpu_event,
        /// out
        elapsed_ns: u64,
    }
);
args_struct!(
    /// `xpu_stream_wait_event_args`.
    xpu_stream_wait_event_args {
        /// in
        stream: *mut xpu_stream,
        /// in
        event: *mut xpu_event,
    }
);

/// `xpu_external_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xpu_external_event {
    /// Passed to both functions.
    pub context: *mut c_void,
    /// Blocks until the event completed; 0 on success.
    pub wait: Option<unsafe extern "C" fn(context: *mut c_void) -> i32>,
    /// Releases `context`.
    pub release: Option<unsafe extern "C" fn(context: *mut c_void)>,
}

args_struct!(
    /// `xpu_stream_wait_external_args`.
    xpu_stream_wait_external_args {
        /// in
        stream: *mut xpu_stream,
        /// in: ownership passes to the plugin
        external: xpu_external_event,
    }
);
args_struct!(
    /// `xpu_kernel_load_args`.
    xpu_kernel_load_args {
        /// in
        device: *mut xpu_device,
        /// in
        format: *const c_char,
        /// in
        code: *const u8,
        /// in
        code_length: u64,
        /// in
        entry_point: *const c_char,
        /// out
        kernel: *mut xpu_kernel,
    }
);
args_struct!(
    /// `xpu_kernel_destroy_args`.
    xpu_kernel_destroy_args {
        /// in
        kernel: *mut xpu_kernel,
    }
);

/// `xpu_kernel_arg`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xpu_kernel_arg {
    /// `xpu_kernel_arg_kind`.
    pub kind: u32,
    /// `xpu_access`.
    pub access: u32,
    /// The buffer range.
    pub range: xpu_buffer_range,
    /// `xpu_dtype` of a scalar.
    pub dtype: u32,
    /// A scalar, little-endian.
    pub scalar: [u8; 8],
}

args_struct!(
    /// `xpu_kernel_launch_args`.
    xpu_kernel_launch_args {
        /// in
        stream: *mut xpu_stream,
        /// in
        kernel: *mut xpu_kernel,
        /// in
        grid: [u32; 3],
        /// in
        block: [u32; 3],
        /// in
        args: *const xpu_kernel_arg,
        /// in
        arg_count: u64,
    }
);
args_struct!(
    /// `xpu_capabilities_args`.
    xpu_capabilities_args {
        /// in
        device: *mut xpu_device,
        /// out
        capabilities: *const *const c_char,
        /// out
        count: u64,
    }
);

/// `xpu_capabilities_extension`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xpu_capabilities_extension {
    /// `type_ == extension_type::CAPABILITIES`.
    pub base: xpu_extension_base,
    /// Lists the device's extra capabilities.
    pub capabilities:
        Option<unsafe extern "C" fn(args: *mut xpu_capabilities_args) -> *mut xpu_error>,
}

/// `XPU_OP_*`: the standard operations' numbers (ABI 1.1), equal to the HAL's
/// `OpKind::id`.
pub mod op {
    /// Matrix multiply.
    pub const MATMUL: u32 = 1;
    /// Bias add.
    pub const BIAS_ADD: u32 = 2;
    /// ReLU.
    pub const RELU: u32 = 3;
    /// ReLU's gradient.
    pub const RELU_BACKWARD: u32 = 4;
    /// GELU.
    pub const GELU: u32 = 5;
    /// GELU's gradient.
    pub const GELU_BACKWARD: u32 = 6;
    /// Softmax.
    pub const SOFTMAX: u32 = 7;
    /// Softmax's gradient.
    pub const SOFTMAX_BACKWARD: u32 = 8;
    /// Cross-entropy.
    pub const CROSS_ENTROPY: u32 = 9;
    /// Cross-entropy's gradient.
    pub const CROSS_ENTROPY_BACKWARD: u32 = 10;
    /// Layer norm.
    pub const LAYER_NORM: u32 = 11;
    /// Layer norm's gradients.
    pub const LAYER_NORM_BACKWARD: u32 = 12;
    /// Gather (embedding lookup).
    pub const GATHER: u32 = 13;
    /// Scatter-add (embedding gradient).
    pub const SCATTER_ADD: u32 = 14;
    /// Reduction along an axis.
    pub const REDUCE: u32 = 15;
    /// SGD with momentum.
    pub const SGD_MOMENTUM: u32 = 16;
    /// AdamW.
    pub const ADAMW: u32 = 17;
    /// Counter-based random numbers.
    pub const RANDOM: u32 = 18;
    /// Inverted dropout.
    pub const DROPOUT: u32 = 19;
}

/// `XPU_MAX_RANK`.
pub const XPU_MAX_RANK: usize = 4;
/// `XPU_OP_MAX_TENSORS`.
pub const XPU_OP_MAX_TENSORS: usize = 8;

/// `xpu_reduce_op` values.
pub mod reduce_op {
    /// Sum.
    pub const SUM: u32 = 0;
    /// Mean.
    pub const MEAN: u32 = 1;
    /// Maximum.
    pub const MAX: u32 = 2;
    /// Minimum.
    pub const MIN: u32 = 3;
}

/// `xpu_random_distribution` values.
pub mod random_distribution {
    /// Raw bits.
    pub const BITS: u32 = 0;
    /// Uniform in `[a, b)`.
    pub const UNIFORM: u32 = 1;
    /// Normal, mean `a`, standard deviation `b`.
    pub const NORMAL: u32 = 2;
}

/// `xpu_tensor`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xpu_tensor {
    /// Size as allocated.
    pub struct_size: usize,
    /// `xpu_dtype`.
    pub dtype: u32,
    /// 1 to [`XPU_MAX_RANK`].
    pub rank: u32,
    /// Shape.
    pub dims: [u64; XPU_MAX_RANK],
    /// Strides in elements.
    pub strides: [u64; XPU_MAX_RANK],
    /// The bytes spanned; `offset` is element 0.
    pub range: xpu_buffer_range,
}

/// `xpu_op_matmul_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct xpu_op_matmul_params {
    /// `a` is given transposed.
    pub trans_a: u32,
    /// `b` is given transposed.
    pub trans_b: u32,
    /// Factor of the product.
    pub alpha: f32,
    /// Factor of `c`.
    pub beta: f32,
}

/// `xpu_op_layer_norm_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct xpu_op_layer_norm_params {
    /// Added to the variance.
    pub eps: f32,
}

/// `xpu_op_reduce_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct xpu_op_reduce_params {
    /// `xpu_reduce_op`.
    pub op: u32,
    /// The dimension reduced.
    pub axis: u32,
}

/// `xpu_op_sgd_momentum_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct xpu_op_sgd_momentum_params {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor.
    pub momentum: f32,
    /// L2 penalty.
    pub weight_decay: f32,
    /// Nesterov momentum (0 or 1).
    pub nesterov: u32,
}

/// `xpu_op_adamw_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct xpu_op_adamw_params {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// Step number, from 1.
    pub step: u32,
}

/// `xpu_op_random_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct xpu_op_random_params {
    /// `xpu_random_distribution`.
    pub distribution: u32,
    /// Uniform: low; normal: mean.
    pub a: f32,
    /// Uniform: high; normal: standard deviation.
    pub b: f32,
    /// 0.
    pub reserved: u32,
    /// Philox key.
    pub seed: u64,
    /// First Philox counter.
    pub offset: u64,
}

/// `xpu_op_dropout_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct xpu_op_dropout_params {
    /// Drop probability.
    pub p: f32,
    /// 0.
    pub reserved: u32,
    /// Philox key.
    pub seed: u64,
    /// First Philox counter.
    pub offset: u64,
}

/// `xpu_op_params`: the member named after the operation holds its parameters.
#[repr(C)]
#[derive(Clone, Copy)]
pub union xpu_op_params {
    /// Matmul.
    pub matmul: xpu_op_matmul_params,
    /// Layer norm.
    pub layer_norm: xpu_op_layer_norm_params,
    /// Reduce.
    pub reduce: xpu_op_reduce_params,
    /// SGD with momentum.
    pub sgd_momentum: xpu_op_sgd_momentum_params,
    /// AdamW.
    pub adamw: xpu_op_adamw_params,
    /// Random.
    pub random: xpu_op_random_params,
    /// Dropout.
    pub dropout: xpu_op_dropout_params,
    /// Fixes the size at 64 bytes.
    pub reserved: [u64; 8],
}

impl std::fmt::Debug for xpu_op_params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: every bit pattern is a valid `[u64; 8]`, which spans the whole union.
        let raw = unsafe { self.reserved };
        f.debug_tuple("xpu_op_params").field(&raw).finish()
    }
}

args_struct!(
    /// `xpu_op_args` (ABI 1.1).
    xpu_op_args {
        /// in
        stream: *mut xpu_stream,
        /// in: `XPU_OP_*`
        op: u32,
        /// in
        tensor_count: u32,
        /// in: `tensor_count` pointers
        tensors: *const *const xpu_tensor,
        /// in
        params: xpu_op_params,
    }
);

/// `xpu_op_support`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct xpu_op_support {
    /// `XPU_OP_*`.
    pub op: u32,
    /// Bit per dtype.
    pub dtype_mask: u32,
}

args_struct!(
    /// `xpu_device_ops_args` (ABI 1.1).
    xpu_device_ops_args {
        /// in
        device: *mut xpu_device,
        /// out: `count` entries, valid until the device is closed
        ops: *const xpu_op_support,
        /// out
        count: u64,
    }
);

/// `xpu_fault` values (ABI 1.2): the faults `device_inject_fault` makes a device
/// suffer. A later fault gets the next number; none is ever reused.
pub mod fault {
    /// The device is lost for good.
    pub const LOST: u32 = 1;
    /// The device is a straggler: `delay_ns` is added to every operation its streams
    /// run from now on (0 ends the slowdown).
    pub const SLOW: u32 = 2;
}

args_struct!(
    /// `xpu_device_fault_args` (ABI 1.2).
    xpu_device_fault_args {
        /// in
        device: *mut xpu_device,
        /// in: `XPU_FAULT_*`
        fault: u32,
        /// in, `XPU_FAULT_SLOW`: nanoseconds added to every operation from now on (0
        /// ends the slowdown)
        delay_ns: u64,
    }
);

/// `xpu_group` (ABI 1.3): a native collective communicator, opaque.
#[repr(C)]
pub struct xpu_group {
    _private: [u8; 0],
}

/// `xpu_collective` values (ABI 1.3).
pub mod collective {
    /// All-reduce.
    pub const ALL_REDUCE: u32 = 1;
    /// Reduce to a root.
    pub const REDUCE: u32 = 2;
    /// Broadcast from a root.
    pub const BROADCAST: u32 = 3;
    /// All-gather.
    pub const ALL_GATHER: u32 = 4;
    /// Reduce-scatter.
    pub const REDUCE_SCATTER: u32 = 5;
    /// All-to-all.
    pub const ALL_TO_ALL: u32 = 6;
}

/// `xpu_collective_op` values (ABI 1.3): the `xpu_binary_op` values and the average.
pub mod collective_op {
    /// Sum.
    pub const SUM: u32 = 0;
    /// Product.
    pub const PROD: u32 = 1;
    /// Minimum.
    pub const MIN: u32 = 2;
    /// Maximum.
    pub const MAX: u32 = 3;
    /// The sum over the ranks divided by their number.
    pub const AVG: u32 = 4;
}

args_struct!(
    /// `xpu_group_create_args` (ABI 1.3).
    xpu_group_create_args {
        /// in: `device_count` devices of the plugin, rank r on `devices[r]`
        devices: *const *mut xpu_device,
        /// in
        device_count: u64,
        /// in: how long a part waits for its peers (0: the plugin's default)
        timeout_ns: u64,
        /// out
        group: *mut xpu_group,
        /// out: static; the library's name and version
        library: *const c_char,
        /// out: cost figure (0: none)
        latency_ns: u64,
        /// out: cost figure (0: none)
        bus_bytes_per_s: u64,
        /// in (ABI 1.4): the identifier of a group across processes
        id: *const u8,
        /// in (ABI 1.4): its length (0: a group of this process alone)
        id_len: u64,
        /// in (ABI 1.4): `device_count` ranks, that of `devices[i]` in the whole group
        ranks: *const u64,
        /// in (ABI 1.4): the ranks in all processes
        size: u64,
    }
);

/// `XPU_GROUP_ID_MAX`: the longest identifier of a group across processes.
pub const XPU_GROUP_ID_MAX: usize = 8192;

args_struct!(
    /// `xpu_group_id_args` (ABI 1.4).
    xpu_group_id_args {
        /// in: a device of the plugin
        device: *mut xpu_device,
        /// in: `XPU_GROUP_ID_MAX` bytes; out: the identifier
        id: *mut u8,
        /// out: its length
        id_len: u64,
    }
);

/// `xpu_group_part` (ABI 1.3): one rank's part of an operation.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xpu_group_part {
    /// Size as allocated.
    pub struct_size: usize,
    /// A stream of the rank's device.
    pub stream: *mut xpu_stream,
    /// Absent when `buffer` is null.
    pub send: xpu_buffer_range,
    /// Absent when `buffer` is null.
    pub recv: xpu_buffer_range,
}

args_struct!(
    /// `xpu_group_run_args` (ABI 1.3).
    xpu_group_run_args {
        /// in
        group: *mut xpu_group,
        /// in: `xpu_collective`
        collective: u32,
        /// in: `xpu_dtype` (reductions)
        dtype: u32,
        /// in: `xpu_collective_op` (reductions)
        op: u32,
        /// in: reduce and broadcast
        root: u32,
        /// in: elements (reductions) or bytes
        count: u64,
        /// in: `part_count` pointers, `parts[r]` for rank r
        parts: *const *const xpu_group_part,
        /// in: the group's size
        part_count: u64,
    }
);

args_struct!(
    /// `xpu_group_args` (ABI 1.3): `group_abort` and `group_destroy`.
    xpu_group_args {
        /// in
        group: *mut xpu_group,
    }
);

/// A plugin function taking `A` and returning an error or null.
pub type PluginFn<A> = Option<unsafe extern "C" fn(args: *mut A) -> *mut xpu_error>;

/// `xpu_plugin_api`: the function table.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xpu_plugin_api {
    /// Size of the table the plugin knows.
    pub struct_size: usize,
    /// Optional features.
    pub extensions: *const xpu_extension_base,
    /// The plugin's major version.
    pub abi_major: u32,
    /// The plugin's minor version.
    pub abi_minor: u32,
    /// The plugin's name.
    pub name: *const c_char,
    /// The plugin's own version.
    pub version: *const c_char,
    /// Error code.
    pub error_code: Option<unsafe extern "C" fn(error: *const xpu_error) -> u32>,
    /// Error message.
    pub error_message: Option<unsafe extern "C" fn(error: *const xpu_error) -> *const c_char>,
    /// Frees an error.
    pub error_destroy: Option<unsafe extern "C" fn(error: *mut xpu_error)>,
    /// Device count.
    pub device_count: PluginFn<xpu_device_count_args>,
    /// Opens a device.
    pub device_open: PluginFn<xpu_device_open_args>,
    /// Closes a device.
    pub device_close: PluginFn<xpu_device_close_args>,
    /// Device properties.
    pub device_properties: PluginFn<xpu_device_properties_args>,
    /// Memory info.
    pub memory_info: PluginFn<xpu_memory_info_args>,
    /// Allocates a buffer.
    pub buffer_allocate: PluginFn<xpu_buffer_allocate_args>,
    /// Frees a buffer.
    pub buffer_free: PluginFn<xpu_buffer_free_args>,
    /// Creates a stream.
    pub stream_create: PluginFn<xpu_stream_create_args>,
    /// Destroys a stream.
    pub stream_destroy: PluginFn<xpu_stream_args>,
    /// Synchronizes a stream.
    pub stream_synchronize: PluginFn<xpu_stream_args>,
    /// Queries a stream.
    pub stream_query: PluginFn<xpu_stream_query_args>,
    /// Host-to-device copy.
    pub copy_host_to_device: PluginFn<xpu_copy_args>,
    /// Device-to-host copy.
    pub copy_device_to_host: PluginFn<xpu_copy_args>,
    /// Device-to-device copy.
    pub copy_device_to_device: PluginFn<xpu_copy_args>,
    /// Builtin operation.
    pub builtin: PluginFn<xpu_builtin_args>,
    /// Records an event.
    pub event_record: PluginFn<xpu_event_record_args>,
    /// Destroys an event.
    pub event_destroy: PluginFn<xpu_event_args>,
    /// Queries an event.
    pub event_query: PluginFn<xpu_event_query_args>,
    /// Waits for an event.
    pub event_wait: PluginFn<xpu_event_wait_args>,
    /// Stream waits for an event of the plugin.
    pub stream_wait_event: PluginFn<xpu_stream_wait_event_args>,
    /// Stream waits for an external event.
    pub stream_wait_external: PluginFn<xpu_stream_wait_external_args>,
    /// Elapsed time (optional).
    pub event_elapsed: PluginFn<xpu_event_elapsed_args>,
    /// Loads a kernel (optional).
    pub kernel_load: PluginFn<xpu_kernel_load_args>,
    /// Destroys a kernel (optional).
    pub kernel_destroy: PluginFn<xpu_kernel_destroy_args>,
    /// Launches a kernel (optional).
    pub kernel_launch: PluginFn<xpu_kernel_launch_args>,
    /// Lists the standard operations of a device (ABI 1.1, optional).
    pub device_ops: PluginFn<xpu_device_ops_args>,
    /// Enqueues a standard operation (ABI 1.1, optional).
    pub op_enqueue: PluginFn<xpu_op_args>,
    /// Makes a device fail as a real failure would, for testing (ABI 1.2, optional).
    pub device_inject_fault: PluginFn<xpu_device_fault_args>,
    /// Makes a native collective communicator (ABI 1.3, optional).
    pub group_create: PluginFn<xpu_group_create_args>,
    /// Enqueues one collective on every rank (ABI 1.3, optional).
    pub group_run: PluginFn<xpu_group_run_args>,
    /// Fails a group's waiting and later parts (ABI 1.3, optional).
    pub group_abort: PluginFn<xpu_group_args>,
    /// Releases a group (ABI 1.3, optional).
    pub group_destroy: PluginFn<xpu_group_args>,
    /// Makes the identifier of a group across processes (ABI 1.4, optional).
    pub group_id: PluginFn<xpu_group_id_args>,
}

// SAFETY: the table holds function pointers and pointers to static strings and
// extension structs, which the header requires to be immutable and valid for the
// plugin's lifetime.
unsafe impl Sync for xpu_plugin_api {}
// SAFETY: as above.
unsafe impl Send for xpu_plugin_api {}
// SAFETY: extension structs are static and immutable (see the header).
unsafe impl Sync for xpu_extension_base {}
// SAFETY: as above.
unsafe impl Sync for xpu_capabilities_extension {}
