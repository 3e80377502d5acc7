//! Matrix multiply, tiled in workgroup memory with a register micro-tile.
//!
//! A workgroup of [`WG`]×[`WG`] invocations computes a [`BM`]×[`BN`] tile of `c`: each
//! invocation accumulates a [`TM`]×[`TN`] micro-tile in registers (rows `TM·l.y …` and
//! columns `TN·l.x …` of the tile). `K` is staged through workgroup memory [`KC`] at a
//! time (half as many for `f64`), every invocation loading its share of the `a` and `b`
//! chunks; the chunks are kept as `vec4`s along the tile's rows and columns, so that
//! each step of the inner loop reads `(TM + TN) / 4` vectors for `TM·TN`
//! multiply-adds. Two barriers per chunk: on a CPU driver such as lavapipe, which runs
//! a workgroup's invocations as SIMD threads switched at every barrier, few barriers
//! and few reads of workgroup memory per multiply-add are what count. Accumulation is in the computation type (`f32`, or `f64`
//! for `f64`); batches run along z (a batch stride may be 0); transposes are strides.
//!
//! Sizes, strides, `alpha`, `beta` and whether `beta` is 0 (then `c` is not read) are
//! parameters, so there is one pipeline per dtype whatever the shape.

use std::fmt::Write;

use xpu_hal::ops::{HasLayout, Op};
use xpu_hal::{DType, Error, Result};

use super::wgsl::compute_type;
use super::{u32_of, Pass, Plan, MAX_GROUPS};

/// Invocations along each side of the workgroup.
const WG: u32 = 8;
/// Rows of the micro-tile (a multiple of 4: read from workgroup memory as `vec4`s).
const TM: u32 = 8;
/// Columns of the micro-tile (a multiple of 4).
const TN: u32 = 8;
/// Rows of the workgroup's tile.
const BM: u32 = WG * TM;
/// Columns of the workgroup's tile.
const BN: u32 = WG * TN;
/// Columns of `op(a)` (rows of `op(b)`) per chunk staged in workgroup memory (half
/// of it for `f64`).
const KC: u32 = 16;
/// Invocations per workgroup.
const INVOCATIONS: u32 = WG * WG;

/// (batch stride, row stride, column stride) of a rank-2 or rank-3 tensor, swapping
/// the last two when `trans`.
fn strides(t: &impl HasLayout, trans: bool) -> Result<[u32; 3]> {
    let s = t.layout().strides();
    let r = s.len();
    let batch = if r == 3 { s[0] } else { 0 };
    let (row, col) = if trans {
        (s[r - 1], s[r - 2])
    } else {
        (s[r - 2], s[r - 1])
    };
    Ok([
        u32_of(batch, "a batch stride")?,
        u32_of(row, "a stride")?,
        u32_of(col, "a stride")?,
    ])
}

