//! The MLP: two embedded operands through two GELU layers to the classes.
//!
//! `x = [E[a], E[b]]` (a gather of two rows per example, `[rows, 2d]`),
//! `h1 = gelu(x·W1 + b1)`, `h2 = gelu(h1·W2 + b2)`, `logits = h2·W3 + b3`, and a softmax
//! cross-entropy per example. Buckets: `[E, W1, b1]`, `[W2, b2]`, `[W3, b3]`.

use xpu_hal::ops::{Op, OpKind};
use xpu_hal::{DType, Result};
use xpu_scheduler::Handle;

use crate::exec::Exec;

use crate::model::{MicroBatch, Model, Stored};
use crate::params::{Init, ParamLayout, ParamSpec, Slot};
use crate::replica::{whole, Replica};

/// Scratch buffers, by index.
const X: usize = 0;
const Z1: usize = 1;
const H1: usize = 2;
const Z2: usize = 3;
const H2: usize = 4;
const LOGITS: usize = 5;
const DLOGITS: usize = 6;
const DH2: usize = 7;
const DH1: usize = 8;
const DX: usize = 9;

/// The MLP's sizes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlpShape {
    /// Classes (and token values).
    pub classes: u64,
    /// Embedding width.
    pub embed: u64,
    /// Hidden width.
    pub hidden: u64,
    /// Examples per micro-batch.
    pub micro_batch: u64,
}

pub(crate) struct Mlp {
    shape: MlpShape,
    layout: ParamLayout,
    slots: [Slot; 7],
}

impl Mlp {
    pub(crate) fn new(shape: MlpShape) -> Result<Mlp> {
        let MlpShape {
            classes: p,
            embed: d,
            hidden: h,
            ..
        } = shape;
        let std = |fan_in: u64| Init::Normal(1.0 / (fan_in as f32).sqrt());
        let layout = ParamLayout::new(vec![
            vec![
                ParamSpec::new("embed", &[p, d], Init::Normal(1.0)),
                ParamSpec::new("w1", &[2 * d, h], std(2 * d)),
                ParamSpec::new("b1", &[h], Init::Zeros),
            ],
            vec![
                ParamSpec::new("w2", &[h, h], std(h)),
                ParamSpec::new("b2", &[h], Init::Zeros),
            ],
            vec![
                ParamSpec::new("w3", &[h, p], std(h)),
                ParamSpec::new("b3", &[p], Init::Zeros),
            ],
        ]);
        let slot = |n: &str| {
            layout.slot(n).ok_or_else(|| {
                xpu_hal::Error::invalid(format!("internal error: no parameter `{n}`"))
            })
        };
        let slots = [
            slot("embed")?,
            slot("w1")?,
            slot("b1")?,
            slot("w2")?,
            slot("b2")?,
            slot("w3")?,
            slot("b3")?,
        ];
        Ok(Mlp {
            shape,
            layout,
            slots,
        })
    }
}

