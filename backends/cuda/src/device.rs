//! [`CudaDevice`]: one CUDA device, its primary context and what its objects share.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUdevice_attribute};
use xpu_hal::backend::{DeviceImpl, StreamImpl};
use xpu_hal::{
    Capabilities, DType, DeviceInfo, DeviceKind, Error, KernelDesc, KernelFormat, KernelImpl,
    MemoryInfo, RawAllocation, Result,
};

use crate::builtins::{BuiltinKernel, BuiltinKind};
use crate::driver::{cu, guarded, version_string, Driver};
use crate::memory::{CudaBuffer, StagingPool};
use crate::stream::CudaStream;
use crate::NAME;

pub(crate) use xpu_hal::backend::lock;

fn cu_device(index: c_int) -> Result<CUdevice> {
    let mut dev: CUdevice = 0;
    let name = format!("{NAME}:{index}");
    // SAFETY: the driver is initialised (the caller went through `Driver::load`); the
    // out-pointer is valid for the call.
    cu(&name, "looking up the device", "cuDeviceGet", || unsafe {
        sys::cuDeviceGet(&mut dev, index)
    })?;
    Ok(dev)
}

/// The name of device `index`, without creating it.
pub(crate) fn device_name(index: c_int) -> Result<String> {
    let dev = cu_device(index)?;
    let mut buf = [0 as c_char; 256];
    cu(
        &format!("{NAME}:{index}"),
        "reading the device name",
        "cuDeviceGetName",
        // SAFETY: `buf` is writable for its length, which is passed.
        || unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, dev) },
    )?;
    Ok(c_string(&buf))
}

fn c_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn attribute(name: &str, dev: CUdevice, attr: CUdevice_attribute) -> Result<c_int> {
    let mut v: c_int = 0;
    cu(
        name,
        "reading a device attribute",
        "cuDeviceGetAttribute",
        // SAFETY: valid out-pointer; `dev` came from cuDeviceGet.
        || unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) },
    )?;
    Ok(v)
}

/// What a device's streams, buffers and kernels share. Destroyed after the last of them.
pub struct DeviceShared {
    pub(crate) driver: Arc<Driver>,
    /// `cuda:N`, for messages.
    pub(crate) name: String,
    pub(crate) index: u32,
    pub(crate) device: CUdevice,
    /// The device's primary context, retained until this value is dropped.
    ctx: CUcontext,
    /// `(major, minor)` compute capability.
    pub(crate) arch: (c_int, c_int),
    pub(crate) sm_count: u32,
    pub(crate) total_memory: u64,
    /// The minimum granularity of virtual memory management (`cuMemCreate` sizes) when
    /// the driver and the device support it: growable allocations are offered then.
    pub(crate) vmm_granularity: Option<u64>,
    /// Ordinals of the other devices that can access this one's memory
    /// (`cuDeviceCanAccessPeer`): growable allocations are mapped for them too.
    pub(crate) accessed_by: Vec<c_int>,
    /// Whether streams can wait on a host word with `cuStreamWaitValue32`; otherwise
    /// they spin in a one-thread kernel (see the `stream` module).
    pub(crate) wait_value: bool,
    /// An error raised where it could not be returned (a `Drop`), reported by the next
    /// synchronize of any stream of this device.
    deferred: Mutex<Option<Error>>,
    /// Builtin kernels loaded so far.
    pub(crate) builtins: Mutex<HashMap<BuiltinKind, Arc<BuiltinKernel>>>,
    /// The kernel streams spin in to wait for a host word where `wait_value` is false.
    pub(crate) flag_wait: Mutex<Option<Arc<BuiltinKernel>>>,
    /// Loaded standard-operation kernels.
    pub(crate) op_kernels: Mutex<HashMap<crate::ops::KernelKey, Arc<BuiltinKernel>>>,
    pub(crate) staging: StagingPool,
    info: DeviceInfo,
}

// SAFETY: a CUcontext may be made current on any thread, and the driver API is
// thread-safe; the mutable state is behind mutexes.
unsafe impl Send for DeviceShared {}
// SAFETY: as above.
unsafe impl Sync for DeviceShared {}

impl DeviceShared {
    /// The device's primary context (retained while this value lives).
    pub(crate) fn context(&self) -> CUcontext {
        self.ctx
    }

