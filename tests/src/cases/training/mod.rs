//! The `training` profile: every standard operation ([`xpu_hal::ops`]) the device
//! lists, against the reference ([`xpu_hal::reference::ops`]), on every dtype it claims
//! for it; an operation it does not list is a skip naming it.
//!
//! Each case runs a set of trials ([`trial`]): shapes with dimensions of 1, odd sizes,
//! a large size, non-contiguous layouts (padded rows, transposed views, gapped
//! outputs), offsets into the allocation, and, where the operation defines what they
//! give, NaN, infinities, −0 and subnormal inputs. Tolerances are per dtype
//! ([`trial::Tolerance`]); copies and selections (gather, ReLU, random bits) must be
//! bit-exact. `training.refusals` checks the errors: shapes, dtypes, overlaps, bad
//! parameters, out-of-range indices (a stream error naming the position, with nothing
//! written) and empty tensors (nothing done).

mod inputs;
mod refusals;
use refusals::refusals;
pub(crate) mod trial;

use xpu_hal::ops::{Distribution, Layout, Op, OpKind, ReduceOp};
use xpu_hal::{DType, Stream};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome, Profile};
use inputs::{contiguous, gapped, labels, padded_rows, positive, signed, with_specials, Gen};
use trial::{run_trial, Spec, Tolerance};

macro_rules! training_cases {
    ($($name:literal, $what:literal, $run:ident;)*) => {
        /// The cases of the `training` profile.
        pub(crate) const CASES: &[Case] = &[
            $(Case {
                name: concat!("training.", $name),
                profile: Profile::Training,
                description: $what,
                run: $run,
                exclusive: false,
            },)*
        ];
    };
}

training_cases! {
    "matmul", "matmul against the reference: 1×1×1, odd sizes, all four transpose combinations, padded leading dimensions, batches with a broadcast operand, beta 0 over NaN and beta 1 accumulating, a large product, specials", matmul;
    "bias_add", "bias add over rows against the reference, including a single column, padded rows and specials", bias_add;
    "relu", "ReLU forward bit-exact (NaN kept, −0 and negatives to 0) over odd, large, rank-4 and strided shapes", relu;
    "relu_backward", "ReLU backward bit-exact: the gradient where x > 0, else 0", relu_backward;
    "gelu", "GELU (tanh approximation) forward within tolerance, with NaN, −0 and subnormal inputs", gelu;
    "gelu_backward", "GELU backward within tolerance of the derivative of the formula", gelu_backward;
    "softmax", "softmax of rows against the reference: one column, wide rows, padded rows, ±inf and NaN in rows", softmax;
    "softmax_backward", "softmax backward against the reference", softmax_backward;
    "cross_entropy", "softmax cross-entropy loss per row against the reference, ignored rows (label −1) giving 0", cross_entropy;
    "cross_entropy_backward", "cross-entropy gradient against the reference, ignored rows zero", cross_entropy_backward;
    "layer_norm", "layer norm forward with its row means and reciprocal deviations against the reference", layer_norm;
    "layer_norm_backward", "layer norm backward (dx, dgamma, dbeta) against the reference", layer_norm_backward;
    "gather", "embedding gather bit-exact for every dtype, repeated indices, one-column tables, a large table", gather;
    "scatter_add", "embedding scatter-add with repeated indices adding up, against the reference", scatter_add;
    "reduce", "sum, mean, max and min along every axis against the reference, NaN propagating through max and min", reduce;
    "sgd_momentum", "SGD with momentum, weight decay and Nesterov over several steps against the reference", sgd_momentum;
    "adamw", "AdamW over several steps with bias correction and decoupled weight decay against the reference", adamw;
    "random", "Philox 4x32-10 bits bit-exact for seeds and offsets (a later call continuing a stream), uniform and normal within tolerance", random;
    "dropout", "dropout keeps exactly the elements the Philox uniforms say and scales them by 1/(1−p)", dropout;
    "refusals", "wrong shapes, dtypes, strides, overlaps and parameters are refused naming the operand; out-of-range indices and labels fail the stream naming the position with nothing written; empty tensors do nothing", refusals;
}

