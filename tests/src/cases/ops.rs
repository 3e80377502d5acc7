//! The builtin elementwise operations (binary, accumulate, scale) against the host
//! reference in [`crate::reference`], their arithmetic rules, and the arguments the HAL
//! must refuse.

use xpu_hal::{BinaryOp, DType, Device, Scalar, Stream};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{
    check_bytes, check_values, decode, encode, expect_invalid, pattern, random_values, upload, Rng,
};
use crate::reference::{self, from_f64, from_i64};

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "binary.sum",
        "dst = a + b for every supported dtype matches the host reference, at offsets, neighbours untouched",
        binary_sum,
    ),
    Case::core(
        "binary.prod",
        "dst = a * b for every supported dtype matches the host reference, at offsets, neighbours untouched",
        binary_prod,
    ),
    Case::core(
        "binary.min",
        "dst = min(a, b) for every supported dtype matches the host reference, at offsets, neighbours untouched",
        binary_min,
    ),
    Case::core(
        "binary.max",
        "dst = max(a, b) for every supported dtype matches the host reference, at offsets, neighbours untouched",
        binary_max,
    ),
    Case::core(
        "accumulate.sum",
        "dst += src for every supported dtype matches the host reference and leaves src and neighbours untouched",
        accumulate_sum,
    ),
    Case::core(
        "accumulate.prod",
        "dst *= src for every supported dtype matches the host reference and leaves src and neighbours untouched",
        accumulate_prod,
    ),
    Case::core(
        "accumulate.min",
        "dst = min(dst, src) for every supported dtype matches the host reference",
        accumulate_min,
    ),
    Case::core(
        "accumulate.max",
        "dst = max(dst, src) for every supported dtype matches the host reference",
        accumulate_max,
    ),
    Case::core(
        "scale.every_dtype",
        "dst = src * alpha for every supported dtype matches the host reference, at offsets, neighbours untouched",
        scale_every_dtype,
    ),
    Case::core(
        "scale.in_place",
        "scale with the destination identical to the source works for every supported dtype",
        scale_in_place,
    ),
    Case::core(
        "scale.alpha_dtype",
        "scale reads and writes elements of alpha's dtype, whatever the bytes held before",
        scale_alpha_dtype,
    ),
    Case::core(
        "ops.integer_wrapping",
        "integer sums and products wrap on overflow (i32::MAX + 1 == i32::MIN)",
        integer_wrapping,
    ),
    Case::core(
        "ops.nan_min_max",
        "float min and max ignore a NaN operand when the other is a number",
        nan_min_max,
    ),
    Case::core(
        "ops.half_rounding",
        "f16 and bf16 results are computed in f32 and rounded once to nearest, ties to even",
        half_rounding,
    ),
    Case::core(
        "ops.float_specials",
        "float sums, products and scales overflow to infinity and propagate NaN (inf - inf and inf * 0 are NaN)",
        float_specials,
    ),
    Case::core(
        "ops.in_place",
        "binary with the destination identical to an operand, and accumulate of a range into itself, work",
        in_place,
    ),
    Case::core(
        "ops.partial_overlap",
        "partly overlapping operands of binary, accumulate, scale and cast are invalid-argument errors",
        partial_overlap,
    ),
    Case::core(
        "ops.misaligned",
        "offsets and lengths that are not whole elements are invalid-argument errors",
        misaligned,
    ),
    Case::core(
        "ops.count_mismatch",
        "operands with different element counts are invalid-argument errors",
        count_mismatch,
    ),
];

/// Elements per operation: odd, so that no vector width divides it.
const N: usize = 1001;
/// Elements kept before and after a destination range to catch stray writes.
const GUARD: usize = 3;
/// Tolerance for f16 and bf16 results in the pattern cases: a backend that computes in
/// native half precision rounds once from the exact result, the reference once from
/// the f32 result; the two differ by at most one unit in the last place.
const HALF_ULPS: u32 = 1;

fn supported(ctx: &CaseContext) -> Vec<DType> {
    DType::ALL
        .into_iter()
        .filter(|d| ctx.device.capabilities().supports_dtype(*d))
        .collect()
}

/// A destination allocation of `GUARD + n + GUARD` elements of background bytes.
pub(crate) struct Guarded {
    alloc: xpu_hal::Allocation,
    background: Vec<u8>,
    dtype: DType,
    n: usize,
}

