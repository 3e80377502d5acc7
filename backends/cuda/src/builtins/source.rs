//! CUDA C source of the builtin kernels, one kernel per [`BuiltinKind`].
//!
//! Every kernel has the same signature (the dispatcher relies on it):
//!
//! ```c
//! extern "C" __global__ void ENTRY(unsigned char* dst, const unsigned char* a,
//!     const unsigned char* b, unsigned long long n, unsigned long long scalar);
//! ```
//!
//! `dst`, `a` and `b` point at the first element of each slice (device pointer + the
//! slice's byte offset; unused operands are null); `n` is the element count; `scalar`
//! holds the fill value or scale factor's little-endian bits in its low bytes. Kernels
//! loop with a grid stride. `dst` may alias `a` or `b` exactly (in-place operations):
//! each thread reads its element before writing it.
//!
//! Values are stored as their own C types (`f16`/`bf16` as `unsigned short` bits) and
//! computed in a *work* type: `float` for `f32`/`f16`/`bf16`, `unsigned int` for `u8`.
//! Float arithmetic uses the `__fadd_rn`-style intrinsics, which the compiler never
//! contracts into fused multiply-adds; integer arithmetic runs on unsigned types so
//! that overflow wraps (signed overflow is undefined in C++). Conversions follow the
//! helpers in `library.cu` (see its header comment).

use xpu_hal::{BinaryOp, DType};

use super::BuiltinKind;

/// The helper library every kernel source starts with.
pub const LIBRARY: &str = include_str!("library.cu");

/// The C type an element is stored as.
pub fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 => "unsigned short",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U8 => "unsigned char",
    }
}

/// The unsigned C type of an element's bits.
fn bits_type(dtype: DType) -> &'static str {
    match dtype.size() {
        1 => "unsigned char",
        2 => "unsigned short",
        4 => "unsigned int",
        _ => "unsigned long long",
    }
}

/// The C type arithmetic on `dtype` runs in.
pub fn work_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "float",
        DType::F64 => "double",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U8 => "unsigned int",
    }
}

fn decode(dtype: DType, raw: &str) -> String {
    match dtype {
        DType::F16 => format!("xpu_f32_from_f16({raw})"),
        DType::BF16 => format!("xpu_f32_from_bf16({raw})"),
        DType::U8 => format!("((unsigned int)({raw}))"),
        DType::F32 | DType::F64 | DType::I32 | DType::I64 => raw.to_string(),
    }
}

fn encode(dtype: DType, v: &str) -> String {
    match dtype {
        DType::F16 => format!("xpu_f16_from_f32({v})"),
        DType::BF16 => format!("xpu_bf16_from_f32({v})"),
        DType::U8 => format!("((unsigned char)(({v}) & 0xFFu))"),
        DType::F32 | DType::F64 | DType::I32 | DType::I64 => v.to_string(),
    }
}

/// The scalar operand (`scalar`'s low bytes) as a work value.
fn scalar(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "__uint_as_float((unsigned int)scalar)",
        DType::F64 => "__longlong_as_double((long long)scalar)",
        DType::I32 => "((int)(unsigned int)scalar)",
        DType::I64 => "((long long)scalar)",
        DType::U8 => "((unsigned int)(scalar & 0xFFull))",
        DType::F16 => "xpu_f32_from_f16((unsigned int)(scalar & 0xFFFFull))",
        DType::BF16 => "xpu_f32_from_bf16((unsigned int)(scalar & 0xFFFFull))",
    }
}

