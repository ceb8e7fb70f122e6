"""Native code: LLVM IR text made by the code generator, compiled for this CPU by llvmlite
(``O3``, the host's features) and called through ``ctypes``.

The runtime only loads text the compiler wrote (a build folder's ``kernels/*.ll``, checked
against the plan's hash of it first): it never generates code itself.
"""

from __future__ import annotations

import ctypes
import re
import threading

from timerlc.plan.items import GEMM_FALLBACK

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

    A large module is compiled in parts, one per CPU, at the same time (``split_module``:
    LLVM's calls hold one lock per process, so the parts go to forked processes), and the
    objects are linked as they are loaded.

    With a ``cache`` folder (a build's ``kernels/``), the machine code is kept there as
    ``cpu-KEY-N.o`` (part N; KEY: a hash of the LLVM IR text, this CPU and its features,
    llvmlite's version and the optimization options) with the SHA-256 of its bytes beside
    it, and a later run of the build loads them instead of compiling again (``cached`` says
    whether it did). A cached object whose bytes do not match their hash is ignored and
    compiled again.

    With ``threads`` (a module that runs, not only compiled for a build), the kernels' parallel
    loops and products go to the process's pool of threads (``runtime.pool``) where it has
    one.

    With ``roots`` (``roots_of``: the functions a run calls at once), only the functions
    they reach are compiled (``lean_text``: the kernels of statements that run only inside a
    fused kernel are left out, a fifth of PPO's text); a function left out is compiled
    with the whole text, as a module of its own, at its first call (``left_out``,
    ``whole``).
    """

    def __init__(self, text: str, cache=None, roots=None, threads: bool = True):
        import os

        llvm = _llvm()
        self.text, self.cache = text, cache
        self.left_out: frozenset = frozenset()
        self._whole: NativeModule | None = None
        if roots is not None:
            text, self.left_out = lean_text(text, roots)
        self.tm = target_machine()
        # the kernels' gemm calls go to the BLAS's gemm, or where there is none to the
        # file's own loops, compiled only then
        gemms = [w for w in ("s", "d") if f"@tl_{w}gemm = global" in text]
        self.blas = cblas() if gemms else None
        gemm_loops = self.blas is None
        key = code_key(text, "gemm loops" if gemm_loops else "BLAS")
        parts = split_module(text, _workers(), gemm_loops)
        paths = [
            None if cache is None else os.path.join(os.fspath(cache), f"cpu-{key}-{k}.o")
            for k in range(len(parts))
        ]
        objs = [_read_object(p) if p else None for p in paths]
        self.cached = all(o is not None for o in objs)
        self.module = None  # the optimized module, when it was compiled here in one part
        if not self.cached:
            if len(parts) == 1:
                self.module = _optimized(parts[0], self.tm)
                objs = [self.tm.emit_object(self.module)]
            else:
                objs = _compile_parts(parts, self.tm)
            for p, o in zip(paths, objs):
                if p:
                    _write_object(p, o)
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.tm)
        for o in objs:
            self.engine.add_object_file(llvm.ObjectFileRef.from_data(o))
        self.engine.finalize_object()
        self._functions: dict[str, object] = {}
        name_for_perf(self.engine, text)
        # the threads (runtime.pool): the kernels' parallel loops and their large products
        par = "@tl_par = global" in text
        self.pool = None
        if threads and (par or (gemms and self.blas is not None)):
            from timerlc.runtime import pool

            self.pool = pool.get()
        if par and self.pool is not None:
            at = self.engine.get_global_value_address("tl_par")
            ctypes.c_void_p.from_address(at).value = self.pool.run
        for which in gemms:
            at = self.engine.get_global_value_address(f"tl_{which}gemm")
            fallback = GEMM_FALLBACK + {"s": "float", "d": "double"}[which]
            gemm = self.address(fallback) if self.blas is None else self.blas[which]
            alone = gemm
            if self.blas is not None and self.pool is not None and self.pool.gemm:
                gemm = self.pool.gemm[which]
            ctypes.c_void_p.from_address(at).value = gemm
            # (the row variants' products, inside a chunk of a row loop: on its thread)
            at = self.engine.get_global_value_address(f"tl_{which}gemm1")
            if at:
                ctypes.c_void_p.from_address(at).value = alone

    def address(self, name: str) -> int:
        if name in self.left_out:
            return self.whole().address(name)
        addr = self.engine.get_function_address(name)
        if not addr:
            raise KeyError(f"no function {name} in the native module")
        return addr

    def function(self, name: str):
        """Kernel ``name`` as a ctypes function; one that the module left out (``left_out``)
        as a function that compiles the whole text at its first call."""
        fn = self._functions.get(name)
        if fn is None:
            if name in self.left_out:
                return _Later(self, name)
            fn = self._functions[name] = KERNEL(self.address(name))
        return fn

    def whole(self) -> NativeModule:
        """The module of the whole text (this one where nothing was left out), compiled at
        the first call that needs it."""
        if not self.left_out:
            return self
        if self._whole is None:
            self._whole = NativeModule(self.text, self.cache, threads=self.pool is not None)
        return self._whole


def name_for_perf(engine, text: str) -> None:
    """``write_perf_map`` where ``TIMERLC_PERF_MAP=1`` asks for it (every module the
    process loads: the kernels', the pool's)."""
    import os

    if os.environ.get("TIMERLC_PERF_MAP", "") == "1":
        write_perf_map(engine, text)


def write_perf_map(engine, text: str, path: str | None = None) -> str:
    """Name the module's functions for Linux ``perf`` (``TIMERLC_PERF_MAP=1``: a debugging
    aid, docs/codegen.md): a line ``ADDRESS SIZE NAME`` (hexadecimal) per function of
    ``text`` the engine has an address for, appended to ``/tmp/perf-PID.map``, where
    ``perf report`` looks for the names of code made at run time. A function's size is the
    distance to the next function's address (the last one's, up to 4 KiB): the code between
    two of them (a constant pool, padding) is counted to the first. Returns the path."""
    import os

    names = re.findall(r"^define [^@]*@([\w.$]+)\(", text, re.MULTILINE)
    at = sorted({(a, n) for n in names if (a := engine.get_function_address(n))})
    path = path or f"/tmp/perf-{os.getpid()}.map"
    with open(path, "a") as f:
        for k, (a, n) in enumerate(at):
            size = at[k + 1][0] - a if k + 1 < len(at) else 4096
            f.write(f"{a:x} {size:x} {n}\n")
    return path


class _Later:
    """A kernel the module left out (``NativeModule.left_out``): its first call compiles the
    whole text (``NativeModule.whole``)."""

    __slots__ = ("fn", "module", "name")

    def __init__(self, module: NativeModule, name: str):
        self.module, self.name, self.fn = module, name, None

    def __call__(self, *args):
        if self.fn is None:
            self.fn = self.module.whole().function(self.name)
        return self.fn(*args)


def roots_of(plan) -> set[str] | None:
    """The functions of ``plan``'s kernel file a cpu run whose tree functions run calls at
    once: the tree functions, and the kernels of the statements outside every fused kernel
    (``plan.kernels.fused``; a fused statement's own kernel runs only where the runtime runs
    that statement alone: a run that checks its windows, a rerun). None (all of them) for
    a plan without tree functions."""
    k = plan.kernels
    if not k.trees:
        return None
    fused = {sid for group in k.fused for sid in group}
    return {name for _, name, _ in k.trees} | {
        name for sid, name, _ in k.statements if sid not in fused
    }


def lean_text(text: str, roots) -> tuple[str, frozenset]:
    """``text`` with only the functions ``roots`` reach through calls (and the runtime
    library's, ``tl_*``, the gemm loops and every internal one, which LLVM drops where no
    call is left), and the names of the functions left out."""
    lines = text.split("\n")
    defs = _definitions(lines)
    keep = {n for n in defs if n in roots or n.startswith("tl_")}
    # (and what a line outside the definitions names: a global that points at a function)
    for line in _without(lines, defs.values()):
        if "@" in line and not line.startswith("define "):
            keep.update(n for n in re.findall(r"@([\w.$]+)", line) if n in defs)
    work = list(keep)
    while work:
        start, end = defs[work.pop()]
        for line in lines[start + 1 : end]:
            if "@" not in line:
                continue
            for name in re.findall(r"@([\w.$]+)", line):
                if name in defs and name not in keep:
                    keep.add(name)
                    work.append(name)
    out = set(defs) - keep
    if not out:
        return text, frozenset()
    return "\n".join(_without(lines, [defs[n] for n in out], True)), frozenset(out)


def _definitions(lines: list[str]) -> dict[str, tuple[int, int]]:
    """The module's function definitions but the internal ones, in order: name -> the
    numbers of its first line and of its closing ``}`` (``split_module``'s and
    ``lean_text``'s)."""
    out: dict[str, tuple[int, int]] = {}
    k = 0
    while k < len(lines):
        line = lines[k]
        if line.startswith("define ") and " internal " not in line.split("@", 1)[0] + " ":
            m = re.search(r"@([\w.$]+)\(", line)  # (its parameters may go on over lines)
            if m is None:  # pragma: no cover - the renderer writes every definition this way
                raise ValueError(f"not a function definition: {line[:80]}")
            end = lines.index("}", k)
            out[m.group(1)] = (k, end)
            k = end + 1
            continue
        k += 1
    return out


def _without(lines: list[str], spans, blank: bool = False) -> list[str]:
    """``lines`` but those of ``spans`` (``(first, last)`` each, apart from one another;
    with ``blank``, and the blank line after each)."""
    out: list[str] = []
    at = 0
    for start, end in sorted(spans):
        out.extend(lines[at:start])
        at = end + 1
        if blank and at < len(lines) and lines[at] == "":
            at += 1
    out.extend(lines[at:])
    return out


def _optimized(text: str, tm):
    """The module of LLVM IR ``text``, verified and optimized (O3, loops vectorized)."""
    llvm = _llvm()
    mod = llvm.parse_assembly(text)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    # unrolling multiplies the code (and LLVM's time) by five for little gain on loops of a
    # few hundred iterations; SLP vectorizing finds little in kernels whose loops
    # vectorize, for a tenth of the time
    pto.slp_vectorization = False
    pto.loop_unrolling = False
    pto.loop_interleaving = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def _workers() -> int:
    """How many processes compile a large module at once: the CPUs this process may use
    (at most 4)."""
    import os

    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 4))


