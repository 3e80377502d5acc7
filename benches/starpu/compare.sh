#!/usr/bin/env bash
# Task Bench on the xpu scheduler (`xpu bench scheduler` on WORKERS host devices) beside
# the same graphs on StarPU (benches/starpu/taskbench.c with WORKERS CPU workers,
# STARPU_NCPU=WORKERS), both measured in this run, in ROUNDS rounds (default 3) that
# alternate which system goes first; each figure is the median over the rounds of each
# run's own median (of ITERATIONS runs after a warm-up), since these machines are noisy.
#
# Figures, each for xpu and StarPU with the ratio xpu/StarPU (above 1: xpu is slower):
#   - time per task at grain 0 (wall / tasks) of every pattern in PATTERNS, WIDTH x STEPS;
#   - empty independent tasks, StarPU's tasks_overhead style: on StarPU, WIDTH*STEPS tasks
#     made with starpu_task_create (no data, no arguments), submitted, waited for; on xpu
#     the `trivial` pattern, which is the same thing (no data, no dependencies);
#   - METG(50%) of METG_PATTERN, METG_WIDTH x METG_STEPS: the smallest busy-wait per task
#     at which the workers are busy at least half the time (both search it the same way).
# Before the rounds, every configuration runs once on each side with --check (each task
# verifies its inputs); the script fails if anything was wrong, or if the two sides did
# not run the same graphs (tasks, edges and graph digest must agree). Needs Debian's
# libstarpu-dev (see build.sh); without it, says so and exits 2.
#
#   benches/starpu/compare.sh [ROUNDS]
#
# Environment (defaults): WORKERS=2 POLICY=eager (eager, ws or dmda: the same name on both
# sides) WIDTH=8 STEPS=1000 PATTERNS="trivial stencil_1d" METG_PATTERN=stencil_1d
# METG_WIDTH=2 METG_STEPS=1000 ITERATIONS=5 METG_ITERATIONS=3; METG=0 skips the METG.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-3}"
workers="${WORKERS:-2}" policy="${POLICY:-eager}"
width="${WIDTH:-8}" steps="${STEPS:-1000}" patterns="${PATTERNS:-trivial stencil_1d}"
metg_pattern="${METG_PATTERN:-stencil_1d}" metg_width="${METG_WIDTH:-2}" metg_steps="${METG_STEPS:-1000}"
iterations="${ITERATIONS:-5}" metg_iterations="${METG_ITERATIONS:-3}" metg="${METG:-1}"
for v in "$rounds" "$workers" "$width" "$steps" "$metg_width" "$metg_steps" "$iterations" "$metg_iterations"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: '$v' is not a positive whole number" >&2; exit 2; }
done
command -v python3 >/dev/null 2>&1 || { echo "compare.sh: python3 not found" >&2; exit 2; }

