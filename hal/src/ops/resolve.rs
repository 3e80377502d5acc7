//! From an `Op<Tensor>` to the `Op<RawTensor>` a backend receives: device support,
//! [`super::check`], bounds and aliasing.

use super::{check, HasLayout, Op, RawTensor, Tensor};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::validate::{self, Overlap};

/// Checks `op` for `device` and resolves its tensors; `Ok(None)` when a tensor is empty
/// (the operation then does nothing).
pub(crate) fn resolve(device: &Device, op: &Op<Tensor<'_>>) -> Result<Option<Op<RawTensor>>> {
    let kind = op.kind();
    let operands = op.operands();
    let dtype = operands[0].tensor.layout.dtype;
    if !device.capabilities().supports_op(kind, dtype) {
        let listed: Vec<String> = device
            .capabilities()
            .ops
            .iter()
            .find(|s| s.kind == kind)
            .map(|s| s.dtypes.iter().map(|d| d.to_string()).collect())
            .unwrap_or_default();
        return Err(Error::unsupported(if listed.is_empty() {
            format!(
                "{} does not provide the standard operation {kind}; see its Capabilities::ops (`xpu devices --json` lists them) or run it on another device",
                device.id()
            )
        } else {
            format!(
                "{} provides {kind} on {} but not on {dtype}",
                device.id(),
                listed.join(", ")
            )
        }));
    }
    check(op)?;
    if operands.iter().any(|o| o.tensor.layout.elements() == 0) {
        return Ok(None);
    }
    for o in &operands {
        let t = o.tensor;
        let size = t.layout.dtype.size() as u64;
        if !t.offset.is_multiple_of(size) {
            return Err(Error::invalid(format!(
                "{kind}: {} starts at byte offset {}, not a multiple of its {} element size ({size} bytes)",
                o.name, t.offset, t.layout.dtype
            )));
        }
    }
    // Written tensors: identical to an input where the operation allows it, else
    // disjoint from every other operand.
    for (i, w) in operands.iter().enumerate() {
        if !w.access.writes() {
            continue;
        }
        for (j, o) in operands.iter().enumerate() {
            if i == j {
                continue;
            }
            let (ws, os) = (w.tensor.span(), o.tensor.span());
            let allowed = kind
                .in_place_pairs()
                .iter()
                .any(|&(input, output)| input == o.name && output == w.name);
            match validate::overlap(&ws, &os) {
                Overlap::Disjoint => {}
                Overlap::Identical if allowed && w.tensor.layout == o.tensor.layout => {}
                _ if allowed => {
                    return Err(Error::invalid(format!(
                        "{kind}: {} overlaps {} without being the very same tensor; use the same memory and layout to work in place, or disjoint memory",
                        w.name, o.name
                    )))
                }
                _ => {
                    return Err(Error::invalid(format!(
                        "{kind}: {} ({}) overlaps {} ({}); it is written, so give it memory of its own",
                        w.name, ws, o.name, os
                    )))
                }
            }
        }
    }
    op.clone()
        .try_map(|name, _, t| {
            let memory = validate::resolve(device, &t.span(), format_args!("{kind}: {name}"))?
                .ok_or_else(|| Error::invalid(format!("{kind}: {name} is empty")))?;
            Ok(RawTensor {
                memory,
                layout: *t.layout(),
            })
        })
        .map(Some)
}
