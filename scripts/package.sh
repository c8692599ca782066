#!/usr/bin/env bash
# The publishable crates as crates.io would receive them: `cargo publish --dry-run` (which
# packages each crate and builds it against the others' packages, default features), then
# the packaged attn-kernels and kv-tiered checked again with `--features cuda` (the PTX they
# embed must be in the package), and the docs built with missing docs and doc warnings as
# errors.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$KVTIDE_ROOT"
crates=(kv-sparse kvtide-projection attn-kernels kv-tiered)
# Cargo verifies each package against its siblings' packages through a local overlay
# registry and takes registry packages as immutable: a sibling changed since the last run at
# the same version would be read from its stale unpacked copy and stale build, so both go
# first.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/{kv-sparse,kvtide-projection,attn-kernels,kv-tiered}-*
cargo clean --profile dev "${crates[@]/#/-p}"
cargo publish --dry-run "${crates[@]/#/-p}" "$@"
version="$(cargo metadata --format-version 1 --no-deps | python3 -c \
  'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "kv-sparse"))')"
unpacked="$(mktemp -d)"; trap 'rm -rf "$unpacked"' EXIT
for c in "${crates[@]}"; do
  crate="$CARGO_TARGET_DIR/package/$c-$version.crate"
  printf '%s: %s bytes\n' "$c" "$(stat -c %s "$crate")"
  tar xzf "$crate" -C "$unpacked"
done
# A workspace of the unpacked crates, each registry dependency on a sibling patched to it.
{
  printf '[workspace]\nresolver = "3"\nmembers = [%s]\n\n[patch.crates-io]\n' \
    "$(printf '"%s-'"$version"'", ' "${crates[@]}")"
  for c in "${crates[@]}"; do printf '%s = { path = "%s-%s" }\n' "$c" "$c" "$version"; done
} > "$unpacked/Cargo.toml"
LD_LIBRARY_PATH="$CUDA_LIBRARY_PATH/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cargo check --manifest-path "$unpacked/Cargo.toml" -p attn-kernels -p kv-tiered \
  --features attn-kernels/cuda,kv-tiered/cuda
RUSTDOCFLAGS="-D missing_docs -D warnings" cargo doc --no-deps "${crates[@]/#/-p}" \
  --features kv-sparse/proptest,kvtide-projection/proptest,attn-kernels/proptest,kv-tiered/proptest