    /// Makes the device's context current on the calling thread. Every driver call that
    /// needs a context is preceded by this.
    pub(crate) fn bind(&self) -> Result<()> {
        let ctx = self.ctx;
        // SAFETY: `ctx` is the retained primary context, live while `self` is.
        cu(
            &self.name,
            "making the context current",
            "cuCtxSetCurrent",
            || unsafe { sys::cuCtxSetCurrent(ctx) },
        )
    }

    /// Records an error that could not be returned (from a `Drop`); the first one is
    /// kept until it is reported.
    pub(crate) fn record_error(&self, e: Error) {
        let mut d = lock(&self.deferred);
        if d.is_none() {
            *d = Some(e);
        }
    }

    /// Releases a driver object from a `Drop`: binds the context, makes the call, and
    /// records a failure for the next report (a drop cannot return it).
    pub(crate) fn release(
        &self,
        what: &str,
        call: &'static str,
        f: impl FnOnce() -> sys::CUresult,
    ) {
        let result = self
            .bind()
            .and_then(|()| crate::driver::cu(&self.name, what, call, f));
        if let Err(e) = result {
            self.record_error(e);
        }
    }

    /// The recorded error, if any, now reported.
    pub(crate) fn take_error(&self) -> Option<Error> {
        lock(&self.deferred).take()
    }

    /// `(free, total)` bytes as the driver reports them.
    pub(crate) fn mem_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        cu(
            &self.name,
            "reading memory use",
            "cuMemGetInfo_v2",
            // SAFETY: context current; valid out-pointers.
            || unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        )?;
        Ok((free as u64, total as u64))
    }
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        // Modules and pinned memory are released with the context current.
        if self.bind().is_ok() {
            if let Ok(mut b) = self.builtins.lock() {
                b.clear();
            }
            if let Ok(mut k) = self.flag_wait.lock() {
                k.take();
            }
            if let Ok(mut k) = self.op_kernels.lock() {
                k.clear();
            }
        }
        self.staging.clear(self);
        let dev = self.device;
        // SAFETY: every object of this device holds an Arc to it, so none is left that
        // uses the context; the retain in `new` is balanced here.
        if let Err(e) = guarded("cuDevicePrimaryCtxRelease_v2", || unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(dev)
        }) {
            // Nobody is left to report it to.
            let _ = e;
        }
    }
}

/// A CUDA device as an xpu device.
pub struct CudaDevice {
    pub(crate) shared: Arc<DeviceShared>,
}

