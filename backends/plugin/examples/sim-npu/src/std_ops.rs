//! The standard operations (ABI 1.1) on arena memory: every operation on every dtype it
//! is defined on, computed by the HAL's reference (`xpu_hal::reference::ops::run`)
//! through a [`TensorIo`] over the device's buffers.
//!
//! An operation is turned into the HAL's `Op` and checked when it is enqueued (so a bad
//! descriptor is refused at once); the worker runs it. The reference reads every input
//! before it writes any output and checks indices and labels first, so in-place
//! operations need no care and an index out of range fails the work — naming its
//! position and value — with nothing written.

use xpu_hal::ops::{self as hal, HasLayout, Layout};
use xpu_hal::reference::ops::{pack, run, unpack, TensorIo};
use xpu_plugin_sdk::{
    BufferRange, DType, Distribution, Error, Op, OpKind, OpParams, OpSupport, ReduceOp, Result,
    Tensor,
};

use crate::arena::Buffer;
use crate::ops::{view, view_mut};

/// Every standard operation on every dtype it is defined on (the device supports every
/// dtype).
pub(crate) fn supported() -> Vec<OpSupport> {
    hal::OpSupport::all(&xpu_hal::DType::ALL)
        .into_iter()
        .filter_map(|s| {
            Some(OpSupport {
                kind: OpKind::from_raw(s.kind.id())?,
                dtypes: s.dtypes.into_iter().map(sdk_dtype).collect(),
            })
        })
        .collect()
}

fn sdk_dtype(d: xpu_hal::DType) -> DType {
    match d {
        xpu_hal::DType::F32 => DType::F32,
        xpu_hal::DType::F64 => DType::F64,
        xpu_hal::DType::F16 => DType::F16,
        xpu_hal::DType::BF16 => DType::BF16,
        xpu_hal::DType::I32 => DType::I32,
        xpu_hal::DType::I64 => DType::I64,
        xpu_hal::DType::U8 => DType::U8,
    }
}

/// The HAL's dtype of an SDK dtype.
pub(crate) fn hal_dtype(d: DType) -> xpu_hal::DType {
    match d {
        DType::F32 => xpu_hal::DType::F32,
        DType::F64 => xpu_hal::DType::F64,
        DType::F16 => xpu_hal::DType::F16,
        DType::BF16 => xpu_hal::DType::BF16,
        DType::I32 => xpu_hal::DType::I32,
        DType::I64 => xpu_hal::DType::I64,
        DType::U8 => xpu_hal::DType::U8,
    }
}

/// A HAL error as the plugin's, keeping the remedy.
fn sdk_error(e: xpu_hal::Error) -> Error {
    match e {
        xpu_hal::Error::InvalidArgument { message } => Error::invalid_argument(message),
        xpu_hal::Error::Unsupported { message } => Error::unsupported(message),
        other => Error::internal(other.to_string()),
    }
}

/// A tensor in arena memory: its layout and the bytes it spans.
pub(crate) struct SimTensor {
    layout: Layout,
    range: BufferRange<Buffer>,
}

impl HasLayout for SimTensor {
    fn layout(&self) -> &Layout {
        &self.layout
    }
}

/// Reads and writes tensors' elements in the arena.
struct Arena;

impl TensorIo<SimTensor> for Arena {
    fn read(&mut self, t: &SimTensor) -> xpu_hal::Result<Vec<u8>> {
        // SAFETY: the range lies in a live buffer and spans exactly the layout's bytes
        // (checked by the SDK); the view ends with this call, before any write.
        Ok(pack(unsafe { view::<u8>(&t.range) }, &t.layout))
    }

    fn write(&mut self, t: &SimTensor, packed: &[u8]) -> xpu_hal::Result<()> {
        // SAFETY: as above; no other view of the arena is live during the call (reads
        // end before it), and the stream's worker is the only one running this stream's
        // work.
        unpack(unsafe { view_mut::<u8>(&t.range) }, &t.layout, packed);
        Ok(())
    }
}

fn sim_tensor(t: Tensor<Buffer>) -> Result<SimTensor> {
    let layout = Layout::strided(hal_dtype(t.dtype), &t.dims, &t.strides).map_err(sdk_error)?;
    Ok(SimTensor {
        layout,
        range: t.range,
    })
}

fn mismatch(kind: OpKind, params: &OpParams) -> Error {
    Error::internal(format!("{kind} came with the parameters {params:?}"))
}

