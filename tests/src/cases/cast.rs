//! Casts between every pair of supported dtypes, and the cast rules one at a time:
//! float → integer truncates and saturates (NaN → 0), integer → narrower integer wraps,
//! anything → float rounds to nearest, ties to even.

use xpu_hal::{DType, Scalar};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome};
use crate::cases::ops::Guarded;
use crate::cases::util::{check_values, decode, encode, random_values, upload, Rng};
use crate::reference::{cast, from_f64, from_i64};

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "cast.all_pairs",
        "casts between every pair of supported dtypes match the host reference, at offsets, neighbours untouched",
        all_pairs,
    ),
    Case::core(
        "cast.float_to_int",
        "float → integer casts truncate toward zero and saturate, and NaN becomes 0",
        float_to_int,
    ),
    Case::core(
        "cast.int_narrowing",
        "integer → narrower integer casts wrap; widening sign- or zero-extends",
        int_narrowing,
    ),
    Case::core(
        "cast.int_to_float",
        "integer → float casts round to nearest, ties to even, and overflow to infinity",
        int_to_float,
    ),
    Case::core(
        "cast.round_once",
        "casts into f16, bf16 and f32 round once to nearest: values just above a tie round up, whatever the source type",
        round_once,
    ),
    Case::core(
        "cast.float_specials",
        "float → float casts keep NaN and infinities, overflow to infinity and underflow to zero or subnormals of f16",
        float_specials,
    ),
    Case::core(
        "cast.in_place",
        "casts between same-size dtypes work with identical source and destination ranges",
        in_place,
    ),
];

fn supported(ctx: &CaseContext) -> Vec<DType> {
    DType::ALL
        .into_iter()
        .filter(|d| ctx.device.capabilities().supports_dtype(*d))
        .collect()
}

/// Values that every dtype represents well enough to make every cast interesting.
const FIXED: [f64; 14] = [
    0.0, 1.0, -1.0, 2.5, -2.5, 100.0, 127.0, 200.0, -200.0, 0.5, 3.75, 1000.0, -0.75, 42.0,
];

/// Casts `src` (of `from`) to `to` on the device and returns the result bytes; the
/// source sits one element into its allocation and the destination between guards.
fn run_cast(
    ctx: &CaseContext,
    stream: &xpu_hal::Stream,
    src: &[Scalar],
    from: DType,
    to: DType,
    what: &str,
) -> Result<Vec<u8>, CaseError> {
    let mut bytes = encode(&[from_i64(from, 5)]);
    bytes.extend(encode(src));
    let s = upload(&ctx.device, stream, &bytes)?;
    let dst = Guarded::new(&ctx.device, stream, to, src.len(), 0xCA)?;
    stream.cast(
        s.slice(from.size() as u64, (src.len() * from.size()) as u64),
        from,
        dst.inner(),
        to,
    )?;
    dst.read(stream, what)
}

fn check_cast(
    ctx: &CaseContext,
    stream: &xpu_hal::Stream,
    src: &[Scalar],
    from: DType,
    to: DType,
    half_ulps: u32,
    rule: &str,
) -> CaseOutcome {
    let what = format!("cast {from} → {to}{rule}");
    let got = run_cast(ctx, stream, src, from, to, &what)?;
    let want: Vec<Scalar> = src.iter().map(|x| cast(*x, to)).collect();
    check_values(to, &got, &want, half_ulps, &what, |i| format!("{}", src[i]))
}

fn all_pairs(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let dtypes = supported(ctx);
    for &from in &dtypes {
        for &to in &dtypes {
            let fixed: Vec<Scalar> = FIXED.iter().map(|v| from_f64(from, *v)).collect();
            check_cast(ctx, &stream, &fixed, from, to, 0, "")?;
            // Values over the source's whole range: rounding into f16 and bf16 is
            // allowed one unit in the last place (a backend may convert through f32).
            let mut rng = Rng::new(0xCA57 + from.size() as u64 * 8 + to.size() as u64);
            let random = random_values(&mut rng, from, 257);
            check_cast(
                ctx,
                &stream,
                &random,
                from,
                to,
                1,
                " (pseudo-random values)",
            )?;
        }
    }
    Ok(())
}

