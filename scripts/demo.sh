#!/usr/bin/env bash
# The README's main job: set-up, then the kvtide CLI on its default real model and text.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$KVTIDE_ROOT"
bash scripts/setup.sh
cargo run --release -q -p kvtide --bin kvtide -- "$@"
