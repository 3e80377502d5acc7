//! [`PluginGroup`]: a plugin's native collectives (ABI 1.3, `group_create` …
//! `group_destroy`) as a HAL [`CollectiveGroup`], so that the collectives layer hands
//! whole operations to the vendor's library without naming the plugin.
//!
//! A group holds its devices open and is destroyed before them. A group across
//! processes (ABI 1.4) is made the same way, with the identifier one process made
//! ([`group_id`]) and this process's ranks; its parts are this process's. Each operation
//! is one `group_run` call carrying every local rank's part; the work it enqueues is numbered on
//! each rank's stream as that stream's next operation, so the stream's checkpoints
//! (synchronize, query, events) cover it and hold its buffers until it has run.

use std::sync::Arc;
use std::time::Duration;

use xpu_hal::group::{
    CollectiveGroup, GroupAcross, GroupConfig, GroupCost, GroupOp, GroupPart, GroupReduce,
};
use xpu_hal::{Device, Error, Result};
use xpu_plugin_sdk::abi::*;

use crate::device::{abi_dtype, DeviceShared, PluginDevice};
use crate::load::{plugin_string, Args, GroupFns, Handle, Plugin};
use crate::stream::{Held, PluginStream, StreamShared};

/// A native collective communicator of a plugin, this process's part `i` on
/// `devices[i]` (rank `i`, within one process).
pub(crate) struct PluginGroup {
    plugin: Arc<Plugin>,
    fns: GroupFns,
    handle: Handle<xpu_group>,
    devices: Vec<Arc<DeviceShared>>,
    /// The ranks in every process.
    size: usize,
    library: String,
    cost: Option<GroupCost>,
}

/// `group_id` with `device`: the identifier of a new group across processes.
pub(crate) fn group_id(device: &Arc<DeviceShared>) -> Result<Vec<u8>> {
    let plugin = &device.plugin;
    let f = plugin.table.groups.and_then(|g| g.id).ok_or_else(|| {
        Error::unsupported(format!(
            "the plugin `{}` has no collective groups across processes (ABI 1.4 group_id)",
            plugin.plugin_name
        ))
    })?;
    let mut id = vec![0u8; XPU_GROUP_ID_MAX];
    let mut args = xpu_group_id_args::new();
    args.device = device.handle.0;
    args.id = id.as_mut_ptr();
    // SAFETY: the device is open (held by `device`); `id` holds XPU_GROUP_ID_MAX bytes
    // and outlives the call; the function was read from a table of ABI 1.4 or later.
    unsafe { plugin.call(f, &mut args, "group_id", &plugin.backend) }?;
    let len = usize::try_from(args.id_len).unwrap_or(usize::MAX);
    if len == 0 || len > XPU_GROUP_ID_MAX {
        return Err(Error::backend_message(
            plugin.backend.clone(),
            format!(
                "group_id returned an identifier of {} bytes; 1 to {XPU_GROUP_ID_MAX} are allowed (a plugin bug)",
                args.id_len
            ),
        ));
    }
    id.truncate(len);
    Ok(id)
}

/// The plugin device behind a HAL device, if it is one of `plugin`'s.
fn plugin_device<'a>(device: &'a Device, plugin: &Plugin) -> Result<&'a Arc<DeviceShared>> {
    device
        .implementation()
        .as_any()
        .downcast_ref::<PluginDevice>()
        .map(PluginDevice::shared)
        .filter(|d| d.plugin.same_library(plugin))
        .ok_or_else(|| {
            Error::invalid(format!(
                "{} is not a device of the plugin `{}`; a native group holds devices of one plugin",
                device.id(),
                plugin.plugin_name
            ))
        })
}