fn float_to_int(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let values = [
        2.9,
        -2.9,
        0.99,
        -0.99,
        1.0e10,
        -1.0e10,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        255.5,
        256.0,
        -1.0,
        2_147_483_520.0,
        -2_147_483_648.0,
        3.0e9,
        9.2e18,
        1.0e19,
        -1.0e19,
        -0.0,
        // The edges of i64: 2^63 saturates, -2^63 is exact, the float below 2^63 fits.
        9_223_372_036_854_775_808.0,
        -9_223_372_036_854_775_808.0,
        9_223_372_036_854_774_784.0,
    ];
    let dtypes = supported(ctx);
    let mut tested = false;
    for &from in dtypes.iter().filter(|d| d.is_float()) {
        for &to in dtypes.iter().filter(|d| !d.is_float()) {
            tested = true;
            let src: Vec<Scalar> = values.iter().map(|v| from_f64(from, *v)).collect();
            check_cast(
                ctx,
                &stream,
                &src,
                from,
                to,
                0,
                " (truncates toward zero, saturates, NaN → 0)",
            )?;
        }
    }
    if !tested {
        return Err(CaseError::skip(
            "device lacks a float or an integer dtype, so there is no float → integer cast",
        ));
    }
    Ok(())
}

fn int_narrowing(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let values: [i64; 12] = [
        0x1_0000_0001,
        -1,
        i64::MAX,
        i64::MIN,
        0x8000_0000,
        0xFFFF_FFFF,
        256,
        300,
        255,
        -256,
        200,
        -5,
    ];
    let dtypes = supported(ctx);
    let ints: Vec<DType> = dtypes.iter().copied().filter(|d| !d.is_float()).collect();
    let mut tested = false;
    for &from in &ints {
        for &to in &ints {
            if from == to {
                continue;
            }
            tested = true;
            let src: Vec<Scalar> = values.iter().map(|v| from_i64(from, *v)).collect();
            check_cast(
                ctx,
                &stream,
                &src,
                from,
                to,
                0,
                " (wraps; widening extends)",
            )?;
        }
    }
    if !tested {
        return Err(CaseError::skip(
            "device supports fewer than two integer dtypes",
        ));
    }
    Ok(())
}

fn int_to_float(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let values: [i64; 19] = [
        0,
        1,
        -1,
        255,
        257,
        259,
        -259,
        2049,
        2051,
        -2049,
        70_000,
        16_777_217,
        16_777_219,
        i32::MAX as i64,
        i32::MIN as i64,
        (1 << 53) + 1,
        (1 << 53) + 3,
        i64::MAX,
        i64::MIN,
    ];
    let dtypes = supported(ctx);
    let mut tested = false;
    for &from in dtypes.iter().filter(|d| !d.is_float()) {
        for &to in dtypes.iter().filter(|d| d.is_float()) {
            tested = true;
            let src: Vec<Scalar> = values.iter().map(|v| from_i64(from, *v)).collect();
            check_cast(
                ctx,
                &stream,
                &src,
                from,
                to,
                0,
                " (rounds to nearest, ties to even)",
            )?;
        }
    }
    if !tested {
        return Err(CaseError::skip(
            "device lacks an integer or a float dtype, so there is no integer → float cast",
        ));
    }
    Ok(())
}

fn in_place(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let dtypes = supported(ctx);
    let mut tested = false;
    for &from in &dtypes {
        for &to in &dtypes {
            if from == to || from.size() != to.size() {
                continue;
            }
            tested = true;
            let mut rng = Rng::new(0x1C + from.size() as u64);
            let src: Vec<Scalar> = if from.is_float() {
                (0..101)
                    .map(|_| from_f64(from, rng.grid(1000.0, 4.0)))
                    .collect()
            } else {
                random_values(&mut rng, from, 101)
            };
            let buf = upload(&ctx.device, &stream, &encode(&src))?;
            stream.cast(&buf, from, &buf, to)?;
            let want: Vec<Scalar> = src.iter().map(|x| cast(*x, to)).collect();
            check_values(
                to,
                &stream.read(&buf)?,
                &want,
                1,
                &format!("in-place cast {from} → {to}"),
                |i| format!("{}", src[i]),
            )?;
        }
    }
    if !tested {
        return Err(CaseError::skip(
            "device supports no two dtypes of the same size",
        ));
    }
    Ok(())
}