out=target/starpu-compare
mkdir -p "$out/home"
rm -f "$out"/*.json
if ! starpu="$(benches/starpu/build.sh "$out")"; then
  echo "compare.sh: StarPU could not be built, so there is nothing to compare against (see above)" >&2
  exit 2
fi
cargo build --release --locked --quiet --bin xpu
xpu=target/release/xpu
devices="host:$(seq -s, 0 $((workers - 1)))"

# StarPU: only CPU workers, WORKERS of them; its performance models and logs stay in $out.
export STARPU_NCPU="$workers" STARPU_NCUDA=0 STARPU_NOPENCL=0 STARPU_SILENT=1
export STARPU_HOME="$PWD/$out/home" STARPU_SCHED="$policy"
# xpu: exactly WORKERS host devices, whatever the environment selects otherwise.
export XPU_HOST_DEVICES="$workers"
unset XPU_DEVICES XPU_SCHED

run_xpu() { "$xpu" bench scheduler --devices "$devices" --policy "$policy" --json "$@"; }
run_starpu() { "$starpu" --policy "$policy" "$@"; }

# name|graph|measurement, for every configuration both sides run.
configs=()
for p in $patterns; do
  configs+=("grain0.$p|--pattern $p --width $width --steps $steps|--iterations $iterations")
done
if [ "$metg" = 1 ]; then
  configs+=("metg.$metg_pattern|--pattern $metg_pattern --width $metg_width --steps $metg_steps|--iterations $metg_iterations --metg")
fi

echo "checking: every configuration once on each side with --check" >&2
for c in "${configs[@]}"; do
  IFS='|' read -r name graph _ <<<"$c"
  read -r -a args <<<"$graph"
  # The check needs the graph, not the timing: one run, no METG search.
  run_starpu "${args[@]}" --check --iterations 1 >"$out/starpu.check.$name.json"
  run_xpu "${args[@]}" --check --iterations 1 >"$out/xpu.check.$name.json"
done

for round in $(seq 1 "$rounds"); do
  echo "round $round of $rounds" >&2
  for c in "${configs[@]}"; do
    IFS='|' read -r name graph measurement <<<"$c"
    read -r -a args <<<"$graph $measurement"
    if [ $((round % 2)) = 1 ]; then
      run_starpu "${args[@]}" >"$out/starpu.$name.$round.json"
      run_xpu "${args[@]}" >"$out/xpu.$name.$round.json"
    else
      run_xpu "${args[@]}" >"$out/xpu.$name.$round.json"
      run_starpu "${args[@]}" >"$out/starpu.$name.$round.json"
    fi
  done
  run_starpu --overhead $((width * steps)) --iterations "$iterations" >"$out/starpu.overhead.$round.json"
done

python3 - "$out" "$rounds" "$workers" "$policy" "$patterns" "$metg" "$metg_pattern" <<'PY'
import json, statistics, sys
out, rounds, workers, policy, patterns, metg, metg_pattern = sys.argv[1:]
rounds = int(rounds)
patterns = patterns.split()
med = statistics.median
def load(path):
    with open(path) as f:
        return json.loads(f.read())
def runs(system, name):
    return [load(f"{out}/{system}.{name}.{k}.json") for k in range(1, rounds + 1)]
bad = []
names = [f"grain0.{p}" for p in patterns] + ([f"metg.{metg_pattern}"] if metg == "1" else [])
wrong = 0
for name in names:
    x, s = load(f"{out}/xpu.check.{name}.json"), load(f"{out}/starpu.check.{name}.json")
    wrong += x["wrong"] + s["wrong"]
    for key in ("tasks", "edges", "digest"):
        if x[key] != s[key]:
            bad.append(f"{name}: {key} differs: xpu {x[key]}, StarPU {s[key]}")
version = load(f"{out}/starpu.overhead.1.json")["version"]
print(f"# Task Bench: xpu scheduler vs StarPU {version}; {workers} xpu host devices, "
      f"{workers} StarPU CPU workers; policy {policy}; medians of {rounds} alternating rounds")
print(f"{'figure':<48} {'xpu':>12} {'StarPU':>12} {'xpu/StarPU':>11}")
def row(label, xv, sv, unit):
    ratio = xv / sv if sv else float("inf")
    print(f"{label:<48} {xv:>9.1f} {unit:<2} {sv:>9.1f} {unit:<2} {ratio:>11.2f}")
for p in patterns:
    xr, sr = runs("xpu", f"grain0.{p}"), runs("starpu", f"grain0.{p}")
    w, st = xr[0]["width"], xr[0]["steps"]
    row(f"{p} {w}x{st}, time per task at grain 0", med(r["per_task_ns"] for r in xr),
        med(r["per_task_ns"] for r in sr), "ns")
ov = [load(f"{out}/starpu.overhead.{k}.json") for k in range(1, rounds + 1)]
if "trivial" in patterns:
    xr = runs("xpu", "grain0.trivial")
    row(f"empty tasks ({ov[0]['overhead_tasks']}), tasks_overhead style",
        med(r["per_task_ns"] for r in xr), med(r["per_task_ns"] for r in ov), "ns")
print(f"{'StarPU tasks_overhead: submit only, per task':<48} {'':>12} "
      f"{med(r['submit_ns'] for r in ov):>9.1f} ns")
if metg == "1":
    name = f"metg.{metg_pattern}"
    xr, sr = runs("xpu", name), runs("starpu", name)
    xm = [r["metg_us"] for r in xr]
    sm = [r["metg_us"] for r in sr]
    label = f"{metg_pattern} {xr[0]['width']}x{xr[0]['steps']}, METG(50%)"
    if None in xm or None in sm:
        print(f"{label:<48} {'n/a' if None in xm else f'{med(xm):.2f} us':>12} "
              f"{'n/a' if None in sm else f'{med(sm):.2f} us':>12}   (50% not reached in every round)")
    else:
        row(label, med(xm), med(sm), "us")
        xg = med(r["metg"]["found"]["granularity_us"] for r in xr)
        sg = med(r["metg"]["found"]["granularity_us"] for r in sr)
        row(f"  Task Bench granularity at that grain", xg, sg, "us")
    for system, rs in (("xpu", xr), ("StarPU", sr)):
        print(f"  {system} METG per round: " + ", ".join("n/a" if v is None else f"{v:.2f}" for v in
              (r["metg_us"] for r in rs)) + " us")
for b in bad:
    print("MISMATCH:", b)
print(f"graphs agree: {'no' if bad else 'yes (tasks, edges, digest)'}; wrong in the checked runs: {wrong}")
sys.exit(1 if bad or wrong else 0)
PY