impl CudaDevice {
    pub(crate) fn new(driver: Arc<Driver>, index: u32) -> Result<Self> {
        let name = format!("{NAME}:{index}");
        let ordinal =
            c_int::try_from(index).map_err(|_| Error::invalid(format!("{name} does not exist")))?;
        let device = cu_device(ordinal)?;
        let gpu_name = device_name(ordinal)?;
        use CUdevice_attribute as A;
        let major = attribute(
            &name,
            device,
            A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        )?;
        let minor = attribute(
            &name,
            device,
            A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        )?;
        let sms = attribute(&name, device, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let mut total = 0usize;
        cu(
            &name,
            "reading the memory size",
            "cuDeviceTotalMem_v2",
            // SAFETY: valid out-pointer and device.
            || unsafe { sys::cuDeviceTotalMem_v2(&mut total, device) },
        )?;
        let mut pci = [0 as c_char; 64];
        cu(
            &name,
            "reading the PCI bus id",
            "cuDeviceGetPCIBusId",
            // SAFETY: `pci` is writable for its length, which is passed.
            || unsafe { sys::cuDeviceGetPCIBusId(pci.as_mut_ptr(), pci.len() as c_int, device) },
        )?;
        // SAFETY: CUuuid is plain bytes; zeroed is a valid value.
        let mut uuid: sys::CUuuid = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer and device.
        cu(&name, "reading the UUID", "cuDeviceGetUuid_v2", || unsafe {
            sys::cuDeviceGetUuid_v2(&mut uuid, device)
        })?;
        let can_access = |from: CUdevice, to: CUdevice| {
            let mut can: c_int = 0;
            // SAFETY: valid out-pointer and devices.
            let ok = guarded("cuDeviceCanAccessPeer", || unsafe {
                sys::cuDeviceCanAccessPeer(&mut can, from, to)
            });
            ok.is_ok() && can != 0
        };
        let others: Vec<(c_int, CUdevice)> = (0..driver.device_count)
            .filter(|&other| other != ordinal)
            .filter_map(|other| cu_device(other).ok().map(|d| (other, d)))
            .collect();
        let peer_access = others.iter().any(|&(_, peer)| can_access(device, peer));
        // Devices that can reach this one's memory: growable allocations map their
        // granules for them too, so peer copies and NCCL work on them.
        let accessed_by: Vec<c_int> = others
            .iter()
            .filter(|&&(_, peer)| can_access(peer, device))
            .map(|&(o, _)| o)
            .collect();
        let mut ctx: CUcontext = std::ptr::null_mut();
        cu(
            &name,
            "retaining the primary context",
            "cuDevicePrimaryCtxRetain",
            // SAFETY: valid out-pointer and device; released in `DeviceShared::drop`.
            || unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, device) },
        )?;
        let vmm_granularity = vmm_granularity(&driver, &name, device, ordinal, ctx);
        // The stream waits with `CU_STREAM_WAIT_VALUE_GEQ`, which the v2 memory
        // operations support on every device: only the NOR comparison, which xpu does
        // not use, needs `CAN_USE_STREAM_WAIT_VALUE_NOR_V2`.
        let wait_value = driver.stream_wait_value;
        let uuid_text = uuid_string(&uuid.bytes);
        let nvrtc = driver.nvrtc.as_ref().ok();
        let kernel_formats = if nvrtc.is_some() {
            vec![KernelFormat::Ptx, KernelFormat::CudaC]
        } else {
            vec![KernelFormat::Ptx]
        };
        let dtypes = if nvrtc.is_some() {
            DType::ALL.to_vec()
        } else {
            Vec::new()
        };
        let arch_code = major * 10 + minor;
        let nvrtc_extra = match &driver.nvrtc {
            Ok(n) => format!(
                "nvrtc={}.{} ({}; {})",
                n.version.0,
                n.version.1,
                n.path,
                match crate::nvrtc::target(&n.archs, arch_code) {
                    crate::nvrtc::Target::Sm(a) => format!("machine code for sm_{a}"),
                    crate::nvrtc::Target::Compute(a) =>
                        format!("PTX for compute_{a}, compiled forward by the driver"),
                }
            ),
            Err(reason) => format!("nvrtc=none ({reason})"),
        };
        let nccl_extra = match &driver.nccl {
            Ok(n) => format!(
                "nccl={} ({})",
                crate::nccl::version_string(n.version),
                n.path
            ),
            Err(reason) => format!("nccl=none ({reason})"),
        };
        let info = DeviceInfo {
            name: gpu_name,
            kind: DeviceKind::Gpu,
            vendor: "NVIDIA".to_string(),
            driver: format!(
                "CUDA driver {}, compute capability {major}.{minor}, {sms} SMs, PCI {}, UUID {uuid_text}{}",
                version_string(driver.version),
                c_string(&pci),
                if nvrtc.is_some() { "" } else { ", no NVRTC (builtin operations unavailable)" }
            ),
            memory_bytes: total as u64,
            capabilities: Capabilities {
                dtypes,
                max_allocation: (total as u64).max(1),
                peer_access,
                timeline_events: false,
                event_timing: true,
                kernel_formats,
                max_streams: u32::MAX,
                kernel_arg_alignment: 1,
                virtual_memory_granularity: vmm_granularity,
                host_addressable: false,
                ops: if nvrtc.is_some() {
                    crate::ops::supported(major * 10 + minor)
                } else {
                    Vec::new()
                },
            },
            extra: vec![
                format!("compute_capability={major}.{minor}"),
                format!("sm_count={sms}"),
                nvrtc_extra,
                nccl_extra,
                format!(
                    "foreign_event_wait={}",
                    if wait_value {
                        "stream-wait-value"
                    } else {
                        "spin-kernel"
                    }
                ),
            ],
        };
        Ok(CudaDevice {
            shared: Arc::new(DeviceShared {
                driver,
                name,
                index,
                device,
                ctx,
                arch: (major, minor),
                sm_count: sms.max(1) as u32,
                total_memory: total as u64,
                vmm_granularity,
                accessed_by,
                wait_value,
                deferred: Mutex::new(None),
                builtins: Mutex::new(HashMap::new()),
                flag_wait: Mutex::new(None),
                op_kernels: Mutex::new(HashMap::new()),
                staging: StagingPool::default(),
                info,
            }),
        })
    }

    /// The device's `cuda:N` name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The device's index within the backend (`N` of `cuda:N`).
    pub fn index(&self) -> u32 {
        self.shared.index
    }

    /// The compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.shared.arch
    }
}

