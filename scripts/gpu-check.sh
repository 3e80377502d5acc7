#!/usr/bin/env bash
# The CUDA check, for a machine with an NVIDIA GPU and driver (CUDA 12.6 or newer).
#
#   scripts/gpu-check.sh --prebuilt DIR [OUT]   run the bundle DIR made by scripts/gpu-bundle.sh;
#                                               needs no Rust, cargo or registry (a borrowed GPU machine)
#   scripts/gpu-check.sh [OUT]                  build the bundle first (target/gpu-bundle, needs
#                                               Rust), then the same steps
#
# OUT defaults to $OUT when set, else target/gpu-check. Every step runs under `timeout` with
# its own budget (about 400 s in all, so that the whole check fits in 7 minutes) and writes
# its file to OUT as soon as it ends, so a run killed from outside still returns what was
# done; summary.txt is rewritten before and after every step. OUT gets at most these files:
#
#   inventory.txt     date, uname, nvidia-smi, where libcuda / NVRTC / NCCL are (loader, CUDA
#                     toolkits, Python's nvidia packages), glibc, ldd of bin/xpu, `xpu devices`,
#                     `xpu topo`
#   cuda-tests.txt    every test of every bin/cuda-* executable, one process each (60 s at most),
#                     with XPU_REQUIRE=cuda: ok / ignored / FAILED / TIMEOUT, failures' output
#   conformance.json  `xpu conformance --devices cuda:0 --require cuda --json`
#   training.json     `xpu conformance --profile training --devices cuda:0 --require cuda --json`
#                     (the standard operations against the f64 reference)
#   collectives.txt   `xpu bench collectives --devices 'cuda:0;host:0' -b 8 -e 64M -f 8 -n 5 -w 2`
#   bench.txt         `xpu bench cuda --json`, the PyTorch script's JSON, and a table of xpu, raw
#                     cudarc and PyTorch side by side with the ratios
#   memory.txt        `xpu bench memory --devices cuda:0` (the AlexNet trace replayed twice and the
#                     reuse scenario; expandable segments where the GPU has virtual memory)
#   summary.txt       one line per step (passed / failed / skipped / timed out, seconds), the
#                     conformance failures and tail, the overall result
#
# When neither NVRTC nor NCCL is on the loader path, the ones found in Python's nvidia
# packages (or a CUDA toolkit's lib64) are exported to the later steps as XPU_CUDA_NVRTC and
# XPU_NCCL_LIBRARY. The bundle's own shared libraries (DIR/lib) are put on LD_LIBRARY_PATH
# for the bundle's executables only, never for python3.
#
# Exits 0 when CUDA is available and every step passed; 1 when CUDA is unavailable or a step
# failed or timed out; 2 on a usage error.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

usage() {
  sed -n '4,7p' "$0" >&2
  exit 2
}

prebuilt=""
out=""
while (($#)); do
  case "$1" in
    --prebuilt)
      [[ $# -ge 2 ]] || usage
      prebuilt="$2"
      shift 2
      ;;
    --prebuilt=*)
      prebuilt="${1#--prebuilt=}"
      shift
      ;;
    -h | --help) usage ;;
    -*)
      echo "gpu-check: unknown option $1" >&2
      usage
      ;;
    *)
      [[ -z "$out" ]] || usage
      out="$1"
      shift
      ;;
  esac
done
out="${out:-${OUT:-target/gpu-check}}"
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Step bookkeeping: names, states and notes, and a summary rewritten from them.
steps=()
declare -A state secs note
details=""
cuda_line="cuda: not probed yet"
gpu_line=""
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
check_start=$SECONDS

