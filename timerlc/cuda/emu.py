"""Running the CUDA C text of ``timerlc.cuda.render`` on the CPU: compiled by the host C++
compiler with ``emu.h`` (a block's threads as fibers run in turns between barriers), each
function ``NAME`` callable as ``fn(table, args, nargs, scratch, err, blocks, shift)`` (through
the module's one entry, ``tl_emu_launch``): it runs over ``blocks`` blocks, its ``nargs``
loop values read from the host's array ``args`` (as a GPU's launch passes them), and a
failing one sets ``*err`` (the device runtime's ``EmuDevice``: the ``cuda-emu`` backend,
tests and debugging: ``docs/cuda.md``).

Two parts are compiled once per compiler and kept in the user's cache folder
(``$XDG_CACHE_HOME/timerlc/emu``, else ``~/.cache/timerlc/emu``; a temporary folder where
neither can be written): the threads of the emulation (``emu_rt.cc``, a library loaded
globally before any module; the modules use its symbols), and, as a precompiled header,
``emu.h`` with the text every module starts with (``render.head()``: the scalar helpers and
the Philox library). A module then costs only its own kernels' compile.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HEADER = Path(__file__).with_name("emu.h")
RUNTIME = Path(__file__).with_name("emu_rt.cc")
# tl_emu_launch(function, table, args, nargs, scratch, err, blocks, shift): the module's
# entry to each of its functions (``prelude.PRELUDE``)
LAUNCH = ctypes.CFUNCTYPE(
    None,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_uint,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_uint,
    ctypes.c_void_p,
)
# tl_set_shift_emu(shift, index, n, d, blocks) (cuda.prelude.SHIFT_KERNEL)
SHIFT = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_uint
)
# modules unoptimized: most are compiled to run a few thousand launches of small grids,
# where the threads' meetings take the time; g++ took 2-4x longer at -O1 (PPO's module at
# the tests' sizes 13.6 -> 3.1 s), and the runs measured were as fast or faster at -O0
# (the products' tests' large shapes included: their joint functions' 19.5 -> 14.6 s)
FLAGS = ("-std=c++20", "-O0", "-fPIC", "-pthread", "-DTL_EMU")


def compiler() -> str | None:
    """The host C++ compiler (``c++``, ``g++`` or ``clang++``), or None."""
    for cc in ("c++", "g++", "clang++"):
        path = shutil.which(cc)
        if path:
            return path
    return None


def _run(cmd: list[str], what: str):
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"the host compiler refused {what}:\n{r.stderr[:4000]}")


def _cache_folder() -> Path:
    """The user's own cache folder (``files.user_cache``: the libraries there are loaded as
    code), else a private temporary one."""
    from timerlc.files import user_cache

    folder = user_cache("emu")
    try:
        if folder is not None:
            probe = folder / f".probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
            return folder
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="timerlc-emu-"))


_BUILT: dict[str, Path] = {}  # per compiler, flags and text: the file made once


@functools.cache
def _version(cc: str) -> str:
    """What ``cc --version`` prints (asked once a process: every module's load keys the
    threads' library and the precompiled head by it)."""
    return subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout


def _once(cc: str, text: str, name: str, flags: list[str], product: str) -> Path:
    """``text`` written as ``name`` in a cache folder of its own and compiled there once
    (``flags``, then the file), into ``product``: its path. Both are renamed into place,
    the source first, so that another process that finds the product finds the source."""
    parts = (cc, _version(cc), " ".join(FLAGS + tuple(flags)), text)
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    if key in _BUILT:
        return _BUILT[key]
    folder = _cache_folder() / key[:16]
    if not (folder / product).is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="build-", dir=folder))
        (tmp / name).write_text(text)
        _run([cc, *FLAGS, *flags, str(tmp / name), "-o", str(tmp / product)], f"{name}")
        (tmp / name).replace(folder / name)
        (tmp / product).replace(folder / product)
        shutil.rmtree(tmp, ignore_errors=True)
    _BUILT[key] = folder / product
    return _BUILT[key]


def precompiled_head(cc: str, head: str) -> Path:
    """The header ``emu.h`` + ``head``, compiled once (its ``.gch`` beside it, with the
    modules' ``FLAGS``: g++ takes a precompiled header only where the optimization matches):
    the path to ``-include``."""
    text = HEADER.read_text().replace("#pragma once\n", "") + "\n" + head
    return _once(cc, text, "head.h", ["-x", "c++-header"], "head.h.gch").with_suffix("")


_LOADED: set[Path] = set()


