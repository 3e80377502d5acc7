//! Proves that the Rust mirror (`xpu_plugin_sdk::abi`) matches `xpu_plugin.h`: the
//! header is compiled with the system C compiler into a program that prints every
//! struct's size, alignment and field offsets, and every constant, and each line is
//! compared with what Rust computes for the mirror.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use xpu_plugin_sdk::abi::*;
use xpu_plugin_sdk::struct_size;

/// Lines `name value` describing one struct, from Rust, and the C code printing the
/// same lines.
struct Layout {
    rust: Vec<String>,
    c: String,
}

macro_rules! layout {
    ($out:expr, $t:ident { $($rf:ident => $cf:ident),* $(,)? }) => {{
        let name = stringify!($t);
        $out.rust.push(format!("{name}.size {}", std::mem::size_of::<$t>()));
        $out.rust.push(format!("{name}.align {}", std::mem::align_of::<$t>()));
        writeln!($out.c, "  printf(\"{name}.size %zu\\n\", sizeof({name}));").unwrap();
        writeln!($out.c, "  printf(\"{name}.align %zu\\n\", _Alignof({name}));").unwrap();
        $(
            $out.rust.push(format!("{name}.{} {}", stringify!($cf), std::mem::offset_of!($t, $rf)));
            writeln!(
                $out.c,
                "  printf(\"{name}.{} %zu\\n\", offsetof({name}, {}));",
                stringify!($cf),
                stringify!($cf)
            )
            .unwrap();
        )*
    }};
}

macro_rules! constant {
    ($out:expr, $c:literal, $v:expr) => {{
        $out.rust.push(format!("{} {}", $c, $v));
        writeln!(
            $out.c,
            "  printf(\"{} %llu\\n\", (unsigned long long)({}));",
            $c, $c
        )
        .unwrap();
    }};
}

