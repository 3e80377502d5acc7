//! Kernels: loading, launching with buffer and scalar arguments, the launches the HAL
//! must refuse, unsupported formats, and kernels that fail or panic.
//!
//! Each case that only needs *a* kernel writes it twice, as a host function and in
//! WGSL, and runs the host function where the device loads host functions, else the
//! WGSL ([`KernelKind`]). Cases about what only a host function can do (see its
//! launch dimensions, fail with a message, panic) skip elsewhere.

use xpu_hal::{
    bf16, f16, Access, DType, Device, Error, HostArg, Kernel, KernelArg, KernelDesc, KernelFormat,
    KernelParam, KernelSource, LaunchDims, Scalar,
};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{
    check_bytes, check_values, ensure, expect_invalid, expect_unsupported, full_message,
    host_kernel, kernel_kind, kernel_offset_unit, nop_kernel, pattern, portable_kernel,
    require_host_functions, upload, wgsl_scalar_type, KernelKind,
};

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "kernel.host_fn_launch",
        "a host-function kernel receives its buffers, scalar and launch dimensions, and its writes land",
        host_fn_launch,
    ),
    Case::core(
        "kernel.launch_result",
        "a kernel (host function or WGSL) computes the expected values from buffers at nonzero aligned offsets and i32, u8 and f32 scalars, sees the grid, writes only its ranges, and runs in launch order",
        launch_result,
    ),
    Case::core(
        "kernel.scalar_args",
        "scalar arguments of every dtype the device supports reach a kernel bit for bit, 8-byte ones after 4-byte ones and between buffers included",
        scalar_args,
    ),
    Case::core(
        "kernel.arg_alignment",
        "buffer arguments at multiples of the device's kernel_arg_alignment work; offsets between them are an invalid-argument error",
        arg_alignment,
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

const AFFINE_WGSL: &str = "
struct Params { s: i32, c: u32, f: f32 }
var<immediate> params: Params;
@group(0) @binding(0) var<storage, read> src: array<i32>;
@group(0) @binding(1) var<storage, read_write> dst: array<i32>;
@group(0) @binding(2) var<storage, read_write> acc: array<f32>;

@compute @workgroup_size(64)
fn affine(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let group = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
    let stride = nwg.x * nwg.y * nwg.z * 64u;
    let code = i32(nwg.x + 10u * nwg.y + 100u * nwg.z);
    let n = arrayLength(&dst);
    for (var i = group * 64u + lid; i < n; i += stride) {
        dst[i] = src[i] * params.s + i32(params.c) + code;
        acc[i] = acc[i] * params.f + f32(src[i] & 1023);
    }
}
";

/// `dst[i] = src[i] * s + c + (grid.x + 10 grid.y + 100 grid.z)` (wrapping i32),
/// `acc[i] = acc[i] * f + (src[i] & 1023)` (f32), over the length of `dst`.
fn portable_affine_kernel(device: &Device, kind: KernelKind) -> Result<Kernel, CaseError> {
    portable_kernel(
        device,
        kind,
        "conformance.portable_affine",
        vec![
            KernelParam::Buffer(Access::Read),
            KernelParam::Buffer(Access::Write),
            KernelParam::Scalar(DType::I32),
            KernelParam::Scalar(DType::U8),
            KernelParam::Scalar(DType::F32),
            KernelParam::Buffer(Access::ReadWrite),
        ],
        "affine",
        AFFINE_WGSL,
        |k| {
            let g = k.dims.grid;
            let code = g[0] as i32 + 10 * g[1] as i32 + 100 * g[2] as i32;
            match k.split() {
                [HostArg::Read(src), HostArg::Write(dst), HostArg::Scalar(Scalar::I32(s)), HostArg::Scalar(Scalar::U8(c)), HostArg::Scalar(Scalar::F32(f)), HostArg::Write(acc)]
                    if src.len() >= dst.len() && acc.len() >= dst.len() =>
                {
                    let (s, c, f) = (*s, i32::from(*c), *f);
                    for ((o, a), v) in dst
                        .chunks_exact_mut(4)
                        .zip(acc.chunks_exact_mut(4))
                        .zip(i32s(src))
                    {
                        let r = v.wrapping_mul(s).wrapping_add(c).wrapping_add(code);
                        o.copy_from_slice(&r.to_le_bytes());
                        let old = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
                        a.copy_from_slice(&(old * f + (v & 1023) as f32).to_le_bytes());
                    }
                    Ok(())
                }
                _ => Err("conformance.portable_affine: arguments are not (read buffer, write buffer, i32, u8, f32, read-write buffer) with sources at least as long as the destination".to_string()),
            }
        },
    )
}

/// An allocation of pseudo-random bytes (from `seed`) with `data` written at byte
/// `offset` and 12 bytes after it: a range at a chosen offset with guard bytes on both
/// sides. Returns the allocation and its whole contents.
fn guarded(
    ctx: &CaseContext,
    stream: &xpu_hal::Stream,
    offset: u64,
    data: &[u8],
    seed: u64,
) -> Result<(xpu_hal::Allocation, Vec<u8>), CaseError> {
    let start = offset as usize;
    let mut contents = pattern(seed, start + data.len() + 12);
    contents[start..start + data.len()].copy_from_slice(data);
    let a = upload(&ctx.device, stream, &contents)?;
    Ok((a, contents))
}

/// Checks the guard bytes of a [`guarded`] allocation read back as `got` (`contents`
/// as written, `len` bytes at `offset` in between) and returns those `len` bytes.
fn unguard<'a>(
    got: &'a [u8],
    contents: &[u8],
    offset: u64,
    len: usize,
    what: &str,
) -> Result<&'a [u8], CaseError> {
    let (start, end) = (offset as usize, offset as usize + len);
    check_bytes(
        got.get(..start).unwrap_or_default(),
        &contents[..start],
        &format!("the bytes before {what}"),
    )?;
    check_bytes(
        got.get(end..).unwrap_or_default(),
        &contents[end..],
        &format!("the bytes after {what}"),
    )?;
    Ok(got.get(start..end).unwrap_or_default())
}

