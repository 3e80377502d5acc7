#!/usr/bin/env bash
# Float-sum all-reduce on 2 ranks at 4 KiB, 1 MiB and 64 MiB: xpu across two processes
# (`mpirun -np 2 xpu bench collectives --devices host:0`, one rank per process), xpu
# within one process (`xpu bench collectives --devices host:0,1`), and Open MPI's own
# MPI_Allreduce on the same two processes (benches/mpi/allreduce.c), all measured in
# this run, in ROUNDS interleaved rounds (default 5), first on an idle machine, then
# with a competing busy process on one core.
#
# Open MPI runs as it runs best on these cores: no --oversubscribe when the processes
# fit the cores (it would switch it to its slow yielding mode).
#
# Prints per size and condition the median over rounds of each mean time and p50, the
# ratios MPI/xpu (1 or more: xpu is at least as fast), and every round's mean, so that
# a figure that holds in one round only shows. Needs Debian's openmpi-bin and
# libopenmpi-dev (scripts/deps.sh installs them).
#
#   benches/mpi/compare.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-5}"
for tool in mpicc mpirun; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "compare.sh: $tool not found; install Debian's openmpi-bin and libopenmpi-dev" >&2
    exit 2
  }
done
out=target/mpi-compare
mkdir -p "$out"
rm -f "$out"/*.jsonl
mpicc -O2 -o "$out/allreduce" benches/mpi/allreduce.c
cargo build --release --locked --quiet --bin xpu
# As root, Open MPI wants to be told.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
launch=(mpirun -np 2)
if (($(nproc) < 2)); then
  launch+=(--oversubscribe)
fi

# size:iterations — enough iterations for the mean to settle at each size.
sizes=(4096:500 1048576:200 67108864:20)

# shellcheck source=benches/mpi/busy.sh
source benches/mpi/busy.sh

for condition in idle busy; do
  if [[ "$condition" == busy ]]; then
    # One core kept busy by another process for the whole condition.
    start_busy
  fi
  for round in $(seq 1 "$rounds"); do
    for entry in "${sizes[@]}"; do
      size="${entry%%:*}" iters="${entry##*:}"
      tag="$condition.$size.$round"
      # Alternate which runs first from round to round.
      runs=(mpi across within)
      if ((round % 2 == 0)); then runs=(within across mpi); fi
      for run in "${runs[@]}"; do
        case "$run" in
          mpi)
            "${launch[@]}" "$out/allreduce" "$size" "$size" 2 "$iters" 5 >"$out/mpi.$tag.jsonl"
            ;;
          across)
            "${launch[@]}" target/release/xpu bench collectives --devices host:0 -b "$size" \
              -e "$size" -n "$iters" -w 5 --json >"$out/across.$tag.jsonl"
            ;;
          within)
            target/release/xpu bench collectives --devices host:0,1 -b "$size" -e "$size" \
              -n "$iters" -w 5 --json >"$out/within.$tag.jsonl"
            ;;
        esac
      done
    done
  done
  stop_busy
done

python3 - "$out" "$rounds" "${sizes[@]}" <<'PY'
import json, statistics, sys
out, rounds, sizes = sys.argv[1], int(sys.argv[2]), [int(s.split(":")[0]) for s in sys.argv[3:]]
med = statistics.median
def row(name, condition, size, r):
    rec = json.loads(open(f"{out}/{name}.{condition}.{size}.{r}.jsonl").readline())
    if name == "mpi":
        return rec["time_us"], rec["p50_us"], rec["wrong"]
    f = rec["out_of_place"]
    return f["time_us"], f["p50_us"], f["wrong"] or 0
print(f"# medians over {rounds} interleaved rounds; ratio = MPI time / xpu time (>= 1: xpu at least as fast)")
print(f"{'condition':>9} {'size':>9} {'run':>7} {'mean us':>10} {'p50 us':>9} {'MPI/xpu':>8} {'p50 ratio':>9} {'wrong':>5}  means per round")
for condition in ("idle", "busy"):
    for size in sizes:
        m = [row("mpi", condition, size, r) for r in range(1, rounds + 1)]
        mt, mp = med(x[0] for x in m), med(x[1] for x in m)
        print(f"{condition:>9} {size:>9} {'mpi':>7} {mt:>10.2f} {mp:>9.2f} {'':>8} {'':>9} {sum(x[2] for x in m):>5}  "
              + " ".join(f"{x[0]:.1f}" for x in m))
        for name in ("across", "within"):
            x = [row(name, condition, size, r) for r in range(1, rounds + 1)]
            xt, xp = med(v[0] for v in x), med(v[1] for v in x)
            print(f"{condition:>9} {size:>9} {name:>7} {xt:>10.2f} {xp:>9.2f} {mt / xt:>8.2f} {mp / xp:>9.2f} "
                  f"{sum(v[2] for v in x):>5}  " + " ".join(f"{v[0]:.1f}" for v in x))
PY
