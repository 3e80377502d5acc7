//! The standard operations: what a training step is made of (matrix multiply,
//! activations, softmax, cross-entropy, layer norm, embeddings, reductions, optimizer
//! updates, counter-based random numbers), with one meaning on every device.
//!
//! ## Design
//!
//! - **One enum, three tensor types.** [`Op<T>`] names an operation and its parameters;
//!   its tensors are `T`. Above the HAL they are [`Tensor`]s (a [`Layout`] on an
//!   [`crate::Allocation`]); [`crate::Stream::run_op`] checks them and hands the backend
//!   an `Op<`[`RawTensor`]`>`; the reference ([`crate::reference::ops`]) and tests use
//!   `Op<`[`Layout`]`>` or their own types. The enum, its operand list and its
//!   conversions are generated from one table, so an operation is described once.
//! - **Optional and listed.** A device lists the operations it provides, with their
//!   dtypes, in [`crate::Capabilities::ops`] ([`OpSupport`]); anything else is
//!   `Unsupported` before it reaches the backend. Every operation has a stable number
//!   ([`OpKind::id`]) that the plugin ABI uses, so adding an operation later changes no
//!   existing one: an older backend simply does not list it.
//! - **Checked once.** Shapes, dtypes, strides, bounds, aliasing and parameters are
//!   checked by the HAL ([`check`]). A backend receives only non-empty tensors of the
//!   documented shapes; an operation with an empty tensor does nothing.
//!
//! ## Shared rules
//!
//! - Floating-point dtypes (`f32`, `f64`, `f16`, `bf16`) unless an operand says
//!   otherwise; all float tensors of an operation share its dtype (the dtype of its first
//!   operand), except layer norm's `mean`/`rstd`, which are `f32` (`f64` for `f64`).
//!   Indices and labels are `i32`.
//! - Computation is at least in `f32` (`f64` for `f64`), each result rounded once to its
//!   tensor's dtype; sums (matmul, softmax, norms, reductions) accumulate in `f32` or
//!   wider, in any order. The reference computes in `f64`; the `training` conformance
//!   profile documents how far a device may be from it per dtype.
//! - Strides may be anything (in elements) on inputs, 0 included (broadcast). A written
//!   tensor must address each element once ([`Layout::is_one_to_one`]) and may not
//!   overlap any other operand, except where an operation allows it to be the very same
//!   tensor as an input (in-place).
//! - Rows: softmax, cross-entropy, layer norm and bias add work on `[rows, n]` tensors,
//!   along the last dimension.

mod check;
mod layout;
mod philox;
pub(crate) mod resolve;
mod tensor;

pub use check::check;
pub use layout::{Layout, MAX_RANK};
pub use philox::{philox4x32_10, uniform_from_bits, PhiloxStream};
pub use tensor::{HasLayout, RawTensor, Tensor};

use std::fmt;

use crate::dtype::DType;

/// How an operation uses one of its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Only read.
    Read,
    /// Only written (its previous contents do not matter).
    Write,
    /// Read and written (an accumulator, an optimizer state).
    ReadWrite,
}

impl Access {
    /// Whether the operation writes the tensor.
    pub fn writes(self) -> bool {
        !matches!(self, Access::Read)
    }
}

/// One tensor of an operation, as [`Op::operands`] lists them.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a, T> {
    /// The field's name (`"a"`, `"dy"`, `"labels"` …), for messages.
    pub name: &'static str,
    /// How the operation uses it.
    pub access: Access,
    /// The tensor.
    pub tensor: &'a T,
}

/// What a random-number operation draws.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// The raw 32-bit outputs of Philox, stored as `i32` (bit-exact on every device).
    Bits,
    /// Uniform in `[low, high)`: `low + (high - low)·u` with `u` from
    /// [`uniform_from_bits`] (exact in `f32`, so bit-exact for `f32` outputs).
    Uniform {
        /// Lower bound.
        low: f32,
        /// Upper bound.
        high: f32,
    },
    /// Normal with the given mean and standard deviation, by Box–Muller on pairs of
    /// outputs (within tolerance on every device, since it uses `log`, `cos` and `sin`).
    Normal {
        /// Mean.
        mean: f32,
        /// Standard deviation.
        std: f32,
    },
}

