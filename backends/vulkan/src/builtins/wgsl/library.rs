//! The WGSL helper functions the kernels call: number-format conversions done with
//! integer arithmetic, saturating float → integer casts, and `min`/`max` that ignore NaN.
//!
//! # Conversions between floating-point formats
//! Every conversion to `f32`, `f16` or `bf16` goes through one intermediate form,
//! `Unpacked`: a kind (zero, finite, infinite, NaN), a sign, a 30-bit significand `sig`
//! with its leading one at bit 29, a `sticky` flag standing for nonzero bits below
//! `sig`, and an unbiased exponent. Thirty bits plus the sticky flag hold more than
//! enough of any source value (`f64`, `i64`, …) to round it **once**, to nearest with
//! ties to even, into a format of at most 24 significant bits; `encode` does exactly
//! that, subnormal results, overflow to infinity and quiet NaNs included. A NaN keeps
//! its sign and the leading bits of its payload and gets the quiet bit, as the host's
//! conversions (x86 and the `half` crate) do.
//!
//! `f64` results are exact or rounded with plain integer arithmetic on the significand
//! and a multiplication by a power of two, which is exact.
//!
//! # `f64` bits
//! With `shaderInt64`, `f64` values are taken apart and built with `bitcast` to and from
//! `u64`. Without it, WGSL has no way to reach an `f64`'s bits, so the same functions
//! are written with exact arithmetic instead (scaling by powers of two, `ldexp`); they
//! agree on every finite value, but a NaN loses its payload there (it becomes the
//! default quiet NaN).
//!
//! # Float → integer
//! The GPU converts only values that are in range (where the conversion is defined as
//! truncation toward zero); the shader chooses the saturated value or 0 (NaN) itself,
//! with ordered comparisons, which are false for a NaN.

/// The helpers every shader may use: 32-bit arithmetic only.
const COMMON: &str = r#"
const KIND_ZERO: u32 = 0u;
const KIND_FINITE: u32 = 1u;
const KIND_INF: u32 = 2u;
const KIND_NAN: u32 = 3u;

// A value on its way between formats. Finite: (sig / 2^29) * 2^exp, sig in
// [2^29, 2^30), sticky when nonzero bits below sig were dropped. NaN: sig's bits 28..0
// are the leading bits of the payload (the fraction).
struct Unpacked {
    kind: u32,
    neg: bool,
    sig: u32,
    sticky: bool,
    exp: i32,
}

// sig >> k for k in 1..=31, rounded to nearest, ties to even; sticky stands for
// nonzero bits below sig.
fn shift_round(sig: u32, sticky: bool, k: u32) -> u32 {
    let q = sig >> k;
    let rem = sig & ((1u << k) - 1u);
    let halfway = 1u << (k - 1u);
    let up = rem > halfway || (rem == halfway && (sticky || (q & 1u) == 1u));
    return q + select(0u, 1u, up);
}

// The bits of v in the binary format with p fraction bits and w exponent bits (f32:
// 23, 8; f16: 10, 5; bf16: 7, 8), rounded once to nearest, ties to even.
fn encode(v: Unpacked, p: u32, w: u32) -> u32 {
    let sign = select(0u, 1u << (p + w), v.neg);
    let ones = (1u << w) - 1u;
    let inf = sign | (ones << p);
    if v.kind == KIND_ZERO {
        return sign;
    }
    if v.kind == KIND_INF {
        return inf;
    }
    if v.kind == KIND_NAN {
        return inf | (1u << (p - 1u)) | (v.sig >> (29u - p));
    }
    let biased = v.exp + i32(ones >> 1u);
    if biased >= i32(ones) {
        return inf;
    }
    // A subnormal result drops as many more bits as its exponent falls short; a
    // rounding carry moves into the exponent field (up to infinity).
    let k = min(29u - p + u32(max(1 - biased, 0)), 31u);
    return sign | ((u32(max(biased, 1) - 1) << p) + shift_round(v.sig, v.sticky, k));
}

fn unpack_f32(x: u32) -> Unpacked {
    let neg = (x >> 31u) == 1u;
    let biased = (x >> 23u) & 0xFFu;
    let fraction = x & 0x7FFFFFu;
    if biased == 0xFFu {
        if fraction == 0u {
            return Unpacked(KIND_INF, neg, 0u, false, 0);
        }
        return Unpacked(KIND_NAN, neg, fraction << 6u, false, 0);
    }
    if biased == 0u {
        if fraction == 0u {
            return Unpacked(KIND_ZERO, neg, 0u, false, 0);
        }
        let s = countLeadingZeros(fraction) - 2u;
        return Unpacked(KIND_FINITE, neg, fraction << s, false, -120 - i32(s));
    }
    return Unpacked(KIND_FINITE, neg, (fraction | 0x800000u) << 6u, false, i32(biased) - 127);
}

