#!/usr/bin/env bash
# Runs every test: the workspace's unit and integration tests, then the conformance
# suite over the host devices through the `xpu` command, with a JUnit report.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
mkdir -p target/conformance
cargo run --locked --quiet -p xpu -- conformance --devices 'host:*' \
  --json target/conformance/host.json --junit target/conformance/host.xml
