//! Kernels: loading, launching a host-function kernel with buffer and scalar
//! arguments, the launches the HAL must refuse, unsupported formats, and kernels that
//! fail or panic.

use xpu_hal::{
    Access, DType, Error, HostArg, KernelArg, KernelDesc, KernelFormat, KernelParam, KernelSource,
    LaunchDims, Scalar,
};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{
    check_bytes, check_values, ensure, expect_invalid, expect_unsupported, full_message,
    host_kernel, pattern, require_host_functions, upload,
};

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "kernel.host_fn_launch",
        "a host-function kernel receives its buffers, scalar and launch dimensions, and its writes land",
        host_fn_launch,
    ),
    Case::core(
        "kernel.empty_buffer_arg",
        "an empty range passed as a buffer argument reaches the kernel as an empty buffer",
        empty_buffer_arg,
    ),
    Case::core(
        "kernel.arg_count_mismatch",
        "a launch with more or fewer arguments than declared is an invalid-argument error",
        arg_count_mismatch,
    ),
    Case::core(
        "kernel.arg_kind_mismatch",
        "a scalar for a buffer parameter, or a buffer for a scalar, is an invalid-argument error",
        arg_kind_mismatch,
    ),
    Case::core(
        "kernel.arg_dtype_mismatch",
        "a scalar of another dtype than declared is an invalid-argument error",
        arg_dtype_mismatch,
    ),
    Case::core(
        "kernel.overlapping_writable_args",
        "a written buffer argument overlapping another buffer argument is an invalid-argument error; read-only overlaps are fine",
        overlapping_writable_args,
    ),
    Case::core(
        "kernel.zero_dim",
        "a launch with a zero grid or block dimension is an invalid-argument error",
        zero_dim,
    ),
    Case::core(
        "kernel.foreign_device",
        "a kernel loaded on another device, or memory of another device as an argument, is an invalid-argument error",
        foreign_device,
    ),
    Case::core(
        "kernel.unsupported_format",
        "loading a kernel in a format the device does not list is an unsupported error",
        unsupported_format,
    ),
    Case::core(
        "kernel.error_at_synchronize",
        "a kernel that fails makes synchronize return an error carrying its message, once; the stream works afterwards",
        error_at_synchronize,
    ),
    Case::core(
        "kernel.panic_becomes_error",
        "a host-function kernel that panics makes synchronize return an aborted error; the stream works afterwards",
        panic_becomes_error,
    ),
];

fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `dst[i] = src[i] * s + (grid.x + 10 grid.y + 100 block.x)`; `calls[0] += 1`.
fn affine_kernel(ctx: &CaseContext) -> Result<xpu_hal::Kernel, CaseError> {
    host_kernel(
        &ctx.device,
        "conformance.affine",
        vec![
            KernelParam::Buffer(Access::Read),
            KernelParam::Buffer(Access::Write),
            KernelParam::Scalar(DType::I32),
            KernelParam::Buffer(Access::ReadWrite),
        ],
        |k| {
            let dims = k.dims;
            let bias = dims.grid[0] as i32 + 10 * dims.grid[1] as i32 + 100 * dims.block[0] as i32;
            match k.split() {
                [HostArg::Read(src), HostArg::Write(dst), HostArg::Scalar(Scalar::I32(s)), HostArg::Write(calls)]
                    if src.len() == dst.len() && !calls.is_empty() =>
                {
                    let s = *s;
                    for (o, v) in dst.chunks_exact_mut(4).zip(i32s(src)) {
                        o.copy_from_slice(&v.wrapping_mul(s).wrapping_add(bias).to_le_bytes());
                    }
                    calls[0] = calls[0].wrapping_add(1);
                    Ok(())
                }
                _ => Err("conformance.affine: arguments are not (read buffer, write buffer of the same length, i32 scalar, read-write buffer)".to_string()),
            }
        },
    )
}