// h: the 16 bits of an f16.
fn unpack_f16(h: u32) -> Unpacked {
    let neg = ((h >> 15u) & 1u) == 1u;
    let biased = (h >> 10u) & 0x1Fu;
    let fraction = h & 0x3FFu;
    if biased == 0x1Fu {
        if fraction == 0u {
            return Unpacked(KIND_INF, neg, 0u, false, 0);
        }
        return Unpacked(KIND_NAN, neg, fraction << 19u, false, 0);
    }
    if biased == 0u {
        if fraction == 0u {
            return Unpacked(KIND_ZERO, neg, 0u, false, 0);
        }
        let s = countLeadingZeros(fraction) - 2u;
        return Unpacked(KIND_FINITE, neg, fraction << s, false, 5 - i32(s));
    }
    return Unpacked(KIND_FINITE, neg, (fraction | 0x400u) << 19u, false, i32(biased) - 15);
}

// An integer of magnitude m (negative when neg).
fn unpack_u32(neg: bool, m: u32) -> Unpacked {
    if m == 0u {
        return Unpacked(KIND_ZERO, false, 0u, false, 0);
    }
    let lz = countLeadingZeros(m);
    let e = 31 - i32(lz);
    if lz >= 2u {
        return Unpacked(KIND_FINITE, neg, m << (lz - 2u), false, e);
    }
    let k = 2u - lz;
    return Unpacked(KIND_FINITE, neg, m >> k, (m & ((1u << k) - 1u)) != 0u, e);
}

fn unpack_i32(x: i32) -> Unpacked {
    let bits = bitcast<u32>(x);
    let neg = x < 0i;
    return unpack_u32(neg, select(bits, 0u - bits, neg));
}

fn f32_from_f16(h: u32) -> f32 {
    return bitcast<f32>(encode(unpack_f16(h), 23u, 8u));
}

fn f32_from_bf16(h: u32) -> f32 {
    let x = h << 16u;
    return bitcast<f32>(select(x, x | 0x400000u, (x & 0x7FFFFFFFu) > 0x7F800000u));
}

fn f16_from_f32(x: f32) -> u32 {
    return encode(unpack_f32(bitcast<u32>(x)), 10u, 5u);
}

fn bf16_from_f32(x: f32) -> u32 {
    return encode(unpack_f32(bitcast<u32>(x)), 7u, 8u);
}

fn is_nan_f32(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7FFFFFFFu) > 0x7F800000u;
}

fn min_f32(a: f32, b: f32) -> f32 {
    if is_nan_f32(a) {
        return b;
    }
    if is_nan_f32(b) {
        return a;
    }
    return select(a, b, b < a);
}

fn max_f32(a: f32, b: f32) -> f32 {
    if is_nan_f32(a) {
        return b;
    }
    if is_nan_f32(b) {
        return a;
    }
    return select(a, b, b > a);
}

fn i32_from_f32(x: f32) -> i32 {
    if x >= -2147483648.0f && x < 2147483648.0f {
        return i32(x);
    }
    if x > 0.0f {
        return 2147483647i;
    }
    if x < 0.0f {
        return bitcast<i32>(0x80000000u);
    }
    return 0i;
}

fn u8_from_f32(x: f32) -> u32 {
    if x >= 1.0f && x < 256.0f {
        return u32(x);
    }
    if x >= 256.0f {
        return 255u;
    }
    return 0u;
}
"#;

/// `f64` helpers that need no 64-bit integers.
const F64_COMMON: &str = r#"
fn min_f64(a: f64, b: f64) -> f64 {
    if is_nan_f64(a) {
        return b;
    }
    if is_nan_f64(b) {
        return a;
    }
    return select(a, b, b < a);
}

fn max_f64(a: f64, b: f64) -> f64 {
    if is_nan_f64(a) {
        return b;
    }
    if is_nan_f64(b) {
        return a;
    }
    return select(a, b, b > a);
}

fn i32_from_f64(x: f64) -> i32 {
    if x >= -2147483648.0lf && x < 2147483648.0lf {
        return i32(x);
    }
    if x > 0.0lf {
        return 2147483647i;
    }
    if x < 0.0lf {
        return bitcast<i32>(0x80000000u);
    }
    return 0i;
}

fn u8_from_f64(x: f64) -> u32 {
    if x >= 1.0lf && x < 256.0lf {
        return u32(x);
    }
    if x >= 256.0lf {
        return 255u;
    }
    return 0u;
}
"#;

