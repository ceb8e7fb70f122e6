"""The device runtime: a plan whose kernels are CUDA C (``kernels/cuda.cu``), run on a device.

It is the cpu runtime's loop tree and interpreter with the buffers on a device. Every
buffer the plan allocates has memory on the device (zeroed, as the cpu runtime's are) and a
host mirror, and each side is known to be current or not:

- a statement with a kernel is a launch: the buffers it reads and writes are made current
  on the device first (copied up where the host wrote last), then its own buffer is current
  on the device only;
- anything that runs on the host (a statement without a kernel, an environment plugin, a
  metric's values, an output at the end) reads through ``read``/``written``, which copy down
  what the device wrote last; what the host writes is then current on the host only, but for
  an environment plugin's step, which writes one point (the batch's observations at a
  step): only that point's bytes go up before the next launch;
- a donation hands the donor's device memory to the statement, a swap copies the buffer to
  the host pool (the host mirror, once current) and releases its device memory, a free
  releases it.

The device is an object with ``alloc``, ``free``, ``zero``, ``upload``, ``download``,
``load``, ``launch`` and ``code`` (``EmuDevice``: the kernels compiled for the host through
``timerlc/cuda/emu.h`` over memory of its own, the ``cuda-emu`` backend; ``CupyDevice``: a
GPU through CuPy, the ``cuda`` backend). A statement's kernel is one or more functions
launched over grids of blocks (``docs/cuda.md``: its phases); its loop values are copied to
the device before them and the failure code read back after them.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import heapq
import math
import os
import sys
import time

import numpy as np

from timerlc.diagnostics import RunError
from timerlc.plan import arena
from timerlc.plan import expr as px
from timerlc.plan.items import (
    DTYPES,
    Call,
    ChainCall,
    GemmCall,
    If,
    Loop,
    Plan,
    PlanError,
    launch_loops,
)
from timerlc.runtime.cpu import CpuRuntime, _env_states, _touched

# where a buffer's values are current: on the host only, the device only, both; or, after
# the host wrote some points of a buffer current on the device, on the device but for
# those points (``written_at``: their bytes are in ``dirty``)
HOST, DEVICE, BOTH, POINTS = 1, 2, 3, 4
_STALE = (HOST, POINTS)  # a buffer the device must get the host's writes of
THREADS = 128  # of a block (cuda.render.THREADS)
ARGS = 8  # the loop values a launch passes (cuda.render.ARGS: the module's struct tl_args)
# the failure record (cuda.render's tl_failed): the code, then the statement and the loop
# values of the call that failed, as long longs
RECORD = 2 + ARGS
# after the record: a reduction's ticket counter (tl_count), then one counter for each group
# of its blocks (tl_groups: at most 256 groups, the square root of 65,536 blocks), as
# unsigned ints; the failure record's buffer is ERR_WORDS long longs in all
ERR_WORDS = RECORD + 1 + 128
# the driver's CUfunction_attribute values: a function's static shared memory, and the most
# dynamic shared memory its launches may ask for (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, _MAX_
# DYNAMIC_SHARED_SIZE_BYTES)
FUNC_SHARED_SIZE_BYTES, FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 1, 8
DEV_MAX_SHARED_PER_BLOCK_OPTIN = 97  # (cudaDevAttrMaxSharedMemoryPerBlockOptin)
FUSED = 1 << 40  # the ids of fused kernels as statements of the tree: FUSED + their index
LOOP = 1 << 41  # the ids of loop kernels as statements of the tree: LOOP + their index
SCRATCH_ALIGN = 256  # bytes: where a call's scratch memory may start (``_scratch_for``)


# which computes a product that has functions of ours too (``GemmCall.own``,
# cuda/products.py): ``fastest`` (each shape timed against the device's BLAS at its first
# call, the faster kept: a GPU's default), ``ours`` (the emulated device's, in float32) or
# ``blas``; ``TIMERLC_PRODUCTS`` sets it for a run (docs/cuda.md)
PRODUCTS = ("fastest", "ours", "blas")
PRODUCT_TRIALS = 3  # timed calls of each, at a shape's first call (the least of each counts)
# how far ours may be from the BLAS's C where the policy times them (the largest difference
# relative to the BLAS's largest magnitude), by the device's float32 products: sums in
# another order (a gram's of 65,536 terms about 1e-5 apart), TF32's operands rounded to 10
# bits; a kernel wrong on a GPU is wrong by far more (``DeviceRuntime._product_choice``)
PRODUCT_TOLERANCE = {"float32": 1e-3, "tensorfloat32": 2e-2}


def disagreement(got: np.ndarray, want: np.ndarray) -> float:
    """How far product ``got`` is from ``want``: the largest difference relative to
    ``want``'s largest magnitude (NaNs where ``want`` has them count as agreeing, and
    anywhere else as infinitely far)."""
    nan = np.isnan(want)
    if (np.isnan(got) != nan).any():
        return math.inf
    got, want = got[~nan].astype(np.float64), want[~nan].astype(np.float64)
    if not got.size:
        return 0.0
    scale = float(np.abs(want).max())
    diff = float(np.abs(got - want).max())
    if not math.isfinite(diff):
        return 0.0 if np.array_equal(got, want) else math.inf
    return diff / scale if scale else (0.0 if diff == 0 else math.inf)


def product_key(call: GemmCall) -> tuple:
    """What the products policy chooses by (``DeviceRuntime.product_choices``): a product's
    dtype, shape and layout; and our functions' names where they make more than the
    product (``GemmCall.then``: an epilogue, its own choice, timed with what the BLAS's
    product launches after it)."""
    a, b, c = call.a, call.b, call.c
    key = (call.dtype, call.m, call.n, call.k, a.ld, a.t, b.ld, b.t, c.ld)
    return key + tuple(f for f, _ in call.own) if call.then else key


def products_policy(default: str) -> str:
    """``TIMERLC_PRODUCTS`` where it is set (one of ``PRODUCTS``), else ``default``."""
    got = os.environ.get("TIMERLC_PRODUCTS", "").strip()
    if not got:
        return default
    if got not in PRODUCTS:
        raise DeviceUnavailable(f"TIMERLC_PRODUCTS={got!r} is not one of {', '.join(PRODUCTS)}")
    return got


class DeviceUnavailable(Exception):
    """The device a backend needs is not here (no GPU, no CuPy, no host compiler)."""


class MissingFunction(Exception):
    """The loaded module has no function of that name (``device.function``)."""


# how a device's BLAS computes float32 products: float32 (the default), or tensorfloat32
# (TF32 tensor cores on NVIDIA GPUs from Ampere on: the operands rounded to 10 bits of
# mantissa, float32 sums; JAX's default on those GPUs). float64 products are float64.
MATMUL = ("float32", "tensorfloat32")


def _run_chosen(chosen: list, choose, ours, other):
    """``ours`` or ``other`` (functions of nothing), as ``choose()`` says once (True: ours;
    None: not yet, ``other`` runs and the next call asks again), the choice kept in
    ``chosen``."""
    if not chosen:
        got = choose()
        if got is None:
            other()
            return
        chosen.append(got)
    (ours if chosen[0] else other)()


def function_names(phases) -> list[str]:
    """The module's functions that a kernel's ``phases`` may launch (a product's of ours, its
    TF32 ones and its joint ones among them)."""
    out = []
    for f in phases:
        if isinstance(f, GemmCall):
            out += [name for name, _ in f.own + f.then + f.tf32 + f.joint]
        elif isinstance(f, ChainCall):
            out += [name for name, _ in f.functions + f.tf32]
        else:
            out.append(f[0])
    return out


def matmul_note(matmul: str) -> str:
    """What a device's description says of its float32 products (nothing for float32)."""
    return ", float32 products in TF32" if matmul == "tensorfloat32" else ""


def device_for(backend: str, matmul: str = "float32"):
    """The device of ``backend`` (``cuda`` or ``cuda-emu``), its float32 products as
    ``matmul`` says (``MATMUL``), or ``DeviceUnavailable``."""
    if matmul not in MATMUL:
        raise ValueError(f"no matmul precision {matmul!r}")
    if backend == "cuda-emu":
        return EmuDevice(matmul)
    if backend == "cuda":
        return CupyDevice(matmul)
    raise ValueError(f"no device for backend {backend!r}")


