//! CUDA C → PTX with NVRTC, cached per (source hash, GPU architecture) for the process.
//! Two flavours of source go through it: the builtin operations (compiled with the
//! options that make their arithmetic match the host reference) and user kernels of
//! format `cuda-c` (compiled with NVRTC's defaults); the flavour is part of the hash.
//! Only called when the probe found `libnvrtc.so` (`Driver::nvrtc`); every call is
//! guarded against cudarc panics like the driver's.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CString};
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::sys::{self, nvrtcProgram, nvrtcResult};

use crate::device::lock;
use crate::driver::panic_message;

type Key = (u64, c_int);

fn cache() -> &'static Mutex<HashMap<Key, Arc<Vec<u8>>>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Arc<Vec<u8>>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

fn call(name: &str, f: impl FnOnce() -> nvrtcResult) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(nvrtcResult::NVRTC_SUCCESS) => Ok(()),
        Ok(code) => Err(format!("{name} failed with {code:?}")),
        Err(p) => Err(format!(
            "{name} could not be called: {}",
            panic_message(&*p)
        )),
    }
}

/// The newest architecture NVRTC supports that is not newer than `arch` (10 × major +
/// minor), so that PTX for a GPU newer than the NVRTC still compiles (the driver JITs
/// it forward).
fn pick_arch(arch: c_int) -> c_int {
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer.
    if call("nvrtcGetNumSupportedArchs", || unsafe {
        sys::nvrtcGetNumSupportedArchs(&mut n)
    })
    .is_err()
        || n <= 0
    {
        return arch;
    }
    let mut archs = vec![0 as c_int; n as usize];
    // SAFETY: `archs` has room for the `n` entries NVRTC reported.
    if call("nvrtcGetSupportedArchs", || unsafe {
        sys::nvrtcGetSupportedArchs(archs.as_mut_ptr())
    })
    .is_err()
    {
        return arch;
    }
    archs
        .into_iter()
        .filter(|a| *a <= arch)
        .max()
        .unwrap_or(arch)
}

/// What a source is, which decides how it is compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Flavor {
    /// A builtin operation: no fused multiply-add, no flush to zero, IEEE division and
    /// square root, as on the host.
    Builtin,
    /// A user kernel (`KernelSource::CudaC`): NVRTC's default options.
    User,
}

impl Flavor {
    fn options(self, arch: c_int) -> Vec<String> {
        let mut options = vec![format!("--gpu-architecture=compute_{arch}")];
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

/// NUL-terminated PTX for `source` on architecture `arch` (10 × major + minor).
pub(crate) fn compile(source: &str, arch: c_int, flavor: Flavor) -> Result<Arc<Vec<u8>>, String> {
    let mut h = DefaultHasher::new();
    flavor.hash(&mut h);
    source.hash(&mut h);
    let key = (h.finish(), arch);
    if let Some(ptx) = lock(cache()).get(&key) {
        return Ok(ptx.clone());
    }
    let ptx = Arc::new(compile_uncached(source, pick_arch(arch), flavor)?);
    lock(cache()).insert(key, ptx.clone());
    Ok(ptx)
}

struct Program(nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: a program from nvrtcCreateProgram, destroyed once.
        let _ = call("nvrtcDestroyProgram", || unsafe {
            sys::nvrtcDestroyProgram(&mut self.0)
        });
    }
}

fn compile_uncached(source: &str, arch: c_int, flavor: Flavor) -> Result<Vec<u8>, String> {
    let src = CString::new(source).map_err(|e| format!("the source contains NUL: {e}"))?;
    let name = flavor.file_name();
    let mut prog: nvrtcProgram = std::ptr::null_mut();
    // SAFETY: valid NUL-terminated strings that outlive the call; no headers.
    call("nvrtcCreateProgram", || unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    let prog = Program(prog);
    let options: Vec<CString> = flavor
        .options(arch)
        .into_iter()
        .filter_map(|o| CString::new(o).ok())
        .collect();
    let ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    let p = prog.0;
    // SAFETY: a live program; the option strings outlive the call.
    let compiled = call("nvrtcCompileProgram", || unsafe {
        sys::nvrtcCompileProgram(p, ptrs.len() as c_int, ptrs.as_ptr())
    });
    if let Err(e) = compiled {
        return Err(format!("{e}: {}", log(p)));
    }
    let mut size = 0usize;
    // SAFETY: a compiled program; valid out-pointer.
    call("nvrtcGetPTXSize", || unsafe {
        sys::nvrtcGetPTXSize(p, &mut size)
    })?;
    let mut ptx = vec![0u8; size.max(1)];
    // SAFETY: `ptx` has the size NVRTC reported (including the NUL).
    call("nvrtcGetPTX", || unsafe {
        sys::nvrtcGetPTX(p, ptx.as_mut_ptr().cast())
    })?;
    if ptx.last() != Some(&0) {
        ptx.push(0);
    }
    Ok(ptx)
}

fn log(p: nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: a live program; valid out-pointer.
    if call("nvrtcGetProgramLogSize", || unsafe {
        sys::nvrtcGetProgramLogSize(p, &mut size)
    })
    .is_err()
    {
        return String::new();
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: `buf` has the size NVRTC reported.
    if call("nvrtcGetProgramLog", || unsafe {
        sys::nvrtcGetProgramLog(p, buf.as_mut_ptr().cast())
    })
    .is_err()
    {
        return String::new();
    }
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_keep_host_rounding_and_user_kernels_get_the_defaults() {
        let builtin = Flavor::Builtin.options(90);
        assert_eq!(builtin[0], "--gpu-architecture=compute_90");
        assert!(builtin.iter().any(|o| o == "--fmad=false"));
        assert_eq!(Flavor::User.options(80), ["--gpu-architecture=compute_80"]);
    }
}