/// `f64` bit access through `u64` (needs `shaderInt64`).
const F64_BITS_INT64: &str = r#"
fn is_nan_f64(x: f64) -> bool {
    return (bitcast<u64>(x) & 0x7FFFFFFFFFFFFFFFlu) > 0x7FF0000000000000lu;
}

fn f64_from_bits(lo: u32, hi: u32) -> f64 {
    return bitcast<f64>((u64(hi) << 32u) | u64(lo));
}

fn unpack_f64(x: f64) -> Unpacked {
    let bits = bitcast<u64>(x);
    let hi = u32(bits >> 32u);
    let lo = u32(bits & 0xFFFFFFFFlu);
    let neg = (hi >> 31u) == 1u;
    let biased = (hi >> 20u) & 0x7FFu;
    let high = hi & 0xFFFFFu;
    // The leading 29 fraction bits, and whether any of the other 23 are set.
    let lead = (high << 9u) | (lo >> 23u);
    let rest = (lo & 0x7FFFFFu) != 0u;
    if biased == 0x7FFu {
        if (high | lo) == 0u {
            return Unpacked(KIND_INF, neg, 0u, false, 0);
        }
        return Unpacked(KIND_NAN, neg, lead, false, 0);
    }
    if biased == 0u {
        if (high | lo) == 0u {
            return Unpacked(KIND_ZERO, neg, 0u, false, 0);
        }
        // Below 2^-1022: far below half the smallest subnormal of any narrower format.
        return Unpacked(KIND_FINITE, neg, 0x20000000u, true, -1023);
    }
    return Unpacked(KIND_FINITE, neg, 0x20000000u | lead, rest, i32(biased) - 1023);
}

// Exact; a NaN keeps its payload and gets the quiet bit.
fn f64_from_f32(x: f32) -> f64 {
    let v = unpack_f32(bitcast<u32>(x));
    var hi = select(0u, 0x80000000u, v.neg);
    var lo = 0u;
    if v.kind == KIND_INF {
        hi = hi | 0x7FF00000u;
    } else if v.kind == KIND_NAN {
        hi = hi | 0x7FF80000u | (v.sig >> 9u);
        lo = v.sig << 23u;
    } else if v.kind == KIND_FINITE {
        let fraction = v.sig & 0x1FFFFFFFu;
        hi = hi | (u32(v.exp + 1023) << 20u) | (fraction >> 9u);
        lo = fraction << 23u;
    }
    return f64_from_bits(lo, hi);
}
"#;

/// `f64` bit access with arithmetic only (no `shaderInt64`); the scaling steps of
/// `unpack_f64` are generated by [`unpack_f64_arithmetic`].
const F64_BITS_ARITHMETIC: &str = r#"
// Not `x != x`: naga writes float `!=` as an ordered comparison, false for a NaN.
fn is_nan_f64(x: f64) -> bool {
    return !(x == x);
}

fn f64_from_bits(lo: u32, hi: u32) -> f64 {
    let neg = (hi >> 31u) == 1u;
    let biased = (hi >> 20u) & 0x7FFu;
    let high = hi & 0xFFFFFu;
    var v: f64;
    if biased == 0x7FFu {
        // Infinity, or a NaN (through an f32 NaN: the payload's leading bits survive
        // where the device keeps them).
        let nan = 0x7FC00000u | (high << 3u) | (lo >> 29u);
        v = f64(bitcast<f32>(select(0x7F800000u, nan, (high | lo) != 0u)));
    } else {
        let m = f64(high | select(0u, 0x100000u, biased != 0u)) * 4294967296.0lf + f64(lo);
        v = ldexp(m, i32(max(biased, 1u)) - 1075);
    }
    return select(v, -v, neg);
}

fn f64_from_f32(x: f32) -> f64 {
    return f64(x);
}
"#;

/// `i64` helpers (need `shaderInt64`).
const I64: &str = r#"
fn i64_from_bits(lo: u32, hi: u32) -> i64 {
    return bitcast<i64>((u64(hi) << 32u) | u64(lo));
}

fn unpack_i64(x: i64) -> Unpacked {
    let neg = x < 0li;
    let m = select(u64(x), 0lu - u64(x), neg);
    let hi = u32(m >> 32u);
    if hi == 0u {
        return unpack_u32(neg, u32(m));
    }
    let n = 64u - countLeadingZeros(hi);
    let k = n - 30u;
    let sticky = (m & ((1lu << k) - 1lu)) != 0lu;
    return Unpacked(KIND_FINITE, neg, u32(m >> k), sticky, i32(n) - 1);
}

