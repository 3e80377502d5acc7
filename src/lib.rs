//! xpu