write_summary() {
  local s result="passed" failed=() running=""
  for s in "${steps[@]}"; do
    case "${state[$s]}" in
      failed | "timed out") failed+=("$s") ;;
      running) running="$s" ;;
    esac
  done
  if [[ -n "$running" ]]; then
    result="incomplete ($running running${failed[*]:+; failed so far: ${failed[*]}})"
  elif ((${#failed[@]})); then
    result="FAILED (${failed[*]})"
  elif [[ "$cuda_line" != "cuda: available"* ]]; then
    result="FAILED (CUDA unavailable)"
  fi
  {
    echo "xpu CUDA check, started $started, $((SECONDS - check_start)) s so far"
    echo "bundle: ${bundle_line:-none}"
    [[ -n "$gpu_line" ]] && echo "gpu: $gpu_line"
    echo "$cuda_line"
    echo
    for s in "${steps[@]}"; do
      printf '%-12s %-10s %5s s  %s\n' "$s" "${state[$s]}" "${secs[$s]}" "${note[$s]}"
    done
    echo
    echo "result: $result"
    if [[ -n "$details" ]]; then printf '\n%s\n' "$details"; fi
  } >"$tmp/summary"
  cp -f "$tmp/summary" "$summary"
}

# begin NAME: marks a step as running (so a run killed from outside says where).
begin() {
  steps+=("$1")
  state[$1]="running"
  secs[$1]=0
  note[$1]=""
  step_start=$SECONDS
  echo "== $1" >&2
  write_summary
}

# finish NAME STATUS NOTE
finish() {
  state[$1]="$2"
  secs[$1]=$((SECONDS - step_start))
  note[$1]="$3"
  echo "   $1: $2 ${3:+($3)}" >&2
  write_summary
}

skip_rest() {
  local s
  for s in "$@"; do
    steps+=("$s")
    state[$s]="skipped"
    secs[$s]=0
    note[$s]="$reason_to_skip"
  done
  write_summary
}

# status_of RC: the step state for a command's exit status.
status_of() {
  case "$1" in
    0) echo passed ;;
    124 | 137) echo "timed out" ;;
    *) echo failed ;;
  esac
}

# Budgets in seconds (each step's whole `timeout`), about 400 in all; XPU_GPU_CHECK_BUDGET (default
# 400) caps the total from the end of the build: a step never gets more than what is left.
total_budget="${XPU_GPU_CHECK_BUDGET:-400}"
budget_tests=135
budget_test_one=60
budget_conformance=110
budget_training=60
budget_collectives=40
budget_bench_xpu=25
budget_bench_torch=35
budget_memory=25

# fit SECONDS: SECONDS, or what is left of the total when that is less (at least 1).
fit() {
  local left=$((total_budget - (SECONDS - check_start)))
  ((left < 1)) && left=1
  echo $(($1 < left ? $1 : left))
}

# --- the bundle ---------------------------------------------------------------------------
if [[ -z "$prebuilt" ]]; then
  prebuilt="target/gpu-bundle"
  begin build
  if scripts/gpu-bundle.sh "$prebuilt" >"$tmp/build.log" 2>&1; then
    finish build passed "scripts/gpu-bundle.sh $prebuilt"
  else
    finish build failed "scripts/gpu-bundle.sh: $(grep -v '^ *$' "$tmp/build.log" | tail -n 1)"
    details="build log (last 30 lines):
$(tail -n 30 "$tmp/build.log")"
    write_summary
    cat "$summary"
    exit 1
  fi
fi
check_start=$SECONDS
dir="$(cd "$prebuilt" 2>/dev/null && pwd)" || {
  echo "gpu-check: $prebuilt is not a directory; make it with scripts/gpu-bundle.sh" >&2
  exit 2
}
xpu="$dir/bin/xpu"
# A copy that lost its modes on the way: make the executables executable again.
for f in "$dir"/bin/*; do
  [[ -x "$f" ]] || chmod +x "$f" 2>/dev/null || echo "gpu-check: $f is not executable" >&2
done
if [[ ! -x "$xpu" ]]; then
  echo "gpu-check: $xpu is missing; make the bundle with scripts/gpu-bundle.sh" >&2
  exit 2
fi
bundle_line="$dir ($(sed -n 's/^git commit: //p' "$dir/MANIFEST" 2>/dev/null | head -n 1))"
libpath="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Runs a bundle executable with the bundle's libraries.
bx() { LD_LIBRARY_PATH="$libpath" "$@"; }

# --- a. inventory -------------------------------------------------------------------------
# Prints every shared library file under Python's nvidia packages (nvidia/*/lib,
# nvidia/cu13/lib …) of the python3 on PATH.
python_nvidia_libs() {
  command -v python3 >/dev/null || return 0
  timeout 20 python3 - <<'EOF' 2>/dev/null
import os, site, sys
dirs = []
try:
    dirs += site.getsitepackages()
except Exception:
    pass
try:
    dirs.append(site.getusersitepackages())
except Exception:
    pass
dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
seen = set()
for d in dirs:
    root = os.path.realpath(os.path.join(d, "nvidia"))
    if root in seen or not os.path.isdir(root):
        continue
    seen.add(root)
    for path, subdirs, files in os.walk(root):
        subdirs.sort()
        if os.path.basename(path) == "lib":
            for f in sorted(files):
                if ".so" in f:
                    print(os.path.join(path, f))
EOF
}

