//! The shape, dtype and parameter rules of each standard operation, checked without
//! touching memory (the stream adds bounds, device and aliasing checks).

use super::{Distribution, HasLayout, Layout, Op, OpKind};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Checks `op` against its operation's rules: ranks, shapes, dtypes, parameters, and
/// that every written tensor addresses each element once. The message names the
/// operation and the operand.
pub fn check<T: HasLayout>(op: &Op<T>) -> Result<()> {
    let kind = op.kind();
    let operands = op.operands();
    let main = operands[0].tensor.layout().dtype;
    if !kind.dtypes().contains(&main) {
        return Err(Error::unsupported(format!(
            "{kind} is not defined on {main} ({} is {main}); it takes {}",
            operands[0].name,
            names(kind.dtypes())
        )));
    }
    for o in &operands {
        if o.access.writes() && !o.tensor.layout().is_one_to_one() {
            return Err(Error::invalid(format!(
                "{kind}: {} ({}) addresses some elements more than once, and it is written; give it strides that step over every element (no stride 0 on a dimension longer than 1)",
                o.name,
                o.tensor.layout()
            )));
        }
    }
    let c = Checker { kind };
    match op {
        Op::Matmul {
            a,
            b,
            c: out,
            trans_a,
            trans_b,
            alpha,
            beta,
        } => {
            let (a, b, o) = (a.layout(), b.layout(), out.layout());
            c.same_dtype(&[("a", a), ("b", b), ("c", o)])?;
            c.finite("alpha", *alpha)?;
            c.finite("beta", *beta)?;
            let rank = a.rank();
            if !(2..=3).contains(&rank) || b.rank() != rank || o.rank() != rank {
                return Err(c.err(format!(
                    "a, b and c must all be matrices (rank 2) or all batches of matrices (rank 3); got {a}, {b} and {o}"
                )));
            }
            let m2 = |l: &Layout, t: bool| {
                let d = l.dims();
                let (r, k) = (d[rank - 2], d[rank - 1]);
                if t {
                    (k, r)
                } else {
                    (r, k)
                }
            };
            let (m, k) = m2(a, *trans_a);
            let (k2, n) = m2(b, *trans_b);
            let (cm, cn) = m2(o, false);
            if k != k2 || cm != m || cn != n {
                return Err(c.err(format!(
                    "op(a) is {m}×{k} and op(b) is {k2}×{n}, so c must be {m}×{n} with a's columns equal to b's rows; got a {a}{}, b {b}{}, c {o}",
                    if *trans_a { " (transposed)" } else { "" },
                    if *trans_b { " (transposed)" } else { "" },
                )));
            }
            if rank == 3 && (a.dims()[0] != o.dims()[0] || b.dims()[0] != o.dims()[0]) {
                return Err(c.err(format!(
                    "the batch dimension must agree: a has {}, b {}, c {} (broadcast with stride 0 instead of a batch of 1)",
                    a.dims()[0],
                    b.dims()[0],
                    o.dims()[0]
                )));
            }
        }
        Op::BiasAdd { x, bias, y } => {
            let (x, bias, y) = (x.layout(), bias.layout(), y.layout());
            c.same_dtype(&[("x", x), ("bias", bias), ("y", y)])?;
            let [_, n] = c.rows("x", x)?;
            c.same_shape(("x", x), ("y", y))?;
            c.shape("bias", bias, &[n])?;
        }
        Op::Relu { x, y } | Op::Gelu { x, y } => {
            let (x, y) = (x.layout(), y.layout());
            c.same_dtype(&[("x", x), ("y", y)])?;
            c.same_shape(("x", x), ("y", y))?;
        }
        Op::ReluBackward { x, dy, dx } | Op::GeluBackward { x, dy, dx } => {
            let (x, dy, dx) = (x.layout(), dy.layout(), dx.layout());
            c.same_dtype(&[("x", x), ("dy", dy), ("dx", dx)])?;
            c.same_shape(("x", x), ("dy", dy))?;
            c.same_shape(("x", x), ("dx", dx))?;
        }
        Op::Softmax { x, y } => {
            let (x, y) = (x.layout(), y.layout());
            c.same_dtype(&[("x", x), ("y", y)])?;
            c.rows("x", x)?;
            c.same_shape(("x", x), ("y", y))?;
        }
        Op::SoftmaxBackward { y, dy, dx } => {
            let (y, dy, dx) = (y.layout(), dy.layout(), dx.layout());
            c.same_dtype(&[("y", y), ("dy", dy), ("dx", dx)])?;
            c.rows("y", y)?;
            c.same_shape(("y", y), ("dy", dy))?;
            c.same_shape(("y", y), ("dx", dx))?;
        }
        Op::CrossEntropy {
            logits,
            labels,
            loss,
        } => {
            let (logits, labels, loss) = (logits.layout(), labels.layout(), loss.layout());
            c.same_dtype(&[("logits", logits), ("loss", loss)])?;
            c.dtype("labels", labels, DType::I32)?;
            let [rows, _] = c.rows("logits", logits)?;
            c.shape("labels", labels, &[rows])?;
            c.shape("loss", loss, &[rows])?;
        }
        Op::CrossEntropyBackward {
            logits,
            labels,
            dloss,
            dlogits,
        } => {
            let (logits, labels) = (logits.layout(), labels.layout());
            let (dloss, dlogits) = (dloss.layout(), dlogits.layout());
            c.same_dtype(&[("logits", logits), ("dloss", dloss), ("dlogits", dlogits)])?;
            c.dtype("labels", labels, DType::I32)?;
            let [rows, _] = c.rows("logits", logits)?;
            c.shape("labels", labels, &[rows])?;
            c.shape("dloss", dloss, &[rows])?;
            c.same_shape(("logits", logits), ("dlogits", dlogits))?;
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
            let (x, gamma, beta, y) = (x.layout(), gamma.layout(), beta.layout(), y.layout());
            c.same_dtype(&[("x", x), ("gamma", gamma), ("beta", beta), ("y", y)])?;
            let [rows, n] = c.rows("x", x)?;
            c.same_shape(("x", x), ("y", y))?;
            c.shape("gamma", gamma, &[n])?;
            c.shape("beta", beta, &[n])?;
            let stats = stats_dtype(x.dtype);
            for (name, l) in [("mean", mean.layout()), ("rstd", rstd.layout())] {
                c.dtype(name, l, stats)?;
                c.shape(name, l, &[rows])?;
            }
            if !(eps.is_finite() && *eps >= 0.0) {
                return Err(c.err(format!("eps is {eps}; give a finite value ≥ 0")));
            }
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
            let (x, gamma, dy, dx) = (x.layout(), gamma.layout(), dy.layout(), dx.layout());
            let (dgamma, dbeta) = (dgamma.layout(), dbeta.layout());
            c.same_dtype(&[
                ("x", x),
                ("gamma", gamma),
                ("dy", dy),
                ("dx", dx),
                ("dgamma", dgamma),
                ("dbeta", dbeta),
            ])?;
            let [rows, n] = c.rows("x", x)?;
            c.same_shape(("x", x), ("dy", dy))?;
            c.same_shape(("x", x), ("dx", dx))?;
            for (name, l) in [("gamma", gamma), ("dgamma", dgamma), ("dbeta", dbeta)] {
                c.shape(name, l, &[n])?;
            }
            let stats = stats_dtype(x.dtype);
            for (name, l) in [("mean", mean.layout()), ("rstd", rstd.layout())] {
                c.dtype(name, l, stats)?;
                c.shape(name, l, &[rows])?;
            }
        }
        Op::Gather {
            table,
            indices,
            out,
        } => {
            let (table, indices, out) = (table.layout(), indices.layout(), out.layout());
            c.same_dtype(&[("table", table), ("out", out)])?;
            c.dtype("indices", indices, DType::I32)?;
            let [_, dim] = c.rows("table", table)?;
            let [n] = c.vector("indices", indices)?;
            c.shape("out", out, &[n, dim])?;
        }
        Op::ScatterAdd {
            src,
            indices,
            table,
        } => {
            let (src, indices, table) = (src.layout(), indices.layout(), table.layout());
            c.same_dtype(&[("src", src), ("table", table)])?;
            c.dtype("indices", indices, DType::I32)?;
            let [_, dim] = c.rows("table", table)?;
            let [n] = c.vector("indices", indices)?;
            c.shape("src", src, &[n, dim])?;
        }
        Op::Reduce { x, y, axis, .. } => {
            let (x, y) = (x.layout(), y.layout());
            c.same_dtype(&[("x", x), ("y", y)])?;
            let axis = *axis as usize;
            if axis >= x.rank() {
                return Err(c.err(format!(
                    "axis {axis} does not exist in x ({x}), which has {} dimensions",
                    x.rank()
                )));
            }
            let mut want = x.dims().to_vec();
            want[axis] = 1;
            c.shape("y", y, &want)?;
        }
        Op::SgdMomentum {
            param,
            grad,
            velocity,
            lr,
            momentum,
            weight_decay,
            ..
        } => {
            let (p, g, v) = (param.layout(), grad.layout(), velocity.layout());
            c.same_dtype(&[("param", p), ("grad", g), ("velocity", v)])?;
            c.same_shape(("param", p), ("grad", g))?;
            c.same_shape(("param", p), ("velocity", v))?;
            c.finite("lr", *lr)?;
            c.finite("momentum", *momentum)?;
            c.finite("weight_decay", *weight_decay)?;
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
            let (p, g, m, v) = (param.layout(), grad.layout(), m.layout(), v.layout());
            c.same_dtype(&[("param", p), ("grad", g), ("m", m), ("v", v)])?;
            c.same_shape(("param", p), ("grad", g))?;
            c.same_shape(("param", p), ("m", m))?;
            c.same_shape(("param", p), ("v", v))?;
            c.finite("lr", *lr)?;
            c.finite("weight_decay", *weight_decay)?;
            for (name, b) in [("beta1", *beta1), ("beta2", *beta2)] {
                if !(0.0..1.0).contains(&b) {
                    return Err(c.err(format!("{name} is {b}; it must lie in [0, 1)")));
                }
            }
            if !(eps.is_finite() && *eps > 0.0) {
                return Err(c.err(format!("eps is {eps}; give a finite value > 0")));
            }
            if *step == 0 {
                return Err(c.err("step is 0; steps count from 1 (the first update is step 1)"));
            }
        }
        Op::Random { y, dist, .. } => {
            let y = y.layout();
            match dist {
                Distribution::Bits => c.dtype("y", y, DType::I32)?,
                Distribution::Uniform { low, high } => {
                    c.float("y", y)?;
                    c.finite("low", *low)?;
                    c.finite("high", *high)?;
                    if low > high {
                        return Err(c.err(format!(
                            "uniform bounds [{low}, {high}) are reversed; give low ≤ high"
                        )));
                    }
                }
                Distribution::Normal { mean, std } => {
                    c.float("y", y)?;
                    c.finite("mean", *mean)?;
                    if !(std.is_finite() && *std >= 0.0) {
                        return Err(c.err(format!("std is {std}; give a finite value ≥ 0")));
                    }
                }
            }
        }
        Op::Dropout { x, y, p, .. } => {
            let (x, y) = (x.layout(), y.layout());
            c.same_dtype(&[("x", x), ("y", y)])?;
            c.same_shape(("x", x), ("y", y))?;
            if !(0.0..1.0).contains(p) {
                return Err(c.err(format!("p is {p}; the drop probability must lie in [0, 1)")));
            }
        }
    }
    Ok(())
}

