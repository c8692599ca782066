#!/usr/bin/env bash
# Checks attn-kernels' committed PTX without a GPU:
#   1. freshness: scripts/gen_ptx.py --check regenerates every PTX with NVRTC into a temporary
#      directory and diffs it against attn-kernels/cuda/ptx (fails on any difference);
#   2. validity: ptxas assembles every committed PTX for each real architecture it can target —
#      compute_80 PTX for sm_80 AND sm_90 (the driver JIT path on Hopper), compute_90 PTX for
#      sm_90 (ptxas cannot lower a .target sm_90 module to sm_80). Register and spill figures
#      of every kernel are printed (ptxas -v) and saved to $PTXAS_REPORT if set.
# Tools come from scripts/setup.sh cuda (NVRTC 12.4 and ptxas 12.4 from PyPI wheels).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${KVTIDE_CACHE:-$HOME/.cache/kvtide}
PTXAS=$CACHE/cuda/nvidia/cuda_nvcc/bin/ptxas
PTX_DIR=$ROOT/attn-kernels/cuda/ptx
[ -x "$PTXAS" ] || { echo "check_ptx: $PTXAS missing; run scripts/setup.sh cuda" >&2; exit 1; }

python3 "$ROOT/scripts/gen_ptx.py" --check

report=$(mktemp)
trap 'rm -f "$report" "$report.cubin"' EXIT
n=0
for ptx in "$PTX_DIR"/*.ptx; do
  case "$ptx" in
    *.compute_80.ptx) arches="sm_80 sm_90" ;;
    *.compute_90.ptx) arches="sm_90" ;;
    *) echo "check_ptx: unexpected file $ptx" >&2; exit 1 ;;
  esac
  for arch in $arches; do
    echo "== $(basename "$ptx") -> $arch" >>"$report"
    if ! "$PTXAS" -arch="$arch" -v "$ptx" -o "$report.cubin" >>"$report" 2>&1; then
      cat "$report" >&2
      echo "check_ptx: ptxas -arch=$arch failed on $(basename "$ptx")" >&2
      exit 1
    fi
    n=$((n + 1))
  done
done

# One line per kernel and architecture: registers, spills, stack.
awk '
  /^== / { file = $2; arch = $4 }
  /Compiling entry function/ { gsub(/\047/, "", $7); kernel = $7 }
  /bytes stack frame/ { stack = $1; spill_st = $5; spill_ld = $9 }
  /Used [0-9]+ registers/ {
    printf "%-28s %-6s %-34s regs %3d  stack %4d  spill st/ld %d/%d\n", file, arch, kernel, $5, stack, spill_st, spill_ld
  }' "$report" | tee "${PTXAS_REPORT:-/dev/null}"
if grep -q "warning" "$report"; then
  grep "warning" "$report" >&2
  echo "check_ptx: ptxas warnings (see above)" >&2
  exit 1
fi
echo "check_ptx: $n ptxas runs passed"
