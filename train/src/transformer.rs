//! The decoder-only transformer: token and position embeddings, pre-norm blocks of
//! causal multi-head attention and a GELU MLP with residual connections, a final
//! layer norm and the output projection, trained by next-token cross-entropy.
//!
//! Every step is a standard operation on views of a few buffers. Attention runs per
//! head as batched matmuls over strided views of the fused `qkv` activations
//! (`[rows, 3d]`: head `h`'s queries at column `h·dh`, keys at `d + h·dh`, values at
//! `2d + h·dh`), so no transpose is ever copied; the causal mask is a bias added to each
//! head's `[T, T]` scores (−10⁹ above the diagonal), and the softmax runs over rows.
//!
//! Buckets, in the order the backward pass finishes them: the final norm and output
//! projection, then the blocks from the last to the first, then the embeddings.

use xpu_hal::ops::{Layout, Op, OpKind};
use xpu_hal::{BinaryOp, DType, Error, Result};
use xpu_scheduler::{Builtin, Handle, TensorRef};

use crate::exec::Exec;

use crate::model::{MicroBatch, Model, Stored};
use crate::params::{Init, ParamLayout, ParamSpec, Slot};
use crate::replica::{view32, whole, Replica};

/// The transformer's sizes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransformerShape {
    /// Vocabulary (and classes).
    pub vocab: u64,
    /// Tokens per sequence.
    pub context: u64,
    /// Model width `d`.
    pub width: u64,
    /// Attention heads (dividing `d`).
    pub heads: u64,
    /// Blocks.
    pub layers: u64,
    /// Sequences per micro-batch.
    pub micro_batch: u64,
}

/// Activations kept for the backward pass, per block.
const PER_LAYER: usize = 13;
const LN1: usize = 0; // [R, d]
const LN1_MEAN: usize = 1; // [R]
const LN1_RSTD: usize = 2; // [R]
const QKV: usize = 3; // [R, 3d]
const PROBS: usize = 4; // [H·B, T, T]
const ATTN: usize = 5; // [R, d]
const MID: usize = 6; // [R, d]: x + attention
const LN2: usize = 7;
const LN2_MEAN: usize = 8;
const LN2_RSTD: usize = 9;
const FF: usize = 10; // [R, 4d] before GELU
const FF_ACT: usize = 11; // [R, 4d] after
const OUT: usize = 12; // [R, d]: the block's output

/// Buffers shared by the blocks, after the per-block ones.
const X0: usize = 0; // [R, d]: the embeddings
const LNF: usize = 1;
const LNF_MEAN: usize = 2;
const LNF_RSTD: usize = 3;
const LOGITS: usize = 4; // [R, V]
const DLOGITS: usize = 5;
const DX: usize = 6; // [R, d]: gradient of the residual stream
const DX2: usize = 7; // [R, d]
const DTMP: usize = 8; // [R, d]
const DQKV: usize = 9; // [R, 3d]
const DPROBS: usize = 10; // [H·B, T, T]
const DSCORES: usize = 11;
const DATTN: usize = 12; // [R, d]
const DFF: usize = 13; // [R, 4d]
const DGAMMA: usize = 14; // [d]
const DBETA: usize = 15; // [d]
const DMID: usize = 16; // [R, d]
const SHARED: usize = 17;

/// Parameters of one block, by index in its bucket.
const BLOCK_PARAMS: [&str; 12] = [
    "ln1.gamma",
    "ln1.beta",
    "qkv.w",
    "qkv.b",
    "proj.w",
    "proj.b",
    "ln2.gamma",
    "ln2.beta",
    "ff1.w",
    "ff1.b",
    "ff2.w",
    "ff2.b",
];

pub(crate) struct Transformer {
    shape: TransformerShape,
    layout: ParamLayout,
    /// The blocks' parameters, then `[tok, pos]`, then `[lnf.gamma, lnf.beta, head.w,
    /// head.b]`.
    blocks: Vec<Vec<Slot>>,
    embed: [Slot; 2],
    head: [Slot; 4],
    /// The causal mask `[T·T]`, registered per replica on first use.
    mask: Vec<f32>,
}

