//! The native collectives' entry points (ABI 1.3): `group_create`, `group_run`,
//! `group_abort` and `group_destroy`, present in the table when
//! [`Plugin::COLLECTIVES`] is true, and `group_id` (ABI 1.4) when
//! [`Plugin::COLLECTIVES_ACROSS`] is too. Each checks what the header promises before
//! the plugin's [`Group`] sees the call.

use std::ptr;
use std::time::Duration;

use super::{device, guard, range, read, stream, DeviceState};
use crate::abi::{self, *};
use crate::error::{Error, Result};
use crate::group::{CollectiveOp, Group, GroupAcross, GroupCall, GroupConfig, GroupPart};
use crate::handle::{Boxed, DeviceId, Kind};
use crate::plugin::Plugin;
use crate::struct_size;
use crate::types::{BufferRange, DType};

/// The most ranks a group may have (far above any machine; it bounds what a faulty
/// host can make the SDK read).
const MAX_RANKS: u64 = 1 << 16;

/// A group as the host holds it: the plugin's group, the devices of this process's
/// ranks, and those ranks' numbers in the whole group with its size (across processes;
/// `0..n` and `n` within one).
struct GroupState<P: Plugin> {
    group: Box<dyn Group<P>>,
    devices: Vec<DeviceId>,
    ranks: Vec<usize>,
    size: usize,
}

pub(super) unsafe extern "C" fn group_id<P: Plugin>(
    args: *mut xpu_group_id_args,
) -> *mut xpu_error {
    guard("group_id", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a device it opened.
        let d = unsafe { device::<P>(a.v.device, "xpu_group_id_args.device") }?;
        if a.v.id.is_null() {
            return Err(Error::invalid_argument(
                "xpu_group_id_args.id is NULL; pass a buffer of XPU_GROUP_ID_MAX bytes",
            ));
        }
        let id = super::instance::<P>()?.group_id(&d.value.device)?;
        if id.is_empty() || id.len() > XPU_GROUP_ID_MAX {
            return Err(Error::internal(format!(
                "the plugin made a group identifier of {} bytes; it must have 1 to {XPU_GROUP_ID_MAX}",
                id.len()
            )));
        }
        // SAFETY: the host lends XPU_GROUP_ID_MAX writable bytes at `id` (ABI
        // contract), and `id.len()` is at most that.
        unsafe { ptr::copy_nonoverlapping(id.as_ptr(), a.v.id, id.len()) };
        write_out!(a, xpu_group_id_args, id_len, id.len() as u64);
        Ok(())
    })
}

/// The 1.4 fields of a group's arguments: `None` for a group within one process, else
/// the checked place of its `n` devices in a group across processes.
fn across<P: Plugin>(a: &xpu_group_create_args, n: usize) -> Result<Option<GroupAcross>> {
    if a.id_len == 0 {
        return Ok(None);
    }
    if !(P::COLLECTIVES && P::COLLECTIVES_ACROSS) {
        return Err(Error::unsupported(
            "xpu_group_create_args asks for a group across processes, but this plugin's groups span one process; leave id_len 0",
        ));
    }
    if a.id.is_null() || a.id_len > XPU_GROUP_ID_MAX as u64 {
        return Err(Error::invalid_argument(format!(
            "xpu_group_create_args.id is {:p} with id_len {}; pass the 1 to {XPU_GROUP_ID_MAX} bytes group_id made",
            a.id, a.id_len
        )));
    }
    if a.ranks.is_null() || a.size < n as u64 || a.size > MAX_RANKS {
        return Err(Error::invalid_argument(format!(
            "xpu_group_create_args has ranks at {:p} and size {} for {n} devices; pass each device's rank and a size of {n} to {MAX_RANKS}",
            a.ranks, a.size
        )));
    }
    // SAFETY: the host passes `id_len` bytes at `id` and `device_count` ranks at
    // `ranks` (ABI contract); both were bounded above.
    let (id, raw) = unsafe {
        (
            std::slice::from_raw_parts(a.id, a.id_len as usize),
            std::slice::from_raw_parts(a.ranks, n),
        )
    };
    let size = a.size as usize;
    let mut ranks: Vec<usize> = Vec::with_capacity(n);
    for (i, &r) in raw.iter().enumerate() {
        if r >= a.size || ranks.contains(&(r as usize)) {
            return Err(Error::invalid_argument(format!(
                "xpu_group_create_args.ranks[{i}] is {r}: ranks must be distinct and below size {size}"
            )));
        }
        ranks.push(r as usize);
    }
    Ok(Some(GroupAcross {
        id: id.to_vec(),
        size,
        ranks,
    }))
}

