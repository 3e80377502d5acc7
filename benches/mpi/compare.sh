#!/usr/bin/env bash
# All-reduce on 2 ranks: xpu (`xpu bench collectives`, host:0 and host:1) beside Open
# MPI's MPI_Allreduce (2 processes started by mpirun), both measured in this run, at
# every size from MIN to MAX bytes (default 8 B to 256 MiB, factor 2), float sum.
# Prints size, both times, both p50s and the ratio MPI time / xpu time (above 1: xpu is
# faster). Needs Debian's openmpi-bin and libopenmpi-dev.
#
#   benches/mpi/compare.sh [MIN] [MAX] [FACTOR] [ITERS] [WARMUP]
set -euo pipefail
cd "$(dirname "$0")/../.."
min="${1:-8}" max="${2:-268435456}" factor="${3:-2}" iters="${4:-20}" warmup="${5:-5}"
for tool in mpicc mpirun; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "compare.sh: $tool not found; install Debian's openmpi-bin and libopenmpi-dev" >&2
    exit 2
  }
done
out=target/mpi-compare
mkdir -p "$out"
mpicc -O2 -o "$out/allreduce" benches/mpi/allreduce.c
cargo build --release --locked --quiet --bin xpu

# As root, Open MPI wants to be told; more ranks than cores need oversubscription.
mpirun --allow-run-as-root --oversubscribe -np 2 "$out/allreduce" "$min" "$max" "$factor" \
  "$iters" "$warmup" >"$out/mpi.jsonl"
target/release/xpu bench collectives --devices host:0,1 -b "$min" -e "$max" -f "$factor" \
  -n "$iters" -w "$warmup" --json >"$out/xpu.jsonl"

python3 - "$out/mpi.jsonl" "$out/xpu.jsonl" <<'PY'
import json, sys
mpi = {r["size"]: r for r in map(json.loads, open(sys.argv[1]))}
xpu = {r["size"]: r for r in map(json.loads, open(sys.argv[2]))}
print(f"{'size':>11} {'xpu us':>10} {'mpi us':>10} {'xpu p50':>9} {'mpi p50':>9} {'mpi/xpu':>8} {'wrong':>6}")
slower = 0
for size in sorted(set(mpi) & set(xpu)):
    x, m = xpu[size], mpi[size]
    xt = x["out_of_place"]["time_us"]
    ratio = m["time_us"] / xt if xt > 0 else float("inf")
    slower += ratio < 1
    wrong = (x["out_of_place"]["wrong"] or 0) + m["wrong"]
    print(f"{size:>11} {xt:>10.2f} {m['time_us']:>10.2f} {x['out_of_place']['p50_us']:>9.2f} "
          f"{m['p50_us']:>9.2f} {ratio:>8.2f} {wrong:>6}")
print(f"sizes where xpu is slower than MPI_Allreduce: {slower}")
PY