def runtime_library(cc: str) -> Path:
    """The emulation's threads (``emu_rt.cc``: fibers) as a shared library, compiled once
    (and optimized: the switches every barrier makes)."""
    return _once(cc, RUNTIME.read_text(), "emu_rt.cc", ["-O1", "-shared"], "emu_rt.so")


def load_runtime(cc: str):
    """The emulation's threads (``emu_rt.cc``), compiled once and loaded globally: the
    modules' ``threadIdx``, ``blockDim``, ``tl_emu_run`` and ``tl_emu_sync``."""
    lib = runtime_library(cc)
    if lib not in _LOADED:
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        _LOADED.add(lib)


# a folder that keeps the modules compiled without a folder of their own (the test suite's:
# one for a session, its processes sharing what one compiled); unset: a temporary folder
MODULES_ENV = "TIMERLC_EMU_MODULES"


class EmuModule:
    """The kernels of a CUDA C text, compiled for the host (kept by the text's hash in
    ``folder``; without one, in ``$TIMERLC_EMU_MODULES`` where set, else in a temporary
    folder removed once the library is loaded); ``defines``: the macros the compile defines
    (``nvrtc.NO_TF32``, ``TF32_ONLY``, ``FUSED_ONLY``: what a run leaves out of the module, as
    the GPU's compile does). Processes may share a folder: each compiles into files of
    their own and renames the library into place."""

    def __init__(self, text: str, folder: str | Path | None = None, defines: tuple[str, ...] = ()):
        self.defines = tuple(defines)
        self.cached = False  # whether the library was found in ``folder``, not compiled
        if folder is None and os.environ.get(MODULES_ENV):
            folder = Path(os.environ[MODULES_ENV])
        loaded = False
        if folder is not None:
            try:
                Path(folder).mkdir(parents=True, exist_ok=True)
                self._load(text, Path(folder))
                loaded = True
            except OSError:  # a folder it cannot write (a build's, read-only): as without
                pass
        if not loaded:
            with tempfile.TemporaryDirectory(prefix="timerlc-emu-") as tmp:
                self._load(text, Path(tmp))  # loaded: its file is not needed any more
        self._functions: dict[str, object] = {}
        self._launch = None

    def _load(self, text: str, out: Path):
        from timerlc.cuda.render import head

        cc = compiler()
        if cc is None:
            raise RuntimeError("no host C++ compiler (c++, g++ or clang++) to emulate CUDA")
        load_runtime(cc)
        flags = [f"-D{d}" for d in self.defines]
        # (the library uses the threads' library's symbols: its text is in the key too)
        parts = (text, HEADER.read_text(), RUNTIME.read_text(), " ".join(FLAGS + tuple(flags)))
        key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
        lib = out / f"emu-{key}.so"
        self.cached = lib.exists()
        if not lib.exists():
            mine = f".{os.getpid()}.tmp"  # (another process may compile the same text)
            src = out / f"emu-{key}.cu"
            fixed = head()
            at = text.find(fixed)
            if at >= 0:  # the module's own text only, after the precompiled part
                include = precompiled_head(cc, fixed)
                Path(str(src) + mine).write_text(text[:at] + text[at + len(fixed) :])
            else:
                include = HEADER
                Path(str(src) + mine).write_text(text)
            cmd = [cc, *FLAGS, *flags, "-shared", "-include", str(include), "-x", "c++"]
            _run(cmd + [str(src) + mine, "-o", str(lib) + mine], "the CUDA C text")
            Path(str(src) + mine).replace(src)
            Path(str(lib) + mine).replace(lib)
        self.lib = ctypes.CDLL(str(lib))

    def function(self, name: str):
        """``NAME`` as ``fn(table, args, nargs, scratch, err, blocks, shift)``
        (``tl_set_shift``: ``fn(shift, index, n, d, blocks)``)."""
        fn = self._functions.get(name)
        if fn is None:
            if name == "tl_set_shift":
                addr = ctypes.cast(self.lib.tl_set_shift_emu, ctypes.c_void_p).value
                fn = SHIFT(addr)
            else:
                if self._launch is None:
                    try:
                        entry = self.lib.tl_emu_launch
                    except AttributeError:
                        raise RuntimeError(
                            "the module has no tl_emu_launch (its text does not start with "
                            "cuda.render.head())"
                        ) from None
                    self._launch = LAUNCH(ctypes.cast(entry, ctypes.c_void_p).value)
                addr = ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value
                fn = functools.partial(self._launch, addr)
            self._functions[name] = fn
        return fn
