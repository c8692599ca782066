#!/usr/bin/env bash
# Runs the libFuzzer targets one after another (single job, `nice -n 15`), each for
# FUZZ_SECONDS (default 600), starting from the committed seeds (fuzz/seeds/<target>) and a
# working corpus kept in fuzz/corpus/<target> (git-ignored). Logs with libFuzzer's final
# stats (execs, coverage) go to fuzz/logs/<target>.log; crashing inputs land in
# fuzz/artifacts/<target>/ — copy each to fuzz/regressions/<target>/ once fixed, where
# integration-tests/tests/fuzz_parsers.rs replays it in CI.
#
# Needs cargo-fuzz and a nightly toolchain (`rustup toolchain install nightly`,
# `cargo install cargo-fuzz`). Usage: fuzz/run.sh [target...]   (default: all five)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
. ../scripts/env.sh
unset CARGO_TARGET_DIR # the fuzz project keeps its own target dir (sanitizer flags)
secs=${FUZZ_SECONDS:-600}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(persist projection wav gguf config)
mkdir -p logs
export CARGO_BUILD_JOBS=1
for t in "${targets[@]}"; do
    nice -n 15 cargo +nightly fuzz build -a "$t"
    mkdir -p "corpus/$t"
    echo "== $t: ${secs}s from $(date -u +%H:%M:%S)" | tee "logs/$t.log"
    nice -n 15 cargo +nightly fuzz run -a "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=4096 -malloc_limit_mb=2048 -timeout=30 \
        -print_final_stats=1 2>&1 | grep -v -E '^#[0-9]+.*(NEW|REDUCE)' >>"logs/$t.log" || true
    tail -n 25 "logs/$t.log"
done
