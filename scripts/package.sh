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
# the same version would be read from its stale unpacked copy and stale build. So the
# verification builds in a target directory of its own, where only those registry copies
# carry the crates' names, and both the copies and their builds go first.
pkg_target="$KVTIDE_CACHE/package-target"
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/{kv-sparse,kvtide-projection,attn-kernels,kv-tiered}-*
if [ -d "$pkg_target" ]; then
  CARGO_TARGET_DIR="$pkg_target" cargo clean -q --profile dev "${crates[@]/#/-p}"
fi
CARGO_TARGET_DIR="$pkg_target" cargo publish --dry-run "${crates[@]/#/-p}" "$@"
# The `.crate` files as uploaded (a dry run keeps them in cargo's scratch registry): packed
# again, unverified (just verified), fresh.
rm -f "$pkg_target"/package/*.crate
CARGO_TARGET_DIR="$pkg_target" cargo package -q --no-verify "${crates[@]/#/-p}" "$@"
version="$(cargo metadata --format-version 1 --no-deps | python3 -c \
  'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "kv-sparse"))')"
unpacked="$(mktemp -d)"; trap 'rm -rf "$unpacked"' EXIT
for c in "${crates[@]}"; do
  crate="$pkg_target/package/$c-$version.crate"
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
