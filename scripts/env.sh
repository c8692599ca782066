# Sourced by the project's scripts: one fixed cache directory and one fixed target
# directory, so every clone (CI's fresh ones included) reuses the same libtorch and
# the same compiled dependencies. LIBTORCH is absolute and stable for the same reason:
# a change in its value makes torch-sys rebuild its C++ shim.
KVTIDE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export KVTIDE_CACHE=${KVTIDE_CACHE:-$HOME/.cache/kvtide}
export LIBTORCH=$KVTIDE_CACHE/libtorch/torch
export CUDA_LIBRARY_PATH=$KVTIDE_CACHE/cuda
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$KVTIDE_CACHE/target}
