//! Row operations on `[rows, n]` tensors: softmax, cross-entropy, layer norm and their
//! gradients. One workgroup per row (rows beyond the launch loop), its invocations
//! striding over the columns and combining sums and maxima in workgroup memory.

use xpu_hal::ops::{Op, RawTensor};
use xpu_hal::{DType, Error, Result};

use super::wgsl::{compute_type, Repr};
use super::{check_pass, grid_loop, Check, Plan, GROUP};

/// Workgroup reductions in the computation type `c` (`wg_max` propagates NaN).
fn reductions(c: &str) -> String {
    let nan = if c == "f64" {
        "f64_from_bits(0u, 0x7FF80000u)"
    } else {
        "bitcast<f32>(0x7FC00000u)"
    };
    let is_nan = if c == "f64" { "is_nan_f64" } else { "is_nan32" };
    format!(
        r#"
var<workgroup> red: array<{c}, {GROUP}>;
var<workgroup> bad_flag: u32;

fn nan_max(a: {c}, b: {c}) -> {c} {{
    if {is_nan}(a) || {is_nan}(b) {{ return {nan}; }}
    return select(b, a, a > b);
}}

fn wg_sum(lid: u32, v: {c}) -> {c} {{
    red[lid] = v;
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s = s >> 1u) {{
        if lid < s {{ red[lid] = red[lid] + red[lid + s]; }}
        workgroupBarrier();
    }}
    let r = red[0];
    workgroupBarrier();
    return r;
}}

fn wg_max(lid: u32, v: {c}) -> {c} {{
    red[lid] = v;
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s = s >> 1u) {{
        if lid < s {{ red[lid] = nan_max(red[lid], red[lid + s]); }}
        workgroupBarrier();
    }}
    let r = red[0];
    workgroupBarrier();
    return r;
}}
"#,
        half = GROUP / 2
    )
}

/// The entry point: each workgroup takes rows `wid.x`, `wid.x + nwg.x`, …; `body` sees
/// `r` (the row) and `lid`. When a check pass found a bad label in tensor `checked`,
/// the first invocation stores it and every invocation returns.
fn row_main(rows: u64, body: &str, checked: Option<u32>) -> String {
    let store = checked.map_or(String::new(), |t| {
        format!(
            "if wid.x == 0u && lid == 0u {{ atomicStore(&P.err_val, bitcast<u32>(ld{t}(off({t}u, bad)))); }}"
        )
    });
    format!(
        r#"
@compute @workgroup_size({GROUP})
fn main(@builtin(local_invocation_id) lidv: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let lid = lidv.x;
    if lid == 0u {{ bad_flag = atomicLoad(&P.err_pos); }}
    let bad = workgroupUniformLoad(&bad_flag);
    if bad != 0xFFFFFFFFu {{
        {store}
        return;
    }}
    for (var r = wid.x; r < {rows}u; r = r + nwg.x) {{
        {body}
    }}
}}
"#
    )
}

