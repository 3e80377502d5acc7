//! CUDA C → device code with NVRTC, cached per (source, GPU architecture) for the
//! process.
//!
//! NVRTC is found by [`crate::libs`] (the loader path, toolkits, Python's `nvidia`
//! packages, or `XPU_CUDA_NVRTC`) and called through its C ABI with a function table of
//! our own, so that any NVRTC from CUDA 11.2 on works, whatever version the bindings
//! were generated for. One that is newer than the driver is refused with that reason:
//! the code it produces would not load (the driver rejects PTX of a newer ISA and
//! machine code of a newer toolkit).
//!
//! Code is compiled to the device's own machine code (`--gpu-architecture=sm_XX`, a
//! cubin) when NVRTC knows the architecture, so the driver loads it without a JIT step
//! and without caring which PTX version it accepts. For a GPU newer than the NVRTC, the
//! fallback is PTX for the newest architecture NVRTC has (`compute_YY`), which the
//! driver compiles forward.
//!
//! Two flavours of source go through it: the builtin operations (compiled with the
//! options that make their arithmetic match the host reference) and user kernels of
//! format `cuda-c` (compiled with NVRTC's defaults); the flavour is part of the key.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use libloading::Library;

use crate::device::lock;
use crate::libs::{self, Found, NotFound, Opened, Places};

/// `nvrtcProgram`: an opaque handle.
type Program = *mut c_void;
/// `nvrtcResult`: 0 is `NVRTC_SUCCESS`.
type NvrtcResult = c_int;

/// NVRTC's entry points this crate calls, with their C types (`nvrtc.h`).
#[derive(Clone, Copy)]
struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    num_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    destroy: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
}

impl Api {
    /// The table of `lib`, or which entry point it lacks.
    fn load(lib: &Library) -> Result<Api, String> {
        // SAFETY: each lookup's type is the one `nvrtc.h` declares for its name.
        unsafe {
            Ok(Api {
                version: libs::symbol(lib, "NVRTC", "nvrtcVersion")?,
                num_archs: libs::symbol(lib, "NVRTC", "nvrtcGetNumSupportedArchs")?,
                archs: libs::symbol(lib, "NVRTC", "nvrtcGetSupportedArchs")?,
                create: libs::symbol(lib, "NVRTC", "nvrtcCreateProgram")?,
                compile: libs::symbol(lib, "NVRTC", "nvrtcCompileProgram")?,
                ptx_size: libs::symbol(lib, "NVRTC", "nvrtcGetPTXSize")?,
                ptx: libs::symbol(lib, "NVRTC", "nvrtcGetPTX")?,
                cubin_size: libs::symbol(lib, "NVRTC", "nvrtcGetCUBINSize")?,
                cubin: libs::symbol(lib, "NVRTC", "nvrtcGetCUBIN")?,
                log_size: libs::symbol(lib, "NVRTC", "nvrtcGetProgramLogSize")?,
                log: libs::symbol(lib, "NVRTC", "nvrtcGetProgramLog")?,
                destroy: libs::symbol(lib, "NVRTC", "nvrtcDestroyProgram")?,
            })
        }
    }
}

/// A loaded NVRTC: its entry points, version and file, and the architectures it
/// compiles for.
pub struct Nvrtc {
    api: Api,
    /// `(major, minor)` as `nvrtcVersion` reports it.
    pub version: (c_int, c_int),
    /// The file the loader mapped.
    pub path: String,
    /// Architectures (10 × major + minor) NVRTC can compile for, ascending.
    pub archs: Vec<c_int>,
    cache: Mutex<HashMap<Key, Arc<Image>>>,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc")
            .field("version", &self.version)
            .field("path", &self.path)
            .field("archs", &self.archs)
            .finish()
    }
}

// SAFETY: NVRTC's functions are thread-safe (each call works on its own program), and
// the table only holds function pointers into a library that is never unloaded.
unsafe impl Send for Nvrtc {}
// SAFETY: as above; the cache is behind a mutex.
unsafe impl Sync for Nvrtc {}

/// `major.minor` of a CUDA version number (1000 × major + 10 × minor).
fn cuda_version(v: (c_int, c_int)) -> c_int {
    v.0 * 1000 + v.1 * 10
}

/// Whether code from NVRTC `nvrtc` loads on a driver of `driver` (1000 × major + 10 ×
/// minor): the driver must be at least as new; `Err` says why not.
pub fn check_against_driver(nvrtc: (c_int, c_int), driver: c_int) -> Result<(), String> {
    if cuda_version(nvrtc) > driver {
        return Err(format!(
            "NVRTC {}.{} is newer than the driver (CUDA {}): the driver would refuse the code it compiles; use an NVRTC of CUDA {} or older, or update the driver",
            nvrtc.0,
            nvrtc.1,
            crate::driver::version_string(driver),
            crate::driver::version_string(driver)
        ));
    }
    Ok(())
}

