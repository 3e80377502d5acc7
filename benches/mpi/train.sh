#!/usr/bin/env bash
# `xpu train` (the transformer, f32) at the same global batch on one host device, on
# two host devices within one process (`--devices host:0,1`) and on one host device in
# each of two processes (`mpirun -np 2 … --devices host:0`), all measured in this run,
# in ROUNDS interleaved rounds (default 5) of STEPS steps (default 60), first on an
# idle machine, then with a competing busy process on one core. Every host device
# runs one thread (XPU_HOST_THREADS=1), as in `xpu bench train`.
#
# Prints per condition each round's tokens/s and the mean of each, with the ratios of
# the two-device runs to the one-device run. Needs Debian's openmpi-bin
# (scripts/deps.sh installs it).
#
#   benches/mpi/train.sh [ROUNDS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-5}"
steps="${2:-60}"
command -v mpirun >/dev/null 2>&1 || {
  echo "train.sh: mpirun not found; install Debian's openmpi-bin" >&2
  exit 2
}
cargo build --release --locked --quiet --bin xpu
xpu=target/release/xpu
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 XPU_HOST_THREADS=1
launch=(mpirun -np 2 --mca btl self,vader)
if (($(nproc) < 2)); then
  launch+=(--oversubscribe)
fi

# shellcheck source=benches/mpi/busy.sh
source benches/mpi/busy.sh

# tokens_per_s DEVICES COMMAND…: the tokens/s that `COMMAND train --devices DEVICES`
# reports ("N tokens/s; …").
tokens_per_s() {
  local devices="$1"
  shift
  "$@" train --devices "$devices" --steps "$steps" --log-every "$steps" |
    sed -n 's/^\([0-9]*\) tokens\/s.*/\1/p'
}

for condition in idle busy; do
  if [[ "$condition" == busy ]]; then
    start_busy
  fi
  one=() within=() across=()
  for round in $(seq 1 "$rounds"); do
    a=$(tokens_per_s host:0 "$xpu")
    b=$(tokens_per_s host:0,1 "$xpu")
    c=$(tokens_per_s host:0 "${launch[@]}" "$xpu")
    one+=("$a") within+=("$b") across+=("$c")
    echo "$condition round $round: host:0 $a, host:0,1 $b, 2 processes × host:0 $c tokens/s"
  done
  python3 - "$condition" "${one[*]}" "${within[*]}" "${across[*]}" <<'PY'
import sys
cond, *cols = sys.argv[1:]
one, within, across = ([float(x) for x in c.split()] for c in cols)
mean = lambda v: sum(v) / len(v)
print(f"{cond}: mean tokens/s: host:0 {mean(one):.0f}; host:0,1 {mean(within):.0f} "
      f"({mean(within) / mean(one):.2f}×); 2 processes × host:0 {mean(across):.0f} "
      f"({mean(across) / mean(one):.2f}×)")
PY
  stop_busy
done
