//! Elementwise operations: ReLU and GELU with their gradients, bias add, dropout,
//! random numbers and the optimizer updates. One invocation per element (grid-stride),
//! each tensor addressed through its own strides.

use xpu_hal::ops::{Distribution, Op, RawTensor};
use xpu_hal::{DType, Error, Result};

use super::wgsl::Repr;
use super::{grid_loop, Plan};

/// Philox 4x32-10 and the stream of values of [`xpu_hal::ops::PhiloxStream`], with the
/// key in scalars `seed` and the first counter in scalar `offset`.
fn philox(seed: u32, offset: u32) -> String {
    format!(
        r#"
fn mulhilo(a: u32, b: u32) -> vec2<u32> {{
    let al = a & 0xFFFFu; let ah = a >> 16u; let bl = b & 0xFFFFu; let bh = b >> 16u;
    let ll = al * bl; let lh = al * bh; let hl = ah * bl; let hh = ah * bh;
    let mid = (ll >> 16u) + (lh & 0xFFFFu) + (hl & 0xFFFFu);
    return vec2<u32>(hh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u), (ll & 0xFFFFu) | (mid << 16u));
}}

fn philox_block(block: u32) -> vec4<u32> {{
    let lo = sc({offset}u) + block;
    let hi = sc_hi({offset}u) + select(0u, 1u, lo < block);
    var c0 = lo; var c1 = hi; var c2 = 0u; var c3 = 0u;
    var k0 = sc({seed}u); var k1 = sc_hi({seed}u);
    for (var round = 0u; round < 10u; round = round + 1u) {{
        if round > 0u {{ k0 = k0 + 0x9E3779B9u; k1 = k1 + 0xBB67AE85u; }}
        let p0 = mulhilo(0xD2511F53u, c0);
        let p1 = mulhilo(0xCD9E8D57u, c2);
        let n0 = p1.x ^ c1 ^ k0;
        let n2 = p0.x ^ c3 ^ k1;
        c0 = n0; c1 = p1.y; c2 = n2; c3 = p0.y;
    }}
    return vec4<u32>(c0, c1, c2, c3);
}}

fn philox_value(n: u32) -> u32 {{
    let b = philox_block(n / 4u);
    return b[n % 4u];
}}

fn uniform_bits(bits: u32) -> f32 {{ return f32(bits >> 8u) * (1.0 / 16777216.0); }}

fn normal(n: u32) -> f32 {{
    let b = philox_block(n / 4u);
    let lane = n % 4u;
    let pair = lane & 2u;
    let u1 = (f32(b[pair] >> 8u) + 1.0) / 16777216.0;
    let u2 = f32(b[pair + 1u] >> 8u) / 16777216.0;
    let r = sqrt(-2.0 * log(u1));
    let angle = 6.283185307179586 * u2;
    return select(r * sin(angle), r * cos(angle), (lane & 1u) == 0u);
}}
"#
    )
}

/// WGSL: whether raw element bits `v` of `dtype` are a NaN, and whether they are a
/// positive number (not zero, not negative, not NaN).
fn bit_tests(dtype: DType) -> String {
    let (nan, positive) = match dtype.size() {
        8 => (
            "let m = v.y & 0x7FFFFFFFu; return m > 0x7FF00000u || (m == 0x7FF00000u && v.x != 0u);",
            "return !is_nan_bits(v) && (v.y >> 31u) == 0u && (v.y != 0u || v.x != 0u);",
        ),
        4 => (
            "return (v.x & 0x7FFFFFFFu) > 0x7F800000u;",
            "return !is_nan_bits(v) && (v.x >> 31u) == 0u && v.x != 0u;",
        ),
        _ if dtype == DType::F16 => (
            "return (v.x & 0x7FFFu) > 0x7C00u;",
            "return !is_nan_bits(v) && (v.x >> 15u) == 0u && v.x != 0u;",
        ),
        _ => (
            "return (v.x & 0x7FFFu) > 0x7F80u;",
            "return !is_nan_bits(v) && (v.x >> 15u) == 0u && v.x != 0u;",
        ),
    };
    format!(
        "fn is_nan_bits(v: vec2<u32>) -> bool {{ {nan} }}\nfn is_positive_bits(v: vec2<u32>) -> bool {{ {positive} }}\n"
    )
}