SPLIT_MIN_FUNCTIONS = 48  # a module with fewer functions is compiled in one piece

_DEFINE = r"^define ([^@]*?)@([\w.$]+)\((.*)\)"  # a function definition's line (a regex)


def split_module(text: str, n: int, gemm_loops: bool = True) -> list[str]:
    """The kernel file's functions in ``n`` modules of about equal cost (``_cost``), each
    with the file's declarations and internal functions (the runtime library), a
    declaration of every function the others define, and the gemm pointers as external
    globals but in the first. LLVM compiles them one per process (its calls hold one lock
    per process); the objects are linked when they are loaded.

    The gemm loops (``GEMM_FALLBACK``), which the kernels reach only through the pointer
    the runtime sets, are left out unless ``gemm_loops`` (no BLAS), else defined in the
    first module only."""
    lines = text.split("\n")
    defs = _definitions(lines)
    head = _without(lines, defs.values())
    funcs: list[list[str]] = []
    loops: list[list[str]] = []
    for start, end in defs.values():
        fallback = lines[start].startswith(f"define void @{GEMM_FALLBACK}")
        (loops if fallback else funcs).append(lines[start : end + 1])
    first = head + [line for f in loops for line in f] if gemm_loops else head
    if n < 2 or len(funcs) < SPLIT_MIN_FUNCTIONS:
        if gemm_loops or not loops:
            return [text]
        return ["\n".join(first + [line for f in funcs for line in f]) + "\n"]
    bins: list[list[list[str]]] = [[] for _ in range(n)]
    sizes = [0.0] * n
    for f in sorted(funcs, key=_cost, reverse=True):
        j = sizes.index(min(sizes))
        bins[j].append(f)
        sizes[j] += _cost(f)
    out = []
    for j, mine in enumerate(bins):
        declares = [_declaration(f[0]) for b in bins if b is not mine for f in b]
        part = first if j == 0 else map(_external, head)
        out.append("\n".join([*part, *declares, *(line for f in mine for line in f)]) + "\n")
    return out


