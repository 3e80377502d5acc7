//! Reductions along one axis: one invocation per output element, looping along the
//! axis in order (sums in the computation type; max and min propagate NaN).

use xpu_hal::ops::{Op, RawTensor, ReduceOp};
use xpu_hal::{DType, Error, Result};

use super::wgsl::compute_type;
use super::{grid_loop, Plan};

/// The plan of a reduction.
pub(super) fn plan(op: &Op<RawTensor>) -> Result<Plan> {
    let Op::Reduce { x, y, op, axis } = op else {
        return Err(Error::unsupported(format!(
            "{} is not a reduction",
            op.kind()
        )));
    };
    let dtype = x.layout.dtype;
    let c = compute_type(dtype);
    let axis = *axis as usize;
    let len = x.layout.dims()[axis];
    let count = y.layout.elements();
    let mut p = Plan::new(dtype);
    let xt = p.float(x, false);
    let yt = p.float(y, true);
    let (nan, is_nan) = if dtype == DType::F64 {
        ("f64_from_bits(0u, 0x7FF80000u)", "is_nan_f64")
    } else {
        ("bitcast<f32>(0x7FC00000u)", "is_nan32")
    };
    let (init, step, finish) = match op {
        ReduceOp::Sum => ("0.0".to_string(), "acc = acc + v;", String::new()),
        ReduceOp::Mean => (
            "0.0".to_string(),
            "acc = acc + v;",
            format!("acc = acc / {c}({len}.0);"),
        ),
        ReduceOp::Max => (
            format!("ld{xt}(base_x)"),
            "if !nan_seen { if is_nan_c(v) { nan_seen = true; } else if v > acc { acc = v; } }",
            format!("if nan_seen {{ acc = {nan}; }}"),
        ),
        ReduceOp::Min => (
            format!("ld{xt}(base_x)"),
            "if !nan_seen { if is_nan_c(v) { nan_seen = true; } else if v < acc { acc = v; } }",
            format!("if nan_seen {{ acc = {nan}; }}"),
        ),
    };
    let body = format!(
        "let base_x = off_as({yt}u, {xt}u, n);
        var acc = {c}({init});
        var nan_seen = false;
        for (var k = 0u; k < {len}u; k = k + 1u) {{
            let v = ld{xt}(base_x + k * stride({xt}u, {axis}u));
            {step}
        }}
        {finish}
        st{yt}(off({yt}u, n), acc);"
    );
    let helper = format!("fn is_nan_c(v: {c}) -> bool {{ return {is_nan}(v); }}\n");
    p.pass_1d(format!("{helper}{}", grid_loop(count, &body)), count);
    Ok(p)
}