/// `a op b` on work values.
fn combine(op: BinaryOp, dtype: DType, a: &str, b: &str) -> String {
    use DType::*;
    match (op, dtype) {
        (BinaryOp::Sum, F32 | F16 | BF16) => format!("__fadd_rn({a}, {b})"),
        (BinaryOp::Prod, F32 | F16 | BF16) => format!("__fmul_rn({a}, {b})"),
        (BinaryOp::Sum, F64) => format!("__dadd_rn({a}, {b})"),
        (BinaryOp::Prod, F64) => format!("__dmul_rn({a}, {b})"),
        (BinaryOp::Min, F32 | F16 | BF16) => format!("xpu_min_f32({a}, {b})"),
        (BinaryOp::Max, F32 | F16 | BF16) => format!("xpu_max_f32({a}, {b})"),
        (BinaryOp::Min, F64) => format!("xpu_min_f64({a}, {b})"),
        (BinaryOp::Max, F64) => format!("xpu_max_f64({a}, {b})"),
        (BinaryOp::Sum, I32) => format!("((int)((unsigned int)({a}) + (unsigned int)({b})))"),
        (BinaryOp::Prod, I32) => format!("((int)((unsigned int)({a}) * (unsigned int)({b})))"),
        (BinaryOp::Sum, I64) => {
            format!("((long long)((unsigned long long)({a}) + (unsigned long long)({b})))")
        }
        (BinaryOp::Prod, I64) => {
            format!("((long long)((unsigned long long)({a}) * (unsigned long long)({b})))")
        }
        (BinaryOp::Sum, U8) => format!("(({a}) + ({b}))"),
        (BinaryOp::Prod, U8) => format!("(({a}) * ({b}))"),
        (BinaryOp::Min, I32 | I64 | U8) => format!("(({a}) < ({b}) ? ({a}) : ({b}))"),
        (BinaryOp::Max, I32 | I64 | U8) => format!("(({a}) > ({b}) ? ({a}) : ({b}))"),
    }
}

/// The work value `x` of `src` converted to a storage value of `dst` with Rust `as`
/// semantics.
fn cast(src: DType, dst: DType, x: &str) -> String {
    use DType::*;
    match dst {
        I32 | I64 | U8 => cast_to_int(src, dst, x),
        F64 => match src {
            F64 => x.to_string(),
            F32 | F16 | BF16 => format!("xpu_f64_from_f32({x})"),
            I32 | U8 => format!("((double)({x}))"),
            I64 => format!("xpu_f64_from_i64({x})"),
        },
        // A copy: the host's `f32 as f32` keeps even a signaling NaN's bits.
        F32 if src == F32 => x.to_string(),
        F32 | F16 | BF16 => {
            let unpacked = match src {
                F32 | F16 | BF16 => format!("xpu_unpack_f32(__float_as_uint({x}))"),
                F64 => format!("xpu_unpack_f64({x})"),
                I32 => format!("xpu_unpack_i32({x})"),
                I64 => format!("xpu_unpack_i64({x})"),
                U8 => format!("xpu_unpack_u32(false, {x})"),
            };
            match dst {
                F32 => format!("__uint_as_float(xpu_encode({unpacked}, 23u, 8u))"),
                F16 => format!("((unsigned short)xpu_encode({unpacked}, 10u, 5u))"),
                _ => format!("((unsigned short)xpu_encode({unpacked}, 7u, 8u))"),
            }
        }
    }
}

fn cast_to_int(src: DType, dst: DType, x: &str) -> String {
    use DType::*;
    let from = match src {
        F32 | F16 | BF16 => Some("f32"),
        F64 => Some("f64"),
        I32 | I64 | U8 => None,
    };
    let to = match dst {
        I64 => "i64",
        U8 => "u8",
        _ => "i32",
    };
    let v = match (from, src, dst) {
        (Some(from), _, _) => format!("xpu_{to}_from_{from}({x})"),
        (None, I32 | U8, I64) => format!("((long long)({x}))"),
        (None, U8, I32) => format!("((int)({x}))"),
        (None, I32, U8) => format!("((unsigned int)({x}) & 0xFFu)"),
        (None, I64, I32) => {
            format!("((int)(unsigned int)((unsigned long long)({x}) & 0xFFFFFFFFull))")
        }
        (None, I64, U8) => format!("((unsigned int)((unsigned long long)({x}) & 0xFFull))"),
        // The same dtype.
        _ => x.to_string(),
    };
    if dst == U8 {
        format!("((unsigned char)({v}))")
    } else {
        v
    }
}

fn name_of(op: BinaryOp) -> &'static str {
    op.name()
}

/// The kernel's entry point name (`xpu_binary_sum_f32`, `xpu_cast_f64_to_bf16` …).
pub fn entry(kind: BuiltinKind) -> String {
    match kind {
        BuiltinKind::Fill(d) => format!("xpu_fill_{d}"),
        BuiltinKind::Binary(op, d) => format!("xpu_binary_{}_{d}", name_of(op)),
        BuiltinKind::Accumulate(op, d) => format!("xpu_accumulate_{}_{d}", name_of(op)),
        BuiltinKind::Scale(d) => format!("xpu_scale_{d}"),
        BuiltinKind::Cast(s, d) => format!("xpu_cast_{s}_to_{d}"),
    }
}