impl PluginGroup {
    /// `group_create` over `devices` (all of `plugin`, distinct).
    pub(crate) fn create(
        plugin: &Arc<Plugin>,
        fns: GroupFns,
        devices: &[Device],
        config: GroupConfig,
        across: Option<&GroupAcross>,
    ) -> Result<PluginGroup> {
        let shared = devices
            .iter()
            .map(|d| plugin_device(d, plugin).cloned())
            .collect::<Result<Vec<_>>>()?;
        for (r, d) in shared.iter().enumerate() {
            if let Some(q) = shared[..r].iter().position(|e| Arc::ptr_eq(d, e)) {
                return Err(Error::invalid(format!(
                    "{} is rank {q} and rank {r}; a native group has one rank per device",
                    d.id
                )));
            }
        }
        let handles: Vec<*mut xpu_device> = shared.iter().map(|d| d.handle.0).collect();
        let mut args = xpu_group_create_args::new();
        args.devices = handles.as_ptr();
        args.device_count = handles.len() as u64;
        args.timeout_ns = u64::try_from(config.timeout.as_nanos()).unwrap_or(u64::MAX);
        let ranks: Vec<u64> = across
            .map(|x| x.ranks.iter().map(|&r| r as u64).collect())
            .unwrap_or_default();
        if let Some(x) = across {
            args.id = x.id.as_ptr();
            args.id_len = x.id.len() as u64;
            args.ranks = ranks.as_ptr();
            args.size = x.size as u64;
        }
        // SAFETY: the devices are open (held by `shared`), `handles`, `ranks` and the
        // identifier outlive the call, and the function was read from a table of ABI 1.3
        // or later with all four (the 1.4 fields are set only for a plugin with
        // `group_id`, whose table is of 1.4 or later).
        unsafe { plugin.call(fns.create, &mut args, "group_create", &plugin.backend) }?;
        if args.group.is_null() {
            return Err(Error::backend_message(
                plugin.backend.clone(),
                "group_create succeeded but returned no group (a plugin bug)",
            ));
        }
        let cost = (args.latency_ns > 0 && args.bus_bytes_per_s > 0).then(|| GroupCost {
            latency: Duration::from_nanos(args.latency_ns),
            bus_bytes_per_s: args.bus_bytes_per_s as f64,
        });
        let library = if args.library.is_null() {
            format!("{}'s library", plugin.plugin_name)
        } else {
            // SAFETY: `library` is a static NUL-terminated string (header).
            unsafe { plugin_string(args.library) }
        };
        Ok(PluginGroup {
            plugin: plugin.clone(),
            fns,
            handle: Handle(args.group),
            size: across.map_or(shared.len(), |x| x.size),
            devices: shared,
            library,
            cost,
        })
    }
}

/// The `xpu_collective_op` of a reduction.
fn abi_reduce(op: GroupReduce) -> u32 {
    match op {
        GroupReduce::Sum => collective_op::SUM,
        GroupReduce::Prod => collective_op::PROD,
        GroupReduce::Min => collective_op::MIN,
        GroupReduce::Max => collective_op::MAX,
        GroupReduce::Avg => collective_op::AVG,
    }
}

/// Fills the operation's fields of `a`.
fn describe(op: GroupOp, a: &mut xpu_group_run_args) -> Result<()> {
    let count = |n: usize| {
        u64::try_from(n).map_err(|_| Error::invalid("the operation does not fit 64 bits"))
    };
    let root = |r: usize| {
        u32::try_from(r).map_err(|_| Error::invalid("the root rank does not fit 32 bits"))
    };
    match op {
        GroupOp::AllReduce {
            count: n,
            dtype,
            op,
        } => {
            a.collective = collective::ALL_REDUCE;
            (a.count, a.dtype, a.op) = (count(n)?, abi_dtype(dtype), abi_reduce(op));
        }
        GroupOp::Reduce {
            count: n,
            dtype,
            op,
            root: r,
        } => {
            a.collective = collective::REDUCE;
            (a.count, a.dtype, a.op) = (count(n)?, abi_dtype(dtype), abi_reduce(op));
            a.root = root(r)?;
        }
        GroupOp::Broadcast { bytes, root: r } => {
            a.collective = collective::BROADCAST;
            a.count = count(bytes)?;
            a.root = root(r)?;
        }
        GroupOp::AllGather { bytes } => {
            a.collective = collective::ALL_GATHER;
            a.count = count(bytes)?;
        }
        GroupOp::ReduceScatter {
            count: n,
            dtype,
            op,
        } => {
            a.collective = collective::REDUCE_SCATTER;
            (a.count, a.dtype, a.op) = (count(n)?, abi_dtype(dtype), abi_reduce(op));
        }
        GroupOp::AllToAll { bytes } => {
            a.collective = collective::ALL_TO_ALL;
            a.count = count(bytes)?;
        }
    }
    Ok(())
}