# Library directories of the CUDA toolkits here.
toolkit_dirs() {
  local d
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-*; do
    [[ -n "$d" && -d "$d" ]] || continue
    [[ -d "$d/lib64" ]] && echo "$d/lib64"
    [[ -d "$d/lib" ]] && echo "$d/lib"
    [[ -d "$d/targets/x86_64-linux/lib" ]] && echo "$d/targets/x86_64-linux/lib"
  done | awk '!seen[$0]++'
}

# on_loader_path REGEX: whether a library whose name matches is in the ld.so cache or in a
# directory of LD_LIBRARY_PATH.
on_loader_path() {
  if ldconfig -p 2>/dev/null | awk '{print $1}' | grep -Eq "$1"; then
    return 0
  fi
  local d
  IFS=: read -ra lds <<<"${LD_LIBRARY_PATH:-}"
  for d in "${lds[@]}"; do
    [[ -n "$d" && -d "$d" ]] || continue
    find "$d" -maxdepth 1 -printf '%f\n' 2>/dev/null | grep -Eq "$1" && return 0
  done
  return 1
}

# pick REGEX MAX_MAJOR < candidates: the candidate whose file name matches with the highest
# version whose major is at most MAX_MAJOR (any when empty).
pick() {
  local regex="$1" max="$2" name path major
  while read -r path; do
    name="${path##*/}"
    [[ "$name" =~ $regex ]] || continue
    printf '%s\t%s\n' "$name" "$path"
  done | sort -V -r | while IFS=$'\t' read -r name path; do
    major="${name#*.so.}"
    major="${major%%.*}"
    if [[ -z "$max" || ! "$major" =~ ^[0-9]+$ || "$major" -le "$max" ]]; then
      echo "$path"
      break
    fi
  done
}

begin inventory
inv="$out/inventory.txt"
cuda_available=0
{
  echo "== date"
  date -u +%Y-%m-%dT%H:%M:%SZ
  echo "== uname"
  uname -a
  echo "== bundle"
  echo "$dir"
  cat "$dir/MANIFEST" 2>/dev/null || echo "(no MANIFEST)"
  echo "== nvidia-smi"
  if command -v nvidia-smi >/dev/null; then
    timeout 15 nvidia-smi >"$tmp/smi" 2>&1
    cat "$tmp/smi"
    echo "-- nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv"
    timeout 15 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv \
      >"$tmp/smiq" 2>&1
    cat "$tmp/smiq"
  else
    echo "nvidia-smi: not found"
  fi
  echo "== libcuda"
  ldconfig -p 2>/dev/null | grep -E 'libcuda\.so' || echo "(libcuda is not in the ld.so cache)"
  ls -l /usr/lib*/libcuda.so* /usr/lib*/*/libcuda.so* /usr/local/nvidia/lib*/libcuda.so* 2>/dev/null ||
    echo "(no libcuda.so* under /usr/lib*, /usr/local/nvidia)"
  echo "== NVRTC and NCCL on the loader path"
  ldconfig -p 2>/dev/null | grep -E 'libnvrtc|libnccl' || echo "(neither is in the ld.so cache)"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  echo "== CUDA toolkits (CUDA_HOME=${CUDA_HOME:-} CUDA_PATH=${CUDA_PATH:-})"
  ls -d /usr/local/cuda* 2>/dev/null || echo "(no /usr/local/cuda*)"
  command -v nvcc >/dev/null && timeout 10 nvcc --version 2>&1 | tail -n 2
  toolkit_dirs | while read -r d; do
    ls "$d"/libnvrtc.so* "$d"/libnccl.so* 2>/dev/null
  done
  echo "== Python's nvidia packages ($(command -v python3 || echo 'no python3'))"
} >"$inv" 2>&1
python_nvidia_libs >"$tmp/pylibs"
{
  cat "$tmp/pylibs"
  [[ -s "$tmp/pylibs" ]] || echo "(none found)"
} >>"$inv"
cuda_major="$(grep -o 'CUDA Version: *[0-9]*' "$tmp/smi" 2>/dev/null | grep -o '[0-9]*$' | head -n 1)"
gpu_line="$(sed -n 2p "$tmp/smiq" 2>/dev/null)"
if command -v nvidia-smi >/dev/null; then
  gpu_line="${gpu_line:-no answer from nvidia-smi}${cuda_major:+, driver CUDA $cuda_major}"