def tf32(x: np.ndarray, away: bool = False) -> np.ndarray:
    """float32 values rounded to TF32, as float32: 10 bits of mantissa, to the nearest, ties
    to even (the emulation's stand-in for cuBLAS's input rounding, which NVIDIA does not
    document bit for bit), or with ``away`` ties away from zero (``cvt.rna.tf32.f32``, as
    our TF32 functions round, ``cuda/products.py``); infinities and NaNs as they are."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    keep = (u + (0x1000 if away else 0xFFF + ((u >> 13) & 1))) & 0xFFFFE000
    finite = (u & 0x7F800000) != 0x7F800000
    return np.where(finite, keep, u).astype(np.uint32).view(np.float32)


class EmuDevice:
    """The host as a device: memory of its own (``alloc`` hands out blocks that hold
    garbage until zeroed, as a GPU's do; a freed block is poisoned and kept for a while, so
    that a kernel still using it reads garbage instead of another buffer), the kernels
    compiled by the host C++ compiler (``timerlc.cuda.emu``)."""

    kind = "cuda-emu"
    QUARANTINE = 64  # freed blocks kept (poisoned) before their memory is returned
    POISON = 0xA5
    # the most blocks of a grid: several, so that the grid's strides are run, and few, as
    # the emulation runs them one after another
    MAX_BLOCKS = 3

    def __init__(self, matmul: str = "float32"):
        from timerlc.cuda.emu import compiler

        self.matmul = matmul
        if compiler() is None:
            raise DeviceUnavailable("no host C++ compiler (c++, g++ or clang++) for cuda-emu")
        # (its times say nothing of a GPU's: our products, so that the suite runs them;
        # the BLAS's where TF32 is asked for, whose rounding only it emulates)
        self.products = products_policy("ours" if matmul == "float32" else "blas")
        self._blocks: dict[int, np.ndarray] = {}
        self._arenas: dict[int, np.ndarray] = {}
        self._freed: collections.deque = collections.deque(maxlen=self.QUARANTINE)
        self._recording: list | None = None  # a graph's work while it is captured
        # the launches' failure record (code 0: none), then a reduction's ticket counters
        self._err = self.alloc(8 * ERR_WORDS)
        self.zero(self._err, 8 * ERR_WORDS)

    def describe(self) -> str:
        note = matmul_note(self.matmul)
        return f"the host, emulating the grids of blocks (timerlc/cuda/emu.h){note}"

    def load(self, text: str, cache=None, defines: tuple[str, ...] = ()):
        from timerlc.cuda.emu import EmuModule

        try:
            return EmuModule(text, cache, defines)
        except RuntimeError as e:
            raise RunError(f"cuda-emu: {e}") from None

    def function(self, module, name: str):
        try:
            return module.function(name)
        except AttributeError:  # (ctypes: the library has no such symbol)
            raise MissingFunction(name) from None

    def grid_limit(self, fn) -> int:
        """The most blocks a launch of ``fn`` gets (``CupyDevice.grid_limit``)."""
        return self.MAX_BLOCKS

    def dynamic_shared(self, fn, nbytes: int) -> bool:
        """(``CupyDevice.dynamic_shared``: the emulation's array is a block's static one,
        ``TL_DYNAMIC_SHARED``, as large as the function says)"""
        return True

    def alloc(self, nbytes: int) -> int:
        block = np.full(max(nbytes, 8), self.POISON, np.uint8)
        self._blocks[block.ctypes.data] = block
        return block.ctypes.data

    def free(self, ptr: int):
        block = self._blocks.pop(ptr)
        block.fill(self.POISON)
        self._freed.append(block)

    def arena(self, nbytes: int) -> int:
        """A block for ``carve`` (holding garbage)."""
        block = np.full(max(nbytes, 8), self.POISON, np.uint8)
        self._arenas[block.ctypes.data] = block
        return block.ctypes.data

    def release_arena(self, base: int):
        self._arenas.pop(base).fill(self.POISON)

    def carve(self, base: int, offset: int, nbytes: int) -> int:
        """The address of ``nbytes`` of arena ``base`` from ``offset`` (two buffers whose
        lives do not meet may get the same bytes; ``uncarve`` when one is freed)."""
        arena = self._arenas[base]
        if offset < 0 or offset + nbytes > arena.nbytes:
            raise RunError(f"internal error: {nbytes} bytes at {offset} outside the arena")
        return base + offset

    def uncarve(self, ptr: int, nbytes: int, poison: bool = True):
        """A carved buffer freed: its bytes poisoned (a kernel that still used them would
        read garbage), but where another buffer may hold them already (``poison`` False)."""
        self._region(ptr, nbytes)
        if poison:
            ctypes.memset(ptr, self.POISON, nbytes)

    def zero(self, ptr: int, nbytes: int):
        self._check(ptr, nbytes)
        self._idle("a zeroing")
        ctypes.memset(ptr, 0, nbytes)

    def upload(self, ptr: int, host: np.ndarray, offset: int = 0):
        self._check(ptr, offset + host.nbytes)
        self._idle("a copy to the device")
        ctypes.memmove(ptr + offset, host.ctypes.data, host.nbytes)

    def download(self, ptr: int, host: np.ndarray):
        self._check(ptr, host.nbytes)
        self._idle("a copy from the device")
        ctypes.memmove(host.ctypes.data, ptr, host.nbytes)

    def launch(self, fn, table: int, args: np.ndarray, scratch: int, blocks: int, shift: int = 0):
        # (the emulation's entry reads the loop values from the host's array: a graph keeps
        # a copy, as a captured launch keeps its parameters)
        n = len(args)
        if n > ARGS:
            raise ValueError(f"a launch passes at most {ARGS} loop values, not {n}")
        if self._recording is None:
            fn(table, args.ctypes.data, n, scratch, self._err, blocks, shift)
            return
        values = args.copy()
        err = self._err
        self._issue(lambda: fn(table, values.ctypes.data, n, scratch, err, blocks, shift))

    def set_shift(self, fn, shift: int, index: int, n: int, deltas: np.ndarray):
        """``tl_set_shift`` (``cuda.prelude.SHIFT_KERNEL``) over the ``n`` shifts at
        ``shift``."""
        d = np.zeros(ARGS, np.int64)
        d[: len(deltas)] = deltas
        self._issue(lambda: fn(shift, index, n, d.ctypes.data, min(-(-n // THREADS), 2)))

    # a graph: the launches and products made while it is captured, kept (not run), then
    # run in order at each replay; nothing else may reach the device meanwhile (a GPU's
    # capture would fail: the runtime must do its copies before)
    # Each call's work is a group that waits for the groups ``depend`` names; a replay runs
    # the groups in an order that keeps only those waits: of the groups ready, the last one
    # captured first (as far from the capture's order as the waits allow: a wait that is
    # missing gives other values).
    def begin_capture(self):
        self._recording = [(set(), [])]  # (the groups it waits for, its work)

    def depend(self, after: set[int]):
        """The work from here is a group of its own that waits for the groups ``after``
        (numbered from 0 in the order ``depend`` made them; the work before the first is
        not one: it comes first)."""
        self._recording.append(({a + 1 for a in after} | {0}, []))

    def end_capture(self) -> tuple:
        groups, self._recording = self._recording, None
        left = [len(after) for after, _ in groups]  # the waits not yet met
        then: list[list[int]] = [[] for _ in groups]  # per group, those waiting for it
        for h, (after, _) in enumerate(groups):
            for g in after:
                then[g].append(h)
        ready = [-g for g, n in enumerate(left) if not n]
        heapq.heapify(ready)
        done: list[int] = []
        while ready:
            g = -heapq.heappop(ready)  # (the last one captured of those ready)
            done.append(g)
            for h in then[g]:
                left[h] -= 1
                if not left[h]:
                    heapq.heappush(ready, -h)
        if len(done) != len(groups):
            raise RunError("internal error: a graph's calls wait for each other in a cycle")
        return tuple(work for g in done for work in groups[g][1])

    def replay(self, graph: tuple):
        self._idle("a graph's replay")
        for work in graph:
            work()

    def _issue(self, work):
        if self._recording is None:
            work()
        else:
            self._recording[-1][1].append(work)

    def _idle(self, what: str):
        if self._recording is not None:
            raise RunError(f"internal error: {what} while a CUDA graph is captured")

    def mark(self) -> float:
        """A point in the device's work (``elapsed`` between two): here, the host's clock
        (the emulation runs a launch before it returns)."""
        return time.perf_counter()

    def snapshot(self, ptr: int, nbytes: int):
        """A copy of ``nbytes`` at ``ptr`` and of the failure record, made when the device
        gets there (``ready``, ``wait``; ``DeviceRuntime.emit``): here at once."""
        self._check(ptr, nbytes)
        self._idle("a copy from the device")
        values = np.empty(max(nbytes, 1), np.uint8)
        ctypes.memmove(values.ctypes.data, ptr, nbytes)
        record = np.empty(RECORD, np.int64)
        ctypes.memmove(record.ctypes.data, self._err, 8 * RECORD)
        return values, record, None

    def ready(self, snap) -> bool:
        return True

    def wait(self, snap):
        pass

    def elapsed(self, start, end) -> float:
        return end - start

    def failure(self) -> tuple[int, int, tuple[int, ...]]:
        """The first failure since the last call: its code (0: none), statement and loop
        values (``tl_failed``); cleared."""
        self._idle("a read of the failure record")
        record = tuple((ctypes.c_int64 * RECORD).from_address(self._err))
        code = ctypes.c_int32.from_address(self._err).value
        if code:
            self.zero(self._err, 8 * ERR_WORDS)
        return code, record[1], record[2:]

    def code(self) -> int:
        """The code of the first launch that failed since the last call (0: none)."""
        return self.failure()[0]

    def gemm(self, dtype, m, n, k, a, lda, ta, b, ldb, tb, c, ldc):
        """``C = op(A) @ op(B)``, row-major, by NumPy (its BLAS) over the device's memory."""
        dt = np.dtype(np.float32 if dtype == "f32" else np.float64)
        A = self._matrix(a, dt, (k, m) if ta else (m, k), lda)
        B = self._matrix(b, dt, (n, k) if tb else (k, n), ldb)
        C = self._matrix(c, dt, (m, n), ldc)

        def product():
            a, b = (A.T if ta else A), (B.T if tb else B)
            if self.matmul == "tensorfloat32" and dt == np.float32:
                a, b = tf32(a), tf32(b)
            C[...] = a @ b

        self._issue(product)

    def _matrix(self, ptr: int, dt, shape: tuple[int, int], ld: int) -> np.ndarray:
        """The ``shape`` matrix at ``ptr``, its rows ``ld`` elements apart, as a view."""
        rows, cols = shape
        nbytes = ((rows - 1) * ld + cols) * dt.itemsize
        flat = self._region(ptr, nbytes, "a product's").view(dt)
        return np.lib.stride_tricks.as_strided(flat, shape, (ld * dt.itemsize, dt.itemsize))

    def _region(self, ptr: int, nbytes: int, what: str = "a copy of") -> np.ndarray:
        """The ``nbytes`` at ``ptr``, inside one block or arena (else an internal error)."""
        for blocks in (self._blocks, self._arenas):
            for start, block in blocks.items():
                if start <= ptr and ptr + nbytes <= start + block.nbytes:
                    return block[ptr - start : ptr - start + nbytes]
        raise RunError(
            f"internal error: {what} {nbytes} bytes at a device address that holds no such block"
        )

    def _check(self, ptr: int, nbytes: int):
        block = self._blocks.get(ptr)
        if block is None or nbytes > block.nbytes:
            self._region(ptr, nbytes)