fn host_fn_launch(ctx: &CaseContext) -> CaseOutcome {
    require_host_functions(ctx)?;
    ctx.require_dtype(DType::I32)?;
    let stream = ctx.device.create_stream()?;
    let kernel = affine_kernel(ctx)?;
    ensure(kernel.device() == &ctx.device, || {
        "a kernel reports another device than the one that loaded it".to_string()
    })?;
    let n = 1001usize;
    let src_vals: Vec<i32> = (0..n as i32).map(|i| i * 7919 - 3_000_000).collect();
    let src_bytes: Vec<u8> = src_vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    // Source one element into its allocation, destination between guard bytes.
    let mut padded = vec![0xAB; 4];
    padded.extend(&src_bytes);
    let src = upload(&ctx.device, &stream, &padded)?;
    let background = pattern(0xAF, n * 4 + 12);
    let dst = upload(&ctx.device, &stream, &background)?;
    let calls = upload(&ctx.device, &stream, &[0u8; 3])?;
    let dims = LaunchDims {
        grid: [3, 2, 1],
        block: [4, 1, 1],
    };
    let args = [
        KernelArg::Buffer(src.slice(4, (n * 4) as u64)),
        KernelArg::Buffer(dst.slice(4, (n * 4) as u64)),
        KernelArg::Scalar(Scalar::I32(-3)),
        KernelArg::Buffer(calls.whole()),
    ];
    stream.launch(&kernel, dims, &args)?;
    stream.launch(&kernel, dims, &args)?;
    stream.synchronize()?;
    let got = stream.read(&dst)?;
    check_bytes(
        &got[..4],
        &background[..4],
        "the bytes before the kernel's destination",
    )?;
    check_bytes(
        &got[4 + n * 4..],
        &background[4 + n * 4..],
        "the bytes after the kernel's destination",
    )?;
    let bias = 3 + 10 * 2 + 100 * 4;
    let want: Vec<Scalar> = src_vals
        .iter()
        .map(|v| Scalar::I32(v.wrapping_mul(-3).wrapping_add(bias)))
        .collect();
    check_values(
        DType::I32,
        &got[4..4 + n * 4],
        &want,
        0,
        "kernel output src * -3 + (grid.x + 10 grid.y + 100 block.x) with grid [3, 2, 1], block [4, 1, 1]",
        |i| format!("src {}", src_vals[i]),
    )?;
    check_bytes(
        &stream.read(&calls)?,
        &[2, 0, 0],
        "the read-write counter after two launches",
    )
}

fn empty_buffer_arg(ctx: &CaseContext) -> CaseOutcome {
    require_host_functions(ctx)?;
    let stream = ctx.device.create_stream()?;
    let kernel = host_kernel(
        &ctx.device,
        "conformance.lengths",
        vec![
            KernelParam::Buffer(Access::Read),
            KernelParam::Buffer(Access::Write),
            KernelParam::Buffer(Access::Write),
        ],
        |k| {
            match k.split() {
            [HostArg::Read(a), HostArg::Write(b), HostArg::Write(out)] if out.len() >= 2 => {
                out[0] = a.len().min(255) as u8;
                out[1] = b.len().min(255) as u8;
                Ok(())
            }
            _ => Err("conformance.lengths: arguments are not (read buffer, write buffer, write buffer of at least 2 bytes)".to_string()),
        }
        },
    )?;
    let some = upload(&ctx.device, &stream, &[1, 2, 3, 4, 5])?;
    let zero = ctx.device.allocate(0)?;
    let out = upload(&ctx.device, &stream, &[0xEE, 0xEE])?;
    stream.launch(
        &kernel,
        LaunchDims::linear(1, 1),
        &[
            KernelArg::Buffer(some.slice(2, 0)),
            KernelArg::Buffer(zero.whole()),
            KernelArg::Buffer(out.whole()),
        ],
    )?;
    stream.synchronize()?;
    check_bytes(
        &stream.read(&out)?,
        &[0, 0],
        "buffer lengths a kernel saw for an empty slice and a zero-size allocation",
    )
}

fn two_param_kernel(ctx: &CaseContext) -> Result<xpu_hal::Kernel, CaseError> {
    require_host_functions(ctx)?;
    ctx.require_dtype(DType::I32)?;
    host_kernel(
        &ctx.device,
        "conformance.nop",
        vec![
            KernelParam::Buffer(Access::Write),
            KernelParam::Scalar(DType::I32),
        ],
        |_| Ok(()),
    )
}