impl Guarded {
    pub(crate) fn new(
        device: &Device,
        stream: &Stream,
        dtype: DType,
        n: usize,
        seed: u64,
    ) -> Result<Self, CaseError> {
        let background = pattern(seed, (n + 2 * GUARD) * dtype.size());
        let alloc = upload(device, stream, &background)?;
        Ok(Guarded {
            alloc,
            background,
            dtype,
            n,
        })
    }

    pub(crate) fn with_values(
        device: &Device,
        stream: &Stream,
        values: &[Scalar],
        dtype: DType,
        seed: u64,
    ) -> Result<Self, CaseError> {
        let mut g = Guarded::new(device, stream, dtype, values.len(), seed)?;
        let s = dtype.size();
        g.background[GUARD * s..(GUARD + values.len()) * s].copy_from_slice(&encode(values));
        stream.write(&g.alloc, &g.background)?;
        Ok(g)
    }

    pub(crate) fn inner(&self) -> xpu_hal::BufferSlice<'_> {
        let s = self.dtype.size() as u64;
        self.alloc.slice(GUARD as u64 * s, self.n as u64 * s)
    }

    /// Reads the allocation, checks the guards, and returns the inner bytes.
    pub(crate) fn read(&self, stream: &Stream, what: &str) -> Result<Vec<u8>, CaseError> {
        let got = stream.read(&self.alloc)?;
        let s = self.dtype.size();
        let (lo, hi) = (GUARD * s, (GUARD + self.n) * s);
        if got.len() != self.background.len() {
            return Err(CaseError::fail(format!(
                "{what}: read {} bytes of a {}-byte allocation",
                got.len(),
                self.background.len()
            )));
        }
        check_bytes(
            &got[..lo],
            &self.background[..lo],
            &format!("{what}: the {GUARD} elements before the destination"),
        )?;
        check_bytes(
            &got[hi..],
            &self.background[hi..],
            &format!("{what}: the {GUARD} elements after the destination"),
        )?;
        Ok(got[lo..hi].to_vec())
    }
}

/// Operands for a binary operation: `a` and `b` at odd element offsets of one
/// allocation.
fn upload_pair(
    device: &Device,
    stream: &Stream,
    dtype: DType,
    a: &[Scalar],
    b: &[Scalar],
) -> Result<(xpu_hal::Allocation, u64, u64, u64), CaseError> {
    let s = dtype.size() as u64;
    let n = a.len() as u64;
    let mut bytes = encode(&[reference::from_i64(dtype, 9)]);
    let a_off = s;
    bytes.extend(encode(a));
    let b_off = bytes.len() as u64;
    bytes.extend(encode(b));
    bytes.extend(encode(&[reference::from_i64(dtype, 9)]));
    let alloc = upload(device, stream, &bytes)?;
    Ok((alloc, a_off, b_off, n * s))
}

fn binary_values(rng: &mut Rng, op: BinaryOp, dtype: DType) -> (Vec<Scalar>, Vec<Scalar>) {
    let a = random_values(rng, dtype, N);
    let mut b = random_values(rng, dtype, N);
    if matches!(op, BinaryOp::Min | BinaryOp::Max) {
        // Equal operands now and then.
        for i in (0..N).step_by(7) {
            b[i] = a[i];
        }
    }
    (a, b)
}

fn expected(op: BinaryOp, a: &[Scalar], b: &[Scalar]) -> Result<Vec<Scalar>, CaseError> {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            reference::binary(op, *x, *y)
                .ok_or_else(|| CaseError::fail("internal: operands of different dtypes"))
        })
        .collect()
}

fn binary_case(ctx: &CaseContext, op: BinaryOp) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    for dtype in supported(ctx) {
        let mut rng = Rng::new(0xB1 + dtype.size() as u64 * 131 + op as u64);
        let (a, b) = binary_values(&mut rng, op, dtype);
        let (inputs, a_off, b_off, len) = upload_pair(&ctx.device, &stream, dtype, &a, &b)?;
        let before = stream.read(&inputs)?;
        let dst = Guarded::new(&ctx.device, &stream, dtype, N, 0xD0 + dtype.size() as u64)?;
        stream.binary(
            op,
            dtype,
            inputs.slice(a_off, len),
            inputs.slice(b_off, len),
            dst.inner(),
        )?;
        let what = format!("binary {op} on {dtype}");
        let got = dst.read(&stream, &what)?;
        check_values(dtype, &got, &expected(op, &a, &b)?, HALF_ULPS, &what, |i| {
            format!("{} {op} {}", a[i], b[i])
        })?;
        check_bytes(
            &stream.read(&inputs)?,
            &before,
            &format!("{what}: the operands afterwards"),
        )?;
    }
    Ok(())
}