pub(super) unsafe extern "C" fn group_create<P: Plugin>(
    args: *mut xpu_group_create_args,
) -> *mut xpu_error {
    guard("group_create", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        let n = a.v.device_count;
        if n == 0 || n > MAX_RANKS || a.v.devices.is_null() {
            return Err(Error::invalid_argument(format!(
                "xpu_group_create_args asks for {n} devices at {:p}; pass 1 to {MAX_RANKS} devices of this plugin",
                a.v.devices
            )));
        }
        // SAFETY: the host passes `device_count` device pointers (ABI contract), and
        // `n` was bounded above.
        let raw = unsafe { std::slice::from_raw_parts(a.v.devices, n as usize) };
        let mut states: Vec<&Boxed<DeviceState<P>>> = Vec::with_capacity(raw.len());
        for (r, &ptr) in raw.iter().enumerate() {
            let what = format!("xpu_group_create_args.devices[{r}]");
            // SAFETY: the host passes devices it opened.
            let d = unsafe { device::<P>(ptr, &what) }?;
            if let Some(q) = states.iter().position(|s| s.device == d.device) {
                return Err(Error::invalid_argument(format!(
                    "{what} is devices[{q}] again; a group has one rank per device"
                )));
            }
            states.push(d);
        }
        let devices: Vec<&P::Device> = states.iter().map(|s| &s.value.device).collect();
        let across = across::<P>(&a.v, raw.len())?;
        let (ranks, size) = match &across {
            Some(x) => (x.ranks.clone(), x.size),
            None => ((0..raw.len()).collect(), raw.len()),
        };
        let config = GroupConfig {
            timeout: (a.v.timeout_ns > 0).then(|| Duration::from_nanos(a.v.timeout_ns)),
            across,
        };
        let made = super::instance::<P>()?.create_group(&devices, config)?;
        let state = GroupState {
            group: made.group,
            devices: states.iter().map(|s| s.device).collect(),
            ranks,
            size,
        };
        hand_out!(
            a,
            xpu_group_create_args,
            group,
            Boxed::into_raw(Kind::Group, None, state),
            |raw: *mut xpu_group| {
                // SAFETY: `raw` was just made and never given out.
                drop(unsafe { Boxed::<GroupState<P>>::take(raw, Kind::Group, "") })
            }
        );
        write_out!(a, xpu_group_create_args, library, made.library.as_ptr());
        let latency = made.latency.map_or(0, |l| {
            u64::try_from(l.as_nanos()).unwrap_or(u64::MAX).max(1)
        });
        write_out!(a, xpu_group_create_args, latency_ns, latency);
        let bandwidth = made.bus_bytes_per_s.unwrap_or(0);
        write_out!(a, xpu_group_create_args, bus_bytes_per_s, bandwidth);
        Ok(())
    })
}

