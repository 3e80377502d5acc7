//! Backends a run must cover (`XPU_REQUIRE`).
//!
//! A skip is honest when a *capability* is missing. It is not acceptable when a whole
//! backend silently has no devices on a machine that is supposed to have them — CI
//! installs lavapipe so that Vulkan runs, builds the plugins so that they load, and a
//! run that quietly covered neither would pass without testing anything. A required
//! backend with no device in the run therefore becomes a failing result named
//! `backend.required`, carrying the backend's unavailability reason.

use xpu_hal::{Availability, BackendStatus, Device};

use crate::expectations::glob_matches;
use crate::report::{CaseResult, Status};

/// The environment variable naming required backends: a comma list of backend names,
/// each possibly ending in `*` as a prefix wildcard.
pub const REQUIRE_ENV: &str = "XPU_REQUIRE";

/// The name of the result a missing required backend produces.
pub const REQUIRED_CASE: &str = "backend.required";

/// Parses a comma list of backend patterns; blanks are ignored.
pub fn parse_required(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// The required backends from `XPU_REQUIRE` (none when unset).
pub fn required_from_env() -> Vec<String> {
    std::env::var(REQUIRE_ENV)
        .map(|v| parse_required(&v))
        .unwrap_or_default()
}

/// One failing result for each pattern in `required` that no device of the run
/// matches. `backends` supplies the reason (the backend's unavailability, or that no
/// such backend is registered).
pub fn check_required(
    required: &[String],
    devices: &[Device],
    backends: &[BackendStatus],
) -> Vec<CaseResult> {
    let mut out = Vec::new();
    for pattern in required {
        if devices.iter().any(|d| glob_matches(pattern, d.backend())) {
            continue;
        }
        let known: Vec<&BackendStatus> = backends
            .iter()
            .filter(|b| glob_matches(pattern, &b.name))
            .collect();
        let why = if known.is_empty() {
            format!(
                "no registered backend matches `{pattern}` (registered: {})",
                backends
                    .iter()
                    .map(|b| b.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            known
                .iter()
                .map(|b| match &b.availability {
                    Availability::Unavailable(reason) => {
                        format!("`{}` is unavailable: {reason}", b.name)
                    }
                    Availability::Available(list) => format!(
                        "`{}` has {} device(s) but the device selector picked none of them",
                        b.name,
                        list.len()
                    ),
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        out.push(CaseResult {
            case: REQUIRED_CASE.to_string(),
            device: format!("{pattern}:*"),
            backend: pattern.clone(),
            status: Status::Fail,
            reason: Some(format!(
                "backend `{pattern}` is required ({REQUIRE_ENV}) but no device of it ran: {why}"
            )),
            duration_s: 0.0,
        });
    }
    out
}

/// The name of the result a backend's diagnostics produce.
pub const DIAGNOSTICS_CASE: &str = "backend.diagnostics";

/// One failing result per backend that reported diagnostics during the run (see
/// `xpu_hal::backend::Backend::diagnostics`), with the first messages as the reason.
pub fn diagnostics_results(diagnostics: &[(String, Vec<String>)]) -> Vec<CaseResult> {
    diagnostics
        .iter()
        .map(|(backend, messages)| CaseResult {
            case: DIAGNOSTICS_CASE.to_string(),
            device: format!("{backend}:*"),
            backend: backend.clone(),
            status: Status::Fail,
            reason: Some(format!(
                "backend `{backend}` reported problems during the run: {}",
                messages
                    .iter()
                    .take(10)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" | ")
            )),
            duration_s: 0.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse() {
        assert_eq!(parse_required(" host, plugin* ,,"), vec!["host", "plugin*"]);
        assert!(parse_required("").is_empty());
    }

    #[test]
    fn a_missing_backend_fails_with_its_reason() {
        let statuses = vec![
            BackendStatus {
                name: "host".into(),
                availability: Availability::Available(vec![]),
            },
            BackendStatus {
                name: "vulkan".into(),
                availability: Availability::Unavailable("libvulkan.so.1 not found".into()),
            },
        ];
        let results = check_required(&["vulkan".to_string()], &[], &statuses);
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].status, Status::Fail);
        let reason = results[0].reason.clone().unwrap_or_default();
        assert!(reason.contains("libvulkan.so.1 not found"), "{reason}");
        let results = check_required(&["cuda".to_string()], &[], &statuses);
        assert!(results[0]
            .reason
            .clone()
            .unwrap_or_default()
            .contains("no registered backend"));
    }
}