/// The dtypes the device lists for `kind`, or a skip naming the operation.
pub(crate) fn listed(ctx: &CaseContext, kind: OpKind) -> Result<Vec<DType>, CaseError> {
    let dtypes: Vec<DType> = ctx
        .device
        .capabilities()
        .ops
        .iter()
        .find(|s| s.kind == kind)
        .map(|s| s.dtypes.clone())
        .unwrap_or_default();
    if dtypes.is_empty() {
        Err(CaseError::skip(format!(
            "device does not list the standard operation {kind}"
        )))
    } else {
        Ok(dtypes)
    }
}

/// The trials of one operation on one dtype: (what, operation) pairs.
pub(crate) type Trials = Result<Vec<(String, Op<Spec>)>, CaseError>;

/// Makes the trials of one operation for a dtype.
pub(crate) type TrialsFn = fn(DType, &mut Gen) -> Trials;

/// The trials of each operation, in the order of [`OpKind::ALL`].
pub(crate) fn trials_of(kind: OpKind) -> TrialsFn {
    match kind {
        OpKind::Matmul => matmul_trials,
        OpKind::BiasAdd => bias_add_trials,
        OpKind::Relu => relu_trials,
        OpKind::ReluBackward => relu_backward_trials,
        OpKind::Gelu => gelu_trials,
        OpKind::GeluBackward => gelu_backward_trials,
        OpKind::Softmax => softmax_trials,
        OpKind::SoftmaxBackward => softmax_backward_trials,
        OpKind::CrossEntropy => cross_entropy_trials,
        OpKind::CrossEntropyBackward => cross_entropy_backward_trials,
        OpKind::LayerNorm => layer_norm_trials,
        OpKind::LayerNormBackward => layer_norm_backward_trials,
        OpKind::Gather => gather_trials,
        OpKind::ScatterAdd => scatter_add_trials,
        OpKind::Reduce => reduce_trials,
        OpKind::SgdMomentum => sgd_momentum_trials,
        OpKind::AdamW => adamw_trials,
        OpKind::Random => random_trials,
        OpKind::Dropout => dropout_trials,
    }
}

/// How exactly `kind` on `dtype` must match the reference: copies and selections bit
/// for bit, arithmetic within the dtype's tolerance.
pub(crate) fn tolerance_of(kind: OpKind, dtype: DType) -> Tolerance {
    match kind {
        OpKind::Relu | OpKind::ReluBackward | OpKind::Gather => Tolerance::Exact,
        OpKind::Random if !dtype.is_float() => Tolerance::Exact,
        _ => Tolerance::Dtype,
    }
}

/// A fresh generator for the trials of `kind` on `dtype` (the same inputs every time).
pub(crate) fn generator(kind: OpKind, dtype: DType) -> Gen {
    Gen::new(kind.id() as u64 * 977 + dtype as u64)
}

/// Runs the trials of `kind` for every dtype the device lists for it.
fn each_dtype(ctx: &CaseContext, kind: OpKind) -> CaseOutcome {
    let stream: Stream = ctx.device.create_stream()?;
    for dtype in listed(ctx, kind)? {
        let mut gen = generator(kind, dtype);
        for (what, op) in trials_of(kind)(dtype, &mut gen)? {
            run_trial(
                &stream,
                &op,
                tolerance_of(kind, dtype),
                &format!("{dtype}, {what}"),
            )?;
        }
    }
    Ok(())
}

macro_rules! case_fns {
    ($($name:ident = $kind:ident;)*) => {
        $(fn $name(ctx: &CaseContext) -> CaseOutcome {
            each_dtype(ctx, OpKind::$kind)
        })*
    };
}

