#!/usr/bin/env bash
# Installs the Debian packages the tests need where missing (scripts/deps.sh --test),
# then runs every test: the workspace's unit and integration tests, then the core,
# collectives and training conformance profiles through the `xpu` command over every device — host,
# Vulkan, and the two example plugins built here as a vendor would build them — with
# JSON and JUnit reports in target/conformance/.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Debian packages the build and the Vulkan tests need, where missing.
scripts/deps.sh --test
# Every part runs even when an earlier one failed, so one run shows every failure; the
# script fails if any did.
status=0
cargo test --workspace --locked --no-fail-fast || status=$?

plugins=target/plugins
mkdir -p "$plugins" target/conformance
cargo build --locked --quiet -p xpu-sim-npu
cp target/debug/libxpu_sim_npu.so "$plugins/"
"${CC:-cc}" -std=c11 -O2 -shared -fPIC -fvisibility=hidden -pthread \
  -Ibackends/plugin/include backends/plugin/examples/c-minimal/minimal.c \
  -o "$plugins/libxpu_minimal.so"
# The loader refuses plugins that other users could replace.
chmod go-w "$plugins" "$plugins"/*.so

# The core profile, then the collectives profile (communicators over each device alone,
# with devices of its backend, and with one device of every other backend), both with
# the backends of XPU_REQUIRE required.
cargo run --locked --quiet -p xpu -- conformance --plugin "$plugins" --devices '*' \
  --json target/conformance/report.json --junit target/conformance/report.xml || status=$?
cargo run --locked --quiet -p xpu -- conformance --profile collectives --plugin "$plugins" \
  --devices '*' --json target/conformance/collectives.json \
  --junit target/conformance/collectives.xml || status=$?
# The training profile: every standard operation each device lists, against the
# reference (an operation a device does not list is a skip naming it).
cargo run --locked --quiet -p xpu -- conformance --profile training --plugin "$plugins" \
  --devices '*' --json target/conformance/training.json \
  --junit target/conformance/training.xml || status=$?
# The abi profile: each plugin's C table called directly (other devices skip it), with
# both example plugins required.
XPU_REQUIRE=plugin.simnpu,plugin.minimal cargo run --locked --quiet -p xpu -- conformance \
  --profile abi --plugin "$plugins" --devices 'plugin.simnpu:*;plugin.minimal:*' \
  --json target/conformance/abi.json --junit target/conformance/abi.xml || status=$?
# Again on one host device with three operation threads, so that the host's split of
# matmul and of the other operations over its threads is held to the same reference.
XPU_REQUIRE=host XPU_HOST_THREADS=3 cargo run --locked --quiet -p xpu -- conformance --profile training \
  --devices host:0 --junit target/conformance/training-threads.xml || status=$?
exit "$status"