TREE_LINE_COST = 0.25  # LLVM's time for a line of an (optnone) tree function, of a kernel's


def _cost(f: list[str]) -> float:
    """LLVM's time for a function, roughly: its lines, a tree function's (mostly calls of
    kernels, not optimized) counted at ``TREE_LINE_COST`` (measured on PPO: the two parts
    took 0.57 and 0.55 s alone balanced this way, 0.52 and 0.62 s at 0.6)."""
    return len(f) * (TREE_LINE_COST if f[0].startswith("define i32 @tree") else 1.0)


def _declaration(define: str) -> str:
    m = re.match(_DEFINE, define)
    if m is None:  # pragma: no cover - the renderer writes every definition this way
        raise ValueError(f"not a function definition: {define[:80]}")
    types = [p.split()[0] for p in m.group(3).split(",") if p.strip()]
    return f"declare {m.group(1).strip()} @{m.group(2)}({', '.join(types)})"


def _external(line: str) -> str:
    """A global defined in the first part, declared in the others."""
    if line.startswith("@") and " = global " in line:
        name, rest = line.split(" = global ", 1)
        return f"{name} = external global {rest.split()[0]}"
    return line


def _compile_parts(parts: list[str], tm) -> list[bytes]:
    """The object code of each part: the first compiled here, the others at the same time
    in forked processes (one compiled here again if its process fails)."""
    import os
    import warnings

    if not hasattr(os, "fork"):
        return [_llvm_object(p, tm) for p in parts]
    children = []
    try:
        for part in parts[1:]:
            r, w = os.pipe()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
                pid = os.fork()
            if pid == 0:  # the child: compile, hand the object over, exit
                code = 1
                try:
                    os.close(r)
                    data = _llvm_object(part, tm)
                    with os.fdopen(w, "wb") as f:
                        f.write(data)
                    code = 0
                finally:
                    os._exit(code)
            os.close(w)
            children.append((pid, r))
        objs = [_llvm_object(parts[0], tm)]
        for (pid, r), part in zip(children, parts[1:]):
            with os.fdopen(r, "rb") as f:
                data = f.read()
            _, status = os.waitpid(pid, 0)
            children = [c for c in children if c[0] != pid]
            objs.append(data if status == 0 and data else _llvm_object(part, tm))
        return objs
    finally:
        for pid, _ in children:  # interrupted: leave no process behind
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass


def _llvm_object(text: str, tm) -> bytes:
    return tm.emit_object(_optimized(text, tm))


SHARED_KEPT = 256  # the most objects the user's cache keeps (the newest)


def code_key(text: str, mode: str) -> str:
    """The cache key of the machine code of LLVM IR ``text`` compiled for this CPU: a hash
    of the text, ``mode``, the CPU, its features, llvmlite's version and the options."""
    import hashlib

    import llvmlite

    llvm = _llvm()
    parts = [
        text,
        mode,
        llvm.get_host_cpu_name(),
        llvm.get_host_cpu_features().flatten(),
        llvmlite.__version__,
        OPTIONS,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def cached_object(text: str, name: str) -> bytes:
    """The object code of LLVM IR ``text`` (optimized as the kernels are), from the user's
    cache of machine code (``shared_cache``) where it is there, else compiled here and kept
    there (the threads' pool: 0.18 s to compile at each start, its grams included)."""
    import os

    tm = target_machine()
    folder = shared_cache()
    path = None
    if folder is not None:
        path = os.path.join(os.fspath(folder), f"{name}-{code_key(text, name)}.o")
        data = _read_object(path)
        if data is not None:
            return data
    data = tm.emit_object(_optimized(text, tm))
    if path is not None:
        _write_object(path, data)
    return data


def shared_cache():
    """The user's own cache of machine code (``files.user_cache("llvm")``: private to the
    user, since what is there is loaded as code), for a run of a program that has no build
    folder: a run of the same program again, on the same CPU, loads its kernels instead of
    compiling them (their key is a hash of their text, the CPU and the options). Only the
    newest ``SHARED_KEPT`` objects are kept. None where there is no such folder."""
    import os

    from timerlc.files import user_cache

    folder = user_cache("llvm")
    if folder is None:
        return None
    try:
        objects = sorted(
            (e.stat().st_mtime, e.path) for e in os.scandir(folder) if e.name.endswith(".o")
        )
        for _, path in objects[: max(0, len(objects) - SHARED_KEPT)]:
            for p in (path, path + ".sha256"):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
    except OSError:
        pass
    return folder


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
        tmp = f"{path}.{os.getpid()}.tmp"  # (another process may write the same object)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        with open(tmp, "w") as f:
            f.write(hashlib.sha256(data).hexdigest() + "\n")
        os.replace(tmp, path + ".sha256")
    except OSError:
        pass


_CBLAS: list = []  # (the gemms' addresses, its set-threads function, its core), found once


def cblas() -> dict[str, int] | None:
    """The addresses of ``sgemm`` and ``dgemm`` of a CBLAS with 64-bit integers (the
    OpenBLAS that NumPy's wheels bundle), or None (the kernels' own loops run instead)."""
    return _blas()[0]


def blas_threads(n: int) -> None:
    """Have the BLAS ``cblas`` found run its calls on ``n`` threads (where it can say)."""
    setter = _blas()[1]
    if setter is not None:
        setter(n)


def blas_core() -> str | None:
    """The kernels the BLAS ``cblas`` found runs (OpenBLAS's name for them: "SkylakeX",
    "Haswell", ...), or None where it cannot say. OpenBLAS picks them for the CPU unless
    ``OPENBLAS_CORETYPE`` names others; an older kind runs the products at its own vector
    width (Haswell's AVX2 takes 1.8x the time of SkylakeX's AVX-512 at PPO's 8192 x 64 x 64)."""
    return _blas()[2]


def _blas() -> tuple:
    if _CBLAS:
        return _CBLAS[0]
    found, setter, core = None, None, None
    try:
        import glob
        import os

        import numpy

        libs = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
        names = sorted(glob.glob(os.path.join(libs, "libscipy_openblas64_*.so*")))
        names += sorted(glob.glob(os.path.join(libs, "libopenblas64_*.so*")))
        for path in names:
            lib = ctypes.CDLL(path)
            for prefix, suffix, threads, corename in (
                (
                    "scipy_cblas_",
                    "64_",
                    "scipy_openblas_set_num_threads64_",
                    "scipy_openblas_get_corename64_",
                ),
                ("cblas_", "64_", "openblas_set_num_threads64_", "openblas_get_corename64_"),
            ):
                try:
                    s = getattr(lib, f"{prefix}sgemm{suffix}")
                    d = getattr(lib, f"{prefix}dgemm{suffix}")
                except AttributeError:
                    continue
                found = {
                    "s": ctypes.cast(s, ctypes.c_void_p).value,
                    "d": ctypes.cast(d, ctypes.c_void_p).value,
                }
                setter = getattr(lib, threads, None)
                if setter is not None:
                    setter.argtypes = [ctypes.c_int]
                named = getattr(lib, corename, None)
                if named is not None:
                    named.argtypes, named.restype = [], ctypes.c_char_p
                    core = (named() or b"").decode("ascii", "replace").strip() or None
                break
            if found:
                break
    except OSError:
        found, setter, core = None, None, None
    _CBLAS.append((found, setter, core if found else None))
    return _CBLAS[0]


def check_kernels(plan, text: str, where: str = "the build folder") -> None:
    """``PlanError`` unless ``text`` is the kernel file of ``plan``: its SHA-256 is the
    plan's record of it, and it was generated for this very plan (its first line holds the
    plan's digest)."""
    import hashlib

    from timerlc.plan.items import (
        CUDA_KERNELS_HEADER,
        KERNELS_HEADER,
        PlanError,
        digest,
    )

    k = plan.kernels
    if k is None:
        raise PlanError(f"{where}: the plan has no kernels: compile the program again")
    if hashlib.sha256(text.encode()).hexdigest() != k.sha256:
        raise PlanError(
            f"{where}: {k.file} does not match the plan's hash of it (a corrupt or stale "
            "build): compile the program again"
        )
    first = text.split("\n", 1)[0]
    header = CUDA_KERNELS_HEADER if k.file.endswith(".cu") else KERNELS_HEADER
    if first != header + digest(plan):
        raise PlanError(
            f"{where}: {k.file} was generated for another plan: compile the program again"
        )