fn launch_result(ctx: &CaseContext) -> CaseOutcome {
    let kind = kernel_kind(ctx)?;
    for d in [DType::I32, DType::U8, DType::F32] {
        ctx.require_dtype(d)?;
    }
    let stream = ctx.device.create_stream()?;
    let kernel = portable_affine_kernel(&ctx.device, kind)?;
    ensure(kernel.device() == &ctx.device, || {
        "a kernel reports another device than the one that loaded it".to_string()
    })?;
    let unit = kernel_offset_unit(&ctx.device);
    let n = 1001usize;
    let src_vals: Vec<i32> = (0..n as i32).map(|i| i * 7919 - 3_000_000).collect();
    let acc_vals: Vec<f32> = (0..n).map(|i| (i % 201) as f32 - 100.0).collect();
    let src_bytes: Vec<u8> = src_vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let acc_bytes: Vec<u8> = acc_vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (src, _) = guarded(ctx, &stream, unit, &src_bytes, 0xA0)?;
    let (dst, dst_contents) = guarded(ctx, &stream, 2 * unit, &pattern(0xA1, n * 4), 0xA2)?;
    let (acc, acc_contents) = guarded(ctx, &stream, 3 * unit, &acc_bytes, 0xA3)?;
    let len = (n * 4) as u64;
    let (s, c, f) = (-3i32, 0xC5u8, -1.5f32);
    let args = [
        KernelArg::Buffer(src.slice(unit, len)),
        KernelArg::Buffer(dst.slice(2 * unit, len)),
        KernelArg::Scalar(Scalar::I32(s)),
        KernelArg::Scalar(Scalar::U8(c)),
        KernelArg::Scalar(Scalar::F32(f)),
        KernelArg::Buffer(acc.slice(3 * unit, len)),
    ];
    let dims = LaunchDims {
        grid: [3, 2, 2],
        block: [64, 1, 1],
    };
    stream.launch(&kernel, dims, &args)?;
    stream.launch(&kernel, dims, &args)?;
    stream.synchronize()?;
    let at = format!(
        "{kind} kernel launched twice with buffers at byte offsets {unit}, {} and {}",
        2 * unit,
        3 * unit
    );
    let got_dst = stream.read(&dst)?;
    let got_dst = unguard(
        &got_dst,
        &dst_contents,
        2 * unit,
        n * 4,
        "the kernel's destination",
    )?;
    let code = 3 + 10 * 2 + 100 * 2;
    let want: Vec<Scalar> = src_vals
        .iter()
        .map(|v| {
            Scalar::I32(
                v.wrapping_mul(s)
                    .wrapping_add(i32::from(c))
                    .wrapping_add(code),
            )
        })
        .collect();
    check_values(
        DType::I32,
        got_dst,
        &want,
        0,
        &format!(
            "{at}: dst = src * {s} + {c} (u8) + (grid.x + 10 grid.y + 100 grid.z) with grid [3, 2, 2]"
        ),
        |i| format!("src {}", src_vals[i]),
    )?;
    let got_acc = stream.read(&acc)?;
    let got_acc = unguard(
        &got_acc,
        &acc_contents,
        3 * unit,
        n * 4,
        "the kernel's read-write buffer",
    )?;
    let want: Vec<Scalar> = acc_vals
        .iter()
        .zip(&src_vals)
        .map(|(a, v)| {
            let t = (v & 1023) as f32;
            Scalar::F32((a * f + t) * f + t)
        })
        .collect();
    check_values(
        DType::F32,
        got_acc,
        &want,
        0,
        &format!("{at}: acc = acc * {f} + (src & 1023), twice"),
        |i| format!("acc {}, src {}", acc_vals[i], src_vals[i]),
    )
}

