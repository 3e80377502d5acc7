#!/usr/bin/env bash
# Builds benches/starpu/taskbench.c (Task Bench on StarPU) against the newest StarPU that
# pkg-config knows (Debian's libstarpu-dev: starpu-1.3) into DIR/taskbench (default
# target/starpu) and prints that path. Exits 2, saying so, when StarPU or a C compiler
# is missing.
#
#   benches/starpu/build.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-target/starpu}"
cc="${CC:-cc}"
if ! command -v pkg-config >/dev/null 2>&1; then
  echo "build.sh: pkg-config not found; install Debian's pkg-config and libstarpu-dev" >&2
  exit 2
fi
module="$(pkg-config --list-all 2>/dev/null | awk '{print $1}' | grep -E '^starpu-[0-9]+\.[0-9]+$' | sort -V | tail -n 1 || true)"
if [ -z "$module" ]; then
  echo "build.sh: StarPU is not installed (pkg-config lists no starpu-1.x module); install it with 'apt-get install -y libstarpu-dev' (Debian)" >&2
  exit 2
fi
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "build.sh: no C compiler ($cc); install Debian's build-essential" >&2
  exit 2
fi
read -r -a flags <<<"$(pkg-config --cflags --libs "$module")"
mkdir -p "$out"
"$cc" -std=gnu11 -O2 -Wall -Wextra -o "$out/taskbench" benches/starpu/taskbench.c "${flags[@]}" -lm
echo "$out/taskbench"
