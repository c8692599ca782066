#!/usr/bin/env bash
# Regenerates the seed corpora fuzz/seeds/<target>/ from the harnesses' seeds() (valid files
# built with each crate's own writer). The same seeds feed the in-tree mutated-valid fuzzing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rm -rf fuzz/seeds
cargo test -p integration-tests --test fuzz_parsers -- --ignored write_fuzz_seed_corpora
ls -l fuzz/seeds/*