/// An output buffer of [`scalar_args`]: where a kernel stores the scalars of a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    /// `array<u32>`: one word per scalar of 1, 2 or 4 bytes, its bits zero-extended.
    Words,
    /// `array<f64>`: the `f64` scalars.
    F64,
    /// `array<i64>`: the `i64` scalars.
    I64,
}

impl Out {
    fn of(dtype: DType) -> Out {
        match dtype {
            DType::F64 => Out::F64,
            DType::I64 => Out::I64,
            _ => Out::Words,
        }
    }

    fn wgsl(self) -> (&'static str, &'static str) {
        match self {
            Out::Words => ("words", "u32"),
            Out::F64 => ("f64s", "f64"),
            Out::I64 => ("i64s", "i64"),
        }
    }
}

/// One parameter of [`scalar_args`].
#[derive(Debug, Clone, Copy)]
enum ScalarArgsParam {
    Scalar(Scalar),
    Out(Out),
}

/// The parameters of [`scalar_args`] before filtering by what the device supports:
/// scalars between buffers, each 8-byte one right after a 4-byte one (so that it
/// needs padding to 8), sign bits set where a sign extension would show, and both
/// halves of the 8-byte ones distinct.
fn scalar_args_template() -> [ScalarArgsParam; 10] {
    use ScalarArgsParam::{Out as O, Scalar as S};
    [
        S(Scalar::U8(0xC3)),
        O(Out::Words),
        S(Scalar::F64(-3.141_592_653_589_793e100)),
        S(Scalar::I32(-123_456_789)),
        O(Out::F64),
        S(Scalar::I64(-0x0123_4567_89AB_CDEF)),
        O(Out::I64),
        S(Scalar::F16(f16::from_f64(-1.5))),
        S(Scalar::BF16(bf16::from_f64(-2.75))),
        S(Scalar::F32(-0.156_25)),
    ]
}

/// How a kernel of [`scalar_args`] stores `s`: the 32-bit word (zero-extended bits) for
/// 1-, 2- and 4-byte dtypes, the 8 bytes otherwise.
fn stored_bytes(s: Scalar) -> Vec<u8> {
    match s {
        Scalar::U8(v) => u32::from(v).to_le_bytes().to_vec(),
        Scalar::F16(v) => u32::from(v.to_bits()).to_le_bytes().to_vec(),
        Scalar::BF16(v) => u32::from(v.to_bits()).to_le_bytes().to_vec(),
        Scalar::I32(v) => v.to_le_bytes().to_vec(),
        Scalar::F32(v) => v.to_bits().to_le_bytes().to_vec(),
        Scalar::I64(v) => v.to_le_bytes().to_vec(),
        Scalar::F64(v) => v.to_bits().to_le_bytes().to_vec(),
    }
}