else
  gpu_line="nvidia-smi not found"
fi
{
  toolkit_dirs | while read -r d; do ls "$d"/libnvrtc.so* "$d"/libnccl.so* 2>/dev/null; done
  cat "$tmp/pylibs"
} >"$tmp/candidates"
exports=()
{
  echo "== libraries for the backend"
  if [[ -n "${XPU_CUDA_NVRTC:-}" ]]; then
    echo "XPU_CUDA_NVRTC=$XPU_CUDA_NVRTC (set by the caller)"
  elif on_loader_path '^libnvrtc\.so(\.[0-9.]+)?$'; then
    echo "NVRTC is on the loader path; XPU_CUDA_NVRTC is not set"
  else
    nvrtc="$(pick '^libnvrtc\.so\.[0-9]+(\.[0-9]+)*$' "$cuda_major" <"$tmp/candidates")"
    if [[ -n "$nvrtc" ]]; then
      export XPU_CUDA_NVRTC="$nvrtc"
      exports+=("XPU_CUDA_NVRTC=$nvrtc")
      echo "export XPU_CUDA_NVRTC=$nvrtc"
    else
      echo "NVRTC: none found (builtin operations and CUDA C kernels will be unavailable)"
    fi
  fi
  if [[ -n "${XPU_NCCL_LIBRARY:-}" ]]; then
    echo "XPU_NCCL_LIBRARY=$XPU_NCCL_LIBRARY (set by the caller)"
  elif on_loader_path '^libnccl\.so(\.[0-9.]+)?$'; then
    echo "NCCL is on the loader path; XPU_NCCL_LIBRARY is not set"
  else
    nccl="$(pick '^libnccl\.so\.[0-9]+(\.[0-9]+)*$' "" <"$tmp/candidates")"
    if [[ -n "$nccl" ]]; then
      export XPU_NCCL_LIBRARY="$nccl"
      exports+=("XPU_NCCL_LIBRARY=$nccl")
      echo "export XPU_NCCL_LIBRARY=$nccl"
    else
      echo "NCCL: none found (collectives over GPUs use xpu's own algorithms)"
    fi
  fi
  echo "== glibc"
  echo "here: $(ldd --version 2>&1 | sed -n 1p)"
  echo "bundle needs: $(sed -n 's/^glibc needed: //p' "$dir/MANIFEST" 2>/dev/null)"
  echo "== ldd bin/xpu (LD_LIBRARY_PATH=$dir/lib)"
  bx ldd "$xpu" 2>&1
  echo "-- not found:"
  for f in "$dir"/bin/*; do
    bx ldd "$f" 2>&1 | grep -E 'not found|version .* not found' | sed "s|^|${f##*/}: |"
  done
  echo "(end)"
  echo "== xpu --version"
  bx timeout 10 "$xpu" --version 2>&1
  echo "== xpu devices"
} >>"$inv" 2>&1
bx timeout -k 5 "$(fit 20)" "$xpu" devices >"$tmp/devices.txt" 2>&1
devices_rc=$?
{
  cat "$tmp/devices.txt"
  echo "== xpu devices --json --devices 'cuda:*'"
  bx timeout -k 5 "$(fit 15)" "$xpu" devices --json --devices 'cuda:*' 2>&1
  echo "== xpu topo --devices 'cuda:*;host:0'"
  bx timeout -k 5 "$(fit 15)" "$xpu" topo --devices 'cuda:*;host:0' 2>&1
} >>"$inv"
# The CUDA backend's line of `xpu devices`: "cuda   available, 1 device(s)" or
# "cuda   unavailable: REASON".
cuda_status="$(grep -E '^  cuda +' "$tmp/devices.txt" | head -n 1 | sed -E 's/^  cuda +//')"
if [[ "$devices_rc" -ne 0 ]]; then
  cuda_line="cuda: unavailable: bin/xpu devices failed (exit $devices_rc: $(grep -v '^ *$' "$tmp/devices.txt" | tail -n 1); see inventory.txt)"
