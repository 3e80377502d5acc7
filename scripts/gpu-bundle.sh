#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh --prebuilt needs on a GPU machine that has no Rust
# toolchain: the `xpu` command and the test executables of the `xpu-cuda` package,
# release builds without debug info, with the shared libraries they link that a stock
# image may lack, the PyTorch comparison script, and a MANIFEST. Idempotent: the
# bundle's contents are made anew on every run.
#
#   scripts/gpu-bundle.sh [DIR]        (default target/gpu-bundle, under the ignored target/)
#
# DIR/bin/xpu                     the command
# DIR/bin/cuda-lib                xpu-cuda's unit tests
# DIR/bin/cuda-<test>             xpu-cuda's integration tests (cuda-gpu, cuda-unavailable)
# DIR/lib/                        non-glibc shared libraries they need (libhwloc, libudev …)
# DIR/cuda_copy_launch.py         benches/torch/cuda_copy_launch.py
# DIR/MANIFEST                    files, sizes, git commit, build date, glibc needed
#
# Fails when DIR is over 60 MiB (what may travel with a borrowed GPU machine is 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-target/gpu-bundle}"
limit_mib=60

command -v cargo >/dev/null || { echo "gpu-bundle: cargo not found; build the bundle on a machine with Rust" >&2; exit 1; }
command -v python3 >/dev/null || { echo "gpu-bundle: python3 is needed to read cargo's JSON messages" >&2; exit 1; }

# Release without debug info: line tables alone made the binaries several times larger.
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=debuginfo
export CARGO_PROFILE_BENCH_DEBUG=0 CARGO_PROFILE_BENCH_STRIP=debuginfo

# Prints `NAME<TAB>PATH` for every executable in cargo's JSON messages on stdin; NAME is
# the bundle's name for it: `xpu` for the binary, `cuda-lib` for xpu-cuda's unit tests,
# `cuda-<target>` for its integration tests.
executables() {
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable") if m.get("reason") == "compiler-artifact" else None
    if not exe:
        continue
    t = m["target"]
    if "bin" in t["kind"] and not m.get("profile", {}).get("test"):
        name = t["name"]
    elif "lib" in t["kind"]:
        name = "cuda-lib"
    else:
        name = "cuda-" + t["name"]
    print(name + "\t" + exe)
'
}

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
echo "gpu-bundle: building xpu (release, no debug info)" >&2
cargo build --release --locked -p xpu --bin xpu --message-format=json-render-diagnostics >"$log"
mapfile -t built < <(executables <"$log")
echo "gpu-bundle: building xpu-cuda's tests (release, no debug info)" >&2
cargo test --release --locked -p xpu-cuda --no-run --message-format=json-render-diagnostics >"$log"
mapfile -t -O "${#built[@]}" built < <(executables <"$log")

rm -rf "${dir:?}/bin" "${dir:?}/lib" "${dir:?}/MANIFEST" "${dir:?}/cuda_copy_launch.py"
mkdir -p "$dir/bin" "$dir/lib"
have_xpu=0
for entry in "${built[@]}"; do
  name="${entry%%$'\t'*}"
  exe="${entry#*$'\t'}"
  cp -f "$exe" "$dir/bin/$name"
  [[ "$name" == xpu ]] && have_xpu=1
done
[[ "$have_xpu" == 1 ]] || { echo "gpu-bundle: cargo reported no xpu executable" >&2; exit 1; }
ls "$dir"/bin/cuda-* >/dev/null 2>&1 || { echo "gpu-bundle: cargo reported no xpu-cuda test executable" >&2; exit 1; }
cp -f benches/torch/cuda_copy_launch.py "$dir/cuda_copy_launch.py"

# Shared libraries: everything ldd resolves (the transitive closure) except the C and
# C++ runtimes, which every image has and which must match its own loader.
is_runtime() {
  case "$1" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | \
      librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | libnsl.so.* | \
      libstdc++.so.* | libgcc_s.so.*) return 0 ;;
    *) return 1 ;;
  esac
}
missing=()
for exe in "$dir"/bin/*; do
  while read -r soname arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    is_runtime "$soname" && continue
    if [[ "$path" == "not" ]]; then
      missing+=("$soname (needed by $(basename "$exe"))")
      continue
    fi
    [[ -e "$dir/lib/$soname" ]] || cp -fL "$path" "$dir/lib/$soname"
  done < <(ldd "$exe")
done
if ((${#missing[@]})); then
  printf 'gpu-bundle: not found by ldd here: %s\n' "${missing[@]}" >&2
  exit 1
fi

# The newest glibc symbol version the bundle needs: the GPU machine's glibc must be at
# least that (gpu-check.sh compares).
glibc_needed() {
  local f
  for f in "$dir"/bin/* "$dir"/lib/*; do
    objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' || true
  done | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -n 1
}

commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git status --porcelain 2>/dev/null)" ]]; then
  commit="$commit (plus uncommitted changes)"
fi
{
  echo "xpu GPU bundle, for: scripts/gpu-check.sh --prebuilt $dir [OUT]"
  echo "git commit: $commit"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
  echo "rustc: $(rustc --version 2>/dev/null || echo unknown)"
  echo "profile: release, CARGO_PROFILE_RELEASE_DEBUG=0, strip=debuginfo"
  echo "glibc here: $(ldd --version 2>&1 | sed -n '1s/.* //p')"
  echo "glibc needed: $(glibc_needed)"
  echo "files (bytes, path):"
  (cd "$dir" && find bin lib cuda_copy_launch.py -type f -printf '%s\t%p\n' | sort -k2)
} >"$dir/MANIFEST"

bytes="$(du -sb "$dir" | cut -f1)"
echo "gpu-bundle: $dir holds $((bytes / 1024 / 1024)) MiB ($bytes bytes)" >&2
cat "$dir/MANIFEST" >&2
if ((bytes > limit_mib * 1024 * 1024)); then
  echo "gpu-bundle: $dir is over ${limit_mib} MiB; the borrowed GPU machine takes at most 64 MiB" >&2
  exit 1
fi