/// The complete CUDA C source of one builtin kernel: the helper library and the
/// kernel.
pub fn source(kind: BuiltinKind) -> String {
    let (dst_type, a_type, b_type, body) = match kind {
        BuiltinKind::Fill(d) => (
            bits_type(d),
            "unsigned char",
            "unsigned char",
            format!("dst[i] = ({})scalar;", bits_type(d)),
        ),
        BuiltinKind::Binary(op, d) => {
            let w = work_type(d);
            (
                storage_type(d),
                storage_type(d),
                storage_type(d),
                format!(
                    "{w} x = {};\n        {w} y = {};\n        dst[i] = {};",
                    decode(d, "a[i]"),
                    decode(d, "b[i]"),
                    encode(d, &combine(op, d, "x", "y"))
                ),
            )
        }
        BuiltinKind::Accumulate(op, d) => {
            let w = work_type(d);
            (
                storage_type(d),
                storage_type(d),
                "unsigned char",
                format!(
                    "{w} x = {};\n        {w} y = {};\n        dst[i] = {};",
                    decode(d, "dst[i]"),
                    decode(d, "a[i]"),
                    encode(d, &combine(op, d, "x", "y"))
                ),
            )
        }
        BuiltinKind::Scale(d) => {
            let w = work_type(d);
            (
                storage_type(d),
                storage_type(d),
                "unsigned char",
                format!(
                    "{w} s = {};\n        {w} x = {};\n        dst[i] = {};",
                    scalar(d),
                    decode(d, "a[i]"),
                    encode(d, &combine(BinaryOp::Prod, d, "x", "s"))
                ),
            )
        }
        BuiltinKind::Cast(s, d) => (
            storage_type(d),
            storage_type(s),
            "unsigned char",
            format!(
                "{} x = {};\n        dst[i] = {};",
                work_type(s),
                decode(s, "a[i]"),
                cast(s, d, "x")
            ),
        ),
    };
    format!(
        "{LIBRARY}
extern \"C\" __global__ void {entry}(unsigned char* dst_bytes, const unsigned char* a_bytes,
    const unsigned char* b_bytes, unsigned long long n, unsigned long long scalar) {{
    {dst_type}* dst = ({dst_type}*)dst_bytes;
    const {a_type}* a = (const {a_type}*)a_bytes;
    const {b_type}* b = (const {b_type}*)b_bytes;
    (void)a;
    (void)b;
    (void)scalar;
    unsigned long long stride = (unsigned long long)gridDim.x * (unsigned long long)blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += stride) {{
        {body}
    }}
}}
",
        entry = entry(kind)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balanced(s: &str) -> bool {
        let mut depth = [0i64; 3];
        for c in s.chars() {
            match c {
                '{' => depth[0] += 1,
                '}' => depth[0] -= 1,
                '(' => depth[1] += 1,
                ')' => depth[1] -= 1,
                '[' => depth[2] += 1,
                ']' => depth[2] -= 1,
                _ => {}
            }
            if depth.iter().any(|d| *d < 0) {
                return false;
            }
        }
        depth == [0, 0, 0]
    }

    #[test]
    fn every_kernel_is_well_formed() {
        let kinds = BuiltinKind::all();
        assert_eq!(kinds.len(), 7 + 28 + 28 + 7 + 49);
        let mut entries = std::collections::HashSet::new();
        for kind in kinds {
            let src = source(kind);
            let name = entry(kind);
            assert!(!src.is_empty());
            assert!(
                src.contains(&format!("extern \"C\" __global__ void {name}(")),
                "{kind:?}"
            );
            assert!(balanced(&src), "{kind:?}: unbalanced brackets");
            assert!(entries.insert(name.clone()), "duplicate entry {name}");
            // Identifiers only: NVRTC's entry lookup takes the name as is.
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            // No host headers: NVRTC has no system include path by default.
            assert!(!src.contains("#include"), "{kind:?}");
        }
    }

    #[test]
    fn arithmetic_follows_the_hal_rules() {
        // Floats: separate roundings (no contraction); integers wrap (unsigned).
        let add = source(BuiltinKind::Binary(BinaryOp::Sum, DType::F16));
        assert!(add.contains("xpu_f16_from_f32(__fadd_rn(x, y))"), "{add}");
        let mul = source(BuiltinKind::Binary(BinaryOp::Prod, DType::I32));
        assert!(mul.contains("(unsigned int)(x) * (unsigned int)(y)"));
        let min = source(BuiltinKind::Accumulate(BinaryOp::Min, DType::F64));
        assert!(min.contains("xpu_min_f64(x, y)"));
        let scale = source(BuiltinKind::Scale(DType::BF16));
        assert!(scale.contains("xpu_bf16_from_f32(__fmul_rn(x, s))"));
        // Saturating float → int and single rounding int → half.
        let cast = source(BuiltinKind::Cast(DType::F32, DType::U8));
        assert!(cast.contains("xpu_u8_from_f32(x)"));
        let cast = source(BuiltinKind::Cast(DType::I64, DType::BF16));
        assert!(cast.contains("xpu_encode(xpu_unpack_i64(x), 7u, 8u)"));
        // f32 → f32 is a plain copy.
        let copy = source(BuiltinKind::Cast(DType::F32, DType::F32));
        assert!(copy.contains("dst[i] = x;"));
        // Fill stores the value's bits.
        let fill = source(BuiltinKind::Fill(DType::F64));
        assert!(fill.contains("dst[i] = (unsigned long long)scalar;"));
    }

    #[test]
    fn the_library_is_self_contained() {
        assert!(balanced(LIBRARY));
        for f in [
            "xpu_encode",
            "xpu_unpack_f64",
            "xpu_unpack_i64",
            "xpu_f64_from_i64",
            "xpu_i64_from_f64",
        ] {
            assert!(LIBRARY.contains(&format!(" {f}(")), "{f}");
        }
    }
}