elif [[ "$cuda_status" == available* ]] && grep -q '^cuda:0 ' "$tmp/devices.txt"; then
  cuda_available=1
  cuda_line="cuda: $cuda_status"
else
  cuda_line="cuda: ${cuda_status:-unavailable: the CUDA backend is not listed by xpu devices}"
  [[ "$cuda_line" == "cuda: unavailable"* ]] || cuda_line="cuda: unavailable (${cuda_status})"
fi
((${#exports[@]})) && cuda_line="$cuda_line; exported ${exports[*]}"
if [[ "$devices_rc" -ne 0 ]]; then
  finish inventory failed "bin/xpu devices exited $devices_rc"
else
  finish inventory passed "$(sed -n 's/^glibc needed: /bundle needs glibc /p' "$dir/MANIFEST" 2>/dev/null), here $(ldd --version 2>&1 | sed -n '1s/.* //p')"
fi

if [[ "$cuda_available" -ne 1 ]]; then
  reason_to_skip="CUDA unavailable"
  skip_rest cuda-tests conformance training collectives bench memory
  cat "$summary"
  exit 1
fi

# --- b. the CUDA backend's tests, one process per test --------------------------------------
begin cuda-tests
budget_tests="$(fit "$budget_tests")"
tests_out="$out/cuda-tests.txt"
echo "xpu-cuda tests, one process each (XPU_REQUIRE=cuda, ${budget_test_one} s each, ${budget_tests} s in all)" >"$tests_out"
n_ok=0 n_ignored=0 n_failed=0 n_timeout=0 n_notrun=0
out_of_time=0
for exe in "$dir"/bin/cuda-*; do
  [[ -e "$exe" ]] || continue
  bin="${exe##*/}"
  if ! bx timeout 20 "$exe" --list --format terse >"$tmp/list" 2>&1; then
    echo "$bin: FAILED to list tests:" >>"$tests_out"
    sed 's/^/    /' "$tmp/list" >>"$tests_out"
    n_failed=$((n_failed + 1))
    continue
  fi
  mapfile -t names < <(sed -n 's/: test$//p' "$tmp/list")
  for name in "${names[@]}"; do
    left=$((budget_tests - (SECONDS - step_start)))
    if ((left < 5)); then
      echo "$bin $name: NOT RUN (the step's ${budget_tests} s were spent)" >>"$tests_out"
      n_notrun=$((n_notrun + 1))
      out_of_time=1
      continue
    fi
    limit=$((left < budget_test_one ? left : budget_test_one))
    t0=$SECONDS
    XPU_REQUIRE=cuda bx timeout -k 5 "$limit" "$exe" --exact "$name" --nocapture --test-threads=1 >"$tmp/test.log" 2>&1
    rc=$?
    took=$((SECONDS - t0))
    passed="$(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed.*/\1/p' "$tmp/test.log" | tail -n 1)"
    ignored="$(sed -n 's/^test result: .* \([0-9]*\) ignored.*/\1/p' "$tmp/test.log" | tail -n 1)"
    if [[ "$rc" == 124 || "$rc" == 137 ]]; then
      verdict="TIMEOUT"
      n_timeout=$((n_timeout + 1))
    elif [[ "$rc" != 0 ]]; then
      verdict="FAILED"
      n_failed=$((n_failed + 1))
    elif [[ "${passed:-0}" -ge 1 ]]; then
      verdict="ok"
      n_ok=$((n_ok + 1))
    elif [[ "${ignored:-0}" -ge 1 ]]; then
      verdict="ignored"
      n_ignored=$((n_ignored + 1))
    else
      verdict="FAILED"
      n_failed=$((n_failed + 1))
    fi
    printf '%s %s: %s (%d s)\n' "$bin" "$name" "$verdict" "$took" >>"$tests_out"
    if [[ "$verdict" == FAILED || "$verdict" == TIMEOUT ]]; then
      tail -n 80 "$tmp/test.log" | sed 's/^/    /' >>"$tests_out"
    fi
  done
done
tests_note="$n_ok ok, $n_failed failed, $n_timeout timed out, $n_ignored ignored"
((n_notrun)) && tests_note="$tests_note, $n_notrun not run"
echo "$tests_note" >>"$tests_out"
if ((n_failed + n_timeout)); then
  finish cuda-tests failed "$tests_note"
elif ((out_of_time)); then
  finish cuda-tests "timed out" "$tests_note"
elif ((n_ok == 0)); then
  finish cuda-tests failed "no test ran"
else
  finish cuda-tests passed "$tests_note"
fi

# --- c. conformance ---------------------------------------------------------------------
begin conformance
bx timeout -k 5 "$(fit "$budget_conformance")" "$xpu" conformance --devices cuda:0 --require cuda \
  --json "$out/conformance.json" >"$tmp/conformance.log" 2>&1
rc=$?
closing="$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$tmp/conformance.log" | tail -n 1)"
details="${details:+$details

}conformance on cuda:0, failures (first 30):
$(grep -E '^(FAIL|XPASS) ' "$tmp/conformance.log" | head -n 30)
conformance, last 15 lines of its output:
$(tail -n 15 "$tmp/conformance.log")"
finish conformance "$(status_of "$rc")" "${closing:-exit $rc, no closing line}"

# --- c2. training profile (the standard operations) --------------------------------------
begin training
bx timeout -k 5 "$(fit "$budget_training")" "$xpu" conformance --profile training --devices cuda:0 \
  --require cuda --json "$out/training.json" >"$tmp/training.log" 2>&1
rc=$?
closing="$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$tmp/training.log" | tail -n 1)"
details="${details:+$details

}training profile on cuda:0, failures (first 30):
$(grep -E '^(FAIL|XPASS) ' "$tmp/training.log" | head -n 30)
training profile, last 15 lines of its output:
$(tail -n 15 "$tmp/training.log")"
finish training "$(status_of "$rc")" "${closing:-exit $rc, no closing line}"