/// GELU (tanh approximation) and its derivative, in the computation type `c`; the tanh
/// argument is clamped where tanh is ±1 in `f32` anyway, so that a driver's tanh never
/// sees a huge value.
fn gelu_fns(c: &str) -> String {
    format!(
        r#"
fn safe_tanh(z: f32) -> f32 {{
    if z > 12.0 {{ return 1.0; }}
    if z < -12.0 {{ return -1.0; }}
    return tanh(z);
}}
fn gelu(x: {c}) -> {c} {{
    let t = {c}(safe_tanh(f32(0.7978845608028654 * (x + 0.044715 * x * x * x))));
    return 0.5 * x * (1.0 + t);
}}
fn gelu_grad(x: {c}) -> {c} {{
    let t = {c}(safe_tanh(f32(0.7978845608028654 * (x + 0.044715 * x * x * x))));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}}
"#
    )
}

/// The plan of an elementwise operation.
pub(super) fn plan(op: &Op<RawTensor>) -> Result<Plan> {
    let dtype = op
        .operands()
        .first()
        .map(|o| o.tensor.layout.dtype)
        .unwrap_or(DType::F32);
    let c = super::wgsl::compute_type(dtype);
    let mut p = Plan::new(dtype);
    let (body, count, extra) = match op {
        Op::Relu { x, y } => {
            let x = p.tensor(x, false, Repr::Raw);
            let yl = y.layout.elements();
            let y = p.tensor(y, true, Repr::Raw);
            (
                format!(
                    "let v = rd{x}(off({x}u, n));
        wr{y}(off({y}u, n), select(vec2<u32>(0u, 0u), v, is_nan_bits(v) || is_positive_bits(v)));"
                ),
                yl,
                bit_tests(dtype),
            )
        }
        Op::ReluBackward { x, dy, dx } => {
            let count = x.layout.elements();
            let x = p.tensor(x, false, Repr::Raw);
            let dy = p.tensor(dy, false, Repr::Raw);
            let dx = p.tensor(dx, true, Repr::Raw);
            (
                format!(
                    "let v = rd{x}(off({x}u, n));
        let g = rd{dy}(off({dy}u, n));
        wr{dx}(off({dx}u, n), select(vec2<u32>(0u, 0u), g, is_positive_bits(v)));"
                ),
                count,
                bit_tests(dtype),
            )
        }
        Op::Gelu { x, y } => {
            let count = x.layout.elements();
            let x = p.float(x, false);
            let y = p.float(y, true);
            (
                format!("st{y}(off({y}u, n), gelu(ld{x}(off({x}u, n))));"),
                count,
                gelu_fns(c),
            )
        }
        Op::GeluBackward { x, dy, dx } => {
            let count = x.layout.elements();
            let x = p.float(x, false);
            let dy = p.float(dy, false);
            let dx = p.float(dx, true);
            (
                format!(
                    "st{dx}(off({dx}u, n), ld{dy}(off({dy}u, n)) * gelu_grad(ld{x}(off({x}u, n))));"
                ),
                count,
                gelu_fns(c),
            )
        }
        Op::BiasAdd { x, bias, y } => {
            let count = x.layout.elements();
            let cols = x.layout.dims()[1];
            let x = p.float(x, false);
            let b = p.float(bias, false);
            let y = p.float(y, true);
            (
                format!(
                    "st{y}(off({y}u, n), ld{x}(off({x}u, n)) + ld{b}(off({b}u, n % {cols}u)));"
                ),
                count,
                String::new(),
            )
        }
        Op::Dropout {
            x,
            y,
            p: prob,
            seed,
            offset,
        } => {
            let count = x.layout.elements();
            let x = p.float(x, false);
            let y = p.float(y, true);
            let s = p.scalar_bits(*seed);
            let o = p.scalar_bits(*offset);
            let prob_i = p.scalar_bits(u64::from(prob.to_bits()));
            let scale = p.scalar_c(1.0 / (1.0 - f64::from(*prob)));
            (
                format!(
                    "let keep = uniform_bits(philox_value(n)) >= scf({prob_i}u);
        let v = ld{x}(off({x}u, n));
        st{y}(off({y}u, n), select({c}(0.0), v * scc({scale}u), keep));"
                ),
                count,
                philox(s, o),
            )
        }
        Op::Random {
            y,
            dist,
            seed,
            offset,
        } => {
            let count = y.layout.elements();
            let bits = matches!(dist, Distribution::Bits);
            if bits != (y.layout.dtype == DType::I32) {
                return Err(Error::invalid(format!(
                    "random {dist:?} into a {} tensor",
                    y.layout.dtype
                )));
            }
            let yb = p.tensor(y, true, if bits { Repr::Raw } else { Repr::Float });
            let s = p.scalar_bits(*seed);
            let o = p.scalar_bits(*offset);
            let body = match dist {
                Distribution::Bits => {
                    format!("wr{yb}(off({yb}u, n), vec2<u32>(philox_value(n), 0u));")
                }
                Distribution::Uniform { low, high } => {
                    let lo = p.scalar_bits(u64::from(low.to_bits()));
                    let hi = p.scalar_bits(u64::from(high.to_bits()));
                    format!(
                        "let u = uniform_bits(philox_value(n));
        st{yb}(off({yb}u, n), {c}(scf({lo}u) + (scf({hi}u) - scf({lo}u)) * u));"
                    )
                }
                Distribution::Normal { mean, std } => {
                    let m = p.scalar_bits(u64::from(mean.to_bits()));
                    let sd = p.scalar_bits(u64::from(std.to_bits()));
                    format!("st{yb}(off({yb}u, n), {c}(scf({m}u) + scf({sd}u) * normal(n)));")
                }
            };
            (body, count, philox(s, o))
        }
        Op::SgdMomentum {
            param,
            grad,
            velocity,
            lr,
            momentum,
            weight_decay,
            nesterov,
        } => {
            let count = param.layout.elements();
            let pa = p.float(param, true);
            let g = p.float(grad, false);
            let v = p.float(velocity, true);
            let lr = p.scalar_c(f64::from(*lr));
            let mom = p.scalar_c(f64::from(*momentum));
            let wd = p.scalar_c(f64::from(*weight_decay));
            let step = if *nesterov {
                format!("gi + scc({mom}u) * vel")
            } else {
                "vel".to_string()
            };
            (
                format!(
                    "let po = off({pa}u, n); let vo = off({v}u, n);
        let pv = ld{pa}(po);
        let gi = ld{g}(off({g}u, n)) + scc({wd}u) * pv;
        let vel = scc({mom}u) * ld{v}(vo) + gi;
        st{v}(vo, vel);
        st{pa}(po, pv - scc({lr}u) * ({step}));"
                ),
                count,
                String::new(),
            )
        }
        Op::AdamW {
            param,
            grad,
            m,
            v,
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            step,
        } => {
            let count = param.layout.elements();
            let pa = p.float(param, true);
            let g = p.float(grad, false);
            let mt = p.float(m, true);
            let vt = p.float(v, true);
            let (b1, b2) = (f64::from(*beta1), f64::from(*beta2));
            let exp = i32::try_from(*step).unwrap_or(i32::MAX);
            let s_b1 = p.scalar_c(b1);
            let s_1b1 = p.scalar_c(1.0 - b1);
            let s_b2 = p.scalar_c(b2);
            let s_1b2 = p.scalar_c(1.0 - b2);
            let c1 = p.scalar_c(1.0 - b1.powi(exp));
            let c2 = p.scalar_c(1.0 - b2.powi(exp));
            let lr = p.scalar_c(f64::from(*lr));
            let eps = p.scalar_c(f64::from(*eps));
            let wd = p.scalar_c(f64::from(*weight_decay));
            (
                format!(
                    "let po = off({pa}u, n); let mo = off({mt}u, n); let vo = off({vt}u, n);
        let gi = ld{g}(off({g}u, n));
        let pv = ld{pa}(po);
        let mv = scc({s_b1}u) * ld{mt}(mo) + scc({s_1b1}u) * gi;
        let vv = scc({s_b2}u) * ld{vt}(vo) + scc({s_1b2}u) * gi * gi;
        st{mt}(mo, mv);
        st{vt}(vo, vv);
        let update = (mv / scc({c1}u)) / (sqrt(vv / scc({c2}u)) + scc({eps}u)) + scc({wd}u) * pv;
        st{pa}(po, pv - scc({lr}u) * update);"
                ),
                count,
                String::new(),
            )
        }
        other => {
            return Err(Error::unsupported(format!(
                "{} is not an elementwise operation",
                other.kind()
            )))
        }
    };
    p.pass_1d(format!("{extra}\n{}", grid_loop(count, &body)), count);
    Ok(p)
}