case_fns! {
    matmul = Matmul;
    bias_add = BiasAdd;
    relu = Relu;
    relu_backward = ReluBackward;
    gelu = Gelu;
    gelu_backward = GeluBackward;
    softmax = Softmax;
    softmax_backward = SoftmaxBackward;
    cross_entropy = CrossEntropy;
    cross_entropy_backward = CrossEntropyBackward;
    layer_norm = LayerNorm;
    layer_norm_backward = LayerNormBackward;
    gather = Gather;
    scatter_add = ScatterAdd;
    reduce = Reduce;
    sgd_momentum = SgdMomentum;
    adamw = AdamW;
    random = Random;
    dropout = Dropout;
}

fn matmul_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    let mut add = |what: String,
                   g: &mut Gen,
                   (la, lb, lc): (Layout, Layout, Layout),
                   ta: bool,
                   tb: bool,
                   beta: f32,
                   specials: bool| {
        let mut av = g.values(la.elements(), signed(2.0));
        if specials {
            with_specials(&mut av, dt, true);
        }
        out.push((
            what,
            Op::Matmul {
                a: g.input(la, &av),
                b: {
                    let bv = g.values(lb.elements(), signed(2.0));
                    g.input(lb, &bv)
                },
                c: if beta == 0.0 {
                    g.output(lc)
                } else {
                    let cv = g.values(lc.elements(), signed(1.0));
                    g.input(lc, &cv)
                },
                trans_a: ta,
                trans_b: tb,
                alpha: 0.75,
                beta,
            },
        ));
    };
    let dims = |ta: bool, tb: bool, m: u64, n: u64, k: u64| {
        let a = if ta { [k, m] } else { [m, k] };
        let b = if tb { [n, k] } else { [k, n] };
        Ok::<_, CaseError>((
            contiguous(dt, &a)?,
            contiguous(dt, &b)?,
            contiguous(dt, &[m, n])?,
        ))
    };
    for (m, n, k) in [(1, 1, 1), (7, 13, 5), (1, 9, 33), (17, 1, 4)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            add(
                format!("{m}×{n}×{k} trans_a={ta} trans_b={tb}"),
                g,
                dims(ta, tb, m, n, k)?,
                ta,
                tb,
                0.0,
                false,
            );
        }
    }
    add(
        "9×11×6, beta 1".into(),
        g,
        dims(false, false, 9, 11, 6)?,
        false,
        false,
        1.0,
        false,
    );
    add(
        "padded leading dimensions 12×10×7".into(),
        g,
        (
            padded_rows(dt, 12, 7, 3)?,
            padded_rows(dt, 7, 10, 5)?,
            padded_rows(dt, 12, 10, 2)?,
        ),
        false,
        false,
        0.5,
        false,
    );
    let batched_b = Layout::strided(dt, &[3, 6, 5], &[0, 5, 1]).map_err(CaseError::from)?;
    add(
        "batch of 3, b broadcast (stride 0)".into(),
        g,
        (
            contiguous(dt, &[3, 4, 6])?,
            batched_b,
            contiguous(dt, &[3, 4, 5])?,
        ),
        false,
        false,
        0.0,
        false,
    );
    add(
        "batch of 2 transposed".into(),
        g,
        (
            contiguous(dt, &[2, 6, 4])?,
            contiguous(dt, &[2, 5, 6])?,
            contiguous(dt, &[2, 4, 5])?,
        ),
        true,
        true,
        1.0,
        false,
    );
    add(
        "NaN, ±inf, −0, subnormal in a".into(),
        g,
        dims(false, false, 8, 8, 8)?,
        false,
        false,
        0.0,
        true,
    );
    add(
        "large 96×80×112".into(),
        g,
        dims(false, false, 96, 80, 112)?,
        false,
        false,
        0.0,
        false,
    );
    Ok(out)
}

/// Builds a unary elementwise operation from its input and the output's layout.
type MakeUnary<'a> = dyn Fn(&mut Gen, Spec, Layout) -> Result<Op<Spec>, CaseError> + 'a;

