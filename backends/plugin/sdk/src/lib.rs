//! # xpu-plugin-sdk: write an xpu vendor plugin in Rust
//!
//! - [`abi`] is the Rust mirror of the C header `xpu_plugin.h` (in the `xpu-plugin`
//!   crate's `include/` folder), proven identical by a layout test.

pub mod abi;