pub(super) unsafe extern "C" fn group_run<P: Plugin>(
    args: *mut xpu_group_run_args,
) -> *mut xpu_error {
    guard("group_run", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a group it created and has not destroyed.
        let g = unsafe {
            Boxed::<GroupState<P>>::borrow(a.v.group, Kind::Group, "xpu_group_run_args.group")
        }?;
        let n = g.value.devices.len();
        if a.v.part_count != n as u64 || a.v.parts.is_null() {
            return Err(Error::invalid_argument(format!(
                "xpu_group_run_args has {} parts at {:p} for a group of {n} ranks in this process; pass one part per rank",
                a.v.part_count, a.v.parts
            )));
        }
        let call = decode(&a.v, g.value.size)?;
        // SAFETY: the host passes `part_count` part pointers (ABI contract), checked
        // equal to the group's size above.
        let raw = unsafe { std::slice::from_raw_parts(a.v.parts, n) };
        let mut parts = Vec::with_capacity(n);
        for (i, &ptr) in raw.iter().enumerate() {
            // SAFETY: each pointer is a part struct of at least its struct_size (ABI
            // contract); `read` refuses NULL and too small ones.
            let p = unsafe { read(ptr.cast_mut()) }?;
            let r = g.value.ranks[i];
            let what = |field: &str| format!("xpu_group_run_args.parts[{i}].{field}");
            // SAFETY: the host passes streams it created.
            let s = unsafe { stream::<P>(p.v.stream, &what("stream")) }?;
            if s.device != g.value.devices[i] {
                return Err(Error::invalid_argument(format!(
                    "{} is a stream of another device than rank {r}'s; each part runs on its rank's device",
                    what("stream")
                )));
            }
            let optional = |raw: &xpu_buffer_range, field: &str| -> Result<_> {
                if raw.buffer.is_null() {
                    return Ok(None);
                }
                // SAFETY: the host passes buffers it allocated.
                unsafe { range::<P>(raw, s.device, what(field)) }.map(Some)
            };
            let mut send = optional(&p.v.send, "send")?;
            let mut recv = optional(&p.v.recv, "recv")?;
            check_part(call, g.value.size, r, &mut send, &mut recv, &what)?;
            parts.push(GroupPart {
                stream: &s.value,
                send,
                recv,
            });
        }
        g.value.group.run(call, parts)
    })
}

pub(super) unsafe extern "C" fn group_abort<P: Plugin>(
    args: *mut xpu_group_args,
) -> *mut xpu_error {
    guard("group_abort", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a group it created and has not destroyed.
        let g = unsafe {
            Boxed::<GroupState<P>>::borrow(a.v.group, Kind::Group, "xpu_group_args.group")
        }?;
        g.value.group.abort();
        Ok(())
    })
}

pub(super) unsafe extern "C" fn group_destroy<P: Plugin>(
    args: *mut xpu_group_args,
) -> *mut xpu_error {
    guard("group_destroy", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host destroys a group it created, once, after its last run.
        let g = unsafe {
            Boxed::<GroupState<P>>::take(a.v.group, Kind::Group, "xpu_group_args.group")
        }?;
        drop(g);
        Ok(())
    })
}

/// The operation of a run's arguments, with its enum values, dtype, root and counts
/// checked.
fn decode(a: &xpu_group_run_args, n: usize) -> Result<GroupCall> {
    let dtype = || super::dtype(a.dtype, "xpu_group_run_args.dtype");
    let op = || {
        CollectiveOp::from_raw(a.op).ok_or_else(|| {
            Error::unsupported(format!(
                "xpu_group_run_args.op is {}, which is no xpu_collective_op of ABI {XPU_PLUGIN_ABI_MAJOR}.{XPU_PLUGIN_ABI_MINOR}",
                a.op
            ))
        })
    };
    let root = || {
        let root = a.root as usize;
        if root >= n {
            return Err(Error::invalid_argument(format!(
                "xpu_group_run_args.root is {root}, but the group has {n} ranks (0 to {})",
                n - 1
            )));
        }
        Ok(root)
    };
    let count = a.count;
    Ok(match a.collective {
        abi::collective::ALL_REDUCE => GroupCall::AllReduce {
            count,
            dtype: dtype()?,
            op: op()?,
        },
        abi::collective::REDUCE => GroupCall::Reduce {
            count,
            dtype: dtype()?,
            op: op()?,
            root: root()?,
        },
        abi::collective::BROADCAST => GroupCall::Broadcast {
            bytes: count,
            root: root()?,
        },
        abi::collective::ALL_GATHER => GroupCall::AllGather { bytes: count },
        abi::collective::REDUCE_SCATTER => GroupCall::ReduceScatter {
            count,
            dtype: dtype()?,
            op: op()?,
        },
        abi::collective::ALL_TO_ALL => GroupCall::AllToAll { bytes: count },
        other => {
            return Err(Error::unsupported(format!(
                "xpu_group_run_args.collective is {other}, which is no xpu_collective of ABI {XPU_PLUGIN_ABI_MAJOR}.{XPU_PLUGIN_ABI_MINOR}"
            )))
        }
    })
}

