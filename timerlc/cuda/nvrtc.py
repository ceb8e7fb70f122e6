"""NVRTC, the runtime CUDA compiler that CuPy's ``RawModule`` (and so the device runtime)
compiles a module with, called directly: it needs no GPU, so the tests compile every
generated module with it as the device runtime would (``docs/cuda.md``).

The library is found in the ``nvidia-cuda-nvrtc`` wheel (``nvidia/cu13/lib``, a test
dependency on x86-64 Linux) or where the system's loader finds ``libnvrtc``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os

# the options the device runtime gives RawModule (runtime.cuda.CupyDevice.load uses these)
OPTIONS = ("-std=c++17", "--fmad=false")
# The module's text has every function a run may launch; a run compiles only those it will
# (docs/cuda.md, "What a run compiles"), defining these where it leaves some out:
NO_TF32 = "TL_NO_TF32"  # the TF32 functions (a device whose float32 products are float32)
FUSED_ONLY = "TL_FUSED_ONLY"  # the kernels of the statements fused kernels compute (unprofiled)
# the float32 functions of chains that have TF32 ones (a device whose float32 products are
# TF32 runs those: ``ChainCall.tf32``)
TF32_ONLY = "TL_TF32_ONLY"


def options(defines: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``OPTIONS`` with each of ``defines`` (``NO_TF32``, ``FUSED_ONLY``, ``TF32_ONLY``)
    defined."""
    return OPTIONS + tuple(f"-D{d}" for d in defines)


def library() -> ctypes.CDLL | None:
    """libnvrtc, or None where there is none."""
    candidates = []
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        candidates += sorted(glob.glob(os.path.join(root, "cu*", "lib", "libnvrtc.so*")))
        candidates += sorted(glob.glob(os.path.join(root, "cuda_nvrtc", "lib", "libnvrtc.so*")))
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    for path in candidates:
        if "builtins" in os.path.basename(path):
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


class NvrtcError(Exception):
    """NVRTC refused a module: its log."""


def compile_ptx(
    text: str, arch: str, lib: ctypes.CDLL | None = None, defines: tuple[str, ...] = ()
) -> tuple[str, str]:
    """(PTX, log) of ``text`` compiled for ``arch`` (``compute_90``) with the device
    runtime's options and ``defines``; ``NvrtcError`` with the log if it does not compile."""
    lib = lib or library()
    if lib is None:
        raise NvrtcError("no libnvrtc here")
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"cuda.cu", 0, None, None):
        raise NvrtcError("nvrtcCreateProgram failed")
    try:
        opts = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in options(defines)]
        result = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        text_log = log.value.decode(errors="replace")
        if result:
            raise NvrtcError(text_log or f"nvrtcCompileProgram returned {result}")
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, ptx)
        return ptx.value.decode(errors="replace"), text_log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
