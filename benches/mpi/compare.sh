#!/usr/bin/env bash
# All-reduce on 2 ranks: xpu (`xpu bench collectives`, host:0 and host:1) beside Open
# MPI's MPI_Allreduce (2 processes started by mpirun), both measured in this run, at
# every size from MIN to MAX bytes (default 8 B to 256 MiB, factor 2), float sum.
# The two alternate ROUNDS times (default 3) and each figure is the median of its rounds,
# since these machines are noisy: where the scheduler puts two busy threads changes a
# small message's time several-fold from one run to the next.
# Prints size, both times, both p50s and the ratio MPI time / xpu time (above 1: xpu is
# faster). Needs Debian's openmpi-bin and libopenmpi-dev.
#
#   benches/mpi/compare.sh [MIN] [MAX] [FACTOR] [ITERS] [WARMUP] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
min="${1:-8}" max="${2:-268435456}" factor="${3:-2}" iters="${4:-20}" warmup="${5:-5}"
rounds="${6:-3}"
for tool in mpicc mpirun; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "compare.sh: $tool not found; install Debian's openmpi-bin and libopenmpi-dev" >&2
    exit 2
  }
done
out=target/mpi-compare
mkdir -p "$out"
rm -f "$out"/mpi.*.jsonl "$out"/xpu.*.jsonl
mpicc -O2 -o "$out/allreduce" benches/mpi/allreduce.c
cargo build --release --locked --quiet --bin xpu

for round in $(seq 1 "$rounds"); do
  # As root, Open MPI wants to be told; more ranks than cores need oversubscription.
  mpirun --allow-run-as-root --oversubscribe -np 2 "$out/allreduce" "$min" "$max" "$factor" \
    "$iters" "$warmup" >"$out/mpi.$round.jsonl"
  target/release/xpu bench collectives --devices host:0,1 -b "$min" -e "$max" -f "$factor" \
    -n "$iters" -w "$warmup" --json >"$out/xpu.$round.jsonl"
done

python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    runs = [{r["size"]: r for r in map(json.loads, open(f"{out}/{name}.{k}.jsonl"))}
            for k in range(1, rounds + 1)]
    return runs
mpi, xpu = load("mpi"), load("xpu")
sizes = sorted(set.intersection(*(set(r) for r in mpi + xpu)))
med = statistics.median
print(f"# medians of {rounds} alternating rounds")
print(f"{'size':>11} {'xpu us':>10} {'mpi us':>10} {'xpu p50':>9} {'mpi p50':>9} {'mpi/xpu':>8} {'wrong':>6}")
slower = 0
for size in sizes:
    xt = med(r[size]["out_of_place"]["time_us"] for r in xpu)
    mt = med(r[size]["time_us"] for r in mpi)
    xp = med(r[size]["out_of_place"]["p50_us"] for r in xpu)
    mp = med(r[size]["p50_us"] for r in mpi)
    wrong = sum((r[size]["out_of_place"]["wrong"] or 0) for r in xpu) + sum(r[size]["wrong"] for r in mpi)
    ratio = mt / xt if xt > 0 else float("inf")
    slower += ratio < 1
    print(f"{size:>11} {xt:>10.2f} {mt:>10.2f} {xp:>9.2f} {mp:>9.2f} {ratio:>8.2f} {wrong:>6}")
print(f"sizes where xpu is slower than MPI_Allreduce: {slower}")
PY
