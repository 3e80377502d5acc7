//! The `abi` profile: the contract beneath the HAL, checked by the backend that has
//! one (a plugin's C table) through [`xpu_hal::Device::abi_check`]. The checks call the
//! plugin directly, so the host's own validation cannot stand in for the plugin's;
//! `backends/plugin/src/abi_check.rs` documents each.

use crate::case::{Case, CaseContext, CaseError, CaseOutcome, Profile};

const fn abi(
    name: &'static str,
    description: &'static str,
    run: fn(&CaseContext) -> CaseOutcome,
) -> Case {
    Case {
        name,
        profile: Profile::Abi,
        description,
        run,
        exclusive: true,
    }
}

/// Runs the device's check `check`; skips on a device without a lower contract.
fn check(ctx: &CaseContext, check: &str) -> CaseOutcome {
    match ctx.device.abi_check(check) {
        None => Err(CaseError::skip(format!(
            "{} has no contract beneath the HAL (only plugin devices have a C ABI)",
            ctx.device.backend()
        ))),
        Some(Ok(())) => Ok(()),
        Some(Err(message)) => Err(CaseError::fail(message)),
    }
}

macro_rules! abi_cases {
    ($(($name:literal, $check:literal, $description:literal)),* $(,)?) => {
        pub(crate) const CASES: &[Case] = &[
            $(abi($name, $description, |ctx| check(ctx, $check)),)*
        ];
    };
}

abi_cases!(
    (
        "abi.struct_sizes",
        "struct_sizes",
        "argument structs larger than the plugin knows are accepted with the same answers and nothing written beyond its fields; structs below their MIN_SIZE are invalid-argument errors"
    ),
    (
        "abi.null_arguments",
        "null_arguments",
        "every function of the table refuses NULL arguments with XPU_ERROR_INVALID_ARGUMENT"
    ),
    (
        "abi.null_handles",
        "null_handles",
        "a NULL device, buffer, stream or event where a function needs one is XPU_ERROR_INVALID_ARGUMENT, also beside valid handles"
    ),
    (
        "abi.properties",
        "properties",
        "name, vendor and driver are non-empty, kind and dtypes are defined values, memory and the largest allocation are consistent, and a kernel format comes with kernel functions and a power-of-two alignment"
    ),
    (
        "abi.enumeration",
        "enumeration",
        "device_count is stable, and opening an index at or past it is XPU_ERROR_INVALID_ARGUMENT"
    ),
    (
        "abi.out_of_memory",
        "out_of_memory",
        "allocations that each fit but together do not end in XPU_ERROR_OUT_OF_MEMORY, and freeing them gives every byte back"
    ),
    (
        "abi.error_objects",
        "error_objects",
        "errors carry a defined code and a message, both stable until the error is destroyed"
    ),
    (
        "abi.unknown_values",
        "unknown_values",
        "builtin kinds and dtypes the ABI does not define are refused when enqueued; an unknown fault number is XPU_ERROR_UNSUPPORTED"
    ),
    (
        "abi.entry_point",
        "entry_point",
        "the entry point, called again, returns a table of the same name, version and ABI"
    ),
);