/// The dtype of layer norm's `mean` and `rstd` for input dtype `x`.
pub(crate) fn stats_dtype(x: DType) -> DType {
    if x == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

fn names(dtypes: &[DType]) -> String {
    dtypes
        .iter()
        .map(|d| d.name())
        .collect::<Vec<_>>()
        .join(", ")
}

struct Checker {
    kind: OpKind,
}

impl Checker {
    fn err(&self, message: impl std::fmt::Display) -> Error {
        Error::invalid(format!("{}: {message}", self.kind))
    }

    fn same_dtype(&self, tensors: &[(&str, &Layout)]) -> Result<()> {
        let (first, l0) = tensors[0];
        for (name, l) in &tensors[1..] {
            if l.dtype != l0.dtype {
                return Err(self.err(format!(
                    "{name} is {} but {first} is {}; the operation's float tensors share one dtype",
                    l.dtype, l0.dtype
                )));
            }
        }
        Ok(())
    }

    fn dtype(&self, name: &str, l: &Layout, want: DType) -> Result<()> {
        if l.dtype != want {
            return Err(self.err(format!("{name} must be {want}, not {}", l.dtype)));
        }
        Ok(())
    }

    fn float(&self, name: &str, l: &Layout) -> Result<()> {
        if !l.dtype.is_float() {
            return Err(self.err(format!(
                "{name} is {}; this distribution needs a float dtype (bits go to i32)",
                l.dtype
            )));
        }
        Ok(())
    }

    fn finite(&self, name: &str, v: f32) -> Result<()> {
        if !v.is_finite() {
            return Err(self.err(format!("{name} is {v}; give a finite value")));
        }
        Ok(())
    }

    fn rows(&self, name: &str, l: &Layout) -> Result<[u64; 2]> {
        match *l.dims() {
            [r, n] => Ok([r, n]),
            _ => Err(self.err(format!(
                "{name} must be [rows, n] (rank 2), not {l}; view higher ranks as rows"
            ))),
        }
    }

    fn vector(&self, name: &str, l: &Layout) -> Result<[u64; 1]> {
        match *l.dims() {
            [n] => Ok([n]),
            _ => Err(self.err(format!("{name} must be a vector (rank 1), not {l}"))),
        }
    }

    fn shape(&self, name: &str, l: &Layout, want: &[u64]) -> Result<()> {
        if l.dims() != want {
            return Err(self.err(format!(
                "{name} must have shape {want:?}, not {:?}",
                l.dims()
            )));
        }
        Ok(())
    }

    fn same_shape(&self, (na, a): (&str, &Layout), (nb, b): (&str, &Layout)) -> Result<()> {
        if a.dims() != b.dims() {
            return Err(self.err(format!(
                "{nb} has shape {:?} but {na} has {:?}; they must agree",
                b.dims(),
                a.dims()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::ReduceOp;

    fn l(dims: &[u64]) -> Layout {
        Layout::contiguous(DType::F32, dims).unwrap()
    }

    #[test]
    fn matmul_shapes() {
        let ok = Op::Matmul {
            a: l(&[2, 3]),
            b: l(&[3, 4]),
            c: l(&[2, 4]),
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
        };
        check(&ok).unwrap();
        let t = Op::Matmul {
            a: l(&[3, 2]),
            b: l(&[4, 3]),
            c: l(&[2, 4]),
            trans_a: true,
            trans_b: true,
            alpha: 1.0,
            beta: 0.0,
        };
        check(&t).unwrap();
        let bad = Op::Matmul {
            a: l(&[2, 3]),
            b: l(&[4, 3]),
            c: l(&[2, 4]),
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
        };
        let e = check(&bad).unwrap_err().to_string();
        assert!(e.contains("matmul") && e.contains("op(b) is 4×3"), "{e}");
    }

    #[test]
    fn written_broadcasts_and_bad_params_are_refused() {
        let bcast = Layout::strided(DType::F32, &[4, 4], &[0, 1]).unwrap();
        let e = check(&Op::Relu {
            x: l(&[4, 4]),
            y: bcast,
        })
        .unwrap_err();
        assert!(e.to_string().contains("more than once"), "{e}");
        check(&Op::Relu {
            x: bcast,
            y: l(&[4, 4]),
        })
        .unwrap();
        let e = check(&Op::Dropout {
            x: l(&[4]),
            y: l(&[4]),
            p: 1.0,
            seed: 0,
            offset: 0,
        })
        .unwrap_err();
        assert!(e.to_string().contains("[0, 1)"), "{e}");
        let e = check(&Op::Reduce {
            x: l(&[2, 3]),
            y: l(&[2]),
            op: ReduceOp::Sum,
            axis: 1,
        })
        .unwrap_err();
        assert!(e.to_string().contains("[2, 1]"), "{e}");
        let ints = Layout::contiguous(DType::I32, &[4]).unwrap();
        let e = check(&Op::Relu { x: ints, y: ints }).unwrap_err();
        assert!(e.to_string().contains("not defined on i32"), "{e}");
    }
}