fn binary_sum(ctx: &CaseContext) -> CaseOutcome {
    binary_case(ctx, BinaryOp::Sum)
}
fn binary_prod(ctx: &CaseContext) -> CaseOutcome {
    binary_case(ctx, BinaryOp::Prod)
}
fn binary_min(ctx: &CaseContext) -> CaseOutcome {
    binary_case(ctx, BinaryOp::Min)
}
fn binary_max(ctx: &CaseContext) -> CaseOutcome {
    binary_case(ctx, BinaryOp::Max)
}

fn accumulate_case(ctx: &CaseContext, op: BinaryOp) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    for dtype in supported(ctx) {
        let mut rng = Rng::new(0xAC + dtype.size() as u64 * 17 + op as u64);
        let (acc, src) = binary_values(&mut rng, op, dtype);
        let dst = Guarded::with_values(&ctx.device, &stream, &acc, dtype, 0xE0)?;
        // The source at an odd element offset of its allocation.
        let (inputs, _, src_off, len) = upload_pair(&ctx.device, &stream, dtype, &src, &src)?;
        let before = stream.read(&inputs)?;
        stream.accumulate(op, dtype, dst.inner(), inputs.slice(src_off, len))?;
        let what = format!("accumulate {op} on {dtype}");
        let got = dst.read(&stream, &what)?;
        check_values(
            dtype,
            &got,
            &expected(op, &acc, &src)?,
            HALF_ULPS,
            &what,
            |i| format!("{} {op}= {}", acc[i], src[i]),
        )?;
        check_bytes(
            &stream.read(&inputs)?,
            &before,
            &format!("{what}: the source afterwards"),
        )?;
    }
    Ok(())
}

fn accumulate_sum(ctx: &CaseContext) -> CaseOutcome {
    accumulate_case(ctx, BinaryOp::Sum)
}
fn accumulate_prod(ctx: &CaseContext) -> CaseOutcome {
    accumulate_case(ctx, BinaryOp::Prod)
}
fn accumulate_min(ctx: &CaseContext) -> CaseOutcome {
    accumulate_case(ctx, BinaryOp::Min)
}
fn accumulate_max(ctx: &CaseContext) -> CaseOutcome {
    accumulate_case(ctx, BinaryOp::Max)
}

fn random_alpha(rng: &mut Rng, dtype: DType) -> Scalar {
    if dtype.is_float() {
        from_f64(dtype, rng.grid(4.0, 4.0))
    } else {
        // Any integer: products wrap.
        random_values(rng, dtype, 1)
            .first()
            .copied()
            .unwrap_or(Scalar::U8(3))
    }
}

fn scale_every_dtype(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    for dtype in supported(ctx) {
        let mut rng = Rng::new(0x5C + dtype.size() as u64);
        let src = random_values(&mut rng, dtype, N);
        for _ in 0..2 {
            let alpha = random_alpha(&mut rng, dtype);
            let (inputs, _, off, len) = upload_pair(&ctx.device, &stream, dtype, &src, &src)?;
            let dst = Guarded::new(&ctx.device, &stream, dtype, N, 0x5D)?;
            stream.scale(inputs.slice(off, len), dst.inner(), alpha)?;
            let what = format!("scale of {dtype} by {alpha}");
            let got = dst.read(&stream, &what)?;
            let want: Vec<Scalar> = src
                .iter()
                .map(|x| reference::scale(*x, alpha).unwrap_or(*x))
                .collect();
            check_values(dtype, &got, &want, HALF_ULPS, &what, |i| {
                format!("{} * {alpha}", src[i])
            })?;
        }
    }
    Ok(())
}

