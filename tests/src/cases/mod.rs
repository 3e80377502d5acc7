//! The built-in cases, one module per area of the contract.
//!
//! | module   | checks |
//! |----------|--------|
//! | `device` | properties, memory info, stream creation |
//! | `memory` | allocation sizes, zero size, double free, use after free, out of memory, accounting, freeing in flight, growable allocations (grow, shrink, refused sizes, accounting) |
//! | `copy`   | host↔device and device↔device copies at odd offsets and sizes; refused copies |
//! | `fill`   | fill for every dtype; unsupported dtypes |
//! | `ops`    | binary, accumulate and scale against the host reference; wrapping, NaN, rounding; refused operands |
//! | `cast`   | every dtype pair; truncation, saturation, wrapping and rounding rules |
//! | `stream` | ordering of builtin operations, kernels and copies without synchronize, many operations, several threads, foreign memory |
//! | `batch`  | batches submitted as one, refused operations left out; kept batches bound to other memory; refused bindings |
//! | `kernel` | launches with buffer and scalar arguments (host function or WGSL), argument alignment, refused launches, unsupported formats, failing and panicking kernels |
//! | `event`  | cross-stream and cross-device waits, queries, timeouts, timing, errors |
//! | `pool`   | the caching allocator on the device: reuse with data intact, cross-stream fences, empty_cache, expandable growth |
//! | `training` | (profile `training`) every standard operation the device lists against the reference on every dtype it claims: odd, large, strided and offset shapes, specials; refusals and stream errors for bad indices |
//! | `abi` | (profile `abi`) a plugin's C table called directly: argument structs of other sizes, NULL arguments, enumeration, out of memory, error objects, undefined values, the entry point |
//! | `collectives` | (profile `collectives`) communicators over the device alone, with a device of its backend, and with one of every other backend: every operation, algorithm, dtype and reduction, in place and out of place; timeouts, desyncs and abort |

use crate::case::{Case, Profile};

mod abi;
mod batch;
mod cast;
mod collectives;
mod copy;
mod device;
mod event;
mod fill;
mod kernel;
mod memory;
mod ops;
mod pool;
mod stream;
pub(crate) mod training;
pub(crate) mod util;

const MODULES: &[&[Case]] = &[
    device::CASES,
    memory::CASES,
    copy::CASES,
    fill::CASES,
    ops::CASES,
    cast::CASES,
    stream::CASES,
    batch::CASES,
    kernel::CASES,
    event::CASES,
    pool::CASES,
    collectives::CASES,
    training::CASES,
    abi::CASES,
];

/// Every built-in case of every profile, in a stable order.
pub fn all_cases() -> Vec<Case> {
    MODULES.iter().flat_map(|m| m.iter().copied()).collect()
}

/// The built-in cases of `profile`, in a stable order.
pub fn cases(profile: Profile) -> Vec<Case> {
    all_cases()
        .into_iter()
        .filter(|c| c.profile == profile)
        .collect()
}

/// The built-in case named `name`.
pub fn find_case(name: &str) -> Option<Case> {
    all_cases().into_iter().find(|c| c.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_dotted_and_described() {
        let all = all_cases();
        let mut seen = std::collections::HashSet::new();
        for c in &all {
            assert!(seen.insert(c.name), "duplicate case name {}", c.name);
            assert!(c.name.contains('.'), "{} is not dotted", c.name);
            assert!(
                c.name.chars().all(|ch| ch.is_ascii_lowercase()
                    || ch.is_ascii_digit()
                    || ch == '.'
                    || ch == '_'),
                "{} is not lowercase",
                c.name
            );
            assert!(!c.description.is_empty(), "{} has no description", c.name);
        }
        assert!(
            cases(Profile::Core).len() >= 45,
            "{} core cases",
            cases(Profile::Core).len()
        );
    }
}