/// The plan of a row operation.
pub(super) fn plan(op: &Op<RawTensor>) -> Result<Plan> {
    let first = op
        .operands()
        .first()
        .map(|o| o.tensor.layout)
        .ok_or_else(|| Error::invalid("an operation without operands"))?;
    let dtype = first.dtype;
    let (rows, n) = (first.dims()[0], first.dims()[1]);
    let c = compute_type(dtype);
    let mut p = Plan::new(dtype);
    let inf = if dtype == DType::F64 {
        "f64_from_bits(0u, 0x7FF00000u)"
    } else {
        "bitcast<f32>(0x7F800000u)"
    };
    // A strided loop over the row's columns.
    let cols = |inner: &str| format!("for (var j = lid; j < {n}u; j = j + {GROUP}u) {{ {inner} }}");
    let mut checked = None;
    let body = match op {
        Op::Softmax { x, y } => {
            let x = p.float(x, false);
            let y = p.float(y, true);
            format!(
                "var m = -{inf};
        {}
        m = wg_max(lid, m);
        var s = {c}(0.0);
        {}
        s = wg_sum(lid, s);
        {}",
                cols(&format!("m = nan_max(m, ld{x}(off2({x}u, r, j)));")),
                cols(&format!("s = s + exp(ld{x}(off2({x}u, r, j)) - m);")),
                cols(&format!(
                    "st{y}(off2({y}u, r, j), exp(ld{x}(off2({x}u, r, j)) - m) / s);"
                )),
            )
        }
        Op::SoftmaxBackward { y, dy, dx } => {
            let y = p.float(y, false);
            let dy = p.float(dy, false);
            let dx = p.float(dx, true);
            format!(
                "var d = {c}(0.0);
        {}
        d = wg_sum(lid, d);
        {}",
                cols(&format!(
                    "d = d + ld{dy}(off2({dy}u, r, j)) * ld{y}(off2({y}u, r, j));"
                )),
                cols(&format!(
                    "st{dx}(off2({dx}u, r, j), ld{y}(off2({y}u, r, j)) * (ld{dy}(off2({dy}u, r, j)) - d));"
                )),
            )
        }
        Op::CrossEntropy {
            logits,
            labels,
            loss,
        } => {
            let x = p.float(logits, false);
            let l = p.tensor(labels, false, Repr::Int);
            let o = p.float(loss, true);
            p.check = Some(Check::Label { classes: n });
            p.pass_1d(check_pass(l, rows, n, true), rows);
            checked = Some(l);
            format!(
                "var m = -{inf};
        {}
        m = wg_max(lid, m);
        var s = {c}(0.0);
        {}
        s = wg_sum(lid, s);
        let label = ld{l}(off({l}u, r));
        if lid == 0u {{
            var v = {c}(0.0);
            if label != -1 {{
                let lse = select(m + log(s), {inf}, m == {inf});
                v = lse - ld{x}(off2({x}u, r, u32(label)));
            }}
            st{o}(off({o}u, r), v);
        }}",
                cols(&format!("m = nan_max(m, ld{x}(off2({x}u, r, j)));")),
                cols(&format!("s = s + exp(ld{x}(off2({x}u, r, j)) - m);")),
            )
        }
        Op::CrossEntropyBackward {
            logits,
            labels,
            dloss,
            dlogits,
        } => {
            let x = p.float(logits, false);
            let l = p.tensor(labels, false, Repr::Int);
            let dl = p.float(dloss, false);
            let g = p.float(dlogits, true);
            p.check = Some(Check::Label { classes: n });
            p.pass_1d(check_pass(l, rows, n, true), rows);
            checked = Some(l);
            format!(
                "var m = -{inf};
        {}
        m = wg_max(lid, m);
        var s = {c}(0.0);
        {}
        s = wg_sum(lid, s);
        let label = ld{l}(off({l}u, r));
        let scale = ld{dl}(off({dl}u, r));
        {}",
                cols(&format!("m = nan_max(m, ld{x}(off2({x}u, r, j)));")),
                cols(&format!("s = s + exp(ld{x}(off2({x}u, r, j)) - m);")),
                cols(&format!(
                    "var v = {c}(0.0);
            if label != -1 {{
                let sm = exp(ld{x}(off2({x}u, r, j)) - m) / s;
                v = (sm - select({c}(0.0), {c}(1.0), u32(label) == j)) * scale;
            }}
            st{g}(off2({g}u, r, j), v);"
                )),
            )
        }
        Op::LayerNorm {
            x,
            gamma,
            beta,
            y,
            mean,
            rstd,
            eps,
        } => {
            let x = p.float(x, false);
            let g = p.float(gamma, false);
            let b = p.float(beta, false);
            let y = p.float(y, true);
            let mu = p.float(mean, true);
            let rs = p.float(rstd, true);
            let e = p.scalar_c(f64::from(*eps));
            format!(
                "var s = {c}(0.0);
        {}
        let mean = wg_sum(lid, s) / {c}({n}.0);
        var q = {c}(0.0);
        {}
        let rstd = 1.0 / sqrt(wg_sum(lid, q) / {c}({n}.0) + scc({e}u));
        {}
        if lid == 0u {{ st{mu}(off({mu}u, r), mean); st{rs}(off({rs}u, r), rstd); }}",
                cols(&format!("s = s + ld{x}(off2({x}u, r, j));")),
                cols(&format!(
                    "let d = ld{x}(off2({x}u, r, j)) - mean; q = q + d * d;"
                )),
                cols(&format!(
                    "st{y}(off2({y}u, r, j), (ld{x}(off2({x}u, r, j)) - mean) * rstd * ld{g}(off({g}u, j)) + ld{b}(off({b}u, j)));"
                )),
            )
        }
        Op::LayerNormBackward {
            x,
            gamma,
            mean,
            rstd,
            dy,
            dx,
            dgamma,
            dbeta,
        } => {
            let x = p.float(x, false);
            let g = p.float(gamma, false);
            let mu = p.float(mean, false);
            let rs = p.float(rstd, false);
            let dy = p.float(dy, false);
            let dx = p.float(dx, true);
            let dg = p.float(dgamma, true);
            let db = p.float(dbeta, true);
            // Per column: dgamma and dbeta summed over the rows (a second pass).
            let columns = format!(
                "var sg = {c}(0.0); var sb = {c}(0.0);
        for (var r = 0u; r < {rows}u; r = r + 1u) {{
            let xhat = (ld{x}(off2({x}u, r, n)) - ld{mu}(off({mu}u, r))) * ld{rs}(off({rs}u, r));
            let d = ld{dy}(off2({dy}u, r, n));
            sg = sg + d * xhat;
            sb = sb + d;
        }}
        st{dg}(off({dg}u, n), sg);
        st{db}(off({db}u, n), sb);"
            );
            let xhat = format!("(ld{x}(off2({x}u, r, j)) - mu) * rs");
            let dxhat = format!("ld{dy}(off2({dy}u, r, j)) * ld{g}(off({g}u, j))");
            let body = format!(
                "let mu = ld{mu}(off({mu}u, r)); let rs = ld{rs}(off({rs}u, r));
        var s1 = {c}(0.0); var s2 = {c}(0.0);
        {}
        let m1 = wg_sum(lid, s1) / {c}({n}.0);
        let m2 = wg_sum(lid, s2) / {c}({n}.0);
        {}",
                cols(&format!(
                    "let xh = {xhat}; let dh = {dxhat}; s1 = s1 + dh; s2 = s2 + dh * xh;"
                )),
                cols(&format!(
                    "let xh = {xhat}; let dh = {dxhat}; st{dx}(off2({dx}u, r, j), rs * (dh - m1 - xh * m2));"
                )),
            );
            p.pass_rows(
                format!("{}\n{}", reductions(c), row_main(rows, &body, None)),
                rows,
            );
            p.pass_1d(grid_loop(n, &columns), n);
            return Ok(p);
        }
        other => {
            return Err(Error::unsupported(format!(
                "{} is not a row operation",
                other.kind()
            )))
        }
    };
    p.pass_rows(
        format!("{}\n{}", reductions(c), row_main(rows, &body, checked)),
        rows,
    );
    Ok(p)
}