fn scale_in_place(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    for dtype in supported(ctx) {
        let mut rng = Rng::new(0x51 + dtype.size() as u64);
        let src = random_values(&mut rng, dtype, N);
        let alpha = random_alpha(&mut rng, dtype);
        let buf = Guarded::with_values(&ctx.device, &stream, &src, dtype, 0x52)?;
        stream.scale(buf.inner(), buf.inner(), alpha)?;
        let what = format!("in-place scale of {dtype} by {alpha}");
        let got = buf.read(&stream, &what)?;
        let want: Vec<Scalar> = src
            .iter()
            .map(|x| reference::scale(*x, alpha).unwrap_or(*x))
            .collect();
        check_values(dtype, &got, &want, HALF_ULPS, &what, |i| {
            format!("{} * {alpha}", src[i])
        })?;
    }
    Ok(())
}

fn scale_alpha_dtype(ctx: &CaseContext) -> CaseOutcome {
    // f32 values whose low 16 bits are zero: read as any float dtype they are normal
    // numbers or zero, so the check does not depend on denormal handling.
    let words = [1.5f32, -2.0, 3.25, 0.5, -7.0, 100.0, 0.0, 1.0];
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let dtypes = supported(ctx);
    if dtypes.len() < 2 {
        return Err(CaseError::skip(
            "device supports a single dtype, so the dtype of a scale cannot be told apart",
        ));
    }
    let stream = ctx.device.create_stream()?;
    let src = upload(&ctx.device, &stream, &bytes)?;
    for dtype in dtypes {
        let alpha = from_i64(dtype, 3);
        let dst = ctx.device.allocate(bytes.len() as u64)?;
        stream.scale(&src, &dst, alpha)?;
        let elems = decode(dtype, &bytes);
        let want: Vec<Scalar> = elems
            .iter()
            .map(|x| reference::scale(*x, alpha).unwrap_or(*x))
            .collect();
        let what = format!(
            "scale by {alpha} of 32 bytes (8 f32 values) read as {} {dtype} elements",
            elems.len()
        );
        check_values(dtype, &stream.read(&dst)?, &want, 0, &what, |i| {
            format!("{} * {alpha}", elems[i])
        })?;
    }
    Ok(())
}

/// Runs `dst = a op b` on small vectors and returns the result bytes.
fn run_binary(
    ctx: &CaseContext,
    stream: &Stream,
    op: BinaryOp,
    dtype: DType,
    a: &[Scalar],
    b: &[Scalar],
) -> Result<Vec<u8>, CaseError> {
    let da = upload(&ctx.device, stream, &encode(a))?;
    let db = upload(&ctx.device, stream, &encode(b))?;
    let dd = ctx.device.allocate(da.size())?;
    stream.binary(op, dtype, &da, &db, &dd)?;
    Ok(stream.read(&dd)?)
}

/// Runs `acc op= src` on small vectors and returns the result bytes.
fn run_accumulate(
    ctx: &CaseContext,
    stream: &Stream,
    op: BinaryOp,
    dtype: DType,
    acc: &[Scalar],
    src: &[Scalar],
) -> Result<Vec<u8>, CaseError> {
    let da = upload(&ctx.device, stream, &encode(acc))?;
    let ds = upload(&ctx.device, stream, &encode(src))?;
    stream.accumulate(op, dtype, &da, &ds)?;
    Ok(stream.read(&da)?)
}

