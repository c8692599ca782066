#!/usr/bin/env python3
"""Compile attn-kernels' CUDA C sources to the committed PTX, through NVRTC (no nvcc, no GPU).

Every `attn-kernels/cuda/*.cu` is compiled for each virtual architecture in ARCHES and written
to `attn-kernels/cuda/ptx/<stem>.<arch>.ptx` (embedded by the Rust launcher with include_str!).
NVRTC comes from the PyPI wheel nvidia-cuda-nvrtc-cu12==12.4.127 (fetched by
`scripts/setup.sh cuda`), which emits PTX ISA 8.4; the script refuses any other NVRTC version
so the committed PTX stays reproducible.

Usage:
    scripts/gen_ptx.py            regenerate the committed PTX
    scripts/gen_ptx.py --check    regenerate into a temporary directory and diff against the
                                  committed PTX; exit 1 (with a diff) if anything differs
Environment: KVTIDE_CACHE (default ~/.cache/kvtide) locates the CUDA wheels.
"""
import argparse
import ctypes
import difflib
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC_DIR = ROOT / "attn-kernels" / "cuda"
PTX_DIR = SRC_DIR / "ptx"
ARCHES = ("compute_80", "compute_90")
NVRTC_VERSION = (12, 4)
PTX_ISA = ".version 8.4"


def cuda_dir() -> pathlib.Path:
    cache = pathlib.Path(os.environ.get("KVTIDE_CACHE", pathlib.Path.home() / ".cache" / "kvtide"))
    return cache / "cuda" / "nvidia"


class Nvrtc:
    """The few NVRTC entry points the script needs, with checked return codes."""

    def __init__(self, lib: pathlib.Path):
        if not lib.exists():
            sys.exit(f"gen_ptx: {lib} not found; run `scripts/setup.sh cuda` first")
        self.lib = ctypes.CDLL(str(lib))
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        if (major.value, minor.value) != NVRTC_VERSION:
            sys.exit(f"gen_ptx: NVRTC {major.value}.{minor.value} found, {NVRTC_VERSION} required")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what} failed: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def compile(self, src: pathlib.Path, arch: str, includes: list) -> bytes:
        prog = ctypes.c_void_p()
        code = src.read_bytes()
        # The program name is the bare file name so no machine path can leak into the PTX.
        self._check(
            self.lib.nvrtcCreateProgram(ctypes.byref(prog), code, src.name.encode(), 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            opts = [f"--gpu-architecture={arch}", "-std=c++17"] + [f"-I{i}" for i in includes]
            arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            rc = self.lib.nvrtcCompileProgram(prog, len(opts), arr)
            log = self._log(prog)
            if rc != 0:
                raise RuntimeError(f"{src.name} ({arch}) did not compile:\n{log}")
            if log.strip():
                print(f"gen_ptx: {src.name} ({arch}) warnings:\n{log}", file=sys.stderr)
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
            buf = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
            return buf.value
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _log(self, prog) -> str:
        size = ctypes.c_size_t()
        self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        self.lib.nvrtcGetProgramLog(prog, buf)
        return buf.value.decode(errors="replace")


def generate(out_dir: pathlib.Path) -> list:
    cuda = cuda_dir()
    nvrtc = Nvrtc(cuda / "cuda_nvrtc" / "lib" / "libnvrtc.so.12")
    includes = [str(SRC_DIR), str(cuda / "cuda_runtime" / "include")]
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sorted(SRC_DIR.glob("*.cu")):
        for arch in ARCHES:
            ptx = nvrtc.compile(src, arch, includes)
            if PTX_ISA.encode() not in ptx:
                raise RuntimeError(f"{src.name} ({arch}): expected PTX ISA {PTX_ISA}")
            path = out_dir / f"{src.stem}.{arch}.ptx"
            path.write_bytes(ptx)
            written.append(path.name)
    return written


def check() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(pathlib.Path(tmp))
        committed = sorted(p.name for p in PTX_DIR.glob("*.ptx"))
        status = 0
        for name in sorted(set(fresh) | set(committed)):
            new, old = pathlib.Path(tmp) / name, PTX_DIR / name
            if not old.exists():
                print(f"gen_ptx --check: {name} is not committed (run scripts/gen_ptx.py)")
                status = 1
            elif not new.exists():
                print(f"gen_ptx --check: {name} is committed but has no source")
                status = 1
            elif new.read_bytes() != old.read_bytes():
                diff = difflib.unified_diff(
                    old.read_text().splitlines(), new.read_text().splitlines(),
                    f"committed/{name}", f"regenerated/{name}", lineterm="", n=2)
                print("\n".join(list(diff)[:60]))
                status = 1
        if status == 0:
            print(f"gen_ptx --check: {len(fresh)} PTX files are current")
        else:
            print("gen_ptx --check: committed PTX is stale; run scripts/gen_ptx.py and commit")
        return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="diff a fresh build against the committed PTX")
    args = parser.parse_args()
    if args.check:
        return check()
    for name in generate(PTX_DIR):
        print(f"gen_ptx: wrote attn-kernels/cuda/ptx/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