/// `count` elements of `dtype` in bytes, or an error if that overflows.
fn bytes_of(count: u64, dtype: Option<DType>, times: usize) -> Result<u64> {
    count
        .checked_mul(dtype.map_or(1, DType::size))
        .and_then(|b| b.checked_mul(times as u64))
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "xpu_group_run_args.count {count} makes an operation larger than 2^64 bytes"
            ))
        })
}

/// Checks rank `r`'s ranges against `call`: present where the operation needs them
/// (those it ignores are dropped), of the lengths it implies, element-aligned for
/// reductions, and identical or disjoint.
fn check_part<B>(
    call: GroupCall,
    n: usize,
    r: usize,
    send: &mut Option<BufferRange<B>>,
    recv: &mut Option<BufferRange<B>>,
    what: &dyn Fn(&str) -> String,
) -> Result<()> {
    // (send length, recv length) in bytes, `None` where the range is not used, and the
    // dtype whose elements the ranges hold.
    let (send_len, recv_len, dtype) = match call {
        GroupCall::AllReduce { count, dtype, .. } => {
            let b = bytes_of(count, Some(dtype), 1)?;
            (Some(b), Some(b), Some(dtype))
        }
        GroupCall::Reduce {
            count, dtype, root, ..
        } => {
            let b = bytes_of(count, Some(dtype), 1)?;
            (Some(b), (r == root).then_some(b), Some(dtype))
        }
        GroupCall::Broadcast { bytes, root } => {
            if r == root && send.is_none() {
                (None, Some(bytes), None)
            } else {
                ((r == root).then_some(bytes), Some(bytes), None)
            }
        }
        GroupCall::AllGather { bytes } => (Some(bytes), Some(bytes_of(bytes, None, n)?), None),
        GroupCall::ReduceScatter { count, dtype, .. } => (
            Some(bytes_of(count, Some(dtype), n)?),
            Some(bytes_of(count, Some(dtype), 1)?),
            Some(dtype),
        ),
        GroupCall::AllToAll { bytes } => {
            let b = bytes_of(bytes, None, n)?;
            (Some(b), Some(b), None)
        }
    };
    for (range, len, field) in [
        (&mut *send, send_len, "send"),
        (&mut *recv, recv_len, "recv"),
    ] {
        match (len, range.as_ref()) {
            (None, _) => *range = None,
            (Some(want), None) => {
                return Err(Error::invalid_argument(format!(
                    "{} is absent, but rank {r} needs {want} bytes there for {call:?}",
                    what(field)
                )))
            }
            (Some(want), Some(got)) => {
                if got.length != want {
                    return Err(Error::invalid_argument(format!(
                        "{} is {} bytes, but {call:?} needs {want} on rank {r}",
                        what(field),
                        got.length
                    )));
                }
                if let Some(dtype) = dtype {
                    super::elements(got, dtype, &what(field))?;
                }
            }
        }
    }
    if let (Some(s), Some(v)) = (send.as_ref(), recv.as_ref()) {
        // In place by block: all-gather's send is block r of recv, reduce-scatter's
        // recv block r of send.
        let block_of = |whole: &BufferRange<B>, part: &BufferRange<B>| {
            part.buffer_eq(whole) && part.offset == whole.offset + r as u64 * part.length
        };
        let by_block = match call {
            GroupCall::AllGather { .. } => block_of(v, s),
            GroupCall::ReduceScatter { .. } => block_of(s, v),
            _ => false,
        };
        if s.overlaps(v) && !s.same_as(v) && !by_block {
            return Err(Error::invalid_argument(format!(
                "{} and {} overlap without being the same range (or, for all-gather and reduce-scatter, rank {r}'s block of the other); pass one of those or disjoint ranges",
                what("send"),
                what("recv")
            )));
        }
    }
    Ok(())
}