fn arg_count_mismatch(ctx: &CaseContext) -> CaseOutcome {
    let kernel = two_param_kernel(ctx)?;
    let stream = ctx.device.create_stream()?;
    let buf = ctx.device.allocate(16)?;
    let dims = LaunchDims::linear(1, 1);
    expect_invalid(
        stream.launch(&kernel, dims, &[KernelArg::Buffer(buf.whole())]),
        "a launch with 1 argument of a kernel declaring 2",
    )?;
    expect_invalid(
        stream.launch(
            &kernel,
            dims,
            &[
                KernelArg::Buffer(buf.whole()),
                KernelArg::Scalar(Scalar::I32(1)),
                KernelArg::Scalar(Scalar::I32(2)),
            ],
        ),
        "a launch with 3 arguments of a kernel declaring 2",
    )?;
    expect_invalid(
        stream.launch(&kernel, dims, &[]),
        "a launch with no arguments of a kernel declaring 2",
    )?;
    stream.synchronize()?;
    Ok(())
}

fn arg_kind_mismatch(ctx: &CaseContext) -> CaseOutcome {
    let kernel = two_param_kernel(ctx)?;
    let stream = ctx.device.create_stream()?;
    let buf = ctx.device.allocate(16)?;
    let other = ctx.device.allocate(16)?;
    let dims = LaunchDims::linear(1, 1);
    expect_invalid(
        stream.launch(
            &kernel,
            dims,
            &[
                KernelArg::Scalar(Scalar::I32(1)),
                KernelArg::Scalar(Scalar::I32(2)),
            ],
        ),
        "a scalar passed for a buffer parameter",
    )?;
    expect_invalid(
        stream.launch(
            &kernel,
            dims,
            &[
                KernelArg::Buffer(buf.whole()),
                KernelArg::Buffer(other.whole()),
            ],
        ),
        "a buffer passed for a scalar parameter",
    )?;
    stream.synchronize()?;
    Ok(())
}

fn arg_dtype_mismatch(ctx: &CaseContext) -> CaseOutcome {
    let kernel = two_param_kernel(ctx)?;
    let stream = ctx.device.create_stream()?;
    let buf = ctx.device.allocate(16)?;
    let dims = LaunchDims::linear(1, 1);
    for wrong in [Scalar::F32(1.0), Scalar::I64(1), Scalar::U8(1)] {
        expect_invalid(
            stream.launch(
                &kernel,
                dims,
                &[KernelArg::Buffer(buf.whole()), KernelArg::Scalar(wrong)],
            ),
            &format!("a {} scalar passed for an i32 parameter", wrong.dtype()),
        )?;
    }
    stream.launch(
        &kernel,
        dims,
        &[
            KernelArg::Buffer(buf.whole()),
            KernelArg::Scalar(Scalar::I32(1)),
        ],
    )?;
    stream.synchronize()?;
    Ok(())
}

fn overlapping_writable_args(ctx: &CaseContext) -> CaseOutcome {
    require_host_functions(ctx)?;
    let stream = ctx.device.create_stream()?;
    let load = |a: Access, b: Access| {
        host_kernel(
            &ctx.device,
            "conformance.pair",
            vec![KernelParam::Buffer(a), KernelParam::Buffer(b)],
            |_| Ok(()),
        )
    };
    let buf = ctx.device.allocate(256)?;
    let dims = LaunchDims::linear(1, 1);
    let pair = |x: (u64, u64), y: (u64, u64)| {
        [
            KernelArg::Buffer(buf.slice(x.0, x.1)),
            KernelArg::Buffer(buf.slice(y.0, y.1)),
        ]
    };
    let write_read = load(Access::Write, Access::Read)?;
    expect_invalid(
        stream.launch(&write_read, dims, &pair((0, 64), (32, 64))),
        "a written buffer [0..64) overlapping a read buffer [32..96)",
    )?;
    expect_invalid(
        stream.launch(&write_read, dims, &pair((0, 64), (0, 64))),
        "a written buffer passed again as a read buffer",
    )?;
    let write_write = load(Access::Write, Access::Write)?;
    expect_invalid(
        stream.launch(&write_write, dims, &pair((0, 64), (63, 1))),
        "two written buffers sharing one byte",
    )?;
    let rw_read = load(Access::ReadWrite, Access::Read)?;
    expect_invalid(
        stream.launch(&rw_read, dims, &pair((10, 10), (0, 11))),
        "a read-write buffer [10..20) overlapping a read buffer [0..11)",
    )?;
    // Allowed: overlapping read-only buffers, and disjoint written ones.
    let read_read = load(Access::Read, Access::Read)?;
    stream.launch(&read_read, dims, &pair((0, 64), (32, 64)))?;
    stream.launch(&write_write, dims, &pair((0, 64), (64, 64)))?;
    stream.synchronize()?;
    Ok(())
}