/// The HAL's operation of `kind` on `tensors` (in the header's order).
fn hal_op<T>(kind: OpKind, tensors: Vec<T>, params: OpParams) -> Result<hal::Op<T>> {
    let count = tensors.len();
    let mut it = tensors.into_iter();
    let mut next = || {
        it.next().ok_or_else(|| {
            Error::invalid_argument(format!("{kind} was given {count} tensors, too few"))
        })
    };
    use hal::Op as H;
    Ok(match kind {
        OpKind::Matmul => {
            let OpParams::Matmul {
                trans_a,
                trans_b,
                alpha,
                beta,
            } = params
            else {
                return Err(mismatch(kind, &params));
            };
            H::Matmul {
                a: next()?,
                b: next()?,
                c: next()?,
                trans_a,
                trans_b,
                alpha,
                beta,
            }
        }
        OpKind::BiasAdd => H::BiasAdd {
            x: next()?,
            bias: next()?,
            y: next()?,
        },
        OpKind::Relu => H::Relu {
            x: next()?,
            y: next()?,
        },
        OpKind::ReluBackward => H::ReluBackward {
            x: next()?,
            dy: next()?,
            dx: next()?,
        },
        OpKind::Gelu => H::Gelu {
            x: next()?,
            y: next()?,
        },
        OpKind::GeluBackward => H::GeluBackward {
            x: next()?,
            dy: next()?,
            dx: next()?,
        },
        OpKind::Softmax => H::Softmax {
            x: next()?,
            y: next()?,
        },
        OpKind::SoftmaxBackward => H::SoftmaxBackward {
            y: next()?,
            dy: next()?,
            dx: next()?,
        },
        OpKind::CrossEntropy => H::CrossEntropy {
            logits: next()?,
            labels: next()?,
            loss: next()?,
        },
        OpKind::CrossEntropyBackward => H::CrossEntropyBackward {
            logits: next()?,
            labels: next()?,
            dloss: next()?,
            dlogits: next()?,
        },
        OpKind::LayerNorm => {
            let OpParams::LayerNorm { eps } = params else {
                return Err(mismatch(kind, &params));
            };
            H::LayerNorm {
                x: next()?,
                gamma: next()?,
                beta: next()?,
                y: next()?,
                mean: next()?,
                rstd: next()?,
                eps,
            }
        }
        OpKind::LayerNormBackward => H::LayerNormBackward {
            x: next()?,
            gamma: next()?,
            mean: next()?,
            rstd: next()?,
            dy: next()?,
            dx: next()?,
            dgamma: next()?,
            dbeta: next()?,
        },
        OpKind::Gather => H::Gather {
            table: next()?,
            indices: next()?,
            out: next()?,
        },
        OpKind::ScatterAdd => H::ScatterAdd {
            src: next()?,
            indices: next()?,
            table: next()?,
        },
        OpKind::Reduce => {
            let OpParams::Reduce { op, axis } = params else {
                return Err(mismatch(kind, &params));
            };
            H::Reduce {
                x: next()?,
                y: next()?,
                op: match op {
                    ReduceOp::Sum => hal::ReduceOp::Sum,
                    ReduceOp::Mean => hal::ReduceOp::Mean,
                    ReduceOp::Max => hal::ReduceOp::Max,
                    ReduceOp::Min => hal::ReduceOp::Min,
                },
                axis,
            }
        }
        OpKind::SgdMomentum => {
            let OpParams::SgdMomentum {
                lr,
                momentum,
                weight_decay,
                nesterov,
            } = params
            else {
                return Err(mismatch(kind, &params));
            };
            H::SgdMomentum {
                param: next()?,
                grad: next()?,
                velocity: next()?,
                lr,
                momentum,
                weight_decay,
                nesterov,
            }
        }
        OpKind::AdamW => {
            let OpParams::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                step,
            } = params
            else {
                return Err(mismatch(kind, &params));
            };
            H::AdamW {
                param: next()?,
                grad: next()?,
                m: next()?,
                v: next()?,
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                step,
            }
        }
        OpKind::Random => {
            let OpParams::Random { dist, seed, offset } = params else {
                return Err(mismatch(kind, &params));
            };
            H::Random {
                y: next()?,
                dist: match dist {
                    Distribution::Bits => hal::Distribution::Bits,
                    Distribution::Uniform { low, high } => hal::Distribution::Uniform { low, high },
                    Distribution::Normal { mean, std } => hal::Distribution::Normal { mean, std },
                },
                seed,
                offset,
            }
        }
        OpKind::Dropout => {
            let OpParams::Dropout { p, seed, offset } = params else {
                return Err(mismatch(kind, &params));
            };
            H::Dropout {
                x: next()?,
                y: next()?,
                p,
                seed,
                offset,
            }
        }
    })
}

/// The operation as the HAL's, checked (shapes, dtypes, parameters): refused at once if
/// anything is wrong.
pub(crate) fn prepare(op: Op<Buffer>) -> Result<hal::Op<SimTensor>> {
    let kind = op.kind;
    let tensors = op
        .tensors
        .into_iter()
        .map(sim_tensor)
        .collect::<Result<Vec<_>>>()?;
    let op = hal_op(kind, tensors, op.params)?;
    hal::check(&op).map_err(|e| sdk_error(e).context(kind))?;
    Ok(op)
}

/// Runs a prepared operation (on the stream's worker).
pub(crate) fn execute(op: &hal::Op<SimTensor>) -> Result<()> {
    run(op, &mut Arena).map_err(|e| sdk_error(e).context(op.kind()))
}