/// The VMM granularity of device `ordinal`, or `None` when the driver lacks the VMM
/// symbols, the device does not report `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`
/// (named `VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED` in the bindings), or the query fails.
/// Never an error: without it the device simply offers no growable allocations.
fn vmm_granularity(
    driver: &Driver,
    name: &str,
    device: CUdevice,
    ordinal: c_int,
    ctx: CUcontext,
) -> Option<u64> {
    if !driver.vmm {
        return None;
    }
    let supported = attribute(
        name,
        device,
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
    )
    .ok()?;
    if supported != 1 {
        return None;
    }
    // SAFETY: `ctx` is the primary context the caller has just retained.
    guarded("cuCtxSetCurrent", || unsafe { sys::cuCtxSetCurrent(ctx) }).ok()?;
    let prop = crate::memory::vmm_properties(ordinal);
    let mut granularity = 0usize;
    // SAFETY: valid out-pointer and properties; the VMM symbols exist (`driver.vmm`).
    guarded("cuMemGetAllocationGranularity", || unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })
    .ok()?;
    u64::try_from(granularity).ok().filter(|g| *g > 0)
}

fn uuid_string(bytes: &[c_char; 16]) -> String {
    let b: Vec<u8> = bytes.iter().map(|c| *c as u8).collect();
    let hex =
        |r: std::ops::Range<usize>| -> String { b[r].iter().map(|x| format!("{x:02x}")).collect() };
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

impl DeviceImpl for CudaDevice {
    fn info(&self) -> DeviceInfo {
        self.shared.info.clone()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        let (free, total) = self.shared.mem_info()?;
        Ok(MemoryInfo { total, free })
    }

    fn allocate(&self, size: u64) -> Result<Arc<dyn RawAllocation>> {
        Ok(Arc::new(CudaBuffer::new(&self.shared, size)?))
    }

    fn allocate_growable(&self, reserve: u64, initial: u64) -> Result<Arc<dyn RawAllocation>> {
        Ok(Arc::new(CudaBuffer::growable(
            &self.shared,
            reserve,
            initial,
        )?))
    }

    fn pin_host(&self, ptr: std::ptr::NonNull<u8>, len: usize) -> Result<Option<xpu_hal::Pin>> {
        crate::pinned::register(&self.shared, ptr, len)
    }

    fn create_stream(&self) -> Result<Box<dyn StreamImpl>> {
        Ok(Box::new(CudaStream::new(self.shared.clone())?))
    }

    /// NCCL over `devices` (see `nccl::NcclGroup::new` for what it refuses).
    fn collective_group(
        &self,
        devices: &[xpu_hal::Device],
        config: xpu_hal::group::GroupConfig,
    ) -> Option<Result<Box<dyn xpu_hal::group::CollectiveGroup>>> {
        Some(crate::nccl::NcclGroup::new(devices).map(|g| {
            Box::new(g.with_timeout(config.timeout)) as Box<dyn xpu_hal::group::CollectiveGroup>
        }))
    }

    /// Whether the loaded NCCL makes groups across processes (NCCL 2.14 or newer; see
    /// `nccl::available_across`).
    fn collective_groups_across(&self) -> bool {
        crate::nccl::available_across().is_ok()
    }

    /// `ncclGetUniqueId`'s 128 bytes.
    fn collective_group_id(&self) -> Result<Vec<u8>> {
        crate::nccl::unique_id()
    }

    /// This process's non-blocking NCCL communicators of a group across processes (see
    /// `nccl::NcclGroup::across`).
    fn collective_group_across(
        &self,
        devices: &[xpu_hal::Device],
        across: &xpu_hal::group::GroupAcross,
        config: xpu_hal::group::GroupConfig,
    ) -> Result<Box<dyn xpu_hal::group::CollectiveGroup>> {
        crate::nccl::NcclGroup::across(devices, across, config)
            .map(|g| Box::new(g) as Box<dyn xpu_hal::group::CollectiveGroup>)
    }

    fn load_kernel(&self, desc: &KernelDesc) -> Result<Arc<dyn KernelImpl>> {
        Ok(Arc::new(crate::kernel::CudaKernel::load(
            &self.shared,
            desc,
        )?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