/// Trials of a unary elementwise operation `make(x, y)` over the shapes every
/// elementwise case uses.
fn elementwise(
    dt: DType,
    g: &mut Gen,
    specials_inf: bool,
    make: &MakeUnary<'_>,
) -> Result<Vec<(String, Op<Spec>)>, CaseError> {
    let mut out = Vec::new();
    let shapes: Vec<(String, Layout, Layout)> = vec![
        ("[1]".into(), contiguous(dt, &[1])?, contiguous(dt, &[1])?),
        (
            "[1001]".into(),
            contiguous(dt, &[1001])?,
            contiguous(dt, &[1001])?,
        ),
        (
            "[2, 3, 4, 5]".into(),
            contiguous(dt, &[2, 3, 4, 5])?,
            contiguous(dt, &[2, 3, 4, 5])?,
        ),
        (
            "[7, 13], x transposed, y gapped".into(),
            contiguous(dt, &[13, 7])?.transposed(0, 1)?,
            gapped(dt, &[7, 13])?,
        ),
        (
            "[65537]".into(),
            contiguous(dt, &[65537])?,
            contiguous(dt, &[65537])?,
        ),
    ];
    for (what, lx, ly) in shapes {
        let xv = g.values(lx.elements(), signed(3.0));
        let x = g.input(lx, &xv);
        out.push((what, make(g, x, ly)?));
    }
    let l = contiguous(dt, &[64])?;
    let mut xv = g.values(64, signed(3.0));
    with_specials(&mut xv, dt, specials_inf);
    let x = g.input(l, &xv);
    out.push(("specials".into(), make(g, x, l)?));
    Ok(out)
}

fn relu_trials(dt: DType, g: &mut Gen) -> Trials {
    elementwise(dt, g, true, &|g, x, ly| Ok(Op::Relu { x, y: g.output(ly) }))
}

fn gelu_trials(dt: DType, g: &mut Gen) -> Trials {
    elementwise(dt, g, false, &|g, x, ly| {
        Ok(Op::Gelu { x, y: g.output(ly) })
    })
}

fn relu_backward_trials(dt: DType, g: &mut Gen) -> Trials {
    elementwise(dt, g, true, &|g, x, ly| {
        let dyv = g.values(ly.elements(), signed(1.0));
        let lx = x.layout;
        let dy = g.input(contiguous(dt, lx.dims())?, &dyv);
        Ok(Op::ReluBackward {
            x,
            dy,
            dx: g.output(ly),
        })
    })
}

fn gelu_backward_trials(dt: DType, g: &mut Gen) -> Trials {
    elementwise(dt, g, false, &|g, x, ly| {
        let dyv = g.values(ly.elements(), signed(1.0));
        let dy = g.input(contiguous(dt, x.layout.dims())?, &dyv);
        Ok(Op::GeluBackward {
            x,
            dy,
            dx: g.output(ly),
        })
    })
}

/// `[rows, n]` shapes for the row operations: (what, input layout, output layout).
fn row_shapes(dt: DType) -> Result<Vec<(String, Layout, Layout)>, CaseError> {
    let c = |r: u64, n: u64| contiguous(dt, &[r, n]);
    Ok(vec![
        ("1×1".into(), c(1, 1)?, c(1, 1)?),
        ("5×1".into(), c(5, 1)?, c(5, 1)?),
        ("7×17".into(), c(7, 17)?, c(7, 17)?),
        ("3×1000".into(), c(3, 1000)?, c(3, 1000)?),
        (
            "9×31 padded rows".into(),
            padded_rows(dt, 9, 31, 5)?,
            padded_rows(dt, 9, 31, 3)?,
        ),
        ("257×129".into(), c(257, 129)?, c(257, 129)?),
    ])
}

