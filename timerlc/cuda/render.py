"""Rendering kernels (``codegen.kir``) as CUDA C text.

A kernel's top-level statements are cut into *steps*, each a function ``__global__ void
NAME(void **table, const tl_args args_in, char *scratch, int *err, const long long *shift)``
(``NAME``, then
``NAME_1``, ``NAME_2``, ...) that the device runtime launches one after another over a grid
of blocks of ``THREADS`` threads (``Launches``: each step and the threads it asks for):

- a ``parallel`` loop (a statement's loop over its vector dims, ``kir.For.parallel``) is
  one thread per iteration, the loop striding over the grid; each thread has its own locals
  and its own copy of the per-point temporaries (a temporary written in the loop and used
  nowhere else);
- a gemm is a call of the device's BLAS (``items.GemmCall``: no function of ours), or, where
  its offsets are not plan expressions, one thread per element of the product, each summing
  its terms in order;
- a reduction (``kir.For.reduce``) leaves a partial result per block, which the step after
  it combines in block order (``_reduction``); a permutation is its keys, the passes of a
  merge sort by rank and its indices, each a step over its elements;
- a run of the other statements runs on one thread (of block 0). A local it assigns that
  another step reads goes through the scratch memory, after the kernel's temporaries (the
  step stores it at its end, the others load it at their start);
- consecutive steps over the same rows whose rows never meet (loops, rows products and
  grams of ours) may run as one function, a *chain* (``_Kernel._chains``,
  ``chain_body``), each block a few rows through all of them in turn: the plan has the
  chain's function and the launches it stands for after it (``items.ChainCall``), the
  runtime runs one.

An ``if`` whose condition reads only the call's loop values (a merge's branch, a domain) is
taken apart first: each statement inside it is a statement of the kernel under its
condition (``_steps``), so that the work inside runs on the grid too; consecutive parallel
loops under exclusive conditions (the two branches of one ``if``) share a function
(docs/cuda.md).

``table`` holds the device addresses of the plan's buffers, ``args_in`` the call's loop values
(a struct passed by value, as a launch's parameters are: nothing to copy before a launch),
``shift`` null or what to add to them (``tl_shifted``: a launch replayed in a CUDA graph
takes the loop values of an enclosing loop from there, ``runtime/graphs.py``), ``scratch`` the temporaries (global memory, shared by the steps). A ``Fail`` sets its
block's code and skips the rest of its point (or of the serial step); the block then sets
``*err`` if it is still 0 (``tl_failed``: with the statement and the call's loop values
after it), and every later step, of this call or a later one, returns at once when ``*err``
is set: the runtime reads it only when it next waits for the device. A parallel loop inside another statement (an
element loop inside a loop over points, the cpu's blocks of a layer chain) runs on its
step's thread like any loop, but for ``if c: <parallel loop>``, which becomes the loop of
``if c: <its body>``.
Scalars follow NumPy's semantics for their dtype, as the LLVM renderer's do
(``docs/codegen.md``): the helpers of ``prelude.PRELUDE``, spelled by ``cexpr``. Bools are
``bool`` in registers and one byte in memory.

Random draws call the Philox library of ``prelude._philox_c`` (bit for bit
``timerlc/rng.py``, as the LLVM kernels' draws are; the module must be compiled without
contracting multiply-adds: ``--fmad=false``). An environment's kernel (``codegen.envs``) finds its state at the table
entries the runtime keeps for it, as on the cpu. Not rendered yet (``Unsupported``): tree
functions.

What the renderer asks of statements before it cuts them into steps is in ``cuda.facts``
(reads, writes, independence, nests) and ``cuda.shapes`` (the loop shapes it recognizes:
column sums, epilogues, rows a chain's levels keep to); the C text every module starts
with is ``cuda.prelude``'s.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

from timerlc.codegen import kir
from timerlc.codegen.kir import (
    Bin,
    Cast,
    Const,
    Fail,
    Fn,
    For,
    Gemm,
    If,
    Let,
    Load,
    Permute,
    Ref,
    Sel,
    Store,
    Un,
)
from timerlc.cuda import products
from timerlc.cuda.cexpr import (
    CTYPE,
    MTYPE,
    RNG_FUNCTIONS,
    Unsupported,
    binary,
    cast,
    const,
    identity,
    unary,
)
from timerlc.cuda.facts import (
    _FACTS,
    _TOUCHED,
    _apart_sums,
    _assignment,
    _buffers,
    _by_id,
    _carried,
    _check_supported,
    _column_loads,
    _constant_nest,
    _exclusive,
    _exprs,
    _fails_any,
    _grid_work,
    _groups,
    _independent,
    _independent_of_run,
    _joins,
    _lets,
    _lin,
    _nest,
    _plan_expr,
    _point_loads,
    _pushed_in,
    _read,
    _refs,
    _refs_of,
    _rewrites,
    _runs,
    _subst,
    _uniform,
    _uniform_checks,
    _updates,
    _written,
)
from timerlc.cuda.nvrtc import NO_TF32, TF32_ONLY
from timerlc.cuda.prelude import (
    PRELUDE,
    SHIFT_KERNEL,
    _philox_c,
    leave_out,
)
from timerlc.cuda.shapes import (
    _column_sum,
    _epilogue,
    _epilogue_apart,
    _gram_loop,
    _lanes_combine,
    _level_accesses,
    _levels_local,
    _one_column,
    _own_grid,
    _product_loop,
    _row_loop,
    _row_stride,
    _rows_local,
    _spread,
    _spread_nest,
    _zeros,
)
from timerlc.plan import expr as px
from timerlc.plan import items
from timerlc.plan.arena import first_fit
from timerlc.plan.items import MAX_PHASES


def head() -> str:
    """The text every module starts with (the scalar helpers and the Philox library): the
    emulation compiles it once, as a precompiled header (``timerlc.cuda.emu``)."""
    return PRELUDE.replace("@UNROLL@", str(UNROLL)) + "\n" + _philox_c()


ARGS = 8  # the most loop values a kernel takes (``tl_args`` in PRELUDE)
THREADS = 128  # of a block: the device runtime launches every function with blocks of them
# the times the GPU's compilers unroll a reduction's loop over its terms (``TL_UNROLL``): on
# the H100 PPO's minibatch step took 11.47 ms an iteration at 4, 11.27 at 8, 11.23 at 16
# (``scripts/cuda_sweep.py``)
UNROLL = 8
PARTS = 256  # the most blocks a reduction's step runs on (a partial result each)
# a permutation's merge sort: the passes whose runs lie within a tile of 2^this keys run in
# one step, a block a tile (its threads meeting between two passes)
PERM_TILE_PASSES = 11
# or, where it has at most PERM_BUCKETS buckets of PERM_BUCKET keys on average (the keys'
# draws' top bits), four steps (``_Kernel.perm_buckets``): each chunk of PERM_CHUNK keys'
# count a bucket, the buckets' places, the keys into their buckets, each bucket sorted by
# a block in its shared memory (PERM_CAP keys at most; a larger one, which random draws
# all but never make, ranked in the device's memory). The merge sort's 10 launches took
# 183 us a permutation of 262,144 on the H200 (PPO 2048's minibatches, 4 an iteration)
PERM_BUCKET, PERM_BUCKETS, PERM_CHUNK, PERM_CAP = 1024, 2048, 4096, 4096
# a reduction or a permutation of fewer terms stays on its serial step's thread (two or more
# launches more would cost more than the terms)
GRID_TERMS = 512
# a loop over at least WIDE_ROWS rows of at least WIDE points each, or of at least
# LONG_ROW points each over any rows, stays out of the rows merged into one loop (``_wide``)
WIDE, WIDE_ROWS, LONG_ROW = 32, 8192, 128
# a sum of fewer terms in a run on one thread, of at least this many, is the run's block's
# (its threads take the terms, a tree combines them: no launch more)
BLOCK_TERMS = 64
PART_BYTES = 1 << 20  # the most scratch a reduction into a temporary keeps partial copies in
# the most blocks an array reduction runs on (``_array_blocks``), its last blocks combining
# the copies in groups (``_Kernel.group_combine``): all of them at once on an H100 (2,112
# blocks of 128 threads); at 256 blocks PPO's bias gradients of 65,536 rows were 4 warps
# an SM, each thread's loads 128 rows one after another (56-77 us for 33.5 MB, 11 us at the
# H100's bandwidth)
ARRAY_PARTS = 2048
# a bias gradient rides on its weight gradient's gram of ours (``_Kernel._gram_sums``); off:
# a reduction of its own (``scripts/cuda_sweep.py --gram-sums`` compares them)
GRAM_SUMS = True
# a layer's elementwise loop after its rows product (``tanh(x @ W + b)``; ``dz * (1 - h^2)``
# after ``dz @ W^T``) made by the product's kernel of ours as it stores C
# (``_Kernel._rows_epilogues``); off: ``scripts/cuda_sweep.py --epilogues 0``
ROWS_EPILOGUES = True
# a rows product and the gram whose B is its A (``dz @ W^T`` and ``h^T @ dz``) made in one
# pass over their rows where TF32 is asked for, as the runtime chooses
# (``_Kernel._joint_pair``, ``GemmCall.joint``)
JOINTS = True
# a loop step after a product of ours that touches nothing of its runs in the product's
# launch, on blocks of its own (``_Kernel._beside``); off: a launch of its own
BESIDE = True
# a gram with its column sums makes the steps after them that read only them (the bias
# gradient's cast to float32 and copy) in its last function's last block, where they were a
# launch of their own (``_Kernel._sums_tail``)
GRAM_TAILS = True
# a kernel's reductions moved ahead of the loops before them that they touch nothing of,
# so that those loops may join the ones after (``_reductions_ahead``)
REDUCTIONS_AHEAD = True
# consecutive steps of loops over a product's rows and products of ours over them whose
# rows never meet may run as one function, a block's rows through all of them in turn
# (``_Kernel._chains``, the runtime's choice): CHAIN_ROWS rows at a time (a multiple of
# each rows product's tile); CHAIN_GRAM_ROWS where a gram is among them (its copies'
# chunks whole tiles of them)
CHAINS = True
# a chain's own buffers a tile at a time in its chunk's first tile's rows (_chain_remap)
CHAIN_REMAP = True
CHAIN_ROWS = 128
CHAIN_GRAM_ROWS = 64
# the most shared memory a chain's function takes, in floats (100 KB: two blocks an SM of
# sm_90's 228 KB; PPO's minibatch step's forward and backward as one chain with TF32
# products takes 99 KB, with float32 ones 90); past ``products.SMEM_FLOATS`` the launch's
# dynamic shared memory (``chain_body``), which a device whose blocks hold less (sm_86's and
# sm_89's 99 KB) does not give: the runtime then runs the launches the chain stands for
# (``CupyDevice.dynamic_shared``), among them the chains within static shared memory
CHAIN_SMEM_FLOATS = 25600
# a thread of a grid's loop whose points are stores alone takes this many of its points at
# once, all their loads before any store (``_Kernel.batched``): one point's load, then its
# store, which the next point's load may not pass (the buffers may alias), kept a single
# load of each thread in flight: 2,048 threads an SM, 8 KB, some 1 MB on the GPU, under the
# H200's bandwidth times its latency
IN_FLIGHT = 4
# (of at most this many stores: PPO's step of nine stores a point took 168 registers a
# thread so, 48 without; ptxas, sm_90)
IN_FLIGHT_STORES = 2
# a thread's statements read what they do not write before the first, and a value stored
# and read back at the same index (no store between that may write it) from a local
# (``_Kernel.straight``, ``_Kernel.forwarded``); off: each load where it was
FORWARD = True
_SIZE = {"bool": 1, "i32": 4, "i64": 8, "f32": 4, "f64": 8}


@dataclass(frozen=True)
class _Own:
    """How a ``gemm`` step runs as a function of ours (``products``): ``kind`` rows, or a
    gram's part or sum; ``at``, the byte of the scratch memory its copies start at; with
    ``acc``, B's column sums into that float64 temporary too, ``sums`` the reduction's
    first values and the reduction (``_gram_sums``); with ``epilogue``, the loop nest over
    C's elements that the rows function makes as it stores them (``_rows_epilogues``)."""

    kind: str
    at: int | None = None
    acc: str | None = None
    sums: tuple = ()
    epilogue: object = None
    tf32: bool = False  # (its operands TF32, the tensor cores': products.tf32_form)
    # (kind joint: the gram whose B is this rows product's A, made in the same pass over
    # their rows, ``_Kernel._joint``; ``acc``, ``sums``: its column sums')
    other: object = None
    # (a gram's sum of copies with its column sums: the steps after the sums that read
    # only them, its last block's to run, ``_Kernel._gram_sums``)
    tail: tuple = ()
    # (a loop step that touches nothing of the product's, run by blocks of the same launch
    # beside the product's: ``_Kernel._beside``)
    beside: object = None


@dataclass(frozen=True)
class _Step:
    """A step of a kernel (``_Kernel._steps``): ``kind`` serial (``body`` a list of
    statements), parallel (a ``For``, its guard inside; ``form``: its guard's literals),
    either (parallel loops, any two under exclusive guards or touching nothing of each
    other's, one function; ``form``: each one's
    literals), gemm (a ``Gemm``), reduce (a ``For`` with its ``form``, ``_reduction``, and
    its number, ``_combine``), perm (a ``Permute``'s keys, a pass of its sort or its
    indices: ``form``) or blas (a ``GemmCall``, its gemm the ``form``: no function of
    ours), run where ``guard`` holds."""

    kind: str
    body: object
    guard: object = None
    form: object = None
    number: int = -1
    # (a blas step's where ours may run instead (``_Kernel.own_product``): how ours computes
    # the product with what follows it, an epilogue or B's column sums; and the steps that
    # make the same after the BLAS's product, ``GemmCall.then``)
    own: _Own | None = None
    after: tuple = ()

    def statements(self) -> list:
        """The kernel IR statements the step runs (for what they read and write)."""
        if self.kind == "serial":
            return self.body
        if self.kind == "blas":
            return [self.form] + [x for st in self.after for x in st.statements()]
        if self.kind == "gemm" and self.form is not None:
            # (a gram with its B's column sums; a rows product with its epilogue)
            extra = [self.form.epilogue] if self.form.epilogue is not None else []
            extra += [self.form.other] if self.form.other is not None else []
            extra += [x for t in self.form.tail for x in t.statements()]
            return [self.body, *self.form.sums, *extra]
        if self.kind == "either":
            return list(self.body)
        if self.kind == "chain":  # (its steps: _Kernel._chains)
            return [x for st in self.body for x in _chain_used(st)]
        return [self.body]


@dataclass(frozen=True)
class Launches:
    """How a kernel runs: its steps, one after another: a function of the module
    (``(name, threads)``: the threads a launch asks for, as blocks of ``THREADS``) or a
    product the device's BLAS computes (``items.GemmCall``); and the bytes of scratch memory
    a call needs (the kernel's temporaries, then the values its steps pass on)."""

    phases: tuple[tuple[str, int] | items.GemmCall, ...]
    scratch: int
    fails: bool = True  # whether a step can fail (else no failure code to read back)
    repeat: int = 1  # the times a call runs the phases (``kir.Kernel.repeat``)


def render_module(
    kernels, blas: bool = True, confined: dict | None = None
) -> tuple[str, dict[str, str], dict[str, Launches]]:
    """The CUDA C text of the ``kernels`` it renders (after ``head()``), why it renders none
    of the others (kernel name -> reason), and how each it renders runs; ``blas``: a gemm
    whose offsets are plan expressions is a call of the device's BLAS (else a step of
    ours, one thread per element of the product); ``confined``: per kernel name, the
    buffers only it touches, written afresh at each call (``codegen.generate._confined``:
    its chains may keep them a tile at a time, ``_chain_remap``)."""
    parts, skipped, launches = render_kernels(kernels, blas, confined)
    return "\n".join([head(), SHIFT_KERNEL, *parts]), skipped, launches


def render_kernels(
    kernels, blas: bool = True, confined: dict | None = None
) -> tuple[list[str], dict[str, str], dict]:
    """``render_module``'s kernels without the module's head: the text of each it renders,
    why it renders none of the others, how each it renders runs."""
    parts, skipped, launches = [], {}, {}
    _TOUCHED.clear()  # (a build's statements: they go)
    _FACTS.clear()
    _KEYS.clear()
    for k in kernels:
        try:
            r = _Kernel(k, blas, confined=(confined or {}).get(k.name, frozenset()))
            parts.append(r.render())
            fails = any(isinstance(s, Fail) for s in kir.walk_tree(k.body))
            launches[k.name] = Launches(tuple(r.phases), r.scratch, fails, k.repeat)
        except Unsupported as e:
            skipped[k.name] = str(e)
    return parts, skipped, launches


def steps(k: kir.Kernel, blas: bool = True) -> list[tuple[str, object]]:
    """How kernel ``k`` runs on a device: ``(kind, body)`` per step, in launch order
    (``_Kernel._steps``: kind serial, parallel, gemm, blas (a ``GemmCall``), reduce or perm;
    a reduction's combining statement is in the step after it)."""
    return [(st.kind, st.body) for st in _Kernel(k, blas)._steps()]


def _blas_call(k: kir.Kernel, s: Gemm, guard=None):
    """Kernel ``k``'s gemm ``s`` (under ``guard``) as a call of the device's BLAS
    (``items.GemmCall``), or None where an offset or the guard is not a plan expression
    (it then runs as a step of ours)."""
    params = tuple(k.params)
    slots = {x.name: x.index for x in k.slots}
    temps = {t.name: t.offset for t in k.temps}

    def operand(b: str, off, ld: int, t: bool):
        e = _plan_expr(off, params)
        if e is None or (b not in slots and b not in temps):
            return None
        space, at = ("table", slots[b]) if b in slots else ("scratch", temps[b])
        return items.Operand(space, at, e, ld, t)

    a = operand(s.a, s.aoff, s.lda, s.ta)
    b = operand(s.b, s.boff, s.ldb, s.tb)
    c = operand(s.c, s.coff, s.ldc, False)
    when = True if guard is None else _plan_expr(guard, params)
    if a is None or b is None or c is None or when is None or s.dtype not in ("f32", "f64"):
        return None
    try:  # (as the plan's reader will check them)
        for o in (a, b, c):
            px.check(o.offset, params)
        px.check(when, params, "bool")
    except px.ExprError:
        return None
    return items.GemmCall(s.dtype, s.m, s.n, s.k, a, b, c, when)


def _reductions_ahead(body, k: kir.Kernel) -> tuple:
    """``body`` with each reduction (``For.reduce``), the locals set just before it (its
    accumulators' first values) and the statements after it up to the next parallel loop
    moved ahead of the parallel loops just before them that they touch nothing of, none of
    which can fail: the loops before and the loop after may then be
    one loop over their rows (``_row_merged``; PPO's gathers of a minibatch's rows and its
    first layers, a launch each side of the advantages' mean and variance, which read
    none of theirs)."""
    out: list = []
    shared = frozenset(k.shared)
    items = list(body)
    q = 0
    while q < len(items):
        s = items[q]
        if not (isinstance(s, For) and s.reduce):
            out.append(s)
            q += 1
            continue
        end = q + 1
        while end < len(items) and not (isinstance(items[end], For) and items[end].parallel):
            end += 1
        group = items[q:end]
        while out and isinstance(out[-1], Let):  # (its accumulators' first values)
            group.insert(0, out.pop())
        at = len(out)
        while (
            at > 0
            and isinstance(out[at - 1], For)
            and out[at - 1].parallel
            and not _fails_any([out[at - 1], *group])
            and _independent([out[at - 1]], group, shared)
        ):
            at -= 1
        out[at:at] = group
        q = end
    return tuple(out)


def _gemms_first(body, k: kir.Kernel) -> tuple:
    """``body`` with each product of the device's BLAS (``_blas_call``) among its
    statements moved ahead of those before it that touch nothing of its and cannot fail,
    up to another product (``_Kernel._products_early`` for the products under a guard): the
    loops on either side of it may then be one (the logits' log-sum-exp over their rows and
    their normalization after the value head's product, one loop a row)."""
    out: list = []
    for s in body:
        ahead = isinstance(s, Gemm) and _blas_call(k, s) is not None
        out.insert(_ahead(out, s, k.shared) if ahead else len(out), s)
    return tuple(out)


def _ahead(before: list, s, shared=(), statement=lambda x: x) -> int:
    """Where product ``s`` goes among the statements ``before`` it (``statement``: an
    item's statement): ahead of the last of them that it touches nothing of and that cannot
    fail, up to another product or a permutation."""
    at = len(before)
    while at > 0:
        p = statement(before[at - 1])
        if (
            isinstance(p, (Gemm, Permute))
            or _fails_any([p])
            or not _independent([p], [s], frozenset(shared))
        ):
            break
        at -= 1
    return at


# functions()' counts, by the kernel and the renderer's settings (``_settings``): a build's
# fusion search asks for hundreds (each a kernel rendered but for its text: most of a cuda
# build's time), and a process that builds the same program again (the tests, the scripts)
# asks for the same ones again; emptied when it holds ``COUNTS_KEPT``
_COUNTS: dict = {}
COUNTS_KEPT = 4096


def _settings() -> tuple:
    """Every setting of this module's and of ``products``' (their upper-case names of a
    number, a flag or a string), with its value: what a kernel's count depends on besides
    the kernel."""
    out = []
    for module in (globals(), vars(products)):
        for key, value in module.items():
            if key.isupper() and isinstance(value, (bool, int, float, str)):
                out.append((key, value))
    return tuple(out)


def functions(k: kir.Kernel, blas: bool = True) -> int:
    """The functions a call of kernel ``k`` launches (its products by the device's BLAS
    aside); one more than its statements' where it renders none (``Unsupported``: they are
    launched one by one then). Kept for the next build's asking (``_COUNTS``)."""
    return _kept(_COUNTS, k, (blas,), lambda: _functions(k, blas))


class _Key:
    """A kernel's fields that its counts depend on (``kernel_key``), their hash worked out
    once: a kernel's body is a tree of statements whose hash is the whole tree's."""

    __slots__ = ("fields", "hash")

    def __init__(self, fields: tuple):
        self.fields = fields
        self.hash = hash(fields)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _Key) and (
            self.fields is other.fields
            or (self.hash == other.hash and self.fields == other.fields)
        )


# per kernel, by its identity: its key (``_by_id``)
_KEYS: dict[int, tuple] = {}


def kernel_key(k: kir.Kernel) -> _Key:
    """What a kernel's counts (``functions``, ``chain_saved``) depend on of it, as a key:
    kernels of the same fields under other names (a fused kernel the orders by level and
    the lowering after them both make) have one."""
    return _by_id(
        _KEYS,
        k,
        lambda k: _Key(
            (k.parts or (k.sid,), k.params, k.body, k.temps, k.slots, k.shared, k.repeat)
        ),
    )


def _kept(store: dict, k: kir.Kernel, more: tuple, work):
    """``work()``'s value for kernel ``k`` (and ``more``) as ``store`` keeps it, by the
    kernel and the settings (``_settings``); ``store`` emptied when it holds
    ``COUNTS_KEPT``."""
    key = (kernel_key(k), *more, _settings())
    got = store.get(key)
    if got is None:
        if len(store) >= COUNTS_KEPT:
            store.clear()
        got = store[key] = work()
    return got


def _functions(k: kir.Kernel, blas: bool) -> int:
    """``functions``' count, worked out."""
    try:
        # (counted as if each product's epilogue were a loop of its own: an epilogue's
        # loop may join others, and the fused kernels chosen by this count are those of
        # loops joined, where a product with its epilogue joins nothing and fusion around
        # it stalled, PPO at B=4 T=16 making 5 launches a minibatch step more; the
        # epilogues go into the products after: ``_rows_epilogues``. A gram with its B's
        # column sums counts as the gram: ours makes the sums in the gram's functions, at
        # no launch more, and the BLAS's path launches for them what their reduction would
        # apart. Counted as ours alone, 2 functions where the BLAS's gram was 0, the sums
        # were cheaper apart by this count, and the orders by level put them apart: PPO's
        # 64 x 64 weight gradients lost their bias sums, a pass more over dy each)
        r = _Kernel(k, blas, choosing=False)
        _check_supported(r.k.body)
        steps = r._steps()
        return sum(1 for j, _, _ in r._units(steps, spread=True) if steps[j].kind != "blas")
    except Unsupported:
        return len(k.parts or (k.sid,)) + 1


_SAVED: dict = {}  # (chain_saved's counts, by the kernel and the settings, as _COUNTS)


def chain_saved(k: kir.Kernel) -> int:
    """The launches a call of kernel ``k`` makes fewer where its chains run
    (``_Kernel._chains``: each chain one launch for its steps' launches, a product's as
    many as its functions of ours); 0 where it renders none (``Unsupported``). For the
    fusion search (``codegen.tree``: two kernels one after the other are one where their
    chains then save more). Kept as ``functions``' counts."""
    return _kept(_SAVED, k, (), lambda: _chain_saved(k))


def _chain_saved(k: kir.Kernel) -> int:
    """``chain_saved``'s count, worked out."""
    if not CHAINS:
        return 0
    try:
        r = _Kernel(k)
        _check_supported(r.k.body)
        steps, _, _, _, _, chains = r._chained_steps()
    except Unsupported:
        return 0

    def launches(st: _Step) -> int:
        if st.kind != "blas":
            return 1
        g = st.form
        return max(1, len(products.launches(g.m, g.n, g.k, g.ta, g.tb)))

    outermost = [r for r in chains if not any(set(r) < set(x) for x in chains)]
    return sum(sum(launches(steps[q]) for q in run) - 1 for run in outermost)