fn zero_dim(ctx: &CaseContext) -> CaseOutcome {
    require_host_functions(ctx)?;
    let stream = ctx.device.create_stream()?;
    let kernel = host_kernel(&ctx.device, "conformance.nop", vec![], |_| Ok(()))?;
    for (grid, block) in [
        ([0, 1, 1], [1, 1, 1]),
        ([1, 0, 1], [1, 1, 1]),
        ([1, 1, 0], [1, 1, 1]),
        ([1, 1, 1], [0, 1, 1]),
        ([4, 4, 4], [1, 1, 0]),
    ] {
        expect_invalid(
            stream.launch(&kernel, LaunchDims { grid, block }, &[]),
            &format!("a launch with grid {grid:?} and block {block:?}"),
        )?;
    }
    stream.launch(&kernel, LaunchDims::linear(1, 1), &[])?;
    stream.synchronize()?;
    Ok(())
}

fn foreign_device(ctx: &CaseContext) -> CaseOutcome {
    require_host_functions(ctx)?;
    let Some(peer) = ctx.peers.iter().find(|p| {
        p.capabilities()
            .supports_kernel_format(KernelFormat::HostFunction)
    }) else {
        return Err(CaseError::skip(
            "needs a second device in the run that loads host-function kernels",
        ));
    };
    let stream = ctx.device.create_stream()?;
    let params = vec![KernelParam::Buffer(Access::Write)];
    let foreign_kernel = host_kernel(peer, "conformance.nop", params.clone(), |_| Ok(()))?;
    let local_kernel = host_kernel(&ctx.device, "conformance.nop", params, |_| Ok(()))?;
    let local = ctx.device.allocate(16)?;
    let foreign = peer.allocate(16)?;
    let dims = LaunchDims::linear(1, 1);
    expect_invalid(
        stream.launch(&foreign_kernel, dims, &[KernelArg::Buffer(local.whole())]),
        &format!(
            "a kernel loaded on {} launched on a stream of {}",
            peer.id(),
            ctx.device.id()
        ),
    )?;
    expect_invalid(
        stream.launch(&local_kernel, dims, &[KernelArg::Buffer(foreign.whole())]),
        &format!(
            "memory of {} as a kernel argument on {}",
            peer.id(),
            ctx.device.id()
        ),
    )?;
    stream.launch(&local_kernel, dims, &[KernelArg::Buffer(local.whole())])?;
    stream.synchronize()?;
    Ok(())
}

fn source_of(format: KernelFormat) -> KernelSource {
    match format {
        KernelFormat::HostFunction => KernelSource::host_fn(|_| Ok(())),
        // A minimal SPIR-V header (magic, version 1.0, generator, bound, schema).
        KernelFormat::SpirV => KernelSource::SpirV(vec![0x0723_0203, 0x0001_0000, 0, 1, 0]),
        KernelFormat::Wgsl => {
            KernelSource::Wgsl("@compute @workgroup_size(1) fn main() {}".to_string())
        }
        KernelFormat::Ptx => KernelSource::Ptx(
            ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry main() { ret; }\n"
                .to_string(),
        ),
        KernelFormat::PluginNative => KernelSource::PluginNative {
            format: "conformance-none".to_string(),
            bytes: vec![0; 16],
        },
    }
}