fn bias_add_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    for (what, lx, ly) in row_shapes(dt)? {
        let n = lx.dims()[1];
        let xv = g.values(lx.elements(), signed(3.0));
        let bv = g.values(n, signed(1.0));
        out.push((
            what,
            Op::BiasAdd {
                x: g.input(lx, &xv),
                bias: g.input(contiguous(dt, &[n])?, &bv),
                y: g.output(ly),
            },
        ));
    }
    let l = contiguous(dt, &[4, 16])?;
    let mut xv = g.values(64, signed(3.0));
    with_specials(&mut xv, dt, true);
    let bv = g.values(16, signed(1.0));
    out.push((
        "specials".into(),
        Op::BiasAdd {
            x: g.input(l, &xv),
            bias: g.input(contiguous(dt, &[16])?, &bv),
            y: g.output(l),
        },
    ));
    Ok(out)
}

fn softmax_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    for (what, lx, ly) in row_shapes(dt)? {
        let xv = g.values(lx.elements(), signed(8.0));
        out.push((
            what,
            Op::Softmax {
                x: g.input(lx, &xv),
                y: g.output(ly),
            },
        ));
    }
    let l = contiguous(dt, &[8, 8])?;
    let mut xv = g.values(64, signed(8.0));
    // Row 0: NaN; row 1: +inf; row 2: −inf among numbers; row 3: all −inf but one.
    xv[3] = f64::NAN;
    xv[8 + 2] = f64::INFINITY;
    xv[16 + 5] = f64::NEG_INFINITY;
    for v in &mut xv[24..31] {
        *v = f64::NEG_INFINITY;
    }
    out.push((
        "NaN and infinities in rows".into(),
        Op::Softmax {
            x: g.input(l, &xv),
            y: g.output(l),
        },
    ));
    Ok(out)
}

fn softmax_backward_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    for (what, lx, ly) in row_shapes(dt)? {
        let n = lx.dims()[1] as usize;
        let mut yv = g.values(lx.elements(), positive(1.0));
        for row in yv.chunks_mut(n) {
            let s: f64 = row.iter().sum();
            row.iter_mut().for_each(|v| *v /= s);
        }
        let dyv = g.values(lx.elements(), signed(2.0));
        out.push((
            what,
            Op::SoftmaxBackward {
                y: g.input(lx, &yv),
                dy: g.input(contiguous(dt, lx.dims())?, &dyv),
                dx: g.output(ly),
            },
        ));
    }
    Ok(out)
}

fn cross_entropy_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    for (what, lx, _) in row_shapes(dt)? {
        let (rows, n) = (lx.dims()[0], lx.dims()[1]);
        let xv = g.values(lx.elements(), signed(6.0));
        let lab = labels(g, rows, n);
        out.push((
            what,
            Op::CrossEntropy {
                logits: g.input(lx, &xv),
                labels: g.input(contiguous(DType::I32, &[rows])?, &lab),
                loss: g.output(gapped(dt, &[rows])?),
            },
        ));
    }
    Ok(out)
}

fn cross_entropy_backward_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    for (what, lx, ly) in row_shapes(dt)? {
        let (rows, n) = (lx.dims()[0], lx.dims()[1]);
        let xv = g.values(lx.elements(), signed(6.0));
        let lab = labels(g, rows, n);
        let dl = g.values(rows, signed(1.0));
        out.push((
            what,
            Op::CrossEntropyBackward {
                logits: g.input(lx, &xv),
                labels: g.input(contiguous(DType::I32, &[rows])?, &lab),
                dloss: g.input(contiguous(dt, &[rows])?, &dl),
                dlogits: g.output(ly),
            },
        ));
    }
    Ok(out)
}