impl Transformer {
    pub(crate) fn new(shape: TransformerShape) -> Result<Transformer> {
        let TransformerShape {
            vocab: v,
            context: t,
            width: d,
            heads,
            layers,
            ..
        } = shape;
        if heads == 0 || !d.is_multiple_of(heads) {
            return Err(Error::invalid(format!(
                "{heads} heads do not divide the width {d}; choose a width that is a multiple of the heads"
            )));
        }
        if layers == 0 || layers > 64 || t == 0 || t > 1024 {
            return Err(Error::invalid(format!(
                "{layers} blocks over a context of {t} tokens: give 1 to 64 blocks and 1 to 1024 tokens"
            )));
        }
        let w = |fan_in: u64| Init::Normal(1.0 / (fan_in as f32).sqrt());
        // Residual projections start smaller, as in GPT-2.
        let res = |fan_in: u64| Init::Normal(1.0 / ((fan_in * 2 * layers) as f32).sqrt());
        let mut specs = vec![vec![
            ParamSpec::new("tok", &[v, d], Init::Normal(1.0)),
            ParamSpec::new("pos", &[t, d], Init::Normal(1.0)),
        ]];
        for l in 0..layers {
            let p = |n: &str| format!("block{l}.{n}");
            specs.push(vec![
                ParamSpec::new(p("ln1.gamma"), &[d], Init::Ones),
                ParamSpec::new(p("ln1.beta"), &[d], Init::Zeros),
                ParamSpec::new(p("qkv.w"), &[d, 3 * d], w(d)),
                ParamSpec::new(p("qkv.b"), &[3 * d], Init::Zeros),
                ParamSpec::new(p("proj.w"), &[d, d], res(d)),
                ParamSpec::new(p("proj.b"), &[d], Init::Zeros),
                ParamSpec::new(p("ln2.gamma"), &[d], Init::Ones),
                ParamSpec::new(p("ln2.beta"), &[d], Init::Zeros),
                ParamSpec::new(p("ff1.w"), &[d, 4 * d], w(d)),
                ParamSpec::new(p("ff1.b"), &[4 * d], Init::Zeros),
                ParamSpec::new(p("ff2.w"), &[4 * d, d], res(4 * d)),
                ParamSpec::new(p("ff2.b"), &[d], Init::Zeros),
            ]);
        }
        specs.push(vec![
            ParamSpec::new("lnf.gamma", &[d], Init::Ones),
            ParamSpec::new("lnf.beta", &[d], Init::Zeros),
            ParamSpec::new("head.w", &[d, v], w(d)),
            ParamSpec::new("head.b", &[v], Init::Zeros),
        ]);
        let layout = ParamLayout::new(specs);
        let slot = |n: &str| {
            layout
                .slot(n)
                .ok_or_else(|| Error::invalid(format!("internal error: no parameter `{n}`")))
        };
        let blocks = (0..layers)
            .map(|l| {
                BLOCK_PARAMS
                    .iter()
                    .map(|n| slot(&format!("block{l}.{n}")))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let mut mask = vec![0.0f32; (t * t) as usize];
        for i in 0..t as usize {
            for j in i + 1..t as usize {
                mask[i * t as usize + j] = -1e9;
            }
        }
        Ok(Transformer {
            shape,
            embed: [slot("tok")?, slot("pos")?],
            head: [
                slot("lnf.gamma")?,
                slot("lnf.beta")?,
                slot("head.w")?,
                slot("head.b")?,
            ],
            layout,
            blocks,
            mask,
        })
    }

    fn rows(&self) -> u64 {
        self.shape.micro_batch * self.shape.context
    }

    /// Scratch buffer `k` of block `l`.
    fn act(&self, r: &Replica, l: u64, k: usize) -> Handle {
        r.scratch[l as usize * PER_LAYER + k]
    }

    /// Shared scratch buffer `k`.
    fn shared(&self, r: &Replica, k: usize) -> Handle {
        r.scratch[self.shape.layers as usize * PER_LAYER + k]
    }

    /// The residual stream entering block `l`.
    fn input_of(&self, r: &Replica, l: u64) -> Handle {
        if l == 0 {
            self.shared(r, X0)
        } else {
            self.act(r, l - 1, OUT)
        }
    }

    /// `[B, T, dh]` view of head `h`'s part `part` (0 queries, 1 keys, 2 values) of the
    /// fused `[R, 3d]` buffer `qkv`.
    fn head_of_qkv(&self, r: &Replica, qkv: Handle, part: u64, h: u64) -> Result<TensorRef> {
        let TransformerShape {
            context: t,
            width: d,
            heads,
            micro_batch: b,
            ..
        } = self.shape;
        let dh = d / heads;
        Ok(TensorRef::strided(
            qkv,
            (part * d + h * dh) * r.dtype.size() as u64,
            Layout::strided(r.dtype, &[b, t, dh], &[t * 3 * d, 3 * d, 1])?,
        ))
    }

    /// `[B, T, dh]` view of head `h`'s columns of an `[R, d]` buffer.
    fn head_of(&self, r: &Replica, buf: Handle, h: u64) -> Result<TensorRef> {
        let TransformerShape {
            context: t,
            width: d,
            heads,
            micro_batch: b,
            ..
        } = self.shape;
        let dh = d / heads;
        Ok(TensorRef::strided(
            buf,
            h * dh * r.dtype.size() as u64,
            Layout::strided(r.dtype, &[b, t, dh], &[t * d, d, 1])?,
        ))
    }

    /// `[B, T, T]` scores of head `h` in a `[H·B, T, T]` buffer.
    fn scores_of(&self, r: &Replica, buf: Handle, h: u64) -> Result<TensorRef> {
        let TransformerShape {
            context: t,
            micro_batch: b,
            ..
        } = self.shape;
        r.view(buf, h * b * t * t, &[b, t, t])
    }

    fn add(&self, sched: &dyn Exec, r: &Replica, a: Handle, b: Handle, out: Handle) -> Result<()> {
        let add = Builtin::Binary {
            op: BinaryOp::Sum,
            dtype: r.dtype,
        };
        sched.builtin(&r.device, add, &[a, b, out])
    }

    /// `y = layer_norm(x)·gamma + beta`, keeping the row statistics.
    #[allow(clippy::too_many_arguments)]
    fn norm(
        &self,
        sched: &dyn Exec,
        r: &Replica,
        name: &str,
        x: Handle,
        gamma: &Slot,
        beta: &Slot,
        y: Handle,
        mean: Handle,
        rstd: Handle,
    ) -> Result<()> {
        let (rows, d) = (self.rows(), self.shape.width);
        r.run(
            sched,
            name,
            Op::LayerNorm {
                x: r.view(x, 0, &[rows, d])?,
                gamma: r.param(gamma)?,
                beta: r.param(beta)?,
                y: r.view(y, 0, &[rows, d])?,
                mean: view32(mean, 0, &[rows])?,
                rstd: view32(rstd, 0, &[rows])?,
                eps: 1e-5,
            },
        )
    }

    /// The backward pass of [`Transformer::norm`]: `dx` overwritten, the parameters'
    /// gradients accumulated.
    #[allow(clippy::too_many_arguments)]
    fn norm_backward(
        &self,
        sched: &dyn Exec,
        r: &Replica,
        mb: &MicroBatch,
        name: &str,
        x: Handle,
        gamma: &Slot,
        beta: &Slot,
        mean: Handle,
        rstd: Handle,
        dy: Handle,
        dx: Handle,
    ) -> Result<()> {
        let (rows, d) = (self.rows(), self.shape.width);
        let (dg, db) = (self.shared(r, DGAMMA), self.shared(r, DBETA));
        r.run(
            sched,
            name,
            Op::LayerNormBackward {
                x: r.view(x, 0, &[rows, d])?,
                gamma: r.param(gamma)?,
                mean: view32(mean, 0, &[rows])?,
                rstd: view32(rstd, 0, &[rows])?,
                dy: r.view(dy, 0, &[rows, d])?,
                dx: r.view(dx, 0, &[rows, d])?,
                dgamma: r.view(dg, 0, &[d])?,
                dbeta: r.view(db, 0, &[d])?,
            },
        )?;
        for (slot, part) in [(gamma, dg), (beta, db)] {
            let g = r.grad(slot, mb)?;
            let row = TensorRef::strided(g.handle, g.offset, Layout::contiguous(r.dtype, &[1, d])?);
            r.run(
                sched,
                &format!("{name}.accumulate"),
                Op::BiasAdd {
                    x: row.clone(),
                    bias: r.view(part, 0, &[d])?,
                    y: row,
                },
            )?;
        }
        Ok(())
    }

    fn block_forward(&self, sched: &dyn Exec, r: &Replica, l: u64) -> Result<()> {
        let TransformerShape {
            context: t,
            width: d,
            heads,
            micro_batch: b,
            ..
        } = self.shape;
        let rows = self.rows();
        let p = &self.blocks[l as usize];
        let a = |k| self.act(r, l, k);
        let x = self.input_of(r, l);
        let scores = self.shared(r, DSCORES);
        self.norm(
            sched,
            r,
            "tf.ln1",
            x,
            &p[0],
            &p[1],
            a(LN1),
            a(LN1_MEAN),
            a(LN1_RSTD),
        )?;
        r.linear(
            sched,
            "tf.qkv",
            r.view(a(LN1), 0, &[rows, d])?,
            &p[2],
            &p[3],
            r.view(a(QKV), 0, &[rows, 3 * d])?,
        )?;
        let scale = 1.0 / ((d / heads) as f32).sqrt();
        for h in 0..heads {
            r.run(
                sched,
                "tf.scores",
                Op::Matmul {
                    a: self.head_of_qkv(r, a(QKV), 0, h)?,
                    b: self.head_of_qkv(r, a(QKV), 1, h)?,
                    c: self.scores_of(r, scores, h)?,
                    trans_a: false,
                    trans_b: true,
                    alpha: scale,
                    beta: 0.0,
                },
            )?;
        }
        let masked = r.view(scores, 0, &[heads * b, t * t])?;
        r.run(
            sched,
            "tf.mask",
            Op::BiasAdd {
                x: masked.clone(),
                bias: whole(r.constants[0], r.dtype, &[t * t])?,
                y: masked,
            },
        )?;
        r.run(
            sched,
            "tf.softmax",
            Op::Softmax {
                x: r.view(scores, 0, &[heads * b * t, t])?,
                y: r.view(a(PROBS), 0, &[heads * b * t, t])?,
            },
        )?;
        for h in 0..heads {
            r.run(
                sched,
                "tf.attend",
                Op::Matmul {
                    a: self.scores_of(r, a(PROBS), h)?,
                    b: self.head_of_qkv(r, a(QKV), 2, h)?,
                    c: self.head_of(r, a(ATTN), h)?,
                    trans_a: false,
                    trans_b: false,
                    alpha: 1.0,
                    beta: 0.0,
                },
            )?;
        }
        let tmp = self.shared(r, DTMP);
        r.linear(
            sched,
            "tf.proj",
            r.view(a(ATTN), 0, &[rows, d])?,
            &p[4],
            &p[5],
            r.view(tmp, 0, &[rows, d])?,
        )?;
        self.add(sched, r, x, tmp, a(MID))?;
        self.norm(
            sched,
            r,
            "tf.ln2",
            a(MID),
            &p[6],
            &p[7],
            a(LN2),
            a(LN2_MEAN),
            a(LN2_RSTD),
        )?;
        r.linear(
            sched,
            "tf.ff1",
            r.view(a(LN2), 0, &[rows, d])?,
            &p[8],
            &p[9],
            r.view(a(FF), 0, &[rows, 4 * d])?,
        )?;
        r.run(
            sched,
            "tf.gelu",
            Op::Gelu {
                x: r.view(a(FF), 0, &[rows, 4 * d])?,
                y: r.view(a(FF_ACT), 0, &[rows, 4 * d])?,
            },
        )?;
        r.linear(
            sched,
            "tf.ff2",
            r.view(a(FF_ACT), 0, &[rows, 4 * d])?,
            &p[10],
            &p[11],
            r.view(tmp, 0, &[rows, d])?,
        )?;
        self.add(sched, r, a(MID), tmp, a(OUT))
    }

    /// The backward pass of block `l`: from the gradient of its output in `DX` to the
    /// gradient of its input, left in `DX` again.
    fn block_backward(&self, sched: &dyn Exec, r: &Replica, mb: &MicroBatch, l: u64) -> Result<()> {
        let TransformerShape {
            context: t,
            width: d,
            heads,
            micro_batch: b,
            ..
        } = self.shape;
        let rows = self.rows();
        let p = &self.blocks[l as usize];
        let a = |k| self.act(r, l, k);
        let s = |k| self.shared(r, k);
        let x = self.input_of(r, l);
        // The MLP: dout → dff_act → dff → dln2.
        r.linear_backward(
            sched,
            mb,
            "tf.ff2.backward",
            r.view(a(FF_ACT), 0, &[rows, 4 * d])?,
            &p[10],
            &p[11],
            r.view(s(DX), 0, &[rows, d])?,
            Some(r.view(s(DFF), 0, &[rows, 4 * d])?),
        )?;
        r.run(
            sched,
            "tf.gelu.backward",
            Op::GeluBackward {
                x: r.view(a(FF), 0, &[rows, 4 * d])?,
                dy: r.view(s(DFF), 0, &[rows, 4 * d])?,
                dx: r.view(s(DFF), 0, &[rows, 4 * d])?,
            },
        )?;
        r.linear_backward(
            sched,
            mb,
            "tf.ff1.backward",
            r.view(a(LN2), 0, &[rows, d])?,
            &p[8],
            &p[9],
            r.view(s(DFF), 0, &[rows, 4 * d])?,
            Some(r.view(s(DTMP), 0, &[rows, d])?),
        )?;
        self.norm_backward(
            sched,
            r,
            mb,
            "tf.ln2.backward",
            a(MID),
            &p[6],
            &p[7],
            a(LN2_MEAN),
            a(LN2_RSTD),
            s(DTMP),
            s(DX2),
        )?;
        // The gradient of `mid`: through the residual and through the norm.
        self.add(sched, r, s(DX), s(DX2), s(DMID))?;
        // Attention: dmid → dattn → per head dprobs, dv → dscores → dq, dk.
        r.linear_backward(
            sched,
            mb,
            "tf.proj.backward",
            r.view(a(ATTN), 0, &[rows, d])?,
            &p[4],
            &p[5],
            r.view(s(DMID), 0, &[rows, d])?,
            Some(r.view(s(DATTN), 0, &[rows, d])?),
        )?;
        let dqkv = s(DQKV);
        for h in 0..heads {
            r.run(
                sched,
                "tf.attend.dprobs",
                Op::Matmul {
                    a: self.head_of(r, s(DATTN), h)?,
                    b: self.head_of_qkv(r, a(QKV), 2, h)?,
                    c: self.scores_of(r, s(DPROBS), h)?,
                    trans_a: false,
                    trans_b: true,
                    alpha: 1.0,
                    beta: 0.0,
                },
            )?;
            r.run(
                sched,
                "tf.attend.dv",
                Op::Matmul {
                    a: self.scores_of(r, a(PROBS), h)?,
                    b: self.head_of(r, s(DATTN), h)?,
                    c: self.head_of_qkv(r, dqkv, 2, h)?,
                    trans_a: true,
                    trans_b: false,
                    alpha: 1.0,
                    beta: 0.0,
                },
            )?;
        }
        r.run(
            sched,
            "tf.softmax.backward",
            Op::SoftmaxBackward {
                y: r.view(a(PROBS), 0, &[heads * b * t, t])?,
                dy: r.view(s(DPROBS), 0, &[heads * b * t, t])?,
                dx: r.view(s(DSCORES), 0, &[heads * b * t, t])?,
            },
        )?;
        let scale = 1.0 / ((d / heads) as f32).sqrt();
        for h in 0..heads {
            r.run(
                sched,
                "tf.scores.dq",
                Op::Matmul {
                    a: self.scores_of(r, s(DSCORES), h)?,
                    b: self.head_of_qkv(r, a(QKV), 1, h)?,
                    c: self.head_of_qkv(r, dqkv, 0, h)?,
                    trans_a: false,
                    trans_b: false,
                    alpha: scale,
                    beta: 0.0,
                },
            )?;
            r.run(
                sched,
                "tf.scores.dk",
                Op::Matmul {
                    a: self.scores_of(r, s(DSCORES), h)?,
                    b: self.head_of_qkv(r, a(QKV), 0, h)?,
                    c: self.head_of_qkv(r, dqkv, 1, h)?,
                    trans_a: true,
                    trans_b: false,
                    alpha: scale,
                    beta: 0.0,
                },
            )?;
        }
        r.linear_backward(
            sched,
            mb,
            "tf.qkv.backward",
            r.view(a(LN1), 0, &[rows, d])?,
            &p[2],
            &p[3],
            r.view(dqkv, 0, &[rows, 3 * d])?,
            Some(r.view(s(DTMP), 0, &[rows, d])?),
        )?;
        self.norm_backward(
            sched,
            r,
            mb,
            "tf.ln1.backward",
            x,
            &p[0],
            &p[1],
            a(LN1_MEAN),
            a(LN1_RSTD),
            s(DTMP),
            s(DX2),
        )?;
        // The gradient of the block's input: through the residual and the norm.
        self.add(sched, r, s(DMID), s(DX2), s(DX))
    }
}

impl Model for Transformer {
    fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    fn ops(&self) -> &'static [OpKind] {
        &[
            OpKind::Gather,
            OpKind::Matmul,
            OpKind::BiasAdd,
            OpKind::LayerNorm,
            OpKind::LayerNormBackward,
            OpKind::Softmax,
            OpKind::SoftmaxBackward,
            OpKind::Gelu,
            OpKind::GeluBackward,
            OpKind::CrossEntropy,
            OpKind::CrossEntropyBackward,
            OpKind::ScatterAdd,
            OpKind::AdamW,
        ]
    }

    fn constants(&self) -> Vec<Vec<f32>> {
        vec![self.mask.clone()]
    }

    fn scratch(&self) -> Vec<(u64, Stored)> {
        let TransformerShape {
            vocab: v,
            context: t,
            width: d,
            heads,
            layers,
            micro_batch: b,
        } = self.shape;
        let r = b * t;
        let probs = heads * b * t * t;
        let mut sizes = Vec::new();
        for _ in 0..layers {
            sizes.extend([
                r * d,
                r,
                r,
                r * 3 * d,
                probs,
                r * d,
                r * d,
                r * d,
                r,
                r,
                r * 4 * d,
                r * 4 * d,
                r * d,
            ]);
        }
        sizes.extend([
            r * d,
            r * d,
            r,
            r,
            r * v,
            r * v,
            r * d,
            r * d,
            r * d,
            r * 3 * d,
            probs,
            probs,
            r * d,
            r * 4 * d,
            d,
            d,
            r * d,
        ]);
        debug_assert_eq!(sizes.len(), layers as usize * PER_LAYER + SHARED);
        // Layer norm's row statistics are `f32` whatever the compute dtype.
        let shared = layers as usize * PER_LAYER;
        let stats = |i: usize| {
            if i < shared {
                matches!(i % PER_LAYER, LN1_MEAN | LN1_RSTD | LN2_MEAN | LN2_RSTD)
            } else {
                matches!(i - shared, LNF_MEAN | LNF_RSTD)
            }
        };
        sizes
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                (
                    e,
                    if stats(i) {
                        Stored::F32
                    } else {
                        Stored::Compute
                    },
                )
            })
            .collect()
    }

    fn loss_rows(&self) -> u64 {
        self.rows()
    }

    fn forward(&self, sched: &dyn Exec, r: &Replica, mb: &MicroBatch) -> Result<()> {
        let TransformerShape {
            vocab: v,
            context: t,
            width: d,
            layers,
            micro_batch: b,
            ..
        } = self.shape;
        let rows = self.rows();
        let x0 = self.shared(r, X0);
        r.run(
            sched,
            "tf.embed",
            Op::Gather {
                table: r.param(&self.embed[0])?,
                indices: whole(mb.tokens, DType::I32, &[rows])?,
                out: r.view(x0, 0, &[rows, d])?,
            },
        )?;
        let pos = r.param(&self.embed[1])?;
        let seqs = r.view(x0, 0, &[b, t * d])?;
        r.run(
            sched,
            "tf.embed.pos",
            Op::BiasAdd {
                x: seqs.clone(),
                bias: TensorRef::strided(
                    pos.handle,
                    pos.offset,
                    Layout::contiguous(r.dtype, &[t * d])?,
                ),
                y: seqs,
            },
        )?;
        for l in 0..layers {
            self.block_forward(sched, r, l)?;
        }
        let s = |k| self.shared(r, k);
        let [gamma, beta, w, bias] = &self.head;
        self.norm(
            sched,
            r,
            "tf.lnf",
            self.input_of(r, layers),
            gamma,
            beta,
            s(LNF),
            s(LNF_MEAN),
            s(LNF_RSTD),
        )?;
        r.linear(
            sched,
            "tf.head",
            r.view(s(LNF), 0, &[rows, d])?,
            w,
            bias,
            r.view(s(LOGITS), 0, &[rows, v])?,
        )?;
        r.run(
            sched,
            "tf.loss",
            Op::CrossEntropy {
                logits: r.view(s(LOGITS), 0, &[rows, v])?,
                labels: whole(mb.labels, DType::I32, &[rows])?,
                loss: r.view(r.loss, mb.loss_offset, &[rows])?,
            },
        )
    }

    fn backward(
        &self,
        sched: &dyn Exec,
        r: &Replica,
        mb: &MicroBatch,
        bucket: usize,
    ) -> Result<()> {
        let TransformerShape {
            vocab: v,
            context: t,
            width: d,
            layers,
            micro_batch: b,
            ..
        } = self.shape;
        let rows = self.rows();
        let s = |k| self.shared(r, k);
        if bucket == layers as usize + 1 {
            let [gamma, beta, w, bias] = &self.head;
            r.run(
                sched,
                "tf.loss.backward",
                Op::CrossEntropyBackward {
                    logits: r.view(s(LOGITS), 0, &[rows, v])?,
                    labels: whole(mb.labels, DType::I32, &[rows])?,
                    dloss: whole(r.dloss, r.dtype, &[rows])?,
                    dlogits: r.view(s(DLOGITS), 0, &[rows, v])?,
                },
            )?;
            r.linear_backward(
                sched,
                mb,
                "tf.head.backward",
                r.view(s(LNF), 0, &[rows, d])?,
                w,
                bias,
                r.view(s(DLOGITS), 0, &[rows, v])?,
                Some(r.view(s(DTMP), 0, &[rows, d])?),
            )?;
            return self.norm_backward(
                sched,
                r,
                mb,
                "tf.lnf.backward",
                self.input_of(r, layers),
                gamma,
                beta,
                s(LNF_MEAN),
                s(LNF_RSTD),
                s(DTMP),
                s(DX),
            );
        }
        if bucket >= 1 {
            return self.block_backward(sched, r, mb, bucket as u64 - 1);
        }
        // The embeddings: the token table by scatter-add, the positions summed over the
        // sequences (`onesᵀ·dx` over `[B, T·d]`).
        r.run(
            sched,
            "tf.embed.backward",
            Op::ScatterAdd {
                src: r.view(s(DX), 0, &[rows, d])?,
                indices: whole(mb.tokens, DType::I32, &[rows])?,
                table: r.grad(&self.embed[0], mb)?,
            },
        )?;
        let dpos = r.grad(&self.embed[1], mb)?;
        r.run(
            sched,
            "tf.embed.pos.backward",
            Op::Matmul {
                a: whole(r.ones, r.dtype, &[1, b])?,
                b: r.view(s(DX), 0, &[b, t * d])?,
                c: TensorRef::strided(
                    dpos.handle,
                    dpos.offset,
                    Layout::contiguous(r.dtype, &[1, t * d])?,
                ),
                trans_a: false,
                trans_b: false,
                alpha: 1.0,
                beta: 1.0,
            },
        )
    }

    fn logits(&self, r: &Replica) -> (Handle, u64) {
        (self.shared(r, LOGITS), self.shape.vocab)
    }
}