fn integer_wrapping(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let mut tested = false;
    type Row = (BinaryOp, i64, i64, i64);
    let tables: [(DType, Vec<Row>); 3] = [
        (
            DType::I32,
            vec![
                (BinaryOp::Sum, i32::MAX as i64, 1, i32::MIN as i64),
                (BinaryOp::Sum, i32::MIN as i64, -1, i32::MAX as i64),
                (BinaryOp::Prod, i32::MAX as i64, 2, -2),
                (BinaryOp::Prod, 65_536, 65_536, 0),
                (BinaryOp::Prod, i32::MIN as i64, -1, i32::MIN as i64),
            ],
        ),
        (
            DType::I64,
            vec![
                (BinaryOp::Sum, i64::MAX, 1, i64::MIN),
                (BinaryOp::Sum, i64::MIN, -1, i64::MAX),
                (BinaryOp::Prod, i64::MAX, 2, -2),
                (BinaryOp::Prod, 1 << 32, 1 << 32, 0),
                (BinaryOp::Prod, i64::MIN, -1, i64::MIN),
            ],
        ),
        (
            DType::U8,
            vec![
                (BinaryOp::Sum, 255, 1, 0),
                (BinaryOp::Sum, 200, 100, 44),
                (BinaryOp::Prod, 16, 16, 0),
                (BinaryOp::Prod, 255, 255, 1),
            ],
        ),
    ];
    for (dtype, rows) in &tables {
        let dtype = *dtype;
        if !ctx.device.capabilities().supports_dtype(dtype) {
            continue;
        }
        tested = true;
        for op in [BinaryOp::Sum, BinaryOp::Prod] {
            let rows: Vec<&Row> = rows.iter().filter(|r| r.0 == op).collect();
            let a: Vec<Scalar> = rows.iter().map(|r| from_i64(dtype, r.1)).collect();
            let b: Vec<Scalar> = rows.iter().map(|r| from_i64(dtype, r.2)).collect();
            let want: Vec<Scalar> = rows.iter().map(|r| from_i64(dtype, r.3)).collect();
            let inputs = |i: usize| format!("{} {op} {}", a[i], b[i]);
            check_values(
                dtype,
                &run_binary(ctx, &stream, op, dtype, &a, &b)?,
                &want,
                0,
                &format!("binary {op} on {dtype} (wraps on overflow)"),
                inputs,
            )?;
            check_values(
                dtype,
                &run_accumulate(ctx, &stream, op, dtype, &a, &b)?,
                &want,
                0,
                &format!("accumulate {op} on {dtype} (wraps on overflow)"),
                inputs,
            )?;
        }
        // Scale by 2 wraps the same way.
        let (max, big) = match dtype {
            DType::I32 => (i32::MAX as i64, 1 << 30),
            DType::I64 => (i64::MAX, 1 << 62),
            _ => (255, 128),
        };
        let src = [from_i64(dtype, max), from_i64(dtype, big)];
        let alpha = from_i64(dtype, 2);
        let d = upload(&ctx.device, &stream, &encode(&src))?;
        stream.scale(&d, &d, alpha)?;
        let want: Vec<Scalar> = src
            .iter()
            .map(|x| reference::scale(*x, alpha).unwrap_or(*x))
            .collect();
        check_values(
            dtype,
            &stream.read(&d)?,
            &want,
            0,
            &format!("scale of {dtype} by 2 (wraps on overflow)"),
            |i| format!("{} * 2", src[i]),
        )?;
    }
    if !tested {
        return Err(CaseError::skip(
            "device lacks every integer dtype (i32, i64, u8)",
        ));
    }
    Ok(())
}

fn nan_min_max(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let nan = f64::NAN;
    let inf = f64::INFINITY;
    let a = [nan, 1.0, nan, -3.0, 5.0, -0.5];
    let b = [2.0, nan, nan, -inf, 5.0, inf];
    let min = [2.0, 1.0, nan, -inf, 5.0, -0.5];
    let max = [2.0, 1.0, nan, -3.0, 5.0, inf];
    let mut tested = false;
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        if !ctx.device.capabilities().supports_dtype(dtype) {
            continue;
        }
        tested = true;
        let conv = |v: &[f64]| -> Vec<Scalar> { v.iter().map(|x| from_f64(dtype, *x)).collect() };
        let (sa, sb) = (conv(&a), conv(&b));
        for (op, want) in [(BinaryOp::Min, conv(&min)), (BinaryOp::Max, conv(&max))] {
            let inputs = |i: usize| format!("{op}({}, {})", sa[i], sb[i]);
            check_values(
                dtype,
                &run_binary(ctx, &stream, op, dtype, &sa, &sb)?,
                &want,
                0,
                &format!("binary {op} on {dtype} with NaN operands (a NaN loses to a number)"),
                inputs,
            )?;
            check_values(
                dtype,
                &run_accumulate(ctx, &stream, op, dtype, &sa, &sb)?,
                &want,
                0,
                &format!("accumulate {op} on {dtype} with NaN operands (a NaN loses to a number)"),
                inputs,
            )?;
        }
    }
    if !tested {
        return Err(CaseError::skip(
            "device lacks every float dtype (f32, f64, f16, bf16)",
        ));
    }
    Ok(())
}

