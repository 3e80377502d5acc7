//! The standard operations (ABI 1.1) on plugin devices: the device's list, read into
//! `Capabilities::ops`, and an [`Op`] of [`RawTensor`]s as the C descriptors.

use std::collections::BTreeMap;

use xpu_hal::ops::{Distribution, Op, OpKind, OpSupport, RawTensor, ReduceOp, MAX_RANK};
use xpu_hal::DType;
use xpu_plugin_sdk::abi::*;

use crate::device::{abi_dtype, DeviceShared};
use crate::load::Args;

/// The most entries of a device's operation list that are read.
pub(crate) const MAX_OP_ENTRIES: u64 = 1024;

/// What the device provides, from its `device_ops`: operation numbers this host does
/// not know and dtypes an operation is not defined on are ignored (a newer plugin may
/// list more); entries of one operation are merged. A failure or an absurd list is
/// recorded as a diagnostic and the device provides what could be read (or nothing).
pub(crate) fn supported(shared: &DeviceShared) -> Vec<OpSupport> {
    let plugin = &shared.plugin;
    let Some(fns) = plugin.table.ops else {
        return Vec::new();
    };
    let mut args = xpu_device_ops_args::new();
    args.device = shared.handle.0;
    // SAFETY: the table's function with a fresh argument struct for an open device.
    if let Err(e) = unsafe { plugin.call_raw(fns.list, &mut args, "device_ops") } {
        plugin.record(format!(
            "{}: {e}; the device provides no standard operation",
            shared.id
        ));
        return Vec::new();
    }
    if args.count == 0 {
        return Vec::new();
    }
    if args.ops.is_null() {
        plugin.record(format!(
            "{}: device_ops returned {} entries but a NULL array; the device provides no standard operation",
            shared.id, args.count
        ));
        return Vec::new();
    }
    if args.count > MAX_OP_ENTRIES {
        plugin.record(format!(
            "{}: device_ops listed {} entries; only the first {MAX_OP_ENTRIES} were read (there are {} standard operations)",
            shared.id,
            args.count,
            OpKind::ALL.len()
        ));
    }
    let mut merged: BTreeMap<OpKind, Vec<DType>> = BTreeMap::new();
    for i in 0..args.count.min(MAX_OP_ENTRIES) as usize {
        // SAFETY: an array of `count` entries, valid until the device is closed;
        // `i < count`. Read unaligned: the plugin's pointer is not trusted further.
        let entry = unsafe { args.ops.add(i).read_unaligned() };
        let Some(kind) = OpKind::from_id(entry.op) else {
            continue;
        };
        let dtypes = merged.entry(kind).or_default();
        for &d in kind.dtypes() {
            if entry.dtype_mask & (1u32 << abi_dtype(d)) != 0 && !dtypes.contains(&d) {
                dtypes.push(d);
            }
        }
    }
    merged
        .into_iter()
        .filter(|(_, dtypes)| !dtypes.is_empty())
        .map(|(kind, dtypes)| OpSupport { kind, dtypes })
        .collect()
}

/// The descriptor of `t`, whose bytes are `range`.
pub(crate) fn tensor(t: &RawTensor, range: xpu_buffer_range) -> xpu_tensor {
    let mut d = xpu_tensor::new();
    let l = &t.layout;
    d.dtype = abi_dtype(l.dtype);
    d.rank = l.rank() as u32;
    let rank = l.rank().min(MAX_RANK).min(XPU_MAX_RANK);
    d.dims[..rank].copy_from_slice(&l.dims()[..rank]);
    d.strides[..rank].copy_from_slice(&l.strides()[..rank]);
    d.range = range;
    d
}

/// The parameters of `op`, in the union member named after it.
pub(crate) fn params<T>(op: &Op<T>) -> xpu_op_params {
    let mut p = xpu_op_params { reserved: [0; 8] };
    match *op {
        Op::Matmul {
            trans_a,
            trans_b,
            alpha,
            beta,
            ..
        } => {
            p.matmul = xpu_op_matmul_params {
                trans_a: u32::from(trans_a),
                trans_b: u32::from(trans_b),
                alpha,
                beta,
            }
        }
        Op::LayerNorm { eps, .. } => p.layer_norm = xpu_op_layer_norm_params { eps },
        Op::Reduce { op, axis, .. } => {
            p.reduce = xpu_op_reduce_params {
                op: match op {
                    ReduceOp::Sum => reduce_op::SUM,
                    ReduceOp::Mean => reduce_op::MEAN,
                    ReduceOp::Max => reduce_op::MAX,
                    ReduceOp::Min => reduce_op::MIN,
                },
                axis,
            }
        }
        Op::SgdMomentum {
            lr,
            momentum,
            weight_decay,
            nesterov,
            ..
        } => {
            p.sgd_momentum = xpu_op_sgd_momentum_params {
                lr,
                momentum,
                weight_decay,
                nesterov: u32::from(nesterov),
            }
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
            p.adamw = xpu_op_adamw_params {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                step,
            }
        }
        Op::Random {
            dist, seed, offset, ..
        } => {
            let (distribution, a, b) = match dist {
                Distribution::Bits => (random_distribution::BITS, 0.0, 0.0),
                Distribution::Uniform { low, high } => (random_distribution::UNIFORM, low, high),
                Distribution::Normal { mean, std } => (random_distribution::NORMAL, mean, std),
            };
            p.random = xpu_op_random_params {
                distribution,
                a,
                b,
                reserved: 0,
                seed,
                offset,
            }
        }
        Op::Dropout {
            p: prob,
            seed,
            offset,
            ..
        } => {
            p.dropout = xpu_op_dropout_params {
                p: prob,
                reserved: 0,
                seed,
                offset,
            }
        }
        _ => {}
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_numbers_are_the_hal_ids() {
        let pairs = [
            (OpKind::Matmul, op::MATMUL),
            (OpKind::BiasAdd, op::BIAS_ADD),
            (OpKind::Relu, op::RELU),
            (OpKind::ReluBackward, op::RELU_BACKWARD),
            (OpKind::Gelu, op::GELU),
            (OpKind::GeluBackward, op::GELU_BACKWARD),
            (OpKind::Softmax, op::SOFTMAX),
            (OpKind::SoftmaxBackward, op::SOFTMAX_BACKWARD),
            (OpKind::CrossEntropy, op::CROSS_ENTROPY),
            (OpKind::CrossEntropyBackward, op::CROSS_ENTROPY_BACKWARD),
            (OpKind::LayerNorm, op::LAYER_NORM),
            (OpKind::LayerNormBackward, op::LAYER_NORM_BACKWARD),
            (OpKind::Gather, op::GATHER),
            (OpKind::ScatterAdd, op::SCATTER_ADD),
            (OpKind::Reduce, op::REDUCE),
            (OpKind::SgdMomentum, op::SGD_MOMENTUM),
            (OpKind::AdamW, op::ADAMW),
            (OpKind::Random, op::RANDOM),
            (OpKind::Dropout, op::DROPOUT),
        ];
        assert_eq!(pairs.len(), OpKind::ALL.len());
        for (kind, raw) in pairs {
            assert_eq!(kind.id(), raw, "{kind}");
            let sdk = xpu_plugin_sdk::OpKind::from_raw(raw);
            assert_eq!(sdk.map(|k| k.name()), Some(kind.name()));
        }
        assert_eq!(MAX_RANK, XPU_MAX_RANK);
    }
}
