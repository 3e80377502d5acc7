//! The standard operations (ABI 1.1) as Rust values: [`OpKind`], the tensors
//! ([`Tensor`]) and parameters ([`OpParams`]) of one operation ([`Op`]), and what a
//! device lists ([`OpSupport`]).
//!
//! The meaning of every operation is the HAL's (`xpu_hal::ops::Op`); the header lists
//! each one's tensors, in the order [`Op::tensors`] holds them, and its parameters.

use std::fmt;

use crate::abi;
use crate::types::{BufferRange, DType};

macro_rules! op_kinds {
    ($($variant:ident = $raw:path, $name:literal, $tensors:literal;)*) => {
        /// `XPU_OP_*`: which standard operation.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpKind {
            $(
                #[doc = concat!("`", $name, "`.")]
                $variant,
            )*
        }

        impl OpKind {
            /// Every operation of ABI 1.1, in the order of their numbers.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$variant),*];

            /// The C value (`XPU_OP_*`, the HAL's `OpKind::id`).
            pub const fn raw(self) -> u32 {
                match self {
                    $(OpKind::$variant => $raw,)*
                }
            }

            /// The operation of a C value, or `None` for a number this ABI version does
            /// not define.
            pub const fn from_raw(raw: u32) -> Option<Self> {
                match raw {
                    $($raw => Some(OpKind::$variant),)*
                    _ => None,
                }
            }

            /// The snake-case name (`"relu_backward"`), as the HAL spells it.
            pub const fn name(self) -> &'static str {
                match self {
                    $(OpKind::$variant => $name,)*
                }
            }

            /// How many tensors the operation takes.
            pub const fn tensor_count(self) -> usize {
                match self {
                    $(OpKind::$variant => $tensors,)*
                }
            }
        }
    };
}