fn half_rounding(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let p = |e: i32| 2f64.powi(e);
    // (a, b, a + b rounded once to nearest even)
    let f16_rows = [
        (1.0, p(-11), 1.0),                  // tie, even stays
        (1.0 + p(-10), p(-11), 1.0 + p(-9)), // tie, odd rounds up
        (1.0, 3.0 * p(-12), 1.0 + p(-10)),   // above the tie
        (2048.0, 1.0, 2048.0),               // 2049: tie, even stays
        (2048.0, 3.0, 2052.0),               // 2051: tie, odd rounds up
    ];
    let bf16_rows = [
        (1.0, p(-8), 1.0),
        (1.0 + p(-7), p(-8), 1.0 + p(-6)),
        (1.0, 3.0 * p(-9), 1.0 + p(-7)),
        (256.0, 1.0, 256.0),
        (256.0, 3.0, 260.0),
    ];
    let mut tested = false;
    for (dtype, rows) in [(DType::F16, f16_rows), (DType::BF16, bf16_rows)] {
        if !ctx.device.capabilities().supports_dtype(dtype) {
            continue;
        }
        tested = true;
        let a: Vec<Scalar> = rows.iter().map(|r| from_f64(dtype, r.0)).collect();
        let b: Vec<Scalar> = rows.iter().map(|r| from_f64(dtype, r.1)).collect();
        let want: Vec<Scalar> = rows.iter().map(|r| from_f64(dtype, r.2)).collect();
        check_values(
            dtype,
            &run_binary(ctx, &stream, BinaryOp::Sum, dtype, &a, &b)?,
            &want,
            0,
            &format!("{dtype} sums at rounding ties"),
            |i| format!("{} + {}", a[i], b[i]),
        )?;
        // f32 → half casts round the same way (exact f32 inputs: a + b).
        if ctx.device.capabilities().supports_dtype(DType::F32) {
            let src: Vec<Scalar> = rows
                .iter()
                .map(|r| Scalar::F32((r.0 + r.1) as f32))
                .collect();
            let s = upload(&ctx.device, &stream, &encode(&src))?;
            let d = ctx.device.allocate((rows.len() * 2) as u64)?;
            stream.cast(&s, DType::F32, &d, dtype)?;
            check_values(
                dtype,
                &stream.read(&d)?,
                &want,
                0,
                &format!("f32 → {dtype} casts at rounding ties"),
                |i| format!("{}", src[i]),
            )?;
        }
    }
    if !tested {
        return Err(CaseError::skip("device lacks f16 and bf16"));
    }
    Ok(())
}

fn float_specials(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let nan = f64::NAN;
    let inf = f64::INFINITY;
    let mut tested = false;
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        if !ctx.device.capabilities().supports_dtype(dtype) {
            continue;
        }
        tested = true;
        let max = match dtype {
            DType::F32 => f32::MAX as f64,
            DType::F16 => xpu_hal::f16::MAX.to_f64(),
            DType::BF16 => xpu_hal::bf16::MAX.to_f64(),
            _ => f64::MAX,
        };
        // (op, a, b, a op b)
        let rows = [
            (BinaryOp::Sum, nan, 1.0, nan),
            (BinaryOp::Sum, inf, -inf, nan),
            (BinaryOp::Sum, max, max, inf),
            (BinaryOp::Sum, -max, -max, -inf),
            (BinaryOp::Sum, inf, 1.0, inf),
            (BinaryOp::Prod, inf, 0.0, nan),
            (BinaryOp::Prod, max, -2.0, -inf),
            (BinaryOp::Prod, nan, 0.0, nan),
            (BinaryOp::Prod, -inf, -1.0, inf),
        ];
        for op in [BinaryOp::Sum, BinaryOp::Prod] {
            let rows: Vec<_> = rows.iter().filter(|r| r.0 == op).collect();
            let a: Vec<Scalar> = rows.iter().map(|r| from_f64(dtype, r.1)).collect();
            let b: Vec<Scalar> = rows.iter().map(|r| from_f64(dtype, r.2)).collect();
            let want: Vec<Scalar> = rows.iter().map(|r| from_f64(dtype, r.3)).collect();
            check_values(
                dtype,
                &run_binary(ctx, &stream, op, dtype, &a, &b)?,
                &want,
                0,
                &format!("binary {op} on {dtype} with infinities, NaN and overflow"),
                |i| format!("{} {op} {}", a[i], b[i]),
            )?;
        }
        let src = [
            from_f64(dtype, max),
            from_f64(dtype, nan),
            from_f64(dtype, -inf),
        ];
        let alpha = from_f64(dtype, 4.0);
        let d = upload(&ctx.device, &stream, &encode(&src))?;
        stream.scale(&d, &d, alpha)?;
        let want = [
            from_f64(dtype, inf),
            from_f64(dtype, nan),
            from_f64(dtype, -inf),
        ];
        check_values(
            dtype,
            &stream.read(&d)?,
            &want,
            0,
            &format!("scale of {dtype} by 4 with overflow, NaN and infinity"),
            |i| format!("{} * 4", src[i]),
        )?;
    }
    if !tested {
        return Err(CaseError::skip(
            "device lacks every float dtype (f32, f64, f16, bf16)",
        ));
    }
    Ok(())
}