/// (source dtype, source value, destination dtype, exact result): the source values lie
/// just above a rounding tie of the destination (one lies just below, as a control), by
/// less than the destination's precision can hold, so rounding in two steps (or
/// dropping low bits first) rounds down where rounding once rounds up.
fn round_once_rows() -> Vec<(DType, f64, DType, f64)> {
    let p = |e: i32| 2f64.powi(e);
    vec![
        (DType::F32, 1.0 + p(-8) + p(-23), DType::BF16, 1.0 + p(-7)),
        (
            DType::F32,
            -(1.0 + p(-8) + p(-23)),
            DType::BF16,
            -(1.0 + p(-7)),
        ),
        (DType::F32, 1.0 + p(-8) - p(-23), DType::BF16, 1.0),
        (DType::F32, 1.0 + p(-11) + p(-23), DType::F16, 1.0 + p(-10)),
        (DType::F32, 1000.0 + p(-2) + p(-13), DType::F16, 1000.5),
        (DType::F64, 1.0 + p(-8) + p(-40), DType::BF16, 1.0 + p(-7)),
        (DType::F64, 1.0 + p(-11) + p(-40), DType::F16, 1.0 + p(-10)),
        (DType::F64, 1.0 + p(-24) + p(-50), DType::F32, 1.0 + p(-23)),
        (DType::I32, p(24) + p(16) + 1.0, DType::BF16, p(24) + p(17)),
        (DType::I64, p(24) + p(16) + 1.0, DType::BF16, p(24) + p(17)),
        (DType::I64, p(40) + p(16) + 1.0, DType::F32, p(40) + p(17)),
        (DType::I32, 4099.0, DType::F16, 4100.0),
    ]
}

fn round_once(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let caps = ctx.device.capabilities();
    let mut tested = 0;
    let mut wrong = Vec::new();
    for (from, value, to, result) in round_once_rows() {
        if !caps.supports_dtype(from) || !caps.supports_dtype(to) {
            continue;
        }
        tested += 1;
        let src = if from.is_float() {
            from_f64(from, value)
        } else {
            from_i64(from, value as i64)
        };
        let what = format!("cast {from} → {to} of {src}");
        let got = run_cast(ctx, &stream, &[src], from, to, &what)?;
        if let Err(CaseError::Fail(_)) =
            check_values(to, &got, &[from_f64(to, result)], 0, &what, |_| {
                String::new()
            })
        {
            let found = decode(to, &got)
                .first()
                .map(|v| v.to_string())
                .unwrap_or_default();
            wrong.push(format!("{what} gave {found}, not {}", from_f64(to, result)));
        }
    }
    if tested == 0 {
        return Err(CaseError::skip(
            "device lacks the dtype pairs whose rounding this case checks (into f16, bf16 or f32)",
        ));
    }
    if !wrong.is_empty() {
        return Err(CaseError::fail(format!(
            "{} of {tested} casts of values next to a rounding tie did not round once to nearest (as if low bits were dropped, or the value was rounded twice): {}",
            wrong.len(),
            wrong.join("; ")
        )));
    }
    Ok(())
}

fn float_specials(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let values = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1.0e5,
        -1.0e5,
        1.0e39,
        -1.0e39,
        65_519.0,
        65_520.0,
        3.0e-8,
        1.0e-9,
        -1.0e-9,
        // Ties between f16 subnormals (steps of 2^-24), which round to the even one.
        2.5 * 2f64.powi(-24),
        2.25 * 2f64.powi(-24),
        -3.5 * 2f64.powi(-24),
        2f64.powi(-25),
        0.75 * 2f64.powi(-24),
    ];
    let floats: Vec<DType> = supported(ctx)
        .into_iter()
        .filter(|d| d.is_float())
        .collect();
    let mut tested = false;
    for &from in &floats {
        for &to in &floats {
            if from == to {
                continue;
            }
            tested = true;
            let src: Vec<Scalar> = values.iter().map(|v| from_f64(from, *v)).collect();
            check_cast(
                ctx,
                &stream,
                &src,
                from,
                to,
                0,
                " (NaN stays NaN, overflow → ±inf, underflow → 0 or an f16 subnormal)",
            )?;
        }
    }
    if !tested {
        return Err(CaseError::skip(
            "device supports fewer than two float dtypes",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_once_table_agrees_with_the_reference() {
        for (from, value, to, result) in round_once_rows() {
            let src = if from.is_float() {
                from_f64(from, value)
            } else {
                from_i64(from, value as i64)
            };
            assert_eq!(src.to_f64(), value, "{from} cannot hold {value} exactly");
            assert_eq!(cast(src, to), from_f64(to, result), "{src} → {to}");
        }
    }
}
