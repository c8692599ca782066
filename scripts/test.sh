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
# (The proptest strategies of kv-sparse, projection, attn-kernels and kv-tiered are enabled for
# their own tests by a dev-dependency on themselves, so `cargo test` runs their property tests.)
step "MSRV: declared, checked against the installed toolchain"; bash scripts/msrv.sh
step "custom-runtime composes the lower crates without libtorch"
if cargo tree -p custom-runtime -e normal,build --prefix none | grep -q '^torch-sys '; then
  echo "custom-runtime depends on torch-sys" >&2; exit 1
fi
# ---- GPU path: committed PTX is fresh and passes ptxas; the `cuda`
# feature builds, lints and tests against the extracted libcuda (GPU legs print SKIPPED here).
step "PTX freshness + ptxas"; bash scripts/check_ptx.sh
step "cuda feature: clippy";  cargo clippy -p attn-kernels -p kv-tiered --all-targets --features attn-kernels/cuda,kv-tiered/cuda -- -D warnings
step "cuda feature: tests";   LD_LIBRARY_PATH="$CUDA_LIBRARY_PATH/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cargo test -p attn-kernels -p kv-tiered --features attn-kernels/cuda,kv-tiered/cuda
# ---- end GPU path ----
step "publishable crates: cargo package, cuda check of the packages, docs -D missing_docs"
bash scripts/package.sh --allow-dirty
# ---- Paper reproduction at CI scale: every enforced check (premise vs transformers
# fixtures, lossless settings == dense, audio lossless WER 0) must pass; exits 1 otherwise.
# Reuses the dev-profile kvtide that `cargo test` just built (no extra release build).
step "kvtide reproduce --quick"
repro_out="$(mktemp -d)"; trap 'rm -rf "$repro_out"' EXIT
cargo run -q -p kvtide --bin kvtide -- reproduce --quick --out "$repro_out"
step "all tests passed"
