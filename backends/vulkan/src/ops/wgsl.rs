//! The WGSL every standard-operation shader starts with: one binding per tensor, the
//! parameter buffer, and accessors that hide how each dtype is stored.
//!
//! # Bindings
//! Tensor `k` (in [`xpu_hal::ops::Op::operands`] order) is binding `k`, named `tk`; the
//! parameter buffer is the binding after the last tensor. Each tensor's binding starts
//! at its byte offset rounded down to 256 bytes; its element 0 is `base(k)` elements
//! into the binding.
//!
//! # Parameter buffer
//! ```wgsl
//! struct Params {
//!     err_pos: atomic<u32>, // first out-of-range position (0xFFFFFFFF: none)
//!     err_val: atomic<u32>, // the value found there
//!     pad0: u32, pad1: u32,
//!     w: array<u32>,        // tensor k at w[10k..10k+10]: base, rank, 4 dims,
//!                           // 4 strides (elements); then the scalars, 2 words each
//! }
//! ```
//!
//! # Accessors
//! - `Float` tensors: `ldk(o) -> C` and `stk(o, v: C)` where `C` is the computation
//!   type (`f32`, or `f64` for `f64` operations) and `o` the element offset from element
//!   0. `f16`/`bf16` live packed in `u32` words (atomics where written, so that writing
//!   one half never disturbs the other).
//! - `Int` tensors (`i32` indices and labels): `ldk(o) -> i32`.
//! - `Raw` tensors (bit-exact copies of any dtype): `rdk(o) -> vec2<u32>` (low and high
//!   words of the element's bits) and `wrk(o, v: vec2<u32>)`.

use std::fmt::Write;

use xpu_hal::DType;

use crate::builtins::wgsl::library::{helpers, Needs};

/// How a shader sees one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repr {
    /// Values in the computation type.
    Float,
    /// `i32` values.
    Int,
    /// Raw element bits.
    Raw,
}

/// One tensor binding of a shader.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    /// The tensor's dtype.
    pub dtype: DType,
    /// Whether the shader writes it.
    pub write: bool,
    /// How the shader accesses it.
    pub repr: Repr,
}

/// Words of the parameter buffer per tensor.
pub(crate) const TENSOR_WORDS: usize = 10;

/// The computation type of an operation on `dtype`.
pub(crate) fn compute_type(dtype: DType) -> &'static str {
    if dtype == DType::F64 {
        "f64"
    } else {
        "f32"
    }
}

const PARAMS: &str = r#"
struct Params {
    err_pos: atomic<u32>,
    err_val: atomic<u32>,
    pad0: u32,
    pad1: u32,
    w: array<u32>,
}

fn base(t: u32) -> u32 { return P.w[t * 10u]; }
fn rank(t: u32) -> u32 { return P.w[t * 10u + 1u]; }
fn dim(t: u32, k: u32) -> u32 { return P.w[t * 10u + 2u + k]; }
fn stride(t: u32, k: u32) -> u32 { return P.w[t * 10u + 6u + k]; }

// The offset of the n-th element (row-major over the dims of tensor d) with the
// strides of tensor s.
fn off_as(d: u32, s: u32, n: u32) -> u32 {
    var r = 0u;
    var m = n;
    var k = rank(d);
    loop {
        if k == 0u { break; }
        k = k - 1u;
        let e = dim(d, k);
        r = r + (m % e) * stride(s, k);
        m = m / e;
    }
    return r;
}

// The offset of the n-th element of tensor t (row-major).
fn off(t: u32, n: u32) -> u32 { return off_as(t, t, n); }

// The offset of element [r, j] of a 2-D tensor, or [r] of a 1-D one.
fn off2(t: u32, r: u32, j: u32) -> u32 {
    if rank(t) == 1u { return r * stride(t, 0u); }
    return r * stride(t, 0u) + j * stride(t, 1u);
}

fn failed() -> bool { return atomicLoad(&P.err_pos) != 0xFFFFFFFFu; }

fn fail_at(pos: u32) { atomicMin(&P.err_pos, pos); }

fn is_nan32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7FFFFFFFu) > 0x7F800000u; }
"#;

/// The prelude of a shader over `slots`, computing in the type of `dtype`, with
/// `scalars` scalar parameters.
pub(crate) fn prelude(slots: &[Slot], dtype: DType, int64: bool) -> String {
    let c = compute_type(dtype);
    let f64_needed = dtype == DType::F64 || slots.iter().any(|s| s.dtype == DType::F64);
    let mut s = helpers(Needs {
        f64: f64_needed,
        i64: false,
        int64,
    });
    s.push_str(PARAMS);
    let _ = writeln!(
        s,
        "@group(0) @binding({}) var<storage, read_write> P: Params;",
        slots.len()
    );
    let scalars = slots.len() * TENSOR_WORDS;
    let _ = writeln!(
        s,
        "fn sc(i: u32) -> u32 {{ return P.w[{scalars}u + 2u * i]; }}"
    );
    let _ = writeln!(
        s,
        "fn sc_hi(i: u32) -> u32 {{ return P.w[{scalars}u + 2u * i + 1u]; }}"
    );
    if dtype == DType::F64 {
        let _ = writeln!(
            s,
            "fn scc(i: u32) -> f64 {{ return f64_from_bits(sc(i), sc_hi(i)); }}"
        );
    } else {
        let _ = writeln!(s, "fn scc(i: u32) -> f32 {{ return bitcast<f32>(sc(i)); }}");
    }
    let _ = writeln!(s, "fn scf(i: u32) -> f32 {{ return bitcast<f32>(sc(i)); }}");
    for (k, slot) in slots.iter().enumerate() {
        s.push_str(&accessors(k, *slot, c));
    }
    s
}