def _host(array: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(array.ctypes.data)


def _blas_scalars():
    """alpha = 1 and beta = 0 of each dtype, in host memory (pointer mode host: cuBLAS reads
    them at the call, and a graph keeps their values)."""
    return {
        d: (np.ones(1, t), np.zeros(1, t)) for d, t in (("f32", np.float32), ("f64", np.float64))
    }


# cuBLAS's math modes: CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH
MATH_MODE = {"float32": 0, "tensorfloat32": 3}


def _blas_of(cp, matmul: str = "float32"):
    """(the BLAS, its handle) and the scalars: a ``Cublas`` over the process's libcublas,
    else CuPy's wrappers over CuPy's handle (whose stream capture refuses them); float32
    products in cuBLAS's math mode for ``matmul``."""
    lib = _cublas_library(cp)
    if lib is not None:
        blas = Cublas(lib)
        return (blas, blas.create(MATH_MODE[matmul])), _blas_scalars()
    from cupy.cuda import cublas, device

    return (_CupyCublas(cublas, MATH_MODE[matmul]), device.get_cublas_handle()), _blas_scalars()


def _cublas_library(cp):
    """The libcublas this process has (the copy CuPy loaded, read off /proc/self/maps; else
    the one cuda-pathfinder finds; else the loader's by name), as a ``ctypes.CDLL``; None
    where none is found."""
    names = []
    with contextlib.suppress(Exception):
        from cupy.cuda import device

        device.get_cublas_handle()  # (CuPy loads its libcublas)
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                path = fields[5] if len(fields) > 5 else ""
                if os.path.basename(path).startswith("libcublas.so"):
                    names.append(path)
                    break
    with contextlib.suppress(Exception):
        from cuda import pathfinder

        names.append(pathfinder.load_nvidia_dynamic_lib("cublas").abs_path)
    names += ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if hasattr(lib, "cublasSgemm_v2"):
            return lib
    return None


class _CupyCublas:
    """CuPy's cuBLAS wrappers over CuPy's handle, which CuPy's own routines use too: the
    stream and pointer mode host set at each call (a captured stream refuses them)."""

    def __init__(self, cublas, math: int = 0):
        self.cublas, self.sgemm, self.dgemm = cublas, cublas.sgemm, cublas.dgemm
        self.math = math

    def setStream(self, handle: int, stream: int):
        self.cublas.setStream(handle, stream)
        self.cublas.setPointerMode(handle, 0)  # CUBLAS_POINTER_MODE_HOST
        self.cublas.setMathMode(handle, self.math)


class Cublas:
    """cuBLAS's gemm through ``ctypes`` over the library itself (``lib``: a ``CDLL``), on a
    handle of its own in pointer mode host: the same calls as CuPy's ``cupy.cuda.cublas``
    (``setStream``, ``sgemm``, ``dgemm``), without its refusal to run while a stream is
    captured. cuBLAS itself is capturable: with scalars in host memory a graph keeps their
    values, and since CUDA 12.2 its workspace comes from stream-ordered allocations."""

    def __init__(self, lib):
        self.lib = lib
        c = ctypes
        ptr, i32 = c.c_void_p, c.c_int
        gemm = [ptr, i32, i32, i32, i32, i32, ptr, ptr, i32, ptr, i32, ptr, ptr, i32]
        for name, args in (
            ("cublasCreate_v2", [ptr]),
            ("cublasSetStream_v2", [ptr, ptr]),
            ("cublasSetPointerMode_v2", [ptr, i32]),
            ("cublasSetMathMode", [ptr, i32]),
            ("cublasSgemm_v2", gemm),
            ("cublasDgemm_v2", gemm),
        ):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, c.c_int
        self._stream = {}  # per handle: the stream last set

    def _check(self, name: str, status: int):
        if status != 0:
            raise RunError(f"cuBLAS's {name} failed (status {status})")

    def create(self, math: int = 0) -> int:
        """A handle in pointer mode host and math mode ``math`` (``MATH_MODE``)."""
        handle = ctypes.c_void_p()
        self._check("cublasCreate", self.lib.cublasCreate_v2(ctypes.addressof(handle)))
        self._check("cublasSetPointerMode", self.lib.cublasSetPointerMode_v2(handle.value, 0))
        self._check("cublasSetMathMode", self.lib.cublasSetMathMode(handle.value, math))
        return handle.value

    def setStream(self, handle: int, stream: int):
        if self._stream.get(handle) != stream:
            self._check("cublasSetStream", self.lib.cublasSetStream_v2(handle, stream))
            self._stream[handle] = stream

    def sgemm(self, handle, *args):
        self._check("cublasSgemm", self.lib.cublasSgemm_v2(handle, *args))

    def dgemm(self, handle, *args):
        self._check("cublasDgemm", self.lib.cublasDgemm_v2(handle, *args))


def resident_blocks(sms: int, threads_per_sm: int) -> int:
    """The blocks of ``THREADS`` threads a GPU of ``sms`` multiprocessors holds at once
    (``threads_per_sm`` threads each): the grid a launch gets at most, each thread striding
    over the points its loops have beyond it. Measured on an H100 (132 of 2048 threads), a
    kernel of 4.2 M points one point a thread (32,768 blocks) took 47 us, on 2,112 blocks
    11.5 us (4,224: 14.4; 1,056: 13.3): each block's own work (the failure check, the loop
    values, its barriers) costs more than its point; docs/performance.md."""
    return max(1, min(65535, sms * max(1, threads_per_sm // THREADS)))


class CupyDevice:
    """A GPU through CuPy: memory from CuPy's pool, the module compiled by NVRTC
    (``RawModule``, which caches the compiled module by its text, options and the GPU's
    architecture), a function launched over blocks of ``THREADS`` threads by the driver
    (``cuLaunchKernel``, its parameters in one host buffer: the table's, the loop values',
    the scratch's, the failure code's and the shifts' addresses), a product by cuBLAS; all
    in a stream of its own (made CuPy's current one), in order; while a graph is captured,
    a call that need not wait for the one before it may go to a side stream (``depend``)."""

    kind = "cuda"
    MAX_BLOCKS = 65535  # (until the GPU's own is known: resident_blocks)
    SIDE_STREAMS = 3  # streams besides the launches' own that a graph's branches use

    def __init__(self, matmul: str = "float32"):
        self.matmul = matmul
        self.products = products_policy("fastest")
        try:
            import cupy
        except ImportError as e:
            raise DeviceUnavailable(
                f"CuPy is not installed ({e}); install the cuda extra matching this machine's "
                "CUDA (docs/cuda.md)"
            ) from None
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # noqa: BLE001 - CuPy without a driver or a GPU: say so
            raise DeviceUnavailable(f"no CUDA device ({type(e).__name__}: {e})") from None
        if count < 1:
            raise DeviceUnavailable("no CUDA device")
        from cupy.cuda import driver

        self.cp, self._driver = cupy, driver
        attrs = cupy.cuda.Device().attributes
        self.MAX_BLOCKS = resident_blocks(
            attrs["MultiProcessorCount"], attrs["MaxThreadsPerMultiProcessor"]
        )
        self._sms = attrs["MultiProcessorCount"]
        # the most shared memory a block may have (a function's dynamic and static together,
        # once the function asks for more than 48 KB: dynamic_shared), and each function's
        # dynamic shared memory its launches ask for
        self._optin = attrs.get("MaxSharedMemoryPerBlockOptin")
        if self._optin is None:  # (CuPy's dictionary without it: the runtime's attribute)
            try:
                self._optin = cupy.cuda.runtime.deviceGetAttribute(
                    DEV_MAX_SHARED_PER_BLOCK_OPTIN, cupy.cuda.Device().id
                )
            except Exception:  # noqa: BLE001 - none to be had: 48 KB, a function's own
                self._optin = 48 * 1024
        self._dynamic: dict[int, int] = {}
        self._mem: dict[int, object] = {}
        self._arenas: dict[int, object] = {}
        # the failure record (tl_failed), then a reduction's ticket counters (tl_count,
        # tl_groups)
        self._err = cupy.zeros(ERR_WORDS, cupy.int64)
        self._code = np.zeros(RECORD, np.int64)
        # a stream of its own (a graph is captured from a stream other than the legacy
        # default one), made current, and synchronizing with the default stream (CuPy's
        # synchronous copies and fills are ordered with its work)
        self._stream_obj = cupy.cuda.Stream()
        self._stream_obj.use()
        self._stream = self._stream_obj.ptr
        # while a graph is captured, calls that need not wait for each other go to streams
        # of their own (``depend``): the graph's branches, run at once on the GPU
        self._streams = [self._stream_obj] + [
            cupy.cuda.Stream(non_blocking=True) for _ in range(self.SIDE_STREAMS)
        ]
        self._capture: dict | None = None
        self._launch_params(self._err.data.ptr)
        self._blas = None  # (cuBLAS's handle, and alpha = 1, beta = 0 of each dtype)

    def _launch_params(self, err: int):
        """The buffer a launch's parameters are written to (cuLaunchKernel reads them when
        it is called, and a graph captured keeps a copy): the table's address, the loop
        values (one parameter, ``struct tl_args``), the scratch's, ``err``'s and the
        shifts' addresses; and a pointer to each. Likewise for ``tl_set_shift``: the
        shifts' and the indices' addresses, their number, the values (``tl_args``)."""
        self._params = np.zeros(4 + ARGS, np.uint64)
        self._params[2 + ARGS] = err
        at = self._params.ctypes.data
        self._param_ptrs = np.array(
            [at, at + 8, at + 8 * (1 + ARGS), at + 8 * (2 + ARGS), at + 8 * (3 + ARGS)],
            np.uint64,
        )
        self._shift_params = np.zeros(3 + ARGS, np.uint64)
        at = self._shift_params.ctypes.data
        self._shift_ptrs = np.array([at, at + 8, at + 16, at + 24], np.uint64)

    def describe(self) -> str:
        props = self.cp.cuda.runtime.getDeviceProperties(self.cp.cuda.Device().id)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        return name + matmul_note(self.matmul)

    def load(self, text: str, cache=None, defines: tuple[str, ...] = ()):
        from timerlc.cuda.nvrtc import options  # (as the tests compile the module)

        try:
            return self.cp.RawModule(code=text, options=options(defines))
        except Exception as e:  # noqa: BLE001 - NVRTC's message, as a run failure
            raise RunError(f"the GPU's compiler refused the kernels: {e}") from None

    def function(self, module, name: str):
        # (RawModule compiles on the first function: NVRTC's refusal arrives here)
        try:
            return module.get_function(name).kernel.ptr  # (a CUfunction)
        except Exception as e:  # noqa: BLE001 - NVRTC's or the driver's message, as a run failure
            if "NOT_FOUND" in str(e):  # (the driver's CUDA_ERROR_NOT_FOUND: no such name)
                raise MissingFunction(name) from None
            raise RunError(
                f"the GPU's compiler refused the kernels ({type(e).__name__}): {e}"
            ) from None

    def grid_limit(self, fn: int) -> int:
        """The most blocks a launch of function ``fn`` gets: as many as the GPU holds at once
        of its (``MAX_BLOCKS`` at most), by the driver's occupancy of it (its registers and
        shared memory). A function of 40 registers a thread fits 12 blocks of 128 threads
        an SM, not 16: on a grid of 16 an SM, a quarter of the blocks waited for the others,
        each with the same points to stride over (a second wave)."""
        dynamic = self._dynamic.get(fn, 0)
        per_sm = self._driver.occupancyMaxActiveBlocksPerMultiprocessor(fn, THREADS, dynamic)
        return max(1, min(self.MAX_BLOCKS, self._sms * per_sm))

    def dynamic_shared(self, fn: int, nbytes: int) -> bool:
        """Whether function ``fn``'s launches may have ``nbytes`` of dynamic shared memory
        (a chain's array past the 48 KB a function may declare, ``ChainCall.shared``): its
        static shared memory and those within the GPU's most a block (the driver's
        ``MAX_SHARED_MEMORY_PER_BLOCK_OPTIN``); if so, the function's largest set to them
        (``cuFuncSetAttribute``), and its launches ask for them from now on."""
        static = self._driver.funcGetAttribute(FUNC_SHARED_SIZE_BYTES, fn)
        if static + nbytes > self._optin:
            return False
        self._driver.funcSetAttribute(fn, FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        self._dynamic[fn] = nbytes
        return True

    def alloc(self, nbytes: int) -> int:
        mem = self.cp.cuda.alloc(max(nbytes, 8))
        self._mem[mem.ptr] = (mem, max(nbytes, 8))
        return mem.ptr

    def free(self, ptr: int):
        del self._mem[ptr]

    def arena(self, nbytes: int) -> int:
        mem = self.cp.cuda.alloc(max(nbytes, 8))
        self._arenas[mem.ptr] = (mem, max(nbytes, 8))
        return mem.ptr

    def release_arena(self, base: int):
        del self._arenas[base]

    def carve(self, base: int, offset: int, nbytes: int) -> int:
        """The address of ``nbytes`` of arena ``base`` from ``offset`` (the arena keeps the
        memory; two buffers whose lives do not meet may get the same bytes)."""
        if offset < 0 or offset + nbytes > self._arenas[base][1]:
            raise RunError(f"internal error: {nbytes} bytes at {offset} outside the arena")
        return base + offset

    def uncarve(self, ptr: int, nbytes: int, poison: bool = True):
        """A carved buffer freed: nothing to do (its bytes are the arena's)."""

    def _at(self, ptr: int, nbytes: int, offset: int = 0):
        """CuPy's pointer for the ``nbytes`` at ``offset`` past a device address: in an
        allocation (its start, or inside it: a product's matrix at an offset into its
        buffer, which the GPU's first PPO run downloaded to time the product, 2026-11-28)
        or an arena; else an internal error, as the emulation's."""
        hit = self._mem.get(ptr)
        if hit is not None and 0 <= offset and offset + nbytes <= hit[1]:
            return hit[0] + offset if offset else hit[0]
        ptr += offset
        for blocks in (self._arenas, self._mem):
            for base, (mem, size) in blocks.items():
                if base <= ptr and ptr + nbytes <= base + size:
                    return mem + (ptr - base)
        raise RunError(
            f"internal error: {nbytes} bytes at a device address outside the device's memory"
        )

    def zero(self, ptr: int, nbytes: int):
        self._at(ptr, nbytes).memset(0, nbytes)

    def upload(self, ptr: int, host: np.ndarray, offset: int = 0):
        # in the launches' stream, from pageable memory: CUDA copies ``host`` to a staging
        # buffer before it returns (so the host may change it at once) and does not wait
        # for the device, which copies it when the stream gets there
        # (CuPy's copies take the host address as a ctypes.c_void_p: they read its .value)
        self._at(ptr, host.nbytes, offset).copy_from_host_async(_host(host), host.nbytes)

    def download(self, ptr: int, host: np.ndarray):
        self._at(ptr, host.nbytes).copy_to_host(_host(host), host.nbytes)

    def launch(
        self, fn: int, table: int, args: np.ndarray, scratch: int, blocks: int, shift: int = 0
    ):
        p = self._params
        p[0] = table
        p[1 : 1 + len(args)] = args.view(np.uint64)
        p[1 + ARGS] = scratch
        p[3 + ARGS] = shift
        self._driver.launchKernel(
            fn,
            blocks,
            1,
            1,
            THREADS,
            1,
            1,
            self._dynamic.get(fn, 0),
            self._stream,
            self._param_ptrs.ctypes.data,
            0,
        )

    def set_shift(self, fn: int, shift: int, index: int, n: int, deltas: np.ndarray):
        """``tl_set_shift`` (``cuda.prelude.SHIFT_KERNEL``) over the ``n`` shifts at
        ``shift``: the values by value, in the launches' stream (before the graph)."""
        p = self._shift_params
        p[:] = 0
        p[0], p[1], p[2] = shift, index, n
        p[3 : 3 + len(deltas)] = np.asarray(deltas, np.int64).view(np.uint64)
        blocks = min(-(-n // THREADS), self.MAX_BLOCKS)
        self._driver.launchKernel(
            fn, blocks, 1, 1, THREADS, 1, 1, 0, self._stream, self._shift_ptrs.ctypes.data, 0
        )

    def begin_capture(self):
        """From here the launches and products are captured into a graph (not run)."""
        main = self._stream_obj
        main.begin_capture()
        fork = self.cp.cuda.Event(disable_timing=True)
        fork.record(main)  # (a side stream joins the capture by waiting for it)
        self._capture = {
            "groups": [],  # per call: (its stream, the event after its work)
            "tails": [None] * len(self._streams),  # per stream: its last call
            "joined": [True] + [False] * self.SIDE_STREAMS,
            "fork": fork,
        }

    def depend(self, after: set[int]):
        """The work from here (a call's) waits for the calls ``after`` (numbered from 0 in
        the order ``depend`` made them) and nothing else: it goes to the stream of one of
        them, if that one was the stream's last, else to the next stream in turn, and
        waits for the others' events (edges of the graph)."""
        c = self._capture
        self._close_call()
        groups, tails = c["groups"], c["tails"]
        k = next(
            (groups[d][0] for d in sorted(after, reverse=True) if tails[groups[d][0]] == d), None
        )
        if k is None:
            k = len(groups) % len(self._streams)
        stream = self._streams[k]
        for d in sorted(after):
            if groups[d][0] != k:
                stream.wait_event(groups[d][1])
                c["joined"][k] = True
        if not c["joined"][k]:
            stream.wait_event(c["fork"])
            c["joined"][k] = True
        groups.append([k, None])
        tails[k] = len(groups) - 1
        self._stream = stream.ptr

    def _close_call(self):
        """The event after the last call's work, in its stream (a later call may wait)."""
        groups = self._capture["groups"]
        if groups and groups[-1][1] is None:
            event = self.cp.cuda.Event(disable_timing=True)
            event.record(self._streams[groups[-1][0]])
            groups[-1][1] = event

    def end_capture(self):
        """The graph captured since ``begin_capture`` (instantiated: CuPy's ``Graph``): the
        launches' stream waits for the other streams' last calls first."""
        c, main = self._capture, self._stream_obj
        try:
            self._close_call()
            for k, last in enumerate(c["tails"]):
                if k and last is not None:
                    main.wait_event(c["groups"][last][1])
        finally:
            self._capture = None
            self._stream = main.ptr
        return main.end_capture()

    def replay(self, graph):
        graph.launch(self._stream_obj)

    def gemm(self, dtype, m, n, k, a, lda, ta, b, ldb, tb, c, ldc):
        """``C = op(A) @ op(B)``, row-major, by cuBLAS's gemm in the launches' stream.

        cuBLAS's matrices are column-major: a row-major ``X`` (rows ``ld`` apart) is its
        transpose there, so ``C`` is computed as ``C^T = op(B)^T op(A)^T``: B first, each
        operand transposed where the plan's is not. cuBLAS is called through a handle of our
        own (``Cublas``), so that a graph captures the products too: CuPy's own wrappers
        refuse any cuBLAS call while a stream is captured (its ``setStream`` raises
        NotImplementedError), which left every graph holding a product uncaptured (seen on
        the H100). Where the library cannot be found, CuPy's wrappers (and no such graph)."""
        if self._blas is None:
            self._blas = _blas_of(self.cp, self.matmul)
        (blas, handle), scalars = self._blas
        blas.setStream(handle, self._stream)
        one, zero = scalars[dtype]
        fn = blas.sgemm if dtype == "f32" else blas.dgemm
        fn(
            handle,
            1 if tb else 0,
            1 if ta else 0,  # CUBLAS_OP_T, CUBLAS_OP_N
            n,
            m,
            k,
            one.ctypes.data,
            b,
            ldb,
            a,
            lda,
            zero.ctypes.data,
            c,
            ldc,
        )

    def snapshot(self, ptr: int, nbytes: int):
        """Copies of ``nbytes`` at ``ptr`` and of the failure record into pinned host
        memory, queued in the launches' stream (the host does not wait), and an event after
        them (``ready``: whether the device got there; ``wait``: until it does)."""
        cp = self.cp
        size = max(nbytes, 1) + 8 * RECORD
        mem = cp.cuda.alloc_pinned_memory(size)
        host = np.frombuffer(mem, np.uint8, size)
        to_host = 2  # (cudaMemcpyDeviceToHost)
        cp.cuda.runtime.memcpyAsync(host.ctypes.data, ptr, nbytes, to_host, self._stream)
        at = host.ctypes.data + max(nbytes, 1)
        cp.cuda.runtime.memcpyAsync(at, self._err.data.ptr, 8 * RECORD, to_host, self._stream)
        event = cp.cuda.Event()
        event.record(self._stream_obj)
        values = host[: max(nbytes, 1)]
        record = host[max(nbytes, 1) :].view(np.int64)
        return values, record, (event, mem)

    def ready(self, snap) -> bool:
        return snap[2][0].done

    def wait(self, snap):
        snap[2][0].synchronize()

    def mark(self):
        """A point in the device's work: a CUDA event recorded in the launches' stream (a
        profile's; ``elapsed`` between two)."""
        event = self.cp.cuda.Event()
        event.record(self._stream_obj)
        return event

    def elapsed(self, start, end) -> float:
        """Seconds the device took from ``start`` to ``end`` (waits for ``end``)."""
        end.synchronize()
        return self.cp.cuda.get_elapsed_time(start, end) / 1e3

    def failure(self) -> tuple[int, int, tuple[int, ...]]:
        """The first failure since the last call: its code (0: none), statement and loop
        values (``tl_failed``); cleared. Waits for the launches."""
        self._err.data.copy_to_host(_host(self._code), self._code.nbytes)
        code = int(self._code.view(np.int32)[0])  # (the record's first 4 bytes: little-endian)
        if code:
            self._err.fill(0)
        return code, int(self._code[1]), tuple(int(v) for v in self._code[2:])

    def code(self) -> int:
        """The code of the first launch that failed since the last call (0: none); waits
        for the launches."""
        return self.failure()[0]


class _FusedCall:
    """A fused kernel as a statement of the tree (``DeviceRuntime._fuse_calls``): a call
    is its statements' calls at the same loop values, one launch of its kernel; a failure
    is its failing statement's (``DeviceRuntime._settle``)."""

    is_env = False

    def __init__(self, rt: DeviceRuntime, fid: int, parts: tuple[int, ...]):
        self.rt, self.id, self.parts = rt, fid, parts
        first = rt.statements[parts[0]]
        self.loops = first.loops
        self.args = np.zeros(max(len(self.loops), 1), np.int64)
        boxes = [rt.statements[p].loop_box for p in parts]
        self.loop_box = tuple(min(b) for b in zip(*boxes))
        self.touched = rt.touched_of((fid,))
        self.native = rt._fused_launchers[fid]

    def run(self, key: tuple):
        rt = self.rt
        if not all(0 <= v < e for v, e in zip(key, self.loop_box)):
            for p in self.parts:  # (the first outside its box refuses the call, saying so)
                rt.statements[p].run(key)
            return
        rt.allocate(self.touched)
        self.args[: len(key)] = key
        self.native(None, None, None)


class _LoopCall:
    """A loop of the tree run as one kernel (``cuda/loops.py``; ``DeviceRuntime._loop_calls``):
    a call is the whole loop at the values of the loops around it (the kernel checks each of
    its calls against its statement's box); a failure is its failing statement's."""

    is_env = False

    def __init__(self, rt: DeviceRuntime, lid: int, scope: tuple[str, ...]):
        self.rt, self.id = rt, lid
        self.loops = scope
        self.args = np.zeros(max(len(scope), 1), np.int64)
        self.loop_box = (1 << 62,) * len(scope)  # (each call inside checks its own box)
        self.touched = rt.touched_of((lid,))
        self.native = rt._launcher(lid, rt.phases[lid], rt._statement_scratch[lid])

    def run(self, key: tuple):
        self.rt.allocate(self.touched)
        self.args[: len(key)] = key
        self.native(None, None, None)


class DeviceRuntime(CpuRuntime):
    """A plan with a CUDA C kernel file, run on ``device`` (see the module's text)."""

    def __init__(
        self,
        plan: Plan,
        on_metric=None,
        *,
        text: str,
        device,
        profile: bool = False,
        allow_nonfinite: bool = False,
        cache=None,
        use_arena: bool = True,
        graphs: bool = True,
        time_graphs: bool = False,
        loops: bool = True,
        async_metrics: bool = True,
    ):
        """``graphs``: replay the runs of the tree that only launch as CUDA graphs
        (``runtime/graphs.py``; not while profiling, which times each call, nor without the
        arena, where a buffer's address can change); ``time_graphs``: the device's seconds
        in each run's replays (``graph_seconds``: marks around each replay); ``loops``: run
        the plan's loop kernels (``kernels.loops``; not while profiling);
        ``async_metrics``: a metric's values come down without the host waiting for them
        (``emit``)."""
        from timerlc.runtime.native import check_kernels

        check_kernels(plan, text)
        if not plan.kernels.file.endswith(".cu"):
            raise PlanError(
                f"the plan's kernels are {plan.kernels.file}, not CUDA C: compile the program "
                "with --backend cuda"
            )
        self.device = device
        self.dev: dict[int, list[int]] = {}  # per buffer on the device: its outputs' memory
        self.fresh: dict[int, int] = {}  # per buffer with device memory: HOST, DEVICE, ...
        # the buffers the host wrote since the device did (HOST, POINTS) among others whose
        # state was so once (``_mark``; ``_current_on_device`` drops those it no longer is)
        self._stale: set[int] = set()
        # the buffers that lost their memory (freed, swapped out, donated) so far; and per
        # list of touched buffers that ``allocate`` or ``prepare`` went through, the count
        # then (none lost since: every one still has its memory, or was freed for good)
        self._released = 0
        self._ready: dict[tuple, tuple] = {}  # (id(touched), freed) -> (touched, _released, ids)
        self.dirty: dict[int, list] = {}  # per POINTS buffer: (output, offset, nbytes)
        self._sizes: dict[int, int] = {}  # device allocations -> bytes
        self.device_bytes = 0  # bytes of device memory held now
        self.device_peak_bytes = 0
        self.uploaded = self.downloaded = 0  # bytes copied each way
        self.launches = 0
        self.blas_calls = 0  # products handed to the device's BLAS
        # per shape of a product with functions of ours (``_gemm``'s key): the seconds of
        # the BLAS and of ours where they were timed (None: not), and whether ours runs
        self.product_choices: dict[tuple, tuple[float | None, float | None, bool]] = {}
        # the shapes whose faster functions of ours computed another C than the BLAS's at
        # their first call (``_product_choice``): how far (``disagreement``); the BLAS's runs
        self.product_disagreements: dict[tuple, float] = {}
        # per pair of products with joint functions (``_joint``: keyed ``("joint", its
        # functions...)``): the seconds of the two apart and of the joint, and whether the
        # joint runs
        self.joint_choices: dict[tuple, tuple[float | None, float | None, bool]] = {}
        # per chain (``ChainCall``: keyed ``("chain", its functions...)``): the seconds of
        # the launches it stands for and of it, and whether it runs
        self.chain_choices: dict[tuple, tuple[float | None, float | None, bool]] = {}
        # the launches and products the device ran one after another: each outside a graph,
        # and a graph's longest chain of waits per replay (``graphs.Order``: a GPU runs its
        # other calls beside that chain); a measure of the device's side without a device
        self.chained = 0
        # calls of kernels that can fail, unread: (statement, loop values), or (statement,
        # None) for any call of it (a graph's)
        self._pending: list[tuple[int, tuple | None]] = []
        # --profile: the device's seconds per statement, from marks around each call's
        # launches (read a batch at a time: reading one waits for the device)
        self.device_seconds: dict[int, float] = {}
        self._marks: list[tuple[int, object, object]] = []
        # what the run compiles of the module (docs/cuda.md, "What a run compiles"): not the
        # TF32 functions where the device's products are float32 (where they are TF32, not
        # the float32 functions of chains that have TF32 ones), nor, unprofiled, the
        # kernels of the statements that only fused kernels compute (kernels.covered): a
        # call of one of those (a run of calls no fused kernel matched) loads the whole
        # module (_whole_module)
        from timerlc.cuda.nvrtc import (  # (the module's macros)
            FUSED_ONLY,
            NO_TF32,
            TF32_ONLY,
        )

        tf32 = getattr(device, "matmul", "float32") == "tensorfloat32"
        lean = bool(plan.kernels.covered) and not profile
        self.defines = ((TF32_ONLY,) if tf32 else (NO_TF32,)) + ((FUSED_ONLY,) if lean else ())
        phases_of = dict(plan.kernels.launches)
        self._left_out = frozenset(
            name
            for sid in (plan.kernels.covered if lean else ())
            for name in function_names(phases_of[sid])
        )
        self._text, self._cache = text, cache
        self._module = device.load(text, cache, self.defines)
        self._whole = None  # (the module with the functions left out, where one needs them)
        # whether the module was loaded from ``cache`` (the emulation's, a build's
        # kernels/), not compiled; None where the device keeps its own (CuPy's)
        self.module_cached: bool | None = getattr(self._module, "cached", None)
        self._unfailing = frozenset(plan.kernels.unfailing)
        # the buffers' memory: one arena, each buffer at its planned offset (plan.arena),
        # where the plan has a layout (no swaps); else one allocation per buffer
        self.layout = arena.layout(plan) if use_arena else None
        # CUDA graphs (runtime/graphs.py): the launches' shifts (0: none; while a graph is
        # captured, its call site's), and how many graphs were made and replayed
        self.use_graphs = graphs and not profile and self.layout is not None
        self._shift = 0
        self._capturing = False
        self._order = None  # (graphs.Order, while a graph is captured)
        self._resources_of: dict[int, tuple] = {}
        self._aliases: dict | None = None
        self._statement_scratch = {sid: n for sid, _, n in plan.kernels.statements}
        for k, (n, _) in enumerate(plan.kernels.fused_launches):
            self._statement_scratch[FUSED + k] = n
        # (graph_launches: the launches and products the replays made)
        self.graphs_made = self.graph_replays = self.graph_launches = 0
        self.graph_refusals: list[str] = []  # (the device's errors, where it refused one)
        # time_graphs: per run (its description), the device's seconds in its replays and
        # their number
        self.time_graphs = time_graphs
        self.graph_seconds: dict[str, list] = {}
        self._graph_marks: list[tuple[str, object, object]] = []
        self._carved: set[int] = set()  # the buffers carved from the arena
        self._dev_bytes: dict[int, list[int]] = {}  # per buffer on the device: its outputs' bytes
        if self.layout is not None:
            self._arena = device.arena(self.layout.size)
            self.device_bytes = self.device_peak_bytes = self.layout.size
        # one scratch memory for every kernel: the statements' calls run one after another
        # (in one stream on a GPU), and a call's scratch holds nothing the next one needs
        # fused kernels (plan.kernels.fused): each a statement of its own to the tree, its
        # id FUSED + its index, standing for its statements' calls one after another
        self._fused = {
            FUSED + k: parts
            for k, parts in enumerate(plan.kernels.fused)
            if not profile  # (a profile times each statement's calls)
        }
        fused_scratch = [n for n, _ in plan.kernels.fused_launches]
        # loop kernels (plan.kernels.loops): each a statement of its own to the tree, its id
        # LOOP + its index, standing for a loop whose function is named after it
        # per loop kernel's function, its id (None: the loop runs as the tree's), and the
        # rows of kernels.loops that found their loop (made at the first build of the tree)
        self._loop_named: dict[str, int | None] | None = None
        self._loop_used: set[int] = set()
        self._loop_parts: dict[int, tuple[int, ...]] = {}
        self._loop_scope: dict[int, tuple[str, ...]] = {}
        self.use_loops = loops and not profile and bool(plan.kernels.loops)
        self.async_metrics = async_metrics
        # metrics on their way down: (name, dims, points, the device's copy, offset, dtype)
        self._metrics: collections.deque = collections.deque()
        loop_scratch = [n for _, _, n in plan.kernels.loops] if self.use_loops else []
        most = max([8] + [n for _, _, n in plan.kernels.statements] + fused_scratch + loop_scratch)
        self._scratch_bytes = -(-most // SCRATCH_ALIGN) * SCRATCH_ALIGN
        self._scratch = self._alloc(self._scratch_bytes)
        self._scratch_top = False  # (where the last call that fits a half took its scratch)
        phases = self.phases = dict(plan.kernels.launches)
        for k, (_, fphases) in enumerate(plan.kernels.fused_launches):
            phases[FUSED + k] = fphases
        self._repeats = dict(plan.kernels.repeats)
        for sid, _, _ in plan.kernels.statements:
            n = len(launch_loops(plan.statement(sid).loops, sid in self._repeats))
            if n > ARGS:
                raise PlanError(
                    f"the plan is not valid: statement {sid}'s kernel takes {n} loop values "
                    f"(a launch passes {ARGS})"
                )
        kernels = {
            name: self._launcher(sid, phases[sid], scratch)
            for sid, name, scratch in plan.kernels.statements
        }
        self._fused_launchers = {
            fid: self._launcher(fid, phases[fid], plan.kernels.fused_launches[fid - FUSED][0])
            for fid in self._fused
        }
        super().__init__(
            plan, on_metric, profile=profile, allow_nonfinite=allow_nonfinite, kernels=kernels
        )
        # the table of device addresses (the host's ``table`` keeps the mirrors')
        self.dtable_host = np.zeros_like(self.table)
        for (sid, k), index in self.slot.items():
            if self.dev.get(sid):
                self.dtable_host[index] = self.dev[sid][k]
        self.dtable = self._alloc(self.dtable_host.nbytes)
        self._table_dirty = True
        # the environments' state arrays, on the device (zero before the first call)
        self.state_dev: list[tuple[np.ndarray, int]] = []
        for a in _env_states(plan):
            host = self.env_state[(a.env, a.name)]
            ptr = self._alloc(host.nbytes)
            device.zero(ptr, host.nbytes)
            self.dtable_host[a.index] = ptr
            self.state_dev.append((host, ptr))

    # ------------------------------------------------------------------ device memory
    def _alloc(self, nbytes: int) -> int:
        ptr = self.device.alloc(nbytes)
        self._sizes[ptr] = nbytes
        self.device_bytes += nbytes
        self.device_peak_bytes = max(self.device_peak_bytes, self.device_bytes)
        return ptr

    def _release(self, ptr: int):
        self.device_bytes -= self._sizes.pop(ptr)
        self.device.free(ptr)

    def _release_buffer(self, sid: int):
        """Buffer ``sid``'s device memory given back (to the arena, which keeps the bytes:
        poisoned on the emulation, but a buffer whose values lived within an iteration,
        whose bytes another buffer may hold by now)."""
        ptrs, sizes = self.dev.pop(sid, ()), self._dev_bytes.pop(sid, ())
        if sid in self._carved:
            self._carved.discard(sid)
            for ptr, nbytes in zip(ptrs, sizes):
                self.device.uncarve(ptr, nbytes, sid not in self.layout.local)
        else:
            for ptr in ptrs:
                self._release(ptr)

    def _set(self, sid: int, bufs, donor: int | None = None):
        if bufs is None or donor is not None:
            # (a buffer freed or donated: a failed call's inputs kept). New arrays need no
            # wait: the bytes they are zeroed in were freed, and a free waits, so no call
            # still unread can have read them
            self._settle()
        super()._set(sid, bufs, donor)
        if bufs is None or donor is not None:
            self._released += 1
        if bufs is None:
            self._release_buffer(sid)
            self.fresh.pop(sid, None)
            self.dirty.pop(sid, None)
        elif donor is not None and donor in self.dev:
            # the donor's memory is the statement's now, with the donor's values in it (on
            # either side, as they were: the same bytes of the same memory)
            self.dev[sid] = self.dev.pop(donor)
            self._dev_bytes[sid] = self._dev_bytes.pop(donor)
            if donor in self._carved:
                self._carved.discard(donor)
                self._carved.add(sid)
            self._mark(sid, self.fresh.pop(donor))
            if donor in self.dirty:
                self.dirty[sid] = self.dirty.pop(donor)
        else:  # new arrays (zeros) or a swap's copies (``swap_in`` marks them)
            planned = self.plan.buffer(sid).donor
            if self.layout is not None and planned is not None and self.dev.get(planned):
                # (the arena gives it its donor's bytes, which the donor still holds: the
                # donation it was planned with did not happen, as where a function of the
                # tree read it before its statement's call allocated it)
                raise RunError(
                    f"internal error: buffer {sid} ({self._name(sid)}) was to take the memory "
                    f"of buffer {planned} ({self._name(planned)}), which still holds it (a "
                    "bad plan)"
                )
            ptrs = []
            # (a buffer whose values live within an iteration shares its bytes with others
            # in between, and every point is written before it is read: not zeroed, which
            # could wipe a live buffer's bytes; the device's bytes are its values then)
            local = self.layout is not None and sid in self.layout.local
            for k, b in enumerate(bufs):
                if self.layout is not None:
                    ptr = self.device.carve(self._arena, self.layout.offsets[sid][k], b.nbytes)
                    self._carved.add(sid)
                else:
                    ptr = self._alloc(b.nbytes)
                if not local:
                    self.device.zero(ptr, b.nbytes)
                ptrs.append(ptr)
            self.dev[sid] = ptrs
            self._dev_bytes[sid] = [b.nbytes for b in bufs]
            self.fresh[sid] = DEVICE if local else BOTH
        if bufs is None and self.layout is not None:
            # (its entries keep its place in the arena, where it comes back: no new table
            # to copy up; a kernel that read it now would read the bytes of another buffer,
            # which the emulation poisons when freed)
            return
        if hasattr(self, "dtable_host"):
            for k, ptr in enumerate(self.dev.get(sid) or [0] * len(self.plan.buffer(sid).outputs)):
                at = self.slot[(sid, k)]
                if self.dtable_host[at] != ptr:  # (in the arena a buffer comes back to its place)
                    self.dtable_host[at] = ptr
                    self._table_dirty = True

    def _to_device(self, sid: int):
        state = self.fresh.get(sid)
        if state == HOST:
            for ptr, host in zip(self.dev[sid], self.buffers[sid]):
                self.device.upload(ptr, host)
                self.uploaded += host.nbytes
            self.fresh[sid] = BOTH
        elif state == POINTS:  # the points the host wrote; the rest of its mirror is stale
            for k, offset, nbytes in self.dirty.pop(sid):
                host = self.buffers[sid][k].reshape(-1).view(np.uint8)[offset : offset + nbytes]
                self.device.upload(self.dev[sid][k], host, offset)
                self.uploaded += nbytes
            self.fresh[sid] = DEVICE

    def _to_host(self, sid: int):
        self._to_device(sid)  # (points the host wrote go up first: then all comes down)
        if self.fresh.get(sid) == DEVICE:
            self._settle()  # (no value of a failed run reaches the host)
            for ptr, host in zip(self.dev[sid], self.buffers[sid]):
                self.device.download(ptr, host)
                self.downloaded += host.nbytes
            self.fresh[sid] = BOTH

    # the host's accesses: current values, and what the host writes is current there only
    def read(self, sid: int) -> list[np.ndarray]:
        if sid in self.homes:  # (views of its home's arrays)
            return self._viewed(sid, self.read(self.homes[sid]))
        bufs = super().read(sid)
        self._to_host(sid)
        return bufs

    def written(self, sid: int) -> list[np.ndarray]:
        if sid in self.homes:
            return self._viewed(sid, self.written(self.homes[sid]))
        self._settle()  # (the host's write could change a failed call's inputs)
        bufs = super().written(sid)
        self._to_host(sid)  # a call writes some points: the others must be current too
        if sid in self.fresh:
            self._mark(sid, HOST)
        return bufs

    def _mark(self, sid: int, state: int):
        """Buffer ``sid``'s state ``state`` where it may be stale (``_stale``)."""
        self.fresh[sid] = state
        if state in _STALE:
            self._stale.add(sid)

    def written_at(self, sid: int, idxs: list[tuple]) -> list[np.ndarray]:
        """The arrays of ``sid`` for a write of one point, at ``idxs`` in each output's
        array: where the device holds the rest of the buffer, only the point's bytes will go
        up (nothing comes down)."""
        if sid in self.homes:  # (its points are its home's: all of it goes up)
            return self.written(sid)
        self._settle()
        bufs = self.buffers[sid]
        if bufs is None:
            bufs = self._allocate(sid, True)  # (zeros on both sides, or a donor's memory)
        if self.fresh.get(sid) not in (DEVICE, BOTH, POINTS):
            return self.written(sid)
        dirty = self.dirty.setdefault(sid, [])
        for k, (b, idx) in enumerate(zip(bufs, idxs)):
            at = b[idx]  # the point's elements: contiguous (its leading indices fixed)
            dirty.append((k, at.ctypes.data - b.ctypes.data, at.nbytes))
        self._mark(sid, POINTS)
        return bufs

    def allocate(self, touched: list[tuple[int, bool]]):
        self._allocated(touched, False)

    def _allocated(self, touched: list[tuple[int, bool]], freed: bool) -> frozenset:
        """The buffers ``touched`` each with its memory (``freed``: but those freed for good,
        given to another by a donation); their ids. Where none lost its memory since the
        last time (``_released``), each has it still: nothing to go through."""
        got = self._ready.get((id(touched), freed))
        if got is not None and got[1] == self._released:
            return got[2]
        buffers, released = self.buffers, self._released
        for sid, write in touched:
            if buffers[sid] is None and not (freed and sid in self._freed):
                self._allocate(sid, write)
        ids = got[2] if got is not None else frozenset(sid for sid, _ in touched)
        # (the count before: a donation among them goes through them again next time; the
        # list held with its id: no other list can take the id while it is kept)
        self._ready[id(touched), freed] = (touched, released, ids)
        return ids

    def swap_out(self, sid: int):
        self._settle()
        self._to_host(sid)
        super().swap_out(sid)

    def swap_in(self, sid: int):
        self._settle()
        super().swap_in(sid)
        if self.buffers[sid] is not None:
            self._mark(sid, HOST)  # copied back to the mirror: up at the next launch

    def prepare(self, touched: list[tuple[int, bool]]):
        """Before a graph's work is captured or replayed: the buffers it touches allocated
        (but those given to another by a donation) and current on the device, the table
        copied up (nothing may be copied while a graph is captured)."""
        self._current_on_device(self._allocated(touched, True))

    def _current_on_device(self, sids: frozenset):
        """Before a launch (or a graph's): the buffers ``sids`` current on the device (the
        host's writes copied up), the table copied up if an entry changed."""
        stale = self._stale
        if stale:
            fresh = self.fresh
            for s in [s for s in stale if s in sids]:
                self._to_device(s)  # (the host wrote it since the device did)
            stale.difference_update([s for s in stale if fresh.get(s) not in _STALE])
        if self._table_dirty:
            self.device.upload(self.dtable, self.dtable_host)
            self._table_dirty = False

    def _scratch_for(self, sid: int) -> tuple[int, tuple]:
        """Where a call of statement ``sid`` takes its scratch memory, and the halves of it
        that are then its (``graphs.Order``'s ``"scratch"``, ``"scratch-top"``): a call
        that fits in half of it takes the half the last such call did not, its bytes at the
        start or at the end, so that two calls one after the other that touch nothing of
        each other's need not wait for each other (PPO's rollout's permutation of the
        epoch's minibatches and the critic's pass after the rollout); a larger one, both."""
        need = self._statement_scratch.get(sid, 0)
        if need <= 0:
            return self._scratch, ()
        if 2 * need + 2 * SCRATCH_ALIGN > self._scratch_bytes:
            return self._scratch, ("scratch", "scratch-top")
        self._scratch_top = not self._scratch_top
        if not self._scratch_top:
            return self._scratch, ("scratch",)
        at = (self._scratch_bytes - need) // SCRATCH_ALIGN * SCRATCH_ALIGN
        return self._scratch + at, ("scratch-top",)

    def _resources(self, sid: int) -> tuple[tuple, tuple]:
        """What a call of statement ``sid`` reads and writes (``graphs.Order``): buffers by
        id, the environments' state, the BLAS (its workspace); the scratch memory's halves
        are the call's own (``_scratch_for``)."""
        got = self._resources_of.get(sid)
        if got is None:
            touched = self.touched_of((sid,))
            reads = tuple(s for s, w in touched if not w)
            writes = tuple(s for s, w in touched if w)
            if any(self.statements[p].is_env for p in self.parts(sid)):
                writes += ("env",)
            if any(isinstance(f, GemmCall) for f in self.phases.get(sid, ())):
                # (one cuBLAS handle, one workspace: its products run one at a time)
                writes += ("blas",)
            got = self._resources_of[sid] = (reads, writes)
        return got

    def aliases(self) -> dict:
        """Per buffer, those whose arena bytes meet its (``graphs.aliases``)."""
        if self._aliases is None:
            from timerlc.runtime.graphs import aliases

            sizes = {
                b.id: sum(arena._aligned(max(n, 1)) for n in arena.output_bytes(self.plan, b.id))
                for b in self.plan.buffers
            }
            self._aliases = aliases(self.layout, sizes)
        return self._aliases

    def graph_refused(self, error: Exception):
        """The device refused to capture a run as a CUDA graph: the run goes as launches
        from here; the first refusal is said on stderr (the run goes on)."""
        if not self.graph_refusals:
            print(
                f"timerlc: the device could not capture a CUDA graph "
                f"({type(error).__name__}: {px.clip(str(error))}); that run goes as launches",
                file=sys.stderr,
            )
        self.graph_refusals.append(f"{type(error).__name__}: {error}")

    def shift_function(self):
        """The module's ``tl_set_shift`` (``cuda.prelude.SHIFT_KERNEL``)."""
        if not hasattr(self, "_set_shift"):
            try:
                self._set_shift = self.device.function(self._module, "tl_set_shift")
            except (AttributeError, KeyError):
                raise PlanError(
                    "the plan's kernels have no tl_set_shift (written by an older timerlc): "
                    "compile the program again"
                ) from None
        return self._set_shift

    def _build(self, items, scope: tuple[str, ...]):
        """The cpu runtime's loop tree, but for the loops a loop kernel runs (one call of
        it), the calls a fused kernel makes (one call of it) and the runs of ``items`` that
        only launch (``graphs.runs``): each is a ``graphs.GraphRun``."""
        items = self._fuse_calls(self._loop_calls(items, scope))
        if not self.use_graphs:
            return super()._build(items, scope)
        from timerlc.runtime.graphs import GraphRun, capturable_fn, runs

        if not hasattr(self, "_capturable"):
            launch_only = (
                {
                    sid
                    for sid, _, _ in self.plan.kernels.statements
                    if sid not in self.valid and sid not in self.metric_of
                }
                | set(self._fused)
                | set(self._loop_parts)
            )
            self._capturable = capturable_fn(launch_only)
        steps = [
            GraphRun(self, part, scope) if isinstance(part, list) else self._item(part, scope)
            for part in runs(items, self._capturable)
        ]

        def run(env):
            for s in steps:
                s(env)

        return run

    def _loop_calls(self, items, scope: tuple[str, ...]) -> list:
        """``items`` with each loop a loop kernel runs (its function named after it,
        ``loops.function_name``) as one call of it (``LOOP + its index``: a statement of its
        own, ``_LoopCall``), inside ifs and loops too."""
        if not self.use_loops:
            return list(items)
        from timerlc.cuda.loops import body_calls, function_name

        top = self._loop_named is None
        if top:  # (the whole tree, the first time: then every row must have found its loop)
            self._loop_named = {}
        out = []
        for it in items:
            if isinstance(it, Loop):
                name = function_name(scope, it)
                if name in self._loop_named:
                    lid = self._loop_named[name]
                else:
                    lid = self._loop_kernel(name, it, scope, body_calls(it))
                if lid is not None:
                    out.append(Call(lid, tuple(scope)))
                    continue
                body = self._loop_calls(it.body, scope + (it.var,))
                it = dataclasses.replace(it, body=tuple(body))
            elif isinstance(it, If):
                then = self._loop_calls(it.then, scope)
                orelse = self._loop_calls(it.orelse, scope)
                it = dataclasses.replace(it, then=tuple(then), orelse=tuple(orelse))
            out.append(it)
        if top and len(self._loop_used) != len(self.plan.kernels.loops):
            raise PlanError(
                "the plan is not valid: a loop kernel of kernels.loops matches no loop of "
                "its tree that the kernel file has a function for"
            )
        return out

    def _loop_kernel(self, name: str, loop: Loop, scope, calls) -> int | None:
        """The id of the loop kernel of ``loop`` (its function ``name``), where the module
        has one and the plan names it (``kernels.loops``: the statements its body calls);
        else None (the loop runs as the tree's)."""
        rows = [k for k, r in enumerate(self.plan.kernels.loops) if r[0] == calls]
        try:
            fn = self.device.function(self._module, name) if rows else None
        except Exception:  # noqa: BLE001 - the module has no such function
            fn = None
        if fn is None:
            self._loop_named[name] = None
            return None
        if any(p in self.valid or p in self.metric_of for p in calls):
            raise PlanError("the plan is not valid: a loop kernel computes an output or a metric")
        k = rows[0]
        self._loop_used.update(rows)
        _, blocks, scratch = self.plan.kernels.loops[k]
        lid = LOOP + len(self._loop_parts)
        self._loop_parts[lid] = tuple(dict.fromkeys(calls))
        self._loop_scope[lid] = tuple(scope)
        self.phases[lid] = ((name, blocks * THREADS),)
        self._statement_scratch[lid] = scratch
        self._loop_named[name] = lid
        self.statements[lid] = _LoopCall(self, lid, tuple(scope))
        return lid

    def _fuse_calls(self, items) -> list:
        """``items`` with each run of calls that a fused kernel makes (its statements one
        after another at the same loop values; the longest) as one call of it (``FUSED +
        its index``): a statement of its own (``_FusedCall``)."""
        if not self._fused:
            return list(items)
        if not hasattr(self, "_fused_first"):
            self._fused_first: dict[int, list[int]] = {}
            for fid, parts in self._fused.items():
                if any(p in self.valid or p in self.metric_of for p in parts):
                    continue  # (a crafted plan's: the runtime records those after each call)
                self.statements[fid] = _FusedCall(self, fid, parts)
                self._fused_first.setdefault(parts[0], []).append(fid)
            for fids in self._fused_first.values():
                fids.sort(key=lambda f: -len(self._fused[f]))
        out, items, i = [], [self._fuse_inside(it) for it in items], 0
        while i < len(items):
            it = items[i]
            for fid in self._fused_first.get(it.statement, ()) if isinstance(it, Call) else ():
                parts = self._fused[fid]
                run = items[i : i + len(parts)]
                if len(run) == len(parts) and all(
                    isinstance(c, Call) and c.statement == p and c.args == it.args
                    for c, p in zip(run, parts)
                ):
                    out.append(Call(fid, it.args))
                    i += len(parts)
                    break
            else:
                out.append(it)
                i += 1
        return out

    def _fuse_inside(self, it):
        """A loop or an ``if`` with ``_fuse_calls`` applied to its bodies (a graph's run
        holds them whole)."""
        if isinstance(it, Loop):
            return dataclasses.replace(it, body=tuple(self._fuse_calls(it.body)))
        if isinstance(it, If):
            then, orelse = self._fuse_calls(it.then), self._fuse_calls(it.orelse)
            return dataclasses.replace(it, then=tuple(then), orelse=tuple(orelse))
        return it

    def parts(self, sid: int) -> tuple[int, ...]:
        """The statements a call of ``sid`` computes (a fused kernel's, a loop kernel's;
        else its own)."""
        got = self._fused.get(sid) or self._loop_parts.get(sid)
        return got or (sid,)

    def loops_of(self, sid: int) -> tuple[str, ...]:
        if sid in self._loop_scope:  # (a loop kernel takes the loops around it)
            return self._loop_scope[sid]
        return self.plan.statement(self.parts(sid)[0]).loops

    def touched_of(self, sids) -> list[tuple[int, bool]]:
        """``_touched`` of the statements the calls of ``sids`` compute."""
        return _touched(self.plan, {p for sid in sids for p in self.parts(sid)})

    def can_fail(self, sid: int) -> bool:
        # (a loop kernel's call outside its box fails too)
        return sid in self._loop_parts or any(p not in self._unfailing for p in self.parts(sid))

    # ------------------------------------------------------------------ launches
    def _launcher(self, sid: int, phases, scratch: int):
        """The function the statement calls for its kernel (``CpuRuntime``'s signature:
        the host's table, args and scratch, unused here): its phases run one after
        another, a function launched over the blocks its threads need (at most as many as
        the device holds at once, ``grid_limit``: each strides over its grid) or a product
        handed to the device's BLAS (``_gemm``), then the failure code read (where a
        function ran)."""
        state: list = []  # (set at the first call) functions, whether to read the code, ...

        def launch(_table, _args, _scratch) -> int:
            if not state:
                fns = tuple(self._phase_fns(sid, phases, scratch))
                # (a kernel that cannot fail leaves the code 0: not read, no wait)
                reads = self.can_fail(sid) and any(b for _, b in fns)
                touched = frozenset(s for s, _ in self.touched_of((sid,)))
                nloops = len(self.loops_of(sid))
                repeat = self._repeats.get(sid, 1)
                # (a repeated kernel's blocks: its launches see the block's number after the
                # loop values)
                blocks = np.zeros(nloops + 1, np.int64) if repeat > 1 else None
                state[:] = [fns, reads, touched, self.statements[sid].args, nloops, repeat, blocks]
            fns, reads, touched, args, nloops, repeat, blocks = state
            self._current_on_device(touched)
            fresh = self.fresh
            device = self.device
            scratch_ptr, halves = self._scratch_for(sid)
            if self._capturing:  # (what the call waits for in the graph)
                weight = len(fns) * repeat
                reads, writes = self._resources(sid)
                device.depend(self._order.call(reads, writes + halves, weight))
                made = self.launches + self.blas_calls
            if self.profile:
                start = device.mark()
            for r in range(repeat):
                values = args
                if blocks is not None:
                    blocks[:nloops] = args[:nloops]
                    blocks[nloops] = r
                    values = blocks
                self._launch_all(fns, values, scratch_ptr)
            if self._capturing:  # (a product's functions, each one after another)
                self._order.weigh(self.launches + self.blas_calls - made)
            if self.profile:
                self._marks.append((sid, start, device.mark()))
                if len(self._marks) >= 1024:
                    self._read_marks()
            if reads and not self._capturing:  # (read when the host next waits: _settle)
                self._pending.append((sid, tuple(int(v) for v in args[:nloops])))
            for p in self.parts(sid):
                fresh[p] = DEVICE
            return 0

        return launch

    def _phase_fns(self, sid: int, phases, scratch: int) -> list:
        """``_launcher``'s runs of ``phases``: a function and its blocks, or a callable of
        the call's loop values and the scratch memory's address (a product, ``_gemm``, or
        two in one pass, ``_joint``; a chain or the launches it stands for, ``_chain``) and
        0."""
        fns: list = []
        tf32 = getattr(self.device, "matmul", "float32") == "tensorfloat32"
        skip = -1  # (the launches up to this one: a chain's or a joint's, made before)
        for q, f in enumerate(phases):
            if q <= skip:
                continue
            if isinstance(f, ChainCall):  # (the next launches: items' check)
                skip = q + f.covers
                apart = self._phase_fns(sid, phases[q + 1 : skip + 1], scratch)
                fns.append((self._chain(f, apart), 0))
                continue
            if isinstance(f, GemmCall):
                run = self._gemm(sid, f, scratch)
                if f.joint and tf32:  # (the next launch, a product: items' check)
                    skip = q + 1
                    run = self._joint(f, run, self._gemm(sid, phases[q + 1], scratch))
                fns.append((run, 0))
                continue
            fns.append(self._function(*f))
        return fns

    def _chain(self, call: ChainCall, apart: list):
        """A chain's functions (``call``) or the launches they stand for (``apart``,
        ``_phase_fns``') as one function of the call's loop values and the scratch memory's
        address: as the products policy chooses between two ways (``_product_choice``,
        keyed by the chain's functions; ``fastest``: both timed at the first call; the
        launches apart while a graph is captured before then). Where TF32 products are asked
        for, the chain's TF32 functions (``ChainCall.tf32``), where it has them; the launches
        always where its dynamic shared memory is more than the device's blocks hold."""
        tf32 = getattr(self.device, "matmul", "float32") == "tensorfloat32" and call.tf32
        mine = call.tf32 if tf32 else call.functions
        shared = call.tf32_shared if tf32 else call.shared
        fns = [self._function(*f, shared) for f in mine]
        key = ("chain", *(f for f, _ in mine))
        chosen: list = []
        if None in fns:  # (its shared memory more than the device's blocks hold: the launches)
            self.chain_choices[key] = (None, None, False)
            chosen.append(False)

        def run(args, scratch_ptr: int):
            def launches():
                self._launch_all(apart, args, scratch_ptr)

            def chain():
                self._launch_all(fns, args, scratch_ptr)

            def choose():
                return self._product_choice(key, launches, chain, choices=self.chain_choices)

            _run_chosen(chosen, choose, chain, launches)

        return run

    def _function(self, name: str, threads: int, shared: int = 0) -> tuple | None:
        """A function of the module and the blocks a launch of it gets: as many as its
        ``threads`` ask for, at most as many as the device holds at once (``grid_limit``:
        each strides over its grid). With ``shared``, its launches' bytes of dynamic shared
        memory (a chain's), or None where the device's blocks cannot hold them
        (``dynamic_shared``)."""
        module = self._whole_module() if name in self._left_out else self._module
        try:
            fn = self.device.function(module, name)
        except MissingFunction:
            # (a plan whose kernels.covered is not the one the text was made with: the
            # function may be among those the run's compile left out)
            from timerlc.cuda.nvrtc import FUSED_ONLY

            fn = None
            if module is self._module and FUSED_ONLY in self.defines:  # (else the same)
                with contextlib.suppress(MissingFunction):
                    fn = self.device.function(self._whole_module(), name)
            if fn is None:
                raise PlanError(
                    f"the plan's kernel file has no function {name} (a corrupt or crafted "
                    "plan): compile the program again"
                ) from None
        if shared and not self.device.dynamic_shared(fn, shared):
            return None
        return fn, min(-(-threads // THREADS), self.device.grid_limit(fn))

    @property
    def scratch_bytes(self) -> int:
        """The bytes of the device's scratch memory: one for every call (the calls run one
        after another in a stream), the most any call needs."""
        return self._scratch_bytes

    @property
    def whole_module_loaded(self) -> bool:
        """Whether a call needed a function the run's compile left out (``_whole_module``):
        never, where the calls go as the code generator's trees fused them."""
        return self._whole is not None and self._whole is not self._module

    def _whole_module(self):
        """The module with the kernels the run's compile left out (``FUSED_ONLY``), loaded
        at the first call that needs one of them."""
        from timerlc.cuda.nvrtc import FUSED_ONLY

        if self._whole is None:
            if FUSED_ONLY not in self.defines:  # (the run's compile left none out)
                self._whole = self._module
            else:
                defines = tuple(d for d in self.defines if d != FUSED_ONLY)
                self._whole = self.device.load(self._text, self._cache, defines)
        return self._whole

    def _gemm(self, sid: int, call: GemmCall, scratch: int):
        """A ``GemmCall`` of statement ``sid``'s kernel as a function of the call's loop
        values and the scratch memory's address: where ``when`` holds, each operand's
        elements checked to lie inside its memory (the buffer at its table entry, or the
        scratch after ``at``), then the device's BLAS (``gemm``)."""
        loops = launch_loops(self.loops_of(sid), sid in self._repeats)
        when = px.compile_packed(call.when, loops)
        ops = (call.a, call.b, call.c)
        offsets = [px.compile_packed(o.offset, loops) for o in ops]
        shapes = (
            (call.k, call.m) if call.a.t else (call.m, call.k),
            (call.n, call.k) if call.b.t else (call.k, call.n),
            (call.m, call.n),
        )
        size = DTYPES[call.dtype]
        # (a buffer in another's memory has that one's entries: the entry is that one's)
        index_of = {index: key for key, index in self.slot.items() if key[0] not in self.homes}

        def memory(o, scratch_ptr: int) -> tuple[int, int]:
            if o.space == "scratch":
                return scratch_ptr + o.at, scratch - o.at
            key = index_of.get(o.at)
            owner = key[0] if key is not None else None
            if owner is not None and owner not in self.dev:
                # (a donor: its memory is the statement's that it was given to, its entry
                # the same address, its values there until that statement writes its own;
                # a product of the statement itself reads them: attention at B=1)
                owner = self.donee.get(owner)
            ptrs = self.dev.get(owner) if owner is not None else None
            if not ptrs:
                raise PlanError(
                    f"the plan is not valid: a product of statement {sid}'s kernel names table "
                    f"entry {o.at}, which holds no buffer"
                )
            return ptrs[key[1]], self._dev_bytes[owner][key[1]]  # (current: the launch's)

        # (ours with TF32 operands where TF32 is asked for and the product has them)
        tf32 = getattr(self.device, "matmul", "float32") == "tensorfloat32" and call.tf32
        own = [self._function(*f) for f in (call.tf32 if tf32 else call.own)]
        then = [self._function(*f) for f in call.then]  # (after the BLAS's only)
        a, b, c = call.a, call.b, call.c
        key = product_key(call)
        chosen: list = []  # (whether ours runs, once chosen)

        launch = self._launch_all  # (ours, or what runs after the BLAS's)
        at: list = []  # (the operands' addresses at the call: ready's)

        def ready(args, scratch_ptr: int) -> bool:
            """Whether the product runs at the call (``when``), its operands checked to lie
            in their memory (their addresses in ``at``)."""
            values = tuple(int(v) for v in args)
            if not when(values):
                return False
            at.clear()
            for o, off, (rows, cols) in zip(ops, offsets, shapes):
                base, nbytes = memory(o, scratch_ptr)
                first = off(values)
                if first < 0 or (first + (rows - 1) * o.ld + cols) * size > nbytes:
                    raise PlanError(
                        f"the plan is not valid: a product of statement {sid}'s kernel reads "
                        f"or writes outside its memory at {dict(zip(loops, values))}"
                    )
                at.append(base + first * size)
            return True

        def blas(args, scratch_ptr: int):
            self.device.gemm(
                call.dtype,
                call.m,
                call.n,
                call.k,
                at[0],
                a.ld,
                a.t,
                at[1],
                b.ld,
                b.t,
                at[2],
                c.ld,
            )
            self.blas_calls += 1
            self.chained += 1
            launch(then, args, scratch_ptr)

        def result() -> np.ndarray:  # (C's memory, as the product left it)
            dt = np.float32 if call.dtype == "f32" else np.float64
            host = np.empty((call.m - 1) * c.ld + call.n, dt)
            self.device.download(at[2], host)
            return host

        def way(args, scratch_ptr: int):
            """The product (``ready`` at the call) as ours or the BLAS's, as chosen."""
            if own and not chosen:
                got = self._product_choice(
                    key,
                    lambda: blas(args, scratch_ptr),
                    lambda: launch(own, args, scratch_ptr),
                    lambda: [result()],
                )
                if got is None:  # (not chosen while a graph is captured: the BLAS's, now)
                    blas(args, scratch_ptr)
                    return
                chosen.append(got)
            if chosen and chosen[0]:
                launch(own, args, scratch_ptr)
            else:
                blas(args, scratch_ptr)

        def run(args, scratch_ptr: int):
            if ready(args, scratch_ptr):
                way(args, scratch_ptr)

        run.ready, run.way, run.result = ready, way, result  # (for a joint: _joint)
        return run

    def _launch_all(self, fns, args, scratch_ptr: int):
        """Runs one after another (``_phase_fns``'): a function of the module launched over
        its blocks (``_function``'s), the loop values ``args`` going by value with the
        launch, or, where its blocks are 0, a callable of them and the scratch memory's
        address (a product, a chain)."""
        for fn, grid in fns:
            if grid:
                self.device.launch(fn, self.dtable, args, scratch_ptr, grid, self._shift)
                self.launches += 1
                self.chained += 1
            else:
                fn(args, scratch_ptr)

    def _joint(self, call: GemmCall, first, second):
        """Products ``first`` and ``second`` (``_gemm``'s, of ``call`` and the launch after
        it) as one function of the call's loop values and the scratch memory's address: where
        the device computes float32 products in TF32 and both run at the call,
        ``call.joint`` (our functions that make both in one pass over their rows) or the two
        as each is chosen, as the products policy chooses between those two ways
        (``_product_choice``, both C's compared; ``joint_choices``); else the two."""
        fns = [self._function(*f) for f in call.joint]
        key = ("joint", *(f for f, _ in call.joint))
        chosen: list = []

        def run(args, scratch_ptr: int):
            runs = (first.ready(args, scratch_ptr), second.ready(args, scratch_ptr))
            if not all(runs):  # (those that run at the call, each as chosen)
                for product, ready in zip((first, second), runs):
                    if ready:
                        product.way(args, scratch_ptr)
                return

            def apart():
                first.way(args, scratch_ptr)
                second.way(args, scratch_ptr)

            def joint():
                self._launch_all(fns, args, scratch_ptr)

            def both() -> list:
                return [first.result(), second.result()]

            def choose():
                return self._product_choice(key, apart, joint, both, True)

            _run_chosen(chosen, choose, joint, apart)

        return run

    def _product_choice(
        self, key: tuple, blas, ours, result=None, joint=False, choices=None
    ) -> bool | None:
        """Whether a product of shape ``key`` runs as our functions (``ours``) rather than
        the device's BLAS (``blas``): as the device's policy says (``products_policy``);
        where it says ``fastest``, each timed ``PRODUCT_TRIALS`` times at the shape's first
        call (their least time), once a run (``product_choices``), and ours, where faster,
        kept only where its C (``result``: a list of C's memory as the product left it)
        is the BLAS's within ``PRODUCT_TOLERANCE`` (else the BLAS's runs, and the distance is in
        ``product_disagreements``: our kernels are proved on the emulation, and a GPU could
        still show one wrong); None while a graph is captured and the shape was not yet
        timed (no wait there). With ``joint``, ``blas`` is two products each as chosen and
        ``ours`` their joint functions (``_joint``), ``result`` both C's, each compared with
        its own; the choice is in ``joint_choices``. ``choices``: where the choice is kept
        (a chain's, ``chain_choices``: ``blas`` the launches it stands for, ``ours`` it)."""
        if choices is None:
            choices = self.joint_choices if joint else self.product_choices
        got = choices.get(key)
        if got is not None:
            return got[2]
        policy = self.device.products
        if policy != "fastest":
            choices[key] = (None, None, policy == "ours")
            return policy == "ours"
        if self._capturing:
            return None
        device = self.device
        times: tuple[list, list] = ([], [])
        for _ in range(PRODUCT_TRIALS):
            for j, f in enumerate((blas, ours)):
                start = device.mark()
                f()
                times[j].append(device.elapsed(start, device.mark()))
        faster = min(times[1]) < min(times[0])
        if faster and result is not None:
            outputs = []
            for f in (blas, ours):
                f()
                device.elapsed(device.mark(), device.mark())  # (the stream done: C there)
                outputs.append(result())
            far = max(disagreement(x, y) for x, y in zip(outputs[1], outputs[0]))
            if far > PRODUCT_TOLERANCE.get(getattr(device, "matmul", "float32"), 1e-3):
                self.product_disagreements[key] = far
                faster = False  # (the call runs the BLAS's next: C as it leaves it)
        got = (min(times[0]), min(times[1]), faster)
        choices[key] = got
        return got[2]

    def _settle(self, final: bool = False):
        """Wait for the device and read its failure record, where a kernel that can fail
        ran since the last wait (``final``: in any case).

        Kernels do not wait to be checked: a failure sets the record (``tl_failed``: the
        code, the statement, the call's loop values) and every launch after it returns at
        once, so the device's buffers stay as the failing call left them. The host waits
        only before it reads the device's values, writes a buffer, or frees or donates one
        (each calls this first; a new buffer is zeroed in bytes a free released, after its
        wait), so a failed call's inputs are intact here: the
        interpreter computes that call again to say what failed, as after a cpu kernel. A
        failure no pending call accounts for is a kernel the plan says cannot fail
        (``kernels.unfailing``; a crafted plan)."""
        if not (self._pending or final):
            return
        pending, self._pending = self._pending, []
        code, sid, values = self.device.failure()
        if not code:
            return
        for psid, key in pending:
            if psid in self._loop_parts:
                if sid in self._loop_parts[psid]:
                    self._loop_failed(sid, code, values)
                continue
            # (a fused kernel records its first statement, and the failing one's place in
            # it as the code)
            parts = self.parts(psid)
            if parts[0] != sid:
                continue
            if key is None:  # (a graph's call: the record says which)
                key = tuple(values[: len(self.loops_of(psid))])
            if key == tuple(values[: len(key)]):
                self._explain(parts[code - 1] if 1 <= code <= len(parts) else sid, key)
        raise PlanError(
            "the plan is not valid: a kernel it says cannot fail (kernels.unfailing) failed"
        )

    def _explain(self, sid: int, key: tuple):
        """Statement ``sid``'s kernel failed at ``key``: the interpreter computes the call
        again, from the values as the kernel left them and the environments' state (raises
        the error that names the failing op and point)."""
        self._to_host(sid)
        for host, ptr in self.state_dev:
            self.device.download(ptr, host)
        self.statements[sid].rerun(key)

    def _loop_failed(self, sid: int, code: int, values):
        """Statement ``sid``'s call at ``values`` failed inside a loop kernel: its call
        outside the box (``loops.LOOP_BOX``) refused as the tree's would be, or computed
        again by the interpreter to say what failed. The other blocks may have run on past
        that call (each stops at its next iteration), so the call's inputs can have changed
        since: where the interpreter then finds no failure, the message says so."""
        from timerlc.cuda.loops import LOOP_BOX

        key = tuple(int(v) for v in values[: len(self.loops_of(sid))])
        st = self.statements[sid]
        if code == LOOP_BOX:
            st.run(key)  # (raises: a call outside its box)
        try:
            self._explain(sid, key)
        except RunError as e:
            if not str(e).startswith("internal error"):
                raise
        at = ", ".join(f"{d}={v}" for d, v in zip(self.loops_of(sid), key))
        raise RunError(
            f"statement {sid} ({self._name(sid)}) failed at {at} inside a loop run as one "
            "kernel, and the loop ran on before its inputs could be read back: run with "
            "--profile (no loop kernels) to see what failed"
        )

    def _read_marks(self):
        """The device's seconds between each call's marks, added to its statement's."""
        for sid, start, end in self._marks:
            seconds = self.device.elapsed(start, end)
            self.device_seconds[sid] = self.device_seconds.get(sid, 0.0) + seconds
        self._marks = []

    def mark_replay(self, run: str, start, end):
        """A replay of ``run`` between the device's marks ``start`` and ``end``
        (``time_graphs``), read 256 at a time."""
        self._graph_marks.append((run, start, end))
        if len(self._graph_marks) >= 256:
            self._read_graph_marks()

    def _read_graph_marks(self):
        for run, start, end in self._graph_marks:
            got = self.graph_seconds.setdefault(run, [0.0, 0])
            got[0] += self.device.elapsed(start, end)
            got[1] += 1
        self._graph_marks = []

    # ------------------------------------------------------------------ metrics
    def emit(self, nid: int, batch):
        """A metric's values at the points of a call: where the device holds them, copied
        down in the launches' stream with the failure record (``snapshot``), and handed to
        ``on_metric`` once the device got there (``_deliver``: at a later metric, at the
        run's end), in order; the host does not wait for the device (a read of the values
        did, once per metric call). A copy whose record shows a failure hands nothing on:
        the failure is explained instead, as before."""
        if self.on_metric is None:
            return
        bufs = self.buffers[nid]
        if not self.async_metrics or self.fresh.get(nid) != DEVICE or bufs is None:
            self._deliver(block=True)
            super().emit(nid, batch)
            return
        st = self.statements[nid]
        host = bufs[0]
        if st.dims:
            cols = [batch.coords[d] for d in st.dims]
            order = np.lexsort(list(reversed(cols)))
            points = [tuple(int(c[k]) for c in cols) for k in order]
        else:
            points = [()]
        flat = [int(np.ravel_multi_index(p, host.shape)) if p else 0 for p in points]
        lo, hi = min(flat), max(flat) + 1
        size = host.dtype.itemsize
        snap = self.device.snapshot(self.dev[nid][0] + lo * size, (hi - lo) * size)
        at = [f - lo for f in flat]
        self._metrics.append((self.metric_of[nid], st.dims, points, at, snap, host.dtype))
        self.downloaded += (hi - lo) * size
        self._deliver(block=False)

    def _deliver(self, block: bool, settle: bool = True):
        """Hand the metrics whose copies the device made to ``on_metric``, in order
        (``block``: all, waiting for the device). A copy whose failure record is set stops
        there: ``settle`` explains the failure (raises)."""
        while self._metrics:
            name, dims, points, at, snap, dtype = self._metrics[0]
            if not block and not self.device.ready(snap):
                return
            self.device.wait(snap)
            values, record, _ = snap
            if int(record[:1].view(np.int32)[0]):
                if settle:
                    self._settle(final=True)  # (explains the failure: raises)
                    raise RunError(
                        "internal error: a metric's copy shows a failure the device's record "
                        "does not"
                    )
                return
            self._metrics.popleft()
            got = values.view(dtype)
            for p, k in zip(points, at):
                self.on_metric(name, dict(zip(dims, p)), got[k][()])

    def run(self):
        try:
            super().run()
        except BaseException:
            # the metrics of the calls before the error: handed on (nothing lost)
            with contextlib.suppress(Exception):
                self._deliver(block=True, settle=False)
            raise
        self._deliver(block=True)
        if self.profile:
            self._read_marks()
        if self._graph_marks:
            self._read_graph_marks()
        # (a pending failure; and a kernel the plan says cannot fail leaves no record
        # behind: one that failed anyway, a crafted plan's, is found here at the latest)
        self._settle(final=True)

    def close(self):
        """Release the device memory (the runtime cannot run after)."""
        for sid in list(self.dev):
            self._release_buffer(sid)
        for ptr in list(self._sizes):
            self._release(ptr)
        if self.layout is not None and self._arena:
            self.device.release_arena(self._arena)
            self.device_bytes -= self.layout.size
            self._arena = 0