fn layer_norm_trials(dt: DType, g: &mut Gen) -> Trials {
    let stats = if dt == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let mut out = Vec::new();
    let mut shapes = row_shapes(dt)?;
    let l = contiguous(dt, &[4, 16])?;
    shapes.push(("specials".into(), l, l));
    for (what, lx, ly) in shapes {
        let (rows, n) = (lx.dims()[0], lx.dims()[1]);
        let mut xv = g.values(lx.elements(), signed(4.0));
        if what == "specials" {
            with_specials(&mut xv, dt, false);
        }
        let gv = g.values(n, signed(2.0));
        let bv = g.values(n, signed(1.0));
        out.push((
            what,
            Op::LayerNorm {
                x: g.input(lx, &xv),
                gamma: g.input(contiguous(dt, &[n])?, &gv),
                beta: g.input(contiguous(dt, &[n])?, &bv),
                y: g.output(ly),
                mean: g.output(contiguous(stats, &[rows])?),
                rstd: g.output(gapped(stats, &[rows])?),
                eps: 1e-5,
            },
        ));
    }
    Ok(out)
}

fn layer_norm_backward_trials(dt: DType, g: &mut Gen) -> Trials {
    let stats = if dt == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let mut out = Vec::new();
    for (what, lx, ly) in row_shapes(dt)? {
        let (rows, n) = (lx.dims()[0], lx.dims()[1]);
        let xv = g.values(lx.elements(), signed(4.0));
        let gv = g.values(n, signed(2.0));
        let mv = g.values(rows, signed(0.5));
        let rv = g.values(rows, positive(2.0));
        let dyv = g.values(lx.elements(), signed(1.0));
        out.push((
            what,
            Op::LayerNormBackward {
                x: g.input(lx, &xv),
                gamma: g.input(contiguous(dt, &[n])?, &gv),
                mean: g.input(contiguous(stats, &[rows])?, &mv),
                rstd: g.input(contiguous(stats, &[rows])?, &rv),
                dy: g.input(contiguous(dt, lx.dims())?, &dyv),
                dx: g.output(ly),
                dgamma: g.output(contiguous(dt, &[n])?),
                dbeta: g.output(gapped(dt, &[n])?),
            },
        ));
    }
    Ok(out)
}

fn gather_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    for (rows, dim, n) in [
        (1u64, 1u64, 1u64),
        (50, 16, 37),
        (7, 1, 20),
        (1000, 64, 300),
    ] {
        let table = padded_or_contiguous(dt, rows, dim, g.below(2) == 1)?;
        let bytes = g.bytes(table.elements() as usize * dt.size());
        let idx: Vec<f64> = (0..n).map(|_| g.below(rows) as f64).collect();
        out.push((
            format!("table {rows}×{dim}, {n} indices"),
            Op::Gather {
                table: g.input_bytes(table, &bytes),
                indices: g.input(contiguous(DType::I32, &[n])?, &idx),
                out: g.output(contiguous(dt, &[n, dim])?),
            },
        ));
    }
    Ok(out)
}

fn padded_or_contiguous(dt: DType, rows: u64, dim: u64, padded: bool) -> Result<Layout, CaseError> {
    if padded {
        padded_rows(dt, rows, dim, 3)
    } else {
        contiguous(dt, &[rows, dim])
    }
}

fn scatter_add_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    for (rows, dim, n) in [(1u64, 1u64, 1u64), (10, 16, 37), (7, 1, 20), (500, 32, 300)] {
        let table = padded_or_contiguous(dt, rows, dim, n % 2 == 1)?;
        let tv = g.values(table.elements(), signed(1.0));
        let sv = g.values(n * dim, signed(1.0));
        let idx: Vec<f64> = (0..n).map(|_| g.below(rows) as f64).collect();
        out.push((
            format!("table {rows}×{dim}, {n} rows added"),
            Op::ScatterAdd {
                src: g.input(contiguous(dt, &[n, dim])?, &sv),
                indices: g.input(contiguous(DType::I32, &[n])?, &idx),
                table: g.input(table, &tv),
            },
        ));
    }
    Ok(out)
}