/// A reduction along one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

macro_rules! standard_ops {
    ($(
        $(#[$meta:meta])*
        $variant:ident = $id:literal, $name:literal {
            $( $(#[$tmeta:meta])* $tensor:ident : $access:ident, )*
            ;
            $( $(#[$pmeta:meta])* $param:ident : $ptype:ty, )*
        }
    )*) => {
        /// A standard operation on tensors of type `T` (see the module docs for the
        /// rules every one follows).
        #[derive(Debug, Clone, PartialEq)]
        pub enum Op<T> {
            $(
                $(#[$meta])*
                $variant {
                    $( $(#[$tmeta])* $tensor: T, )*
                    $( $(#[$pmeta])* $param: $ptype, )*
                },
            )*
        }

        /// Which standard operation: what a device lists in
        /// [`crate::Capabilities::ops`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u32)]
        pub enum OpKind {
            $(
                $(#[$meta])*
                $variant = $id,
            )*
        }

        impl OpKind {
            /// Every operation, in the order of their numbers.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$variant),*];

            /// The stable number (the plugin ABI's `XPU_OP_…` constant).
            pub const fn id(self) -> u32 {
                self as u32
            }

            /// The operation with number `id`, if this build knows it.
            pub fn from_id(id: u32) -> Option<OpKind> {
                OpKind::ALL.iter().copied().find(|k| k.id() == id)
            }

            /// The snake-case name used on the command line and in reports.
            pub const fn name(self) -> &'static str {
                match self {
                    $(OpKind::$variant => $name,)*
                }
            }
        }

        impl<T> Op<T> {
            /// Which operation this is.
            pub fn kind(&self) -> OpKind {
                match self {
                    $(Op::$variant { .. } => OpKind::$variant,)*
                }
            }

            /// The tensors, the operation's main operand first (its dtype is the
            /// operation's).
            pub fn operands(&self) -> Vec<Operand<'_, T>> {
                match self {
                    $(
                        #[allow(unused_variables)]
                        Op::$variant { $($tensor,)* .. } => vec![
                            $(Operand { name: stringify!($tensor), access: Access::$access, tensor: $tensor },)*
                        ],
                    )*
                }
            }

            /// The same operation with each tensor converted by `f` (given the
            /// operand's name and access), stopping at the first error.
            pub fn try_map<U, E>(
                self,
                mut f: impl FnMut(&'static str, Access, T) -> Result<U, E>,
            ) -> Result<Op<U>, E> {
                Ok(match self {
                    $(
                        Op::$variant { $($tensor,)* $($param,)* } => Op::$variant {
                            $( $tensor: f(stringify!($tensor), Access::$access, $tensor)?, )*
                            $( $param, )*
                        },
                    )*
                })
            }

            /// The same operation with references to its tensors.
            pub fn by_ref(&self) -> Op<&T> {
                match self {
                    $(
                        Op::$variant { $($tensor,)* $($param,)* } => Op::$variant {
                            $( $tensor, )*
                            $( $param: *$param, )*
                        },
                    )*
                }
            }
        }
    };
}

standard_ops! {
    /// `c = alpha·op(a)·op(b) + beta·c` for `a` `[M, K]`, `b` `[K, N]`, `c` `[M, N]`
    /// (`op(x)` is `x`, or `xᵀ` when `trans_x`, so a transposed `a` is `[K, M]`), or the
    /// same with a leading batch dimension on all three (stride 0 broadcasts an operand
    /// across the batch). When `beta` is 0, `c` is not read (NaN in it is ignored).
    Matmul = 1, "matmul" {
        /// Left operand.
        a: Read,
        /// Right operand.
        b: Read,
        /// Result (and, scaled by `beta`, an addend).
        c: ReadWrite,
        ;
        /// Whether `a` is given transposed (`[K, M]`).
        trans_a: bool,
        /// Whether `b` is given transposed (`[N, K]`).
        trans_b: bool,
        /// Factor of the product.
        alpha: f32,
        /// Factor of `c`'s previous value (1 accumulates, 0 overwrites).
        beta: f32,
    }
    /// `y[r, j] = x[r, j] + bias[j]` for `x`, `y` `[rows, n]` and `bias` `[n]`; `y` may
    /// be `x` itself.
    BiasAdd = 2, "bias_add" {
        /// Input.
        x: Read,
        /// Per-column addend.
        bias: Read,
        /// Output.
        y: Write,
        ;
    }
    /// `y = max(x, 0)` elementwise (NaN stays NaN); `y` may be `x` itself.
    Relu = 3, "relu" {
        /// Input.
        x: Read,
        /// Output (same shape).
        y: Write,
        ;
    }
    /// `dx = dy` where `x > 0`, else 0; `dx` may be `dy` itself.
    ReluBackward = 4, "relu_backward" {
        /// The forward input.
        x: Read,
        /// Gradient of the output.
        dy: Read,
        /// Gradient of the input.
        dx: Write,
        ;
    }
    /// GELU, tanh approximation: `y = x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`; `y` may
    /// be `x` itself.
    Gelu = 5, "gelu" {
        /// Input.
        x: Read,
        /// Output (same shape).
        y: Write,
        ;
    }
    /// `dx = dy·gelu'(x)` (the derivative of [`OpKind::Gelu`]'s formula); `dx` may be
    /// `dy` itself.
    GeluBackward = 6, "gelu_backward" {
        /// The forward input.
        x: Read,
        /// Gradient of the output.
        dy: Read,
        /// Gradient of the input.
        dx: Write,
        ;
    }
    /// Softmax of each row of `x` `[rows, n]` (stable: the row's maximum subtracted
    /// first).
    Softmax = 7, "softmax" {
        /// Input.
        x: Read,
        /// Output (same shape).
        y: Write,
        ;
    }
    /// `dx[r, j] = y[r, j]·(dy[r, j] − Σk dy[r, k]·y[r, k])`, from the forward output `y`.
    SoftmaxBackward = 8, "softmax_backward" {
        /// The forward output.
        y: Read,
        /// Gradient of the output.
        dy: Read,
        /// Gradient of the input.
        dx: Write,
        ;
    }
    /// `loss[r] = logsumexp(logits[r]) − logits[r, labels[r]]` for `logits` `[rows,
    /// classes]`; a label of −1 ignores its row (loss 0); any other label outside `[0,
    /// classes)` fails the operation naming the row.
    CrossEntropy = 9, "cross_entropy" {
        /// Unnormalised scores.
        logits: Read,
        /// `i32` class per row.
        labels: Read,
        /// Per-row loss `[rows]`.
        loss: Write,
        ;
    }
    /// `dlogits[r, j] = (softmax(logits[r])[j] − [j = labels[r]])·dloss[r]`; rows with
    /// label −1 get 0.
    CrossEntropyBackward = 10, "cross_entropy_backward" {
        /// The forward scores.
        logits: Read,
        /// `i32` class per row.
        labels: Read,
        /// Gradient of each row's loss `[rows]`.
        dloss: Read,
        /// Gradient of the scores.
        dlogits: Write,
        ;
    }
    /// Layer norm of each row of `x` `[rows, n]`: `y = (x − mean)·rstd·gamma + beta`
    /// with `rstd = 1/√(var + eps)` (biased variance), also storing each row's `mean`
    /// and `rstd` (`[rows]`, `f32`) for the backward pass.
    LayerNorm = 11, "layer_norm" {
        /// Input.
        x: Read,
        /// Scale `[n]`.
        gamma: Read,
        /// Shift `[n]`.
        beta: Read,
        /// Output.
        y: Write,
        /// Row means.
        mean: Write,
        /// Row reciprocal standard deviations.
        rstd: Write,
        ;
        /// Added to the variance (at least 0, finite).
        eps: f32,
    }
    /// Gradients of [`OpKind::LayerNorm`]: `dx`, and `dgamma`, `dbeta` `[n]` summed over
    /// the rows (overwritten, not accumulated).
    LayerNormBackward = 12, "layer_norm_backward" {
        /// The forward input.
        x: Read,
        /// The forward scale.
        gamma: Read,
        /// The forward row means.
        mean: Read,
        /// The forward row reciprocal standard deviations.
        rstd: Read,
        /// Gradient of the output.
        dy: Read,
        /// Gradient of the input.
        dx: Write,
        /// Gradient of the scale.
        dgamma: Write,
        /// Gradient of the shift.
        dbeta: Write,
        ;
    }
    /// `out[i, :] = table[indices[i], :]` for `table` `[rows, dim]`, `indices` `[n]`
    /// (`i32`), `out` `[n, dim]`; any dtype, bit-exact. An index outside `[0, rows)`
    /// fails the operation naming its position.
    Gather = 13, "gather" {
        /// The embedding table.
        table: Read,
        /// Row of each output.
        indices: Read,
        /// Gathered rows.
        out: Write,
        ;
    }
    /// `table[indices[i], :] += src[i, :]` for every `i` (repeated indices add up): the
    /// gradient of [`OpKind::Gather`]. An index outside `[0, rows)` fails the operation
    /// naming its position, before anything is added.
    ScatterAdd = 14, "scatter_add" {
        /// Rows to add `[n, dim]`.
        src: Read,
        /// Destination row of each.
        indices: Read,
        /// The table added to `[rows, dim]`.
        table: ReadWrite,
        ;
    }
    /// `y` = the reduction of `x` along `axis`: `y` has `x`'s shape with that dimension 1.
    Reduce = 15, "reduce" {
        /// Input.
        x: Read,
        /// Output.
        y: Write,
        ;
        /// What to compute.
        op: ReduceOp,
        /// The dimension reduced.
        axis: u32,
    }
    /// SGD with momentum and weight decay (PyTorch's): `g = grad + weight_decay·param`,
    /// `velocity = momentum·velocity + g`, `param −= lr·(nesterov ? g + momentum·velocity
    /// : velocity)`. All four tensors have one shape.
    SgdMomentum = 16, "sgd_momentum" {
        /// Parameters (updated).
        param: ReadWrite,
        /// Gradients.
        grad: Read,
        /// Momentum buffer (updated; zeros before the first step).
        velocity: ReadWrite,
        ;
        /// Learning rate.
        lr: f32,
        /// Momentum factor.
        momentum: f32,
        /// L2 penalty.
        weight_decay: f32,
        /// Nesterov momentum.
        nesterov: bool,
    }
    /// AdamW (decoupled weight decay): `m = β1·m + (1−β1)·g`, `v = β2·v + (1−β2)·g²`,
    /// `param −= lr·(m/(1−β1^step) / (√(v/(1−β2^step)) + eps) + weight_decay·param)`.
    AdamW = 17, "adamw" {
        /// Parameters (updated).
        param: ReadWrite,
        /// Gradients.
        grad: Read,
        /// First moment (updated; zeros before step 1).
        m: ReadWrite,
        /// Second moment (updated; zeros before step 1).
        v: ReadWrite,
        ;
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
        /// The step number, from 1 (for bias correction).
        step: u32,
    }
    /// Counter-based random numbers: element `n` (row-major) of `y` takes output `n mod
    /// 4` of Philox 4x32-10 with key `seed` and counter `offset + n/4` (see
    /// [`PhiloxStream`]), so the same seed and offset give the same bits on every device
    /// and a later call continues with `offset + ceil(elements/4)`.
    Random = 18, "random" {
        /// Output (`i32` for bits, float otherwise).
        y: Write,
        ;
        /// What to draw.
        dist: Distribution,
        /// Key.
        seed: u64,
        /// First counter.
        offset: u64,
    }
    /// Inverted dropout: `y[n] = u[n] ≥ p ? x[n]/(1−p) : 0` with `u[n]` the uniform of
    /// element `n` as [`OpKind::Random`] draws it, so the backward pass is the same
    /// operation (same seed and offset) on the output gradient; `y` may be `x` itself.
    Dropout = 19, "dropout" {
        /// Input.
        x: Read,
        /// Output (same shape).
        y: Write,
        ;
        /// Probability of dropping an element, in `[0, 1)`.
        p: f32,
        /// Key.
        seed: u64,
        /// First counter.
        offset: u64,
    }
}

impl OpKind {
    /// Whether the output may be the very same tensor as this input (in place).
    pub fn in_place_pairs(self) -> &'static [(&'static str, &'static str)] {
        match self {
            OpKind::BiasAdd | OpKind::Relu | OpKind::Gelu | OpKind::Dropout => &[("x", "y")],
            OpKind::ReluBackward | OpKind::GeluBackward => &[("dy", "dx")],
            _ => &[],
        }
    }

    /// The dtypes the operation is defined on (a device lists a subset).
    pub fn dtypes(self) -> &'static [DType] {
        const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];
        const ANY: &[DType] = &[
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
            DType::U8,
        ];
        const RANDOM: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32];
        match self {
            OpKind::Gather => ANY,
            OpKind::Random => RANDOM,
            _ => FLOATS,
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for OpKind {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OpKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                crate::Error::invalid(format!(
                    "unknown operation `{s}`; the standard operations are {}",
                    OpKind::ALL
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }
}

/// One operation a device provides, with the dtypes it provides it for (of its main
/// operand; see [`Op::operands`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpSupport {
    /// The operation.
    pub kind: OpKind,
    /// Its dtypes on this device.
    pub dtypes: Vec<DType>,
}

impl OpSupport {
    /// Every operation on `dtypes` (each limited to the dtypes it is defined on).
    pub fn all(dtypes: &[DType]) -> Vec<OpSupport> {
        OpKind::ALL
            .iter()
            .map(|&kind| OpSupport {
                kind,
                dtypes: kind
                    .dtypes()
                    .iter()
                    .copied()
                    .filter(|d| dtypes.contains(d))
                    .collect(),
            })
            .filter(|s| !s.dtypes.is_empty())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_have_stable_unique_ids_and_names() {
        let mut ids: Vec<u32> = OpKind::ALL.iter().map(|k| k.id()).collect();
        ids.dedup();
        assert_eq!(ids.len(), OpKind::ALL.len());
        assert_eq!(OpKind::Matmul.id(), 1);
        assert_eq!(OpKind::Dropout.id(), 19);
        for &k in OpKind::ALL {
            assert_eq!(OpKind::from_id(k.id()), Some(k));
            assert_eq!(k.name().parse::<OpKind>().unwrap(), k);
        }
        assert!(OpKind::from_id(0).is_none());
        assert!("conv".parse::<OpKind>().is_err());
    }

    #[test]
    fn operands_and_map_keep_order() {
        let op: Op<u32> = Op::Matmul {
            a: 1,
            b: 2,
            c: 3,
            trans_a: false,
            trans_b: true,
            alpha: 1.0,
            beta: 0.0,
        };
        let names: Vec<_> = op.operands().iter().map(|o| (o.name, *o.tensor)).collect();
        assert_eq!(names, vec![("a", 1), ("b", 2), ("c", 3)]);
        let mapped = op
            .try_map(|_, access, t| Ok::<_, ()>((t * 10, access.writes())))
            .unwrap();
        assert_eq!(mapped.kind(), OpKind::Matmul);
        let Op::Matmul { c, trans_b, .. } = mapped else {
            panic!("kind changed")
        };
        assert_eq!((c, trans_b), ((30, true), true));
    }
}
