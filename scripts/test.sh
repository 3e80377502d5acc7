#!/usr/bin/env bash
# Runs every test: the workspace's unit and integration tests, then the conformance
# suite over every device (host, and Vulkan where a driver is installed) through the
# `xpu` command, with JSON and JUnit reports in target/conformance/.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
mkdir -p target/conformance
cargo run --locked --quiet -p xpu -- conformance --devices '*' \
  --json target/conformance/report.json --junit target/conformance/report.xml
