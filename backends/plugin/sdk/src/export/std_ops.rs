//! The standard operations' entry points (ABI 1.1): `device_ops` and `op_enqueue`.

use std::collections::BTreeMap;
use std::ptr;

use super::{device, dtype, guard, range, read, stream};
use crate::abi::*;
use crate::error::{Error, Result};
use crate::handle::DeviceId;
use crate::ops::{Distribution, Op, OpKind, OpParams, OpSupport, ReduceOp, Tensor};
use crate::plugin::{Device, Plugin, Stream};
use crate::struct_size;
use crate::types::DType;

/// The C list of a device's operations: one entry per kind, dtype masks merged.
fn raw_ops(list: Vec<OpSupport>) -> Vec<xpu_op_support> {
    let mut merged: BTreeMap<u32, u32> = BTreeMap::new();
    for s in list {
        *merged.entry(s.kind.raw()).or_insert(0) |= DType::mask(&s.dtypes);
    }
    merged
        .into_iter()
        .filter(|&(_, mask)| mask != 0)
        .map(|(op, dtype_mask)| xpu_op_support { op, dtype_mask })
        .collect()
}

pub(super) unsafe extern "C" fn device_ops<P: Plugin>(
    args: *mut xpu_device_ops_args,
) -> *mut xpu_error {
    guard("device_ops", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a device it opened.
        let d = unsafe { device::<P>(a.v.device, "xpu_device_ops_args.device") }?;
        let list = match d.value.ops.get() {
            Some(list) => list,
            None => {
                let made = raw_ops(d.value.device.ops()?);
                // Another thread may have won the race; either value is the same list.
                let _ = d.value.ops.set(made);
                d.value
                    .ops
                    .get()
                    .ok_or_else(|| Error::internal("the operation list was not kept"))?
            }
        };
        write_out!(a, xpu_device_ops_args, ops, list.as_ptr());
        write_out!(a, xpu_device_ops_args, count, list.len() as u64);
        Ok(())
    })
}

/// Elements from the first to one past the last one a layout addresses, or `None` on
/// overflow.
fn span_elements(dims: &[u64], strides: &[u64]) -> Option<u64> {
    dims.iter().zip(strides).try_fold(1u64, |acc, (&d, &s)| {
        acc.checked_add((d - 1).checked_mul(s)?)
    })
}

/// Reads and checks tensor `i` of an operation.
///
/// # Safety
/// `ptr` is null or points to an `xpu_tensor` of at least its `struct_size` bytes,
/// valid for the call, whose buffer is null or a live buffer handle of this plugin.
unsafe fn tensor<P: Plugin>(
    ptr: *const xpu_tensor,
    device: DeviceId,
    i: usize,
) -> Result<Tensor<P::Buffer>> {
    // SAFETY: forwarded contract; `read` never writes through the pointer.
    let t = unsafe { read(ptr.cast_mut()) }
        .map_err(|e| e.context(format!("tensor {i}")))?
        .v;
    let what = format!("tensor {i}");
    let dtype = dtype(t.dtype, &format!("{what}'s dtype"))?;
    let rank = t.rank as usize;
    if !(1..=XPU_MAX_RANK).contains(&rank) {
        return Err(Error::invalid_argument(format!(
            "{what} has rank {rank}; tensors have 1 to {XPU_MAX_RANK} dimensions"
        )));
    }
    let (dims, strides) = (&t.dims[..rank], &t.strides[..rank]);
    if dims.contains(&0) {
        return Err(Error::invalid_argument(format!(
            "{what} has shape {dims:?} with no element; the host sends only non-empty tensors"
        )));
    }
    let span = span_elements(dims, strides).and_then(|n| n.checked_mul(dtype.size()));
    if span != Some(t.range.length) || !t.range.offset.is_multiple_of(dtype.size()) {
        return Err(Error::invalid_argument(format!(
            "{what} ({dtype} {dims:?}, strides {strides:?}) spans {} bytes, but its range has offset {} and length {}; \
             the range must start at a whole element and span exactly the bytes the layout addresses",
            span.map_or_else(|| "more than 2^64".to_string(), |s| s.to_string()),
            t.range.offset,
            t.range.length
        )));
    }
    // SAFETY: forwarded contract.
    let range = unsafe { range::<P>(&t.range, device, format!("{what}'s range")) }?;
    Ok(Tensor {
        dtype,
        dims: dims.to_vec(),
        strides: strides.to_vec(),
        range,
    })
}