def name(v: str) -> str:
    """A local's C name (kernel IR names may hold ``.`` and ``$``)."""
    return "v_" + v.replace(".", "_").replace("$", "_")


def buf(b: str) -> str:
    """A buffer's C name (a fused kernel's temporaries are named ``t1.2``)."""
    return "m_" + b.replace(".", "_").replace("$", "_")


class _Kernel:
    def __init__(
        self,
        k: kir.Kernel,
        blas: bool = True,
        merge_rows: bool = True,
        choosing: bool = True,
        confined: frozenset = frozenset(),
    ):
        # (not where two of its buffers are one memory, a donation's: a loop reading the
        # donor's at one row and another writing the statement's at another would meet)
        merge_rows = merge_rows and not k.shared
        body = _gemms_first(k.body, k) if blas else k.body
        temps = frozenset(t.name for t in k.temps)
        body = _reductions_ahead(body, k) if merge_rows and REDUCTIONS_AHEAD else body
        body = _reductions_joined(_fissioned(body, temps), k) if merge_rows else body
        body, self.row_shared = _row_merged(body) if merge_rows else (body, set())
        self.k = k = dataclasses.replace(k, body=_spread(body))
        self.blas = blas
        self.lines: list[str] = []
        self.labels = 0
        self.bufs = {s.name: s.dtype for s in k.slots} | {t.name: t.dtype for t in k.temps}
        self.local_temps: set[str] = set()  # temps of a parallel loop's own (per thread)
        self.again: set[str] = set()  # (temporaries declared again: temps_again)
        self.jumps: set[str] = set()  # the labels a Fail jumps to
        self.phases: list[tuple[str, int]] = []  # (function, threads) launched in order
        self.parts: dict[str, list] = {}  # a reduction's scratch: name -> [dtype, n, offset]
        self.others: set[str] = set()  # the buffers the other steps use
        # the buffers nothing but this kernel touches, written afresh at each call
        # (``codegen.generate._confined``; a chain's, ``_chain_remap``)
        self.confined = frozenset(confined)
        self.scratch = k.scratch_bytes
        self.copies_at = 0  # (the scratch byte our products' copies start at: _copies_region)
        self.rows = False  # (a statement of a loop kernel: cuda/loops.py)
        self.one_block = False  # (a step run by one block, the last of a reduction's)
        self.spreading = False  # (steps every block runs alike: ``spread_phase``)
        # (the reductions every block makes, ``_spread``: whether the grid runs loops after)
        self.spread: dict[int, bool] = {}
        self.groups_of = None  # (the number of the reduction whose groups' copies are combined)
        self.hoisted: dict = {}  # a load -> the local it was read into (column_loop)
        # the values a thread stored that it may read back from a local (``forwarded``):
        # (buffer, index) -> (local, the locals the index reads); None: off
        self.fwd: dict | None = None
        self.fwd_scopes: list[list] = []  # the entries each open C block made
        self.fwd_locals: list[tuple[str, str]] = []  # (local, C type) to declare
        self.block_sums_made = 0  # (the sums of runs on one thread the block takes: block_sums)
        self.gram_sums: list = []  # (the bundles of a gram and its column sums: _gram_sums)
        self.epilogues: list = []  # (the bundles of a rows product and its epilogue)
        # (the products that ours may make with what follows them carry both ways: their
        # epilogues, _rows_epilogues, a gram's column sums as the BLAS's too; off for
        # functions()'s count)
        self.choosing = choosing

    def emit(self, depth: int, line: str):
        self.lines.append("  " * depth + line)

    def label(self) -> str:
        self.labels += 1
        return f"tl_skip{self.labels}"

    def end(self, depth: int, skip: str):
        """The label a ``Fail`` of the step jumps to, where one does."""
        if skip in self.jumps:
            self.emit(depth, f"{skip}:;")

    def render(self) -> str:
        _check_supported(self.k.body)
        if len(self.k.params) > ARGS:
            raise Unsupported(f"{len(self.k.params)} loop values (a launch passes {ARGS})")
        text = self.render_phases()
        if len(self.phases) > MAX_PHASES:
            raise Unsupported(f"{len(self.phases)} steps (a plan allows {MAX_PHASES})")
        return text

    # ------------------------------------------------------------------ phases
    def render_phases(self) -> str:
        """One function per step of the kernel's body, each launched over a grid (``_steps``);
        a value a serial step computes and a later step reads goes through the scratch
        memory after the temporaries; a failing step sets ``*err`` and the steps after it
        return at once."""
        steps, units, defined, used, passed, chains = self._chained_steps()
        self._repack(steps, units, chains)
        offset = (self.k.scratch_bytes + 7) // 8 * 8  # (after the temporaries placed anew)
        for v, (dt, _) in passed.items():
            passed[v] = (dt, offset)
            offset += 8
        shared = set()  # (the sums every block makes: spread_phase)
        for j, _, tail in units:
            if j in self.spread:
                for x in (j, *tail):
                    if steps[x].kind == "reduce":
                        shared.update(self._parts_of(steps[x].number))
        for p, part in self.parts.items():  # the reductions' partial results, after them
            if p in shared:  # (in each block's shared memory: spread_phase)
                continue
            part[2] = offset
            offset += (part[1] * _SIZE[part[0]] + 7) // 8 * 8
        self.scratch = max(self.k.scratch_bytes, offset)
        self.copies_at = (self.scratch + 7) // 8 * 8  # (our products' copies: _copies_region)
        for j, st in enumerate(steps):  # (a gram with its column sums: _gram_sums)
            if st.kind == "gemm" and st.form is not None and st.form.acc is not None:
                g = st.body
                at = self._copies_region(
                    products.scratch_bytes(g.m, g.n, g.k, g.ta, g.tb, sums=True)
                )
                steps[j] = dataclasses.replace(st, form=dataclasses.replace(st.form, at=at))
        bufs = [_buffers(st.statements()) for st in steps]

        def others(j: int) -> set:  # (the buffers the steps but step j touch)
            return set().union(*(b for q, b in enumerate(bufs) if q != j))

        out, own = [], []
        blas_at: dict[int, int] = {}  # (a blas step -> its phase)
        # (the chains each step is in: a chain of chains' and its own)
        chain_of = {
            q: tuple(c for c, run in enumerate(chains) if q in run) for q in range(len(steps))
        }
        firsts: dict[int, list] = {}  # (a step -> the chains it starts, the longest first)
        for run in sorted(chains, key=len, reverse=True):
            firsts.setdefault(run[0], []).append(run)
        beside = {  # (both steps of a chain's, or neither: its launches are the steps')
            j: q
            for j, q in self._beside(steps, units, passed, used, defined).items()
            if chain_of.get(j) == chain_of.get(q)
        }
        # (each chain's place among the phases, its last step, its functions and their
        # dynamic shared memory; the innermost last)
        pending: list[tuple] = []
        made = 0  # (the chains' functions in ``out``)

        def resolve():  # (the chain stands for the launches of its steps, made after it)
            at, _, fn, tf32, shared = pending.pop()
            covers = len(self.phases) - at - 1
            self.phases[at] = items.ChainCall((fn,), covers, tf32, *shared)

        for j, head, tail in units:
            st = steps[j]
            while pending and j > pending[-1][1]:
                resolve()
            for run in firsts.get(j, ()):  # (a chain's steps: one function; then the steps')
                mine = set(run)
                self.others = set().union(*(b for q, b in enumerate(bufs) if q not in mine))
                outer = any(set(x) < mine for x in chains)  # (a chain of chains: o)
                name = f"{self.k.name}_{j}{'o' if outer else 'c'}"
                chain = _Step("chain", tuple(steps[q] for q in run))
                text = self.phase(name, chain, [], [], passed)
                tf32, shared = (), [16 * _chain_dynamic(chain.body)[0], 0]
                has_tf32 = chain_tf32(chain.body)  # (a run of TF32 products: that one only)
                out.append(leave_out(text, TF32_ONLY) if has_tf32 else text)
                if has_tf32:  # (its TF32 function: compiled where TF32 is asked for)
                    chain = dataclasses.replace(chain, form=True)
                    text = self.phase(f"{name}t", chain, [], [], passed)
                    out.append(leave_out(text, NO_TF32))
                    tf32 = (self.phases.pop(),)
                    shared[1] = 16 * _chain_dynamic(chain.body, True)[0]
                pending.append((len(self.phases) - 1, run[-1], self.phases[-1], tf32, shared))
                made += 1 + len(tf32)
            if j in beside.values():  # (in its product's launch)
                continue
            if st.kind == "blas":  # (the device's BLAS; and the functions of ours, if any)
                blas_at[j] = len(self.phases)
                loops = (steps[beside[j]], others(beside[j])) if j in beside else None
                self.phases.append(self.own_product(j, st, own, loops))
                continue
            # (the kernel's name its first function's, a chain's aside: items' check)
            fname = f"{self.k.name}_{j}" if len(out) > made else self.k.name
            at = (j, *tail)
            loads = sorted(v for v in passed if any(v in used[q] or v in defined[q] for q in at))
            stores = sorted(v for v in passed if any(v in defined[q] for q in at))
            self.others = others(j)
            then = [(steps[t], others(t)) for t in tail]
            spread = self.spread.get(j)  # (over the grid: no value it passes read elsewhere)
            stores = [] if spread else stores
            out.append(self.phase(fname, st, loads, stores, passed, then or None, spread))
        while pending:
            resolve()
        paired: set[int] = set()
        for j, i in blas_at.items():  # (two products in one pass over their rows: _joint)
            if (
                blas_at.get(j + 1) != i + 1
                or j in paired
                or chain_of.get(j) != chain_of.get(j + 1)
            ):
                continue
            pair = self._joint_pair(steps[j], steps[j + 1])
            if pair is not None:
                gram = self.phases[i + (pair[1] is steps[j + 1])]
                joint = self._joint(j, *pair, gram, own)
                self.phases[i] = dataclasses.replace(self.phases[i], joint=joint)
                paired.add(j + 1)
        return "\n".join(out + own)

    def _chained_steps(self) -> tuple:
        """``(steps, units, defined, used, passed, chains)``: the kernel's steps
        (``_steps``, partners next), the functions they run as (``_units``), what each
        assigns and reads and the locals passed between them (``_passing``), and the runs
        of them that may be chains (``_chains``)."""
        steps = self._steps()
        self._partners_next(steps)
        units = self._units(steps, spread=True)
        defined, used, passed = self._passing(steps)
        return (
            steps,
            units,
            defined,
            used,
            passed,
            self._chains(steps, units, passed, used, defined),
        )

    def _passing(self, steps: list[_Step]) -> tuple[list, list, dict]:
        """Per step, the locals it assigns (a run on one thread's) and those it reads; and
        the locals a step assigns that another reads or assigns, which go through the
        scratch memory (``local -> (dtype, -1)``: their places are the caller's)."""
        defined = [_lets(st.body) if st.kind == "serial" else {} for st in steps]
        used = []
        for st in steps:
            refs = _refs(st.statements())
            if st.guard is not None:
                refs |= {e.name for e in kir.subexprs(st.guard) if isinstance(e, Ref)}
            if st.kind == "reduce" and st.form[0] == "scalar":
                refs -= set(st.form[1])  # (the step's own accumulators)
            used.append(refs)
        params = set(self.k.params)
        passed: dict[str, tuple[str, int]] = {}
        for j, lets in enumerate(defined):
            for v, dt in lets.items():
                elsewhere = any(
                    v in used[q] or v in defined[q] for q in range(len(steps)) if q != j
                )
                if elsewhere and v not in passed and v not in params:
                    passed[v] = (dt, -1)
        return defined, used, passed

    def _partners_next(self, steps: list[_Step]):
        """``steps`` with each product that one pass over its rows can make with an earlier
        product (``_joint_pair``) moved to just after it, where only products lie between
        them and it touches nothing of theirs (a minibatch step's gradient ``dz @ W^T``
        first, then three weights' gradients, its own ``h^T @ dz`` the last: the joint
        covers the launch after its product's, ``GemmCall.joint``)."""
        if not (self.choosing and JOINTS):
            return
        shared = frozenset(self.k.shared)
        for j, st in enumerate(steps):
            if st.kind != "blas" or (
                j + 1 < len(steps) and self._joint_pair(st, steps[j + 1]) is not None
            ):
                continue
            for q in range(j + 2, len(steps)):
                if steps[q - 1].kind != "blas":
                    break
                if self._joint_pair(st, steps[q]) is None:
                    continue
                mine = steps[q].statements()
                if all(_independent(steps[x].statements(), mine, shared) for x in range(j + 1, q)):
                    steps.insert(j + 1, steps.pop(q))
                break

    def _beside(self, steps: list[_Step], units: list, passed, used, defined) -> dict:
        """The loop steps that run in the launch of the product next to them (``blas`` step
        -> loop step, ``BESIDE``): a product with one function of ours (a rows product, or a
        gram that adds its copies itself or has one; its TF32 function too), none of a joint
        pair's (whose functions make it without the loops, ``_joint_pair``), under no
        condition (the loops run at every call); and the step of parallel loops just after
        it, or else just before it, a function of its own with no run after it, that cannot
        fail, passes no local, reads what it writes only after writing it (``_rewrites``:
        the products policy may run both ways more than once at the first call) and touches
        nothing of the product's (its statements, what runs after the BLAS's included). The
        function of ours runs the loops in its last blocks (``own_beside``), so that a
        launch's wait goes and the loops' blocks run while the product's few do (PPO's
        minibatch step: a 4 x 64 weight gradient's 256 blocks and the layer's elementwise
        gradient beside them). The BLAS's way runs the loops as a function after it
        (``GemmCall.then``)."""
        if not (self.choosing and BESIDE):
            return {}
        shared = frozenset(self.k.shared)
        alone = {j for j, head, tail in units if not head and not tail}
        out: dict[int, int] = {}
        for j, st in enumerate(steps):
            if st.kind != "blas" or j not in alone:
                continue
            s = st.form
            if products.form(s.dtype, s.m, s.n, s.k, s.ta, s.tb) is None:
                continue
            if len(products.launches(s.m, s.n, s.k, s.ta, s.tb)) != 1:
                continue
            if st.own is not None and st.own.kind not in ("rows", "gram"):
                continue
            if any(  # (a joint's functions make it then, without the loops)
                0 <= x < len(steps) - 1 and self._joint_pair(steps[x], steps[x + 1])
                for x in (j - 1, j)
            ):
                continue
            if st.guard is not None or st.body.when is not True:  # (the loops run always)
                continue
            for q in (j + 1, j - 1):  # (the step after it, else the one before)
                if not (0 <= q < len(steps)) or q not in alone or q in out.values():
                    continue
                nxt = steps[q]
                if nxt.kind not in ("parallel", "either") or _fails(nxt):
                    continue
                if used[q] & set(passed) or set(defined[q]) & set(passed):
                    continue
                loops = nxt.statements()
                if not _rewrites(loops):  # (the runtime may run them again: _product_choice)
                    continue
                if _independent(st.statements(), loops, shared):
                    out[j] = q
                    break
        return out

    def _chains(self, steps: list[_Step], units: list, passed, used, defined) -> list[list]:
        """The runs of consecutive steps that may run as one function each (``CHAINS``):
        parallel loops over the rows of the same count, rows products and grams of ours
        over them (``_chain_rows``), at least one product and two steps, whose rows never
        meet (``_chain_local``: each buffer a step writes and another touches accessed at
        its row only, a product's A and C, a gram's A and B, at their rows), whose rows
        products read no B the run writes, and whose shared memory fits a function
        (``_chain_fits``: else the run is cut before the step that would pass it).
        ``chain_body`` runs them: each block a chunk of the rows through every step in
        turn, its threads meeting between two, where each step was a launch over all the
        rows (a chained launch each, and each product's C read back from the device's
        memory by the next: PPO's policy head's 65,536 x 2 logits and their log-softmax,
        a layer's gradient and its weight's). The plan has both ways
        (``items.ChainCall``), the runtime runs one. None for ``functions()``'s count, nor
        where buffers share memory (a donor's).

        Cut where a function's static shared memory would pass (``products.SMEM_FLOATS``);
        and where those runs and the steps between them make longer ones within
        ``CHAIN_SMEM_FLOATS`` (the launch's dynamic shared memory, ``chain_body``), those
        too, each around the runs it holds whole (none that only overlaps one): a chain of
        chains, whose launches the runtime chooses between as for any chain (the shorter
        chains, or their launches, each as chosen). Outer runs after the runs they hold."""
        if not (self.choosing and CHAINS) or self.k.shared:
            return []
        inner = self._chain_runs(steps, units, passed, used, defined, products.SMEM_FLOATS)
        outer = self._chain_runs(steps, units, passed, used, defined, CHAIN_SMEM_FLOATS)
        mine = [set(r) for r in inner]
        outer = [
            r for r in outer if r not in inner and all(x <= set(r) or not x & set(r) for x in mine)
        ]
        return inner + outer

    def _chain_runs(
        self, steps: list[_Step], units: list, passed, used, defined, limit: int
    ) -> list[list]:
        """``_chains``' runs whose shared memory is at most ``limit`` floats each."""
        out: list[list[int]] = []
        run: list[int] = []
        rows = None

        def close():
            nonlocal run, rows
            mine = [steps[q] for q in run]
            if len(run) > 1 and any(x.kind == "blas" for x in mine) and _chain_local(mine):
                out.append(run)
            run, rows = [], None

        for j, head, tail in units:
            st = steps[j]
            n = None if head or tail else _chain_rows(st)
            if n is not None and (used[j] | set(defined[j])) & set(passed):
                n = None
            if n is None:
                close()
                continue
            if (
                rows is not None
                and not rows & n
                or not _chain_fits([steps[q] for q in [*run, j]], limit)
            ):
                close()
            run.append(j)
            rows = n if rows is None else rows & n
        close()
        return out

    def chain_body(self, st: _Step) -> int:
        """A chain's steps (``_chains``) as one function: each block a chunk of the rows at
        a time (``tl_p``: a copy of each gram's, ``products.parts`` of them; where the chain
        has no gram, ``CHAIN_ROWS`` rows), a tile of it (``_chain_tile``: ``tl_rb ..<
        tl_re``) at a time, every step over the tile in turn, a barrier between two: a loop
        a thread a point of the rows, as a loop kernel's block runs its rows; a rows product
        of ours over them, op(B) copied once a block before the first rows, A's tile in a
        pool of shared memory the products share (``products.rows_lines``); a gram's rows
        added into the chunk's copy (``products.gram_part_lines``). After a chunk's last
        tile, its copies are added as a merged gram's (``products.chain_sums_lines``: the
        last block of each group of copies, then the last group's, which runs the steps
        after the grams' sums). With ``st.form`` True, the products that have TF32 functions
        (``products.tf32_form``) are made as theirs make them (``_chain_tf32``). Where its
        shared memory passes what a function may declare (``products.SMEM_FLOATS``), the
        pool, the sums' groups and the copies of op(B) are one array of the launch's dynamic
        shared memory (``TL_DYNAMIC_SHARED``, ``_chain_dynamic``: its bytes the plan's
        ``ChainCall.shared``, the runtime's to ask for). The threads it asks for."""
        inner = list(st.body)
        n, r = _chain_count(inner), _chain_tile(inner)
        grams = [q for q, x in enumerate(inner) if _is_gram(x)]
        count = products.parts(n) if grams else -(-n // r)
        chunk = _chunk(n) if grams else r
        tf32 = {q: st.form is True and _chain_tf32(x) for q, x in enumerate(inner)}
        acc = {q: inner[q].own.acc if inner[q].own is not None else None for q in grams}
        count4, sd, places = _chain_dynamic(inner, st.form is True)
        if count4:
            self.emit(
                1, f"TL_DYNAMIC_SHARED(tl_dyn, {count4});  // (the launch's: {16 * count4} bytes)"
            )
            self.emit(1, "float4 *tl_sm4 = tl_dyn;  // the products' tiles")
            if sd is not None:
                self.emit(1, f"double *tl_sd = (double *)(tl_dyn + {sd});  // (the sums')")
        else:
            pool = _chain_pool(inner, st.form is True)
            self.emit(1, f"__shared__ float4 tl_sm4[{-(-pool // 4)}];  // the products' tiles")
            if sd is not None:
                self.emit(
                    1, f"__shared__ double tl_sd[{products.MAX_THREADS * 8}];  // (the sums')"
                )
        copies, arrays, tails = {}, [], []
        if grams:
            sizes = []
            for q in grams:
                g = inner[q].form
                sizes.append(
                    -(-products.scratch_bytes(g.m, g.n, g.k, True, False, bool(acc[q])) // 8) * 8
                )
            at = self._copies_region(sum(sizes))
            for q, size in zip(grams, sizes):
                copies[q] = f"(scratch + {at})"
                at += size
        for q, x in enumerate(inner):
            if x.kind == "blas" and not _is_gram(x):
                g = x.form
                b = f"{buf(g.b)} + ({self.expr(g.boff)})"
                at = f"tl_dyn + {places[q]}" if q in places else None
                for line in products.rows_chain_head(g, b, q, tf32[q], at):
                    self.emit(0 if line.startswith("#") else 1, line)
        if grams and count > 1:  # (each gram's copies: its sums' first, doubles)
            self.emit(1, "__shared__ int tl_last;  // (a ticket's: products.chain_sums_lines)")
            for q in grams:
                g = inner[q].form
                c = f"{buf(g.c)} + ({self.expr(g.coff)})"
                sums = buf(acc[q]) if acc[q] else None
                for line in products._copies(g, copies[q], c, sums):
                    self.emit(0, line.replace("tl_pp", f"tl_pp{q}").replace("tl_pd", f"tl_pd{q}"))
                arrays.append(
                    ("float", f"tl_pp{q}", g.m * g.n, f"({c})[e / {g.n} * {g.ldc} + e % {g.n}]")
                )
                if sums:
                    arrays.append(("double", f"tl_pd{q}", g.n, f"({sums})[e]"))
                tails += list(inner[q].own.tail) if inner[q].own is not None else []
        self.emit(1, f"for (long long tl_p = blockIdx.x; tl_p < {count}; tl_p += gridDim.x) {{")
        self.emit(
            2,
            f"const long long tl_lo = tl_p * {chunk}, tl_hi = tl_lo + {chunk} < {n}LL"
            f" ? tl_lo + {chunk} : {n}LL;",
        )
        self.emit(2, f"for (long long tl_c0 = tl_lo; tl_c0 < tl_hi; tl_c0 += {r}) {{")
        self.emit(
            3,
            f"const long long tl_rb = tl_c0, tl_re = tl_c0 + {r} < tl_hi ? tl_c0 + {r} : tl_hi;",
        )
        self.emit(3, "const bool tl_first = tl_c0 == tl_lo;  (void)tl_first;")
        outside = self.others
        # (the buffers whose tiles take turns in the chunk's first tile's rows)
        remap = _chain_remap(inner, self.confined - outside) if CHAIN_REMAP and chunk > r else {}
        if remap:  # (the tile before read them to its last step: none writes them yet)
            names = ", ".join(buf(x) for x in remap)
            self.emit(3, f"__syncthreads();  // (in the first tile's rows: {names}; _chain_remap)")
        bufs = [_buffers(x.statements()) for x in inner]
        for q, x in enumerate(inner):
            self.others = outside.union(*(b for i, b in enumerate(bufs) if i != q))
            if q:
                self.emit(3, "__syncthreads();  // (the step before done with these rows)")
            # (the step's buffers' addresses read from the table again: none kept in
            # registers across the chain's steps, where they took some 80 of PPO's whole
            # minibatch step's, spilled)
            self.emit(3, "{")
            for slot in self.k.slots:
                if slot.name in bufs[q]:
                    t, b = MTYPE[slot.dtype], buf(slot.name)
                    at = f"({t} *)table[{slot.index}]"
                    if slot.name in remap:
                        at = f"{at} + {remap[slot.name]}LL * (tl_lo - tl_rb)"
                    self.emit(4, f"[[maybe_unused]] {t} *{b} = {at};")
            self._chain_step(x, q, n, acc, copies, tf32)
            self.emit(3, "}")
        self.others = outside
        self.emit(2, "}")
        if arrays:  # (the chunk's copies done: the grams' sums, by tickets)
            # (a chunk past the rows, where whole tiles a chunk leave the last empty: its
            # copies, which no tile stored, are zeros; PPO at 1,600 rows a minibatch, 6
            # chunks of 320: its gradients took the scratch memory's bytes)
            self.emit(2, "if (tl_lo >= tl_hi) {  // (no rows: its copies zeros)")
            for t, arr, size, _ in arrays:
                zero = "0.0" if t == "double" else "0.0f"
                self.emit(
                    3,
                    f"for (int e = threadIdx.x; e < {size}; e += blockDim.x) "
                    f"{arr}[tl_p * {size} + e] = {zero};",
                )
            self.emit(2, "}")
            final = []
            if tails:
                lines, self.lines = self.lines, []
                everything = _buffers(self.k.body)
                self.in_one_block([(t, everything) for t in tails], [], [], {})
                final, self.lines = [x.removeprefix("  ") for x in self.lines], lines
            for line in products.chain_sums_lines(n, arrays, final):
                self.emit(0 if line.startswith("#") else 1, line)
        self.emit(1, "}")
        self.block_done(1)
        return count * THREADS

    def _chain_step(self, x: _Step, q: int, n: int, acc: dict, copies: dict, tf32: dict):
        """Step ``x`` (the ``q``-th) of a chain of ``n`` rows over a tile (``chain_body``'s
        ``tl_rb ..< tl_re``): a loop a thread a point of the tile's rows, a rows product of
        ours over them or a gram's rows added into the chunk's copy (``copies``; its column
        sums into ``acc``'s), with TF32 operands where ``tf32`` says."""
        if x.kind in ("parallel", "either"):  # (an either's loops touch nothing of each
            self.rows = True  # other's, or one of them runs: one after another)
            for loop in _chain_loops(x):
                points = n // _row_levels(loop, n)[0][2]  # (a row of its first level's)
                if points > 1:  # (the tile's rows as its first level's: a nest's points)
                    div = f"tl_nb = tl_rb / {points}, tl_ne = tl_re / {points}"
                    self.emit(3, f"{{ const long long {div};")
                    self.emit(3, "{ const long long tl_rb = tl_nb, tl_re = tl_ne;")
                self.grid_loop(loop, 3, epilogue=False, collapse=True)
                if points > 1:
                    self.emit(3, "} }")
            self.rows = False
            return
        g = x.form
        a = f"{buf(g.a)} + ({self.expr(g.aoff)})"
        c = f"{buf(g.c)} + ({self.expr(g.coff)})"
        if _is_gram(x):
            b = f"{buf(g.b)} + ({self.expr(g.boff)})"
            sums = buf(acc[q]) if acc[q] else None
            part = products.gram_part_tf32_lines if tf32[q] else products.gram_part_lines
            lines = part(g, a, b, copies[q], c, sums, chain=True)
        else:
            epilogue = x.own.epilogue if x.own is not None else None
            store = self._epilogue_store(g, epilogue) if epilogue is not None else None
            rows = products.rows_tf32_lines if tf32[q] else products.rows_lines
            lines = rows(g, a, "B", c, store, chain=q)
        for line in lines:
            self.emit(0 if line.startswith("#") else 3, line)

    def _joint_pair(self, first: _Step, second: _Step) -> tuple | None:
        """Two consecutive blas steps as ``(rows, gram)`` where one pass over their rows can
        make both (``products.joint_form``: the gram's B the rows product's A, the same
        memory at the same offset, rows as far apart; a layer's ``dz @ W^T`` with its
        epilogue and its weight's gradient ``h^T @ dz`` with its bias's sums), neither
        writing what the other touches, no donor's memory among theirs; else None. Not for
        ``functions()``'s count (no function of its own: it replaces two)."""
        if not (self.choosing and JOINTS and first.kind == second.kind == "blas"):
            return None
        shared = frozenset(self.k.shared)
        for r, g in ((first, second), (second, first)):
            rs, gs = r.form, g.form
            if not (
                products.joint_form(rs, gs)
                and (gs.b, gs.boff, gs.ldb) == (rs.a, rs.aoff, rs.lda)
                and (r.own is None or r.own.kind == "rows")
                and (g.own is None or g.own.kind == "gram")
            ):
                continue
            a, b = r.statements(), g.statements()
            if not (_buffers(a) | _buffers(b)) & shared and _independent(a, b, shared):
                return r, g
        return None

    def _joint(self, j: int, r: _Step, g: _Step, gram: items.GemmCall, out: list) -> tuple:
        """The functions (their text onto ``out``) that make rows step ``r``'s product with
        its epilogue and gram step ``g``'s with its column sums in one pass over their rows
        (``products.joint_tf32_lines``, TF32 operands), then the gram's copies added by its
        own function (``gram``'s): the first product's ``GemmCall.joint``."""
        rs, gs = r.form, g.form
        sums = g.own is not None and g.own.acc is not None
        at = self._copies_region(products.scratch_bytes(gs.m, gs.n, gs.k, gs.ta, gs.tb, sums))
        own = _Own(
            "joint",
            at,
            g.own.acc if sums else None,
            g.own.sums if sums else (),
            r.own.epilogue if r.own is not None else None,
            True,
            gs,
        )
        text = self.phase(f"{self.k.name}_{j}j", _Step("gemm", rs, form=own), [], [], {})
        out.append(leave_out(text, NO_TF32))
        return (self.phases.pop(), *gram.tf32[1:])

    def _copies_region(self, nbytes: int) -> int:
        """The byte of the scratch memory a product of ours keeps its ``nbytes`` of copies
        from: one region after everything else's for all of the kernel's products (they run
        one after another, each done with its copies before the next), as large as the
        largest needs."""
        self.scratch = max(self.scratch, self.copies_at + nbytes)
        return self.copies_at

    def own_product(self, j: int, st: _Step, out: list, beside=None) -> items.GemmCall:
        """The ``GemmCall`` of blas step ``j`` (``st``) with the functions of ours that
        compute its product too (``products``: their text onto ``out``), where its shape
        has them; a gram's copies in the scratch memory (``_copies_region``). With an
        epilogue (``_rows_epilogues``), ours make it too, and the epilogue's loops are a
        function of their own that runs after the BLAS's product (``GemmCall.then``); so
        are the loops ``beside`` it (``(step, the other steps' buffers)``: ``_beside``),
        which ours run in their own blocks."""
        s, call = st.form, st.body
        what = products.form(s.dtype, s.m, s.n, s.k, s.ta, s.tb)
        if what is None:
            return call
        sums = st.own is not None and st.own.acc is not None
        at = self._copies_region(products.scratch_bytes(s.m, s.n, s.k, s.ta, s.tb, sums))
        mine, tf32 = [], []
        kinds = products.launches(s.m, s.n, s.k, s.ta, s.tb)
        for kind in kinds:
            fname = f"{self.k.name}_{j}{kind[0]}"
            own = _Own(kind, at, beside=beside)
            if st.own is not None:  # (the steps after the sums: the last function's)
                tail = st.own.tail * (kind == kinds[-1])
                own = dataclasses.replace(st.own, kind=kind, tail=tail, beside=beside)
            step = _Step("gemm", s, form=dataclasses.replace(own, at=at))
            out.append(self.phase(fname, step, [], [], {}))
            mine.append(self.phases.pop())
            if not products.tf32_form(s.m, s.n, s.k, s.ta, s.tb):
                continue
            if kind == "sum":  # (the copies' sum: the same function)
                tf32.append(mine[-1])
                continue
            step = dataclasses.replace(step, form=dataclasses.replace(step.form, tf32=True))
            # (compiled only for a device whose products are TF32: a sixth of PPO's module)
            text = self.phase(f"{fname}t", step, [], [], {})
            out.append(leave_out(text, NO_TF32))
            tf32.append(self.phases.pop())
        call = dataclasses.replace(call, tf32=tuple(tf32))
        if not st.after and beside is None:
            return dataclasses.replace(call, own=tuple(mine))
        then = []
        if st.after:
            self.others = _buffers(self.k.body)  # (no temporary of a thread's own)
            for u, (q, _, tail) in enumerate(self._units(list(st.after))):
                fname = f"{self.k.name}_{j}e" + (str(u) if u else "")
                others = [(st.after[t], self.others) for t in tail]
                out.append(self.phase(fname, st.after[q], [], [], {}, others or None))
                then.append(self.phases.pop())
        if beside is not None:  # (after the BLAS's: the loops a function of their own)
            self.others = beside[1]
            out.append(self.phase(f"{self.k.name}_{j}b", beside[0], [], [], {}))
            then.append(self.phases.pop())
        return dataclasses.replace(call, own=tuple(mine), then=tuple(then))

    def _units(
        self, steps: list[_Step], spread: bool = False
    ) -> list[tuple[int, list[int], list[int]]]:
        """The functions the ``steps`` run as, in order: ``(j, head, tail)``, step ``j`` and
        the steps ``tail`` (``head``'s among them) that its last block runs after it (a
        ``blas`` step: a product of the device's BLAS, no function). With ``spread``, the
        reductions every block makes whole, then its steps, the last over the grid
        (``_spread``), are ``self.spread``."""
        units = []
        if spread:
            self.spread = {}
        j = 0
        while j < len(steps):
            st = steps[j]
            if st.kind == "blas":
                units.append((j, [], []))
                j += 1
                continue
            # a run on one thread before a reduction that touches nothing of its (the sums'
            # first values, which only the combination reads): run by the reduction's last
            # block, before it combines
            # Likewise a small step that touches nothing of the reduction's but its
            # accumulators' first values (``_first_values``)
            head: list[int] = []
            if (
                j + 2 < len(steps)
                and steps[j + 1].kind == "reduce"
                and _combines(steps[j + 2], steps[j + 1].number)
                and (
                    st.kind == "serial"
                    and steps[j + 2].kind == "serial"  # (thread 0: the run's locals its own)
                    and not _fails(st)
                    and _apart(st, steps[j + 1], self.k.shared)
                    or _first_values(st, steps[j + 1])
                )
            ):
                head = [j]
                j += 1
                st = steps[j]
            # a reduction and the step that combines its results: one function, whose last
            # block to finish combines them, and goes on with the small steps after it that
            # cannot fail (one block does them: the bias gradient's cast and copy)
            tail: list[int] = []
            if st.kind == "reduce" and j + 1 < len(steps) and _combines(steps[j + 1], st.number):
                tail = _small_after(steps, [*head, j + 1])
                whole = self._spread(steps, j, head) if spread else None
                if whole is not None and whole[0][-1] > tail[-1]:
                    tail, self.spread[j] = whole
            units.append((j, head, tail))
            j = (tail[-1] if tail else j) + 1
        return units

    def _spread(self, steps: list[_Step], j: int, head: list[int]) -> tuple | None:
        """``(tail, grid)``: the steps a function runs after reduction ``j`` where every
        block makes the whole reduction itself (``spread_phase``), each a small sum
        (``_small_sum``); None where that could compute other values, or saves no launch.
        ``head``, the step that combines it and the runs on one thread after it, then any
        further small sums with their combinations and runs (the advantages' mean, then
        their variance: each a launch of its own); then, with ``grid``, the step of
        parallel loops after them over the grid; else, where there are two sums or more,
        the small steps after them (a last block's, ``_small``), the function one block.

        Over a grid, the blocks make the same sums in the same order, so each block's
        thread 0 computes the same values and stores the same bits; that holds while
        nothing the blocks read changes during the launch: the runs read nothing they (or
        the sums) write but after writing it, the loops write nothing the runs or the sums
        touch and read none of the runs' locals, none of them can fail, no buffer is
        another's memory, no value the runs pass on is read by another function, and all
        the blocks load at most ``SPREAD_LOADS`` terms. Gradient clipping's norm and the
        Adam updates that scale by it (PPO's minibatch step): one launch, no ticket, where
        the updates were a launch after the norm's (the last block's updates of a few
        thousand points, then the rest)."""
        if not SPREAD or self.rows or self.k.shared or not _small_sum(steps[j]):
            return None
        n = len(steps)
        sums, q = [j], j + 2  # (after the combining step: runs on one thread, more sums)
        terms = _terms(steps[j].body)
        while True:
            while q < n and steps[q].kind == "serial":
                q += 1
            if (
                q + 1 < n
                and _small_sum(steps[q])
                and _combines(steps[q + 1], steps[q].number)
                and terms + _terms(steps[q].body) <= SPREAD_TERMS  # (in all: a block's work)
                and not self._reads_runs(steps[q], [steps[x] for x in (*head, *range(j + 1, q))])
            ):
                sums.append(q)
                terms += _terms(steps[q].body)
                q += 2
                continue
            break
        order = [steps[x] for x in (j, *head, *range(j + 1, q))]  # (as the function runs)
        if any(_fails(x) for x in order):
            return None
        lets = set().union(*(_lets(st.body) for st in order if st.kind == "serial"))
        mine = {j, *head, *range(j + 1, q + 1)}
        if (
            q < n
            and steps[q].kind in ("parallel", "either")
            and -(-_points(steps[q]) // THREADS) * terms <= SPREAD_LOADS
            and self._spread_apart(steps, order, steps[q], lets, mine)
        ):
            return [*head, *range(j + 1, q + 1)], True
        if len(sums) < 2:
            return None
        # (one block: the small steps after, as a last block's)
        return _small_after(steps, [*head, *range(j + 1, q)]), False

    @staticmethod
    def _reads_runs(red: _Step, before: list[_Step]) -> bool:
        """Whether the sum ``red`` reads a local that a run on one thread of ``before``
        assigns (thread 0's alone: the block's other threads have the value the function
        loaded at its start), its accumulators aside."""
        lets = set().union(*(_lets(st.body) for st in before if st.kind == "serial"))
        refs = _refs(red.statements()) - set(red.form[1])
        if red.guard is not None:
            refs |= _refs_of(red.guard)
        return bool(refs & lets)

    def _spread_apart(self, steps: list[_Step], order: list, last: _Step, lets, mine) -> bool:
        """Whether every block may run the steps ``order`` (sums and runs on one thread)
        and then the loops ``last`` over the grid (``_spread``): the values every block
        reads stay the same during the launch."""
        if _fails(last):
            return False
        region = [x for st in order for x in st.statements()]
        if _written(last.statements()) & _buffers(region):
            return False
        if _refs(last.statements()) & lets:
            return False
        writes, before = _written(region), set()
        for st in order:
            for x in st.body if st.kind == "serial" else st.statements():
                if _read(x) & writes - before:
                    return False
                before |= _written([x])
        defined, used, passed = self._passing(steps)
        outside = set().union(
            *(used[x] | set(defined[x]) for x in range(len(steps)) if x not in mine)
        )
        return not lets & set(passed) & outside

    def _repack(self, steps: list[_Step], units: list, chains=()):
        """The temporaries placed anew in the scratch memory, two sharing bytes only where no
        function (``units``; a chain's, ``chains``, one) uses both: lowering packs them by
        the order of the kernel's statements (``lower._packed_temps``), but a function runs
        its steps' loops at once (side by side, rows merged: a thread at one row's last
        loop while another is at its first) or out of that order (a run before a
        reduction, after it): PPO's gradient of the logits wrote a temporary into the bytes
        of one another row still read; a chain's grams' column sums, each cast after all
        of them were made, one another's bytes."""
        temps = {t.name: t for t in self.k.temps}
        if len(temps) < 2:
            return
        first: dict[int, int] = {}  # (a chain's steps: its first's, the outermost chain's)
        for run in chains:
            for q in run:
                first[q] = min(first.get(q, q), run[0])
        at = {j: u for u, (j, _, _) in enumerate(units)}
        span: dict[str, list[int]] = {}
        for u, (j, _, tail) in enumerate(units):
            u = at.get(first.get(j, j), u)
            for q in (j, *tail):
                for n in _buffers(steps[q].statements()) & temps.keys():
                    span.setdefault(n, [u, u])[1] = u
        order = sorted(temps.values(), key=lambda t: (-t.size * kir.SIZES[t.dtype], t.name))
        regions = []
        for t in order:
            first, last = span.get(t.name, (-1, -1))
            regions.append((t.size * kir.SIZES[t.dtype], first, last + 1))
        offsets = {t.name: at for t, at in zip(order, first_fit(regions, 8))}
        placed = tuple(dataclasses.replace(t, offset=offsets[t.name]) for t in self.k.temps)
        self.k = dataclasses.replace(self.k, temps=placed)

        def moved(o, b: str):  # (a product's operand in the scratch memory: its new place)
            return dataclasses.replace(o, at=offsets[b]) if o.space == "scratch" else o

        for q, st in enumerate(steps):
            if st.kind == "blas":
                g, call = st.form, st.body
                call = dataclasses.replace(
                    call, a=moved(call.a, g.a), b=moved(call.b, g.b), c=moved(call.c, g.c)
                )
                steps[q] = dataclasses.replace(st, body=call)

    def _steps(self) -> list[_Step]:
        """The kernel's body as steps. An ``if`` whose condition is the same for every
        thread (it reads only the call's loop values) and that holds work for the grid is
        taken apart: each statement inside it is a statement of the body under the
        condition (its *guard*). Then each parallel loop is a step (one thread per
        iteration, the loop striding over the grid), each gemm (one thread per element of
        the product), each reduction (``For.reduce``, ``_reduction``: a step that leaves a
        partial result per block, then its results combined in order), and each run of the
        other statements (on one thread)."""
        steps: list[_Step] = []
        serial: list = []
        last_guard = None
        shared = frozenset(self.k.shared)

        combining = False  # (the run on one thread starts by combining a reduction's)

        def flush():
            nonlocal serial, last_guard, combining
            prev = steps[-1] if steps else None
            if serial and not combining and not self.rows and _joins(serial, prev, shared):
                # a run on one thread that touches nothing of the parallel step before it
                # (a [1]-shaped parameter's Adam moments, after the others'): a loop of one
                # point in that step's launch, where it was a launch of its own
                one = For(f"tl_one{len(steps)}", kir.i64(0), kir.i64(1), tuple(serial), True)
                loops = prev.body if prev.kind == "either" else (prev.body,)
                steps[-1] = _Step("either", loops + (one,), form=prev.form + (frozenset(),))
            elif serial:
                steps.append(_Step("serial", serial))
            serial, last_guard, combining = [], None, False

        def under(guard, s):
            return s if guard is None else If(guard, (s,))

        items = self._products_early(self._guarded(self.k.body, None, frozenset()))
        items = self._rows_epilogues(self._gram_sums(items))
        for guard, lits, s in self._arrays_joined(items):
            big = isinstance(s, For) and s.reduce and _terms(s) >= GRID_TERMS
            form = self._reduction(s) if big else None
            if form is not None and form[0] == "scalar":
                s = _flat_sum(s)
            elif form is not None:
                s, form = _flat_rows(s, form)
            pushed = s if isinstance(s, For) and s.parallel else _pushed_in(s)
            if form is not None:
                flush()
                combine, number = self._combine(s, form)
                steps.append(_Step("reduce", s, guard, form, number))
                if form[0] == "scalar":  # (the serial step after it starts with it)
                    serial.append(under(guard, combine))
                    combining = True
                else:
                    steps.append(_Step("parallel", _pushed_in(under(guard, combine))))
            elif any(s is b for b in self.gram_sums):  # a gram and its B's column sums
                flush()
                gemm, init, red, *rest = s.then
                acc = red.reduce[0][0]
                # (the steps after the sums that read only them: the last function's)
                tail = tuple(
                    _Step("parallel", _pushed_in(under(guard, t)), form=(lits,)) for t in rest
                )
                call = self._gemm_call(gemm, guard)
                after = self._sums_after(init, red, guard, lits) if call is not None else None
                if after is None:  # (ours alone)
                    kinds = products.launches(gemm.m, gemm.n, gemm.k, gemm.ta, gemm.tb)
                    for kind in kinds:
                        own = _Own(kind, None, acc, (init, red), tail=tail * (kind == kinds[-1]))
                        steps.append(_Step("gemm", gemm, guard, form=own))
                else:  # (ours with them, or the BLAS's and then the sums: as the runtime
                    # chooses)
                    own = _Own("gram", None, acc, (init, red), tail=tail)
                    steps.append(_Step("blas", call, form=gemm, own=own, after=after + tail))
            elif any(s is b for b in self.epilogues):  # a rows product and its epilogue
                flush()
                gemm, epilogue = s.then
                call = self._gemm_call(gemm, guard)
                own = _Own("rows", epilogue=epilogue)
                if call is None:  # (ours alone)
                    steps.append(_Step("gemm", gemm, guard, form=own))
                else:  # (ours with it, or the BLAS's and then it: as the runtime chooses)
                    after = (_Step("parallel", _pushed_in(epilogue), form=(lits,)),)
                    steps.append(_Step("blas", call, form=gemm, own=own, after=after))
            elif isinstance(s, Gemm):
                flush()
                call = self._gemm_call(s, guard) if self.blas else None
                steps.append(
                    _Step("gemm", s, guard) if call is None else _Step("blas", call, form=s)
                )
            elif isinstance(s, Permute) and s.n >= GRID_TERMS:
                flush()
                digits = _perm_digits(s.n)
                if digits is not None:  # (by buckets: four steps)
                    for what in ("count", "scan", "scatter", "sort"):
                        steps.append(_Step("perm", s, guard, (what, digits)))
                else:
                    total = 0
                    while (1 << total) < s.n:
                        total += 1
                    # the keys and the passes whose runs lie within a tile: one step, a block
                    # a tile; then a step per pass over the whole
                    local = min(total, PERM_TILE_PASSES)
                    steps.append(_Step("perm", s, guard, ("tile", local)))
                    for passes in range(local, total):
                        steps.append(_Step("perm", s, guard, ("pass", passes)))
                    steps.append(_Step("perm", s, guard, ("out", total)))
            elif isinstance(pushed, For) and pushed.parallel:
                loop = _pushed_in(under(guard, pushed))
                checks = _uniform_checks(serial, set(self.k.params))
                if checks and not combining and _runs(loop):
                    # the run is checks of the call's loop values alone (a slice's start):
                    # each iteration of the loop makes them first, where a step of their
                    # own was a launch (and went after the loop, which touched nothing of
                    # the run's, so the loop read before they had said it may)
                    loop = dataclasses.replace(loop, body=tuple(checks) + loop.body)
                    serial, last_guard = [], None
                if serial and (
                    combining
                    or _fails_any(serial)
                    or not _independent_of_run(loop, serial, shared)
                ):
                    flush()
                # (else the run on one thread, which touches nothing of the loop's, runs
                # after it: the loop may join the step before the run)
                prev = steps[-1] if steps else None
                before = (
                    () if prev is None else (prev.body if prev.kind == "either" else (prev.body,))
                )
                if (
                    prev is not None
                    and prev.kind in ("parallel", "either")
                    and prev.form
                    and (
                        # (touching nothing of all of them's is touching nothing of each
                        # one's: a step of Adam's loops of every parameter checks once)
                        _independent(before, [loop], shared)
                        or all(
                            _exclusive(lits, other) or _independent([other_loop], [loop], shared)
                            for other, other_loop in zip(prev.form, before)
                        )
                    )
                ):  # (one of them runs at a call, or they touch nothing of each other's:
                    # one launch for both)
                    steps[-1] = _Step("either", before + (loop,), form=prev.form + (lits,))
                else:
                    steps.append(_Step("parallel", loop, form=(lits,)))
            elif guard is not None and last_guard == guard:
                prev = serial[-1]
                serial[-1] = If(guard, prev.then + (s,))
            else:
                serial.append(under(guard, s))
                last_guard = guard
        flush()
        if not steps:
            steps.append(_Step("serial", []))
        return steps

    def _products_early(self, items: list) -> list:
        """``items`` (``_guarded``'s) with each product of the device's BLAS moved ahead of
        the statements before it that touch nothing of its and cannot fail, up to another
        product: the loops on either side of it may then join one launch (the second layers'
        bias and tanh after both products; each bias gradient's sum after every weight's)."""
        out: list = []
        for item in items:
            guard, _, s = item
            ahead = isinstance(s, Gemm) and self.blas and self._gemm_call(s, guard) is not None
            at = _ahead(out, s, self.k.shared, lambda x: x[2]) if ahead else len(out)
            out.insert(at, item)
        return out

    def _gram_sums(self, items: list) -> list:
        """``items`` (``_guarded``'s) with each float32 gram product (``products``: a
        weight's gradient ``x^T @ dy``) whose B's column sums a later reduction makes (a
        bias's gradient ``sum(dy, 0)``: into a float64 temporary of n elements, its first
        values zeros just before it, under the same guard, nothing between touching what
        they touch) bundled with that reduction and its first values (an ``If`` of a true
        condition, ``gram_sums``): one pass of our gram over x and dy makes both (its
        column sums in float64, ``products.gram_part_lines``), where cuBLAS's product and
        the reduction each read dy. Not where the renderer is told to make no BLAS call
        (its gemms then stay steps of one thread an element)."""
        self.gram_sums = []
        if not (self.blas and GRAM_SUMS):
            return items
        temps = {t.name: t for t in self.k.temps}
        shared = frozenset(self.k.shared)
        out = list(items)
        for i, (guard, lits, s) in enumerate(out):
            if not (
                isinstance(s, Gemm)
                and products.form(s.dtype, s.m, s.n, s.k, s.ta, s.tb) == "gram"
                and s.c != s.b
            ):
                continue
            for j in range(i + 1, len(out) - 1):
                (g1, _, init), (g2, _, red) = out[j], out[j + 1]
                if s.n == 1:  # (a value head's bias: its one column's sum, a scalar's form)
                    init, red = _one_column(init), _one_column(red, s)
                acc = _column_sum(red, s) if g1 == guard == g2 else None
                t = temps.get(acc)
                if t is None or t.dtype != "f64" or t.size != s.n or acc == s.c:
                    continue
                if not _zeros(init, acc, s.n):
                    continue
                between = [x[2] for x in out[i + 1 : j]]
                if _independent(between, [init, red], shared):
                    tail = self._sums_tail(out[j + 2 :], guard, acc, s, between + [init, red])
                    bundle = If(Const("bool", True), (s, init, red, *tail))
                    self.gram_sums.append(bundle)
                    out[i] = (guard, lits, bundle)
                    del out[j : j + 2 + len(tail)]
                break
        return out

    def _sums_tail(self, items: list, guard, acc: str, s: Gemm, before: list) -> list:
        """The statements at the start of ``items`` (``_guarded``'s, after a gram's column
        sums into ``acc``) that a gram with its sums makes in its last function's last
        block (``_gram_sums``): under the same guard, each a parallel loop of at most
        ``s.n`` iterations that reads ``acc`` or what the ones before it wrote, and else
        only what nothing ``before`` writes (nor memory a donor shares), and writes what
        nothing ``before`` touches (the bias gradient's float64 sums cast to float32 and
        copied into its buffer, a launch of their own until the sixteenth session; a
        moving average of it, which reads its last value); none where the gram has one
        copy (no sum function: no scratch memory, whose users the graphs run one at a
        time, for its ticket)."""
        if not GRAM_TAILS or products.parts(s.k) < 2:
            return []
        tail: list = []
        made = {acc}
        for g, _, t in items:
            if s.n == 1 and isinstance(t, Store):  # (a scalar's: a loop of one)
                t = For(f"{t.buf}$one", kir.i64(0), kir.i64(1), (t,), True)
            if not (
                g == guard
                and isinstance(t, For)
                and t.parallel
                and isinstance(t.lo, Const)
                and isinstance(t.hi, Const)
                and 0 < int(t.hi.value) - int(t.lo.value) <= s.n
                and not _fails_any([t])
            ):
                break
            written = _written([t])
            reads = _buffers([t]) - written
            if not (
                reads & made
                and not (reads - made) & (_written(before) | set(self.k.shared))
                and not written & _buffers(before)
            ):
                break
            tail.append(t)
            made |= written
        return tail

    def _sums_after(self, init, red: For, guard, lits) -> tuple | None:
        """The steps that make a gram's B's column sums (``_gram_sums``: ``init``, their
        zeros, and ``red``, the reduction, under ``guard``) after the device's BLAS made
        the product (``GemmCall.then``): the zeros, the reduction on the grid and the step
        that combines its copies, as ``_steps`` makes any array reduction (one function:
        ``_units``); None where the reduction has no form on the grid."""
        form = self._reduction(red)
        if form is None or form[0] != "array":
            return None
        red, form = _flat_rows(red, form)
        combine, number = self._combine(red, form)
        under = (lambda x: x) if guard is None else (lambda x: If(guard, (x,)))
        return (
            _Step("parallel", _pushed_in(under(init)), form=(lits,)),
            _Step("reduce", red, guard, form, number),
            _Step("parallel", _pushed_in(under(combine))),
        )

    def _rows_epilogues(self, items: list) -> list:
        """``items`` (``_guarded``'s) with each float32 product of the rows form
        (``products``: a layer's ``x @ W``) bundled with the loop nest that next writes its
        C, where that nest is C's elementwise epilogue (``_epilogue``: ``tanh(C + b)``, or
        ``C * (1 - h^2)``), under the same guard, nothing between touching what either
        touches (an ``If`` of a true condition, ``epilogues``): the product's function of
        ours stores what the nest would, where the product wrote C and the nest read and
        wrote it again (two passes over C's bytes; a 65,536 x 64 layer's 16 MiB each). The
        BLAS's product may still run instead, the nest a function after it (``own_product``:
        ``GemmCall.then``; the runtime times the two ways)."""
        self.epilogues = []
        if not (self.blas and ROWS_EPILOGUES and self.choosing):
            return items
        shared = frozenset(self.k.shared)
        out = list(items)
        for i, (guard, lits, s) in enumerate(out):
            if not (
                isinstance(s, Gemm)
                and products.form(s.dtype, s.m, s.n, s.k, s.ta, s.tb) == "rows"
                and s.c not in (s.a, s.b)
                and not {s.a, s.b, s.c} & shared
            ):
                continue
            for j in range(i + 1, len(out)):
                g, lits_j, nest = out[j]
                if s.c not in _buffers([nest]):
                    continue
                nest, rest = _epilogue_apart(nest, s, self.k.params)
                between = [x[2] for x in out[i + 1 : j]]
                if (
                    g == guard
                    and nest is not None
                    and not _buffers([nest]) & shared
                    and _independent(between, [s, nest], shared)
                ):
                    bundle = If(Const("bool", True), (s, nest))
                    self.epilogues.append(bundle)
                    out[i] = (guard, lits, bundle)
                    if rest is None:
                        del out[j]
                    else:
                        out[j] = (g, lits_j, rest)
                break
        return out

    def _arrays_joined(self, items: list) -> list:
        """``items`` (``_guarded``'s) with each reduction into a temporary over a grid's
        worth of rows (``_reduction``'s array form) joined by the later ones under the same
        guard, over the same rows and elements, into temporaries of the same size, that
        need nothing computed between them (``_apart_sums``) and whose first values (a loop
        storing the identity, just before) touch nothing between either: one loop, each
        block adding a row's terms to its copy of every temporary, one launch (a minibatch
        step's four bias gradients, four launches, one; each sum's terms and their order as
        before)."""
        out = list(items)
        temps = {t.name: t for t in self.k.temps}

        def array(s):  # (the reduction's accumulator and its loop over elements, or None)
            if not (isinstance(s, For) and len(s.reduce) == 1 and _terms(s) >= GRID_TERMS):
                return None
            form = self._reduction(s)
            if form is None or form[0] != "array" or form[2] is not s.body[0]:
                return None
            return form[1][0], form[2]

        def init(item, acc: str, inner: For) -> bool:  # (``acc[e] = identity`` over inner's)
            _, _, s = item
            if not (
                isinstance(s, For)
                and s.parallel
                and (s.lo, s.hi) == (inner.lo, inner.hi)
                and len(s.body) == 1
                and isinstance(s.body[0], Store)
            ):
                return False
            st = s.body[0]
            return st.buf == acc and st.index == Ref(s.var) and isinstance(st.value, Const)

        i = 0
        while i < len(out):
            guard, lits, a = out[i]
            got = array(a)
            if got is None:
                i += 1
                continue
            acc_a, inner_a = got
            j = i + 2
            while j < len(out):
                gb, _, b = out[j]
                got_b = array(b) if gb == guard else None
                if (
                    got_b is not None
                    and (b.lo, b.hi) == (a.lo, a.hi)
                    and (got_b[1].lo, got_b[1].hi) == (inner_a.lo, inner_a.hi)
                    and temps[got_b[0]].size == temps[acc_a].size
                    and out[j - 1][0] == guard
                    and init(out[j - 1], *got_b)
                ):
                    between = [x[2] for x in out[i + 1 : j - 1]]
                    first = out[j - 1][2]
                    if _apart_sums(a, b, between) and _independent(
                        [first], [a, *between], self.k.shared
                    ):
                        inner_b = got_b[1]
                        sub = _subst({b.var: a.var, inner_b.var: inner_a.var})
                        moved = tuple(sub.stmt(x) for x in inner_b.body)
                        inner = dataclasses.replace(inner_a, body=inner_a.body + moved)
                        joined = dataclasses.replace(a, body=(inner,), reduce=a.reduce + b.reduce)
                        out[i : j + 1] = [out[j - 1], (guard, lits, joined), *out[i + 1 : j - 1]]
                        i += 1  # (the first values now before it)
                        a, inner_a = joined, inner
                        j = i + 2
                        continue
                j += 1
            i += 1
        return out

    def _guarded(self, body, guard, lits: frozenset) -> list:
        """``(guard, literals, statement)`` for the statements of ``body``: an ``if`` that is
        the same on every thread and holds work for the grid taken apart (``_steps``); the
        literals are the guard's conditions, each ``(cond, holds)``."""
        out = []
        params = set(self.k.params)
        for s in body:
            if isinstance(s, If) and _uniform(s.cond, params) and _grid_work(s):
                c = s.cond
                out += self._guarded(s.then, kir.conj(guard, c), lits | {(c, True)})
                not_c = Un("not", c, "bool")
                out += self._guarded(s.orelse, kir.conj(guard, not_c), lits | {(c, False)})
            else:
                out.append((guard, lits, s))
        return out

    def _reduction(self, loop: For):
        """How the reduction ``loop`` runs on the grid, or None where it does not (it then
        runs on one thread): ``("scalar", {acc: dtype})``, its iterations dealt to the
        grid's threads, each block's accumulators combined by a tree in shared memory, or
        ``("array", accs, inner)``: temporaries' elements updated in ``inner`` (the one
        parallel loop inside; several temporaries of one size where reductions were joined,
        ``_arrays_joined``), the iterations of ``loop`` dealt to the blocks, those of
        ``inner`` to a block's threads, each block accumulating into a partial copy of each
        temporary of its own."""
        accs = dict(loop.reduce)
        temps = {t.name: t for t in self.k.temps}
        if any(op not in kir.REDUCE_OPS for op in accs.values()):
            return None
        stmts = list(kir.walk_tree(loop.body))
        if any(isinstance(s, (Gemm, Permute)) for s in stmts):
            return None
        if all(a not in temps and a not in self.bufs for a in accs):  # locals
            if any(isinstance(s, Store) for s in stmts):
                return None
            dtypes = {}
            for s in stmts:
                if isinstance(s, Let) and s.name in accs:
                    v = s.value
                    if not (
                        isinstance(v, Bin)
                        and v.op == accs[s.name]
                        and isinstance(v.a, Ref)
                        and v.a.name == s.name
                        and s.name not in _refs_of(v.b)
                    ):
                        return None
                    dtypes.setdefault(s.name, s.dtype)
            reads = [e for e in _exprs(loop.body) if isinstance(e, Ref) and e.name in accs]
            writes = [s for s in stmts if isinstance(s, Let) and s.name in accs]
            if len(reads) != len(writes) or set(dtypes) != set(accs):
                return None
            if any(dt not in _SIZE or dt == "bool" for dt in dtypes.values()):
                return None
            return ("scalar", dtypes)
        if any(a not in temps or temps[a].dtype == "bool" for a in accs):
            return None
        if len({temps[a].size for a in accs}) != 1:  # (several: joined, _arrays_joined)
            return None
        if len(accs) == 1:
            ((acc, op),) = accs.items()
            t = temps[acc]
            if t.size == 1 and not any(isinstance(s, For) and s.parallel for s in stmts):
                # one element (a column sum of one column): as a local
                ok = _updates(loop.body, {acc: (op, t.dtype)})
                return ("scalar", {acc: t.dtype}) if ok else None
        inner = loop
        while True:  # loops of one statement each, down to the parallel one
            if len(inner.body) != 1 or not isinstance(inner.body[0], For):
                return None
            inner = inner.body[0]
            if inner.parallel:
                break
        if not _updates(inner.body, {a: (op, temps[a].dtype) for a, op in accs.items()}):
            return None
        return ("array", tuple(accs), inner)

    def _gemm_call(self, s: Gemm, guard):
        """The gemm ``s`` (under ``guard``) as a call of the device's BLAS
        (``items.GemmCall``), or None where an offset or the guard is not a plan
        expression (it then runs as a step of ours)."""
        return _blas_call(self.k, s, guard)

    def _combine(self, loop: For, form):
        """The statement that combines a reduction's partial results (one per block, in
        block order) into its accumulators, and the reduction's number (its scratch, in
        ``self.parts``: ``tl_npartsN``, the blocks that left results, and ``tl_partN_J``,
        the results for accumulator J)."""
        n = len(self.parts)
        count = f"tl_nparts{n}"
        self.parts[count] = ["i64", 1, 0]
        self.bufs[count] = "i64"
        nparts = Load(count, kir.i64(0), "i64")
        b = f"tl_b{n}"
        if form[0] == "scalar":
            lets = []
            for j, (acc, dt) in enumerate(form[1].items()):
                part = f"tl_part{n}_{j}"
                self.parts[part] = [dt, PARTS, 0]
                self.bufs[part] = dt
                op = dict(loop.reduce)[acc]
                term = Load(part, Ref(b), dt)
                if acc in self.bufs:  # a temporary of one element
                    zero = kir.i64(0)
                    total = Bin(op, Load(acc, zero, dt), term, dt)
                    lets.append(Store(acc, zero, total))
                else:
                    lets.append(Let(acc, dt, Bin(op, Ref(acc, dt), term, dt)))
            return For(b, kir.i64(0), nparts, tuple(lets)), n
        temps = {t.name: t for t in self.k.temps}
        size = temps[form[1][0]].size
        q = f"tl_q{n}"
        body = []
        blocks = min(_extent(loop, _array_blocks(size)), _array_blocks(size))  # (reduction's)
        for j, acc in enumerate(form[1]):
            t = temps[acc]
            part = f"tl_part{n}_{j}"
            self.parts[part] = [t.dtype, blocks * size, 0]
            self.bufs[part] = t.dtype
            op = dict(loop.reduce)[acc]
            at = kir.add(kir.mul(Ref(b), size), Ref(q))
            total = Bin(op, Load(acc, Ref(q), t.dtype), Load(part, at, t.dtype), t.dtype)
            body.append(For(b, kir.i64(0), nparts, (Store(acc, Ref(q), total),)))
        return For(q, kir.i64(0), kir.i64(size), tuple(body), True), n

    def phase(self, fname: str, st: _Step, loads, stores, passed, then=None, spread=None) -> str:
        """One step as a function (``then``: the step that combines a reduction's results
        and what the other steps use, run by the reduction's last block to finish; with
        ``spread`` not None, by every block after it made the whole reduction, the last
        over the grid where ``spread`` is true: ``spread_phase``)."""
        self.lines = []
        self.local_temps = set()
        self.again = set()
        self.jumps = set()
        self.one_block = False
        kind, body = st.kind, st.body
        if kind == "reduce" and spread is not None:
            threads = self.spread_phase(st, then, loads, stores, passed, spread)
        elif kind == "reduce":
            if then is not None:  # (its own accumulators, apart from the values passed on)
                self.emit(1, "{")
            grouped = self._grouped(st, then)
            threads = self.reduction(st, grouped)
            if then is not None:
                self.emit(1, "}")
                self.temps_again(then)
                self.last_block(then, loads, stores, passed, st if grouped else None)
        tail = st.form.tail if kind == "gemm" and isinstance(st.form, _Own) else ()
        if kind != "reduce":
            threads = self.step_body(st, loads, stores, passed)
        if tail and not _merged(st):  # (the steps after a gram's sums: its last block's,
            everything = _buffers(self.k.body)  # as a reduction's; a merged gram's: own_lines)
            self.last_block([(t, everything) for t in tail], loads, stores, passed)
        self.phases.append((fname, max(1, min(threads, 1 << 31))))
        head = [
            (
                f'extern "C" __global__ void {fname}(void **table, const tl_args args_in, '
                "char *scratch, int *err, const long long *shift) {"
            )
        ]
        # an earlier step's failure: read first, looked at with the block's first barrier
        # (the block's threads agree), so that the loads of the call's loop values and of
        # the buffers' addresses go out with it, where they waited for it (a round trip to
        # the device's memory more at the start of every launch)
        # (a product or a permutation cannot fail; a gram's tail is loops, which check theirs)
        beside = st.form.beside if kind == "gemm" and isinstance(st.form, _Own) else None
        barrier = kind not in ("gemm", "perm") or bool(tail) or beside is not None
        if barrier:
            head.append("  const int tl_stop = *(volatile int *)err;")
        else:
            head.append("  if (*(volatile int *)err) return;  // an earlier step failed")
        head.append("  const tl_args args = tl_shifted(args_in, shift);")
        if barrier:
            head += ["  __shared__ int tl_fail;", "  if (threadIdx.x == 0) tl_fail = 0;"]
        extra = self._parts_of(st.number)
        if kind == "perm":  # (its scratch; its output at the last step only)
            last = st.form[0] in ("out", "sort")
            head += self.pointers([], [body.scratch] + ([body.out] if last else []))
        elif kind == "chain":  # (its steps read their buffers' addresses themselves; the
            temps = {t.name for t in self.k.temps} | set(self.parts)  # temporaries' here)
            steps = sorted(_buffers(st.statements()) & temps)
            head += self.pointers(_chain_top(st.body), steps)
        else:
            used = st.statements() + [x for t, _ in then or () for x in t.statements()]
            if kind == "gemm" and st.form is not None:  # (a gram's launches: no C; C alone)
                one = products.launches(body.m, body.n, body.k, body.ta, body.tb) == ("part",)
                sums = list(st.form.sums[:1])  # (its column sums')
                if st.form.kind == "joint":  # (the rows product's, and the gram's as a part)
                    g = st.form.other
                    one = products.launches(g.m, g.n, g.k, g.ta, g.tb) == ("part",)
                    epilogue = [st.form.epilogue] if st.form.epilogue is not None else []
                    gram = [g, *sums] if one else [dataclasses.replace(g, c=g.a)]
                    used = [body, *epilogue, *gram]
                elif st.form.kind == "part" and not one:
                    used = [dataclasses.replace(body, c=body.a)]
                elif st.form.kind == "part":
                    used = [body, *sums]
                elif st.form.kind == "sum":
                    used = [dataclasses.replace(body, a=body.c, b=body.c), *sums]
                used += [x for t in st.form.tail for x in t.statements()]
                used += beside[0].statements() if beside is not None else []
            head += self.pointers(used, extra if kind == "reduce" else ())
        for v in loads:
            dt, off = passed[v]
            head.append(f"  {CTYPE[dt]} {name(v)} = *({CTYPE[dt]} *)(scratch + {off});")
        if barrier:
            head.append("  if (__syncthreads_or(tl_stop)) return;  // an earlier step failed")
        return "\n".join(head + self.lines + ["}"]) + "\n"

    def spread_phase(self, st: _Step, then: list, loads, stores, passed, grid: bool) -> int:
        """A small sum (``_spread``'s) that every block makes whole: its threads each every
        ``blockDim.x``-th term (``TL_UNROLL``: the loads of several terms in flight), a tree
        in shared memory into the block's one partial result (in shared memory too, the
        count of results 1); then the steps ``then``, each as the last block of a reduction
        runs it (a combination the same loop, over one result; a further sum as the first),
        the threads meeting between two; with ``grid``, the last of them (parallel loops)
        over the grid. The threads it asks for: the last step's, or one block's."""
        sums = [st] + [t for t, _ in then if t.kind == "reduce"]
        for r in sums:
            for p in self._parts_of(r.number):
                self.emit(1, f"__shared__ {MTYPE[self.parts[p][0]]} {buf(p)}[1];")
                self.local_temps.add(p)
        # (a later sum's accumulator of one element, which the steps before it set to its
        # first value: the temporary itself after the first sum, each sum's own scope
        # holding the thread's copy, so that it is declared before those steps use it)
        for r in sums[1:]:
            if r.form[0] == "scalar":
                self.local_temps.update(acc for acc in r.form[1] if acc in self.bufs)
        outside = self.others
        self.one_block = self.spreading = True
        self.emit(1, "{")
        self.reduction(st)
        self.emit(1, "}")
        self.temps_again(then)
        for k, (t, others) in enumerate(then[:-1] if grid else then):
            self.emit(1, "__syncthreads();")
            self.others = others
            if t.kind == "reduce":
                self.emit(1, "{")
                self.reduction(t)
                self.emit(1, "}")
                self.temps_again(then[k + 1 :])
            else:
                self.step_body(t, loads, stores, passed)
        self.one_block = self.spreading = False
        self.others = outside
        if not grid:
            return THREADS
        self.emit(1, "__syncthreads();")
        last, others = then[-1]
        self.others = others
        threads = self.step_body(last, loads, stores, passed)
        self.others = outside
        return threads

    def temps_again(self, then: list):
        """After a reduction's scope: each temporary the reduction kept per thread or per
        block that the steps ``then`` use, the temporary itself again (for the combining
        step)."""
        wanted = set().union(*(_buffers(t.statements()) for t, _ in then))
        for t in self.k.temps:
            if t.name in self.local_temps and t.name in wanted and t.name not in self.again:
                mt = MTYPE[t.dtype]
                self.emit(1, f"{mt} *{buf(t.name)} = ({mt} *)(scratch + {t.offset});")
                self.again.add(t.name)  # (once a function: a later sum's scope shadows it)

    def _parts_of(self, count: int) -> list[str]:
        """The scratch names of reduction ``count``'s partial results (``_combine``)."""
        return [
            p for p in self.parts if p == f"tl_nparts{count}" or p.startswith(f"tl_part{count}_")
        ]

    def last_block(self, then: list, loads, stores, passed, grouped=None):
        """After a reduction's partial results: each block takes a ticket, and the last to
        finish (it sees every block's results) runs the steps ``then`` (each with what the
        other steps use), the first of which combines them, as a grid of one block, its
        threads meeting between two. Where the reduction is ``grouped`` (an array
        reduction's step, ``_grouped``), the last block of each group of blocks combines
        the group's copies first (``group_combine``), and those blocks take the tickets."""
        self.emit(1, "__threadfence();  // (this block's partial results, then its ticket)")
        self.emit(1, "__shared__ int tl_last;")
        if grouped is not None:
            self.group_combine(grouped)
        blocks = "tl_ng" if grouped is not None else "gridDim.x"
        self.emit(
            1, f"if (threadIdx.x == 0) tl_last = atomicAdd(tl_count(err), 1u) == {blocks} - 1;"
        )
        self.emit(1, "__syncthreads();")
        self.emit(1, "if (!tl_last) return;  // the last block combines the results")
        self.emit(1, "__threadfence();")
        self.emit(1, "if (threadIdx.x == 0) *tl_count(err) = 0;")
        self.in_one_block(then, loads, stores, passed, grouped)

    def in_one_block(self, then: list, loads, stores, passed, grouped=None):
        """The steps ``then`` (each with what the other steps use) run by one block, its
        threads meeting between two (``last_block``'s; a merged gram's last block's after
        its sums, ``own_lines``)."""
        outside = self.others
        self.one_block = True
        self.groups_of = grouped.number if grouped is not None else None
        for k, (st, others) in enumerate(then):
            if k:
                self.emit(1, "__syncthreads();")
            self.others = others
            self.step_body(st, loads, stores, passed)
        self.one_block = False
        self.groups_of = None
        self.others = outside

    def _grouped(self, st: _Step, then) -> bool:
        """Whether the blocks of reduction step ``st`` combine its copies in groups before
        its last block combines the groups' (``group_combine``): an array reduction's, whose
        last block then combines them by lanes (``copies_by_lanes``)."""
        if st.form[0] != "array" or not then:
            return False
        return any(
            t.kind == "parallel" and _combines(t, st.number) and _lanes_combine(t.body)
            for t, _ in then
        )

    def group_combine(self, st: _Step):
        """An array reduction's blocks in groups of ``tl_gs`` (``tl_group_size``: about the
        square root of their number; ``tl_ng`` groups): each block takes a ticket of its
        group's, and the group's last to finish combines the group's copies (block order,
        its threads as lanes of the copies: ``copies_by_lanes``) into the group's first
        copy, then takes a ticket of ``tl_count``'s (``last_block``), whose last combines
        the groups' first copies. Groups of one block (fewer than 3 blocks): none of it."""
        n = st.number
        temps = {t.name: t for t in self.k.temps}
        ops = dict(st.body.reduce)
        accs = st.form[1]
        size = temps[accs[0]].size
        self.emit(1, "const unsigned tl_gs = tl_group_size(gridDim.x);")
        self.emit(1, "const unsigned tl_ng = (gridDim.x + tl_gs - 1) / tl_gs;")
        self.emit(1, "if (tl_gs > 1) {")
        self.emit(2, "const unsigned tl_first = blockIdx.x / tl_gs * tl_gs;")
        self.emit(
            2,
            "const unsigned tl_in = gridDim.x - tl_first < tl_gs ? gridDim.x - tl_first : tl_gs;",
        )
        self.emit(
            2,
            "if (threadIdx.x == 0) "
            "tl_last = atomicAdd(tl_groups(err) + blockIdx.x / tl_gs, 1u) == tl_in - 1;",
        )
        self.emit(2, "__syncthreads();")
        self.emit(2, "if (!tl_last) return;  // the group's last block combines its copies")
        self.emit(2, "__threadfence();")
        self.emit(2, "if (threadIdx.x == 0) tl_groups(err)[blockIdx.x / tl_gs] = 0;")
        parts = []
        for j, acc in enumerate(accs):
            dt = temps[acc].dtype
            parts.append((buf(f"tl_part{n}_{j}"), ops[acc], dt, f"tl_glanes{n}_{j}"))
            self.emit(2, f"__shared__ {MTYPE[dt]} tl_glanes{n}_{j}[{THREADS}];")
        self.lanes_count("tl_gl", size)
        self.emit(
            2, f"for (long long tl_t = threadIdx.x; tl_t < tl_gl * {size}; tl_t += blockDim.x) {{"
        )
        self.emit(3, f"const long long tl_e = tl_t % {size};")
        for j, (_, op, dt, _) in enumerate(parts):
            self.emit(3, f"{CTYPE[dt]} tl_v{j} = {identity(op, dt)};")
        self.emit(3, "TL_UNROLL")
        self.emit(
            3,
            f"for (long long tl_c = tl_first + tl_t / {size}; tl_c < tl_first + tl_in; "
            "tl_c += tl_gl) {",
        )
        for j, (part, op, dt, _) in enumerate(parts):
            self.emit(
                4, f"tl_v{j} = {binary(op, f'tl_v{j}', f'{part}[tl_c * {size} + tl_e]', dt)};"
            )
        self.emit(3, "}")
        for j, (part, _, _, lanes) in enumerate(parts):
            self.emit(3, f"if (tl_gl == 1) {part}[tl_first * {size} + tl_e] = tl_v{j};")
            self.emit(3, f"else {lanes}[tl_t] = tl_v{j};")
        self.emit(2, "}")
        self.lanes_tree("tl_gl", size, [(lanes, op, dt) for _, op, dt, lanes in parts])
        self.emit(2, f"if (tl_gl > 1 && threadIdx.x < {size}) {{")
        for part, _, _, lanes in parts:
            self.emit(3, f"{part}[tl_first * {size} + threadIdx.x] = {lanes}[threadIdx.x];")
        self.emit(2, "}")
        self.emit(2, "__syncthreads();")
        self.emit(2, "__threadfence();  // (the group's sums, then the ticket)")
        self.emit(1, "}")

    def step_body(self, st: _Step, loads, stores, passed) -> int:
        """The lines of a step that is not a reduction; the threads it asks for."""
        kind, body = st.kind, st.body
        if kind == "serial":
            threads = 1
            mine = _lets(body)
            skip = self.label()
            if self.one_block and body and not self.spreading:
                body = self.combined_by_block(body)
            who = "threadIdx.x == 0" if self.one_block else "blockIdx.x == 0 && threadIdx.x == 0"
            segments = self._block_sums(body)
            if len(segments) > 1:
                self.serial_with_sums(segments, mine, who, skip, loads, stores, passed)
                return threads
            self.emit(1, f"if ({who}) {{")
            for v, dt in mine.items():
                if v not in loads:
                    self.emit(2, f"{CTYPE[dt]} {name(v)};")
            self.straight(body, 2, skip)
            self.serial_end(skip, stores, passed)
            self.emit(1, "}")
        elif kind == "parallel":
            threads = _grid_extent(body)
            if not (self.one_block and self.copies_by_lanes(body)):
                self.grid_loop(body, 1, collapse=True)
        elif kind == "either":
            # loops that touch nothing of each other's, or under exclusive guards (only one
            # does work at a call): side by side over the grid, each thread a point of one
            # (``_packed``), where each thread took a point of each in turn; one barrier
            # and one look at the block's failure after the last (none of them reads what
            # another writes: a barrier between two waited for nothing, and each cost the
            # H100's blocks about a microsecond: a step of 30 copies of weights, 27 us)
            offsets = _packed(body, st.form)
            threads = max(o + _grid_extent(loop) for o, loop in zip(offsets, body))
            groups = None if self.rows or self.one_block else _ranges_of(body, offsets)
            if groups is not None:
                self.either_by_ranges(body, groups, threads)
                return threads
            outside = self.others
            for k, (loop, at) in enumerate(zip(body, offsets)):
                self.others = outside | _buffers([x for x in body if x is not loop])
                last = k == len(body) - 1
                self.grid_loop(loop, 1, collapse=True, skew=at, epilogue=last)
            self.others = outside
        elif kind == "perm":
            threads = self.permute(st)
        elif kind == "chain":
            threads = self.chain_body(st)
        elif st.form is not None and st.form.beside is not None:  # (and loops: _beside)
            threads = self.own_beside(st, loads, stores, passed)
        elif st.form is not None:  # a product's function of ours (own_product, _gram_sums)
            depth = self.open_guard(st)
            threads = self.own_lines(body, st.form, depth, (loads, stores, passed))
            if st.guard is not None:
                self.emit(1, "}")
        else:
            threads = body.m * body.n
            depth = self.open_guard(st)
            self.gemm(
                body,
                depth,
                "(long long)blockIdx.x * blockDim.x + threadIdx.x",
                "(long long)gridDim.x * blockDim.x",
            )
            if st.guard is not None:
                self.emit(1, "}")
        return threads

    def own_beside(self, st: _Step, loads, stores, passed) -> int:
        """A product's function of ours with the loop step beside it (``_beside``): the
        launch's first ``tl_pb`` blocks the product's (``tl_beside_split``: as many as it
        asks for where the loops keep as many as they ask for or an eighth of the grid,
        whichever is fewer, one at least; one block alone makes both, one after the other),
        the others the loops', each over its blocks as over a grid of its own (``tl_bx``,
        ``tl_gx``). The threads both ask for."""
        loop, others = st.form.beside
        form = dataclasses.replace(st.form, beside=None)
        lines, self.lines = self.lines, []
        depth = self.open_guard(st)
        mine = self.own_lines(st.body, form, depth, (loads, stores, passed))
        if st.guard is not None:
            self.emit(1, "}")
        product, self.lines = self.lines, []
        outside, self.others = self.others, others
        theirs = self.step_body(loop, loads, stores, passed)
        self.others = outside
        loops, self.lines = self.lines, lines
        pb, lb = -(-mine // THREADS), -(-theirs // THREADS)
        self.emit(1, f"const unsigned tl_pb = tl_beside_split(gridDim.x, {pb}u, {lb}u);")
        self.emit(1, "if (blockIdx.x < tl_pb) {  // (the product's blocks)")
        self.emit(1, "const unsigned tl_bx = blockIdx.x, tl_gx = tl_pb;")
        self.lines += [_own_grid(x) for x in product]
        self.emit(1, "}")
        self.emit(1, "if (blockIdx.x >= tl_pb || gridDim.x == 1) {  // (the loops')")
        self.emit(1, "const unsigned tl_bx = blockIdx.x - (gridDim.x == 1 ? 0 : tl_pb);")
        self.emit(1, "const unsigned tl_gx = gridDim.x == 1 ? 1 : gridDim.x - tl_pb;")
        self.lines += [_own_grid(x) for x in loops]
        self.emit(1, "}")
        return pb * THREADS + lb * THREADS

    def own_lines(self, s: Gemm, form: _Own, depth: int, io=([], [], {})) -> int:
        """The lines of a function of ours for gemm ``s`` (``products``; ``form``: rows, or
        a gram's part or sum, with its copies' place, its B's column sums or its epilogue);
        the threads it asks for."""
        kind, at = form.kind, form.at
        a = f"{buf(s.a)} + ({self.expr(s.aoff)})"
        b = f"{buf(s.b)} + ({self.expr(s.boff)})"
        c = f"{buf(s.c)} + ({self.expr(s.coff)})"
        copies = f"(scratch + {at})"
        sums = buf(form.acc) if form.acc is not None else None
        if kind == "rows":
            store = self._epilogue_store(s, form.epilogue) if form.epilogue else None
            if form.tf32:
                lines = products.rows_tf32_lines(s, a, b, c, store)
                threads = products.rows_tf32_threads(s.m)
            else:
                lines = products.rows_lines(s, a, b, c, store)
                threads = products.rows_threads(s.m, s.n, s.k)
        elif kind == "joint":
            g = form.other
            store = self._epilogue_store(s, form.epilogue) if form.epilogue else None
            ga = f"{buf(g.a)} + ({self.expr(g.aoff)})"
            gc = f"{buf(g.c)} + ({self.expr(g.coff)})"
            lines = products.joint_tf32_lines(s, g, ga, a, b, c, copies, gc, store, sums)
            threads = products.gram_part_threads(g.k)
        elif kind == "part":
            part = products.gram_part_tf32_lines if form.tf32 else products.gram_part_lines
            lines = part(s, a, b, copies, c, sums, self._after_sums(form, io))
            threads = products.gram_part_threads(s.k)
        else:
            lines = products.gram_sum_lines(s, c, copies, sums)
            threads = products.gram_sum_threads(s.m, s.n, s.k)
        for line in lines:
            self.emit(0 if line.startswith("#") else depth, line)
        return threads

    def _after_sums(self, form: _Own, io) -> list[str]:
        """The lines of a merged gram's steps after its sums (``form.tail``,
        ``products.merged``): run by the block that adds its last group of copies, as a
        reduction's last block runs them (``in_one_block``; ``io``: the step's loads, stores
        and values passed), at depth 0."""
        if not form.tail:
            return []
        lines, self.lines = self.lines, []
        try:
            everything = _buffers(self.k.body)
            self.in_one_block([(t, everything) for t in form.tail], *io)
            return [x.removeprefix("  ") for x in self.lines]
        finally:
            self.lines = lines

    def _epilogue_store(self, s: Gemm, nest: For) -> tuple[str, str, str]:
        """What a rows function stores for an element of C with ``nest``
        (``_rows_epilogues``: its one store, C's element read as the product's value):
        ``(rows, column, value)``: the C line that defines the nest's row variables from
        the element's row ``r``, the C name of its column variable (which the function
        defines), and the value's C expression, which reads the product's value as
        ``tl_v``."""
        rows, col = _epilogue(nest, s, self.k.params)
        store = nest
        while isinstance(store, For):
            store = store.body[0]
        self.hoisted = {
            e: "tl_v" for e in kir.subexprs(store.value) if isinstance(e, Load) and e.buf == s.c
        }
        try:
            value = self.expr(store.value)
        finally:
            self.hoisted = {}
        defs, below = [], 1
        for var, extent in reversed(rows):
            at = "r" if below == 1 else f"(r / {below}LL)"
            defs.append(f"{name(var)} = {at}" + (f" % {extent}LL" if var != rows[0][0] else ""))
            below *= extent
        line = f"const long long {', '.join(reversed(defs))};"
        line += "".join(f" (void){name(var)};" for var, _ in rows)
        return line, name(col), value

    def serial_end(self, skip: str, stores, passed):
        """The end of a run on thread 0: the label its failures jump to, its failure
        reported, the values it passes on stored in the scratch memory."""
        self.end(2, skip)
        self.emit(2, f"if (tl_fail) {{ tl_failed(err, tl_fail, {self.k.sid}, args); return; }}")
        for v in stores:
            dt, off = passed[v]
            self.emit(2, f"*({CTYPE[dt]} *)(scratch + {off}) = {name(v)};")

    def _block_sums(self, body: list) -> list[tuple[list, list | None]]:
        """``body`` (a run on one thread) cut at each sum the block's threads can take
        (``_block_sum``): ``[(statements before it, its nest of loops), ..., (the rest,
        None)]``; one segment where there is none, or where the run can fail (a failure
        jumps to the run's end, past the block's barriers)."""
        if self.rows or _fails_any(body):
            return [(body, None)]
        out, run = [], []
        for s in body:
            nest = self._block_sum(s)
            if nest is None:
                run.append(s)
            else:
                out.append((run, nest))
                run = []
        return out + [(run, None)]

    def _block_sum(self, s) -> list | None:
        """The nest of loops of ``s``, where ``s`` is a sum (``For.reduce``, into locals) of
        at least ``BLOCK_TERMS`` terms over loops of constant bounds, one inside the other,
        whose terms read memory, constants and the call's loop values only (a local of the
        run is thread 0's alone): the block's threads can then take its terms, where thread
        0 took them one after another (a gradient's norm: nine sums of up to 256 squares,
        some 900 loads, each a wait on the device's memory). Else None."""
        if not (isinstance(s, For) and s.reduce and not s.parallel):
            return None
        form = self._reduction(s)
        if form is None or form[0] != "scalar" or any(a in self.bufs for a in form[1]):
            return None
        nest = [s]
        while len(nest[-1].body) == 1 and isinstance(nest[-1].body[0], For):
            nest.append(nest[-1].body[0])
        inner = nest[-1].body
        if any(isinstance(x, (For, Store, Fail, Gemm, Permute)) for x in kir.walk_tree(inner)):
            return None
        if _carried(inner, form[1]):  # (the inner loops' iterations must be apart too)
            return None
        if any(
            x.parallel
            or not (isinstance(x.lo, Const) and isinstance(x.hi, Const))
            or int(x.hi.value) <= int(x.lo.value)
            for x in nest
        ):
            return None
        if math.prod(_extent(x) for x in nest) < BLOCK_TERMS:
            return None
        own = {x.var for x in nest} | set(form[1]) | set(_lets(inner)) | set(self.k.params)
        if _refs(nest) - own:
            return None
        return nest

    def serial_with_sums(self, segments, mine: dict, who: str, skip: str, loads, stores, passed):
        """A run on one thread with sums the block's threads take (``_block_sums``): the
        run's locals declared for every thread (thread 0's are the run's), each piece of
        the run on thread 0, then each sum by the block (``block_sums``), which thread 0
        adds into its accumulators at the start of the next piece. The sums after it whose
        terms read nothing the pieces before them write go with it (one pass, one tree):
        a gradient norm's 8 small sums of squares (PPO's) were 8 trees of 7 barriers each, one
        after another in a reduction's last block."""
        self.emit(1, "{")
        for v, dt in mine.items():
            if v not in loads:
                self.emit(1, f"{CTYPE[dt]} {name(v)};")
        pending: dict[int, list[str]] = {}  # segment -> thread 0's adds of a sum's total
        done: set[int] = set()  # the segments whose sums went with an earlier one's
        for j, (run, nest) in enumerate(segments):
            self.emit(1, f"if ({who}) {{")
            for line in pending.get(j, ()):
                self.emit(2, line)
            self.stmts(run, 2, skip)
            if nest is None:
                self.serial_end(skip, stores, passed)
            self.emit(1, "}")
            if nest is None or j in done:
                continue
            batch, written = [j], set()
            for q in range(j + 1, len(segments)):
                run_q, nest_q = segments[q]
                written |= _written(run_q)
                if nest_q is None or _buffers(nest_q) & written:
                    break
                batch.append(q)
            for q, lines in zip(batch, self.block_sums([segments[q][1] for q in batch])):
                pending[q + 1] = lines
                done.add(q)
        self.emit(1, "}")

    def block_sums(self, nests: list) -> list[list[str]]:
        """The sums ``nests`` (``_block_sum``'s, whose terms read nothing the run writes
        between them) by the threads of the block that runs the run on one thread: each
        thread the terms ``threadIdx.x``, ``blockDim.x`` apart (the loops' points numbered,
        the innermost fastest), into its own accumulators, each sum's after the one
        before, then one tree in shared memory for all of them (fixed: a build gives the
        same bits every run); for each sum, the lines by which thread 0 then adds the
        block's sums into its accumulators."""
        owner = "true" if self.one_block else "blockIdx.x == 0"
        sums = []  # (nest, ops, dtypes, shared arrays)
        for nest in nests:
            ops = dict(nest[0].reduce)
            n = self.block_sums_made
            self.block_sums_made += 1
            shared = {acc: f"tl_bs{n}_{j}" for j, acc in enumerate(ops)}
            sums.append((nest, ops, self._reduction(nest[0])[1], shared))
        for _, _, dtypes, shared in sums:
            for acc, dt in dtypes.items():
                self.emit(1, f"__shared__ {MTYPE[dt]} {shared[acc]}[{THREADS}];")
        self.emit(1, "__syncthreads();  // (thread 0's writes before the sums' terms)")
        self.emit(1, f"if ({owner}) {{")
        for nest, ops, dtypes, shared in sums:
            total = math.prod(_extent(x) for x in nest)
            self.emit(2, "{")
            for acc, dt in dtypes.items():
                self.emit(3, f"{CTYPE[dt]} {name(acc)} = {identity(ops[acc], dt)};")
            self.emit(
                3, f"for (long long tl_g = threadIdx.x; tl_g < {total}LL; tl_g += blockDim.x) {{"
            )
            self.nest_point(nest, "tl_g", 4)
            for lv, dt in _lets(nest[-1].body).items():
                if lv not in ops:
                    self.emit(4, f"{CTYPE[dt]} {name(lv)};")
            skip = self.label()
            self.stmts(nest[-1].body, 4, skip)
            self.end(4, skip)
            self.emit(3, "}")
            for acc in ops:
                self.emit(3, f"{shared[acc]}[threadIdx.x] = {name(acc)};")
            self.emit(2, "}")
        self.emit(1, "}")
        self.emit(1, "__syncthreads();")
        self.emit(1, "for (unsigned tl_s = 1; tl_s < blockDim.x; tl_s *= 2) {")
        self.emit(
            2,
            f"if ({owner} && threadIdx.x % (2 * tl_s) == 0 && threadIdx.x + tl_s < blockDim.x) {{",
        )
        for _, ops, dtypes, shared in sums:
            for acc, dt in dtypes.items():
                r = shared[acc]
                both = binary(ops[acc], f"{r}[threadIdx.x]", f"{r}[threadIdx.x + tl_s]", dt)
                self.emit(3, f"{r}[threadIdx.x] = {both};")
        self.emit(2, "}")
        self.emit(2, "__syncthreads();")
        self.emit(1, "}")
        return [
            [
                f"{name(acc)} = {binary(ops[acc], name(acc), f'{shared[acc]}[0]', dt)};"
                for acc, dt in dtypes.items()
            ]
            for _, ops, dtypes, shared in sums
        ]

    def array_in_registers(self, st, loop: For, inner: For, accs: tuple, held):
        """An array reduction's sums in registers (``_in_registers``): each thread an
        element of a row and a *lane*, the block's threads as many lanes of the row as fit
        (a power of two: at 128 threads a 64-wide bias gradient 2, a 2-wide one 64; one
        where the row is wider than the block, each thread then taking elements
        ``blockDim.x`` apart), each lane the rows ``blockIdx.x * lanes + lane`` on,
        ``gridDim.x * lanes`` apart, in order, summing into a register; then the lanes'
        sums by a tree in shared memory into the block's copy (fixed: a build gives the same
        bits every run). A row at a time each thread added into the copy in the device's
        memory, each add waiting for the one before, and half the block's threads (a 64-wide
        row) idle."""
        regs, body = held
        temps = {t.name: t for t in self.k.temps}
        ops = dict(loop.reduce)
        e, v = name(inner.var), name(loop.var)
        lo = self.expr(inner.lo)
        width = f"(({self.expr(inner.hi)}) - ({lo}))"
        lanes = {acc: f"tl_lanes_{name(r)}" for acc, r in zip(accs, regs)}
        for acc in accs:
            self.emit(1, f"__shared__ {MTYPE[temps[acc].dtype]} {lanes[acc]}[{THREADS}];")
        self.lanes_count("tl_lanes", width)
        depth = self.open_guard(st)
        self.emit(
            depth,
            f"for (long long tl_t = threadIdx.x; tl_t < tl_lanes * {width}; "
            "tl_t += blockDim.x) {",
        )
        inside = depth + 1
        self.emit(inside, f"const long long {e} = ({lo}) + tl_t % {width};")
        self.emit(inside, f"const long long tl_lane = tl_t / {width};")
        for acc, r in zip(accs, regs):
            dt = temps[acc].dtype
            self.emit(inside, f"{CTYPE[dt]} {name(r)} = {identity(ops[acc], dt)};")
        for lv, dt in _lets(inner.body).items():
            self.emit(inside, f"{CTYPE[dt]} {name(lv)};")
        self.emit(inside, "TL_UNROLL")
        self.emit(
            inside,
            f"for (long long {v} = ({self.expr(loop.lo)}) + (long long)blockIdx.x * tl_lanes "
            f"+ tl_lane; {v} < {self.expr(loop.hi)}; {v} += (long long)gridDim.x * tl_lanes) {{",
        )
        skip = self.label()
        self.stmts(body, inside + 1, skip)
        self.end(inside + 1, skip)
        self.emit(inside, "}")
        self.emit(inside, "if (tl_lanes == 1) {")
        for acc, r in zip(accs, regs):
            self.emit(inside + 1, f"{buf(acc)}[{e}] = {name(r)};")
        self.emit(inside, "} else {")
        for acc, r in zip(accs, regs):
            self.emit(inside + 1, f"{lanes[acc]}[tl_t] = {name(r)};")
        self.emit(inside, "}")
        self.emit(depth, "}")
        if st.guard is not None:
            self.emit(1, "}")
        # (outside the guard: every thread meets at each barrier)
        self.lanes_tree("tl_lanes", width, [(lanes[a], ops[a], temps[a].dtype) for a in accs])
        guard = f"{self.expr(st.guard)} && " if st.guard is not None else ""
        self.emit(1, f"if ({guard}tl_lanes > 1 && threadIdx.x < {width}) {{")
        for acc in accs:
            self.emit(2, f"{buf(acc)}[({lo}) + threadIdx.x] = {lanes[acc]}[threadIdx.x];")
        self.emit(1, "}")
        self.emit(1, "__syncthreads();")
        self.emit(1, "if (threadIdx.x == 0) {")

    def _in_registers(self, loop: For, inner: For, accs: tuple, count: int):
        """Where the sums of an array reduction (``loop`` over the rows, ``inner`` over a
        row's elements, straight inside it) may each be a register of the thread that
        takes an element: ``(registers, inner's body adding to them)``; None where the body
        stores elsewhere or at another index, writes a temporary, or can fail (or in a loop
        kernel's block)."""
        if self.rows or self.one_block or loop.body != (inner,) or _fails_any(inner.body):
            return None
        if not _written(inner.body) <= set(accs):
            return None
        at = Ref(inner.var)
        regs = {acc: f"tl_acc{count}_{j}" for j, acc in enumerate(accs)}
        body = []
        for x in inner.body:
            if isinstance(x, Let):
                body.append(x)
                continue
            if not (
                isinstance(x, Store)
                and x.buf in regs
                and x.index == at
                and isinstance(x.value, Bin)
                and x.value.a == Load(x.buf, at, x.value.dtype)
            ):
                return None
            r = Ref(regs[x.buf], x.value.dtype)
            body.append(Let(regs[x.buf], x.value.dtype, dataclasses.replace(x.value, a=r)))
        return [regs[a] for a in accs], body

    def lanes_count(self, lanes: str, width):
        """``long long lanes``: as many lanes of ``width`` threads as the block holds, a
        power of two (at most ``THREADS``; one where a lane is wider than the block)."""
        self.emit(1, f"long long {lanes} = 1;")
        self.emit(
            1,
            f"while ({lanes} * 2 * {width} <= blockDim.x && {lanes} * 2 <= {THREADS}) "
            f"{lanes} *= 2;",
        )

    def lanes_tree(self, lanes: str, width, shared: list):
        """The lanes' values in each shared array of ``shared`` (``(name, op, dtype)``:
        thread ``lane * width + element``'s at that index) combined by a tree into lane 0's,
        every thread meeting at each barrier."""
        self.emit(1, "__syncthreads();")
        self.emit(1, f"for (long long tl_s = 1; tl_s < {lanes}; tl_s *= 2) {{")
        self.emit(
            2,
            f"if (threadIdx.x < {lanes} * {width} && (threadIdx.x / {width}) % (2 * tl_s) == 0 "
            f"&& threadIdx.x / {width} + tl_s < {lanes}) {{",
        )
        for sh, op, dt in shared:
            both = binary(op, f"{sh}[threadIdx.x]", f"{sh}[threadIdx.x + tl_s * {width}]", dt)
            self.emit(3, f"{sh}[threadIdx.x] = {both};")
        self.emit(2, "}")
        self.emit(2, "__syncthreads();")
        self.emit(1, "}")

    def copies_by_lanes(self, loop: For) -> bool:
        """The last block's combination of an array reduction's copies (``_combine``: each
        element ``q`` of the temporaries, the blocks' copies in block order, under the
        reduction's guard) with the block's threads as lanes of the copies: each thread an
        element and a lane (as many lanes as fit, a power of two), summing every
        ``lanes``-th copy in a register, then a tree over the lanes (fixed order), the
        element's first value added last; where each thread summed one element's up to 256
        copies one after another, each a load waiting for the one before. False (nothing
        written) where ``loop`` is not such a combination."""
        form = _lanes_combine(loop)
        if form is None:
            return False
        guard, inner = form
        q = loop.var
        n = q.removeprefix("tl_q")
        # (grouped: the groups' sums, in each group's first copy: group_combine)
        grouped = self.groups_of is not None and n == str(self.groups_of)
        size = int(loop.hi.value) - int(loop.lo.value)
        terms = [(f.body[0], f.body[0].value.op, f.body[0].value.b) for f in inner]
        for j, (st, _, _) in enumerate(terms):
            self.emit(1, f"__shared__ {MTYPE[st.value.dtype]} tl_lanes{n}_{j}[{THREADS}];")
        self.lanes_count("tl_cl", size)
        depth = 1
        if guard is not None:
            self.emit(1, f"if ({self.expr(guard)}) {{")
            depth = 2
        self.emit(
            depth,
            f"for (long long tl_t = threadIdx.x; tl_t < tl_cl * {size}; tl_t += blockDim.x) {{",
        )
        self.emit(depth + 1, f"const long long {name(q)} = {int(loop.lo.value)} + tl_t % {size};")
        self.emit(depth + 1, f"const long long {name(inner[0].var)} = tl_t / {size};")
        # the temporaries whose copies run over one range (a joined reduction's: the same
        # blocks) in one loop, an accumulator each: their loads go out together, where each
        # temporary's loop waited for the one before it (the order of each sum the same)
        groups: list[list[int]] = []
        for j, f in enumerate(inner):
            same = [g for g in groups if (inner[g[0]].var, inner[g[0]].hi) == (f.var, f.hi)]
            if same:
                same[0].append(j)
            else:
                groups.append([j])
        for group in groups:
            b, hi = name(inner[group[0]].var), self.expr(inner[group[0]].hi)
            hi, at = ("(long long)tl_ng", "tl_c * tl_gs") if grouped else (hi, "tl_c")
            self.emit(depth + 1, "{")
            for j in group:
                st, op, _ = terms[j]
                self.emit(
                    depth + 2, f"{CTYPE[st.value.dtype]} tl_v{j} = {identity(op, st.value.dtype)};"
                )
            self.emit(depth + 2, "TL_UNROLL")
            self.emit(depth + 2, f"for (long long tl_c = {b}; tl_c < {hi}; tl_c += tl_cl) {{")
            self.emit(depth + 3, f"const long long {b} = {at};  (void){b};")
            for j in group:
                st, op, part = terms[j]
                v = f"tl_v{j}"
                self.emit(depth + 3, f"{v} = {binary(op, v, self.expr(part), st.value.dtype)};")
            self.emit(depth + 2, "}")
            for j in group:
                st, op, _ = terms[j]
                own, v = f"{buf(st.buf)}[{name(q)}]", f"tl_v{j}"
                self.emit(
                    depth + 2, f"if (tl_cl == 1) {own} = {binary(op, own, v, st.value.dtype)};"
                )
                self.emit(depth + 2, f"else tl_lanes{n}_{j}[tl_t] = {v};")
            self.emit(depth + 1, "}")
        self.emit(depth, "}")
        if guard is not None:
            self.emit(1, "}")
        shared = [(f"tl_lanes{n}_{j}", op, st.value.dtype) for j, (st, op, _) in enumerate(terms)]
        self.lanes_tree("tl_cl", size, shared)
        cond = f"{self.expr(guard)} && " if guard is not None else ""
        self.emit(1, f"if ({cond}tl_cl > 1 && threadIdx.x < {size}) {{")
        for j, (st, op, _) in enumerate(terms):
            own = f"{buf(st.buf)}[{int(loop.lo.value)} + threadIdx.x]"
            both = binary(op, own, f"tl_lanes{n}_{j}[threadIdx.x]", st.value.dtype)
            self.emit(2, f"{own} = {both};")
        self.emit(1, "}")
        return True

    def combined_by_block(self, body: list) -> list:
        """``body`` (a run the last block of a reduction makes, on its thread 0), where it
        starts by combining the blocks' results into locals (``_combine``'s loop over them
        in block order, under the reduction's guard), with the results combined first by
        every thread of the block: each its share of them in order, then a tree in shared
        memory (fixed: a build gives the same bits on every run); the loop then takes the
        tree's result. Up to 256 results one after another were as many loads from the
        device's memory, each waiting for the one before (some 30 us on a GPU)."""
        first, guard = body[0], None
        if isinstance(first, If) and not first.orelse and len(first.then) == 1:
            guard, first = first.cond, first.then[0]
        if not (
            isinstance(first, For)
            and first.var.startswith("tl_b")
            and isinstance(first.hi, Load)
            and first.hi.buf.startswith("tl_nparts")
        ):
            return body
        terms = []  # (accumulator: a local or a one-element temporary, op, results, dtype)
        for x in first.body:
            v = x.value if isinstance(x, (Let, Store)) else None
            if not (isinstance(v, Bin) and isinstance(v.b, Load) and v.b.index == Ref(first.var)):
                return body
            terms.append((x, v.op, v.b.buf, v.b.dtype))
        if not terms or any(dt not in _SIZE or dt == "bool" for _, _, _, dt in terms):
            return body
        n = first.var.removeprefix("tl_b")
        for j, (_, _, _, dt) in enumerate(terms):  # (outside the guard: thread 0 reads them)
            self.bufs[f"tl_cmb{n}_{j}"] = dt
            self.emit(1, f"__shared__ {MTYPE[dt]} {buf(f'tl_cmb{n}_{j}')}[{THREADS}];")
        depth = 1
        if guard is not None:
            self.emit(1, f"if ({self.expr(guard)}) {{")
            depth = 2
        self.emit(depth, f"const long long tl_nb{n} = {self.expr(first.hi)};")
        combined = []
        for j, (x, op, part, dt) in enumerate(terms):
            red = f"tl_cmb{n}_{j}"
            self.emit(depth, "{")
            self.emit(depth + 1, f"{CTYPE[dt]} tl_v = {identity(op, dt)};")
            self.emit(
                depth + 1,
                f"for (long long tl_q = threadIdx.x; tl_q < tl_nb{n}; tl_q += blockDim.x) "
                f"tl_v = {binary(op, 'tl_v', f'{buf(part)}[tl_q]', dt)};",
            )
            self.emit(depth + 1, f"{buf(red)}[threadIdx.x] = tl_v;")
            self.emit(depth, "}")
            total = Load(red, kir.i64(0), dt)
            if isinstance(x, Let):
                combined.append(Let(x.name, x.dtype, dataclasses.replace(x.value, b=total)))
            else:
                combined.append(
                    dataclasses.replace(x, value=dataclasses.replace(x.value, b=total))
                )
        self.emit(depth, "__syncthreads();")
        self.emit(depth, "for (unsigned tl_s = 1; tl_s < blockDim.x; tl_s *= 2) {")
        self.emit(
            depth + 1, "if (threadIdx.x % (2 * tl_s) == 0 && threadIdx.x + tl_s < blockDim.x) {"
        )
        for j, (_, op, _, dt) in enumerate(terms):
            r = buf(f"tl_cmb{n}_{j}")
            both = binary(op, f"{r}[threadIdx.x]", f"{r}[threadIdx.x + tl_s]", dt)
            self.emit(depth + 2, f"{r}[threadIdx.x] = {both};")
        self.emit(depth + 1, "}")
        self.emit(depth + 1, "__syncthreads();")
        self.emit(depth, "}")
        if guard is not None:
            self.emit(1, "}")
        step = tuple(combined) if guard is None else (If(guard, tuple(combined)),)
        return list(step) + list(body[1:])

    def reduction(self, st: _Step, grouped: bool = False) -> int:
        """A reduction's step (``_reduction``); the threads it asks for. Each block leaves
        its partial results in ``self.parts`` (and block 0 the number of blocks), which
        ``_combine``'s statement, the next step's, adds up in block order (an array
        reduction's ``grouped``: on up to ``ARRAY_PARTS`` blocks, ``_array_blocks``)."""
        loop, form = st.body, st.form
        count = st.number
        ops = dict(loop.reduce)
        if form[0] == "scalar":
            accs = form[1]
            own = {}  # accumulator -> its C lvalue
            for acc, dt in accs.items():
                self.emit(1, f"__shared__ {MTYPE[dt]} tl_red_{name(acc)}[{THREADS}];")
                if acc in self.bufs:  # a temporary of one element: the thread's own
                    self.local_temps.add(acc)
                    self.emit(1, f"{MTYPE[dt]} {buf(acc)}[1] = {{{identity(ops[acc], dt)}}};")
                    own[acc] = f"{buf(acc)}[0]"
                else:
                    self.emit(1, f"{CTYPE[dt]} {name(acc)} = {identity(ops[acc], dt)};")
                    own[acc] = name(acc)
            depth = self.open_guard(st)
            self.grid_loop(loop, depth, epilogue=False, own=set(accs), unroll=self.one_block)
            if st.guard is not None:
                self.emit(1, "}")
            for acc in accs:
                self.emit(1, f"tl_red_{name(acc)}[threadIdx.x] = {own[acc]};")
            self.emit(1, "__syncthreads();")
            # a tree: in round s, each thread at a multiple of 2s takes in the one s after it
            self.emit(1, "for (unsigned tl_s = 1; tl_s < blockDim.x; tl_s *= 2) {")
            self.emit(2, "if (threadIdx.x % (2 * tl_s) == 0 && threadIdx.x + tl_s < blockDim.x) {")
            for acc, dt in accs.items():
                r = f"tl_red_{name(acc)}"
                both = binary(ops[acc], f"{r}[threadIdx.x]", f"{r}[threadIdx.x + tl_s]", dt)
                self.emit(3, f"{r}[threadIdx.x] = {both};")
            self.emit(2, "}")
            self.emit(2, "__syncthreads();")
            self.emit(1, "}")
            self.emit(1, "if (threadIdx.x == 0) {")
            at = "0" if self.one_block else "blockIdx.x"  # (every block's own: spread_phase)
            for j, (acc, dt) in enumerate(accs.items()):
                self.emit(2, f"{buf(f'tl_part{count}_{j}')}[{at}] = tl_red_{name(acc)}[0];")
            threads = min(_extent(loop, PARTS * THREADS), PARTS * THREADS)
        else:
            _, accs, inner = form
            temps = {t.name: t for t in self.k.temps}
            for j, acc in enumerate(accs):
                t = temps[acc]
                mt = MTYPE[t.dtype]
                self.local_temps.add(acc)  # (its pointer is the block's partial copy)
                part = buf(f"tl_part{count}_{j}")
                self.emit(1, f"{mt} *{buf(acc)} = {part} + (long long)blockIdx.x * {t.size};")
                self.emit(
                    1,
                    f"for (long long tl_q = threadIdx.x; tl_q < {t.size}; tl_q += blockDim.x) "
                    f"{buf(acc)}[tl_q] = {identity(ops[acc], t.dtype)};",
                )
            t = temps[accs[0]]
            self.emit(1, "__syncthreads();")
            held = self._in_registers(loop, inner, accs, count)
            if held is not None:
                self.array_in_registers(st, loop, inner, accs, held)
                blocks = _array_blocks(t.size, grouped)
                threads = min(_extent(loop, blocks), blocks) * THREADS
                self.emit(2, f"if (blockIdx.x == 0) {buf(f'tl_nparts{count}')}[0] = gridDim.x;")
                self.emit(2, f"if (tl_fail) tl_failed(err, tl_fail, {self.k.sid}, args);")
                self.emit(1, "}")
                return threads
            depth = self.open_guard(st)
            v = name(loop.var)
            self.emit(
                depth,
                f"for (long long {v} = ({self.expr(loop.lo)}) + blockIdx.x; {v} < "
                f"{self.expr(loop.hi)}; {v} += gridDim.x) {{",
            )
            node, closes = loop, 0
            while node.body[0] is not inner:
                node = node.body[0]
                depth += 1
                self.emit(
                    depth,
                    f"for (long long {name(node.var)} = {self.expr(node.lo)}; {name(node.var)} "
                    f"< {self.expr(node.hi)}; {name(node.var)}++) {{",
                )
                closes += 1
            self.grid_loop(
                inner,
                depth + 1,
                first=f"({self.expr(inner.lo)}) + threadIdx.x",
                step="blockDim.x",
                epilogue=False,
            )
            for _ in range(closes + 1):
                self.emit(depth, "}")
                depth -= 1
            if st.guard is not None:
                self.emit(1, "}")
            self.emit(1, "__syncthreads();")
            self.emit(1, "if (threadIdx.x == 0) {")
            blocks = _array_blocks(t.size, grouped)
            threads = min(_extent(loop, blocks), blocks) * THREADS
        if self.one_block:  # (every block's own result: spread_phase)
            self.emit(2, f"{buf(f'tl_nparts{count}')}[0] = 1;")
        else:
            self.emit(2, f"if (blockIdx.x == 0) {buf(f'tl_nparts{count}')}[0] = gridDim.x;")
        self.emit(2, f"if (tl_fail) tl_failed(err, tl_fail, {self.k.sid}, args);")
        self.emit(1, "}")
        return threads

    def open_guard(self, st: _Step) -> int:
        """``if (guard) {`` where step ``st`` has a guard (``_steps``); the depth inside."""
        if st.guard is None:
            return 1
        self.emit(1, f"if ({self.expr(st.guard)}) {{")
        return 2

    def permute(self, st: _Step) -> int:
        """A step of a permutation on the grid (``tl_perm_key``, ``tl_perm_merge``): its
        keys into the first half of its scratch and the passes of the merge sort whose runs
        lie within a tile (``PERM_TILE_PASSES``: a block a tile, its threads meeting between
        two passes, each from one half into the other), a pass over the whole, or the
        indices out of the half the last pass wrote; the threads."""
        s, what = st.body, st.form
        keys = f"(u64 *){buf(s.scratch)}"
        depth = self.open_guard(st)
        if what[0] in ("count", "scan", "scatter", "sort"):
            threads = self.perm_buckets(s, what[0], what[1], depth)
            if st.guard is not None:
                self.emit(1, "}")
            return threads
        if what[0] == "tile":  # a block a tile: its keys, then the passes within it
            tile = 1 << PERM_TILE_PASSES
            self.emit(
                depth,
                f"for (long long tl_t = blockIdx.x; tl_t * {tile}LL < {s.n}LL; "
                "tl_t += gridDim.x) {",
            )
            self.emit(depth + 1, f"const long long lo = tl_t * {tile}LL;")
            self.emit(
                depth + 1,
                f"const long long hi = lo + {tile}LL < {s.n}LL ? lo + {tile}LL : {s.n}LL;",
            )
            self.emit(depth + 1, "for (long long e = lo + threadIdx.x; e < hi; e += blockDim.x)")
            self.emit(depth + 2, f"tl_perm_key({s.seed}, {s.site}, {self.expr(s.p)}, e, {keys});")
            for p in range(what[1]):
                src, dst = (s.n, 0) if p % 2 else (0, s.n)
                self.emit(depth + 1, "__syncthreads();")
                self.emit(
                    depth + 1, "for (long long e = lo + threadIdx.x; e < hi; e += blockDim.x)"
                )
                self.emit(
                    depth + 2,
                    f"tl_perm_merge({keys} + {src}, {keys} + {dst}, {s.n}LL, {1 << p}LL, e);",
                )
            self.emit(depth + 1, "__syncthreads();")
            self.emit(depth, "}")
            if st.guard is not None:
                self.emit(1, "}")
            return -(-s.n // tile) * THREADS  # (a block a tile)
        self.emit(
            depth,
            f"for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < {s.n}LL; "
            "e += (long long)gridDim.x * blockDim.x) {",
        )
        if what[0] == "pass":
            src, dst = (s.n, 0) if what[1] % 2 else (0, s.n)
            line = f"tl_perm_merge({keys} + {src}, {keys} + {dst}, {s.n}LL, {1 << what[1]}LL, e);"
        else:
            last = s.n if what[1] % 2 else 0
            line = f"{buf(s.out)}[e] = (int)(({keys})[{last} + e] & 0xFFFFFFFFull);"
        self.emit(depth + 1, line)
        self.emit(depth, "}")
        if st.guard is not None:
            self.emit(1, "}")
        return s.n

    def perm_buckets(self, s: Permute, what: str, d: int, depth: int) -> int:
        """A step of permutation ``s`` by ``2^d`` buckets of its keys (``_perm_digits``),
        ``what``: ``count`` (a block a chunk of ``PERM_CHUNK`` keys: its count a bucket, in
        the block's shared memory, into the scratch's words), ``scan`` (one block: each
        bucket's first place, and each chunk's first place in each bucket), ``scatter``
        (a block a chunk: each key into the next place of its chunk's in its bucket, in
        the scratch's second half; the order within a bucket is the atomics', any) or
        ``sort`` (a block a bucket: its keys sorted in shared memory by a bitonic network,
        their indices out; the keys are distinct, so the result is the merge sort's
        whatever order the scatter left). The scratch's first half holds the counts (the
        keys are made again where needed); the threads."""
        b, n = 1 << d, s.n
        chunks, per = -(-n // PERM_CHUNK), -(-b // THREADS)
        assert chunks * b + b + 1 <= 2 * n  # (the counts and places in the first half)
        words = f"((unsigned *){buf(s.scratch)})"
        sorted_keys = f"((u64 *){buf(s.scratch)} + {n})"
        starts = f"({words} + {chunks * b})"
        key = f"tl_perm_key_at({s.seed}, {s.site}, {self.expr(s.p)}, e)"
        lines: list[str] = []
        if what in ("count", "scatter"):
            lines = [
                f"__shared__ unsigned tl_h[{b}];",
                f"for (long long c = blockIdx.x; c < {chunks}LL; c += gridDim.x) {{",
                f"  for (int q = threadIdx.x; q < {b}; q += blockDim.x)"
                + (" tl_h[q] = 0u;" if what == "count" else f" tl_h[q] = {words}[c * {b} + q];"),
                "  __syncthreads();",
                f"  const long long lo = c * {PERM_CHUNK}LL;",
                f"  const long long hi = lo + {PERM_CHUNK}LL < {n}LL ?",
                f"    lo + {PERM_CHUNK}LL : {n}LL;",
                "  for (long long e = lo + threadIdx.x; e < hi; e += blockDim.x) {",
                f"    const u64 tl_k = {key};",
                f"    const unsigned tl_at = atomicAdd(&tl_h[tl_perm_bucket(tl_k, {d})], 1u);",
                f"    {sorted_keys}[tl_at] = tl_k;" if what == "scatter" else "    (void)tl_at;",
                "  }",
                "  __syncthreads();",
            ]
            if what == "count":  # (the chunk's counts out, read before the next zeroes them)
                lines += [
                    (
                        f"  for (int q = threadIdx.x; q < {b}; q += blockDim.x)"
                        f" {words}[c * {b} + q] = tl_h[q];"
                    ),
                    "  __syncthreads();",
                ]
            lines.append("}")
            threads = chunks * THREADS
        elif what == "scan":
            # (each thread a run of buckets: its runs' counts, the runs' first places by
            # thread 0, then each bucket's and each of its chunks'; a chunk's counts read 8
            # at a time, their loads in flight together)
            lines = [
                f"__shared__ unsigned tl_t[{b}];",
                f"__shared__ unsigned tl_r[{THREADS}];",
                "if (blockIdx.x == 0) {",
                f"  for (int q = threadIdx.x; q < {b}; q += blockDim.x) {{",
                "    unsigned tl_s = 0u;",
                f"    for (long long c = 0; c < {chunks}LL; c++) tl_s += {words}[c * {b} + q];",
                "    tl_t[q] = tl_s;",
                "  }",
                "  __syncthreads();",
                f"  for (int g = threadIdx.x; g < {THREADS}; g += blockDim.x) {{",
                "    unsigned tl_s = 0u;",
                f"    for (int q = g * {per}; q < {b} && q < (g + 1) * {per}; q++)",
                "      tl_s += tl_t[q];",
                "    tl_r[g] = tl_s;",
                "  }",
                "  __syncthreads();",
                "  if (threadIdx.x == 0) {",
                "    unsigned tl_s = 0u;",
                f"    for (int g = 0; g < {THREADS}; g++) {{",
                "      const unsigned tl_x = tl_r[g];",
                "      tl_r[g] = tl_s;",
                "      tl_s += tl_x;",
                "    }",
                "  }",
                "  __syncthreads();",
                f"  for (int g = threadIdx.x; g < {THREADS}; g += blockDim.x) {{",
                "    unsigned tl_s = tl_r[g];",
                f"    for (int q = g * {per}; q < {b} && q < (g + 1) * {per}; q++) {{",
                "      const unsigned tl_x = tl_t[q];",
                "      tl_t[q] = tl_s;",
                "      tl_s += tl_x;",
                "    }",
                "  }",
                "  __syncthreads();",
                f"  for (int q = threadIdx.x; q < {b}; q += blockDim.x) {{",
                "    unsigned tl_s = tl_t[q];",
                f"    {starts}[q] = tl_s;",
                f"    for (long long c0 = 0; c0 < {chunks}LL; c0 += 8) {{",
                "      unsigned tl_x[8];",
                "#pragma unroll",
                "      for (int u = 0; u < 8; u++)",
                f"        tl_x[u] = c0 + u < {chunks}LL ? {words}[(c0 + u) * {b} + q] : 0u;",
                "#pragma unroll",
                "      for (int u = 0; u < 8; u++) {",
                f"        if (c0 + u < {chunks}LL) {words}[(c0 + u) * {b} + q] = tl_s;",
                "        tl_s += tl_x[u];",
                "      }",
                "    }",
                "  }",
                f"  if (threadIdx.x == 0) {starts}[{b}] = {n}u;",
                "}",
            ]
            threads = THREADS
        else:  # sort
            lines = [
                f"__shared__ u64 tl_s[{PERM_CAP}];",
                f"for (long long q = blockIdx.x; q < {b}LL; q += gridDim.x) {{",
                f"  const unsigned lo = {starts}[q], m = {starts}[q + 1] - lo;",
                f"  if (m <= {PERM_CAP}u) {{",
                "    unsigned tl_n = 1u;",
                "    while (tl_n < m) tl_n *= 2u;",
                "    for (unsigned i = threadIdx.x; i < tl_n; i += blockDim.x)",
                f"      tl_s[i] = i < m ? {sorted_keys}[lo + i] : ~0ull;",
                "    __syncthreads();",
                "    for (unsigned k = 2u; k <= tl_n; k *= 2u) {",
                "      for (unsigned j = k / 2u; j > 0u; j /= 2u) {",
                "        for (unsigned i = threadIdx.x; i < tl_n; i += blockDim.x) {",
                "          const unsigned l = i ^ j;",
                "          if (l > i) {",
                "            const u64 x = tl_s[i], y = tl_s[l];",
                "            if ((x > y) == ((i & k) == 0u)) {",
                "              tl_s[i] = y;",
                "              tl_s[l] = x;",
                "            }",
                "          }",
                "        }",
                "        __syncthreads();",
                "      }",
                "    }",
                "    for (unsigned i = threadIdx.x; i < m; i += blockDim.x)",
                f"      {buf(s.out)}[lo + i] = (int)(tl_s[i] & 0xFFFFFFFFull);",
                "  } else {  // (more than shared memory holds: each key ranked among them)",
                "    for (unsigned i = threadIdx.x; i < m; i += blockDim.x) {",
                f"      const u64 x = {sorted_keys}[lo + i];",
                "      unsigned r = 0u;",
                f"      for (unsigned j = 0u; j < m; j++) r += {sorted_keys}[lo + j] < x;",
                f"      {buf(s.out)}[lo + r] = (int)(x & 0xFFFFFFFFull);",
                "    }",
                "  }",
                "  __syncthreads();",
                "}",
            ]
            threads = b * THREADS
        for line in lines:
            self.emit(depth, line)
        return threads

    def grid_loop(
        self,
        s: For,
        depth: int,
        first=None,
        step=None,
        epilogue=True,
        own=(),
        collapse=False,
        skew=0,
        unroll=False,
    ):
        """A parallel loop over the grid (or, given ``first`` and ``step``, over what they
        say): each thread its iterations, its own locals (but ``own``, declared before) and
        its own copy of the per-point temporaries (written in the loop, used by no other
        step); a failing iteration sets its block's code, which goes to ``*err`` once the
        block is done (``epilogue``; else the caller's). ``collapse``: the parallel loops
        perfectly nested in it (``_nest``) are one loop with it, a thread per point.
        ``skew``: the loop's first point goes to the grid's thread ``skew`` (``tl_skew``:
        the threads before it take its last points, where the grid is smaller than the
        loop and the others it shares the grid with)."""
        v = name(s.var)
        mine = self.own_temps(s)
        nest = _nest(s) if collapse else [s]
        step = step or "(long long)gridDim.x * blockDim.x"
        if self.rows or self.one_block:  # (a loop kernel's block: its rows tl_rb ..< tl_re
            step = "blockDim.x"  # of the loop's; the last block of a reduction: all of it)
        if len(nest) > 1:
            # a nest of parallel loops is one loop over the grid, each thread one point of
            # the nest (its variables from the point's number, the innermost fastest)
            inner = math.prod(_extent(x) for x in nest[1:])
            lo = self.expr(s.lo)
            count = f"(({self.expr(s.hi)}) - ({lo})) * {inner}LL"
            first = "(long long)blockIdx.x * blockDim.x + threadIdx.x"
            if self.rows:
                count, first = f"tl_re * {inner}LL", f"tl_rb * {inner}LL + threadIdx.x"
            elif self.one_block:
                first = "(long long)threadIdx.x"
            if skew and not self.rows:
                first = f"tl_skew({first}, {skew}LL, {step})"
            if len(nest) == 2 and not (self.rows or self.one_block):
                self.emit(depth, f"if (({step}) % {inner}LL == 0) {{")
                self.column_loop(s, nest[1], depth + 1, first, step, mine, own)
                self.emit(depth, "} else {")
                depth += 1
            self.emit(depth, f"for (long long tl_g = {first}; tl_g < {count}; tl_g += {step}) {{")
            self.nest_point(nest, "tl_g", depth + 1)
            body = nest[-1].body
        else:
            if first is None or self.one_block:
                thread = "(long long)blockIdx.x * blockDim.x + threadIdx.x"
                if self.one_block:
                    thread = "(long long)threadIdx.x"
                if skew:
                    thread = f"tl_skew({thread}, {skew}LL, {step})"
                first = f"({self.expr(s.lo)}) + {thread}"
            hi = self.expr(s.hi)
            if self.rows:
                lo = self.expr(s.lo)
                first, hi = f"({lo}) + tl_rb + threadIdx.x", f"({lo}) + tl_re"
            elif not self.one_block and not s.reduce and self.batchable(s.body, mine):
                # (not a reduction's terms: a sum into a temporary of one element stores
                # into the same element at every point, and a pass's points each took the
                # value before the pass, all but the last's term lost wherever a thread
                # had more than one term: on a GPU past PARTS blocks' threads)
                self.emit(depth, "{")
                self.emit(depth + 1, f"const long long tl_rs = {step};")
                self.batched(s.var, first, hi, "tl_rs", s.body, depth + 1)
                self.emit(depth, "}")
                if epilogue:
                    self.block_done(depth)
                return
            if unroll:  # (a sum's terms: their loads in flight, spread_phase)
                self.emit(depth, "TL_UNROLL")
            self.emit(depth, f"for (long long {v} = {first}; {v} < {hi}; {v} += {step}) {{")
            body = s.body
        self.point(s, body, depth, mine, own)
        self.emit(depth, "}")
        if len(nest) == 2 and not (self.rows or self.one_block):
            depth -= 1
            self.emit(depth, "}")
        if epilogue:
            self.block_done(depth)

    def block_done(self, depth: int):
        """After a step's loops: the block's barrier, then its failure, if any, recorded."""
        self.emit(depth, "__syncthreads();")
        self.emit(
            depth, f"if (threadIdx.x == 0 && tl_fail) tl_failed(err, tl_fail, {self.k.sid}, args);"
        )

    def own_temps(self, s: For) -> set[str]:
        """The temporaries parallel loop ``s`` writes and no other step uses: each thread's
        own copy (counted in ``local_temps``)."""
        temps = {t.name for t in self.k.temps}
        mine = temps & (_written(s.body) - self.others) - self.row_shared
        self.local_temps |= mine
        return mine

    def nest_point(self, nest: list, at: str, depth: int, unused: bool = False):
        """The variables of point number ``at`` of ``nest`` (``_nest``: the innermost
        fastest) as constants; ``unused``: cast to void, as a point may read none."""
        quiet = (lambda v: f"  (void){v};") if unused else (lambda v: "")
        self.emit(depth, f"long long tl_r = {at};")
        for x in reversed(nest[1:]):
            n, v = _extent(x), name(x.var)
            self.emit(
                depth,
                f"const long long {v} = ({self.expr(x.lo)}) + tl_r % {n}LL;{quiet(v)}  "
                f"tl_r /= {n}LL;",
            )
        v = name(nest[0].var)
        self.emit(depth, f"const long long {v} = ({self.expr(nest[0].lo)}) + tl_r;{quiet(v)}")

    def either_by_ranges(self, body, groups, total: int):
        """An ``either`` step's loops (``_ranges_of``: constant bounds, each group's threads
        its own) dispatched by range: each of the grid's threads takes its points, and
        for each, the group of loops whose range holds it (a jump), one point of each of
        them. Side by side, each thread walked every loop's code, testing its range: PPO's
        step of 36 statements' copies (72 loops, 10,000 lines of PTX) took 38.6 us on the
        H200 for 27,463 floats, a thread's one copy among them."""
        outside = self.others
        step = "(long long)gridDim.x * blockDim.x"
        first = "(long long)blockIdx.x * blockDim.x + threadIdx.x"
        self.emit(1, f"for (long long tl_p = {first}; tl_p < {total}LL; tl_p += {step}) {{")
        self.emit(2, "int tl_k = 0;")
        for lo, _, _ in groups[1:]:
            self.emit(2, f"tl_k += tl_p >= {lo}LL;")
        self.emit(2, "switch (tl_k) {")
        for g, (lo, hi, members) in enumerate(groups):
            self.emit(2, f"case {g}: {{")
            self.emit(3, f"const long long tl_q = tl_p - {lo}LL;")
            self.emit(3, f"if (tl_q < {hi - lo}LL) {{")
            for i in members:
                loop = body[i]
                self.others = outside | _buffers([x for x in body if x is not loop])
                self.point_at(loop, "tl_q", 4)
            self.emit(3, "}")
            self.emit(3, "break;")
            self.emit(2, "}")
        self.emit(2, "}")
        self.emit(1, "}")
        self.others = outside
        self.block_done(1)

    def point_at(self, s: For, q: str, depth: int):
        """Point number ``q`` of parallel loop ``s`` and the loops nested in it (``_nest``,
        the innermost fastest), in a block of its own at ``depth``."""
        mine = self.own_temps(s)
        nest = _nest(s)
        self.emit(depth, "{")
        self.nest_point(nest, q, depth + 1, unused=True)
        self.point(s, nest[-1].body, depth, mine, ())
        self.emit(depth, "}")

    def point(self, s: For, body, depth: int, mine, own):
        """A point of parallel loop ``s``: its per-point temporaries and locals, then
        ``body`` (inside the loop, at ``depth + 1``)."""
        for t in self.k.temps:
            if t.name in mine:
                self.emit(depth + 1, f"{MTYPE[t.dtype]} {buf(t.name)}[{max(t.size, 1)}];")
        for lv, dt in _lets(s.body).items():
            if lv not in own:
                self.emit(depth + 1, f"{CTYPE[dt]} {name(lv)};")
        skip = self.label()
        self.straight(body, depth + 1, skip)
        self.end(depth + 1, skip)

    def straight(self, body, depth: int, skip: str):
        """The statements ``body`` of one thread (a point's, a serial step's): the loads of
        what they do not write before the first (``_point_loads``: else each statement's
        loads waited for the store before them, which might write the same memory, for
        all the compiler knows, a round trip each), a value stored and read back from a
        local (``forwarded``)."""
        outer = self.hoisted
        self.hoisted = dict(outer)
        if FORWARD and sum(1 for _ in itertools.takewhile(_assignment, body)) > 1:
            self.hoist(_point_loads(body, _written(body), set(self.k.shared)), depth)
        self.forwarded(body, depth, skip)
        self.hoisted = outer

    def hoist(self, loads, depth: int):
        """Each of ``loads`` not yet read into a local read into one (``self.hoisted``)."""
        for ld in loads:
            if ld not in self.hoisted:
                h = f"tl_h{len(self.hoisted)}"
                self.emit(depth, f"const {CTYPE[ld.dtype]} {h} = {self.expr(ld)};")
                self.hoisted[ld] = h

    def forwarded(self, body, depth: int, skip: str):
        """``body``'s statements on one thread, a value it stores and reads back at the same
        index read from a local (``FORWARD``): its locals declared before the first
        statement (a failure's jump past an initialization would not compile). The compiler
        may not do it itself: a store to another buffer between the two may write the same
        memory, for all it knows; the kernel knows which buffers may (``Kernel.shared``),
        and a thread's chain of store, load, store... waited a round trip to the memory at
        each load (PPO's rows of a statement's ops one after another, Adam's moments and
        its update)."""
        if not FORWARD or self.fwd is not None:
            self.stmts(body, depth, skip)
            return
        at = len(self.lines)
        self.fwd, self.fwd_scopes, self.fwd_locals = {}, [[]], []
        try:
            self.stmts(body, depth, skip)
        finally:
            decls = [f"{'  ' * depth}{t} {v};" for v, t in self.fwd_locals]
            self.lines[at:at] = decls
            self.fwd, self.fwd_scopes, self.fwd_locals = None, [], []

    def fwd_assigned(self, names) -> None:
        """Forget the forwarded values whose index reads a local of ``names`` (assigned
        since: the index names another element now)."""
        if self.fwd:
            self.fwd = {k: v for k, v in self.fwd.items() if not v[1] & names}

    def fwd_written(self, written: set[str]) -> None:
        """Forget what may no longer hold: the values of buffers in ``written``, and those
        whose index reads one (of every buffer that may be another's memory where one of
        those is)."""
        shared = set(self.k.shared)
        if written & shared:
            written = written | shared
        if self.fwd:
            self.fwd = {
                k: v for k, v in self.fwd.items() if k[0] not in written and not v[2] & written
            }

    def column_loop(self, s: For, col: For, depth: int, first: str, step: str, mine, own):
        """A nest of two parallel loops (rows ``s``, columns ``col``) over the grid where its
        stride is a whole number of rows (the caller's test): each thread's column is the
        same at each of its points, so the loads whose index reads only the column (and
        the call's loop values) of buffers the loop does not write, outside any part of an
        expression that may not run, are read once before the loop (``self.hoisted``),
        and the thread steps through the rows (no division a point); where the rows are a
        constant, positive number (else a call's values might leave none, and the loads
        none to read). A forward layer's
        ``tanh(x @ W + b)`` with W 4 x 64: its 4 weights and the bias, 5 of a point's 9
        loads and their addresses, were each point's (PPO's f139_19_5 took 29.6 us for
        two loops of 4.2 M points on the H100, about the count of its instructions)."""
        w = _extent(col)
        self.emit(depth, f"const long long tl_g0 = {first};")
        self.emit(
            depth, f"const long long {name(col.var)} = ({self.expr(col.lo)}) + tl_g0 % {w}LL;"
        )
        loads = []  # (rows the call's values bound may be none: no load before the loop)
        if _constant_nest([s, col]):
            params, written = set(self.k.params), _written(s.body)
            loads = _column_loads(col.body, col.var, params, written, set(self.k.shared))
        outer = self.hoisted
        self.hoisted = dict(outer)
        self.hoist(loads, depth)
        v, lo = name(s.var), self.expr(s.lo)
        if self.batchable(col.body, mine):
            self.emit(depth, f"const long long tl_rs = ({step}) / {w}LL;")
            self.batched(
                s.var, f"({lo}) + tl_g0 / {w}LL", self.expr(s.hi), "tl_rs", col.body, depth
            )
        else:
            self.emit(
                depth,
                f"for (long long {v} = ({lo}) + tl_g0 / {w}LL; {v} < ({self.expr(s.hi)}); "
                f"{v} += ({step}) / {w}LL) {{",
            )
            self.point(s, col.body, depth, mine, own)
            self.emit(depth, "}")
        self.hoisted = outer

    def batchable(self, body, mine) -> bool:
        """Whether a grid loop's points whose statements are ``body`` may go ``IN_FLIGHT``
        at a time (``batched``): stores alone, ``IN_FLIGHT_STORES`` at most (no locals, no
        temporaries of a point's own, no failure), none of their buffers one memory with
        another (a donation's: a point's store and another point's load might meet)."""
        return (
            IN_FLIGHT > 1
            and 0 < len(body) <= IN_FLIGHT_STORES
            and not mine
            and all(isinstance(x, Store) for x in body)
            and not (_buffers(body) & set(self.k.shared))
        )

    def batched(self, var: str, first: str, hi: str, rs: str, body, depth: int):
        """A grid loop over ``var`` from ``first`` below ``hi`` by ``rs`` whose points are
        stores alone (``batchable``), ``IN_FLIGHT`` points a pass: each store's values at
        every point of the pass (their loads all issued before any is used), then its
        stores; the next store's the same. A parallel loop's points are independent, so
        the pass's order (a statement at each point, then the next) computes what the
        points one after another do; the pass's points past the loop's end are skipped."""
        v, n = name(var), IN_FLIGHT
        self.emit(depth, f"for (long long tl_b = {first}; tl_b < ({hi}); tl_b += {n}LL * {rs}) {{")
        # (each point of the pass: its value, and the test that it lies before the end)
        ats = ["tl_b"] + [f"tl_b + {u}LL * {rs}" for u in range(1, n)]
        conds = [""] + [f"if ({at} < ({hi})) " for at in ats[1:]]
        for i, st in enumerate(body):
            mt = MTYPE[self.bufs[st.buf]]
            val = self.expr(st.value)
            if self.bufs[st.buf] == "bool":
                val = f"(unsigned char)({val})"
            where = self.expr(st.index)
            xs = [f"tl_x{i}_{u}" for u in range(n)]
            self.emit(depth + 1, f"{mt} {', '.join(x + ' = 0' for x in xs)};")
            for x, at, cond in zip(xs, ats, conds):
                self.emit(
                    depth + 1, f"{cond}{{ const long long {v} = {at}; (void){v}; {x} = {val}; }}"
                )
            for x, at, cond in zip(xs, ats, conds):
                self.emit(
                    depth + 1,
                    f"{cond}{{ const long long {v} = {at}; (void){v}; "
                    f"{buf(st.buf)}[{where}] = {x}; }}",
                )
        self.emit(depth, "}")

    def pointers(self, body=None, extra=()) -> list[str]:
        """The kernel's loop values, and the buffers and (global) temporaries that the
        statements ``body`` (default: all) use, and the scratch ``extra`` names, as C
        locals."""
        k = self.k
        used = _buffers(k.body if body is None else body) | set(extra)
        out = []
        for j, p in enumerate(k.params):
            out.append(f"  const long long {name(p)} = args.v[{j}];  (void){name(p)};")
        for s in k.slots:
            if s.name in used:
                t = MTYPE[s.dtype]
                out.append(
                    f"  {t} *{buf(s.name)} = ({t} *)table[{s.index}];  (void){buf(s.name)};"
                )
        temps = [(t.name, t.dtype, t.offset) for t in k.temps]
        temps += [(p, dt, off) for p, (dt, _, off) in self.parts.items()]
        for tmp, dt, off in temps:
            if tmp in used and tmp not in self.local_temps:
                out.append(self.temp_pointer(tmp, dt, off))
        return out

    def temp_pointer(self, tmp: str, dt: str, off: int) -> str:
        """The C local that points at temporary ``tmp`` (``dt``) at ``off`` in the scratch
        memory (a loop kernel's may be in the block's shared memory: ``cuda.loops``)."""
        t, b = MTYPE[dt], buf(tmp)
        return f"  {t} *{b} = ({t} *)(scratch + {off});"

    def gemm(self, s: Gemm, depth: int, first: str, step: str, end: str | None = None):
        """``C = op(A) @ op(B)`` element by element, its terms summed in order: the elements
        dealt to the grid's threads (``first``, ``step``), or all on one (``"0"``, ``"1"``);
        ``end``: the element to stop before (a loop kernel's block: its rows')."""
        t = CTYPE[s.dtype]
        a = f"A[{'k * ' + str(s.lda) + ' + i' if s.ta else 'i * ' + str(s.lda) + ' + k'}]"
        b = f"B[{'j * ' + str(s.ldb) + ' + k' if s.tb else 'k * ' + str(s.ldb) + ' + j'}]"
        self.emit(depth, "{")
        self.emit(depth + 1, f"const {t} *A = {buf(s.a)} + ({self.expr(s.aoff)});")
        self.emit(depth + 1, f"const {t} *B = {buf(s.b)} + ({self.expr(s.boff)});")
        self.emit(depth + 1, f"{t} *C = {buf(s.c)} + ({self.expr(s.coff)});")
        end = end or f"{s.m}LL * {s.n}"
        self.emit(depth + 1, f"for (long long e = {first}; e < {end}; e += {step}) {{")
        self.emit(depth + 2, f"long long i = e / {s.n}, j = e % {s.n};")
        self.emit(depth + 2, f"{t} acc = 0;")
        self.emit(depth + 2, f"for (long long k = 0; k < {s.k}; k++) acc += {a} * {b};")
        self.emit(depth + 2, f"C[i * {s.ldc} + j] = acc;")
        self.emit(depth + 1, "}")
        self.emit(depth, "}")

    # ------------------------------------------------------------------ statements
    def stmts(self, stmts, depth: int, skip: str):
        for s in stmts:
            self.stmt(s, depth, skip)

    def stmt(self, s, depth: int, skip: str):
        if isinstance(s, Let):
            self.emit(depth, f"{name(s.name)} = {self.expr(s.value)};")
            self.fwd_assigned({s.name})
        elif isinstance(s, Store):
            val = self.expr(s.value)
            if self.bufs[s.buf] == "bool":
                val = f"(unsigned char)({val})"
            where = self.expr(s.index)
            # (not a thread's own array: the compiler sees it written, and every read of
            # it forwarded would leave it set and never used, which nvcc warns of)
            if self.fwd is None or s.buf in self.local_temps:
                self.emit(depth, f"{buf(s.buf)}[{where}] = {val};")
                return
            self.fwd_written({s.buf})
            local = f"tl_f{len(self.fwd_locals)}"
            self.fwd_locals.append((local, MTYPE[self.bufs[s.buf]]))
            self.emit(depth, f"{local} = {val};")
            self.emit(depth, f"{buf(s.buf)}[{where}] = {local};")
            key = (s.buf, s.index)
            loads = frozenset(x.buf for x in kir.subexprs(s.index) if isinstance(x, Load))
            self.fwd[key] = (local, frozenset(_refs_of(s.index)), loads)
            self.fwd_scopes[-1].append(key)
        elif isinstance(s, For):
            v = name(s.var)
            self.emit(
                depth,
                f"for (long long {v} = {self.expr(s.lo)}; {v} < {self.expr(s.hi)}; {v}++) {{",
            )
            # (an iteration's statements before a store see what the iteration before stored)
            self.fwd_written(_written(s.body))
            changed = set(_lets(s.body)) | {s.var}
            self.fwd_assigned(changed)
            self.scoped(s.body, depth + 1, skip)
            self.emit(depth, "}")
        elif isinstance(s, If):
            self.emit(depth, f"if ({self.expr(s.cond)}) {{")
            self.scoped(s.then, depth + 1, skip)
            if s.orelse:
                self.emit(depth, "} else {")
                self.scoped(s.orelse, depth + 1, skip)
            self.emit(depth, "}")
        elif isinstance(s, Fail):
            self.jumps.add(skip)
            self.emit(depth, f"{{ tl_fail = {int(s.code)}; goto {skip}; }}")
        elif isinstance(s, Gemm):  # a gemm inside a loop of thread 0 (a product per point)
            if self.fwd:  # (it may write any memory, for what forwarding knows)
                self.fwd.clear()
            self.gemm(s, depth, "0", "1")
        elif isinstance(s, Permute):
            if self.fwd:  # (it may write any memory, for what forwarding knows)
                self.fwd.clear()
            self.emit(
                depth,
                f"tl_rng_permutation({s.seed}, {s.site}, {self.expr(s.p)}, {s.n}LL, "
                f"{buf(s.out)}, (long long *){buf(s.scratch)});",
            )
        else:  # pragma: no cover - _check_supported refused it
            raise Unsupported(f"a {type(s).__name__} statement")

    def scoped(self, body, depth: int, skip: str):
        """``body`` in a C block of its own: the values it stores are read back from their
        locals inside it only (what it may store is forgotten after it too)."""
        if self.fwd is None:
            self.stmts(body, depth, skip)
            return
        self.fwd_scopes.append([])
        self.stmts(body, depth, skip)
        made = self.fwd_scopes.pop()
        for key in made:
            self.fwd.pop(key, None)
        self.fwd_written(_written(body))
        changed = set(_lets(body))
        self.fwd_assigned(changed)

    # ------------------------------------------------------------------ expressions
    def expr(self, e) -> str:
        if isinstance(e, Const):
            return const(e.value, e.dtype)
        if isinstance(e, Ref):
            return name(e.name)
        if isinstance(e, Load):
            if e in self.hoisted:  # (read once, before the loop: column_loop)
                return self.hoisted[e]
            got = self.fwd.get((e.buf, e.index)) if self.fwd else None
            if got is not None and e.dtype == self.bufs.get(e.buf):  # (stored: forwarded)
                return f"({got[0]} != 0)" if e.dtype == "bool" else got[0]
            x = f"{buf(e.buf)}[{self.expr(e.index)}]"
            return f"({x} != 0)" if e.dtype == "bool" else x
        if isinstance(e, Cast):
            return cast(self.expr(e.x), e.x.dtype, e.dtype)
        if isinstance(e, Sel):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, Un):
            return unary(e.op, self.expr(e.x), e.x.dtype)
        if isinstance(e, Bin):
            return binary(e.op, self.expr(e.a), self.expr(e.b), e.a.dtype)
        if isinstance(e, Fn) and e.name in RNG_FUNCTIONS:
            return f"{e.name}({', '.join(self.expr(a) for a in e.args)})"
        raise Unsupported(f"the expression {type(e).__name__}")


# ----------------------------------------------------------------------------- analyses


def _perm_digits(n: int) -> int | None:
    """The bits of a permutation of ``n``'s buckets (``_Kernel.perm_buckets``: about
    ``PERM_BUCKET`` keys a bucket), or None where it would have more than ``PERM_BUCKETS``
    (the merge sort's steps)."""
    d = 0
    while (PERM_BUCKET << d) < n:
        d += 1
    return d if (1 << d) <= PERM_BUCKETS else None


# the most a step before or after a reduction's combination may ask to join it (a 64x64
# weight gradient's copy: 32 points a thread of the last block)
TAIL_THREADS = 4096
# a reduction into locals of at most this many terms, over loops of constant bounds, whose
# results the grid's next step needs (more points than a last block takes): every block
# sums all of its terms itself and goes on with that step (``_Kernel._spread``), where the
# step was a launch of its own after the reduction's; further sums join it while all of
# their terms together are at most this many too
SPREAD = True
SPREAD_TERMS = 16384
# ... and at most this many terms all the blocks load together (the loops' points over a
# block's threads, times the terms): past it the loads cost more than a launch's wait
SPREAD_LOADS = 1 << 21


def _apart(run: _Step, red: _Step, shared=()) -> bool:
    """Whether the run on one thread ``run`` and the reduction ``red`` touch nothing of each
    other's (``_independent``), and the reduction reads no local the run assigns."""
    a, b = run.statements(), red.statements()
    if not _independent(a, b, shared):
        return False
    refs = _refs(b)
    if red.form[0] == "scalar":  # (its accumulators: each thread's own, from the identity)
        refs -= set(red.form[1])
    if red.guard is not None:
        refs |= _refs_of(red.guard)
    return not refs & set(_lets(a))


def _first_values(st: _Step, red: _Step) -> bool:
    """Whether the small step ``st`` (``_small``: parallel loops of a few points, or a run on
    one thread, none able to fail) may run after the reduction ``red``, first in its last
    block: of what ``red`` touches it writes only the accumulators that are temporaries (a
    sum's zero, a bias gradient's zeros: each block of ``red`` sums into a copy of its own
    from the identity, and only the combination, the last block's, reads them), it reads
    nothing ``red`` writes, and it has no local. A weight gradient's copy out of the
    product and the bias gradient's zeros before the bias gradient's sum: one launch less."""
    if not _small(st) or st.kind not in ("serial", "parallel", "either"):
        return False
    accs = set(red.form[1])
    a, b = st.statements(), red.statements()
    written = _written(a)
    return (
        not (written & _buffers(b)) - accs
        and not (_buffers(a) - written) & _written(b)
        and not _lets(a)
    )


def _fails(st: _Step) -> bool:
    return any(isinstance(s, Fail) for s in kir.walk_tree(st.statements()))


def _small_after(steps: list[_Step], tail: list[int]) -> list[int]:
    """``tail`` (the steps a reduction's last block runs, one after another, ending with
    its last) with the small steps after it that the block may run too: none can fail, at
    most ``TAIL_THREADS`` points in all (``_small``, ``_points``), and no loop among them
    reads a local of the runs before it (thread 0's alone: the block's other threads have
    the value the function loaded at its start)."""
    tail = list(tail)
    lets = set().union(*(_lets(steps[q].body) for q in tail if steps[q].kind == "serial"))
    points = sum(_points(steps[q]) for q in tail)
    while (
        tail[-1] + 1 < len(steps)
        and not _fails(steps[tail[-1]])
        and _small(nxt := steps[tail[-1] + 1])
        and points + _points(nxt) <= TAIL_THREADS
        and (nxt.kind == "serial" or not _refs(nxt.statements()) & lets)
    ):
        tail.append(tail[-1] + 1)
        points += _points(nxt)
        if nxt.kind == "serial":
            lets |= set(_lets(nxt.body))
    return tail


def _small_sum(st: _Step) -> bool:
    """Whether step ``st`` is a reduction into locals that every block may make whole
    (``_Kernel._spread``): at most ``SPREAD_TERMS`` terms over loops of constant bounds."""
    if st.kind != "reduce" or st.form[0] != "scalar":
        return False
    loops = [x for x in kir.walk_tree([st.body]) if isinstance(x, For)]
    if any(not (isinstance(x.lo, Const) and isinstance(x.hi, Const)) for x in loops):
        return False
    return _terms(st.body) <= SPREAD_TERMS


def _small(st: _Step) -> bool:
    """Whether step ``st`` may run in a reduction's last block: a run on one thread, or
    parallel loops of at most ``TAIL_THREADS`` points, none able to fail."""
    return not _fails(st) and _points(st) <= TAIL_THREADS


def _points(st: _Step) -> int:
    """The points of step ``st`` a block runs where it runs in a reduction's last block (a
    run on one thread: one); more than ``TAIL_THREADS`` for any other kind of step."""
    if st.kind == "serial":
        return 1
    if st.kind == "parallel":
        return _grid_extent(st.body)
    if st.kind == "either":
        return sum(_grid_extent(loop) for loop in st.body)
    return TAIL_THREADS + 1


def _combines(st: _Step, number: int) -> bool:
    """Whether step ``st`` starts by combining reduction ``number``'s partial results
    (``_Kernel._combine``)."""
    first = st.statements()[:1]
    return st.kind in ("serial", "parallel") and any(
        isinstance(s, For) and s.var == f"tl_b{number}" for s in kir.walk_tree(first)
    )


def _extent(loop: For, otherwise: int = THREADS) -> int:
    """The iterations of a parallel loop, where its bounds are constants (else
    ``otherwise``, by default one block's worth: the loop strides over whatever grid it
    gets)."""
    if isinstance(loop.lo, Const) and isinstance(loop.hi, Const):
        return max(int(loop.hi.value) - int(loop.lo.value), 1)
    hi = loop.hi
    if isinstance(hi, Bin) and hi.op == "add" and hi.a == loop.lo and isinstance(hi.b, Const):
        return max(int(hi.b.value), 1)  # (lo ..< lo + n: a block's points)
    return otherwise


def _flat_rows(s: For, form: tuple) -> tuple[For, tuple]:
    """An array reduction ``s`` (``form``: ``("array", accs, inner)``) whose rows are a nest
    of loops of constant bounds, one loop in each, down to ``inner`` (the parallel loop
    over a row's elements): the nest as one loop over its points, the loops' variables
    from the point's number at the top of ``inner``'s body (the innermost fastest). The
    blocks then deal points, and a row's sums go to registers (``array_in_registers``):
    REINFORCE's bias gradient over 2,048 environments x 128 steps was 2,048 rows dealt to
    256 blocks, each thread adding 128 steps one after another into the block's copy in the
    device's memory, each add waiting for the one before (476 us on the H100). ``(s,
    form)`` where the rows are not such a nest."""
    _, accs, inner = form
    nest = [s]
    while nest[-1].body[0] is not inner:
        nest.append(nest[-1].body[0])
    if not _constant_nest(nest):
        return s, form
    if {x.var for x in nest} & (_refs_of(inner.lo) | _refs_of(inner.hi)):
        return s, form
    point = Ref(f"{s.var}.flat")
    inner = dataclasses.replace(inner, body=_nest_lets(point, nest) + tuple(inner.body))
    total = kir.i64(math.prod(_extent(x) for x in nest))
    flat = dataclasses.replace(s, var=point.name, lo=kir.i64(0), hi=total, body=(inner,))
    return flat, ("array", accs, inner)


def _nest_lets(point: Ref, nest: list) -> tuple:
    """The variables of a nest of loops of constant bounds from ``point``, the number of a
    point of the nest (the innermost fastest), the outermost first."""
    lets: list = []
    rest = point
    for x in reversed(nest[1:]):
        n = kir.i64(_extent(x))
        lets.append(Let(x.var, "i64", kir.add(x.lo, Bin("mod", rest, n, "i64"))))
        rest = Bin("floordiv", rest, n, "i64")
    lets.append(Let(nest[0].var, "i64", kir.add(nest[0].lo, rest)))
    return tuple(reversed(lets))


def _flat_sum(s: For) -> For:
    """Sum ``s`` (into locals) with its perfect nest of loops of constant bounds as one loop
    over the nest's points, the loops' variables from the point's number (the innermost
    fastest; as ``grid_loop`` numbers a nest of parallel loops): the grid then deals points,
    where it dealt the outer loop's iterations, each thread running down the inner loops (a
    gradient norm's sum of a 64 x 64 weight's squares: 64 threads, each a row of 64 in turn,
    each load 256 bytes from its neighbour's; now 4,096 threads, a warp's loads a row's
    neighbours). ``s`` where it has no such nest."""
    from timerlc.codegen.fuse import _Subst

    nest = [s]
    while True:
        inner = nest[-1].body
        if not inner or not all(
            isinstance(x, For)
            and not x.parallel
            and set(x.reduce) <= set(s.reduce)
            and (x.lo, x.hi) == (inner[0].lo, inner[0].hi)
            for x in inner
        ):
            break
        # (loops of one range in a row, each into its own accumulators: a joined sum's
        # rows of two weights, ``_reductions_joined``: one loop, the later ones' variables
        # renamed to the first's)
        first, stmts = inner[0], []
        for x in inner:
            sub = _Subst({x.var: first.var}, {}, 0)
            stmts += [sub.stmt(y) for y in x.body] if x.var != first.var else list(x.body)
        reduce = tuple(dict.fromkeys(r for x in inner for r in x.reduce))
        nest.append(dataclasses.replace(first, body=tuple(stmts), reduce=reduce))
    if not _constant_nest(nest):
        return s
    if not all(isinstance(x, Let) for x in nest[-1].body) or _carried(
        nest[-1].body, dict(s.reduce)
    ):
        return s
    total = math.prod(_extent(x) for x in nest)
    point = Ref(f"{s.var}.flat")
    body = _nest_lets(point, nest) + tuple(nest[-1].body)
    return dataclasses.replace(s, var=point.name, lo=kir.i64(0), hi=kir.i64(total), body=body)


def _wide(s: For) -> bool:
    """Whether row loop ``s`` is at least ``WIDE_ROWS`` rows of an element loop that
    ``_spread`` spreads over the grid, of at least ``WIDE`` elements (a warp's worth).
    Merged with the loops around it (``_row_merged``), each thread would run down a row of
    it, a warp's stores each to 32 rows ``4 * WIDE`` bytes and more apart (PPO at 2048 x
    128: the first layers' tanh over a minibatch, 65,536 rows of 64, each 128 bytes a warp
    stores in 32 pieces of 4); apart, a thread per element, a warp's stores are one row's
    neighbours: a launch more, where the rows are many enough that the stores cost more;
    or where a row has ``LONG_ROW`` points or more, whatever the rows: each thread's run down
    its row is a store and a load a point, one after another (the compiler cannot move a
    load above a store that may write it), a round trip to memory each (PPO's returns'
    bootstrap, 2,048 rows of 129 then 128, merged: f38_8, 74.3 us on the H200)."""
    rows = _extent(s)
    need = WIDE if rows >= WIDE_ROWS else LONG_ROW
    if _terms(s) < rows * need:  # (too few points a row whatever the spread: no need to look)
        return False
    spread = _spread_nest(s)
    if spread is s:
        return False
    return math.prod(_extent(x) for x in _nest(spread)[1:]) >= need


def _row_merged(body) -> tuple[tuple, set]:
    """``body`` with each run of consecutive parallel loops over one constant range (a
    statement's ops over the rows of its value, each into a temporary: PPO's gradient of
    the logits, six loops over 65,536 rows, five launches) as one loop, each thread doing
    every loop's iteration for its row in turn, where of what one loop of the run writes the
    others touch only the element of their own row (``_rows_local``); and the temporaries
    the merged loops write (global: a thread's row of them, not a copy of its own). Loops
    of a run that touch nothing of each other's (``_groups``) stay apart: they are one launch
    anyway (an ``either`` step), each its own nest over the grid (Adam's moments of a 64x64
    weight and a 64 bias merged were 64 threads, each a row of 64 in turn). A wide loop over
    many rows stays apart too (``_wide``)."""
    out: list = []
    shared: set = set()
    run: list = []

    def flush():
        for group in _groups(run):  # (loops that touch nothing of each other's: apart)
            if len(group) == 1:
                out.extend(group)
                continue
            var = group[0].var
            stmts: list = []
            for loop in group:
                sub = _subst({loop.var: var})
                stmts += [sub.stmt(x) for x in loop.body] if loop.var != var else loop.body
            out.append(dataclasses.replace(group[0], body=tuple(stmts)))
            shared.update(_written(group))
        run.clear()

    for s in body:
        if not _row_loop(s) or _wide(s):
            flush()
            out.append(s)
        elif run and (s.lo, s.hi) == (run[0].lo, run[0].hi) and _rows_local(run + [s]):
            run.append(s)
        else:
            flush()
            run.append(s)
    flush()
    return tuple(out), shared


def _fissioned(body, temps: frozenset = frozenset()) -> tuple:
    """``body`` with each parallel loop over a constant range whose iterations cannot be
    spread over the grid (``_spread_nest``: its statements are not one loop over elements)
    as one loop per group of its statements that touch each other's buffers or locals
    (``_groups``), where there are two or more: loops that touch nothing of each other's,
    one launch (an ``either`` step), each spread over the grid. A fused kernel's statements
    over rows of one length (Adam's moments of a 64-bias, a 64x64 weight and a 64x2 weight:
    64 threads, each storing its row of each in turn) get a thread per element. Each group
    is cut into its wide pieces too (``_wide_pieces``), whatever the groups beside it (PPO's
    value head's gradient over h2 stayed in its row's loop, a thread down each row, where
    the log-std's ``exp`` beside it made a second group: f172_64, 100 us on the H200)."""
    out: list = []
    for s in body:
        if isinstance(s, If):
            out.append(
                dataclasses.replace(
                    s, then=_fissioned(s.then, temps), orelse=_fissioned(s.orelse, temps)
                )
            )
            continue
        if _row_loop(s) and len(s.body) > 1 and _spread_nest(s) is s:
            groups = [
                p
                for g in _groups(s.body)
                for p in _wide_pieces(dataclasses.replace(s, body=tuple(g)), temps)
            ]
            if len(groups) > 1:
                out += [dataclasses.replace(s, body=tuple(g)) for g in groups]
                continue
        out.append(s)
    return tuple(out)


def _wide_pieces(s: For, temps: frozenset) -> list[list]:
    """The statements of row loop ``s`` cut before and after each element loop that makes
    it ``_wide`` (over at least ``WIDE_ROWS`` rows, at least ``WIDE`` elements a thread each
    can take), where no local or temporary of one piece is another's (the row's values
    pass through the buffers: ``s``'s iterations are independent, so the pieces may run
    one after another over all the rows); else the statements as one piece. A fused
    kernel's value head gradient over h2 (65,536 rows of 64) after the value loss's
    gradient per row, which it reads (``_row_merged`` keeps the wide piece apart)."""

    def wide(x) -> bool:
        return isinstance(x, For) and _wide(dataclasses.replace(s, body=(x,)))

    if not any(wide(x) for x in s.body):
        return [list(s.body)]
    pieces: list[list] = [[]]
    for x in s.body:
        if pieces[-1] and (wide(x) or wide(pieces[-1][-1])):
            pieces.append([])
        pieces[-1].append(x)
    if len(pieces) < 2:
        return [list(s.body)]
    for j, p in enumerate(pieces):
        mine = set(_lets(p)) | (_written(p) & temps)
        others = [x for q, piece in enumerate(pieces) if q != j for x in piece]
        if mine & (_refs(others) | set(_lets(others)) | _buffers(others)):
            return [list(s.body)]
    return pieces


def _reductions_joined(body, k: kir.Kernel) -> tuple:
    """``body`` with each reduction into locals over a grid's worth of terms (a step of its
    own, ``_Kernel._reduction``) joined by the later ones over the same range that need
    nothing computed between them: one loop, each thread adding its terms to every
    accumulator, one launch (a gradient norm's sums of squares of two 64x64 weights, two
    launches of one block each, one; each sum's terms and their order as before)."""
    out = list(body)
    i = 0
    while i < len(out):
        a = out[i]
        if not _grid_sum(a, k):
            i += 1
            continue
        j = i + 1
        while j < len(out):
            b, init = out[j], out[j - 1]
            between = out[i + 1 : j - 1]
            if (
                _grid_sum(b, k)
                and (b.lo, b.hi) == (a.lo, a.hi)
                and isinstance(init, Let)
                and isinstance(init.value, Const)
                and {init.name} == {acc for acc, _ in b.reduce}
                and j - 1 > i
                and _apart_sums(a, b, between)
            ):
                sub = _subst({b.var: a.var})
                moved = tuple(sub.stmt(x) for x in b.body)
                joined = dataclasses.replace(a, body=a.body + moved, reduce=a.reduce + b.reduce)
                out[i : j + 1] = [init, joined, *between]
                a = joined
                i += 1  # (the init now before it)
                j = i + 1 + len(between)
                continue
            j += 1
        i += 1
    return tuple(out)


def _grid_sum(s, k: kir.Kernel) -> bool:
    """Whether ``s`` is a reduction into locals (not a temporary, no store) over at least
    ``GRID_TERMS`` terms: a step of its own on the grid."""
    if not (isinstance(s, For) and s.reduce and _terms(s) >= GRID_TERMS):
        return False
    named = {t.name for t in k.temps} | {x.name for x in k.slots}
    return (
        not any(acc in named for acc, _ in s.reduce)
        and not any(isinstance(x, (Store, Fail, Gemm, Permute)) for x in kir.walk_tree(s.body))
        and not any(isinstance(e, kir.Fn) for e in _exprs(s.body))
    )


def _merged(st: _Step) -> bool:
    """Whether step ``st`` is a gram's part function of ours that adds its copies itself
    (``products.merged``: the steps after its sums are its last block's, ``own_lines``)."""
    if st.kind != "gemm" or not isinstance(st.form, _Own) or st.form.kind != "part":
        return False
    s = st.body
    return products.merged(s.m, s.n, s.k)


def _chain_rows(st: _Step) -> frozenset | None:
    """The counts of rows step ``st`` may run over as a chain's (``_Kernel._chains``): a
    parallel loop over a constant count from a start the call's values say (under no
    condition, nothing in it that fails, needs the grid or an order), its rows those of
    its first levels of parallel loops (``_row_levels``: each count of points of the
    nest's first 1, 2, ... levels), or loops side by side (``either``) each so; or the
    rows of a product of the device's BLAS at every call that ours make in the rows form
    or as a gram over its rows (each chunk of rows a copy, none empty); else None."""
    if st.guard is not None:
        return None
    if st.kind in ("parallel", "either"):
        counts = None
        for s in st.body if st.kind == "either" else (st.body,):
            got = _loop_counts(s)
            if got is None:
                return None
            counts = got if counts is None else counts & got
        return counts or None
    if st.kind != "blas" or st.body.when is not True or st.after and st.own is None:
        return None
    g = st.form
    what = products.form(g.dtype, g.m, g.n, g.k, g.ta, g.tb)
    if st.own is not None and (st.own.kind != what or st.own.beside is not None):
        return None
    if g.c in (g.a, g.b):
        return None
    if what == "gram" and g.ta and not g.tb and (g.k - 1) // _chunk(g.k) < products.parts(g.k):
        return frozenset({g.k})
    if what != "rows" or CHAIN_ROWS % products.rows_tile(g)[0]:
        return None
    return frozenset({g.m})


def _loop_counts(s) -> frozenset | None:
    """The counts of rows a parallel loop may run over in a chain (``_chain_rows``): the
    points of its nest's first levels (``_nest``), its own over a constant count."""
    if not (isinstance(s, For) and s.parallel and not s.reduce):
        return None
    if any(isinstance(x, (Fail, Gemm, Permute)) for x in kir.walk_tree(s.body)):
        return None
    if any(isinstance(e, kir.Fn) for e in _exprs(s.body)) or _lin(s.lo) is None:
        return None
    count = _extent(s, 0)
    if count <= 0:
        return None
    counts = {count}
    for x in _nest(s)[1:]:
        count *= _extent(x)
        counts.add(count)
    return frozenset(counts)


def _row_levels(s: For, rows: int) -> list | None:
    """The levels of parallel loop ``s``'s nest that make ``rows`` rows (``_loop_counts``):
    ``[(variable, start, count), ...]``, a row the points of the levels after the first
    for a point of the first, in order; None where no first levels make them."""
    levels, count = [], 1
    for x in _nest(s):
        n = _extent(x, 0)
        levels.append((x.var, x.lo, n))
        count *= n
        if count == rows:
            return levels
        if count > rows or n <= 0:
            return None
    return None


def _chain_count(run: list) -> int | None:
    """The rows of a chain of the steps ``run`` (its products'), or None where it has no
    product."""
    for st in run:
        if st.kind == "blas":
            return next(iter(_chain_rows(st)))
    return None


def _is_gram(st: _Step) -> bool:
    """Whether a chain's step (``_chain_rows``') is a gram product."""
    return st.kind == "blas" and st.form.ta


def _chunk(rows: int) -> int:
    """The rows of a chain's copy of its grams (``products.parts`` of them): whole stages of
    ``CHAIN_GRAM_ROWS``, as a gram's part function's chunks."""
    return -(-rows // products.parts(rows) // CHAIN_GRAM_ROWS) * CHAIN_GRAM_ROWS


def _chain_tile(run: list) -> int:
    """The rows a chain's block takes at a time: ``CHAIN_GRAM_ROWS`` where it has a gram (a
    chunk of its copies whole tiles), else ``CHAIN_ROWS``."""
    return CHAIN_GRAM_ROWS if any(_is_gram(st) for st in run) else CHAIN_ROWS


def _chain_top(run) -> list:
    """What a chain's function reads outside its steps (``chain_body``; each step reads its
    own buffers' addresses): its rows products' B (copied once a block), its grams' C
    (their copies added at the end; a gram of one copy has C for it) and the steps after
    their sums (the column sums themselves temporaries, declared for the steps)."""
    out: list = []
    for st in run:
        if st.kind != "blas":
            continue
        g = st.form
        if not _is_gram(st):
            out.append(dataclasses.replace(g, a=g.b, c=g.b))
            continue
        if products.parts(g.k) > 1:  # (else its one copy C itself, the step's own)
            out.append(dataclasses.replace(g, a=g.c, b=g.c))
            if st.own is not None:
                out += [x for t in st.own.tail for x in t.statements()]
    return out


def _chain_tf32(st: _Step) -> bool:
    """Whether a chain's step is a product with TF32 functions (``products.tf32_form``): a
    chain's TF32 function makes it as they do (``chain_body``)."""
    g = st.form
    return st.kind == "blas" and products.tf32_form(g.m, g.n, g.k, g.ta, g.tb)


def _chain_dynamic(run: list, tf32: bool = False) -> tuple[int, int | None, dict]:
    """Where a chain of the steps ``run`` keeps its shared memory (``chain_body``; with
    ``tf32``, its TF32 function): ``(float4s, the sums' groups, {rows product: its copy of
    op(B)})``, the float4s of the launch's dynamic shared memory and each array's first
    float4 in it, the pool first, where they pass what a function may declare
    (``products.SMEM_FLOATS``); else ``(0, sums, {})``, ``sums`` 0 where the chain has
    float32 grams' column sums (their groups' doubles, ``tl_sd``), None where not."""
    mine = {q: tf32 and _chain_tf32(st) for q, st in enumerate(run)}
    sums = any(
        _is_gram(st) and st.own is not None and st.own.acc is not None and not mine[q]
        for q, st in enumerate(run)
    )  # (a TF32 gram's sums: in its copy)
    if _chain_floats(run, tf32) <= products.SMEM_FLOATS:
        return 0, 0 if sums else None, {}
    at = -(-_chain_pool(run, tf32) // 4)
    sd = at if sums else None
    at += products.MAX_THREADS * 8 // 2 if sums else 0
    places = {}
    for q, st in enumerate(run):
        if st.kind == "blas" and not _is_gram(st):
            places[q] = at
            at += -(-products.weights_floats(st.form, mine[q]) // 4)
    return at, sd, places


def _chain_pool(run: list, tf32: bool = False) -> int:
    """The floats of a chain's pool (``chain_body``'s ``tl_sm4``): the largest of its rows
    products' tiles of A and of its grams' stages (``products.rows_tile``,
    ``products.gram_chain_floats``); with ``tf32``, those of the products with TF32
    functions as theirs (``_chain_tf32``)."""
    return max(
        (
            products.rows_tile(st.form, tf32 and _chain_tf32(st))[1]
            if not _is_gram(st)
            else products.gram_chain_floats(st.form, tf32 and _chain_tf32(st))
            for st in run
            if st.kind == "blas"
        ),
        default=0,
    )


def _chain_floats(run: list, tf32: bool = False) -> int:
    """The floats of shared memory a chain of the steps ``run`` takes (``chain_body``): its
    rows products' copies of op(B); the largest of their tiles of A and of its grams'
    stages, one pool (``_chain_pool``); its grams' column sums' groups. With ``tf32``, its
    TF32 function's (op(B)'s rows of those products ``products._stride`` apart)."""
    weights = 0
    for st in run:
        if st.kind == "blas" and not _is_gram(st):
            g = st.form
            weights += products.weights_floats(g, tf32 and _chain_tf32(st))
    grams = [st for st in run if _is_gram(st)]
    sums = any(st.own is not None and st.own.acc is not None for st in grams)
    return _chain_pool(run, tf32) + weights + 2 * products.MAX_THREADS * 8 * sums


def chain_tf32(run: list) -> bool:
    """Whether the chain of the steps ``run`` has a TF32 function too: a product among them
    has TF32 functions (``_chain_tf32``), and its shared memory fits a function."""
    return any(_chain_tf32(st) for st in run) and _chain_floats(run, True) <= CHAIN_SMEM_FLOATS


def _chain_fits(run: list, limit: int) -> bool:
    """Whether the steps ``run`` (``_chain_rows``': a chain's, over one count of rows) fit
    one function: their shared memory (``_chain_floats``) at most ``limit`` floats, each
    rows product's tile a divisor of the chain's (``_chain_tile``)."""
    tile, rows = _chain_tile(run), _chain_count(run)
    if rows is not None:  # (a loop's rows a tile's: its first level's points whole)
        for st in run:
            for s in _chain_loops(st):
                levels = _row_levels(s, rows)
                if levels is None or tile % (rows // levels[0][2]):
                    return False
    return _chain_floats(run) <= limit and all(
        tile % products.rows_tile(st.form)[0] == 0
        for st in run
        if st.kind == "blas" and not _is_gram(st)
    )


def _chain_loops(st: _Step) -> list:
    """A chain's loop step's loops (none for a product)."""
    if st.kind == "either":
        return list(st.body)
    return [st.body] if st.kind == "parallel" else []


def _chain_local(run: list) -> bool:
    """Whether the steps ``run`` (``_chain_rows``'s, over one count of rows) never meet
    across rows (``_rows_local``: a product as the loop nest of its accesses, A's and C's,
    with its epilogue's), and none writes what a product reads as its B."""
    loops, weights, mine = _chain_accesses(run)
    for k, own in mine:
        others = [x for q, st in enumerate(run) if q != k for x in _chain_statements(st)]
        if own & _buffers(others):
            return False
    items = _chain_levels(run, loops)
    return items is not None and not weights & _written(loops) and _levels_local(items)


def _chain_accesses(run: list) -> tuple[list, set, list]:
    """``(loops, weights, grams' own)``: the steps ``run``'s accesses as loops (a product's
    as the loop nest of its A's and C's, ``_product_loop``, with its epilogue; a gram's of
    its A's and B's, ``_gram_loop``), the rows products' B, and per gram ``(its number, its
    C, its sums and what runs after them)``."""
    loops, weights, mine = [], set(), []
    for k, st in enumerate(run):
        if st.kind in ("parallel", "either"):
            loops += _chain_loops(st)
            continue
        g = st.form
        if _is_gram(st):  # (its C, its sums and what runs after them: its own)
            loops.append(_gram_loop(g, f"tl_chain{k}"))
            acc = [st.own.acc] if st.own is not None and st.own.acc is not None else []
            tail = [x for t in st.own.tail for x in t.statements()] if st.own else []
            mine.append((k, {g.c, *acc} | _buffers(tail)))
            continue
        weights.add(g.b)
        loops.append(_product_loop(g, f"tl_chain{k}"))
        if st.own is not None and st.own.epilogue is not None:
            loops.append(st.own.epilogue)
    return loops, weights, mine


def _chain_levels(run: list, loops: list) -> list | None:
    """``[(loop, its row levels)]`` of a chain's ``loops`` over its rows (``_row_levels``),
    or None where one has none."""
    rows = _chain_count(run)
    levels = [_row_levels(s, rows) for s in loops]
    return None if any(x is None for x in levels) else list(zip(loops, levels))


def _chain_remap(run: list, confined: frozenset) -> dict[str, int]:
    """The buffers of ``confined`` (no step of the kernel outside the chain ``run`` touches
    them, nothing outside the kernel does, and each call writes them afresh: the plan's
    ``codegen.generate._confined``) that a chain may keep a tile at a time in its chunk's
    first tile's rows (``chain_body``), by their row stride ``S``: written by its steps,
    accessed in all of them only at ``S * r + f + base`` (``_row_stride``), not a rows
    product's B nor a gram's C, sums or what runs after them. Each tile's values are
    read only by the tile's later steps, so the chunk's tiles may take turns in one
    tile's memory: the chunks' first tiles, a quarter of the rows where a chunk has four,
    stay in the GPU's L2 cache where the whole arrays (PPO's minibatch step: 132 MiB of
    activations and their gradients) went out to its memory."""
    if not confined:
        return {}
    loops, weights, mine = _chain_accesses(run)
    items = _chain_levels(run, loops)
    if items is None:
        return {}
    banned = set(weights).union(*(own for _, own in mine))
    written = _written(loops)
    accesses, varying = _level_accesses(items)
    out = {}
    for name in sorted(confined - banned):
        uses = accesses.get(name)
        if name in written and uses:
            stride = _row_stride(uses, items, varying)
            if stride is not None:
                out[name] = stride
    return out


def _chain_statements(st: _Step) -> list:
    """What a chain's step touches in the chain (a gram's rows and A and B: ``_gram_loop``;
    a rows product's, its epilogue's; a loop step's)."""
    if st.kind in ("parallel", "either"):
        return _chain_loops(st)
    g = st.form
    if _is_gram(st):
        return [_gram_loop(g, "tl_chain")]
    epilogue = [st.own.epilogue] if st.own is not None and st.own.epilogue is not None else []
    return [g, *epilogue]


def _chain_used(st: _Step) -> list:
    """The statements a chain's step stands for in its function (``chain_body``): a gram's
    product, its sums' first values (its column sums' buffer) and the steps after its
    sums; a rows product and its epilogue; a loop step's loops."""
    if st.kind in ("parallel", "either"):
        return _chain_loops(st)
    own = st.own
    if _is_gram(st):
        sums = list(own.sums[:1]) if own is not None else []
        tail = [x for t in own.tail for x in t.statements()] if own is not None else []
        return [st.form, *sums, *tail]
    return [st.form, *([own.epilogue] if own is not None and own.epilogue is not None else [])]


def _packed(loops, form) -> list[int]:
    """Each loop's first thread of an ``either`` step's grid: side by side, but where two
    run under exclusive guards (``form``: each one's literals; only one of them does work at
    a call), which may share threads: each loop at the first place where it meets no loop
    before it that may run with it."""
    at: list[tuple[int, int]] = []
    for k, loop in enumerate(loops):
        n = _grid_extent(loop)
        meets = [at[q] for q in range(k) if not _exclusive(form[q], form[k])]
        for start in sorted({0} | {end for _, end in at}):
            if all(start + n <= lo or start >= hi for lo, hi in meets):
                break
        at.append((start, start + n))
    return [lo for lo, _ in at]


# an ``either`` step of at least this many groups of loops is dispatched by ranges
# (``_Kernel.either_by_ranges``)
DISPATCH_GROUPS = 4


def _ranges_of(loops, offsets) -> list | None:
    """An ``either`` step's loops as groups by their threads' range (``_packed``'s):
    ``[(first, end, [loop indices])]`` in order, where every loop's bounds are constants
    (its points a number known here) and two ranges are the same or apart (loops under
    exclusive guards share one), at least ``DISPATCH_GROUPS`` of them; else None."""
    if not all(isinstance(x.lo, Const) and isinstance(x.hi, Const) for x in loops):
        return None
    by: dict[tuple[int, int], list[int]] = {}
    for k, (loop, at) in enumerate(zip(loops, offsets)):
        by.setdefault((at, at + _grid_extent(loop)), []).append(k)
    ranges = sorted(by)
    if len(ranges) < DISPATCH_GROUPS:
        return None
    if any(b[0] < a[1] for a, b in itertools.pairwise(ranges)):
        return None
    return [(lo, hi, by[(lo, hi)]) for lo, hi in ranges]


def _grid_extent(loop: For) -> int:
    """The threads a parallel loop asks for: one per point of its nest (``_nest``)."""
    return max(1, min(_extent(loop) * math.prod(_extent(x) for x in _nest(loop)[1:]), 1 << 31))


def _terms(loop: For) -> int:
    """The iterations of ``loop``'s nest (a loop whose bounds are not constants: as many as
    a grid would take)."""
    n = _extent(loop, GRID_TERMS)
    inner = [s for s in loop.body if isinstance(s, For)]
    return n * max([1] + [_terms(s) for s in inner])


def _array_blocks(size: int, grouped: bool = True) -> int:
    """The most blocks a reduction into a temporary of ``size`` elements runs on (each
    keeps a partial copy of it: at most ``PART_BYTES`` of them in all): ``ARRAY_PARTS``
    where its last blocks combine the copies in groups (``grouped``), else ``PARTS``."""
    most = ARRAY_PARTS if grouped else PARTS
    return max(1, min(most, PART_BYTES // (8 * max(size, 1))))
