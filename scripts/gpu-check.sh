#!/usr/bin/env bash
# The CUDA check, for a machine with an NVIDIA GPU and driver (CUDA 12.6 or newer;
# NVRTC from the CUDA toolkit for the builtin operations). Builds release, runs the
# conformance suite on every CUDA device with JSON and JUnit reports, prints the
# topology, runs the collectives benchmark on the GPUs (or a GPU beside a host device),
# runs the CUDA benchmarks, and writes a summary. Everything lands in OUT (default
# target/gpu-check/). Exits non-zero when CUDA is unavailable or conformance fails.
#
#   scripts/gpu-check.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/gpu-check}"
mkdir -p "$out"
summary="$out/summary.txt"
status=0

{
  echo "xpu CUDA check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
  else
    echo "nvidia-smi: not found"
  fi
} >"$summary"

echo "== build (release)"
if ! cargo build --release --locked -p xpu 2>&1 | tee "$out/build.log"; then
  echo "build: FAILED (see build.log)" >>"$summary"
  exit 1
fi

echo "== devices"
XPU_REQUIRE=cuda target/release/xpu devices >"$out/devices.txt" 2>&1
cat "$out/devices.txt"
if ! grep -q "cuda:" "$out/devices.txt"; then
  echo "devices: no cuda device listed (see devices.txt)" >>"$summary"
  status=1
fi

echo "== CUDA backend tests"
if XPU_REQUIRE=cuda cargo test --release --locked -p xpu-cuda >"$out/cuda-tests.log" 2>&1; then
  echo "xpu-cuda tests: passed" >>"$summary"
else
  echo "xpu-cuda tests: FAILED (see cuda-tests.log)" >>"$summary"
  status=1
fi

echo "== conformance on cuda:*"
if XPU_REQUIRE=cuda target/release/xpu conformance --devices 'cuda:*' \
  --json "$out/conformance.json" --junit "$out/conformance.xml" \
  >"$out/conformance.log" 2>&1; then
  echo "conformance: passed" >>"$summary"
else
  echo "conformance: FAILED (see conformance.log, conformance.json)" >>"$summary"
  status=1
fi
tail -n 20 "$out/conformance.log" >>"$summary"

echo "== topology and collectives (every CUDA device, then CUDA beside host:0)"
target/release/xpu topo --devices 'cuda:*;host:0' >"$out/topo.txt" 2>&1 || status=1
cat "$out/topo.txt" >>"$summary"
gpus=$(grep -c "^cuda:" "$out/topo.txt" || true)
if [[ "$gpus" -ge 2 ]]; then
  sel='cuda:*'
else
  sel='cuda:0;host:0'
fi
if target/release/xpu bench collectives --devices "$sel" -b 8 -e 256M -f 8 -n 10 -w 3 \
  >"$out/collectives.txt" 2>&1; then
  echo "collectives ($sel): 0 wrong elements" >>"$summary"
else
  echo "collectives ($sel): FAILED (see collectives.txt)" >>"$summary"
  status=1
fi
cat "$out/collectives.txt" >>"$summary"

echo "== benchmarks (cuda groups)"
if cargo bench --locked -p xpu-benches -- cuda >"$out/bench.log" 2>&1; then
  echo "benchmarks: done (bench.log; criterion reports in target/criterion/)" >>"$summary"
  grep -E "^cuda_|time:|thrpt:|skipped" "$out/bench.log" >>"$summary" || true
else
  echo "benchmarks: FAILED (see bench.log)" >>"$summary"
  status=1
fi

echo
cat "$summary"
exit "$status"