# --- d. collectives ---------------------------------------------------------------------
begin collectives
bx timeout -k 5 "$(fit "$budget_collectives")" "$xpu" bench collectives --devices 'cuda:0;host:0' \
  -b 8 -e 64M -f 8 -n 5 -w 2 >"$out/collectives.txt" 2>&1
rc=$?
finish collectives "$(status_of "$rc")" "cuda:0;host:0, all-reduce 8 B..64 MiB; exit $rc"

# --- e. xpu vs raw cudarc vs PyTorch ----------------------------------------------------
begin bench
rounds=20
size=$((64 << 20))
bench_out="$out/bench.txt"
echo "== xpu bench cuda --json --rounds $rounds --size $size" >"$bench_out"
XPU_REQUIRE=cuda bx timeout -k 5 "$(fit "$budget_bench_xpu")" "$xpu" bench cuda --json --rounds "$rounds" \
  --size "$size" >"$tmp/xpu.json" 2>"$tmp/xpu.err"
xrc=$?
cat "$tmp/xpu.json" "$tmp/xpu.err" >>"$bench_out"
echo "== python3 cuda_copy_launch.py --json --rounds $rounds --size $size" >>"$bench_out"
if command -v python3 >/dev/null; then
  timeout -k 5 "$(fit "$budget_bench_torch")" python3 "$dir/cuda_copy_launch.py" --json --rounds "$rounds" \
    --size "$size" >"$tmp/torch.json" 2>"$tmp/torch.err"
  trc=$?
else
  echo '{"skipped": "python3 not found"}' >"$tmp/torch.json"
  : >"$tmp/torch.err"
  trc=0
fi
cat "$tmp/torch.json" "$tmp/torch.err" >>"$bench_out"
echo "== side by side" >>"$bench_out"
bench_note="xpu exit $xrc, torch exit $trc"
if command -v python3 >/dev/null; then
  python3 - "$tmp/xpu.json" "$tmp/torch.json" >"$tmp/table" 2>&1 <<'EOF'
import json, sys

def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except Exception as e:
        return {"error": f"unreadable: {e}"}