impl Nvrtc {
    /// Finds NVRTC for a driver of version `driver` (see the module docs): `places`
    /// from the environment unless given.
    pub fn find(driver: c_int, places: Option<Places>) -> Result<Found<Nvrtc>, NotFound> {
        let places = places.unwrap_or_else(|| Places::from_env(&libs::NVRTC));
        let open = |lib: &Library| {
            let api = Api::load(lib)?;
            let (mut major, mut minor) = (0, 0);
            // SAFETY: valid out-pointers.
            let r = unsafe { (api.version)(&mut major, &mut minor) };
            if r != 0 {
                return Err(format!("nvrtcVersion failed with {r}"));
            }
            check_against_driver((major, minor), driver)?;
            let archs = supported_archs(&api);
            Ok(Opened {
                symbol: api.version as *const c_void,
                version: format!("{major}.{minor}"),
                value: Nvrtc {
                    api,
                    version: (major, minor),
                    path: String::new(),
                    archs,
                    cache: Mutex::new(HashMap::new()),
                },
            })
        };
        // SAFETY: loading NVRTC runs its initialisers, which is what using it means;
        // the table is used only as `nvrtc.h` declares.
        unsafe { libs::search(&libs::NVRTC, &places, open) }.map(|mut found| {
            found.value.path = found.path.clone();
            found
        })
    }

    /// Device code for `source` on architecture `arch` (10 × major + minor), compiled
    /// once per (flavour, source, architecture) in the process.
    pub fn compile(&self, source: &str, arch: c_int, flavor: Flavor) -> Result<Arc<Image>, String> {
        let mut h = DefaultHasher::new();
        flavor.hash(&mut h);
        source.hash(&mut h);
        let key = (h.finish(), arch);
        if let Some(image) = lock(&self.cache).get(&key) {
            return Ok(image.clone());
        }
        let image = Arc::new(self.compile_uncached(source, target(&self.archs, arch), flavor)?);
        lock(&self.cache).insert(key, image.clone());
        Ok(image)
    }

    fn call(&self, name: &str, r: NvrtcResult) -> Result<(), String> {
        if r == 0 {
            Ok(())
        } else {
            Err(format!("{name} failed with NVRTC error {r}"))
        }
    }