fn i32_from_i64(x: i64) -> i32 {
    return bitcast<i32>(u32(u64(x) & 0xFFFFFFFFlu));
}

fn u8_from_i64(x: i64) -> u32 {
    return u32(u64(x) & 0xFFlu);
}

fn i64_from_f32(x: f32) -> i64 {
    if x >= -9223372036854775808.0f && x < 9223372036854775808.0f {
        return i64(x);
    }
    if x > 0.0f {
        return 9223372036854775807li;
    }
    if x < 0.0f {
        return -9223372036854775807li - 1li;
    }
    return 0li;
}
"#;

/// Helpers for `f64` with `i64`.
const F64_I64: &str = r#"
fn i64_from_f64(x: f64) -> i64 {
    if x >= -9223372036854775808.0lf && x < 9223372036854775808.0lf {
        return i64(x);
    }
    if x > 0.0lf {
        return 9223372036854775807li;
    }
    if x < 0.0lf {
        return -9223372036854775807li - 1li;
    }
    return 0li;
}

// Rounded once to nearest, ties to even: the significand is rounded to 53 bits with
// integer arithmetic; converting it and scaling by a power of two are exact.
fn f64_from_i64(x: i64) -> f64 {
    let neg = x < 0li;
    let m = select(u64(x), 0lu - u64(x), neg);
    let hi = u32(m >> 32u);
    if hi < 0x200000u {
        // |x| < 2^53: exactly representable.
        return f64(x);
    }
    let k = 64u - countLeadingZeros(hi) - 53u;
    let q = m >> k;
    let rem = m & ((1lu << k) - 1lu);
    let halfway = 1lu << (k - 1u);
    let up = rem > halfway || (rem == halfway && (q & 1lu) == 1lu);
    let v = f64(q + select(0lu, 1lu, up)) * f64(1u << k);
    return select(v, -v, neg);
}
"#;

/// `unpack_f64` written with exact arithmetic: the value is scaled into [1, 2) by
/// powers of two (exact in the normal range), then its leading 30 bits are read off
/// with an exact conversion.
fn unpack_f64_arithmetic() -> String {
    let steps = [512, 256, 128, 64, 32, 16, 8, 4, 2, 1];
    let mut down = String::new();
    let mut up = String::new();
    for k in steps {
        down.push_str(&format!(
            "    if m >= 0x1p{k}lf {{\n        m = m * 0x1p-{k}lf;\n        e = e + {k};\n    }}\n"
        ));
        up.push_str(&format!(
            "    if m < 0x1p{}lf {{\n        m = m * 0x1p{k}lf;\n        e = e - {k};\n    }}\n",
            1 - k
        ));
    }
    format!(
        r#"
fn unpack_f64(x: f64) -> Unpacked {{
    if !(x == x) {{
        return Unpacked(KIND_NAN, false, 0u, false, 0);
    }}
    // f32(x) keeps the sign of every number, zeros included.
    let neg = x < 0.0lf || (x == 0.0lf && (bitcast<u32>(f32(x)) >> 31u) == 1u);
    var m = abs(x);
    if m == 0.0lf {{
        return Unpacked(KIND_ZERO, neg, 0u, false, 0);
    }}
    if m > 0x1.fffffffffffffp1023lf {{
        return Unpacked(KIND_INF, neg, 0u, false, 0);
    }}
    if m < 0x1p-1022lf {{
        // Far below half the smallest subnormal of any narrower format.
        return Unpacked(KIND_FINITE, neg, 0x20000000u, true, -1023);
    }}
    var e = 0i;
{down}{up}    let scaled = m * 0x1p29lf;
    let sig = u32(scaled);
    return Unpacked(KIND_FINITE, neg, sig, f64(sig) != scaled, e);
}}
"#
    )
}

/// What a shader's helpers must cover.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Needs {
    /// The shader handles `f64` values.
    pub f64: bool,
    /// The shader handles `i64` values.
    pub i64: bool,
    /// The device has `shaderInt64` (chooses how `f64` bits are reached).
    pub int64: bool,
}

/// The helper functions a shader with these needs may call.
pub(crate) fn helpers(needs: Needs) -> String {
    let mut text = String::from(COMMON);
    if needs.f64 {
        text.push_str(F64_COMMON);
        if needs.int64 {
            text.push_str(F64_BITS_INT64);
        } else {
            text.push_str(F64_BITS_ARITHMETIC);
            text.push_str(&unpack_f64_arithmetic());
        }
    }
    if needs.i64 {
        text.push_str(I64);
        if needs.f64 {
            text.push_str(F64_I64);
        }
    }
    text
}
