//! Embedding gather and scatter-add: a check pass over the indices first (see the
//! parent module), then the copy or the sums.

use xpu_hal::ops::{Op, RawTensor};
use xpu_hal::{Error, Result};

use super::wgsl::Repr;
use super::{after_check, check_pass, grid_loop_after, Check, Plan};

/// The plan of a gather or a scatter-add.
pub(super) fn plan(op: &Op<RawTensor>) -> Result<Plan> {
    match op {
        Op::Gather {
            table,
            indices,
            out,
        } => {
            let (rows, dim) = (table.layout.dims()[0], table.layout.dims()[1]);
            let n = indices.layout.elements();
            let mut p = Plan::new(table.layout.dtype);
            let t = p.tensor(table, false, Repr::Raw);
            let i = p.tensor(indices, false, Repr::Int);
            let o = p.tensor(out, true, Repr::Raw);
            p.check = Some(Check::Index { rows });
            p.pass_1d(check_pass(i, n, rows, false), n);
            // One invocation per output element, bit for bit.
            let body = format!(
                "let r = n / {dim}u; let j = n % {dim}u;
        let row = u32(ld{i}(off({i}u, r)));
        wr{o}(off2({o}u, r, j), rd{t}(off2({t}u, row, j)));"
            );
            p.pass_1d(grid_loop_after(n * dim, &body, &after_check(i)), n * dim);
            Ok(p)
        }
        Op::ScatterAdd {
            src,
            indices,
            table,
        } => {
            let (rows, dim) = (table.layout.dims()[0], table.layout.dims()[1]);
            let n = indices.layout.elements();
            let mut p = Plan::new(table.layout.dtype);
            let s = p.float(src, false);
            let i = p.tensor(indices, false, Repr::Int);
            let t = p.float(table, true);
            p.check = Some(Check::Index { rows });
            p.pass_1d(check_pass(i, n, rows, false), n);
            // One invocation per column, adding the rows in order, so that repeated
            // indices add up without races.
            let body = format!(
                "for (var k = 0u; k < {n}u; k = k + 1u) {{
            let row = u32(ld{i}(off({i}u, k)));
            let at = off2({t}u, row, n);
            st{t}(at, ld{t}(at) + ld{s}(off2({s}u, k, n)));
        }}"
            );
            p.pass_1d(grid_loop_after(dim, &body, &after_check(i)), dim);
            Ok(p)
        }
        other => Err(Error::unsupported(format!(
            "{} is not an indexing operation",
            other.kind()
        ))),
    }
}
