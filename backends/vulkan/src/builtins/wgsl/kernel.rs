//! The shape of every builtin shader: push constants, bindings, source loaders, the
//! per-element function and the grid-stride entry point.
//!
//! Each shader has one function `element(i)` that computes destination element `i` in
//! storage form (see [`super::element`]). The entry point only decides which elements
//! an invocation owns and writes them:
//! - **native destination**: one unit per element, a plain store;
//! - **packed destination**: one unit per destination word; the lanes of the word that
//!   lie inside the destination's byte range are computed (an accumulation first reads
//!   the word with `atomicLoad`) and written with one `atomicStore` when the whole word
//!   is covered, else with `atomicAnd` (clear the covered lanes) then `atomicOr` (set
//!   them), so that bytes outside the range are never written.

use xpu_hal::{BinaryOp, DType};

use super::super::abi::{ShaderKind, ENTRY_POINT, WORKGROUP_SIZE};
use super::element::{self, Lane};
use super::library::{self, Needs};

/// The push constants, exactly as [`super::super::abi::PushConstants`] lays them out.
const PARAMS: &str = r#"
struct Params {
    dst_offset: u32,
    a_offset: u32,
    b_offset: u32,
    count: u32,
    scalar_lo: u32,
    scalar_hi: u32,
    _pad0: u32,
    _pad1: u32,
}

var<immediate> params: Params;
"#;

/// The dtype written by `kind`.
fn dst_dtype(kind: ShaderKind) -> DType {
    match kind {
        ShaderKind::Fill(d)
        | ShaderKind::Binary(_, d)
        | ShaderKind::Accumulate(_, d)
        | ShaderKind::Scale(d)
        | ShaderKind::Cast(_, d) => d,
    }
}

/// The sources of `kind`: binding name, offset field, dtype.
fn sources(kind: ShaderKind) -> Vec<(&'static str, &'static str, DType)> {
    let a = |d| ("a", "a_offset", d);
    match kind {
        ShaderKind::Fill(_) => Vec::new(),
        ShaderKind::Binary(_, d) => vec![a(d), ("b", "b_offset", d)],
        ShaderKind::Accumulate(_, d) | ShaderKind::Scale(d) | ShaderKind::Cast(d, _) => {
            vec![a(d)]
        }
    }
}

/// Every dtype `kind` touches.
pub(super) fn dtypes(kind: ShaderKind) -> Vec<DType> {
    let mut all: Vec<DType> = sources(kind).into_iter().map(|(_, _, d)| d).collect();
    all.push(dst_dtype(kind));
    all
}

/// A short description of `kind` for the shader's first line.
fn describe(kind: ShaderKind) -> String {
    match kind {
        ShaderKind::Fill(d) => format!("fill {d}"),
        ShaderKind::Binary(op, d) => format!("binary {op} {d}"),
        ShaderKind::Accumulate(op, d) => format!("accumulate {op} {d}"),
        ShaderKind::Scale(d) => format!("scale {d}"),
        ShaderKind::Cast(s, d) => format!("cast {s} to {d}"),
    }
}

/// Whether `kind` fills 8-byte elements; it stores their bits as `vec2<u32>` (the same
/// layout and element offsets as `f64`/`i64`, and no 64-bit shader types needed).
fn fills_wide(kind: ShaderKind) -> bool {
    matches!(kind, ShaderKind::Fill(d) if d.size() == 8)
}

/// The complete WGSL text of `kind`. `int64`: the device has `shaderInt64`.
pub(super) fn shader(kind: ShaderKind, int64: bool) -> String {
    let dst = dst_dtype(kind);
    let touched = dtypes(kind);
    let needs = Needs {
        f64: !matches!(kind, ShaderKind::Fill(_)) && touched.contains(&DType::F64),
        i64: !matches!(kind, ShaderKind::Fill(_)) && touched.contains(&DType::I64),
        int64,
    };

    let mut text = format!("// xpu builtin: {}\n", describe(kind));
    text.push_str(PARAMS);
    text.push('\n');
    text.push_str(&bindings(kind));
    text.push_str(&library::helpers(needs));
    for (binding, offset, dtype) in sources(kind) {
        text.push_str(&loader(binding, offset, dtype));
    }
    text.push_str(&element_fn(kind));
    match element::lane(dst) {
        Some(lane) => text.push_str(&packed_main(
            lane,
            matches!(kind, ShaderKind::Accumulate(..)),
        )),
        None => text.push_str(&native_main()),
    }
    text
}

/// The storage buffer declarations `kind` uses (and only those).
fn bindings(kind: ShaderKind) -> String {
    let dst = dst_dtype(kind);
    let dst_type = if fills_wide(kind) {
        "vec2<u32>"
    } else if element::lane(dst).is_some() {
        "atomic<u32>"
    } else {
        element::storage_type(dst)
    };
    let mut text =
        format!("@group(0) @binding(0) var<storage, read_write> dst: array<{dst_type}>;\n");
    for (index, (binding, _, dtype)) in sources(kind).into_iter().enumerate() {
        text.push_str(&format!(
            "@group(0) @binding({}) var<storage, read> {binding}: array<{}>;\n",
            index + 1,
            element::storage_type(dtype)
        ));
    }
    text
}