op_kinds! {
    Matmul = abi::op::MATMUL, "matmul", 3;
    BiasAdd = abi::op::BIAS_ADD, "bias_add", 3;
    Relu = abi::op::RELU, "relu", 2;
    ReluBackward = abi::op::RELU_BACKWARD, "relu_backward", 3;
    Gelu = abi::op::GELU, "gelu", 2;
    GeluBackward = abi::op::GELU_BACKWARD, "gelu_backward", 3;
    Softmax = abi::op::SOFTMAX, "softmax", 2;
    SoftmaxBackward = abi::op::SOFTMAX_BACKWARD, "softmax_backward", 3;
    CrossEntropy = abi::op::CROSS_ENTROPY, "cross_entropy", 3;
    CrossEntropyBackward = abi::op::CROSS_ENTROPY_BACKWARD, "cross_entropy_backward", 4;
    LayerNorm = abi::op::LAYER_NORM, "layer_norm", 6;
    LayerNormBackward = abi::op::LAYER_NORM_BACKWARD, "layer_norm_backward", 8;
    Gather = abi::op::GATHER, "gather", 3;
    ScatterAdd = abi::op::SCATTER_ADD, "scatter_add", 3;
    Reduce = abi::op::REDUCE, "reduce", 2;
    SgdMomentum = abi::op::SGD_MOMENTUM, "sgd_momentum", 3;
    AdamW = abi::op::ADAMW, "adamw", 4;
    Random = abi::op::RANDOM, "random", 1;
    Dropout = abi::op::DROPOUT, "dropout", 2;
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `xpu_reduce_op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The mean.
    Mean,
    /// The largest value (NaN if any is NaN).
    Max,
    /// The smallest value (NaN if any is NaN).
    Min,
}

impl ReduceOp {
    /// The operator of a C value, or `None` for one this ABI version does not define.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        Some(match raw {
            abi::reduce_op::SUM => ReduceOp::Sum,
            abi::reduce_op::MEAN => ReduceOp::Mean,
            abi::reduce_op::MAX => ReduceOp::Max,
            abi::reduce_op::MIN => ReduceOp::Min,
            _ => return None,
        })
    }
}

/// `xpu_random_distribution` with its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// Philox's raw 32-bit outputs, as `i32`.
    Bits,
    /// Uniform in `[low, high)`.
    Uniform {
        /// Lower bound.
        low: f32,
        /// Upper bound.
        high: f32,
    },
    /// Normal.
    Normal {
        /// Mean.
        mean: f32,
        /// Standard deviation.
        std: f32,
    },
}

/// The parameters of an operation (see the HAL's `Op` for their meaning).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OpParams {
    /// The operation has none.
    None,
    /// [`OpKind::Matmul`].
    Matmul {
        /// `a` is given transposed (`[K, M]`).
        trans_a: bool,
        /// `b` is given transposed (`[N, K]`).
        trans_b: bool,
        /// Factor of the product.
        alpha: f32,
        /// Factor of `c`'s previous value (0: `c` is not read).
        beta: f32,
    },
    /// [`OpKind::LayerNorm`].
    LayerNorm {
        /// Added to the variance.
        eps: f32,
    },
    /// [`OpKind::Reduce`].
    Reduce {
        /// What to compute.
        op: ReduceOp,
        /// The dimension reduced.
        axis: u32,
    },
    /// [`OpKind::SgdMomentum`].
    SgdMomentum {
        /// Learning rate.
        lr: f32,
        /// Momentum factor.
        momentum: f32,
        /// L2 penalty.
        weight_decay: f32,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// [`OpKind::AdamW`].
    AdamW {
        /// Learning rate.
        lr: f32,
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Added to the denominator.
        eps: f32,
        /// Decoupled weight decay.
        weight_decay: f32,
        /// The step number, from 1.
        step: u32,
    },
    /// [`OpKind::Random`].
    Random {
        /// What to draw.
        dist: Distribution,
        /// Key.
        seed: u64,
        /// First counter.
        offset: u64,
    },
    /// [`OpKind::Dropout`].
    Dropout {
        /// Probability of dropping an element.
        p: f32,
        /// Key.
        seed: u64,
        /// First counter.
        offset: u64,
    },
}

/// One tensor of an operation: element `[i0, i1, …]` lies `Σ ik·strides[k]` elements
/// after element 0, which is at `range.offset`.
///
/// Guaranteed by the SDK: rank 1 to [`abi::XPU_MAX_RANK`], one stride per dimension; the
/// range lies in a buffer of the stream's device, starts at a multiple of the dtype's
/// size and is exactly as long as the bytes the layout spans, so every element the
/// layout addresses lies within it.
pub struct Tensor<B> {
    /// The element type.
    pub dtype: DType,
    /// The shape.
    pub dims: Vec<u64>,
    /// The strides, in elements (0 broadcasts an input).
    pub strides: Vec<u64>,
    /// The bytes spanned.
    pub range: BufferRange<B>,
}

impl<B> Tensor<B> {
    /// The number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

impl<B> Clone for Tensor<B> {
    fn clone(&self) -> Self {
        Tensor {
            dtype: self.dtype,
            dims: self.dims.clone(),
            strides: self.strides.clone(),
            range: self.range.clone(),
        }
    }
}

impl<B> fmt::Debug for Tensor<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("dims", &self.dims)
            .field("strides", &self.strides)
            .field("range", &self.range)
            .finish()
    }
}

/// A standard operation, checked by the SDK: a known kind, its number of tensors (in
/// the header's order), parameters of the kind. The host has checked the rest (see the
/// header): shapes, dtypes, parameters, overlaps.
pub struct Op<B> {
    /// Which operation.
    pub kind: OpKind,
    /// Its tensors, in the header's order.
    pub tensors: Vec<Tensor<B>>,
    /// Its parameters.
    pub params: OpParams,
}

impl<B> Clone for Op<B> {
    fn clone(&self) -> Self {
        Op {
            kind: self.kind,
            tensors: self.tensors.clone(),
            params: self.params,
        }
    }
}

impl<B> fmt::Debug for Op<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Op")
            .field("kind", &self.kind)
            .field("tensors", &self.tensors)
            .field("params", &self.params)
            .finish()
    }
}

/// One operation a device provides, with the dtypes (of its first tensor) it provides
/// it for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpSupport {
    /// The operation.
    pub kind: OpKind,
    /// Its dtypes on this device.
    pub dtypes: Vec<DType>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_both_ways_and_count_from_one() {
        for (i, k) in OpKind::ALL.iter().enumerate() {
            assert_eq!(k.raw(), i as u32 + 1);
            assert_eq!(OpKind::from_raw(k.raw()), Some(*k));
            assert!((1..=abi::XPU_OP_MAX_TENSORS).contains(&k.tensor_count()));
        }
        assert_eq!(OpKind::from_raw(0), None);
        assert_eq!(OpKind::from_raw(20), None);
        assert_eq!(OpKind::Dropout.name(), "dropout");
    }
}
