use xpu_hal::{BinaryOp, DType};

use super::super::abi::{ShaderFeatures, ShaderKind, ENTRY_POINT};
use super::source;

/// Every kind for every dtype `features` support, and every cast pair of them.
fn all_kinds(features: ShaderFeatures) -> Vec<ShaderKind> {
    let dtypes = features.dtypes();
    let mut kinds = Vec::new();
    for &d in &dtypes {
        kinds.push(ShaderKind::Fill(d));
        kinds.push(ShaderKind::Scale(d));
        for op in BinaryOp::ALL {
            kinds.push(ShaderKind::Binary(op, d));
            kinds.push(ShaderKind::Accumulate(op, d));
        }
        for &to in &dtypes {
            kinds.push(ShaderKind::Cast(d, to));
        }
    }
    kinds
}

/// The validation capabilities a device with `features` gives: only those.
fn capabilities(features: ShaderFeatures) -> naga::valid::Capabilities {
    use naga::valid::Capabilities;
    let mut caps = Capabilities::IMMEDIATES;
    if features.float64 {
        caps |= Capabilities::FLOAT64;
    }
    if features.int64 {
        caps |= Capabilities::SHADER_INT64;
    }
    caps
}

/// Parses, validates and writes SPIR-V for `kind`, as the dispatcher does.
fn compile(kind: ShaderKind, features: ShaderFeatures) -> Result<Vec<u32>, String> {
    let text = source(kind, features)?;
    let module = naga::front::wgsl::parse_str(&text)
        .map_err(|e| format!("{kind:?}: parse: {}\n{text}", e.emit_to_string(&text)))?;
    let info =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), capabilities(features))
            .validate(&module)
            .map_err(|e| format!("{kind:?}: validate: {}\n{text}", e.emit_to_string(&text)))?;
    if !module.entry_points.iter().any(|e| e.name == ENTRY_POINT) {
        return Err(format!("{kind:?}: no entry point `{ENTRY_POINT}`"));
    }
    let options = naga::back::spv::Options {
        lang_version: (1, 3),
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: ENTRY_POINT.to_string(),
    };
    naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| format!("{kind:?}: spir-v: {e}"))
}

fn compile_all(features: ShaderFeatures) {
    let failures: Vec<String> = all_kinds(features)
        .into_iter()
        .filter_map(|kind| compile(kind, features).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} shaders failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn every_shader_compiles_with_all_features() {
    let features = ShaderFeatures {
        float64: true,
        int64: true,
    };
    assert_eq!(all_kinds(features).len(), 7 * (2 + 8 + 7));
    compile_all(features);
}

#[test]
fn every_shader_compiles_with_each_feature_set() {
    // Only the capabilities the features give: f64 without i64 takes the arithmetic
    // path to f64 bits, and nothing may need a capability the device lacks.
    for (float64, int64) in [(false, false), (true, false), (false, true)] {
        compile_all(ShaderFeatures { float64, int64 });
    }
}

#[test]
fn unsupported_dtypes_are_refused() {
    let none = ShaderFeatures::default();
    for kind in [
        ShaderKind::Fill(DType::F64),
        ShaderKind::Binary(BinaryOp::Sum, DType::I64),
        ShaderKind::Accumulate(BinaryOp::Max, DType::F64),
        ShaderKind::Scale(DType::I64),
        ShaderKind::Cast(DType::F32, DType::F64),
        ShaderKind::Cast(DType::I64, DType::U8),
    ] {
        let err = source(kind, none).unwrap_err();
        assert!(err.contains("not supported"), "{err}");
    }
    let only_f64 = ShaderFeatures {
        float64: true,
        int64: false,
    };
    assert!(source(ShaderKind::Cast(DType::F64, DType::I64), only_f64)
        .unwrap_err()
        .contains("shaderInt64"));
    assert!(source(ShaderKind::Cast(DType::F64, DType::I32), only_f64).is_ok());
}

#[test]
fn shaders_follow_the_abi() {
    let features = ShaderFeatures {
        float64: true,
        int64: true,
    };
    let text = source(ShaderKind::Binary(BinaryOp::Sum, DType::F16), features).unwrap();
    assert!(text.contains("var<immediate> params: Params;"));
    assert!(
        text.contains("@group(0) @binding(0) var<storage, read_write> dst: array<atomic<u32>>;")
    );
    assert!(text.contains("@group(0) @binding(1) var<storage, read> a: array<u32>;"));
    assert!(text.contains("@group(0) @binding(2) var<storage, read> b: array<u32>;"));
    assert!(text.contains("@workgroup_size(64)"));
    assert!(!text.contains("enable f16"));

    let text = source(ShaderKind::Cast(DType::F64, DType::I32), features).unwrap();
    assert!(text.contains("var<storage, read_write> dst: array<i32>;"));
    assert!(text.contains("var<storage, read> a: array<f64>;"));
    assert!(!text.contains("@binding(2)"));

    let text = source(ShaderKind::Fill(DType::U8), features).unwrap();
    assert!(!text.contains("@binding(1)"));
}
