//! From an operation to kernel launches: kernel selection, parameter packing and grid
//! sizing. Pure (no driver calls), so it is unit-tested without a GPU.

use xpu_hal::ops::{Distribution, HasLayout, Layout, Op, ReduceOp, MAX_RANK};
use xpu_hal::{DType, Error, Result};

use super::check::Checked;

/// Threads per block of every operation kernel (16×16 for matmul's tiles).
pub const BLOCK: u32 = 256;
/// Matmul's tile edge.
pub const TILE: u64 = 16;
/// The largest grid dimension used (y and z are limited to 65535; kernels grid-stride).
const MAX_GRID: u64 = 65_535;
/// Tensors an operation may have.
pub const MAX_TENSORS: usize = 8;

/// The parameters of every operation kernel, passed by value (`XpuOpParams` in
/// `common.cu`: same fields in the same order, 704 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpParams {
    /// Device address of each tensor's element 0, in operand order.
    pub ptr: [u64; MAX_TENSORS],
    /// Each tensor's dims.
    pub dims: [[u64; MAX_RANK]; MAX_TENSORS],
    /// Each tensor's strides, in elements.
    pub strides: [[u64; MAX_RANK]; MAX_TENSORS],
    /// Sizes (per kernel: element counts, rows, row length …).
    pub size: [u64; 4],
    /// Integer words (per kernel; `word[3]` is the index-check record or 0).
    pub word: [u64; 4],
    /// Float parameters.
    pub f: [f32; 8],
    /// Each tensor's rank.
    pub rank: [u32; MAX_TENSORS],
}

impl OpParams {
    /// Sets tensor `slot` to `layout` at device address `address`.
    pub fn set(&mut self, slot: usize, layout: &Layout, address: u64) {
        self.ptr[slot] = address;
        self.rank[slot] = layout.rank() as u32;
        for (k, (&d, &s)) in layout.dims().iter().zip(layout.strides()).enumerate() {
            self.dims[slot][k] = d;
            self.strides[slot][k] = s;
        }
    }
}

/// Which kernel (the entry point `xpu_op_<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Entry {
    /// The index/label check.
    CheckIndices,
    /// Tiled matmul.
    Matmul,
    /// Bias add.
    BiasAdd,
    /// ReLU.
    Relu,
    /// ReLU's gradient.
    ReluBackward,
    /// GELU.
    Gelu,
    /// GELU's gradient.
    GeluBackward,
    /// Softmax.
    Softmax,
    /// Softmax's gradient.
    SoftmaxBackward,
    /// Cross-entropy.
    CrossEntropy,
    /// Cross-entropy's gradient.
    CrossEntropyBackward,
    /// Layer norm.
    LayerNorm,
    /// Layer norm's `dx`.
    LayerNormBackwardRows,
    /// Layer norm's `dgamma` and `dbeta`.
    LayerNormBackwardParams,
    /// Gather.
    Gather,
    /// Scatter-add.
    ScatterAdd,
    /// Reduce along an axis.
    Reduce,
    /// SGD with momentum.
    SgdMomentum,
    /// AdamW.
    AdamW,
    /// Random bits (`i32`).
    RandomBits,
    /// Random floats.
    Random,
    /// Dropout.
    Dropout,
}

impl Entry {
    /// The kernel's entry point.
    pub fn name(self) -> &'static str {
        match self {
            Entry::CheckIndices => "xpu_op_check_indices",
            Entry::Matmul => "xpu_op_matmul",
            Entry::BiasAdd => "xpu_op_bias_add",
            Entry::Relu => "xpu_op_relu",
            Entry::ReluBackward => "xpu_op_relu_backward",
            Entry::Gelu => "xpu_op_gelu",
            Entry::GeluBackward => "xpu_op_gelu_backward",
            Entry::Softmax => "xpu_op_softmax",
            Entry::SoftmaxBackward => "xpu_op_softmax_backward",
            Entry::CrossEntropy => "xpu_op_cross_entropy",
            Entry::CrossEntropyBackward => "xpu_op_cross_entropy_backward",
            Entry::LayerNorm => "xpu_op_layer_norm",
            Entry::LayerNormBackwardRows => "xpu_op_layer_norm_backward_rows",
            Entry::LayerNormBackwardParams => "xpu_op_layer_norm_backward_params",
            Entry::Gather => "xpu_op_gather",
            Entry::ScatterAdd => "xpu_op_scatter_add",
            Entry::Reduce => "xpu_op_reduce",
            Entry::SgdMomentum => "xpu_op_sgd_momentum",
            Entry::AdamW => "xpu_op_adamw",
            Entry::RandomBits => "xpu_op_random_bits",
            Entry::Random => "xpu_op_random",
            Entry::Dropout => "xpu_op_dropout",
        }
    }

    /// Every kernel.
    pub const ALL: &'static [Entry] = &[
        Entry::CheckIndices,
        Entry::Matmul,
        Entry::BiasAdd,
        Entry::Relu,
        Entry::ReluBackward,
        Entry::Gelu,
        Entry::GeluBackward,
        Entry::Softmax,
        Entry::SoftmaxBackward,
        Entry::CrossEntropy,
        Entry::CrossEntropyBackward,
        Entry::LayerNorm,
        Entry::LayerNormBackwardRows,
        Entry::LayerNormBackwardParams,
        Entry::Gather,
        Entry::ScatterAdd,
        Entry::Reduce,
        Entry::SgdMomentum,
        Entry::AdamW,
        Entry::RandomBits,
        Entry::Random,
        Entry::Dropout,
    ];
}

