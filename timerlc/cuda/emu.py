"""Running the CUDA C text of ``timerlc.cuda.render`` on the CPU: compiled by the host C++
compiler with ``emu.h`` (one block of threads as std::threads meeting at a barrier), each
kernel ``NAME`` callable as ``NAME_emu(table, args, scratch) -> code``, the signature of the
LLVM kernels, so that the cpu runtime can run a plan's statements with them (tests and
debugging: ``docs/cuda.md``)."""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

HEADER = Path(__file__).with_name("emu.h")
KERNEL = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def compiler() -> str | None:
    """The host C++ compiler (``c++``, ``g++`` or ``clang++``), or None."""
    for cc in ("c++", "g++", "clang++"):
        path = shutil.which(cc)
        if path:
            return path
    return None


class EmuModule:
    """The kernels of a CUDA C text, compiled for the host (cached by the text's hash in
    ``folder``, default a temporary folder)."""

    def __init__(self, text: str, folder: str | Path | None = None):
        cc = compiler()
        if cc is None:
            raise RuntimeError("no host C++ compiler (c++, g++ or clang++) to emulate CUDA")
        key = hashlib.sha256((text + HEADER.read_text()).encode()).hexdigest()[:16]
        out = Path(folder or tempfile.mkdtemp(prefix="timerlc-emu-"))
        lib = out / f"emu-{key}.so"
        if not lib.exists():
            src = out / f"emu-{key}.cu"
            src.write_text(text)
            cmd = [cc, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-DTL_EMU"]
            cmd += ["-include", str(HEADER), "-x", "c++", str(src), "-o", str(lib) + ".tmp"]
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise RuntimeError(
                    f"the host compiler refused the CUDA C text:\n{r.stderr[:4000]}"
                )
            Path(str(lib) + ".tmp").replace(lib)
        self.lib = ctypes.CDLL(str(lib))
        self._functions: dict[str, object] = {}

    def function(self, name: str):
        fn = self._functions.get(name)
        if fn is None:
            addr = ctypes.cast(getattr(self.lib, f"{name}_emu"), ctypes.c_void_p).value
            fn = self._functions[name] = KERNEL(addr)
        return fn