/// What the kernel of [`scalar_args`] writes into each output of `outs`, given its
/// `scalars` in order.
fn scalar_args_outputs(scalars: &[Scalar], outs: &[Out]) -> Vec<Vec<u8>> {
    outs.iter()
        .map(|o| {
            scalars
                .iter()
                .filter(|s| Out::of(s.dtype()) == *o)
                .flat_map(|s| stored_bytes(*s))
                .collect()
        })
        .collect()
}

fn scalar_args(ctx: &CaseContext) -> CaseOutcome {
    let kind = kernel_kind(ctx)?;
    let caps = ctx.device.capabilities();
    let supported = |d: DType| caps.supports_dtype(d);
    let scalars: Vec<Scalar> = scalar_args_template()
        .into_iter()
        .filter_map(|p| match p {
            ScalarArgsParam::Scalar(s) if supported(s.dtype()) => Some(s),
            _ => None,
        })
        .collect();
    let template: Vec<ScalarArgsParam> = scalar_args_template()
        .into_iter()
        .filter(|p| match p {
            ScalarArgsParam::Scalar(s) => supported(s.dtype()),
            ScalarArgsParam::Out(o) => scalars.iter().any(|s| Out::of(s.dtype()) == *o),
        })
        .collect();
    let outs: Vec<Out> = template
        .iter()
        .filter_map(|p| match p {
            ScalarArgsParam::Out(o) => Some(*o),
            ScalarArgsParam::Scalar(_) => None,
        })
        .collect();
    if scalars.is_empty() {
        return Err(CaseError::skip(
            "device supports none of the dtypes a scalar argument can have",
        ));
    }
    let params: Vec<KernelParam> = template
        .iter()
        .map(|p| match p {
            ScalarArgsParam::Scalar(s) => KernelParam::Scalar(s.dtype()),
            ScalarArgsParam::Out(_) => KernelParam::Buffer(Access::Write),
        })
        .collect();
    // The WGSL: field `s{i}` per scalar, output `o` at binding `outs.position(o)`, and
    // one store per scalar at the next index of its output.
    let mut wgsl = format!(
        "struct Params {{ {} }}\nvar<immediate> params: Params;\n",
        scalars
            .iter()
            .enumerate()
            .map(|(i, s)| format!("s{i}: {}", wgsl_scalar_type(s.dtype())))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (b, o) in outs.iter().enumerate() {
        let (name, ty) = o.wgsl();
        wgsl.push_str(&format!(
            "@group(0) @binding({b}) var<storage, read_write> {name}: array<{ty}>;\n"
        ));
    }
    wgsl.push_str("@compute @workgroup_size(1)\nfn main() {\n");
    let mut next = [0usize; 3];
    for (i, s) in scalars.iter().enumerate() {
        let out = Out::of(s.dtype());
        let (name, _) = out.wgsl();
        let index = &mut next[out as usize];
        let value = match s.dtype() {
            DType::I32 | DType::F32 => format!("bitcast<u32>(params.s{i})"),
            _ => format!("params.s{i}"),
        };
        wgsl.push_str(&format!("    {name}[{index}] = {value};\n"));
        *index += 1;
    }
    wgsl.push_str("}\n");
    let host_outs = outs.clone();
    let kernel = portable_kernel(
        &ctx.device,
        kind,
        "conformance.scalar_args",
        params.clone(),
        "main",
        &wgsl,
        move |k| {
            let scalars: Vec<Scalar> = k
                .args
                .iter()
                .filter_map(|a| match a {
                    HostArg::Scalar(s) => Some(*s),
                    _ => None,
                })
                .collect();
            let mut data = scalar_args_outputs(&scalars, &host_outs).into_iter();
            for a in k.split() {
                if let HostArg::Write(out) = a {
                    match data.next() {
                        Some(bytes) if bytes.len() == out.len() => out.copy_from_slice(&bytes),
                        _ => return Err(
                            "conformance.scalar_args: the output buffers do not match the scalars"
                                .to_string(),
                        ),
                    }
                }
            }
            Ok(())
        },
    )?;
    let stream = ctx.device.create_stream()?;
    let want = scalar_args_outputs(&scalars, &outs);
    let mut buffers = Vec::new();
    for w in &want {
        buffers.push(upload(&ctx.device, &stream, &pattern(0x5C, w.len()))?);
    }
    let mut next_buffer = buffers.iter();
    let mut args = Vec::new();
    for p in &template {
        match p {
            ScalarArgsParam::Scalar(s) => args.push(KernelArg::Scalar(*s)),
            ScalarArgsParam::Out(_) => {
                if let Some(b) = next_buffer.next() {
                    args.push(KernelArg::Buffer(b.whole()));
                }
            }
        }
    }
    stream.launch(&kernel, LaunchDims::linear(1, 1), &args)?;
    stream.synchronize()?;
    let signature = params
        .iter()
        .map(|p| match p {
            KernelParam::Scalar(d) => d.name().to_string(),
            KernelParam::Buffer(_) => "buffer".to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let hex = |b: &[u8]| {
        b.iter()
            .rev()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    };
    for ((o, w), b) in outs.iter().zip(&want).zip(&buffers) {
        let got = stream.read(b)?;
        let mut at = 0usize;
        for s in scalars.iter().filter(|s| Out::of(s.dtype()) == *o) {
            let expected = stored_bytes(*s);
            let end = at + expected.len();
            let found = got.get(at..end).unwrap_or_default();
            ensure(found == expected.as_slice(), || {
                format!(
                    "the {} scalar argument {s} of a {kind} kernel with parameters ({signature}) arrived as 0x{}, expected 0x{} ({})",
                    s.dtype(),
                    hex(found),
                    hex(&expected),
                    if s.dtype().size() < 8 {
                        "its bits zero-extended to 32"
                    } else {
                        "its 8 bytes"
                    }
                )
            })?;
            at = end;
        }
        ensure(got.len() == w.len(), || {
            format!(
                "an output buffer of {} bytes read back {} bytes",
                w.len(),
                got.len()
            )
        })?;
    }
    Ok(())
}

/// `dst[i] = src[i]` over 32-bit words (a host function copies bytes).
fn copy_kernel(device: &Device, kind: KernelKind) -> Result<Kernel, CaseError> {
    portable_kernel(
        device,
        kind,
        "conformance.copy",
        vec![
            KernelParam::Buffer(Access::Read),
            KernelParam::Buffer(Access::Write),
        ],
        "main",
        "@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = gid.x; i < arrayLength(&dst); i += nwg.x * 64u) {
        dst[i] = src[i];
    }
}
",
        |k| {
            match k.split() {
            [HostArg::Read(src), HostArg::Write(dst)] if src.len() == dst.len() => {
                dst.copy_from_slice(src);
                Ok(())
            }
            _ => Err(
                "conformance.copy: arguments are not (read buffer, write buffer of the same length)"
                    .to_string(),
            ),
        }
        },
    )
}

fn arg_alignment(ctx: &CaseContext) -> CaseOutcome {
    let kind = kernel_kind(ctx)?;
    let align = ctx.device.capabilities().kernel_arg_alignment;
    ensure(align.is_power_of_two(), || {
        format!("kernel_arg_alignment is {align}, not a power of two")
    })?;
    let stream = ctx.device.create_stream()?;
    let kernel = copy_kernel(&ctx.device, kind)?;
    // Host functions see bytes, so any multiple of the alignment will do (odd ones
    // when it is 1); WGSL sees 32-bit words, which need 4-byte offsets too.
    let (at_src, at_dst) = match kind {
        KernelKind::HostFunction => (3 * align, 5 * align),
        KernelKind::Wgsl => {
            let unit = kernel_offset_unit(&ctx.device);
            (unit, 2 * unit)
        }
    };
    let len = 4 * 257usize;
    let data = pattern(0xA7, len);
    let (src, _) = guarded(ctx, &stream, at_src, &data, 0xA8)?;
    let (dst, contents) = guarded(ctx, &stream, at_dst, &pattern(0xA9, len), 0xAA)?;
    let dims = LaunchDims::linear(4, 64);
    stream.launch(
        &kernel,
        dims,
        &[
            KernelArg::Buffer(src.slice(at_src, len as u64)),
            KernelArg::Buffer(dst.slice(at_dst, len as u64)),
        ],
    )?;
    stream.synchronize()?;
    let got = stream.read(&dst)?;
    let what = format!(
        "a {kind} copy kernel's destination at byte offset {at_dst} (source at {at_src}; kernel_arg_alignment {align})"
    );
    let middle = unguard(&got, &contents, at_dst, len, &what)?;
    check_bytes(middle, &data, &what)?;
    if align == 1 {
        return Ok(());
    }
    // Offsets between multiples of the alignment (multiples of 4 where possible), for
    // the read and for the written argument, in allocations large enough that only the
    // alignment can be wrong.
    let probe_len = 64u64;
    let probe_src = ctx.device.allocate(2 * align + probe_len)?;
    let probe_dst = ctx.device.allocate(2 * align + probe_len)?;
    let step = if align > 4 { 4 } else { 1 };
    for off in [step, align + align / 2, 2 * align - step] {
        if off.is_multiple_of(align) {
            continue;
        }
        for (which, src_at, dst_at) in [("read", off, 0), ("written", 0, off)] {
            expect_invalid(
                stream.launch(
                    &kernel,
                    dims,
                    &[
                        KernelArg::Buffer(probe_src.slice(src_at, probe_len)),
                        KernelArg::Buffer(probe_dst.slice(dst_at, probe_len)),
                    ],
                ),
                &format!(
                    "a {which} buffer argument at byte offset {off} on a device with kernel_arg_alignment {align}"
                ),
            )?;
        }
    }
    stream.synchronize()?;
    Ok(())
}

fn empty_buffer_arg(ctx: &CaseContext) -> CaseOutcome {
    if kernel_kind(ctx)? == KernelKind::Wgsl {
        return empty_buffer_arg_wgsl(ctx);
    }
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

/// The WGSL form of [`empty_buffer_arg`]. A WGSL device may be unable to bind an empty
/// range at all (Vulkan cannot); refusing the launch with an invalid-argument error is
/// then the honest answer, and the case skips saying so. Any other outcome than that
/// refusal or empty buffers in the kernel fails.
fn empty_buffer_arg_wgsl(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let kernel = portable_kernel(
        &ctx.device,
        KernelKind::Wgsl,
        "conformance.lengths",
        vec![
            KernelParam::Buffer(Access::Read),
            KernelParam::Buffer(Access::Write),
            KernelParam::Buffer(Access::Write),
        ],
        "main",
        "@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() {
    out[0] = arrayLength(&a);
    out[1] = arrayLength(&b);
}
",
        |_| Err("conformance.lengths: the WGSL form has no host function".to_string()),
    )?;
    let unit = kernel_offset_unit(&ctx.device);
    let some = upload(&ctx.device, &stream, &pattern(0xE0, 2 * unit as usize))?;
    let zero = ctx.device.allocate(0)?;
    let out = upload(&ctx.device, &stream, &[0xEE; 8])?;
    let launched = stream.launch(
        &kernel,
        LaunchDims::linear(1, 1),
        &[
            KernelArg::Buffer(some.slice(unit, 0)),
            KernelArg::Buffer(zero.whole()),
            KernelArg::Buffer(out.whole()),
        ],
    );
    match launched {
        Ok(()) => {}
        Err(Error::InvalidArgument { message }) => {
            stream.synchronize()?;
            return Err(CaseError::skip(format!(
                "device refuses empty buffer arguments to WGSL kernels: {message}"
            )));
        }
        Err(e) => return Err(e.into()),
    }
    stream.synchronize()?;
    check_bytes(
        &stream.read(&out)?,
        &[0; 8],
        "arrayLength a WGSL kernel saw for an empty slice and a zero-size allocation",
    )
}

fn two_param_kernel(ctx: &CaseContext) -> Result<Kernel, CaseError> {
    let kind = kernel_kind(ctx)?;
    ctx.require_dtype(DType::I32)?;
    nop_kernel(
        &ctx.device,
        kind,
        vec![
            KernelParam::Buffer(Access::Write),
            KernelParam::Scalar(DType::I32),
        ],
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

/// The largest multiple of `align` not above `x`.
fn align_down(x: u64, align: u64) -> u64 {
    x / align * align
}

fn overlapping_writable_args(ctx: &CaseContext) -> CaseOutcome {
    let kind = kernel_kind(ctx)?;
    let stream = ctx.device.create_stream()?;
    let load = |a: Access, b: Access| {
        nop_kernel(
            &ctx.device,
            kind,
            vec![KernelParam::Buffer(a), KernelParam::Buffer(b)],
        )
    };
    // Every range starts at a multiple of the device's kernel argument alignment, so
    // that only the overlap can be the reason for a refusal. With alignment 1 these
    // are [0..64) and [32..96), [63..64), [10..20) and [0..11).
    let align = ctx.device.capabilities().kernel_arg_alignment.max(1);
    let u = 16 * align;
    let buf = ctx.device.allocate((8 * u).max(256))?;
    let dims = LaunchDims::linear(1, 1);
    let pair = |x: (u64, u64), y: (u64, u64)| {
        [
            KernelArg::Buffer(buf.slice(x.0, x.1)),
            KernelArg::Buffer(buf.slice(y.0, y.1)),
        ]
    };
    let write_read = load(Access::Write, Access::Read)?;
    expect_invalid(
        stream.launch(&write_read, dims, &pair((0, 4 * u), (2 * u, 4 * u))),
        &format!(
            "a written buffer [0..{}) overlapping a read buffer [{}..{})",
            4 * u,
            2 * u,
            6 * u
        ),
    )?;
    expect_invalid(
        stream.launch(&write_read, dims, &pair((0, 4 * u), (0, 4 * u))),
        "a written buffer passed again as a read buffer",
    )?;
    let write_write = load(Access::Write, Access::Write)?;
    let shared = align_down(4 * u - 1, align);
    expect_invalid(
        stream.launch(&write_write, dims, &pair((0, shared + 1), (shared, 1))),
        &format!("two written buffers sharing byte {shared}"),
    )?;
    let rw_read = load(Access::ReadWrite, Access::Read)?;
    let rw = 10u64.div_ceil(align) * align;
    expect_invalid(
        stream.launch(&rw_read, dims, &pair((rw, 10), (0, rw + 1))),
        &format!(
            "a read-write buffer [{rw}..{}) overlapping a read buffer [0..{})",
            rw + 10,
            rw + 1
        ),
    )?;
    // Allowed: overlapping read-only buffers, and disjoint written ones.
    let read_read = load(Access::Read, Access::Read)?;
    stream.launch(&read_read, dims, &pair((0, 4 * u), (2 * u, 4 * u)))?;
    stream.launch(&write_write, dims, &pair((0, 4 * u), (4 * u, 4 * u)))?;
    stream.synchronize()?;
    Ok(())
}

fn zero_dim(ctx: &CaseContext) -> CaseOutcome {
    let kind = kernel_kind(ctx)?;
    let stream = ctx.device.create_stream()?;
    let kernel = nop_kernel(&ctx.device, kind, vec![])?;
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

fn foreign_device_with(ctx: &CaseContext, kind: KernelKind, peer: &Device) -> CaseOutcome {
    let Some(peer_kind) = KernelKind::of(peer) else {
        return Ok(());
    };
    let stream = ctx.device.create_stream()?;
    let params = vec![KernelParam::Buffer(Access::Write)];
    let foreign_kernel = nop_kernel(peer, peer_kind, params.clone())?;
    let local_kernel = nop_kernel(&ctx.device, kind, params)?;
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

fn foreign_device(ctx: &CaseContext) -> CaseOutcome {
    let kind = kernel_kind(ctx)?;
    let loads = |p: &&Device| KernelKind::of(p).is_some();
    let backend = ctx.device.backend();
    let same = ctx
        .peers
        .iter()
        .filter(loads)
        .find(|p| p.backend() == backend);
    let other = ctx
        .peers
        .iter()
        .filter(loads)
        .find(|p| p.backend() != backend);
    if same.is_none() && other.is_none() {
        return Err(CaseError::skip(
            "needs a second device in the run that loads host-function or wgsl kernels",
        ));
    }
    for peer in same.into_iter().chain(other) {
        let which = if peer.backend() == backend {
            "same backend"
        } else {
            "another backend"
        };
        foreign_device_with(ctx, kind, peer)
            .map_err(|e| e.context(format!("{} ({which})", peer.id())))?;
    }
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
        KernelFormat::CudaC => {
            KernelSource::CudaC("extern \"C\" __global__ void main() {}".to_string())
        }
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
        KernelFormat::CudaC,
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
