#!/usr/bin/env bash
# The decode loop of the speed issue: SmolLM2-135M, 2 048 prefilled tokens, 128 decoded
# through each cache, every cache once per round, the order reversed every other round (the
# cache decoded first tends to run fastest). One JSON line per (round, cache) on stdout.
# Usage: results/bench-attn/decode-loop/run.sh [ROUNDS] > rounds.jsonl
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../../scripts/env.sh"
rounds=${1:-4}
bin="$CARGO_TARGET_DIR/release/kvtide"
caches=(
  "dense"
  "dense:format=int8,b=128"
  "dense:format=int4,b=128"
  "dense:format=int4,b=128,queries=int8"
  "kivi:bits=2,group=32,b=128"
  "turbo:bits=3,b=128"
  "swan:k=32,kv=32,b=128,index=bitmask,value=int8"
)
for r in $(seq 1 "$rounds"); do
  order=("${caches[@]}")
  if (( r % 2 == 0 )); then
    order=(); for ((i = ${#caches[@]} - 1; i >= 0; i--)); do order+=("${caches[i]}"); done
  fi
  for c in "${order[@]}"; do
    "$bin" eval-ppl --tokens 2176 --prefix 2048 --torch-threads 2 --cache "$c" --json |
      python3 -c 'import json, sys
r = json.load(sys.stdin)["results"][0]
print(json.dumps({"round": int(sys.argv[1]), "spec": sys.argv[2], "cache": r["cache"],
                  "tok_s": r["decode_tokens_per_s"], "perplexity": r["perplexity"]}))' "$r" "$c"
  done
done