fn reduce_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    let shapes: Vec<Layout> = vec![
        contiguous(dt, &[1])?,
        contiguous(dt, &[5, 7, 9])?,
        contiguous(dt, &[9, 5])?.transposed(0, 1)?,
        contiguous(dt, &[300, 257])?,
        contiguous(dt, &[2, 3, 4, 5])?,
    ];
    for (s, lx) in shapes.into_iter().enumerate() {
        for axis in 0..lx.rank() {
            let op = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min][(s + axis) % 4];
            let mut dims = lx.dims().to_vec();
            dims[axis] = 1;
            let mut xv = g.values(lx.elements(), signed(3.0));
            if s == 1 {
                with_specials(&mut xv, dt, true);
            }
            out.push((
                format!("{} of {lx} along {axis}", op.name()),
                Op::Reduce {
                    x: g.input(lx, &xv),
                    y: g.output(contiguous(dt, &dims)?),
                    op,
                    axis: axis as u32,
                },
            ));
        }
    }
    Ok(out)
}

fn sgd_momentum_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    for (n, nesterov, wd) in [
        (1u64, false, 0.0f32),
        (1001, true, 0.01),
        (65537, false, 1e-4),
    ] {
        let l = contiguous(dt, &[n])?;
        let (p, gr, v) = (
            g.values(n, signed(1.0)),
            g.values(n, signed(0.1)),
            g.values(n, signed(0.1)),
        );
        out.push((
            format!("{n} parameters, nesterov {nesterov}"),
            Op::SgdMomentum {
                param: g.input(l, &p),
                grad: g.input(gapped(dt, &[n])?, &gr),
                velocity: g.input(l, &v),
                lr: 0.05,
                momentum: 0.9,
                weight_decay: wd,
                nesterov,
            },
        ));
    }
    Ok(out)
}

fn adamw_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    for (n, step) in [(1u64, 1u32), (1001, 7), (65537, 1000)] {
        let l = contiguous(dt, &[n])?;
        let (p, gr, m) = (
            g.values(n, signed(1.0)),
            g.values(n, signed(0.1)),
            g.values(n, signed(0.01)),
        );
        let v = if step == 1 {
            vec![0.0; n as usize]
        } else {
            g.values(n, positive(0.01))
        };
        out.push((
            format!("{n} parameters, step {step}"),
            Op::AdamW {
                param: g.input(l, &p),
                grad: g.input(l, &gr),
                m: g.input(gapped(dt, &[n])?, &m),
                v: g.input(l, &v),
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
                step,
            },
        ));
    }
    Ok(out)
}

fn random_trials(dt: DType, g: &mut Gen) -> Trials {
    let dists = if dt == DType::I32 {
        vec![Distribution::Bits]
    } else {
        vec![
            Distribution::Uniform {
                low: -1.5,
                high: 2.5,
            },
            Distribution::Normal {
                mean: 0.5,
                std: 2.0,
            },
        ]
    };
    let mut out = Vec::new();
    for dist in dists {
        for (n, seed, offset) in [
            (1u64, 0u64, 0u64),
            (1001, 42, 7),
            (65537, u64::MAX, u64::MAX - 3),
        ] {
            let y = if n == 1001 {
                gapped(dt, &[n])?
            } else {
                contiguous(dt, &[n])?
            };
            out.push((
                format!("{dist:?}, {n} elements, seed {seed}, offset {offset}"),
                Op::Random {
                    y: g.output(y),
                    dist,
                    seed,
                    offset,
                },
            ));
        }
    }
    Ok(out)
}

fn dropout_trials(dt: DType, g: &mut Gen) -> Trials {
    let mut out = Vec::new();
    for (n, p) in [(1u64, 0.5f32), (1001, 0.1), (65537, 0.5), (64, 0.0)] {
        let l = contiguous(dt, &[n])?;
        let xv = g.values(n, signed(2.0));
        out.push((
            format!("{n} elements, p {p}"),
            Op::Dropout {
                x: g.input(l, &xv),
                y: g.output(if n == 1001 { gapped(dt, &[n])? } else { l }),
                p,
                seed: 1234 + n,
                offset: n,
            },
        ));
    }
    Ok(out)
}