fn unsupported_format(ctx: &CaseContext) -> CaseOutcome {
    let all = [
        KernelFormat::HostFunction,
        KernelFormat::SpirV,
        KernelFormat::Wgsl,
        KernelFormat::Ptx,
        KernelFormat::PluginNative,
    ];
    let caps = ctx.device.capabilities();
    let Some(missing) = all.into_iter().find(|f| !caps.supports_kernel_format(*f)) else {
        return Err(CaseError::skip(
            "device loads every kernel format, so there is none to refuse",
        ));
    };
    expect_unsupported(
        ctx.device.load_kernel(KernelDesc {
            name: "conformance.unsupported".to_string(),
            entry_point: "main".to_string(),
            source: source_of(missing),
            params: vec![],
        }),
        &format!("loading a {missing} kernel"),
    )?;
    // A supported format with a scalar parameter of a dtype the device lacks.
    let lacking = DType::ALL.into_iter().find(|d| !caps.supports_dtype(*d));
    if let (Some(format), Some(dtype)) = (caps.kernel_formats.first().copied(), lacking) {
        expect_unsupported(
            ctx.device.load_kernel(KernelDesc {
                name: "conformance.unsupported_scalar".to_string(),
                entry_point: "main".to_string(),
                source: source_of(format),
                params: vec![KernelParam::Scalar(dtype)],
            }),
            &format!("loading a kernel with an unsupported {dtype} scalar parameter"),
        )?;
    }
    Ok(())
}

const FAILURE_MARKER: &str = "conformance: deliberate kernel failure 0x5eed";

fn check_recovered(ctx: &CaseContext, stream: &xpu_hal::Stream, after: &str) -> CaseOutcome {
    match stream.synchronize() {
        Ok(()) => {}
        Err(e) => {
            return Err(CaseError::fail(format!(
                "a second synchronize after {after} returned the error again ({e}); an error is reported once"
            )))
        }
    }
    let data = pattern(0x5E, 999);
    let buf = upload(&ctx.device, stream, &data)?;
    let copy = ctx.device.allocate(999)?;
    stream.copy(&buf, &copy)?;
    stream.synchronize()?;
    check_bytes(
        &stream.read(&copy)?,
        &data,
        &format!("a copy on the stream after {after}"),
    )
}

fn error_at_synchronize(ctx: &CaseContext) -> CaseOutcome {
    require_host_functions(ctx)?;
    let stream = ctx.device.create_stream()?;
    crate::cases::util::enqueue_failure(&stream, FAILURE_MARKER)?;
    match stream.synchronize() {
        Ok(()) => {
            return Err(CaseError::fail(
                "synchronize after a kernel that returned an error succeeded; it must return that error",
            ))
        }
        Err(e) => {
            let text = full_message(&e);
            ensure(text.contains(FAILURE_MARKER), || {
                format!(
                    "synchronize returned a {} error that does not carry the kernel's message `{FAILURE_MARKER}`: {text}",
                    e.kind()
                )
            })?;
        }
    }
    check_recovered(ctx, &stream, "a failed kernel was reported")
}

fn panic_becomes_error(ctx: &CaseContext) -> CaseOutcome {
    require_host_functions(ctx)?;
    let stream = ctx.device.create_stream()?;
    // resume_unwind unwinds like a panic without printing one.
    let kernel = host_kernel(&ctx.device, "conformance.panic", vec![], |_| {
        std::panic::resume_unwind(Box::new("conformance: deliberate panic in a kernel"))
    })?;
    stream.launch(&kernel, LaunchDims::linear(1, 1), &[])?;
    match stream.synchronize() {
        Err(Error::Aborted { .. }) => {}
        Err(e) => {
            return Err(CaseError::fail(format!(
                "synchronize after a panicking kernel returned a {} error ({e}); a panic in a worker must become an aborted error",
                e.kind()
            )))
        }
        Ok(()) => {
            return Err(CaseError::fail(
                "synchronize after a panicking kernel succeeded; it must return an aborted error",
            ))
        }
    }
    check_recovered(ctx, &stream, "a panicking kernel was reported")
}