impl CollectiveGroup for PluginGroup {
    fn size(&self) -> usize {
        self.size
    }

    fn local_size(&self) -> usize {
        self.devices.len()
    }

    fn library(&self) -> String {
        self.library.clone()
    }

    fn cost(&self) -> Option<GroupCost> {
        self.cost
    }

    fn run(&self, op: GroupOp, parts: &[GroupPart<'_>]) -> Result<()> {
        let n = self.devices.len();
        if parts.len() != n {
            return Err(Error::invalid(format!(
                "{} parts for a native group of {n} ranks in this process; give one per rank",
                parts.len()
            )));
        }
        let mut args = xpu_group_run_args::new();
        args.group = self.handle.0;
        describe(op, &mut args)?;
        let mut raw = Vec::with_capacity(n);
        let mut streams: Vec<&StreamShared> = Vec::with_capacity(n);
        let mut holds: Vec<Vec<Held>> = Vec::with_capacity(n);
        for (r, part) in parts.iter().enumerate() {
            let device = &self.devices[r];
            let stream = part
                .stream
                .implementation()
                .as_any()
                .downcast_ref::<PluginStream>()
                .filter(|s| Arc::ptr_eq(&s.shared().device, device))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "rank {r}'s stream is on {}, not {}; each rank's part runs on its own device",
                        part.stream.device().id(),
                        device.id
                    ))
                })?;
            let mut held = Vec::new();
            let mut range = |b: &Option<xpu_hal::BufferSlice<'_>>| -> Result<xpu_buffer_range> {
                let absent = xpu_buffer_range {
                    buffer: std::ptr::null_mut(),
                    offset: 0,
                    length: 0,
                };
                match b {
                    None => Ok(absent),
                    Some(b) => match b.resolve(part.stream.device())? {
                        None => Ok(absent),
                        Some(slice) => stream.range(&slice, &mut held),
                    },
                }
            };
            let (send, recv) = (range(&part.send)?, range(&part.recv)?);
            let mut p = xpu_group_part::new();
            p.stream = stream.shared().raw();
            p.send = send;
            p.recv = recv;
            raw.push(p);
            streams.push(stream.shared());
            holds.push(held);
        }
        let pointers: Vec<*const xpu_group_part> = raw.iter().map(|p| p as *const _).collect();
        args.parts = pointers.as_ptr();
        args.part_count = n as u64;
        StreamShared::enqueue_on_all(&streams, holds, || {
            // SAFETY: the group is live (destroyed only in `Drop`); every part names a
            // live stream of its rank's device and ranges of buffers `holds` keeps
            // alive until the work is done; `raw` and `pointers` outlive the call.
            unsafe {
                self.plugin
                    .call(self.fns.run, &mut args, "group_run", &self.plugin.backend)
            }
        })
    }

    fn abort(&self) {
        let mut args = xpu_group_args::new();
        args.group = self.handle.0;
        // SAFETY: the group is live; the header allows an abort at any time, from any
        // thread, more than once.
        unsafe {
            self.plugin
                .release(self.fns.abort, args, "group_abort", &self.plugin.backend)
        };
    }
}

impl Drop for PluginGroup {
    fn drop(&mut self) {
        let mut args = xpu_group_args::new();
        args.group = self.handle.0;
        // SAFETY: the group is live and this is its last use; its devices are still
        // open (held by `self.devices`, dropped after this).
        unsafe {
            self.plugin.release(
                self.fns.destroy,
                args,
                "group_destroy",
                &self.plugin.backend,
            )
        };
    }
}

impl std::fmt::Debug for PluginGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.devices.iter().map(|d| d.id.as_str()).collect();
        f.debug_struct("PluginGroup")
            .field("library", &self.library)
            .field("devices", &ids)
            .finish()
    }
}
