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
step "all tests passed"
