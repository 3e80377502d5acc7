#!/usr/bin/env bash
# Runs the README's test command (scripts/test.sh) ROUNDS times (default 5) under load, to
# catch tests that pass only on an idle machine: in every round a busy process spins on
# one core for the whole run, the test binaries run more test threads than there are
# cores (RUST_TEST_THREADS), and the randomised tests take a new seed (XPU_TEST_SEED).
# The environment is CI's (scripts/ci-env.sh): a backend that must not be skipped fails
# the round if it is.
#
#   scripts/stress-tests.sh [ROUNDS]
#
#   XPU_STRESS_THREADS   test threads per test binary (default: twice the cores)
#   XPU_STRESS_ROUND_TIMEOUT  seconds after which a round is stopped as hung (default 3600;
#                         a hang guard only: a healthy round takes a few minutes)
#   XPU_TEST_SEED         the first round's seed (default: random); later rounds add 1
#
# Every round's output is kept in target/stress/round-N.log. Each failure is printed with
# its test name, its output and the round's seed; the script exits non-zero if any round
# failed. Run it before submitting a change: CI runs the test command once, on an idle
# machine, and a test that fails by chance there blocks every landing.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

rounds="${1:-5}"
if ! [[ "$rounds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/stress-tests.sh [ROUNDS]   (ROUNDS: a positive integer, got '$rounds')" >&2
  exit 2
fi
cores="$(nproc)"
threads="${XPU_STRESS_THREADS:-$((cores * 2))}"
limit="${XPU_STRESS_ROUND_TIMEOUT:-3600}"
for v in "$threads" "$limit"; do
  if ! [[ "$v" =~ ^[1-9][0-9]*$ ]]; then
    echo "scripts/stress-tests.sh: XPU_STRESS_THREADS and XPU_STRESS_ROUND_TIMEOUT take positive integers, got '$v'" >&2
    exit 2
  fi
done
seed="${XPU_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
if ! [[ "$seed" =~ ^[0-9]+$ ]]; then
  echo "scripts/stress-tests.sh: XPU_TEST_SEED takes a decimal integer, got '$seed'" >&2
  exit 2
fi

source scripts/ci-env.sh
scripts/deps.sh --test || exit 1
logs=target/stress
mkdir -p "$logs"

# Build before the first round, so that its figure is the tests' time, not the build's.
echo "== building the tests"
cargo test --workspace --locked --no-run --quiet || exit 1
cargo build --workspace --locked --quiet || exit 1

busy_pid=""
stop_busy() {
  if [[ -n "$busy_pid" ]]; then
    kill "$busy_pid" 2>/dev/null
    wait "$busy_pid" 2>/dev/null
    busy_pid=""
  fi
}
trap stop_busy EXIT
trap 'stop_busy; exit 130' INT TERM
start_busy() {
  # One core kept busy: pinned to core 0 where taskset exists, so the test threads share
  # the remaining cores with it as CI's would with a noisy neighbour.
  local spin=(bash -c 'while :; do :; done')
  if command -v taskset >/dev/null 2>&1; then
    taskset -c 0 "${spin[@]}" &
  else
    "${spin[@]}" &
  fi
  busy_pid=$!
}

# The failures in one round's log: each failed test's name and output (libtest's
# `failures:` section), test binaries that died, conformance cases that failed, and the
# backend verdicts.
print_failures() {
  local log="$1"
  awk '
    /^failures:$/ && !inside { inside = 1 }
    inside { print "    " $0 }
    /^test result: FAILED/ { inside = 0 }
    /^error: test failed, to rerun pass/ { print "    " $0 }
    /process didn.t exit successfully/ { print "    " $0 }
    /^FAIL  / { print "    conformance: " $0 }
    /^backend .*: FAILED/ { print "    conformance: " $0 }
  ' "$log"
}

declare -a summary
failed=0
total_start=$SECONDS
for ((round = 1; round <= rounds; round++)); do
  log="$logs/round-$round.log"
  round_seed=$((seed + round - 1))
  echo "== round $round of $rounds: RUST_TEST_THREADS=$threads XPU_TEST_SEED=$round_seed, one core busy"
  start=$SECONDS
  start_busy
  RUST_TEST_THREADS="$threads" XPU_TEST_SEED="$round_seed" \
    timeout --kill-after=30 "$limit" scripts/test.sh >"$log" 2>&1
  rc=$?
  stop_busy
  took=$((SECONDS - start))
  passed="$(grep -Eo '^test result: ok\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')"
  if ((rc == 0)); then
    summary+=("round $round: ok in ${took} s ($passed cargo tests; XPU_TEST_SEED=$round_seed)")
    echo "   ok in ${took} s"
  else
    failed=$((failed + 1))
    reason="exit status $rc"
    ((rc == 124 || rc == 137)) && reason="stopped after ${limit} s (hung?)"
    summary+=("round $round: FAILED ($reason) in ${took} s; XPU_TEST_SEED=$round_seed; log $log")
    echo "   FAILED ($reason) in ${took} s; XPU_TEST_SEED=$round_seed; log $log"
    found="$(print_failures "$log")"
    if [[ -n "$found" ]]; then
      echo "$found"
    else
      echo "    (no test named the failure; the log ends:)"
      tail -n 30 "$log" | sed 's/^/    /'
    fi
  fi
done

echo
echo "== summary: $rounds round(s) in $((SECONDS - total_start)) s, $cores cores, one busy"
printf '%s\n' "${summary[@]}"
if ((failed > 0)); then
  echo "$failed of $rounds round(s) failed"
  exit 1
fi
echo "all $rounds round(s) passed"