fn in_place(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    for dtype in supported(ctx) {
        let mut rng = Rng::new(0x1A + dtype.size() as u64);
        let a = random_values(&mut rng, dtype, 257);
        let b = random_values(&mut rng, dtype, 257);
        let cases: [(&str, BinaryOp); 4] = [
            ("dst = a + b with dst identical to a", BinaryOp::Sum),
            ("dst = a * b with dst identical to b", BinaryOp::Prod),
            ("x = max(x, x)", BinaryOp::Max),
            ("x = x + x", BinaryOp::Sum),
        ];
        for (k, (what, op)) in cases.into_iter().enumerate() {
            let da = upload(&ctx.device, &stream, &encode(&a))?;
            let db = upload(&ctx.device, &stream, &encode(&b))?;
            let (want, got, lhs, rhs) = match k {
                0 => {
                    stream.binary(op, dtype, &da, &db, &da)?;
                    (expected(op, &a, &b)?, stream.read(&da)?, &a, &b)
                }
                1 => {
                    stream.binary(op, dtype, &da, &db, &db)?;
                    (expected(op, &a, &b)?, stream.read(&db)?, &a, &b)
                }
                _ => {
                    stream.binary(op, dtype, &da, &da, &da)?;
                    (expected(op, &a, &a)?, stream.read(&da)?, &a, &a)
                }
            };
            check_values(
                dtype,
                &got,
                &want,
                HALF_ULPS,
                &format!("{dtype}: {what}"),
                |i| format!("{} {op} {}", lhs[i], rhs[i]),
            )?;
        }
        let da = upload(&ctx.device, &stream, &encode(&a))?;
        stream.accumulate(BinaryOp::Sum, dtype, &da, &da)?;
        check_values(
            dtype,
            &stream.read(&da)?,
            &expected(BinaryOp::Sum, &a, &a)?,
            HALF_ULPS,
            &format!("{dtype}: accumulate x += x"),
            |i| format!("{} + {}", a[i], a[i]),
        )?;
    }
    Ok(())
}

/// A dtype of at least two bytes, for cases about element alignment.
fn wide_dtype(ctx: &CaseContext) -> Result<DType, CaseError> {
    ctx.pick_dtype(&[
        DType::I32,
        DType::F32,
        DType::I64,
        DType::F64,
        DType::F16,
        DType::BF16,
    ])
}

fn partial_overlap(ctx: &CaseContext) -> CaseOutcome {
    let dtype = ctx.pick_dtype(&DType::ALL)?;
    let s = dtype.size() as u64;
    let stream = ctx.device.create_stream()?;
    let data = pattern(0x0F, 64 * s as usize);
    let buf = upload(&ctx.device, &stream, &data)?;
    let r = |first: u64, count: u64| buf.slice(first * s, count * s);
    expect_invalid(
        stream.binary(BinaryOp::Sum, dtype, r(0, 16), r(32, 16), r(8, 16)),
        "binary whose destination [8..24) partly overlaps operand a [0..16)",
    )?;
    expect_invalid(
        stream.binary(BinaryOp::Sum, dtype, r(0, 16), r(32, 16), r(40, 16)),
        "binary whose destination [40..56) partly overlaps operand b [32..48)",
    )?;
    expect_invalid(
        stream.binary(BinaryOp::Sum, dtype, r(0, 16), r(1, 16), r(40, 16)),
        "binary whose operands [0..16) and [1..17) partly overlap",
    )?;
    expect_invalid(
        stream.accumulate(BinaryOp::Sum, dtype, r(0, 16), r(4, 16)),
        "accumulate whose source partly overlaps the accumulator",
    )?;
    expect_invalid(
        stream.scale(r(0, 16), r(1, 16), from_i64(dtype, 2)),
        "scale whose destination is shifted by one element",
    )?;
    expect_invalid(
        stream.cast(r(0, 16), dtype, r(15, 16), dtype),
        "cast whose ranges share one element",
    )?;
    let sizes: Vec<DType> = supported(ctx)
        .into_iter()
        .filter(|d| d.size() != dtype.size())
        .collect();
    if let Some(&other) = sizes.first() {
        let n = 8;
        expect_invalid(
            stream.cast(
                buf.slice(0, n * s),
                dtype,
                buf.slice(0, n * other.size() as u64),
                other,
            ),
            &format!("cast from {dtype} to {other} in place (sizes differ, so the ranges only partly overlap)"),
        )?;
    }
    check_bytes(
        &stream.read(&buf)?,
        &data,
        "an allocation after refused operations",
    )
}