impl Model for Mlp {
    fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    fn ops(&self) -> &'static [OpKind] {
        &[
            OpKind::Gather,
            OpKind::Matmul,
            OpKind::BiasAdd,
            OpKind::Gelu,
            OpKind::CrossEntropy,
            OpKind::CrossEntropyBackward,
            OpKind::GeluBackward,
            OpKind::ScatterAdd,
            OpKind::AdamW,
        ]
    }

    fn scratch(&self) -> Vec<(u64, Stored)> {
        let MlpShape {
            classes: p,
            embed: d,
            hidden: h,
            micro_batch: n,
        } = self.shape;
        vec![
            n * 2 * d,
            n * h,
            n * h,
            n * h,
            n * h,
            n * p,
            n * p,
            n * h,
            n * h,
            n * 2 * d,
        ]
        .into_iter()
        .map(|e| (e, Stored::Compute))
        .collect()
    }

    fn loss_rows(&self) -> u64 {
        self.shape.micro_batch
    }

    fn forward(&self, sched: &dyn Exec, r: &Replica, mb: &MicroBatch) -> Result<()> {
        let MlpShape {
            classes: p,
            embed: d,
            hidden: h,
            micro_batch: n,
        } = self.shape;
        let [embed, w1, b1, w2, b2, w3, b3] = &self.slots;
        let s = |i: usize, dims: &[u64]| r.view(r.scratch[i], 0, dims);
        r.run(
            sched,
            "mlp.embed",
            Op::Gather {
                table: r.param(embed)?,
                indices: whole(mb.tokens, DType::I32, &[2 * n])?,
                out: s(X, &[2 * n, d])?,
            },
        )?;
        r.linear(sched, "mlp.l1", s(X, &[n, 2 * d])?, w1, b1, s(Z1, &[n, h])?)?;
        r.run(
            sched,
            "mlp.gelu1",
            Op::Gelu {
                x: s(Z1, &[n, h])?,
                y: s(H1, &[n, h])?,
            },
        )?;
        r.linear(sched, "mlp.l2", s(H1, &[n, h])?, w2, b2, s(Z2, &[n, h])?)?;
        r.run(
            sched,
            "mlp.gelu2",
            Op::Gelu {
                x: s(Z2, &[n, h])?,
                y: s(H2, &[n, h])?,
            },
        )?;
        r.linear(
            sched,
            "mlp.l3",
            s(H2, &[n, h])?,
            w3,
            b3,
            s(LOGITS, &[n, p])?,
        )?;
        r.run(
            sched,
            "mlp.loss",
            Op::CrossEntropy {
                logits: s(LOGITS, &[n, p])?,
                labels: whole(mb.labels, DType::I32, &[n])?,
                loss: r.view(r.loss, mb.loss_offset, &[n])?,
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
        let MlpShape {
            classes: p,
            embed: d,
            hidden: h,
            micro_batch: n,
        } = self.shape;
        let [embed, w1, b1, w2, b2, w3, b3] = &self.slots;
        let s = |i: usize, dims: &[u64]| r.view(r.scratch[i], 0, dims);
        match bucket {
            2 => {
                r.run(
                    sched,
                    "mlp.loss.backward",
                    Op::CrossEntropyBackward {
                        logits: s(LOGITS, &[n, p])?,
                        labels: whole(mb.labels, DType::I32, &[n])?,
                        dloss: whole(r.dloss, r.dtype, &[n])?,
                        dlogits: s(DLOGITS, &[n, p])?,
                    },
                )?;
                r.linear_backward(
                    sched,
                    mb,
                    "mlp.l3.backward",
                    s(H2, &[n, h])?,
                    w3,
                    b3,
                    s(DLOGITS, &[n, p])?,
                    Some(s(DH2, &[n, h])?),
                )
            }
            1 => {
                r.run(
                    sched,
                    "mlp.gelu2.backward",
                    Op::GeluBackward {
                        x: s(Z2, &[n, h])?,
                        dy: s(DH2, &[n, h])?,
                        dx: s(DH2, &[n, h])?,
                    },
                )?;
                r.linear_backward(
                    sched,
                    mb,
                    "mlp.l2.backward",
                    s(H1, &[n, h])?,
                    w2,
                    b2,
                    s(DH2, &[n, h])?,
                    Some(s(DH1, &[n, h])?),
                )
            }
            _ => {
                r.run(
                    sched,
                    "mlp.gelu1.backward",
                    Op::GeluBackward {
                        x: s(Z1, &[n, h])?,
                        dy: s(DH1, &[n, h])?,
                        dx: s(DH1, &[n, h])?,
                    },
                )?;
                r.linear_backward(
                    sched,
                    mb,
                    "mlp.l1.backward",
                    s(X, &[n, 2 * d])?,
                    w1,
                    b1,
                    s(DH1, &[n, h])?,
                    Some(s(DX, &[n, 2 * d])?),
                )?;
                r.run(
                    sched,
                    "mlp.embed.backward",
                    Op::ScatterAdd {
                        src: s(DX, &[2 * n, d])?,
                        indices: whole(mb.tokens, DType::I32, &[2 * n])?,
                        table: r.grad(embed, mb)?,
                    },
                )
            }
        }
    }

    fn logits(&self, r: &Replica) -> (Handle, u64) {
        (r.scratch[LOGITS], self.shape.classes)
    }
}
