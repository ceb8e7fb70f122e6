"""Native code: LLVM IR text made by the code generator, compiled for this CPU by llvmlite
(``O3``, the host's features) and called through ``ctypes``.

The runtime only loads text the compiler wrote (a build folder's ``kernels/*.ll``, checked
against the plan's hash of it first): it never generates code itself.
"""

from __future__ import annotations

import ctypes
import threading

_INIT = threading.Lock()
_READY = False
KERNEL = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
# a tree function: (table, args, scratch, host, err)
TREE = ctypes.CFUNCTYPE(ctypes.c_int32, *([ctypes.c_void_p] * 5))
# the runtime's callback: (statement, mode, loop values)
HOST = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)


def _llvm():
    global _READY
    import llvmlite.binding as llvm

    with _INIT:
        if not _READY:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _READY = True
    return llvm


def target_machine():
    llvm = _llvm()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
    )


OPTIONS = "O3 vectorize no-slp no-unroll no-interleave 2"  # a change invalidates the cache


class NativeModule:
    """A module of kernels compiled for this machine; ``function(name)`` is a ctypes
    function ``int32(table, args, scratch)``, ``address(name)`` any function's address.

    With a ``cache`` folder (a build's ``kernels/``), the machine code is kept there as
    ``cpu-KEY.o`` (KEY: a hash of the LLVM IR text, this CPU and its features, llvmlite's
    version and the optimization options) with the SHA-256 of its bytes beside it, and a
    later run of the build loads it instead of compiling again (``cached`` says whether it
    did). A cached object whose bytes do not match their hash is ignored and compiled
    again.

    (Compiling parts of a module in threads gains nothing: llvmlite serializes its calls
    into LLVM with one lock.)"""

    def __init__(self, text: str, cache=None):
        import hashlib
        import os

        import llvmlite

        llvm = _llvm()
        self.tm = target_machine()
        key = hashlib.sha256(
            "\0".join(
                [
                    text,
                    llvm.get_host_cpu_name(),
                    llvm.get_host_cpu_features().flatten(),
                    llvmlite.__version__,
                    OPTIONS,
                ]
            ).encode()
        ).hexdigest()[:24]
        path = None if cache is None else os.path.join(os.fspath(cache), f"cpu-{key}.o")
        obj = _read_object(path) if path else None
        self.cached = obj is not None
        mod = llvm.parse_assembly(text)
        mod.verify()
        if obj is None:
            pto = llvm.create_pipeline_tuning_options(speed_level=3)
            pto.loop_vectorization = True
            # unrolling multiplies the code (and LLVM's time) by five for little gain on
            # loops of a few hundred iterations; SLP vectorizing finds little in kernels
            # whose loops vectorize, for a tenth of the time
            pto.slp_vectorization = False
            pto.loop_unrolling = False
            pto.loop_interleaving = False
            pb = llvm.create_pass_builder(self.tm, pto)
            pm = pb.getModulePassManager()
            pm.run(mod, pb)
        self.module = mod
        self.engine = llvm.create_mcjit_compiler(mod, self.tm)
        made: list[bytes] = []
        self.engine.set_object_cache(
            lambda _module, buf: made.append(bytes(buf)), lambda _module: obj
        )
        self.engine.finalize_object()
        if path and obj is None and made:
            _write_object(path, made[0])
        self._functions: dict[str, object] = {}
        self.blas = None
        for which in ("s", "d"):
            at = self.engine.get_global_value_address(f"tl_{which}gemm")
            if at:  # the kernels call a gemm: give them the BLAS's, if there is one
                self.blas = self.blas or cblas()
                if self.blas is not None:
                    ctypes.c_void_p.from_address(at).value = self.blas[which]

    def address(self, name: str) -> int:
        addr = self.engine.get_function_address(name)
        if not addr:
            raise KeyError(f"no function {name} in the native module")
        return addr

    def function(self, name: str):
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = KERNEL(self.address(name))
        return fn


def _read_object(path: str) -> bytes | None:
    """A cached object file, if it is there and its bytes match their recorded hash."""
    import hashlib

    try:
        with open(path, "rb") as f:
            data = f.read()
        with open(path + ".sha256") as f:
            want = f.read().strip()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == want else None


def _write_object(path: str, data: bytes) -> None:
    """Keep a compiled object (a cache: a folder that cannot be written is no error)."""
    import hashlib
    import os

    try:
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        with open(tmp, "w") as f:
            f.write(hashlib.sha256(data).hexdigest() + "\n")
        os.replace(tmp, path + ".sha256")
    except OSError:
        pass


_CBLAS: list = []


def cblas() -> dict[str, int] | None:
    """The addresses of ``sgemm`` and ``dgemm`` of a CBLAS with 64-bit integers (the
    OpenBLAS that NumPy's wheels bundle), or None (the kernels' own loops run instead)."""
    if _CBLAS:
        return _CBLAS[0]
    found = None
    try:
        import glob
        import os

        import numpy

        libs = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
        names = sorted(glob.glob(os.path.join(libs, "libscipy_openblas64_*.so*")))
        names += sorted(glob.glob(os.path.join(libs, "libopenblas64_*.so*")))
        for path in names:
            lib = ctypes.CDLL(path)
            for prefix, suffix in (("scipy_cblas_", "64_"), ("cblas_", "64_")):
                try:
                    s = getattr(lib, f"{prefix}sgemm{suffix}")
                    d = getattr(lib, f"{prefix}dgemm{suffix}")
                except AttributeError:
                    continue
                found = {
                    "s": ctypes.cast(s, ctypes.c_void_p).value,
                    "d": ctypes.cast(d, ctypes.c_void_p).value,
                }
                break
            if found:
                break
    except OSError:
        found = None
    _CBLAS.append(found)
    return found


def check_kernels(plan, text: str, where: str = "the build folder") -> None:
    """``PlanError`` unless ``text`` is the kernel file of ``plan``: its SHA-256 is the
    plan's record of it, and it was generated for this very plan (its first line holds the
    plan's digest)."""
    import hashlib

    from timerlc.plan.items import KERNELS_HEADER, PlanError, digest

    k = plan.kernels
    if k is None:
        raise PlanError(f"{where}: the plan has no kernels: compile the program again")
    if hashlib.sha256(text.encode()).hexdigest() != k.sha256:
        raise PlanError(
            f"{where}: {k.file} does not match the plan's hash of it (a corrupt or stale "
            "build): compile the program again"
        )
    first = text.split("\n", 1)[0]
    if first != KERNELS_HEADER + digest(plan):
        raise PlanError(
            f"{where}: {k.file} was generated for another plan: compile the program again"
        )