/// `fn load_<binding>(i: u32)`: source element `i` as a work value. A packed element is
/// read from the word holding its byte offset (any element-aligned offset).
fn loader(binding: &str, offset: &str, dtype: DType) -> String {
    let work = element::work_type(dtype);
    let body = match element::lane(dtype) {
        None => format!("    return {binding}[params.{offset} + i];\n"),
        Some(lane) => {
            let raw = format!(
                "(({binding}[at >> 2u] >> ((at & 3u) << 3u)) & {})",
                lane.mask
            );
            format!(
                "    let at = params.{offset} + (i << {}u);\n    return {};\n",
                lane.size_log2,
                element::decode(dtype, &raw)
            )
        }
    };
    format!("\nfn load_{binding}(i: u32) -> {work} {{\n{body}}}\n")
}

/// `fn element(i)` (native destination) or `fn element(i, old)` (packed destination,
/// `old`: the lane's current bits): destination element `i` in storage form.
fn element_fn(kind: ShaderKind) -> String {
    let dst = dst_dtype(kind);
    let packed = element::lane(dst);
    // Operands are bound first: `combine` may use each more than once.
    let (operands, value) = match kind {
        ShaderKind::Fill(d) => {
            let value = match packed {
                Some(lane) => format!("params.scalar_lo & {}", lane.mask),
                None if d.size() == 8 => {
                    "vec2<u32>(params.scalar_lo, params.scalar_hi)".to_string()
                }
                None => format!("bitcast<{}>(params.scalar_lo)", element::storage_type(d)),
            };
            (String::new(), value)
        }
        ShaderKind::Binary(op, d) => (
            "    let lhs = load_a(i);\n    let rhs = load_b(i);\n".to_string(),
            element::encode(d, &element::combine(op, d, "lhs", "rhs")),
        ),
        ShaderKind::Accumulate(op, d) => {
            let old = match packed {
                Some(_) => element::decode(d, "old"),
                None => "dst[params.dst_offset + i]".to_string(),
            };
            (
                format!("    let lhs = {old};\n    let rhs = load_a(i);\n"),
                element::encode(d, &element::combine(op, d, "lhs", "rhs")),
            )
        }
        ShaderKind::Scale(d) => (
            format!("    let alpha = {};\n", element::scalar(d)),
            element::encode(
                d,
                &element::combine(BinaryOp::Prod, d, "load_a(i)", "alpha"),
            ),
        ),
        ShaderKind::Cast(s, d) => (String::new(), element::cast(s, d, "load_a(i)")),
    };
    let (params, result) = match packed {
        Some(_) => ("i: u32, old: u32", "u32"),
        None if fills_wide(kind) => ("i: u32", "vec2<u32>"),
        None => ("i: u32", element::storage_type(dst)),
    };
    format!("\nfn element({params}) -> {result} {{\n{operands}    return {value};\n}}\n")
}

/// The entry point of a shader with a native destination: one unit per element.
fn native_main() -> String {
    format!(
        r#"
@compute @workgroup_size({WORKGROUP_SIZE})
fn {ENTRY_POINT}(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {{
    let stride = groups.x * {WORKGROUP_SIZE}u;
    for (var i = id.x; i < params.count; i = i + stride) {{
        dst[params.dst_offset + i] = element(i);
    }}
}}
"#
    )
}

/// The entry point of a shader with a packed destination: one unit per destination
/// word; `accumulate`: the lanes' current values are operands.
fn packed_main(lane: Lane, accumulate: bool) -> String {
    let old = if accumulate {
        "        let old = atomicLoad(&dst[word]);\n"
    } else {
        "        let old = 0u;\n"
    };
    let mut lanes = String::new();
    for index in 0..4 / lane.size {
        let shift = index * lane.size * 8;
        let mask = lane.mask;
        lanes.push_str(&format!(
            r#"        let at{index} = (word << 2u) + {byte}u;
        if at{index} >= first && at{index} <= last {{
            bits = bits | (element((at{index} - first) >> {log2}u, (old >> {shift}u) & {mask}) << {shift}u);
            covered = covered | ({mask} << {shift}u);
        }}
"#,
            byte = index * lane.size,
            log2 = lane.size_log2,
        ));
    }
    format!(
        r#"
@compute @workgroup_size({WORKGROUP_SIZE})
fn {ENTRY_POINT}(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {{
    if params.count == 0u {{
        return;
    }}
    // Bytes [first, last] of binding 0, and the words that hold them.
    let first = params.dst_offset;
    let last = first + (params.count - 1u) * {size}u + {size_minus_one}u;
    let first_word = first >> 2u;
    let words = (last >> 2u) - first_word + 1u;
    let stride = groups.x * {WORKGROUP_SIZE}u;
    for (var unit = id.x; unit < words; unit = unit + stride) {{
        let word = first_word + unit;
{old}        var bits = 0u;
        var covered = 0u;
{lanes}        if covered == 0xFFFFFFFFu {{
            atomicStore(&dst[word], bits);
        }} else {{
            atomicAnd(&dst[word], ~covered);
            atomicOr(&dst[word], bits);
        }}
    }}
}}
"#,
        size = lane.size,
        size_minus_one = lane.size - 1,
    )
}
