#!/usr/bin/env bash
# MSRV check within what an offline machine allows (no older toolchain can be installed):
# every publishable crate declares `rust-version`, the installed rustc is at least that, and
# no normal or build dependency (all features, this platform) declares a newer one.
# Standard-library APIs newer than the declared version are rejected separately by clippy's
# `incompatible_msrv` lint under `-D warnings`. Language features are not checked here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
meta="$(mktemp)"; trap 'rm -f "$meta"' EXIT
cargo metadata --format-version 1 --all-features \
  --filter-platform "$(rustc -vV | sed -n 's/^host: //p')" > "$meta"
rustc_version="$(rustc --version | awk '{print $2}')"
python3 - "$meta" "$rustc_version" <<'PY'
import json, sys
meta, installed = json.load(open(sys.argv[1])), sys.argv[2]
PUBLISHED = ("kv-sparse", "kvtide-projection", "attn-kernels", "kv-tiered")
def ver(s):
    return tuple(int(x) for x in s.split("-")[0].split(".")) + (0, 0)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
failures = []
for p in meta["packages"]:
    if p["name"] not in PUBLISHED or p["source"] is not None:
        continue
    msrv = p.get("rust_version")
    if not msrv:
        failures.append(f"{p['name']}: no rust-version")
        continue
    if ver(installed)[:3] < ver(msrv)[:3]:
        failures.append(f"{p['name']}: rust-version {msrv} above the installed rustc {installed}")
    seen, stack = set(), [p["id"]]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        for d in nodes[i]["deps"]:
            if any(k["kind"] in (None, "build") for k in d["dep_kinds"]):
                stack.append(d["pkg"])
    for i in seen - {p["id"]}:
        dep = packages[i]
        rv = dep.get("rust_version")
        if rv and ver(rv)[:3] > ver(msrv)[:3]:
            failures.append(f"{p['name']} (rust-version {msrv}) depends on {dep['name']} {dep['version']} (rust-version {rv})")
    print(f"{p['name']}: rust-version {msrv}, {len(seen) - 1} dependencies, none newer; installed rustc {installed}")
if failures:
    print("MSRV check failed:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
PY
