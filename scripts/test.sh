#!/usr/bin/env bash
# The README's test command: set-up, then format, lints and every test.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$KVTIDE_ROOT"
bash scripts/setup.sh
step() { printf '\n== %s\n' "$*" >&2; }
step "cargo fmt --check";  cargo fmt --all --check
step "cargo clippy";       cargo clippy --workspace --all-targets -- -D warnings
step "cargo test";         cargo test --workspace
# ---- GPU path (gpu engineer, issue 5): committed PTX is fresh and passes ptxas; the `cuda`
# feature builds, lints and tests against the extracted libcuda (GPU legs print SKIPPED here).
step "PTX freshness + ptxas"; bash scripts/check_ptx.sh
step "cuda feature: clippy";  cargo clippy -p attn-kernels -p kv-tiered --all-targets --features attn-kernels/cuda,kv-tiered/cuda -- -D warnings
step "cuda feature: tests";   LD_LIBRARY_PATH="$CUDA_LIBRARY_PATH/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cargo test -p attn-kernels -p kv-tiered --features attn-kernels/cuda,kv-tiered/cuda
# ---- end GPU path ----
step "all tests passed"
