//! Matrix multiply: 16×16 output tiles per workgroup, `a` and `b` staged through
//! workgroup memory 16 columns of `K` at a time, accumulated in the computation type
//! (`f32`, or `f64` for `f64`); batches along z (a batch stride may be 0).

use xpu_hal::ops::{Op, RawTensor};
use xpu_hal::{Error, Result};

use super::wgsl::compute_type;
use super::{u32_of, Pass, Plan, MAX_GROUPS};

/// The tile edge.
const TILE: u64 = 16;

/// (batch stride, row stride, column stride) of a rank-2 or rank-3 tensor, swapping
/// the last two when `trans`.
fn strides(t: &RawTensor, trans: bool) -> Result<[u32; 3]> {
    let s = t.layout.strides();
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
pub(super) fn plan(op: &Op<RawTensor>) -> Result<Plan> {
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
    let dtype = c.layout.dtype;
    let ct = compute_type(dtype);
    let lc = c.layout;
    let rank = lc.rank();
    let batch = if rank == 3 { lc.dims()[0] } else { 1 };
    let (m, n) = (lc.dims()[rank - 2], lc.dims()[rank - 1]);
    let k = if *trans_a {
        a.layout.dims()[rank - 2]
    } else {
        a.layout.dims()[rank - 1]
    };
    let [ab, ai, aq] = strides(a, *trans_a)?;
    let [bb, bq, bj] = strides(b, *trans_b)?;
    let [cb, ci, cj] = strides(c, false)?;
    let groups = [n.div_ceil(TILE), m.div_ceil(TILE), batch];
    if groups.iter().any(|&g| g > MAX_GROUPS) {
        return Err(Error::unsupported(format!(
            "a matmul of {m}×{n} (batch {batch}) needs more workgroups than the Vulkan backend launches"
        )));
    }
    let mut p = Plan::new(dtype);
    let at = p.float(a, false);
    let bt = p.float(b, false);
    let ctn = p.float(c, true);
    let alpha_i = p.scalar_c(f64::from(*alpha));
    let beta_i = p.scalar_c(f64::from(*beta));
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
    let [m, n, k, ab, ai, aq, bb, bq, bj, cb, ci, cj] = sizes.map(|i| format!("sc({i}u)"));
    let result = if *beta == 0.0 {
        format!("scc({alpha_i}u) * acc")
    } else {
        format!("scc({alpha_i}u) * acc + scc({beta_i}u) * ld{ctn}(o)")
    };
    let body = format!(
        r#"
var<workgroup> tile_a: array<array<{ct}, {TILE}>, {TILE}>;
var<workgroup> tile_b: array<array<{ct}, {TILE}>, {TILE}>;
var<workgroup> k_shared: u32;

@compute @workgroup_size({TILE}, {TILE})
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {{
    let i = w.y * {TILE}u + l.y;
    let j = w.x * {TILE}u + l.x;
    let z = w.z;
    var acc = {ct}(0.0);
    if l.x == 0u && l.y == 0u {{ k_shared = {k}; }}
    let kdim = workgroupUniformLoad(&k_shared);
    for (var t = 0u; t < kdim; t = t + {TILE}u) {{
        let qa = t + l.x;
        var va = {ct}(0.0);
        if i < {m} && qa < {k} {{ va = ld{at}(z * {ab} + i * {ai} + qa * {aq}); }}
        tile_a[l.y][l.x] = va;
        let qb = t + l.y;
        var vb = {ct}(0.0);
        if qb < {k} && j < {n} {{ vb = ld{bt}(z * {bb} + qb * {bq} + j * {bj}); }}
        tile_b[l.y][l.x] = vb;
        workgroupBarrier();
        for (var q = 0u; q < {TILE}u; q = q + 1u) {{
            acc = acc + tile_a[l.y][q] * tile_b[q][l.x];
        }}
        workgroupBarrier();
    }}
    if i < {m} && j < {n} {{
        let o = z * {cb} + i * {ci} + j * {cj};
        st{ctn}(o, {result});
    }}
}}
"#
    );
    p.passes.push(Pass {
        body,
        groups: [groups[0] as u32, groups[1] as u32, groups[2] as u32],
    });
    Ok(p)
}