/// One kernel launch: which kernel, its grid (blocks of [`BLOCK`] threads), its
/// parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Launch {
    /// The kernel.
    pub entry: Entry,
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// The parameters.
    pub params: OpParams,
}

/// Blocks for a grid-stride loop over `count` items (at least 1; at most 32 per SM).
pub fn blocks_for(count: u64, sm_count: u32) -> u32 {
    count
        .div_ceil(u64::from(BLOCK))
        .min(u64::from(sm_count.max(1)) * 32)
        .clamp(1, MAX_GRID) as u32
}

/// Blocks for one-block-per-row kernels over `rows` rows.
pub fn blocks_for_rows(rows: u64, sm_count: u32) -> u32 {
    rows.min(u64::from(sm_count.max(1)) * 32).clamp(1, MAX_GRID) as u32
}

/// Matmul's grid: one block per 16×16 tile of `c` (`m`×`n`) per batch, limited to
/// 65535 in each dimension (the kernel grid-strides).
pub fn matmul_grid(m: u64, n: u64, batch: u64) -> [u32; 3] {
    let g = |x: u64| x.clamp(1, MAX_GRID) as u32;
    [g(n.div_ceil(TILE)), g(m.div_ceil(TILE)), g(batch)]
}

/// What the operation's index check checks, if it has one.
pub fn checked<T: HasLayout>(op: &Op<T>) -> Option<Checked> {
    match op {
        Op::Gather { table, .. } | Op::ScatterAdd { table, .. } => Some(Checked::Indices {
            rows: table.layout().dims()[0],
        }),
        Op::CrossEntropy { logits, .. } | Op::CrossEntropyBackward { logits, .. } => {
            Some(Checked::Labels {
                classes: logits.layout().dims()[1],
            })
        }
        _ => None,
    }
}