/// A header that lets the kernels compile as host C++ (for checking the generated
/// source where there is no NVRTC): CUDA's qualifiers and intrinsics as plain C++.
#[cfg(test)]
pub(crate) const HOST_SHIM: &str = r#"
#include <cstring>
#include <cmath>
#define __global__
#define __device__
#define __shared__ static
static void __syncthreads() {}
static void __threadfence_system() {}
static float atomicAdd(float* p, float v) { float o = *p; *p = o + v; return o; }
static double atomicAdd(double* p, double v) { double o = *p; *p = o + v; return o; }
struct XpuDim { unsigned int x, y, z; };
static XpuDim gridDim = {1, 1, 1}, blockDim = {1, 1, 1}, blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
static int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned int)x); }
static float __uint_as_float(unsigned int x) { float f; std::memcpy(&f, &x, 4); return f; }
static unsigned int __float_as_uint(float f) { unsigned int x; std::memcpy(&x, &f, 4); return x; }
static double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
static long long __double_as_longlong(double d) { long long x; std::memcpy(&x, &d, 8); return x; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fmul_rn(float a, float b) { return a * b; }
static double __dadd_rn(double a, double b) { return a + b; }
static double __dmul_rn(double a, double b) { return a * b; }
"#;

#[cfg(test)]
mod host_compile {
    use super::*;

    /// Every kernel, with the library once, compiled as host C++ with warnings as
    /// errors: catches syntax and type errors NVRTC would report. Skipped (with a
    /// message) without a C++ compiler.
    #[test]
    fn every_kernel_compiles_as_host_cpp() {
        let mut text = String::from(HOST_SHIM);
        text.push_str(LIBRARY);
        for kind in BuiltinKind::all() {
            let src = source(kind);
            let kernel = src.strip_prefix(LIBRARY).unwrap_or(&src);
            text.push_str(kernel);
        }
        let dir = std::env::temp_dir().join(format!("xpu-cuda-cpp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let file = dir.join("kernels.cpp");
        if std::fs::write(&file, &text).is_err() {
            eprintln!("skipped: cannot write {}", file.display());
            return;
        }
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
        let out = std::process::Command::new(&cxx)
            .args([
                "-fsyntax-only",
                "-std=c++14",
                "-Wall",
                "-Werror",
                "-Wno-unused-function",
            ])
            .arg(&file)
            .output();
        std::fs::remove_dir_all(&dir).ok();
        match out {
            Ok(o) => assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("skipped: no C++ compiler `{cxx}`: {e}"),
        }
    }
}