    fn compile_uncached(
        &self,
        source: &str,
        target: Target,
        flavor: Flavor,
    ) -> Result<Image, String> {
        let src = CString::new(source).map_err(|e| format!("the source contains NUL: {e}"))?;
        let name = flavor.file_name();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid NUL-terminated strings that outlive the call; no headers.
        let r = unsafe {
            (self.api.create)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        self.call("nvrtcCreateProgram", r)?;
        let prog = ProgramGuard(self.api.destroy, prog);
        let options: Vec<CString> = flavor
            .options(target)
            .into_iter()
            .filter_map(|o| CString::new(o).ok())
            .collect();
        let ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let p = prog.1;
        // SAFETY: a live program; the option strings outlive the call.
        let r = unsafe { (self.api.compile)(p, ptrs.len() as c_int, ptrs.as_ptr()) };
        if r != 0 {
            return Err(format!(
                "nvrtcCompileProgram failed with NVRTC error {r}: {}",
                self.log(p)
            ));
        }
        let (size_fn, get_fn, kind) = match target {
            Target::Sm(_) => (self.api.cubin_size, self.api.cubin, ImageKind::Cubin),
            Target::Compute(_) => (self.api.ptx_size, self.api.ptx, ImageKind::Ptx),
        };
        let mut size = 0usize;
        // SAFETY: a compiled program; valid out-pointer.
        self.call("nvrtcGet*Size", unsafe { size_fn(p, &mut size) })?;
        let mut bytes = vec![0u8; size.max(1)];
        // SAFETY: `bytes` has the size NVRTC reported.
        self.call("nvrtcGet*", unsafe { get_fn(p, bytes.as_mut_ptr().cast()) })?;
        if kind == ImageKind::Ptx && bytes.last() != Some(&0) {
            bytes.push(0);
        }
        Ok(Image {
            bytes,
            kind,
            target,
        })
    }

    fn log(&self, p: Program) -> String {
        let mut size = 0usize;
        // SAFETY: a live program; valid out-pointer.
        if unsafe { (self.api.log_size)(p, &mut size) } != 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` has the size NVRTC reported.
        if unsafe { (self.api.log)(p, buf.as_mut_ptr().cast()) } != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .to_string()
    }
}

/// The architectures NVRTC supports, ascending (empty if it cannot say).
fn supported_archs(api: &Api) -> Vec<c_int> {
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer.
    if unsafe { (api.num_archs)(&mut n) } != 0 || n <= 0 {
        return Vec::new();
    }
    let mut archs = vec![0 as c_int; n as usize];
    // SAFETY: `archs` has room for the `n` entries NVRTC reported.
    if unsafe { (api.archs)(archs.as_mut_ptr()) } != 0 {
        return Vec::new();
    }
    archs.sort_unstable();
    archs
}

/// Destroys a program when dropped.
struct ProgramGuard(unsafe extern "C" fn(*mut Program) -> NvrtcResult, Program);

impl Drop for ProgramGuard {
    fn drop(&mut self) {
        // SAFETY: a program from nvrtcCreateProgram, destroyed once.
        let _ = unsafe { (self.0)(&mut self.1) };
    }
}

/// What NVRTC is asked to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Machine code for exactly this architecture (a cubin).
    Sm(c_int),
    /// PTX for this virtual architecture, compiled forward by the driver.
    Compute(c_int),
}

/// The target for a device of architecture `arch` given the architectures NVRTC
/// supports: its own machine code when NVRTC knows it, else PTX for the newest
/// architecture not newer than it (the driver JITs it forward), else — NVRTC could
/// not say — the device's own architecture as PTX.
pub fn target(supported: &[c_int], arch: c_int) -> Target {
    if supported.contains(&arch) {
        return Target::Sm(arch);
    }
    supported
        .iter()
        .copied()
        .filter(|a| *a <= arch)
        .max()
        .map_or(Target::Compute(arch), Target::Compute)
}

/// Whether an [`Image`] is machine code or PTX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// A cubin (ELF) for one architecture.
    Cubin,
    /// NUL-terminated PTX text.
    Ptx,
}

/// Compiled device code, ready for `cuModuleLoadData` (which takes either kind).
#[derive(Debug)]
pub struct Image {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// What they are.
    pub kind: ImageKind,
    /// What they were compiled for.
    pub target: Target,
}

type Key = (u64, c_int);

/// What a source is, which decides how it is compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// A builtin operation: no fused multiply-add, no flush to zero, IEEE division and
    /// square root, as on the host.
    Builtin,
    /// A user kernel (`KernelSource::CudaC`): NVRTC's default options.
    User,
}

impl Flavor {
    fn options(self, target: Target) -> Vec<String> {
        let mut options = vec![match target {
            Target::Sm(a) => format!("--gpu-architecture=sm_{a}"),
            Target::Compute(a) => format!("--gpu-architecture=compute_{a}"),
        }];
        if self == Flavor::Builtin {
            options.extend(
                [
                    // Separate roundings for a*b and +c, as on the host.
                    "--fmad=false",
                    "--ftz=false",
                    "--prec-div=true",
                    "--prec-sqrt=true",
                ]
                .map(String::from),
            );
        }
        options
    }

    fn file_name(self) -> &'static std::ffi::CStr {
        match self {
            Flavor::Builtin => c"xpu_builtins.cu",
            Flavor::User => c"xpu_kernel.cu",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_keep_host_rounding_and_user_kernels_get_the_defaults() {
        let builtin = Flavor::Builtin.options(Target::Sm(90));
        assert_eq!(builtin[0], "--gpu-architecture=sm_90");
        assert!(builtin.iter().any(|o| o == "--fmad=false"));
        assert_eq!(
            Flavor::User.options(Target::Compute(80)),
            ["--gpu-architecture=compute_80"]
        );
    }

    #[test]
    fn a_known_architecture_gets_machine_code_and_a_newer_one_ptx() {
        let nvrtc_12_6 = [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
        assert_eq!(
            target(&nvrtc_12_6, 90),
            Target::Sm(90),
            "H100/H200: a cubin"
        );
        assert_eq!(
            target(&nvrtc_12_6, 100),
            Target::Compute(90),
            "newer GPU: PTX"
        );
        assert_eq!(target(&[], 90), Target::Compute(90), "NVRTC could not say");
        assert_eq!(target(&[60, 70], 52), Target::Compute(52));
    }

    #[test]
    fn an_nvrtc_newer_than_the_driver_is_refused() {
        assert!(check_against_driver((13, 0), 13000).is_ok());
        assert!(check_against_driver((12, 6), 13000).is_ok());
        let e = check_against_driver((13, 1), 13000).unwrap_err();
        assert!(
            e.contains("NVRTC 13.1 is newer than the driver (CUDA 13.0)"),
            "{e}"
        );
        assert!(check_against_driver((13, 0), 12060).is_err());
    }
}