fn decl(k: usize, write: bool, ty: &str) -> String {
    let access = if write { "read_write" } else { "read" };
    format!("@group(0) @binding({k}) var<storage, {access}> t{k}: array<{ty}>;\n")
}

/// Reads word `w` (a WGSL expression) of binding `k`.
fn word(k: usize, atomic: bool, w: &str) -> String {
    if atomic {
        format!("atomicLoad(&t{k}[{w}])")
    } else {
        format!("t{k}[{w}]")
    }
}

fn accessors(k: usize, slot: Slot, c: &str) -> String {
    let size = slot.dtype.size();
    let packed = size < 4;
    let atomic = packed && slot.write;
    let mut s = if atomic {
        decl(k, true, "atomic<u32>")
    } else {
        match (slot.repr, slot.dtype) {
            (Repr::Float, DType::F32) => decl(k, slot.write, "f32"),
            (Repr::Float, DType::F64) => decl(k, slot.write, "f64"),
            (Repr::Int, _) => decl(k, slot.write, "i32"),
            _ => decl(k, slot.write, "u32"),
        }
    };
    // Packed element bits: lane of element e (in bytes or halves).
    let lane_bits = size * 8;
    let lanes = 4 / size.max(1);
    let mask = if packed { (1u32 << lane_bits) - 1 } else { 0 };
    let packed_read = |k: usize| {
        format!(
            "let e = base({k}u) + o; let sh = (e % {lanes}u) * {lane_bits}u; \
             let h = ({}) >> sh & {mask}u;",
            word(k, atomic, &format!("e / {lanes}u"))
        )
    };
    let packed_write = |k: usize| {
        format!(
            "let e = base({k}u) + o; let sh = (e % {lanes}u) * {lane_bits}u; \
             atomicAnd(&t{k}[e / {lanes}u], ~({mask}u << sh)); \
             atomicOr(&t{k}[e / {lanes}u], (bits & {mask}u) << sh);"
        )
    };
    match slot.repr {
        Repr::Float => match slot.dtype {
            DType::F32 | DType::F64 => {
                let ty = compute_type(slot.dtype);
                let _ = writeln!(
                    s,
                    "fn ld{k}(o: u32) -> {c} {{ return {c}(t{k}[base({k}u) + o]); }}"
                );
                if slot.write {
                    let _ = writeln!(
                        s,
                        "fn st{k}(o: u32, v: {c}) {{ t{k}[base({k}u) + o] = {ty}(v); }}"
                    );
                }
            }
            DType::F16 | DType::BF16 => {
                let name = if slot.dtype == DType::F16 {
                    "f16"
                } else {
                    "bf16"
                };
                let _ = writeln!(
                    s,
                    "fn ld{k}(o: u32) -> {c} {{ {} return {c}(f32_from_{name}(h)); }}",
                    packed_read(k)
                );
                if slot.write {
                    let _ = writeln!(
                        s,
                        "fn st{k}(o: u32, v: {c}) {{ let bits = {name}_from_f32(f32(v)); {} }}",
                        packed_write(k)
                    );
                }
            }
            _ => {}
        },
        Repr::Int => {
            let _ = writeln!(
                s,
                "fn ld{k}(o: u32) -> i32 {{ return t{k}[base({k}u) + o]; }}"
            );
        }
        Repr::Raw => {
            if packed {
                let _ = writeln!(
                    s,
                    "fn rd{k}(o: u32) -> vec2<u32> {{ {} return vec2<u32>(h, 0u); }}",
                    packed_read(k)
                );
                if slot.write {
                    let _ = writeln!(
                        s,
                        "fn wr{k}(o: u32, v: vec2<u32>) {{ let bits = v.x; {} }}",
                        packed_write(k)
                    );
                }
            } else if size == 4 {
                let _ = writeln!(
                    s,
                    "fn rd{k}(o: u32) -> vec2<u32> {{ return vec2<u32>(t{k}[base({k}u) + o], 0u); }}"
                );
                if slot.write {
                    let _ = writeln!(
                        s,
                        "fn wr{k}(o: u32, v: vec2<u32>) {{ t{k}[base({k}u) + o] = v.x; }}"
                    );
                }
            } else {
                let _ = writeln!(
                    s,
                    "fn rd{k}(o: u32) -> vec2<u32> {{ let e = 2u * (base({k}u) + o); \
                     return vec2<u32>(t{k}[e], t{k}[e + 1u]); }}"
                );
                if slot.write {
                    let _ = writeln!(
                        s,
                        "fn wr{k}(o: u32, v: vec2<u32>) {{ let e = 2u * (base({k}u) + o); \
                         t{k}[e] = v.x; t{k}[e + 1u] = v.y; }}"
                    );
                }
            }
        }
    }
    s
}