/// The parameters of `kind` from the union.
fn params(kind: OpKind, p: &xpu_op_params) -> Result<OpParams> {
    // SAFETY: every member of the union is made of integers and floats, for which any
    // bit pattern is valid, and the union is fully initialised (zeroed beyond the
    // caller's struct_size), so reading any member is defined.
    let (matmul, layer_norm, reduce, sgd, adamw, random, dropout) = unsafe {
        (
            p.matmul,
            p.layer_norm,
            p.reduce,
            p.sgd_momentum,
            p.adamw,
            p.random,
            p.dropout,
        )
    };
    Ok(match kind {
        OpKind::Matmul => OpParams::Matmul {
            trans_a: matmul.trans_a != 0,
            trans_b: matmul.trans_b != 0,
            alpha: matmul.alpha,
            beta: matmul.beta,
        },
        OpKind::LayerNorm => OpParams::LayerNorm {
            eps: layer_norm.eps,
        },
        OpKind::Reduce => OpParams::Reduce {
            op: ReduceOp::from_raw(reduce.op).ok_or_else(|| {
                Error::unsupported(format!(
                    "params.reduce.op is {}, which is no xpu_reduce_op of ABI {XPU_PLUGIN_ABI_MAJOR}.{XPU_PLUGIN_ABI_MINOR}",
                    reduce.op
                ))
            })?,
            axis: reduce.axis,
        },
        OpKind::SgdMomentum => OpParams::SgdMomentum {
            lr: sgd.lr,
            momentum: sgd.momentum,
            weight_decay: sgd.weight_decay,
            nesterov: sgd.nesterov != 0,
        },
        OpKind::AdamW => OpParams::AdamW {
            lr: adamw.lr,
            beta1: adamw.beta1,
            beta2: adamw.beta2,
            eps: adamw.eps,
            weight_decay: adamw.weight_decay,
            step: adamw.step,
        },
        OpKind::Random => OpParams::Random {
            dist: match random.distribution {
                random_distribution::BITS => Distribution::Bits,
                random_distribution::UNIFORM => Distribution::Uniform {
                    low: random.a,
                    high: random.b,
                },
                random_distribution::NORMAL => Distribution::Normal {
                    mean: random.a,
                    std: random.b,
                },
                other => {
                    return Err(Error::unsupported(format!(
                        "params.random.distribution is {other}, which is no xpu_random_distribution of ABI {XPU_PLUGIN_ABI_MAJOR}.{XPU_PLUGIN_ABI_MINOR}"
                    )))
                }
            },
            seed: random.seed,
            offset: random.offset,
        },
        OpKind::Dropout => OpParams::Dropout {
            p: dropout.p,
            seed: dropout.seed,
            offset: dropout.offset,
        },
        _ => OpParams::None,
    })
}

pub(super) unsafe extern "C" fn op_enqueue<P: Plugin>(args: *mut xpu_op_args) -> *mut xpu_error {
    guard("op_enqueue", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a stream it created.
        let s = unsafe { stream::<P>(a.v.stream, "xpu_op_args.stream") }?;
        let kind = OpKind::from_raw(a.v.op).ok_or_else(|| {
            Error::unsupported(format!(
                "xpu_op_args.op is {}, which is no XPU_OP_* of ABI {XPU_PLUGIN_ABI_MAJOR}.{XPU_PLUGIN_ABI_MINOR}",
                a.v.op
            ))
        })?;
        let count = a.v.tensor_count as usize;
        if count != kind.tensor_count() {
            return Err(Error::invalid_argument(format!(
                "xpu_op_args.tensor_count is {count}, but {kind} takes {} tensors",
                kind.tensor_count()
            )));
        }
        if a.v.tensors.is_null() {
            return Err(Error::invalid_argument(format!(
                "xpu_op_args.tensors is NULL but tensor_count is {count}"
            )));
        }
        // SAFETY: the host passes `tensor_count` (at least 1) pointers at `tensors`,
        // valid for the call.
        let pointers = unsafe { std::slice::from_raw_parts(a.v.tensors, count) };
        let mut tensors = Vec::with_capacity(count);
        for (i, &p) in pointers.iter().enumerate() {
            // SAFETY: each pointer is a tensor descriptor the host made for the call.
            tensors.push(unsafe { tensor::<P>(p, s.device, i) }?);
        }
        let params = params(kind, &a.v.params)?;
        s.value.run_op(Op {
            kind,
            tensors,
            params,
        })
    })
}
