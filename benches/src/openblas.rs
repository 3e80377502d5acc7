//! OpenBLAS loaded at run time (`libopenblas.so.0`, Debian `libopenblas0` or
//! `libopenblas-dev`), as the reference for host matrix multiplication: `cblas_sgemm` and
//! `cblas_dgemm` on the same row-major matrices, with the thread count set to the
//! device's. Loading it at run time keeps OpenBLAS out of the build: without it, the
//! benchmark says so instead of failing to link.

use libloading::{Library, Symbol};
use xpu_hal::{Error, Result};

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

type Sgemm = CblasGemm<f32>;
type Dgemm = CblasGemm<f64>;
type SetThreads = unsafe extern "C" fn(i32);
type GetThreads = unsafe extern "C" fn() -> i32;

/// A loaded OpenBLAS.
pub struct OpenBlas {
    sgemm: Sgemm,
    dgemm: Dgemm,
    set_threads: SetThreads,
    get_threads: GetThreads,
    // Kept loaded for as long as the function pointers above are used.
    _lib: Library,
}

/// Row-major matrices of one product `c = alpha·op(a)·op(b) + beta·c`, `m × n` with
/// inner size `k`, densely packed.
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    /// Rows of `c`.
    pub m: usize,
    /// Columns of `c`.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// Whether `a` is stored `k × m`.
    pub trans_a: bool,
    /// Whether `b` is stored `n × k`.
    pub trans_b: bool,
}

impl OpenBlas {
    /// Loads `libopenblas.so.0` (or `XPU_OPENBLAS`, a path).
    pub fn load() -> Result<Self> {
        let path = std::env::var("XPU_OPENBLAS").unwrap_or_else(|_| "libopenblas.so.0".into());
        // SAFETY: loading OpenBLAS runs its constructors, which only set up its thread
        // pool; the library stays loaded as long as this value (`_lib`).
        let lib = unsafe { Library::new(&path) }.map_err(|e| {
            Error::unavailable(
                "openblas",
                format!("{path} could not be loaded ({e}); install Debian's libopenblas0 (scripts/deps.sh --bench) or set XPU_OPENBLAS"),
            )
        })?;
        // SAFETY: the symbols have the C signatures of OpenBLAS's cblas.h, and the
        // pointers are used only while `lib` is loaded (it moves into the result).
        unsafe {
            let sgemm = *lib.get::<Sgemm>(b"cblas_sgemm\0").map_err(missing)?;
            let dgemm = *lib.get::<Dgemm>(b"cblas_dgemm\0").map_err(missing)?;
            let set_threads: Symbol<'_, SetThreads> =
                lib.get(b"openblas_set_num_threads\0").map_err(missing)?;
            let get_threads: Symbol<'_, GetThreads> =
                lib.get(b"openblas_get_num_threads\0").map_err(missing)?;
            let (set_threads, get_threads) = (*set_threads, *get_threads);
            Ok(OpenBlas {
                sgemm,
                dgemm,
                set_threads,
                get_threads,
                _lib: lib,
            })
        }
    }

    /// Makes OpenBLAS use `threads` threads and returns how many it then reports.
    pub fn set_threads(&self, threads: usize) -> usize {
        // SAFETY: plain OpenBLAS calls with no pointers.
        unsafe {
            (self.set_threads)(threads.clamp(1, 1024) as i32);
            (self.get_threads)().max(1) as usize
        }
    }

    /// `cblas_sgemm` on densely packed row-major matrices.
    pub fn sgemm(
        &self,
        g: Gemm,
        alpha: f32,
        a: &[f32],
        b: &[f32],
        beta: f32,
        c: &mut [f32],
    ) -> Result<()> {
        call(self.sgemm, g, alpha, a, b, beta, c)
    }

    /// `cblas_dgemm` on densely packed row-major matrices.
    pub fn dgemm(
        &self,
        g: Gemm,
        alpha: f64,
        a: &[f64],
        b: &[f64],
        beta: f64,
        c: &mut [f64],
    ) -> Result<()> {
        call(self.dgemm, g, alpha, a, b, beta, c)
    }
}

/// A CBLAS `?gemm` of element type `T`.
type CblasGemm<T> = unsafe extern "C" fn(
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    T,
    *const T,
    i32,
    *const T,
    i32,
    T,
    *mut T,
    i32,
);

/// Calls `f` (`cblas_sgemm` or `cblas_dgemm`) on densely packed row-major matrices.
fn call<T>(
    f: CblasGemm<T>,
    g: Gemm,
    alpha: T,
    a: &[T],
    b: &[T],
    beta: T,
    c: &mut [T],
) -> Result<()> {
    let (lda, ldb) = g.check(a.len(), b.len(), c.len())?;
    // SAFETY: `check` verified the slices hold the matrices with these leading
    // dimensions and that every size fits an `int`; `c` is a unique borrow.
    unsafe {
        f(
            ROW_MAJOR,
            if g.trans_a { TRANS } else { NO_TRANS },
            if g.trans_b { TRANS } else { NO_TRANS },
            g.m as i32,
            g.n as i32,
            g.k as i32,
            alpha,
            a.as_ptr(),
            lda,
            b.as_ptr(),
            ldb,
            beta,
            c.as_mut_ptr(),
            g.n as i32,
        );
    }
    Ok(())
}

impl Gemm {
    /// The leading dimensions of `a` and `b`, after checking the lengths and that every
    /// size fits OpenBLAS's `int`.
    fn check(&self, a: usize, b: usize, c: usize) -> Result<(i32, i32)> {
        let fits = |v: usize| i32::try_from(v).is_ok();
        if ![self.m, self.n, self.k].into_iter().all(fits) {
            return Err(Error::invalid(format!(
                "{}×{}×{} is too large for OpenBLAS's 32-bit sizes",
                self.m, self.n, self.k
            )));
        }
        if a < self.m * self.k || b < self.k * self.n || c < self.m * self.n {
            return Err(Error::invalid(format!(
                "matrices of {a}, {b} and {c} elements are too small for {}×{}×{}",
                self.m, self.n, self.k
            )));
        }
        let lda = if self.trans_a { self.m } else { self.k };
        let ldb = if self.trans_b { self.k } else { self.n };
        Ok((lda.max(1) as i32, ldb.max(1) as i32))
    }
}

fn missing(e: libloading::Error) -> Error {
    Error::unavailable("openblas", format!("a CBLAS symbol is missing: {e}"))
}