/// The plan of a matrix multiply.
pub(super) fn plan<T: HasLayout + Clone>(op: &Op<T>) -> Result<Plan<T>> {
    let Op::Matmul {
        a,
        b,
        c,
        trans_a,
        trans_b,
        alpha,
        beta,
    } = op
    else {
        return Err(Error::unsupported(format!("{} is not a matmul", op.kind())));
    };
    let lc = *c.layout();
    let dtype = lc.dtype;
    let ct = compute_type(dtype);
    let rank = lc.rank();
    let batch = if rank == 3 { lc.dims()[0] } else { 1 };
    let (m, n) = (lc.dims()[rank - 2], lc.dims()[rank - 1]);
    let la = a.layout();
    let k = if *trans_a {
        la.dims()[rank - 2]
    } else {
        la.dims()[rank - 1]
    };
    let [ab, ai, aq] = strides(a, *trans_a)?;
    let [bb, bq, bj] = strides(b, *trans_b)?;
    let [cb, ci, cj] = strides(c, false)?;
    let groups = [n.div_ceil(u64::from(BN)), m.div_ceil(u64::from(BM)), batch];
    if groups.iter().any(|&g| g > MAX_GROUPS) {
        return Err(Error::unsupported(format!(
            "a matmul of {m}×{n} (batch {batch}) needs more workgroups than the Vulkan backend launches"
        )));
    }
    // Workgroup memory: (BM + BN)·kc values, 8 KiB in f32 and in f64.
    let kc: u32 = if dtype == DType::F64 { KC / 2 } else { KC };
    let mut p = Plan::new(dtype);
    let at = p.float(a, false);
    let bt = p.float(b, false);
    let ctn = p.float(c, true);
    let alpha_i = p.scalar_c(f64::from(*alpha));
    let beta_i = p.scalar_c(f64::from(*beta));
    let beta_zero = p.scalar_bits(u64::from(*beta == 0.0));
    // Sizes and strides as parameters, so that one pipeline serves every shape.
    let mut sizes = [0u32; 12];
    for (slot, v) in sizes.iter_mut().zip([
        u32_of(m, "M")?,
        u32_of(n, "N")?,
        u32_of(k, "K")?,
        ab,
        ai,
        aq,
        bb,
        bq,
        bj,
        cb,
        ci,
        cj,
    ]) {
        *slot = p.scalar_bits(u64::from(v));
    }
    let [m_i, n_i, k_i, ab, ai, aq, bb, bq, bj, cb, ci, cj] = sizes;
    let lanes = ["x", "y", "z", "w"];
    let (va, vb) = (TM / 4, TN / 4);
    let mut step = String::new();
    for v in 0..va {
        let _ = writeln!(
            step,
            "            let a{v} = sa[q * {}u + l.y * {va}u + {v}u];",
            BM / 4
        );
    }
    for v in 0..vb {
        let _ = writeln!(
            step,
            "            let b{v} = sb[q * {}u + l.x * {vb}u + {v}u];",
            BN / 4
        );
    }
    for r in 0..TM {
        for v in 0..vb {
            let _ = writeln!(
                step,
                "            acc{r}_{v} = acc{r}_{v} + a{}.{} * b{v};",
                r / 4,
                lanes[(r % 4) as usize]
            );
        }
    }
    let mut accs = String::new();
    for r in 0..TM {
        for v in 0..vb {
            let _ = writeln!(accs, "    var acc{r}_{v} = vec4<{ct}>({ct}(0.0));");
        }
    }
    let mut store = String::new();
    for r in 0..TM {
        let _ = writeln!(
            store,
            "    {{
        let i = i0 + l.y * {TM}u + {r}u;
        if i < m {{"
        );
        for s in 0..TN {
            let _ = writeln!(
                store,
                "            if j + {s}u < n {{ out(z * cb + i * ci + (j + {s}u) * cj, acc{r}_{}.{}); }}",
                s / 4,
                lanes[(s % 4) as usize]
            );
        }
        let _ = writeln!(store, "        }}\n    }}");
    }
    let a_loads = BM * kc / INVOCATIONS;
    let b_loads = BN * kc / INVOCATIONS;
    let body = format!(
        r#"
var<workgroup> sa: array<vec4<{ct}>, {sa_len}>;
var<workgroup> sb: array<vec4<{ct}>, {sb_len}>;
var<workgroup> k_shared: u32;

fn out(o: u32, v: {ct}) {{
    if sc({beta_zero}u) != 0u {{
        st{ctn}(o, scc({alpha_i}u) * v);
    }} else {{
        st{ctn}(o, scc({alpha_i}u) * v + scc({beta_i}u) * ld{ctn}(o));
    }}
}}

@compute @workgroup_size({WG}, {WG})
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(workgroup_id) w: vec3<u32>) {{
    let m = sc({m_i}u);
    let n = sc({n_i}u);
    let kk = sc({k_i}u);
    let ai = sc({ai}u);
    let aq = sc({aq}u);
    let bq = sc({bq}u);
    let bj = sc({bj}u);
    let cb = sc({cb}u);
    let ci = sc({ci}u);
    let cj = sc({cj}u);
    let z = w.z;
    let i0 = w.y * {BM}u;
    let j = w.x * {BN}u + l.x * {TN}u;
    let a0 = z * sc({ab}u);
    let b0 = z * sc({bb}u);
{accs}
    if li == 0u {{ k_shared = kk; }}
    let kdim = workgroupUniformLoad(&k_shared);
    for (var t = 0u; t < kdim; t = t + {kc}u) {{
        for (var e = 0u; e < {a_loads}u; e = e + 1u) {{
            let x = li + e * {INVOCATIONS}u;
            let r = x / {kc}u;
            let q = x % {kc}u;
            let gi = i0 + r;
            let gq = t + q;
            var v = {ct}(0.0);
            if gi < m && gq < kk {{ v = ld{at}(a0 + gi * ai + gq * aq); }}
            sa[q * {BM4}u + r / 4u][r % 4u] = v;
        }}
        for (var e = 0u; e < {b_loads}u; e = e + 1u) {{
            let x = li + e * {INVOCATIONS}u;
            let q = x / {BN}u;
            let s = x % {BN}u;
            let gj = w.x * {BN}u + s;
            let gq = t + q;
            var v = {ct}(0.0);
            if gq < kk && gj < n {{ v = ld{bt}(b0 + gq * bq + gj * bj); }}
            sb[q * {BN4}u + s / 4u][s % 4u] = v;
        }}
        workgroupBarrier();
        for (var q = 0u; q < {kc}u; q = q + 1u) {{
{step}        }}
        workgroupBarrier();
    }}
{store}}}
"#,
        sa_len = BM * kc / 4,
        sb_len = BN * kc / 4,
        BM4 = BM / 4,
        BN4 = BN / 4,
    );
    p.passes.push(Pass {
        body,
        groups: [groups[0] as u32, groups[1] as u32, groups[2] as u32],
    });
    Ok(p)
}
