//! WGSL → SPIR-V with naga.

use xpu_hal::{Error, Result};

/// Compiles WGSL text to SPIR-V words for the compute entry point `entry`.
pub(crate) fn wgsl_to_spirv(source: &str, entry: &str, what: &str) -> Result<Vec<u32>> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| {
        Error::invalid(format!(
            "{what}: the WGSL does not parse: {}",
            e.emit_to_string(source)
        ))
    })?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| {
        Error::invalid(format!(
            "{what}: the WGSL is not valid: {}",
            e.emit_to_string(source)
        ))
    })?;
    if !module
        .entry_points
        .iter()
        .any(|ep| ep.name == entry && ep.stage == naga::ShaderStage::Compute)
    {
        return Err(Error::invalid(format!(
            "{what}: the WGSL has no compute entry point named `{entry}`"
        )));
    }
    let options = naga::back::spv::Options {
        lang_version: (1, 3),
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.to_string(),
    };
    naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| Error::invalid(format!("{what}: SPIR-V generation failed: {e}")))
}