fn misaligned(ctx: &CaseContext) -> CaseOutcome {
    let dtype = wide_dtype(ctx)?;
    let s = dtype.size() as u64;
    let stream = ctx.device.create_stream()?;
    let data = pattern(0x3A, 64 * s as usize);
    let buf = upload(&ctx.device, &stream, &data)?;
    let one = from_i64(dtype, 1);
    expect_invalid(
        stream.fill(buf.slice(1, 8 * s), one),
        &format!("a {dtype} fill at byte offset 1"),
    )?;
    expect_invalid(
        stream.fill(buf.slice(0, 8 * s + 1), one),
        &format!("a {dtype} fill of {} bytes", 8 * s + 1),
    )?;
    expect_invalid(
        stream.binary(
            BinaryOp::Sum,
            dtype,
            buf.slice(1, 8 * s),
            buf.slice(16 * s, 8 * s),
            buf.slice(32 * s, 8 * s),
        ),
        &format!("a {dtype} binary whose operand a starts at byte 1"),
    )?;
    expect_invalid(
        stream.binary(
            BinaryOp::Sum,
            dtype,
            buf.slice(0, 8 * s - 1),
            buf.slice(16 * s, 8 * s - 1),
            buf.slice(32 * s, 8 * s - 1),
        ),
        &format!("a {dtype} binary on {}-byte ranges", 8 * s - 1),
    )?;
    expect_invalid(
        stream.accumulate(
            BinaryOp::Max,
            dtype,
            buf.slice(0, 8 * s),
            buf.slice(16 * s + 1, 8 * s),
        ),
        &format!("a {dtype} accumulate whose source starts mid-element"),
    )?;
    expect_invalid(
        stream.scale(buf.slice(0, 8 * s), buf.slice(32 * s - 1, 8 * s), one),
        &format!("a {dtype} scale whose destination starts mid-element"),
    )?;
    expect_invalid(
        stream.cast(
            buf.slice(0, 8 * s),
            dtype,
            buf.slice(32 * s + 1, 8 * s),
            dtype,
        ),
        &format!("a {dtype} cast whose destination starts mid-element"),
    )?;
    check_bytes(
        &stream.read(&buf)?,
        &data,
        "an allocation after refused operations",
    )
}

fn count_mismatch(ctx: &CaseContext) -> CaseOutcome {
    let dtype = ctx.pick_dtype(&DType::ALL)?;
    let s = dtype.size() as u64;
    let stream = ctx.device.create_stream()?;
    let data = pattern(0x4C, 64 * s as usize);
    let buf = upload(&ctx.device, &stream, &data)?;
    let r = |first: u64, count: u64| buf.slice(first * s, count * s);
    expect_invalid(
        stream.binary(BinaryOp::Sum, dtype, r(0, 8), r(16, 9), r(32, 8)),
        "binary with 8 and 9 operand elements",
    )?;
    expect_invalid(
        stream.binary(BinaryOp::Prod, dtype, r(0, 8), r(16, 8), r(32, 7)),
        "binary with 8 operand and 7 destination elements",
    )?;
    expect_invalid(
        stream.accumulate(BinaryOp::Sum, dtype, r(0, 8), r(16, 16)),
        "accumulate of 16 elements into 8",
    )?;
    expect_invalid(
        stream.scale(r(0, 8), r(16, 9), from_i64(dtype, 2)),
        "scale of 8 elements into 9",
    )?;
    expect_invalid(
        stream.cast(r(0, 8), dtype, r(16, 9), dtype),
        "cast of 8 elements into 9",
    )?;
    check_bytes(
        &stream.read(&buf)?,
        &data,
        "an allocation after refused operations",
    )
}