x, t = load(sys.argv[1]), load(sys.argv[2])
xf, tf = x.get("figures", {}), t.get("figures", {})
if "figures" not in x:
    print("xpu:", x.get("skipped") or x.get("error") or "no figures")
if "figures" not in t:
    print("torch:", t.get("skipped") or t.get("error") or "no figures")
print(f"{'figure':<10} {'unit':<5} {'xpu p50':>9} {'raw p50':>9} {'torch p50':>9} {'xpu/raw':>8} {'xpu/torch':>9}  target")
notes = []
for key in ("h2d", "d2h", "launch"):
    f, g = xf.get(key, {}), tf.get(key, {})
    unit = f.get("unit") or g.get("unit") or ""
    xv = f.get("xpu", {}).get("p50")
    rv = f.get("raw", {}).get("p50")
    tv = g.get("p50")
    throughput = unit == "GB/s"
    # Ratios are oriented so that above 1 is better for copies and below 1 is better
    # for launches, as in `xpu bench cuda`: xpu/other bandwidth, xpu/other time.
    def ratio(a, b):
        return a / b if a and b else None
    fmt = lambda v: f"{v:9.3f}" if isinstance(v, (int, float)) else f"{'-':>9}"
    xr, xt = ratio(xv, rv), ratio(xv, tv)
    target = f.get("target")
    verdict = ""
    if xr is not None and target is not None:
        ok = xr >= target if throughput else xr <= target
        verdict = f"{'>=' if throughput else '<='}{target} {'met' if ok else 'MISSED'}"
        notes.append(f"{key} {xr:.2f}{'' if ok else ' MISSED'}")
    print(f"{key:<10} {unit:<5} {fmt(xv)} {fmt(rv)} {fmt(tv)} {fmt(xr)[1:]} {fmt(xt)}  {verdict}")
print()
print("copies: xpu/raw and xpu/torch are bandwidth ratios (1.0 = as fast, higher is better);")
print("launch: time ratios (1.0 = no overhead, lower is better). p50 over the rounds (xpu and raw interleaved).")
if t.get("launch_op"):
    print("torch launch:", t["launch_op"])
if "launch_fill" in tf:
    print(f"torch 1-element fill_ + synchronize: {tf['launch_fill'].get('p50', 0):.3f} µs (p50)")
print("NOTE xpu/raw:", ", ".join(notes) if notes else "none")
EOF
  cat "$tmp/table" >>"$bench_out"
  ratios="$(sed -n 's/^NOTE xpu\/raw: //p' "$tmp/table")"
  bench_note="xpu/raw: ${ratios:-none}; torch: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("skipped: " + d["skipped"] if "skipped" in d else ("error" if "error" in d else "measured"))' "$tmp/torch.json" 2>/dev/null || echo unreadable)"
else
  echo "(no python3: no table)" >>"$bench_out"
fi
if [[ "$xrc" == 124 || "$xrc" == 137 || "$trc" == 124 || "$trc" == 137 ]]; then
  finish bench "timed out" "$bench_note; xpu exit $xrc, torch exit $trc"
elif [[ "$xrc" != 0 || "$trc" != 0 ]]; then
  finish bench failed "$bench_note; xpu exit $xrc, torch exit $trc"
else
  finish bench passed "$bench_note"
fi

# --- f. memory pool on the GPU ----------------------------------------------------------
begin memory
trace="memory/tests/data/alexnet_train.log"
# No --latency: it times 3 x 201 x 512 device allocations (cuMemAlloc + cuMemFree), tens of
# seconds on a GPU.
memory_args=(bench memory --devices cuda:0 --scenario --iterations 2)
[[ -f "$trace" ]] && memory_args+=(--trace "$trace")
echo "== xpu ${memory_args[*]}" >"$out/memory.txt"
bx timeout -k 5 "$(fit "$budget_memory")" "$xpu" "${memory_args[@]}" >>"$out/memory.txt" 2>&1
rc=$?
finish memory "$(status_of "$rc")" "exit $rc$(grep -qE '^cuda:0 +[a-z]+ +yes' "$out/memory.txt" && echo ', expandable segments')"

cat "$summary"
for s in "${steps[@]}"; do
  [[ "${state[$s]}" == passed ]] || exit 1
done
exit 0