fn describe() -> Layout {
    let mut l = Layout {
        rust: Vec::new(),
        c: String::new(),
    };
    layout!(l, xpu_extension_base { struct_size => struct_size, type_ => type, next => next });
    layout!(l, xpu_buffer_range { buffer => buffer, offset => offset, length => length });
    layout!(l, xpu_host_info { struct_size => struct_size, extensions => extensions, abi_major => abi_major, abi_minor => abi_minor });
    layout!(l, xpu_device_count_args { extensions => extensions, count => count });
    layout!(l, xpu_device_open_args { extensions => extensions, index => index, device => device });
    layout!(l, xpu_device_close_args { device => device });
    layout!(l, xpu_device_properties_args {
        device => device, name => name, vendor => vendor, driver => driver, kind => kind,
        dtype_mask => dtype_mask, memory_bytes => memory_bytes, max_allocation => max_allocation,
        kernel_arg_alignment => kernel_arg_alignment, timeline_events => timeline_events,
        event_timing => event_timing, kernel_format => kernel_format,
    });
    layout!(l, xpu_memory_info_args { device => device, total => total, free => free });
    layout!(l, xpu_buffer_allocate_args { device => device, size => size, buffer => buffer });
    layout!(l, xpu_buffer_free_args { buffer => buffer });
    layout!(l, xpu_stream_create_args { device => device, stream => stream });
    layout!(l, xpu_stream_args { stream => stream });
    layout!(l, xpu_stream_query_args { stream => stream, done => done });
    layout!(l, xpu_copy_args { stream => stream, src => src, dst => dst, host => host, length => length });
    layout!(l, xpu_builtin_args {
        stream => stream, kind => kind, op => op, dtype => dtype, dst_dtype => dst_dtype,
        dst => dst, a => a, b => b, scalar => scalar,
    });
    layout!(l, xpu_event_record_args { stream => stream, event => event });
    layout!(l, xpu_event_args { event => event });
    layout!(l, xpu_event_query_args { event => event, done => done });
    layout!(l, xpu_event_wait_args { event => event, timeout_ns => timeout_ns });
    layout!(l, xpu_event_elapsed_args { start => start, end => end, elapsed_ns => elapsed_ns });
    layout!(l, xpu_stream_wait_event_args { stream => stream, event => event });
    layout!(l, xpu_external_event { context => context, wait => wait, release => release });
    layout!(l, xpu_stream_wait_external_args { stream => stream, external => external });
    layout!(l, xpu_kernel_load_args {
        device => device, format => format, code => code, code_length => code_length,
        entry_point => entry_point, kernel => kernel,
    });
    layout!(l, xpu_kernel_destroy_args { kernel => kernel });
    layout!(l, xpu_kernel_arg { kind => kind, access => access, range => range, dtype => dtype, scalar => scalar });
    layout!(l, xpu_kernel_launch_args {
        stream => stream, kernel => kernel, grid => grid, block => block, args => args,
        arg_count => arg_count,
    });
    layout!(l, xpu_capabilities_args { device => device, capabilities => capabilities, count => count });
    layout!(l, xpu_capabilities_extension { base => base, capabilities => capabilities });
    layout!(l, xpu_tensor {
        struct_size => struct_size, dtype => dtype, rank => rank, dims => dims,
        strides => strides, range => range,
    });
    layout!(l, xpu_op_matmul_params { trans_a => trans_a, trans_b => trans_b, alpha => alpha, beta => beta });
    layout!(l, xpu_op_layer_norm_params { eps => eps });
    layout!(l, xpu_op_reduce_params { op => op, axis => axis });
    layout!(l, xpu_op_sgd_momentum_params {
        lr => lr, momentum => momentum, weight_decay => weight_decay, nesterov => nesterov,
    });
    layout!(l, xpu_op_adamw_params {
        lr => lr, beta1 => beta1, beta2 => beta2, eps => eps, weight_decay => weight_decay,
        step => step,
    });
    layout!(l, xpu_op_random_params {
        distribution => distribution, a => a, b => b, reserved => reserved, seed => seed,
        offset => offset,
    });
    layout!(l, xpu_op_dropout_params { p => p, reserved => reserved, seed => seed, offset => offset });
    layout!(l, xpu_op_params {});
    layout!(l, xpu_op_args {
        stream => stream, op => op, tensor_count => tensor_count, tensors => tensors,
        params => params,
    });
    layout!(l, xpu_op_support { op => op, dtype_mask => dtype_mask });
    layout!(l, xpu_device_ops_args { device => device, ops => ops, count => count });
    layout!(l, xpu_device_fault_args { extensions => extensions, device => device, fault => fault, delay_ns => delay_ns });
    layout!(l, xpu_group_create_args {
        extensions => extensions, devices => devices, device_count => device_count,
        timeout_ns => timeout_ns, group => group, library => library,
        latency_ns => latency_ns, bus_bytes_per_s => bus_bytes_per_s, id => id,
        id_len => id_len, ranks => ranks, size => size,
    });
    layout!(l, xpu_group_id_args { extensions => extensions, device => device, id => id, id_len => id_len });
    layout!(l, xpu_group_part { struct_size => struct_size, stream => stream, send => send, recv => recv });
    layout!(l, xpu_group_run_args {
        extensions => extensions, group => group, collective => collective, dtype => dtype,
        op => op, root => root, count => count, parts => parts, part_count => part_count,
    });
    layout!(l, xpu_group_args { extensions => extensions, group => group });
    layout!(l, xpu_plugin_api {
        struct_size => struct_size, extensions => extensions, abi_major => abi_major,
        abi_minor => abi_minor, name => name, version => version, error_code => error_code,
        error_message => error_message, error_destroy => error_destroy,
        device_count => device_count, device_open => device_open, device_close => device_close,
        device_properties => device_properties, memory_info => memory_info,
        buffer_allocate => buffer_allocate, buffer_free => buffer_free,
        stream_create => stream_create, stream_destroy => stream_destroy,
        stream_synchronize => stream_synchronize, stream_query => stream_query,
        copy_host_to_device => copy_host_to_device, copy_device_to_host => copy_device_to_host,
        copy_device_to_device => copy_device_to_device, builtin => builtin,
        event_record => event_record, event_destroy => event_destroy, event_query => event_query,
        event_wait => event_wait, stream_wait_event => stream_wait_event,
        stream_wait_external => stream_wait_external, event_elapsed => event_elapsed,
        kernel_load => kernel_load, kernel_destroy => kernel_destroy, kernel_launch => kernel_launch,
        device_ops => device_ops, op_enqueue => op_enqueue,
        device_inject_fault => device_inject_fault, group_create => group_create,
        group_run => group_run, group_abort => group_abort, group_destroy => group_destroy,
        group_id => group_id,
    });
    constant!(l, "XPU_PLUGIN_ABI_MAJOR", XPU_PLUGIN_ABI_MAJOR);
    constant!(l, "XPU_PLUGIN_ABI_MINOR", XPU_PLUGIN_ABI_MINOR);
    constant!(
        l,
        "XPU_ERROR_INVALID_ARGUMENT",
        error_code::INVALID_ARGUMENT
    );
    constant!(l, "XPU_ERROR_OUT_OF_MEMORY", error_code::OUT_OF_MEMORY);
    constant!(l, "XPU_ERROR_UNSUPPORTED", error_code::UNSUPPORTED);
    constant!(l, "XPU_ERROR_UNAVAILABLE", error_code::UNAVAILABLE);
    constant!(l, "XPU_ERROR_DEVICE_LOST", error_code::DEVICE_LOST);
    constant!(l, "XPU_ERROR_TIMEOUT", error_code::TIMEOUT);
    constant!(l, "XPU_ERROR_ABORTED", error_code::ABORTED);
    constant!(l, "XPU_ERROR_INTERNAL", error_code::INTERNAL);
    constant!(l, "XPU_DTYPE_F32", dtype::F32);
    constant!(l, "XPU_DTYPE_F64", dtype::F64);
    constant!(l, "XPU_DTYPE_F16", dtype::F16);
    constant!(l, "XPU_DTYPE_BF16", dtype::BF16);
    constant!(l, "XPU_DTYPE_I32", dtype::I32);
    constant!(l, "XPU_DTYPE_I64", dtype::I64);
    constant!(l, "XPU_DTYPE_U8", dtype::U8);
    constant!(l, "XPU_DEVICE_KIND_CPU", device_kind::CPU);
    constant!(l, "XPU_DEVICE_KIND_GPU", device_kind::GPU);
    constant!(l, "XPU_DEVICE_KIND_NPU", device_kind::NPU);
    constant!(l, "XPU_DEVICE_KIND_OTHER", device_kind::OTHER);
    constant!(l, "XPU_BUILTIN_FILL", builtin_kind::FILL);
    constant!(l, "XPU_BUILTIN_BINARY", builtin_kind::BINARY);
    constant!(l, "XPU_BUILTIN_ACCUMULATE", builtin_kind::ACCUMULATE);
    constant!(l, "XPU_BUILTIN_SCALE", builtin_kind::SCALE);
    constant!(l, "XPU_BUILTIN_CAST", builtin_kind::CAST);
    constant!(l, "XPU_BINARY_SUM", binary_op::SUM);
    constant!(l, "XPU_BINARY_PROD", binary_op::PROD);
    constant!(l, "XPU_BINARY_MIN", binary_op::MIN);
    constant!(l, "XPU_BINARY_MAX", binary_op::MAX);
    constant!(l, "XPU_KERNEL_ARG_BUFFER", kernel_arg_kind::BUFFER);
    constant!(l, "XPU_KERNEL_ARG_SCALAR", kernel_arg_kind::SCALAR);
    constant!(l, "XPU_ACCESS_READ", access::READ);
    constant!(l, "XPU_ACCESS_WRITE", access::WRITE);
    constant!(l, "XPU_ACCESS_READ_WRITE", access::READ_WRITE);
    constant!(
        l,
        "XPU_EXTENSION_CAPABILITIES",
        extension_type::CAPABILITIES
    );
    constant!(l, "XPU_OP_MATMUL", op::MATMUL);
    constant!(l, "XPU_OP_BIAS_ADD", op::BIAS_ADD);
    constant!(l, "XPU_OP_RELU", op::RELU);
    constant!(l, "XPU_OP_RELU_BACKWARD", op::RELU_BACKWARD);
    constant!(l, "XPU_OP_GELU", op::GELU);
    constant!(l, "XPU_OP_GELU_BACKWARD", op::GELU_BACKWARD);
    constant!(l, "XPU_OP_SOFTMAX", op::SOFTMAX);
    constant!(l, "XPU_OP_SOFTMAX_BACKWARD", op::SOFTMAX_BACKWARD);
    constant!(l, "XPU_OP_CROSS_ENTROPY", op::CROSS_ENTROPY);
    constant!(
        l,
        "XPU_OP_CROSS_ENTROPY_BACKWARD",
        op::CROSS_ENTROPY_BACKWARD
    );
    constant!(l, "XPU_OP_LAYER_NORM", op::LAYER_NORM);
    constant!(l, "XPU_OP_LAYER_NORM_BACKWARD", op::LAYER_NORM_BACKWARD);
    constant!(l, "XPU_OP_GATHER", op::GATHER);
    constant!(l, "XPU_OP_SCATTER_ADD", op::SCATTER_ADD);
    constant!(l, "XPU_OP_REDUCE", op::REDUCE);
    constant!(l, "XPU_OP_SGD_MOMENTUM", op::SGD_MOMENTUM);
    constant!(l, "XPU_OP_ADAMW", op::ADAMW);
    constant!(l, "XPU_OP_RANDOM", op::RANDOM);
    constant!(l, "XPU_OP_DROPOUT", op::DROPOUT);
    constant!(l, "XPU_MAX_RANK", XPU_MAX_RANK);
    constant!(l, "XPU_OP_MAX_TENSORS", XPU_OP_MAX_TENSORS);
    constant!(l, "XPU_REDUCE_SUM", reduce_op::SUM);
    constant!(l, "XPU_REDUCE_MEAN", reduce_op::MEAN);
    constant!(l, "XPU_REDUCE_MAX", reduce_op::MAX);
    constant!(l, "XPU_REDUCE_MIN", reduce_op::MIN);
    constant!(l, "XPU_RANDOM_BITS", random_distribution::BITS);
    constant!(l, "XPU_RANDOM_UNIFORM", random_distribution::UNIFORM);
    constant!(l, "XPU_RANDOM_NORMAL", random_distribution::NORMAL);
    constant!(l, "XPU_FAULT_LOST", fault::LOST);
    constant!(l, "XPU_FAULT_SLOW", fault::SLOW);
    constant!(l, "XPU_COLLECTIVE_ALL_REDUCE", collective::ALL_REDUCE);
    constant!(l, "XPU_COLLECTIVE_REDUCE", collective::REDUCE);
    constant!(l, "XPU_COLLECTIVE_BROADCAST", collective::BROADCAST);
    constant!(l, "XPU_COLLECTIVE_ALL_GATHER", collective::ALL_GATHER);
    constant!(
        l,
        "XPU_COLLECTIVE_REDUCE_SCATTER",
        collective::REDUCE_SCATTER
    );
    constant!(l, "XPU_COLLECTIVE_ALL_TO_ALL", collective::ALL_TO_ALL);
    constant!(l, "XPU_COLLECTIVE_OP_SUM", collective_op::SUM);
    constant!(l, "XPU_COLLECTIVE_OP_PROD", collective_op::PROD);
    constant!(l, "XPU_COLLECTIVE_OP_MIN", collective_op::MIN);
    constant!(l, "XPU_COLLECTIVE_OP_MAX", collective_op::MAX);
    constant!(l, "XPU_COLLECTIVE_OP_AVG", collective_op::AVG);
    constant!(
        l,
        "XPU_GROUP_CREATE_ARGS_MIN_SIZE",
        struct_size!(xpu_group_create_args, bus_bytes_per_s)
    );
    constant!(
        l,
        "XPU_GROUP_PART_MIN_SIZE",
        struct_size!(xpu_group_part, recv)
    );
    constant!(
        l,
        "XPU_GROUP_RUN_ARGS_MIN_SIZE",
        struct_size!(xpu_group_run_args, part_count)
    );
    constant!(l, "XPU_GROUP_ID_MAX", XPU_GROUP_ID_MAX);
    constant!(
        l,
        "XPU_GROUP_ID_ARGS_MIN_SIZE",
        struct_size!(xpu_group_id_args, id_len)
    );
    constant!(
        l,
        "XPU_GROUP_ARGS_MIN_SIZE",
        struct_size!(xpu_group_args, group)
    );
    constant!(l, "XPU_TENSOR_MIN_SIZE", struct_size!(xpu_tensor, range));
    constant!(l, "XPU_OP_ARGS_MIN_SIZE", struct_size!(xpu_op_args, params));
    constant!(
        l,
        "XPU_DEVICE_OPS_ARGS_MIN_SIZE",
        struct_size!(xpu_device_ops_args, count)
    );
    constant!(
        l,
        "XPU_DEVICE_FAULT_ARGS_MIN_SIZE",
        struct_size!(xpu_device_fault_args, delay_ns)
    );
    constant!(
        l,
        "XPU_HOST_INFO_MIN_SIZE",
        struct_size!(xpu_host_info, abi_minor)
    );
    constant!(
        l,
        "XPU_DEVICE_PROPERTIES_ARGS_MIN_SIZE",
        struct_size!(xpu_device_properties_args, kernel_format)
    );
    constant!(
        l,
        "XPU_BUILTIN_ARGS_MIN_SIZE",
        struct_size!(xpu_builtin_args, scalar)
    );
    constant!(
        l,
        "XPU_COPY_ARGS_MIN_SIZE",
        struct_size!(xpu_copy_args, length)
    );
    constant!(
        l,
        "XPU_KERNEL_LAUNCH_ARGS_MIN_SIZE",
        struct_size!(xpu_kernel_launch_args, arg_count)
    );
    constant!(
        l,
        "XPU_PLUGIN_API_MIN_SIZE",
        struct_size!(xpu_plugin_api, kernel_launch)
    );
    l
}

fn header_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../include")
}

#[test]
fn the_mirror_matches_the_header() {
    let layout = describe();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("xpu-plugin-layout");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    let program = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"xpu_plugin.h\"\nint main(void) {{\n{}  return 0;\n}}\n",
        layout.c
    );
    std::fs::write(&src, program).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(header_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| panic!("could not run the C compiler `{cc}`: {e}"));
    assert!(status.success(), "the header did not compile cleanly");
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let c_lines: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(c_lines.len(), layout.rust.len());
    let mismatches: Vec<String> = c_lines
        .iter()
        .zip(&layout.rust)
        .filter(|(c, r)| c != r)
        .map(|(c, r)| format!("C: {c}  Rust: {r}"))
        .collect();
    assert!(
        mismatches.is_empty(),
        "layout mismatches:\n{}",
        mismatches.join("\n")
    );
}
