#!/usr/bin/env bash
# Runs the test suites that exercise kvtide's unsafe code under valgrind memcheck:
#
#   kv-sparse    persist          mmap views of cache files (MappedCache::open), CSR views
#   kv-sparse    lib unit tests   persist/mapped.rs and the byte-level decoders
#   attn-kernels kernels, errors  AVX2 kernels (31 unsafe blocks), tile + thread pool
#   projection   lib unit tests   AVX2 row kernel (rotate.rs) and the GEMM (gemm.rs)
#   models       lib unit tests   host.rs (slices over libtorch tensor storage), gguf mmap
#   models       gguf             GGUF files through mmap and from bytes
#   kv-tiered    tier_contract    host tier pages, arenas and the recall worker threads
#   integration  fuzz_parsers     every parser on fuzzed bytes (FUZZ_CASES cut to 200)
#
# A suite passes when valgrind reports zero errors and no definite leaks (exit code 99
# otherwise); "possibly lost"/"still reachable" blocks belong to libtorch's and the test
# harness's process-lifetime allocations and are reported but not failed. One libtorch-internal
# false positive is suppressed, with the evidence, in scripts/valgrind/libtorch.supp (the
# summary line shows how many reports each run suppressed). The CUDA tier's
# pinned buffers need a GPU and valgrind cannot follow the driver; see docs/bad-inputs.md.
#
# Usage: scripts/memcheck.sh [suite-name...]   (names as in the table above, e.g.
# `kv-sparse:persist`); logs go to $MEMCHECK_LOGS (default results/tmp/memcheck).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$KVTIDE_ROOT"
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 2; }
logs=${MEMCHECK_LOGS:-$KVTIDE_ROOT/results/tmp/memcheck}
mkdir -p "$logs"

# name | cargo selector | test-binary arguments (filters keep the slowest cases out)
suites=(
    "kv-sparse:persist|-p kv-sparse --test persist|"
    "kv-sparse:lib|-p kv-sparse --lib|"
    "attn-kernels:kernels|-p attn-kernels --test kernels|"
    "attn-kernels:errors|-p attn-kernels --test errors|"
    "projection:lib|-p kvtide-projection --lib|"
    "models:lib|-p models --lib|host"
    "models:gguf|-p models --test gguf|--skip real_model"
    "kv-tiered:tier_contract|-p kv-tiered --test tier_contract|"
    "integration:fuzz_parsers|-p integration-tests --test fuzz_parsers|"
)

# The test executable cargo builds for a selector, and its package directory (tab-separated).
binary_for() {
    # shellcheck disable=SC2086 # the selector is a word list
    cargo test -j 2 $1 --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"] + "\t" + m["manifest_path"].rsplit("/", 1)[0])' | tail -n 1
}

want=("$@")
failed=0
for entry in "${suites[@]}"; do
    IFS='|' read -r name selector args <<<"$entry"
    if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" $name "* ]]; then continue; fi
    IFS=$'\t' read -r bin dir < <(binary_for "$selector") || true
    [ -n "$bin" ] || { echo "$name: no test binary built" >&2; failed=1; continue; }
    log="$logs/${name/:/-}.log"
    echo "== $name: $(basename "$bin") $args" >&2
    # shellcheck disable=SC2086 # test filters are a word list
    if (cd "$dir" &&
        FUZZ_CASES=200 PROPTEST_CASES=32 RUST_TEST_THREADS=2 nice -n 10 \
            valgrind --tool=memcheck --error-exitcode=99 --leak-check=full \
            --show-leak-kinds=definite --errors-for-leak-kinds=definite \
            --track-origins=yes --suppressions="$KVTIDE_ROOT/scripts/valgrind/libtorch.supp" \
            --log-file="$log" "$bin" $args >"$log.out" 2>&1); then
        status=clean
    else
        status=FAILED
        failed=1
    fi
    summary=$(grep -E "ERROR SUMMARY|definitely lost" "$log" | sed 's/^==[0-9]*== //' | tr '\n' ' ')
    summary="$(grep -h "^test result" "$log.out" | tr '\n' ' ')— $summary"
    echo "$name: $status — $summary" | tee -a "$logs/summary.txt"
done
exit $failed
