//! A malformed `XPU_SIMNPU_*` variable: every device call reports it, naming the
//! variable, instead of the plugin guessing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use xpu_plugin_sdk::ErrorCode;

#[test]
fn a_malformed_variable_is_reported_by_device_calls() {
    std::env::set_var("XPU_SIMNPU_BANDWIDTH_GBPS", "fast");
    for _ in 0..2 {
        let e = device_count().unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        assert!(
            e.message().contains("XPU_SIMNPU_BANDWIDTH_GBPS is `fast`"),
            "{e}"
        );
        let e = open(0).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
    }
    // The table itself is still there: the host can report the error with the name.
    assert_eq!(cstr(api().name), "simnpu");
}