/// The launches of `op` (checked by the HAL, non-empty), in order: `address` gives each
/// tensor's device address; `record` is the index-check record's device address (0 when
/// the operation has none).
pub fn plan<T: HasLayout>(
    op: &Op<T>,
    address: impl Fn(&T) -> u64,
    sm_count: u32,
    record: u64,
) -> Result<Vec<Launch>> {
    let operands = op.operands();
    if operands.len() > MAX_TENSORS {
        return Err(Error::invalid("an operation with more than 8 tensors"));
    }
    let mut p = OpParams::default();
    for (slot, o) in operands.iter().enumerate() {
        p.set(slot, o.tensor.layout(), address(o.tensor));
    }
    p.word[3] = record;
    let first = operands[0].tensor.layout();
    let elements = first.elements();
    let rows = |l: &Layout| (l.dims()[0], l.dims().get(1).copied().unwrap_or(1));
    let flat = |entry: Entry, mut p: OpParams, count: u64| {
        p.size[0] = count;
        Launch {
            entry,
            grid: [blocks_for(count, sm_count), 1, 1],
            params: p,
        }
    };
    let by_rows = |entry: Entry, mut p: OpParams, (r, n): (u64, u64)| {
        p.size[0] = r;
        p.size[1] = n;
        Launch {
            entry,
            grid: [blocks_for_rows(r, sm_count), 1, 1],
            params: p,
        }
    };
    let mut launches = Vec::new();
    if let Some(c) = checked(op) {
        let indices = match op {
            Op::Gather { indices, .. } | Op::ScatterAdd { indices, .. } => indices,
            Op::CrossEntropy { labels, .. } | Op::CrossEntropyBackward { labels, .. } => labels,
            _ => return Err(Error::invalid("internal error: a check without indices")),
        };
        let mut q = OpParams::default();
        q.set(0, indices.layout(), address(indices));
        q.size[0] = c.bound();
        q.word[0] = u64::from(c.allows_minus_one());
        q.word[3] = record;
        launches.push(Launch {
            entry: Entry::CheckIndices,
            grid: [1, 1, 1],
            params: q,
        });
    }
    let launch = match op {
        Op::Matmul {
            a,
            c,
            trans_a,
            trans_b,
            alpha,
            beta,
            ..
        } => {
            let (la, lc) = (a.layout(), c.layout());
            let r = lc.rank();
            let batch = if r == 3 { lc.dims()[0] } else { 1 };
            let (m, n) = (lc.dims()[r - 2], lc.dims()[r - 1]);
            let k = if *trans_a {
                la.dims()[r - 2]
            } else {
                la.dims()[r - 1]
            };
            p.size = [m, n, k, batch];
            p.word[0] = u64::from(*trans_a);
            p.word[1] = u64::from(*trans_b);
            p.f[0] = *alpha;
            p.f[1] = *beta;
            Launch {
                entry: Entry::Matmul,
                grid: matmul_grid(m, n, batch),
                params: p,
            }
        }
        Op::BiasAdd { x, .. } => {
            let (r, n) = rows(x.layout());
            p.size[1] = n;
            let mut l = flat(Entry::BiasAdd, p, r * n);
            l.params.size[0] = r;
            l
        }
        Op::Relu { .. } => flat(Entry::Relu, p, elements),
        Op::ReluBackward { .. } => flat(Entry::ReluBackward, p, elements),
        Op::Gelu { .. } => flat(Entry::Gelu, p, elements),
        Op::GeluBackward { .. } => flat(Entry::GeluBackward, p, elements),
        Op::Softmax { x, .. } => by_rows(Entry::Softmax, p, rows(x.layout())),
        Op::SoftmaxBackward { y, .. } => by_rows(Entry::SoftmaxBackward, p, rows(y.layout())),
        Op::CrossEntropy { logits, .. } => by_rows(Entry::CrossEntropy, p, rows(logits.layout())),
        Op::CrossEntropyBackward { logits, .. } => {
            by_rows(Entry::CrossEntropyBackward, p, rows(logits.layout()))
        }
        Op::LayerNorm { x, eps, .. } => {
            p.f[0] = *eps;
            by_rows(Entry::LayerNorm, p, rows(x.layout()))
        }
        Op::LayerNormBackward { x, .. } => {
            let (r, n) = rows(x.layout());
            launches.push(by_rows(Entry::LayerNormBackwardRows, p, (r, n)));
            let mut q = p;
            q.size[0] = r;
            q.size[1] = n;
            Launch {
                entry: Entry::LayerNormBackwardParams,
                grid: [blocks_for(n, sm_count), 1, 1],
                params: q,
            }
        }
        Op::Gather { indices, table, .. } | Op::ScatterAdd { indices, table, .. } => {
            let (n, dim) = (indices.layout().dims()[0], table.layout().dims()[1]);
            let entry = if op.kind() == xpu_hal::ops::OpKind::Gather {
                Entry::Gather
            } else {
                Entry::ScatterAdd
            };
            p.size[1] = dim;
            let mut l = flat(entry, p, n * dim);
            l.params.size[0] = n;
            l
        }
        Op::Reduce { x, y, op, axis } => {
            let len = x.layout().dims()[*axis as usize];
            p.size[0] = len;
            p.word[0] = u64::from(*axis);
            p.word[1] = match op {
                ReduceOp::Sum => 0,
                ReduceOp::Mean => 1,
                ReduceOp::Max => 2,
                ReduceOp::Min => 3,
            };
            let outputs = y.layout().elements();
            p.size[1] = outputs;
            Launch {
                entry: Entry::Reduce,
                grid: [blocks_for(outputs, sm_count), 1, 1],
                params: p,
            }
        }
        Op::SgdMomentum {
            lr,
            momentum,
            weight_decay,
            nesterov,
            ..
        } => {
            p.f[..3].copy_from_slice(&[*lr, *momentum, *weight_decay]);
            p.word[0] = u64::from(*nesterov);
            flat(Entry::SgdMomentum, p, elements)
        }
        Op::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            step,
            ..
        } => {
            p.f[..5].copy_from_slice(&[*lr, *beta1, *beta2, *eps, *weight_decay]);
            let step = i32::try_from(*step).unwrap_or(i32::MAX);
            p.word[0] = (1.0 - f64::from(*beta1).powi(step)).to_bits();
            p.word[1] = (1.0 - f64::from(*beta2).powi(step)).to_bits();
            flat(Entry::AdamW, p, elements)
        }
        Op::Random {
            dist, seed, offset, ..
        } => {
            p.word[0] = *seed;
            p.word[1] = *offset;
            match *dist {
                Distribution::Bits => flat(Entry::RandomBits, p, elements),
                Distribution::Uniform { low, high } => {
                    if first.dtype == DType::I32 {
                        return Err(Error::invalid("uniform random numbers need a float tensor"));
                    }
                    p.word[2] = 1;
                    p.f[0] = low;
                    p.f[1] = high;
                    flat(Entry::Random, p, elements)
                }
                Distribution::Normal { mean, std } => {
                    if first.dtype == DType::I32 {
                        return Err(Error::invalid("normal random numbers need a float tensor"));
                    }
                    p.word[2] = 2;
                    p.f[0] = mean;
                    p.f[1] = std;
                    flat(Entry::Random, p, elements)
                }
            }
        }
        Op::Dropout {
            p: prob,
            seed,
            offset,
            ..
        } => {
            p.f[0] = *prob;
            p.word[0] = *seed;
            p.word[1] = *offset;
            p.word[2] = (1.0 / (1.0 - f64::from(*prob))).to_bits();
            flat(Entry::Dropout, p, elements)
        }
    };
    launches.push(launch);
    Ok(launches)
}
