"""Lowering a plan's statement to a kernel (``kir.Kernel``).

A call of a statement computes its points with the loop dims fixed to the call's arguments:
the kernel takes the loop dims as its arguments and loops over the vector dims' box, each
point guarded by the statement's domain (``docs/plan.md``). At a point, every node of the
statement is a *value*: a function from an element's indices to a scalar expression.

- A stored read is a ``Load`` from the source buffer at the linear index its access gives
  (a slice adds a leading axis; the dim of a ring buffer wraps modulo its size).
- Elementwise ops (and ``cast``, ``where``, constants, ``dimval``, ``arange``) are
  *inlined*: computed per element inside the loops of whatever reads them; shape ops
  (``reshape``, ``transpose``, ``expand_dims``, ``squeeze``, ``broadcast_to``) only
  remap the indices.
- Everything else (reductions, ``matmul``) is *materialized*: computed by a loop nest of
  its own into a temporary of the scratch area, read back by ``Load``. So is an inlined node
  that several others read, when recomputing it would cost more than a load, and an
  operand of a matmul that is not a plain load (it is read once per row or column).
  A materialized value that does not depend on the vector dims is computed once per call,
  before the vector loops.

A statement the code generator cannot lower yet raises ``Unsupported`` with the reason;
the runtime runs it with its NumPy kernels instead (``docs/codegen.md``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from timerlc import ops
from timerlc.codegen import kir
from timerlc.codegen.kir import (
    Bin,
    Cast,
    Const,
    Expr,
    For,
    If,
    Let,
    Load,
    Ref,
    Sel,
    Store,
    Un,
)
from timerlc.plan import arena
from timerlc.plan import expr as px
from timerlc.plan.items import BLOCK_LOOP, At, Ix, Plan, Statement

MAX_CONST_ELEMENTS = 4096  # an array constant is written into a temporary element by element
SHORT_LOOP = 4  # a reduction over at most this many elements is written out (short_loops)


class Unsupported(Exception):
    """A statement the code generator does not lower (yet): the runtime interprets it."""


@dataclass
class Val:
    """A node's value at one point: ``at(idx)`` is element ``idx`` (i64 expressions, one
    per axis of ``shape``); ``vdep``: whether it depends on the vector dims; ``cost``: the
    rough number of ops one element costs to recompute."""

    dtype: str
    shape: tuple
    at: Callable[[list], Expr]
    vdep: bool
    cost: int
    # where the value lies in memory, if it is a strided view of a buffer: (buffer, offset,
    # strides), element ``idx`` at ``offset + sum(idx[k] * strides[k])`` (BLAS reads it)
    layout: tuple | None = None
    # whether it reads what the statements of the point compute (a per-point temporary, a
    # local): then it can only be computed inside the vector loops, at its point
    local: bool = False


# RTL's elementwise ops and the kernel IR's scalar ops of the same meaning
_UNARY = {op: op for op in kir.UNARY if op != "not"} | {"logical_not": "not"}
_BINARY = {op: op for op in kir.BINARY if op not in ("and", "or", "rem")} | {
    "logical_and": "and",
    "logical_or": "or",
}
_VIEWS = {"reshape", "transpose", "expand_dims", "squeeze", "broadcast_to"}
_SAME = {"where", "cast", "copy", "stop_grad"}  # elementwise ops besides _UNARY and _BINARY
_REDUCE = {"sum", "mean", "prod", "max", "min", "logsumexp"}
# a reduction's scalar op and its first value (None: the first element)
_COMBINE = {
    "sum": ("add", 0),
    "mean": ("add", 0),
    "prod": ("mul", 1),
    "max": ("maximum", None),
    "min": ("minimum", None),
}


# the ops a kernel computes (the others are interpreted)
SUPPORTED = frozenset(
    set(_UNARY)
    | set(_BINARY)
    | _VIEWS
    | _REDUCE
    | {
        "where",
        "cast",
        "copy",
        "stop_grad",
        "const",
        "dimval",
        "index_value",
        "arange",
        "matmul",
        "argmax",
        "argmin",
        "merge",
        "index",
        "take",
        "take_along",
        "cumsum",
        "discounted_sum",
        "index_add",
        "concat",
        "random_uniform",
        "random_normal",
        "random_uniform_at",
        "random_normal_at",
        "random_gumbel",
        "random_permutation",
        "random_init",
    }
)


# ----------------------------------------------------------------------------- entry point
def lower_statement(plan: Plan, st: Statement, slot_of: dict, blocks: bool = True) -> kir.Kernel:
    """The kernel of one statement; ``slot_of[(sid, out)]``: the table entry of a buffer's
    output. Raises ``Unsupported``.

    A statement whose layers run over many points at once (``_matmul_over_points``: the
    value of every observation of a rollout) is lowered again block by block of its
    outermost vector dim (``_block``): each block's layers run one after another on its
    rows, whose temporaries stay in the cache, instead of each layer over every point
    (for a CPU's caches; not with ``blocks`` false: a GPU runs each layer over every point)."""
    # (a large operand's tiles: each kernel's own scratch on a CPU; one scratch for every
    # call on a GPU, so tiles as large as a call's unblocked scratch there)
    tile = OPERAND_TILE_BYTES if blocks else GPU_SCRATCH
    low = _Lowering(plan, st, slot_of, tile=tile)
    k = low.kernel()
    if low.over_points and blocks:
        block = _block(plan, st)
        if block is not None:
            k = _Lowering(plan, st, slot_of, block, tile).kernel()
    if not blocks:  # (a GPU's temporaries hold every point's values: share their bytes)
        k = _packed_temps(k)
        if low.over_points and low.target is None and k.scratch_bytes > GPU_SCRATCH:
            k = _gpu_blocks(plan, st, slot_of, k) or k
    return k


GPU_SCRATCH = 16 << 20  # the most scratch a cuda kernel over many points takes unblocked


class IntRanges:
    """Bounds of integer values from the ops that make them: a permutation of ``range(n)``
    lies in ``[0, n)``, and an op that only moves elements (an index, a take, a view, a
    copy, a merge of such) within its inputs' bounds; None where unknown (any other op, a
    float, a recurrence through itself)."""

    MOVES = {"index", "take", "take_along", "copy", "stop_grad", "concat", "stack"} | _VIEWS

    def __init__(self, plan: Plan):
        self.nodes = {n.id: n for st in plan.statements for n in st.nodes}
        self.final = {st.id: st.node.id for st in plan.statements}
        self.memo: dict[int, tuple[int, int] | None] = {}

    def of_read(self, r) -> tuple[int, int] | None:
        """The bounds of what the read ``r`` reads (a stored buffer's: its statement's)."""
        nid = self.final.get(r.src) if r.stored else r.src
        return None if nid is None else self.of(nid)

    def of(self, nid: int) -> tuple[int, int] | None:
        if nid in self.memo:
            return self.memo[nid]
        self.memo[nid] = None  # (while it is worked out: a cycle is unknown)
        node = self.nodes.get(nid)
        got = None if node is None else self._of(node)
        self.memo[nid] = got
        return got

    def _of(self, node) -> tuple[int, int] | None:
        if node.types[0].dtype not in ("i32", "i64"):
            return None
        if node.op == "random_permutation":
            return (0, int(node.attr_dict()["n"]) - 1)
        if node.op not in self.MOVES and node.op != "merge":
            return None
        ins = node.inputs[:1] if node.op in ("index", "take", "take_along") else node.inputs
        bounds = [self.of_read(r) for r in ins]
        if not bounds or any(b is None for b in bounds):
            return None
        return (min(b[0] for b in bounds), max(b[1] for b in bounds))


_RANGES: list = []  # (plan, its IntRanges): the last few plans lowered


def int_ranges(plan: Plan) -> IntRanges:
    for p, r in _RANGES:
        if p is plan:
            return r
    r = IntRanges(plan)
    _RANGES[:] = [(plan, r)] + _RANGES[:3]
    return r


def _gpu_blocks(plan: Plan, st: Statement, slot_of: dict, k: kir.Kernel):
    """For the cuda target: ``st``'s layers over points whose temporaries (``k``'s, every
    point's rows) would take more than ``GPU_SCRATCH``, as a kernel whose call runs block
    after block of the points (``kir.Kernel.repeat``: its launches once per block, the
    block's number its last param), each block's temporaries at most about that; None
    where no block of its outermost vector dim is smaller than the whole."""
    block = _block(plan, st, k.scratch_bytes)
    if block is None:
        return None
    blocked = _Lowering(plan, st, slot_of, block, GPU_SCRATCH).kernel()
    (loop,) = blocked.body  # (For over BLOCK_VAR, 0 ..< the blocks: the calls' repeats)
    repeated = dataclasses.replace(
        blocked, params=blocked.params + (BLOCK_VAR,), body=loop.body, repeat=int(loop.hi.value)
    )
    return _packed_temps(repeated)


def _packed_temps(k: kir.Kernel) -> kir.Kernel:
    """``k`` with its temporaries packed: two whose uses do not overlap (the top-level
    statements from the first that names one to the last) share bytes. Each is placed, the
    largest first, at the lowest 8-byte-aligned offset where it meets no temporary placed
    that is in use at the same time (``plan.arena.first_fit``, as the arena's buffers)."""
    names = {t.name for t in k.temps}
    uses: dict[str, list[int]] = {}
    for j, top in enumerate(k.body):
        named: set[str] = set()
        for s in kir.walk_tree([top]):
            read, written = kir.own_buffers(s)
            named.update(read + written)
            for e in kir.own_exprs(s):
                named.update(x.buf for x in kir.subexprs(e) if isinstance(x, Load))
        for n in named & names:
            uses.setdefault(n, [j, j])[1] = j
    order = sorted(k.temps, key=lambda t: (-t.size * kir.SIZES[t.dtype], t.name))
    regions = []
    for t in order:
        first, last = uses.get(t.name, (-1, -1))
        regions.append((t.size * kir.SIZES[t.dtype], first, last + 1))
    offsets = {t.name: at for t, at in zip(order, arena.first_fit(regions, 8))}
    temps = tuple(dataclasses.replace(t, offset=offsets[t.name]) for t in k.temps)
    return dataclasses.replace(k, temps=temps)


BLOCK_VAR = BLOCK_LOOP  # the loop over the blocks (no dim is named so)
BLOCK_ROWS = 1024  # the points of a block of a statement's layers over points (at most)


def _block(plan: Plan, st: Statement, scratch: int | None = None) -> tuple[str, int] | None:
    """``(dim, size)``: the blocks of a statement over many points, along its outermost
    vector dim of more than one point, ``size`` of its values a block (a divisor of its
    extent, each block at most ``BLOCK_ROWS`` points where it can be; None for a statement
    of at most ``2 * BLOCK_ROWS`` points). Given the ``scratch`` bytes of its kernel over
    every point (the cuda target's), a block's share of them at most ``GPU_SCRATCH``
    instead; None where no block is smaller than the whole."""
    box = plan.buffer(st.id).box
    vdims = [(d, box[k]) for k, d in enumerate(st.dims) if d in st.vector and box[k] > 1]
    points = math.prod(n for _, n in vdims)
    if not vdims or (scratch is None and points <= 2 * BLOCK_ROWS):
        return None
    rows = BLOCK_ROWS if scratch is None else max(1, GPU_SCRATCH * points // scratch)
    d0, e0 = vdims[0]
    inner = points // e0
    size = largest_divisor(e0, rows // inner)
    return None if size == e0 else (d0, size)


def largest_divisor(n: int, cap: int) -> int:
    """The largest divisor of ``n`` (> 0) that is at most ``cap``, else 1: the divisors in
    pairs up to the square root of ``n`` (an extent up to 2^31: 46,341 steps at most, where
    counting up to ``n`` took minutes)."""
    best = 1
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            best = max([best] + [k for k in (d, n // d) if k <= cap])
    return best


class _Lowering:
    def __init__(self, plan: Plan, st: Statement, slot_of: dict, block=None, tile=None):
        self.plan, self.st, self.slot_of = plan, st, slot_of
        # the most bytes of a tile of a large operand of a product (``_tiled_gemm``)
        self.tile = OPERAND_TILE_BYTES if tile is None else tile
        # the block of the vector loops (``_block``: dim, size), where the statement runs
        # block by block; ``lo``: the first value of the dim in the block
        self.block = block
        self.lo: Expr = (
            Bin("mul", Ref(BLOCK_VAR), kir.i64(block[1]), "i64") if block else kir.i64(0)
        )
        self.over_points = False  # whether a matmul ran over the points at once
        self.vector = set(st.vector)
        self.slots: dict[tuple, kir.Slot] = {}
        self.temps: list[kir.Temp] = []
        self.scratch = 0
        self.names = 0
        self.pre: list = []  # once per call, before the vector loops
        self.point: list = []  # per point, before the stores
        self.nodes = {n.id: n for n in st.nodes}
        self.uses: dict[int, int] = {}
        for n in st.nodes:
            for r in n.inputs:
                if not r.stored:
                    self.uses[r.src] = self.uses.get(r.src, 0) + 1
        self.vals: dict[int, Val] = {}
        self.target: str | None = None  # a temporary the values go to before the buffer
        self.branch = False  # lowering an input of a merge (see _merge)
        self.batchable = False  # see kernel()
        # whether pre holds work that only the points of the statement's domain may do (a
        # product over the points, a uniform branch's values): guarded by the domain
        self.pre_guarded = False
        self.known = None  # the range of a gather's indices, where known (int_ranges)
        self.dest = None  # where the statement's matmul may write, straight into its buffer
        self.dest_node = None  # the node whose product that is (the statement's own, or a
        # merge's input: ``_merge``)
        self.wrote_dest = False  # whether it did (else its value is stored as any other)

    # ------------------------------------------------------------------ naming and memory
    def fresh(self, stem: str) -> str:
        self.names += 1
        return f"{stem}{self.names}"

    def slot(self, sid: int, out: int, write: bool = False) -> str:
        sid = self.plan.storage_of(sid)  # (a buffer in another's memory: that one's slot)
        key = (sid, out)
        s = self.slots.get(key)
        if s is None or (write and not s.write):
            dtype = self.plan.buffer(sid).outputs[out].dtype
            name = s.name if s is not None else f"b{sid}_{out}"
            s = kir.Slot(
                name, dtype, self.slot_of[key], sid, out, write or (s is not None and s.write)
            )
            self.slots[key] = s
        return s.name

    def temp(self, dtype: str, size: int) -> str:
        name = self.fresh("t")
        align = 8
        self.scratch = (self.scratch + align - 1) // align * align
        self.temps.append(kir.Temp(name, dtype, self.scratch, size))
        self.scratch += size * kir.SIZES[dtype]
        return name

    # ------------------------------------------------------------------ the kernel
    def kernel(self) -> kir.Kernel:
        st = self.st
        if ops.is_env(st.node.op):
            return self._env_kernel()
        if len(st.node.types) != 1:
            raise Unsupported("a statement of several outputs")
        buf = self.plan.buffer(st.id)
        if buf.donor is not None:
            # the buffer takes its donor's memory, which the statement may still read: the
            # values go to a temporary first, and into the buffer once all are computed
            size = math.prod(buf.extents(0)) * math.prod(buf.outputs[0].shape)
            self.target = self.temp(buf.outputs[0].dtype, size)
        for n in st.nodes:
            if n.op not in SUPPORTED:
                raise Unsupported(f"op {n.op}")
        # values may be computed at every point of the vector dims' box at once (before the
        # vector loops) where every point of the box is one of the statement's, or none of
        # them: a domain that names no vector dim holds at all points of a call or at none
        # (RNN REINFORCE's step back through time, t >= 1), that work then under it
        inside = self._inside_box(st.domain)
        self.batchable = bool(st.vector) and (inside is True or not self.names_vector(inside))
        own = st.node
        if own.op == "matmul" and self._direct():
            # the product goes straight into the buffer where it can (no temporary, no copy)
            self.dest = (
                self.slot(st.id, 0, write=True),
                self.point_index(st.id, [Ref(d) for d in st.dims]),
            )
            self.dest_node = own.id
            v = self.value(own.id)
            body = [] if self.wrote_dest else self._store(v)
        elif own.op == "merge":
            body = self._merge(own)
        else:
            self._in_place(own)
            v = self.value(own.id)
            body = self._store(v)
        point = tuple(self.point) + tuple(body)
        if point:  # (else all is computed before the vector loops)
            domain = self.index(self._inside_box(st.domain))
            if not (isinstance(domain, Const) and domain.value is True):
                point = (If(domain, point),)
            for d in reversed(st.dims):
                if d in self.vector:
                    lo, hi = self.vector_range(d)
                    point = (For(d, lo, hi, point, True),)
        pre = tuple(self.pre)
        if pre and inside is not True and (self.over_points or self.pre_guarded):
            pre = (If(self.index(inside), pre),)
        point = pre + point
        if self.block is not None:
            d0, per = self.block
            blocks = self.plan.buffer(st.id).box[st.dims.index(d0)] // per
            point = (For(BLOCK_VAR, kir.i64(0), kir.i64(blocks), point),)
        if self.target is not None:
            own = self.slot(st.id, 0, write=True)
            dt = buf.outputs[0].dtype
            copy = self.loops(
                (size,), lambda idx: [Store(own, idx[0], Load(self.target, idx[0], dt))]
            )
            if len(copy) == 1 and isinstance(copy[0], For):  # each element its own
                copy = [dataclasses.replace(copy[0], parallel=True)]
            point += tuple(copy)
        return kir.Kernel(
            f"s{st.id}",
            st.id,
            tuple(st.loops),
            tuple(sorted(self.slots.values(), key=lambda s: s.index)),
            tuple(self.temps),
            point,
            self._shared(),
        )

    def dim_ranges(self) -> dict:
        """The least and greatest values of the vector dims whose loops run over constant
        ranges (``vector_range``): an index by such a dim needs no check where its range
        lies inside the array (``_holds``)."""
        out = {}
        for d in self.vector:
            lo, hi = self.vector_range(d)
            if isinstance(lo, Const) and isinstance(hi, Const) and int(hi.value) > int(lo.value):
                out[d] = (int(lo.value), int(hi.value) - 1)
        return out

    def vector_range(self, d: str) -> tuple[Expr, Expr]:
        """The values of vector dim ``d`` a call computes (a block's, see ``_block``)."""
        if self.block is not None and d == self.block[0]:
            return self.lo, kir.add(self.lo, kir.i64(self.block[1]))
        return kir.i64(0), kir.i64(self.plan.buffer(self.st.id).box[self.st.dims.index(d)])

    def _shared(self) -> tuple:
        """The kernel's slots of its own buffer and of the buffer whose memory it takes
        (``kir.Kernel.shared``), where it takes one."""
        buf = self.plan.buffer(self.st.id)
        if buf.donor is None:
            return ()
        donor = self.plan.buffer(buf.donor)
        names = {(self.st.id, k) for k in range(len(buf.outputs))}
        names |= {(buf.donor, k) for k in range(len(donor.outputs))}
        return tuple(sorted(s.name for key, s in self.slots.items() if key in names))

    def _env_kernel(self) -> kir.Kernel:
        """An environment call of a built-in: its generated form (``codegen.envs``) over the
        instances, its state in the arrays the runtime keeps for it."""
        from timerlc.codegen import envs

        st, node = self.st, self.st.node
        name = node.attr_dict()["env"]
        env = next(e for e in self.plan.envs if e.name == name)
        form = envs.form_of(env, self.plan.seed)
        if form is None:
            raise Unsupported(f"environment {name} ({env.spec}) is a plugin: it runs in Python")
        if st.vector:
            raise Unsupported("an environment call with vector dims")
        action = None
        if node.op == "env_step":
            act = self.read(node.inputs[0])
            if act.vdep:
                raise Unsupported("an action that depends on vector dims")

            def action(k, j, act=act):
                return act.at([k] if len(act.shape) == 1 else [k, kir.i64(j)])

        def out(k: int) -> tuple[str, Expr]:
            point = self.point_index(st.id, [Ref(d) for d in st.dims], k)
            return self.slot(st.id, k, write=True), point

        state = {}
        for a in envs.state_arrays(self.plan):
            if a.env == name:
                state[a.name] = a.slot
                self.slots[("state", a.slot)] = kir.Slot(
                    a.slot, a.dtype, a.index, -1, -1, True, f"{name}.{a.name}"
                )
        io = envs.IO(form.n, action, out(0), None, None, state)
        if node.op == "env_step":
            io.reward, io.done = out(1), out(2)
            body = form.step(io)
        else:
            body = form.reset(io)
        if self.point:
            raise Unsupported("an action computed at the point")
        return kir.Kernel(
            f"s{st.id}",
            st.id,
            tuple(st.loops),
            tuple(sorted(self.slots.values(), key=lambda s: s.index)),
            tuple(self.temps),
            tuple(self.pre) + tuple(body),
            self._shared(),
        )

    def _direct(self) -> bool:
        """Whether a matmul statement may compute into its buffer: at every call and every
        point of its vector dims (no condition), and no read of its own buffer (a ring
        buffer's slot may be the one it writes) nor a donor's memory. With vector dims, it
        does where the product is computed for all points at once and the points' results
        lie one after another in the buffer (``_matmul_over_points``)."""
        st = self.st
        return (
            (not st.vector or self.batchable)
            and self.target is None
            and not self._reads_own()
            and self._inside_box(st.domain) is True
        )

    def _in_place(self, top) -> None:
        """Where the statement's value, node ``top``, is elementwise ops of a product
        (``_epilogue_product``) and the product may go straight into the buffer
        (``_direct``): it goes there, and the ops after it (a layer's bias and tanh) work
        there in place, each element reading only its own."""
        if top.op == "matmul" or not self._direct():
            return
        product = self._epilogue_product(top)
        if product is not None:
            self.dest = (
                self.slot(self.st.id, 0, write=True),
                self.point_index(self.st.id, [Ref(d) for d in self.st.dims]),
            )
            self.dest_node = product

    def _epilogue_product(self, top) -> int | None:
        """The product (a matmul node) that node ``top`` is elementwise ops of, where it may
        compute into the statement's buffer with those ops then applied in place:
        ``tanh(h @ w + b)``. Every node from ``top`` down to the product has the output's
        shape and is read once, by the next (so element ``idx`` of the value reads element
        ``idx`` of the product and nothing else does), and the product has the output's
        dtype. None where there is none."""
        out = self.plan.buffer(self.st.id).outputs[0]
        shape = tuple(out.shape)
        if not shape:
            return None

        def find(node):
            if tuple(node.types[0].shape) != shape:
                return None
            if node.op == "matmul":
                return node.id if node.types[0].dtype == out.dtype else None
            if node.op not in _UNARY and node.op not in _BINARY and node.op not in _SAME:
                return None
            for r in node.inputs:
                if not r.stored and self.uses.get(r.src) == 1:
                    got = find(self.nodes[r.src])
                    if got is not None:
                        return got
            return None

        return find(top)

    def _reads_own(self) -> bool:
        """Whether the statement reads its own buffer (at other points: a window's slot may
        be the one it writes)."""
        st = self.st
        return any(r.stored and r.src == st.id for n in st.nodes for r in n.inputs)

    def _direct_input(self, r) -> bool:
        """Whether the merge input ``r`` is a product of the statement's own (a node read
        nowhere else) that may compute into the statement's buffer where the input applies
        (``_direct``'s conditions, but the domain's: the product runs inside its branch; and
        no vector dims): a weight's gradient ``where(j < J, x^T @ dy, 0)`` was a product
        into a temporary, then a copy."""
        st = self.st
        if r.stored or self.uses.get(r.src) != 1 or st.vector or self.target is not None:
            return False
        node = next((n for n in st.nodes if n.id == r.src), None)
        if node is None or node.op != "matmul":
            return False
        out = self.plan.buffer(st.id).outputs[0]
        if node.types[0].dtype != out.dtype or tuple(node.types[0].shape) != tuple(out.shape):
            return False
        return not self._reads_own()

    def _store(self, v: Val) -> list:
        """The statement's value at the point, into its buffer (or the temporary that
        stands for it, see ``kernel``)."""
        name = self.target or self.slot(self.st.id, 0, write=True)
        base = self.point_index(self.st.id, [Ref(d) for d in self.st.dims])
        shape = self.plan.buffer(self.st.id).outputs[0].shape
        out = self.loops(
            shape, lambda idx: [Store(name, kir.add(base, kir.linear(idx, shape)), v.at(idx))]
        )
        if len(out) == 1 and isinstance(out[0], For):
            # each element its own: the value's reads are of other buffers, or of this one
            # at other points (a window keeps them in other slots), or of the donor's memory
            # (then the stores go to a temporary)
            out = [dataclasses.replace(out[0], parallel=True)]
        return out

    def _merge(self, node) -> list:
        """First match wins: the first input whose condition holds at the point. All that
        an input's value needs is computed inside its branch (not once per call, before the
        vector loops): where another input applies, its reads and index checks may be out
        of range (``x[i-1]`` at ``i = 0``). A merge of one input that always applies (a
        tensor of one equation) is that input: what its value needs that does not depend on
        the vector dims (``max(x[0:K])`` in ``y[k] = x[k] - max(x[0:K])``) is computed once
        per call, not at every point. So is it for an input that takes every point of a call
        or none (``_uniform_branch``: its condition, and those of the inputs before it, name
        no vector dim) and has a product: once per call under the condition that it
        applies, so that its product runs over the points at once (RNN REINFORCE's step
        back through time, ``dh[t] = dz[t+1] @ Wh^T`` where ``t < T``)."""
        if len(node.inputs) == 1 and (node.inputs[0].cond is None or node.inputs[0].cond is True):
            if not node.inputs[0].stored:
                self._in_place(self.nodes[node.inputs[0].src])
            return self._store(self.read(node.inputs[0]))
        out: tuple = ()
        for k in reversed(range(len(node.inputs))):
            r = node.inputs[k]
            there = self._in_place_input(r)
            if there is not None and there == r.cond:
                there = True  # (in place wherever the input applies)
            if there is True:
                # (its values are where this merge's are: nothing to copy)
                if r.cond is None or not out:
                    out = ()
                else:
                    out = (If(Un("not", self.index(r.cond), "bool"), tuple(out)),)
                continue
            saved = self.point, self.vals
            guard = self._uniform_branch(node, k) if there is None else None
            self.point, self.vals, self.branch = [], {}, guard is None
            batchable, self.batchable = self.batchable, self.batchable and guard is not None
            outer, self.pre = self.pre, ([] if guard is not None else self.pre)
            if self._direct_input(r):  # (a weight's gradient where it is computed)
                self.dest = (
                    self.slot(self.st.id, 0, write=True),
                    self.point_index(self.st.id, [Ref(d) for d in self.st.dims]),
                )
                self.dest_node, self.wrote_dest = r.src, False
            v = self.read(r)
            stored = [] if self.wrote_dest else self._store(v)
            self.dest, self.dest_node, self.wrote_dest = None, None, False
            branch = tuple(self.point) + tuple(stored)
            if there is not None:  # (in place at that point only: copied elsewhere)
                branch = (If(Un("not", self.index(there), "bool"), branch),)
            (self.point, self.vals), self.branch = saved, False
            self.batchable = batchable
            if guard is not None and self.pre:
                if isinstance(guard, Const):  # (the first input: it applies wherever any does)
                    outer.extend(self.pre)
                else:
                    outer.append(If(guard, tuple(self.pre)))
                self.pre_guarded = True
            self.pre = outer
            if r.cond is None:
                out = branch
            else:
                out = (If(self.index(r.cond), branch, out),)
        return list(out)

    def _uniform_branch(self, node, k: int) -> Expr | None:
        """Where input ``k`` of merge ``node`` applies at every point of a call or at none
        and has a product, the condition (in the kernel's form) that it applies: its own and
        no earlier input's (first match wins); else None. Only where the statement's values
        may be computed over the points at once (``batchable``)."""
        if not self.batchable:
            return None
        conds = [r.cond for r in node.inputs[: k + 1]]
        if any(c is None or c is True for c in conds[:-1]):
            return None  # (an earlier input always applies: this one never does)
        if any(self.names_vector(c) for c in conds if c is not None and c is not True):
            return None
        if not self._has_product(node.inputs[k]):
            return None
        guard: Expr | None = None
        for c in conds[:-1]:
            guard = kir.conj(guard, Un("not", self.index(c), "bool"))
        own = conds[-1]
        if own is not None and own is not True:
            guard = kir.conj(guard, self.index(own))
        return guard if guard is not None else Const("bool", True)

    def _has_product(self, r) -> bool:
        """Whether the value read ``r`` reaches is computed with a ``matmul`` of the
        statement's own nodes."""
        seen, todo = set(), [r]
        while todo:
            x = todo.pop()
            if x.stored or x.src in seen or x.src not in self.nodes:
                continue
            seen.add(x.src)
            n = self.nodes[x.src]
            if n.op == "matmul":
                return True
            todo.extend(n.inputs)
        return False

    def _in_place_input(self, r):
        """Where input ``r`` of the merge being lowered reads a buffer that lives in the
        merge's memory (``Buffer.home``) at the point the merge's own is stored at, so that
        there is nothing to copy (``plan.memory._homes``): True at every point (an update
        written in place of the value it updates: ``U[d - 1]`` at ``d``), a condition in
        the plan's form (an initial value of no dims where the merge's first point ``c``
        is: ``d == c``), or None."""
        if not r.stored:
            return None
        src = self.plan.buffer(r.src)
        if src.home is None or src.home.buffer != self.st.id or len(self.st.dims) != 1:
            return None
        (d,) = self.st.dims
        if any(not isinstance(a, At) for a in r.access):
            return None
        (at,) = src.home.at
        at = px.substitute(at, {x: a.index for x, a in zip(src.dims, r.access)})
        if px.difference(at, d) == 0:
            return True
        return ("eq", d, at) if not px.names(at) else None

    def _inside_box(self, e):
        """The domain without the conjuncts every point of the box meets (``d >= 0``,
        ``d < extent``: the vector loops run over the box, and the runtime checks that a
        call's loop values lie in it)."""
        box = dict(zip(self.st.dims, self.plan.buffer(self.st.id).box))
        parts = list(e[1:]) if isinstance(e, tuple) and e[0] == "and" else [e]

        def trivial(c) -> bool:
            if not (isinstance(c, tuple) and len(c) == 3):
                return False
            op, a, b = c
            if op == "ge" and a in box and b == 0 or op == "le" and a == 0 and b in box:
                return True
            if op == "lt" and a in box and isinstance(b, int) and not isinstance(b, bool):
                return b >= box[a]
            if op == "le" and a in box and isinstance(b, int) and not isinstance(b, bool):
                return b >= box[a] - 1
            return False

        kept = [c for c in parts if not trivial(c)]
        if not kept:
            return True
        return kept[0] if len(kept) == 1 else ("and", *kept)

    # ------------------------------------------------------------------ loops
    def loops(self, shape: tuple, body: Callable[[list], list], parallel: bool = False) -> list:
        """``body(idx)`` inside a loop nest over ``shape`` (no loop for an axis of 1);
        ``parallel``: the outer loop's iterations are independent (``For.parallel``: each
        writes its own elements, its locals assigned before they are read)."""
        idx = []
        vars_ = []
        for n in shape:
            if n == 1:
                idx.append(kir.i64(0))
            else:
                v = self.fresh("e")
                vars_.append((v, n))
                idx.append(Ref(v))
        if any(n == 0 for n in shape):
            return []
        stmts = list(body(idx))
        for v, n in reversed(vars_):
            stmts = [For(v, kir.i64(0), kir.i64(n), tuple(stmts))]
        if parallel and len(stmts) == 1 and isinstance(stmts[0], For):
            stmts = [dataclasses.replace(stmts[0], parallel=True)]
        return stmts

    def short_loops(self, shape: tuple, body: Callable[[list], list]) -> list:
        """``loops``, but a nest of at most ``SHORT_LOOP`` iterations is written out, its
        indices constants: a reduction over two actions inside a loop over rows is then
        straight code, and LLVM vectorizes the loop over the rows."""
        n = math.prod(shape)
        if n == 0 or n > SHORT_LOOP:
            return self.loops(shape, body)
        out: list = []
        for flat in range(n):
            idx, rest = [], flat
            for ext in reversed(shape):
                idx.append(kir.i64(rest % ext))
                rest //= ext
            out += body(list(reversed(idx)))
        return out

    def emit(self, stmts: list, vdep: bool):
        """Statements that compute a value: at each point if it depends on the vector dims
        (or belongs to a merge's branch), else once per call before the vector loops."""
        (self.point if vdep or self.branch else self.pre).extend(stmts)

    def materialize(self, v: Val) -> Val:
        """``v`` computed into a temporary (a local for a scalar)."""
        if not v.shape:
            name = self.fresh("x")
            self.emit([Let(name, v.dtype, v.at([]))], v.vdep)
            return Val(
                v.dtype, (), lambda idx, n=name, d=v.dtype: Ref(n, d), v.vdep, 0, None, True
            )
        size = math.prod(v.shape)
        name = self.temp(v.dtype, size)
        shape = v.shape
        self.emit(
            self.loops(shape, lambda idx: [Store(name, kir.linear(idx, shape), v.at(idx))], True),
            v.vdep,
        )
        return self.temp_val(name, v.dtype, shape, v.vdep)

    def temp_val(self, name: str, dtype: str, shape: tuple, vdep: bool) -> Val:
        """A temporary's value; one that depends on the vector dims was computed at the
        point (``emit``), so it is local."""
        layout = (name, kir.i64(0), _contiguous(shape))
        return Val(
            dtype,
            shape,
            lambda idx: Load(name, kir.linear(idx, shape), dtype),
            vdep,
            0,
            layout,
            vdep or self.branch,
        )

    # ------------------------------------------------------------------ index expressions
    def index(self, e) -> Expr:
        """A plan expression (``plan.expr``) over the statement's dims."""
        return plan_expr(e)

    def names_vector(self, e) -> bool:
        return bool(px.names(e) & self.vector)

    def point_index(self, sid: int, index: list, out: int = 0) -> Expr:
        """The linear index of the point ``index`` (one i64 expression per dim of ``sid``'s
        buffer) times its outputs' element count, the dim of a ring buffer wrapped."""
        buf = self.plan.buffer(sid)
        extents = buf.extents(out)
        wraps = buf.wraps(out)
        pos: Expr = kir.i64(0)
        stride = math.prod(buf.outputs[out].shape)
        for k in reversed(range(len(extents))):
            e = index[k]
            if wraps.get(k, 1) != 1:
                e = Bin("mod", e, kir.i64(wraps[k]), "i64")
            elif k in wraps:
                e = kir.i64(0)
            pos = kir.add(pos, kir.mul(e, stride))
            stride *= extents[k]
        return pos

    # ------------------------------------------------------------------ values
    def read(self, r) -> Val:
        if not r.stored:
            return self.value(r.src)
        c = self._stored_const(r)
        if c is not None:
            return c
        buf = self.plan.buffer(r.src)
        o = buf.outputs[r.out]
        name = self.slot(r.src, r.out)
        fixed: list = []
        lengths: list[int] = []
        vdep = False
        for a in r.access:
            if isinstance(a, At):
                fixed.append(("at", self.index(a.index)))
                vdep = vdep or self.names_vector(a.index)
            else:
                n = px.difference(a.hi, a.lo)
                if n is None:
                    raise Unsupported("a slice whose length depends on the point")
                fixed.append(("slice", self.index(a.lo)))
                lengths.append(max(n, 0))
                vdep = vdep or self.names_vector(a.lo)
        shape = tuple(lengths) + tuple(o.shape)
        nsl = len(lengths)
        spatial = tuple(o.shape)
        sid = r.src

        def at(idx, fixed=fixed):
            index, j = [], 0
            for kind, e in fixed:
                if kind == "at":
                    index.append(e)
                else:
                    index.append(kir.add(e, idx[j]))
                    j += 1
            # the output number selects the array; every output shares the point layout
            base = self.point_index(sid, index, r.out)
            return Load(name, kir.add(base, kir.linear(idx[nsl:], spatial)), o.dtype)

        layout = None
        wraps = buf.wraps(r.out)
        sliced = [k for k, a in enumerate(r.access) if not isinstance(a, At)]
        if all(wraps.get(k, 1) == 1 for k in sliced):
            offset = self.point_index(sid, [e for _, e in fixed], r.out)
            dstride = _contiguous(tuple(buf.extents(r.out)) + spatial)
            strides = tuple(dstride[k] for k in sliced) + _contiguous(spatial)
            layout = (name, offset, strides)
        return Val(o.dtype, shape, at, vdep, 0, layout)

    def _stored_const(self, r) -> Val | None:
        """A read of a constant that the schedule stored (a statement of one ``const`` of
        one value, over no dims: it is read by statements of other loops): the constant
        itself, folded into the code, not loaded from its buffer."""
        src = self.plan.statement(r.src)
        if src.dims or r.access or len(src.nodes) != 1 or src.node.op != "const":
            return None
        attrs = src.node.attr_dict()
        if isinstance(attrs["value"], tuple):
            return None
        t = src.node.types[r.out]
        return self._const(attrs, t.dtype, tuple(t.shape))

    def value(self, nid: int) -> Val:
        v = self.vals.get(nid)
        if v is None:
            v = self._value(self.nodes[nid])
            if self.uses.get(nid, 0) >= 2 and v.cost >= 3:
                v = self.materialize(v)
            self.vals[nid] = v
        return v

    def _value(self, node) -> Val:
        op = node.op
        attrs = node.attr_dict()
        dtype = node.types[0].dtype
        shape = tuple(node.types[0].shape)
        if op in _DYNAMIC and node.inputs and _dynamic_slice(node.inputs[0]):
            return self._dynamic_reduce(node, op, attrs, dtype, shape)
        ins = [self.read(r) for r in node.inputs] if op != "merge" else []
        # (the gather indices' values, where their ops bound them: check_indices)
        gathers = op in ("index", "index_add", "take", "take_along") and len(node.inputs) > 1
        self.known = int_ranges(self.plan).of_read(node.inputs[1]) if gathers else None
        v = self._op(node, op, attrs, dtype, shape, ins)
        if any(x.local for x in ins):  # an op over a local value is local
            v.local = True
        return v

    def _op(self, node, op: str, attrs: dict, dtype: str, shape: tuple, ins: list) -> Val:
        if op in _UNARY:
            (x,) = ins
            k = _UNARY[op]
            return Val(dtype, shape, lambda idx: Un(k, x.at(idx), dtype), x.vdep, x.cost + 1)
        if op in _BINARY:
            a, b = ins
            k = _BINARY[op]
            folded = _fold_binary(k, a, b, dtype, shape)
            if folded is not None:
                return folded
            return Val(
                dtype,
                shape,
                lambda idx: Bin(k, _bcast(a, idx, shape), _bcast(b, idx, shape), dtype),
                a.vdep or b.vdep,
                a.cost + b.cost + 1,
            )
        if op == "where":
            c, a, b = ins
            return Val(
                dtype,
                shape,
                lambda idx: Sel(
                    _bcast(c, idx, shape), _bcast(a, idx, shape), _bcast(b, idx, shape), dtype
                ),
                c.vdep or a.vdep or b.vdep,
                c.cost + a.cost + b.cost + 1,
            )
        if op == "cast":
            (x,) = ins
            return Val(dtype, shape, lambda idx: Cast(x.at(idx), dtype), x.vdep, x.cost + 1)
        if op in ("copy", "stop_grad"):
            return ins[0]  # the same value (and layout)
        if op == "const":
            return self._const(attrs, dtype, shape)
        if op == "dimval":
            d = attrs["dim"]
            return Val("i32", (), lambda idx: Cast(Ref(d), "i32"), d in self.vector, 1)
        if op == "index_value":
            e = attrs["expr"]
            e = e.expr if isinstance(e, Ix) else e
            ix = self.index(e)
            return Val("i32", (), lambda idx: Cast(ix, "i32"), self.names_vector(e), 1)
        if op == "arange":
            start, step = attrs["start"], attrs["step"]
            return Val(
                dtype,
                shape,
                lambda idx: Cast(kir.add(kir.i64(start), kir.mul(idx[0], step)), dtype),
                False,
                1,
            )
        if op in _VIEWS:
            return self._view(op, attrs, ins[0], shape)
        if op in _REDUCE:
            return self._reduce(op, attrs, ins[0], dtype, shape)
        if op in ("argmax", "argmin"):
            return self._argreduce(op, attrs, ins[0], shape)
        if op == "matmul":
            dest = self.dest if node.id == self.dest_node else None
            return self._matmul(ins[0], ins[1], dtype, shape, dest)
        if op == "index":
            return self._index(attrs["items"], ins, shape)
        if op == "index_add":
            return self._index_add(attrs["items"], ins, shape)
        if op == "take":
            return self._take(attrs.get("axis"), ins[0], ins[1], shape)
        if op == "take_along":
            return self._take_along(attrs["axis"], ins[0], ins[1], shape)
        if op == "concat":
            return self._concat(attrs["axis"], ins, dtype, shape)
        if op.startswith("random_"):
            return self._random(op, attrs, dtype, shape, ins)
        if op == "cumsum":
            return self._cumsum(attrs.get("axis"), ins[0], shape)
        if op == "discounted_sum":
            return self._discounted(bool(attrs.get("reverse")), ins[0], ins[1], shape)
        raise Unsupported(f"op {op}")

    # ------------------------------------------------------------------ random draws
    def _random(self, op: str, attrs, dtype: str, shape: tuple, ins: list) -> Val:
        """A draw of the runtime library (``llvm.philox``: bit for bit ``timerlc.rng``) per
        element: key (seed, site), counter (element index, point index). The point index is
        the point's dims linearized, or, for ``random_uniform_at``/``random_normal_at``, the
        input's value (an i64 scalar)."""
        from timerlc import rng

        seed = _i32(rng.seed32(attrs["seed"]))
        site = _i32(attrs["site"])
        p: Expr = kir.i64(0)
        cost = 40
        if op in ("random_uniform_at", "random_normal_at"):
            (x,) = ins
            if math.prod(shape) > 1 and x.cost >= 2:
                x = self.materialize(x)  # computed once, not once per element
            p = x.at([]) if x.dtype == "i64" else Cast(x.at([]), "i64")
            vdep, cost = x.vdep, 40 + x.cost
            op = op.removesuffix("_at")
        else:
            space = attrs["space"]
            for k, (d, b) in enumerate(space):
                p = Ref(d) if k == 0 else kir.add(kir.mul(p, b), Ref(d))
            vdep = any(d in self.vector for d, _ in space)
        key = (Const("i32", seed), Const("i32", site), p)
        if op == "random_permutation":
            n = attrs["n"]
            out = self.temp("i32", max(n, 1))
            scratch = self.temp("i64", max(2 * n, 1))
            self.emit([kir.Permute(seed, site, p, n, out, scratch)], vdep)
            return self.temp_val(out, "i32", (n,), vdep)
        suffix = "f32" if dtype == "f32" else "f64"
        extra: tuple = ()
        if op == "random_uniform":
            name = f"tl_rng_uniform_{suffix}"
        elif op == "random_normal":
            name = f"tl_rng_normal_{suffix}"
        elif op == "random_gumbel":
            if dtype != "f64":
                raise Unsupported("gumbel noise of another dtype than f64")
            name = "tl_rng_gumbel_f64"
        else:
            kind = attrs["kind"]
            if kind == "glorot":
                fan_in, fan_out = rng.glorot_fans(shape)
                limit = math.sqrt(6.0 / max(1, fan_in + fan_out))
                name, extra = f"tl_rng_uniform_range_{suffix}", (-limit, limit)
            elif kind == "uniform":
                name, extra = f"tl_rng_uniform_range_{suffix}", (attrs["lo"], attrs["hi"])
            elif kind == "normal":
                name, extra = f"tl_rng_normal_affine_{suffix}", (0.0, attrs["std"])
            else:
                raise Unsupported(f"the {kind} initializer (a QR on the host)")
        args = key
        consts = tuple(Const(dtype, _round(v, dtype)) for v in extra)

        def at(idx):
            return kir.Fn(name, args + (kir.linear(idx, shape),) + consts, dtype)

        return Val(dtype, shape, at, vdep, cost)

    def _concat(self, axis: int, parts: list, dtype: str, shape: tuple) -> Val:
        """The parts, one after another along ``axis``, into a temporary."""
        name = self.temp(dtype, max(math.prod(shape), 1))
        stmts: list = []
        offset = 0
        for v in parts:

            def put(idx, v=v, offset=offset):
                out = idx[:axis] + [kir.add(idx[axis], kir.i64(offset))] + idx[axis + 1 :]
                return [Store(name, kir.linear(out, shape), v.at(idx))]

            stmts += self.loops(v.shape, put)
            offset += v.shape[axis]
        vdep = any(v.vdep for v in parts)
        self.emit(stmts, vdep)
        return self.temp_val(name, dtype, shape, vdep)

    def _cumsum(self, axis, x: Val, shape: tuple) -> Val:
        """A running sum along ``axis`` in the dtype, in order (NumPy's ``add.accumulate``)."""
        if axis is None:
            src = x
            x = Val(
                x.dtype, shape, lambda idx: src.at(_unravel(idx[0], src.shape)), x.vdep, x.cost
            )
            axis = 0
        dt = x.dtype
        name = self.temp(dt, max(math.prod(shape), 1))
        others = tuple(n for k, n in enumerate(shape) if k != axis)

        def body(oidx):
            acc = self.fresh("acc")

            def step(kidx):
                idx = oidx[:axis] + [kidx[0]] + oidx[axis:]
                total = Bin("add", Ref(acc, dt), x.at(idx), dt)
                return [Let(acc, dt, total), Store(name, kir.linear(idx, shape), Ref(acc, dt))]

            zero = Const(dt, 0.0 if dt[0] == "f" else 0)
            return [Let(acc, dt, zero)] + self.loops((shape[axis],), step)

        self.emit(self.loops(others, body, True), x.vdep)
        return self.temp_val(name, dt, shape, x.vdep)

    def _discounted(self, reverse: bool, x: Val, g: Val, shape: tuple) -> Val:
        """Horner's rule from the last element (NumPy's kernel, operation by operation)."""
        dt = x.dtype
        n = x.shape[0]
        name = self.temp(dt, max(math.prod(shape), 1))

        def body(oidx):
            acc, k = self.fresh("acc"), self.fresh("k")
            j = Ref(k) if reverse else Bin("sub", kir.i64(n - 1), Ref(k), "i64")
            term = Bin("add", x.at([j] + oidx), Bin("mul", g.at([]), Ref(acc, dt), dt), dt)
            return [
                Let(acc, dt, Const(dt, 0.0)),
                For(k, kir.i64(0), kir.i64(n), (Let(acc, dt, term),)),
                Store(name, kir.linear(oidx, shape), Ref(acc, dt)),
            ]

        vdep = x.vdep or g.vdep
        self.emit(self.loops(shape, body, True), vdep)
        return self.temp_val(name, dt, shape, vdep)

    # ------------------------------------------------------------------ indexing
    def check(self, ok: Expr, vdep: bool):
        """Fail the call where ``ok`` does not hold (the runtime then names the point)."""
        if isinstance(ok, Const) and ok.value is True or _holds(ok, self.dim_ranges()):
            return
        self.emit([If(Un("not", ok, "bool"), (kir.Fail(1),))], vdep)

    def _bounded(self, n: int) -> bool:
        """Whether the gather being lowered has indices its ops bound to ``[0, n)``."""
        known = self.known
        return known is not None and known[0] >= 0 and known[1] < n

    def _gather_position(self, n: int):
        """How the gather being lowered turns an index into a position in ``[0, n)``: from
        the end where negative, after ``check_indices``; or, where its ops bound its values
        to ``[0, n)`` (no check), clamped there, so that a wrong value (a bug elsewhere: a
        replay that did not wait for the indices' writer) still reads inside the array."""
        return _clamp if self._bounded(n) else _wrap

    def check_indices(self, g: Val, n: int):
        """Every element of the index tensor ``g`` lies in ``[-n, n)`` (NumPy's rule); no
        check where the ops that made its values bound them so (``self.known``,
        ``int_ranges``: PPO's minibatch indices, slices of a permutation of the batch)."""
        if self._bounded(n):
            return

        def body(idx):
            v = Cast(g.at(idx), "i64")
            ok = Bin(
                "and", Bin("ge", v, kir.i64(-n), "bool"), Bin("lt", v, kir.i64(n), "bool"), "bool"
            )
            return [If(Un("not", ok, "bool"), (kir.Fail(1),))]

        # (any failing element fails the call: the interpreter then names the first)
        self.emit(self.loops(g.shape, body, True), g.vdep)

    def _index(self, items, ins: list, shape: tuple) -> Val:
        x = ins[0]
        g = ins[1] if len(ins) > 1 else None
        src_of, vdep = self._index_map(items, x.shape, g, check_ints=True)
        return Val(
            x.dtype,
            shape,
            lambda oidx: x.at(src_of(oidx)),
            vdep or x.vdep,
            x.cost + (g.cost if g is not None else 0) + 1,
        )

    def _index_add(self, items, ins: list, shape: tuple) -> Val:
        """``zeros(shape)`` with the input added at the items (repeated gather indices
        accumulate, in the order of the input's elements, as ``np.add.at`` does)."""
        v = ins[0]
        g = ins[1] if len(ins) > 1 else None
        src_of, vdep = self._index_map(items, shape, g, check_ints=False)
        vdep = vdep or v.vdep
        dt = v.dtype
        name = self.temp(dt, max(math.prod(shape), 1))
        zero = Const(dt, 0.0 if dt[0] == "f" else 0)
        clear = self.loops(shape, lambda idx: [Store(name, kir.linear(idx, shape), zero)], True)

        def add(oidx):
            at = kir.linear(src_of(oidx), shape)
            total = Bin("add", Load(name, at, dt), _bcast(v, oidx, sub), dt)
            return [Store(name, at, total)]

        sub = self._index_shape
        self.emit(clear + self.loops(sub, add), vdep)
        return self.temp_val(name, dt, shape, vdep)

    def _index_map(self, items, sx: tuple, g: Val | None, check_ints: bool):
        """How an index reads an array of shape ``sx``: a function from an element of the
        result to the element of the array, and whether it depends on the vector dims; the
        result's shape is left in ``self._index_shape``. Slices and gather indices are
        checked (and ints, with ``check_ints``; else taken modulo the axis, as
        ``index_add`` does)."""
        items = list(items) + [("full",)] * (len(sx) - len(items))
        basic = [k for k, it in enumerate(items) if it[0] in ("slice", "full")]
        sg: tuple = ()
        group = len(basic)
        if g is not None:
            sg = g.shape
            adv = [k for k, it in enumerate(items) if it[0] in ("int", "gather")]
            adjacent = adv[-1] - adv[0] == len(adv) - 1
            group = sum(1 for k in basic if k < adv[0]) if adjacent else 0
            self.check_indices(g, sx[items.index(("gather",))])
        pos = {k: j if j < group else j + len(sg) for j, k in enumerate(basic)}
        out = [0] * (len(basic) + len(sg))
        out[group : group + len(sg)] = sg
        fixed: dict[int, Expr] = {}
        vdep = g is not None and g.vdep
        for k, it in enumerate(items):
            n = sx[k]
            if it[0] == "int":
                e = self.ix(it[1])
                dep = self.ix_vdep(it[1])
                vdep = vdep or dep
                if check_ints:
                    ok = Bin(
                        "and",
                        Bin("ge", e, kir.i64(-n), "bool"),
                        Bin("lt", e, kir.i64(n), "bool"),
                        "bool",
                    )
                    self.check(ok, dep)
                    fixed[k] = _wrap(e, n, self.dim_ranges())
                else:
                    fixed[k] = Bin("mod", e, kir.i64(n), "i64") if n else e
            elif it[0] == "slice":
                e = self.ix(it[1])
                dep = self.ix_vdep(it[1])
                vdep = vdep or dep
                length = it[2]
                ok = Bin(
                    "and",
                    Bin("ge", e, kir.i64(0), "bool"),
                    Bin("le", e, kir.i64(n - length), "bool"),
                    "bool",
                )
                self.check(ok, dep)
                fixed[k] = e
                out[pos[k]] = length
            elif it[0] == "full":
                out[pos[k]] = n
        self._index_shape = tuple(out)
        gathered = self._gather_position(sx[items.index(("gather",))]) if g is not None else None

        def src_of(oidx):
            src = []
            for k, it in enumerate(items):
                if it[0] in ("int",):
                    src.append(fixed[k])
                elif it[0] == "slice":
                    src.append(kir.add(fixed[k], oidx[pos[k]]))
                elif it[0] == "full":
                    src.append(oidx[pos[k]])
                else:
                    gv = Cast(g.at(oidx[group : group + len(sg)]), "i64")
                    src.append(gathered(gv, sx[k]))
            return src

        return src_of, vdep

    def ix(self, v) -> Expr:
        return plan_expr(v.expr if isinstance(v, Ix) else v)

    def ix_vdep(self, v) -> bool:
        return isinstance(v, Ix) and self.names_vector(v.expr)

    def _take(self, axis, x: Val, g: Val, shape: tuple) -> Val:
        if axis is None:
            flat = (math.prod(x.shape),)
            x = Val(
                x.dtype, flat, lambda idx, x=x: x.at(_unravel(idx[0], x.shape)), x.vdep, x.cost
            )
            axis = 0
        n = x.shape[axis]
        self.check_indices(g, n)
        r = len(g.shape)
        gathered = self._gather_position(n)

        def at(oidx):
            gv = gathered(Cast(g.at(oidx[axis : axis + r]), "i64"), n)
            return x.at(oidx[:axis] + [gv] + oidx[axis + r :])

        return Val(x.dtype, shape, at, x.vdep or g.vdep, x.cost + g.cost + 1)

    def _take_along(self, axis: int, x: Val, g: Val, shape: tuple) -> Val:
        n = x.shape[axis]
        self.check_indices(g, n)
        gathered = self._gather_position(n)

        def at(oidx):
            gidx = [kir.i64(0) if g.shape[k] == 1 else oidx[k] for k in range(len(shape))]
            gv = gathered(Cast(g.at(gidx), "i64"), n)
            xidx = [
                gv if k == axis else (kir.i64(0) if x.shape[k] == 1 else oidx[k])
                for k in range(len(shape))
            ]
            return x.at(xidx)

        return Val(x.dtype, shape, at, x.vdep or g.vdep, x.cost + g.cost + 1)

    def _const(self, attrs, dtype: str, shape: tuple) -> Val:
        value = attrs["value"]
        if not isinstance(value, tuple):
            c = Const(dtype, _scalar(value, dtype))
            return Val(dtype, shape, lambda idx: c, False, 0)
        import numpy as np

        arr = np.broadcast_to(np.asarray(value, dtype=ops.numpy_dtype(dtype)), shape)
        if arr.size > MAX_CONST_ELEMENTS:
            raise Unsupported("an array constant of more than 4096 elements")
        name = self.temp(dtype, arr.size)
        flat = arr.reshape(-1)
        self.pre.extend(
            Store(name, kir.i64(k), Const(dtype, _scalar(flat[k].item(), dtype)))
            for k in range(arr.size)
        )
        return self.temp_val(name, dtype, shape, False)

    def _view(self, op: str, attrs, x: Val, shape: tuple) -> Val:
        if op == "reshape":
            src = x.shape

            def at(idx):
                flat = kir.linear(idx, shape)
                return x.at(_unravel(flat, src))

        elif op == "transpose":
            perm = attrs["perm"]

            def at(idx):
                back = [None] * len(perm)
                for j, p in enumerate(perm):
                    back[p] = idx[j]
                return x.at(back)

        elif op == "expand_dims":
            axis = attrs["axis"]

            def at(idx):
                return x.at(idx[:axis] + idx[axis + 1 :])

        elif op == "squeeze":
            axes = set(attrs["axes"])

            def at(idx):
                out, j = [], 0
                for k in range(len(x.shape)):
                    if k in axes:
                        out.append(kir.i64(0))
                    else:
                        out.append(idx[j])
                        j += 1
                return x.at(out)

        else:  # broadcast_to

            def at(idx):
                return _bcast(x, idx, shape)

        layout = _view_layout(op, attrs, x, shape)
        if op == "reshape" and layout is not None and x.cost == 0:
            # (a strided view: each element's load at its strides, not at its input's index
            # unravelled from the flat one, divisions and remainders an element; a gather of
            # a minibatch's rows of a rollout's observations, flattened, then copies runs of
            # consecutive elements)
            buf, off, st = layout

            def at(idx):
                pos = off
                for e, k in zip(idx, st):
                    pos = kir.add(pos, kir.mul(e, k))
                return Load(buf, pos, x.dtype)

        return Val(x.dtype, shape, at, x.vdep, x.cost, layout)

    def _reduce(self, op: str, attrs, x: Val, dtype: str, shape: tuple) -> Val:
        rank = len(x.shape)
        axes = ops.normalize_axes(attrs.get("axes"), rank, op)
        keep = bool(attrs.get("keepdims"))
        kept = [k for k in range(rank) if k not in axes]
        count = math.prod(x.shape[k] for k in axes)
        if op in ("max", "min") and count == 0:
            raise Unsupported(f"{op} of an empty slice (an error at run time)")
        if op == "logsumexp" and math.prod(x.shape) == 0:
            raise Unsupported("logsumexp of an empty array")
        # sums of floats accumulate in f64 (as accurate as NumPy's pairwise sums or more)
        acc_t = "f64" if dtype in ("f32", "f64") and op in ("sum", "mean", "logsumexp") else dtype
        if dtype in ("i32", "i64") and op in ("sum", "prod"):
            acc_t = "i64"
        rshape = tuple(x.shape[k] for k in axes)
        if op != "logsumexp" and axes and kept and kept[-1] == rank - 1 and count > 0:
            return self._reduce_rows(op, x, axes, kept, keep, count, acc_t, dtype, shape)
        # one value at each point of the vector loops (a point's logsumexp over its
        # actions, kept as [1]): a local, not a temporary every point would store into (a
        # loop over the points can then go to the threads, llvm.render.threaded). One
        # value for all the points stays a temporary: the cuda renderer's steps hand it
        # from the grid's reduction to the points' loop through memory.
        one = math.prod(shape) == 1 and x.vdep
        name = self.fresh("r") if one else self.temp(dtype, max(math.prod(shape), 1))

        def full(outer, inner):
            idx = [None] * rank
            for j, k in enumerate(kept):
                idx[k] = outer[j]
            for j, k in enumerate(axes):
                idx[k] = inner[j]
            return idx

        def body(oidx):
            outer = [oidx[k] for k in kept] if keep else list(oidx)
            acc = self.fresh("acc")
            stmts: list = []
            if op == "logsumexp":
                m = self.fresh("m")
                stmts.append(Let(m, dtype, Const(dtype, -math.inf)))
                stmts += _reducing(
                    self.short_loops(
                        rshape,
                        lambda iidx: [
                            Let(
                                m,
                                dtype,
                                Bin("maximum", Ref(m, dtype), x.at(full(outer, iidx)), dtype),
                            )
                        ],
                    ),
                    m,
                    "maximum",
                )
                # an infinite or nan max is replaced by 0, as NumPy's kernel does
                fin = Bin(
                    "and",
                    Bin("lt", Un("abs", Ref(m, dtype), dtype), Const(dtype, math.inf), "bool"),
                    Bin("eq", Ref(m, dtype), Ref(m, dtype), "bool"),
                    "bool",
                )
                stmts.append(Let(m, dtype, Sel(fin, Ref(m, dtype), Const(dtype, 0.0), dtype)))
                stmts.append(Let(acc, acc_t, Const(acc_t, 0.0)))
                term = lambda iidx: Cast(
                    Un("exp", Bin("sub", x.at(full(outer, iidx)), Ref(m, dtype), dtype), dtype),
                    acc_t,
                )
                stmts += _reducing(
                    self.short_loops(
                        rshape,
                        lambda iidx: [
                            Let(acc, acc_t, Bin("add", Ref(acc, acc_t), term(iidx), acc_t))
                        ],
                    ),
                    acc,
                    "add",
                )
                result = Bin(
                    "add", Un("log", Cast(Ref(acc, acc_t), dtype), dtype), Ref(m, dtype), dtype
                )
            else:
                comb, init = _COMBINE[op]
                if init is None:
                    first = [kir.i64(0)] * len(axes)
                    stmts.append(Let(acc, acc_t, x.at(full(outer, first))))
                else:
                    stmts.append(
                        Let(acc, acc_t, Const(acc_t, float(init) if acc_t[0] == "f" else init))
                    )

                def step(iidx):
                    v = x.at(full(outer, iidx))
                    if v.dtype != acc_t:
                        v = Cast(v, acc_t)
                    return [Let(acc, acc_t, Bin(comb, Ref(acc, acc_t), v, acc_t))]

                stmts += _reducing(self.short_loops(rshape, step), acc, comb)
                result = Ref(acc, acc_t)
                if op == "mean":
                    result = Bin("div", result, Const(acc_t, float(count)), acc_t)
                if result.dtype != dtype:
                    result = Cast(result, dtype)
            if one:
                stmts.append(Let(name, dtype, result))
            else:
                stmts.append(Store(name, kir.linear(oidx, shape), result))
            return stmts

        if one:
            self.emit(body([kir.i64(0)] * len(shape)), x.vdep)
            return Val(dtype, shape, lambda idx: Ref(name, dtype), x.vdep, 0, None, True)
        self.emit(self.loops(shape, body, True), x.vdep)
        return self.temp_val(name, dtype, shape, x.vdep)

    def _dynamic_reduce(self, node, op: str, attrs, dtype: str, shape: tuple) -> Val:
        """A reduction of a slice whose length depends on the point (``x[b, 0:t+1]``, a
        window that grows): a loop from the slice's start to its end at the point, the terms
        in the order ``_reduce`` and ``_discounted`` add them. The slice must lie inside
        its source's dims (else the kernel fails, and the interpreter names the read)."""
        r = node.inputs[0]
        buf = self.plan.buffer(r.src)
        o = buf.outputs[r.out]
        if o.shape or shape or attrs.get("keepdims") or attrs.get("reverse"):
            raise Unsupported("a slice whose length depends on the point")
        if op in _REDUCE and attrs.get("axes") not in (None, 0, (0,), [0]):
            raise Unsupported("a slice whose length depends on the point")
        name = self.slot(r.src, r.out)
        (k,) = [j for j, a in enumerate(r.access) if not isinstance(a, At)]
        lo, hi = self.index(r.access[k].lo), self.index(r.access[k].hi)
        fixed = [None if j == k else self.index(a.index) for j, a in enumerate(r.access)]
        vdep = any(self.names_vector(e) for e in (r.access[k].lo, r.access[k].hi)) or any(
            self.names_vector(a.index) for a in r.access if isinstance(a, At)
        )
        g = self.read(node.inputs[1]) if op == "discounted_sum" else None
        vdep = vdep or (g is not None and g.vdep)

        def at(pos: Expr) -> Expr:
            return Load(
                name,
                self.point_index(r.src, [pos if e is None else e for e in fixed], r.out),
                o.dtype,
            )

        n = Bin("sub", hi, lo, "i64")
        # a read outside the source's dims (a non-empty slice past its box) is the
        # interpreter's error to report
        inside = Bin(
            "or",
            Bin("le", n, kir.i64(0), "bool"),
            Bin(
                "and",
                Bin("ge", lo, kir.i64(0), "bool"),
                Bin("le", hi, kir.i64(buf.box[k]), "bool"),
                "bool",
            ),
            "bool",
        )
        stmts: list = [If(Un("not", inside, "bool"), (kir.Fail(1),))]
        acc, j = self.fresh("acc"), self.fresh("k")
        if op == "discounted_sum":
            # Horner's rule from the last element (as _discounted)
            pos = Bin("sub", Bin("sub", hi, kir.i64(1), "i64"), Ref(j), "i64")
            term = Bin("add", at(pos), Bin("mul", g.at([]), Ref(acc, dtype), dtype), dtype)
            stmts += [
                Let(acc, dtype, Const(dtype, 0.0)),
                For(j, kir.i64(0), n, (Let(acc, dtype, term),)),
            ]
            result: Expr = Ref(acc, dtype)
        else:
            acc_t = "f64" if dtype in ("f32", "f64") and op in ("sum", "mean") else dtype
            if dtype in ("i32", "i64") and op in ("sum", "prod"):
                acc_t = "i64"
            comb, init = _COMBINE[op]

            def cast(v: Expr) -> Expr:
                return v if v.dtype == acc_t else Cast(v, acc_t)

            if init is None:  # max, min: the first element (the slice is not empty)
                stmts.append(If(Bin("le", n, kir.i64(0), "bool"), (kir.Fail(1),)))
                stmts.append(Let(acc, acc_t, cast(at(lo))))
                start = Bin("add", lo, kir.i64(1), "i64")
            else:
                stmts.append(
                    Let(acc, acc_t, Const(acc_t, float(init) if acc_t[0] == "f" else init))
                )
                start = lo
            step = Let(acc, acc_t, Bin(comb, Ref(acc, acc_t), cast(at(Ref(j))), acc_t))
            stmts.append(For(j, start, hi, (step,)))
            result = Ref(acc, acc_t)
            if op == "mean":
                result = Bin(
                    "div", result, Cast(Bin("maximum", n, kir.i64(0), "i64"), acc_t), acc_t
                )
            if result.dtype != dtype:
                result = Cast(result, dtype)
        out = self.fresh("x")
        stmts.append(Let(out, dtype, result))
        self.emit(stmts, vdep)
        return Val(dtype, (), lambda idx: Ref(out, dtype), vdep, 0, None, True)

    def _reduce_rows(self, op, x: Val, axes, kept, keep, count, acc_t, dtype, shape) -> Val:
        """A reduction that keeps the last axis (a column sum): accumulated in the input's
        order, a row at a time into a row of accumulators, so that the inner loop runs
        along contiguous memory and vectorizes; each result still adds its terms in order."""
        kshape = tuple(x.shape[k] for k in kept)
        acc = self.temp(acc_t, math.prod(kshape))
        comb, _ = _COMBINE[op]

        def kept_of(idx):
            return kir.linear([idx[k] for k in kept], kshape)

        def first(kidx):
            if op in ("max", "min"):
                idx = [None] * len(x.shape)
                for j, k in enumerate(kept):
                    idx[k] = kidx[j]
                for k in axes:
                    idx[k] = kir.i64(0)
                v = x.at(idx)
            else:
                v = Const(
                    acc_t, (1.0 if op == "prod" else 0.0) if acc_t[0] == "f" else int(op == "prod")
                )
            v = v if v.dtype == acc_t else Cast(v, acc_t)
            return [Store(acc, kir.linear(kidx, kshape), v)]

        def step(idx):
            at = kept_of(idx)
            v = x.at(idx)
            v = v if v.dtype == acc_t else Cast(v, acc_t)
            return [Store(acc, at, Bin(comb, Load(acc, at, acc_t), v, acc_t))]

        name = self.temp(dtype, max(math.prod(shape), 1))

        def out(oidx):
            kidx = [oidx[k] for k in kept] if keep else list(oidx)
            r: Expr = Load(acc, kir.linear(kidx, kshape), acc_t)
            if op == "mean":
                r = Bin("div", r, Const(acc_t, float(count)), acc_t)
            if r.dtype != dtype:
                r = Cast(r, dtype)
            return [Store(name, kir.linear(oidx, shape), r)]

        init = self.loops(kshape, first, True)
        terms = self.loops(x.shape, step)
        big = [k for k, n in enumerate(x.shape) if n != 1]  # the axes that have loops
        kbig = [j for j, k in enumerate(big) if k in kept]
        if terms and kbig:
            if kbig[0] == 0:  # the outer loop is over a kept axis: each iteration its rows
                terms = _marked(terms, 0, parallel=True)
            else:  # rows of terms, each iteration of the first kept axis' loop its own
                terms = _marked(_marked(terms, kbig[0], parallel=True), 0, reduce=((acc, comb),))
        elif terms and big:  # one column: every term into acc[0] (one term: no loop)
            terms = _marked(terms, 0, reduce=((acc, comb),))
        stmts = init + terms + self.loops(shape, out, True)
        self.emit(stmts, x.vdep)
        return self.temp_val(name, dtype, shape, x.vdep)

    def _argreduce(self, op: str, attrs, x: Val, shape: tuple) -> Val:
        if math.prod(x.shape) == 0:
            raise Unsupported(f"{op} of an empty array")
        axis = attrs.get("axis")
        xs = x
        if axis is None:
            flat = (math.prod(x.shape),)
            xs = Val(x.dtype, flat, lambda idx: x.at(_unravel(idx[0], x.shape)), x.vdep, x.cost)
            axis = 0
        axis %= len(xs.shape)
        n = xs.shape[axis]
        name = self.temp("i32", max(math.prod(shape), 1))
        better = "gt" if op == "argmax" else "lt"
        dt = xs.dtype

        def body(oidx):
            best, pos = self.fresh("best"), self.fresh("pos")
            at = lambda j: xs.at(oidx[:axis] + [j] + oidx[axis:])
            k = self.fresh("k")
            cur = at(Ref(k))
            # NumPy: the first nan wins, else the first extreme
            if dt in ("f32", "f64"):
                isnan = lambda e: Bin("ne", e, e, "bool")
                take = Bin(
                    "and",
                    Un("not", isnan(Ref(best, dt)), "bool"),
                    Bin("or", isnan(cur), Bin(better, cur, Ref(best, dt), "bool"), "bool"),
                    "bool",
                )
            else:
                take = Bin(better, cur, Ref(best, dt), "bool")
            loop = For(
                k,
                kir.i64(1),
                kir.i64(n),
                (If(take, (Let(best, dt, cur), Let(pos, "i64", Ref(k)))),),
            )
            return [
                Let(best, dt, at(kir.i64(0))),
                Let(pos, "i64", kir.i64(0)),
                loop,
                Store(name, kir.linear(oidx, shape), Cast(Ref(pos), "i32")),
            ]

        self.emit(self.loops(shape, body, True), x.vdep)
        return self.temp_val(name, "i32", shape, x.vdep)

    def _matmul(self, a: Val, b: Val, dtype: str, shape: tuple, dest=None) -> Val:
        if (
            dtype in ("f32", "f64")
            and a.shape[-1] <= SMALL_K
            and len(a.shape) in (1, 2)
            and len(b.shape) == 2
        ):
            return self._small_k(a, b, dtype, shape)
        if (
            self.batchable
            and a.vdep
            and not a.local
            and not b.vdep
            and len(a.shape) in (1, 2)
            and len(b.shape) == 2
            and dtype in ("f32", "f64")
        ):
            return self._matmul_over_points(a, b, dtype, dest)
        if dest is not None and self.st.vector:
            dest = None  # a product per point: into a temporary, then stored
        if dest is not None:
            self.wrote_dest = True
        return self._matmul_at_point(a, b, dtype, shape, dest)

    def _small_k(self, a: Val, b: Val, dtype: str, shape: tuple) -> Val:
        """``a @ b`` over at most ``SMALL_K`` terms (a layer's inputs: four observations;
        the gradient through a head of two actions) as an expression per element, its terms
        written out in order: it is computed inside whatever reads it (a layer's bias and
        ``tanh``), with no temporary between the product and them."""
        if a.cost > 0:
            a = self.materialize(a)  # (each element of a is read once per column)
        if b.cost > 0:
            b = self.materialize(b)
        kk = a.shape[-1]

        def at(idx):
            total = None
            for k in range(kk):
                term = Bin(
                    "mul", a.at(idx[:-1] + [kir.i64(k)]), b.at([kir.i64(k), idx[-1]]), dtype
                )
                total = term if total is None else Bin("add", total, term, dtype)
            return total if total is not None else Const(dtype, 0.0)

        local = a.local or b.local
        return Val(dtype, shape, at, a.vdep or b.vdep, 2 * kk, None, local)

    def _matmul_over_points(self, a: Val, b: Val, dtype: str, dest=None) -> Val:
        """``a @ b`` at every point of the vector dims at once, where ``a`` depends on the
        point and ``b`` does not (a layer applied to every environment): one matmul (the
        BLAS's) of the rows of ``a`` at all points, each point reading its rows. Computed
        once per call, before the vector loops. Where the points' rows of ``a`` lie in its
        buffer at a constant stride (one after another, as the rows of ``o[i, b, t]`` at
        all ``b, t``), the BLAS reads them there; else they are copied into one matrix
        first. Likewise the product goes straight to ``dest`` (the statement's buffer)
        where the points' results lie there one after another."""
        st = self.st
        self.over_points = True
        box = self.plan.buffer(st.id).box
        vdims = [(d, box[k]) for k, d in enumerate(st.dims) if d in self.vector]
        origin = {}
        if self.block is not None:  # the points of one block
            d0, size = self.block
            vdims = [(d, size if d == d0 else ext) for d, ext in vdims]
            origin = {d0: self.lo}
        points = math.prod(n for _, n in vdims)
        m = 1 if len(a.shape) == 1 else a.shape[0]
        kk, n = a.shape[-1], b.shape[1]
        p: Expr = kir.i64(0)
        for d, ext in vdims:
            local = Bin("sub", Ref(d), origin[d], "i64") if d in origin else Ref(d)
            p = kir.add(kir.mul(p, ext), local)
        shape_a = tuple(a.shape)
        strided = None if a.layout is None else _point_rows(a.layout, vdims, m, kk, origin)
        if (
            strided is not None
            and _matrix(Val(dtype, (points * m, kk), a.at, False, 0, strided), (points * m, kk))
            is None
        ):
            strided = None
        if strided is None:
            rows = self.temp(dtype, max(points * m * kk, 1))

            def put(idx):
                row = kir.add(kir.mul(p, m), idx[0] if len(shape_a) == 2 else kir.i64(0))
                return [Store(rows, kir.add(kir.mul(row, kk), idx[-1]), a.at(idx))]

            loop = self.loops(shape_a, put)
            for d, _ in reversed(vdims):
                # each loop over the points is parallel: each point its own rows
                loop = [For(d, *self.vector_range(d), tuple(loop), True)]
            self.pre.extend(loop)
            strided = (rows, kir.i64(0), (kk, 1))
        buf, off, (sr, sc) = strided
        every = Val(
            dtype,
            (points * m, kk),
            lambda idx: Load(
                buf, kir.add(off, kir.add(kir.mul(idx[0], sr), kir.mul(idx[1], sc))), dtype
            ),
            False,
            0,
            strided,
        )
        into = None
        if dest is not None:
            into = _point_rows((dest[0], dest[1], (n, 1)), vdims, m, n, origin)
            if into is not None and (into[2][1] != 1 or into[2][0] < n):
                into = None
        if into is not None:
            self.wrote_dest = True
            out = self._matmul_at_point(
                every, b, dtype, (points * m, n), (into[0], into[1]), into[2][0]
            )
        else:
            out = self._matmul_at_point(every, b, dtype, (points * m, n))

        def at(idx):
            row = kir.add(kir.mul(p, m), idx[0] if len(shape_a) == 2 else kir.i64(0))
            return out.at([row, idx[-1]])

        return Val(dtype, (n,) if len(shape_a) == 1 else (m, n), at, True, 0)

    def _matmul_at_point(
        self, a: Val, b: Val, dtype: str, shape: tuple, dest=None, ldc: int | None = None
    ) -> Val:
        """``a @ b`` into a temporary, or with ``dest`` (a buffer and the offset of the
        point's element) straight into the statement's buffer, its rows ``ldc`` elements
        apart (default: one after another)."""
        sa = (1,) + a.shape if len(a.shape) == 1 else a.shape
        sb = b.shape + (1,) if len(b.shape) == 1 else b.shape
        batch = tuple(_bshape(sa[:-2], sb[:-2]))
        m, kk, n = sa[-2], sa[-1], sb[-1]
        blas = dtype in ("f32", "f64") and m * n * kk >= BLAS_MIN_MACS
        tiled = (
            blas
            and not batch
            and len(a.shape) == 2
            and len(b.shape) == 2
            and not (a.vdep or b.vdep)  # (once a call, outside the vector loops)
            and (a.cost > 0 or _matrix(a, sa) is None)
            and m * kk * kir.SIZES[dtype] > TILED_OPERAND_BYTES
        )
        # (a tiled a is computed a tile at a time, _tiled_gemm)
        if not tiled and (a.cost > 0 or (blas and _matrix(a, sa) is None)):
            a = self.materialize(a)
        if b.cost > 0 or (blas and _matrix(b, sb) is None):
            b = self.materialize(b)
        full = batch + (m, n)
        if dest is None:
            name, base = self.temp(dtype, max(math.prod(full), 1)), kir.i64(0)
        else:
            name, base = dest
        if ldc is None:
            ldc = n
        elif batch:
            raise ValueError("a row stride of its own for a batch of products")

        def pos(idx) -> Expr:
            if ldc != n:
                return kir.add(base, kir.add(kir.mul(idx[-2], ldc), idx[-1]))
            return kir.add(base, kir.linear(idx, full))

        def a_at(bidx, i, k):
            idx = _bidx(bidx, batch, sa[:-2]) + [i, k]
            return a.at(idx[1:] if len(a.shape) == 1 else idx)

        def b_at(bidx, k, j):
            idx = _bidx(bidx, batch, sb[:-2]) + [k, j]
            return b.at(idx[:-1] if len(b.shape) == 1 else idx)

        def body(bidx):
            # row by row: out[i, :] = sum over k of a[i, k] * b[k, :] (the inner loop runs
            # along a row of b and of out: it vectorizes)
            zero = Const(dtype, 0.0 if dtype[0] == "f" else 0)

            def row(i):
                def clear(jdx):
                    return [Store(name, pos(list(bidx) + [i, jdx[0]]), zero)]

                def term(kdx):
                    aik = self.fresh("a")

                    def acc(jdx):
                        at = pos(list(bidx) + [i, jdx[0]])
                        prod = Bin("mul", Ref(aik, dtype), b_at(bidx, kdx[0], jdx[0]), dtype)
                        return [Store(name, at, Bin("add", Load(name, at, dtype), prod, dtype))]

                    return [Let(aik, dtype, a_at(bidx, i, kdx[0]))] + self.loops((n,), acc)

                return self.loops((n,), clear) + self.loops((kk,), term)

            return self.loops((m,), lambda idx: row(idx[0]), parallel=True)

        if tiled:

            def body(bidx):
                return self._tiled_gemm(a, b, sb, name, base, ldc)

        elif blas:

            def body(bidx):  # the BLAS (or the runtime library's loops where it has none)
                return [self._gemm(a, b, sa, sb, batch, bidx, name, base, full, ldc)]

        vdep = a.vdep or b.vdep
        self.emit(self.loops(batch, body) if batch else body([]), vdep)
        if dest is None:
            res = self.temp_val(name, dtype, full, vdep)
        else:
            layout = (name, base, (ldc, 1)) if ldc != n else None
            res = Val(dtype, full, lambda idx: Load(name, pos(idx), dtype), vdep, 0, layout)
        if len(a.shape) == 1 or len(b.shape) == 1:

            def at(idx):
                idx = list(idx)
                if len(a.shape) == 1:
                    idx = idx[: len(batch)] + [kir.i64(0)] + idx[len(batch) :]
                if len(b.shape) == 1:
                    idx = idx + [kir.i64(0)]
                return res.at(idx)

            return Val(dtype, shape, at, vdep, 0)
        return res

    def _tiled_gemm(self, a: Val, b: Val, sb, name: str, base: Expr, ldc: int) -> list:
        """``c = a @ b`` by the BLAS where ``a`` (``m x k``) is no matrix it can read and too
        large to compute whole (more than ``TILED_OPERAND_BYTES``: a minibatch's rows of
        image-sized observations, gathered, ``schedule.build._gathered_operands``): ``a``
        computed a tile of at most ``self.tile`` bytes at a time (``OPERAND_TILE_BYTES``;
        ``GPU_SCRATCH`` for the cuda target, whose calls share one scratch memory) into one
        temporary, and multiplied from there. The tiles run along the longer of ``a``'s
        axes, and each tile's copy along it innermost (the rows of a gather are the
        observations, read one after another):

        - along ``k`` (``obs[idx] @ w``): tile ``q`` multiplies ``a[:, ks]`` by ``b[ks, :]``,
          the first into ``c``, each next one into a second temporary then added to ``c``;
        - along ``m`` (``obs[idx].T @ g``, a weight's gradient): tile ``q`` is
          ``c[ms, :] = a[ms, :] @ b``, its copy stored transposed (``a[ms, :]``'s rows are
          ``obs[idx]``'s columns)."""
        dtype = a.dtype
        m, kk = a.shape
        n = sb[-1]
        tb, bbuf, boff, ldb = _matrix(b, sb)
        size = kir.SIZES[dtype]
        along_k = kk >= m
        side, total = (m, kk) if along_k else (kk, m)  # (a tile: side x width, of total)
        width = max(1, self.tile // (size * side))
        tiles = -(-total // width)
        if tiles > MAX_OPERAND_TILES:  # (each tile is code of its own)
            width = -(-total // MAX_OPERAND_TILES)
            tiles = -(-total // width)
        tile = self.temp(dtype, width * side)
        part = self.temp(dtype, m * n) if along_k and tiles > 1 else None
        zero = kir.i64(0)
        out: list = []
        for q in range(tiles):
            lo = q * width
            w = min(width, total - lo)
            if along_k:

                def put(idx, lo=lo, w=w):
                    at = kir.add(kir.mul(idx[0], w), idx[1])
                    return [Store(tile, at, a.at([idx[0], kir.add(idx[1], kir.i64(lo))]))]

                out += self.loops((m, w), put, True)
                bat = kir.add(boff, kir.i64(lo if tb else lo * ldb))
                into, at, ld = (name, base, ldc) if q == 0 else (part, zero, n)
                out.append(
                    kir.Gemm(
                        dtype, False, tb, m, n, w, tile, zero, w, bbuf, bat, ldb, into, at, ld
                    )
                )
                if q > 0:

                    def acc(idx):
                        c = kir.add(base, kir.add(kir.mul(idx[0], ldc), idx[1]))
                        p = kir.add(kir.mul(idx[0], n), idx[1])
                        s = Bin("add", Load(name, c, dtype), Load(part, p, dtype), dtype)
                        return [Store(name, c, s)]

                    out += self.loops((m, n), acc, True)
            else:

                def put_t(idx, lo=lo, w=w):
                    at = kir.add(kir.mul(idx[0], w), idx[1])
                    return [Store(tile, at, a.at([kir.add(idx[1], kir.i64(lo)), idx[0]]))]

                out += self.loops((kk, w), put_t, True)
                cat = kir.add(base, kir.i64(lo * ldc))
                out.append(
                    kir.Gemm(
                        dtype, True, tb, w, n, kk, tile, zero, w, bbuf, boff, ldb, name, cat, ldc
                    )
                )
        return out

    def _gemm(
        self, a: Val, b: Val, sa, sb, batch, bidx, name: str, base: Expr, full: tuple, ldc: int
    ) -> kir.Gemm:
        """``out[bidx] = a[bidx] @ b[bidx]`` by the BLAS (both operands strided matrices)."""
        m, kk, n = sa[-2], sa[-1], sb[-1]
        ta, abuf, aoff, lda = _matrix(a, sa)
        tb, bbuf, boff, ldb = _matrix(b, sb)
        ab = _bidx(bidx, batch, sa[:-2])
        bb = _bidx(bidx, batch, sb[:-2])
        astr = a.layout[2][: len(a.shape) - 2] if len(a.shape) > 2 else ()
        bstr = b.layout[2][: len(b.shape) - 2] if len(b.shape) > 2 else ()
        for e, st in zip(ab, astr):
            aoff = kir.add(aoff, kir.mul(e, st))
        for e, st in zip(bb, bstr):
            boff = kir.add(boff, kir.mul(e, st))
        coff = kir.add(base, kir.linear(list(bidx) + [kir.i64(0), kir.i64(0)], full))
        return kir.Gemm(
            a.dtype, ta, tb, m, n, kk, abuf, aoff, lda, bbuf, boff, ldb, name, coff, ldc
        )


def _const_of(v: Val) -> Const | None:
    """The constant every element of ``v`` is, if it is one."""
    if v.vdep or v.cost or v.layout is not None or v.local:
        return None
    e = v.at([kir.i64(0)] * len(v.shape))
    return e if isinstance(e, Const) else None


def _fold_binary(op: str, a: Val, b: Val, dtype: str, shape: tuple) -> Val | None:
    """``a op b`` where it simplifies: two constants folded (as NumPy computes them in
    ``dtype``); ``x ** 1`` is ``x``, and ``x ** 2`` is ``x * x`` (NumPy's own fast path for
    these exponents)."""
    ca, cb = _const_of(a), _const_of(b)
    if ca is not None and cb is not None and op in ("add", "sub", "mul") and dtype[0] == "f":
        import numpy as np

        t = ops.numpy_dtype(dtype)
        x, y = np.asarray(ca.value, t), np.asarray(cb.value, t)
        r = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](x, y)
        c = Const(dtype, float(r))
        return Val(dtype, shape, lambda idx: c, False, 0)
    if op == "pow" and cb is not None and dtype[0] == "f" and a.shape == shape:
        if cb.value == 1.0:
            return a
        if cb.value == 2.0:
            return Val(
                dtype,
                shape,
                lambda idx: Bin("mul", a.at(idx), a.at(idx), dtype),
                a.vdep,
                a.cost + 1,
            )
    return None


def _point_rows(layout: tuple, vdims: list, m: int, k: int, origin=None) -> tuple | None:
    """The layout ``(buffer, offset, (row stride, column stride))`` of the matrix of the
    rows of every point of the vector dims ``vdims`` (``(dim, extent)``, outermost first;
    point ``p`` in row-major order gives rows ``p*m ..< p*m + m``), from ``layout``: one
    point's ``[m, k]`` (or ``[k]`` where ``m`` is 1) view, its offset an expression of the
    vector dims. The points start at ``origin`` (dim -> its first value; default 0). None
    where the points' rows do not lie one after another at one stride."""
    buf, off, st = layout
    aff = _affine(off, {d for d, _ in vdims})
    if aff is None:
        return None
    rest, coef = aff
    for d, lo in (origin or {}).items():
        if coef.get(d, 0):
            rest = kir.add(rest, Bin("mul", lo, kir.i64(coef[d]), "i64"))
    sc = st[-1]
    row = st[-2] if len(st) == 2 else None
    want = None  # the stride the next dim outward must have
    for d, ext in reversed(vdims):
        c = coef.get(d, 0)
        if ext == 1:
            continue
        if want is None:
            if m > 1 and c != m * row:
                return None
            row = row if m > 1 else c
        elif c != want:
            return None
        want = c * ext
    if row is None:  # a single point of one row
        row = k * sc
    return buf, rest, (row, sc)


def _affine(e: Expr, names: set) -> tuple[Expr, dict] | None:
    """``e`` (i64) as ``rest + sum(coef[v] * v)`` over the locals ``names``, ``rest`` free
    of them: ``(rest, coef)``, or None where ``e`` is not of that form."""
    if isinstance(e, Ref) and e.name in names:
        return kir.i64(0), {e.name: 1}
    if not _mentions(e, names):
        return e, {}
    if isinstance(e, Bin) and e.dtype == "i64" and e.op == "add":
        a, b = _affine(e.a, names), _affine(e.b, names)
        if a is None or b is None:
            return None
        coef = dict(a[1])
        for v, c in b[1].items():
            coef[v] = coef.get(v, 0) + c
        return kir.add(a[0], b[0]), coef
    if isinstance(e, Bin) and e.dtype == "i64" and e.op == "mul":
        x, k = (e.a, e.b) if isinstance(e.b, Const) else (e.b, e.a)
        if not isinstance(k, Const):
            return None
        x = _affine(x, names)
        if x is None:
            return None
        return kir.mul(x[0], k.value), {v: c * k.value for v, c in x[1].items()}
    return None


INT_LIMITS = {
    "bool": (0, 1),
    "i32": (-(1 << 31), (1 << 31) - 1),
    "i64": (-(1 << 63), (1 << 63) - 1),
}


def fits(r: tuple[int, int] | None, dtype: str) -> tuple[int, int] | None:
    """Range ``r`` where values of ``dtype`` hold all of it (an integer dtype), else None."""
    if r is None or dtype not in INT_LIMITS:
        return None
    lo, hi = INT_LIMITS[dtype]
    return r if lo <= r[0] and r[1] <= hi else None


def interval(e: Expr, ranges: dict | None = None, leaf=None) -> tuple[int, int] | None:
    """The least and greatest values of the integer expression ``e`` where its variables
    lie in ``ranges`` (name -> (least, greatest); a variable not there: any value) and its
    constants and ops bound it (``mod(j, 4) * 65536`` lies in ``[0, 196608]`` whatever
    ``j`` is); None where they do not. ``leaf``: the range of an expression the sums,
    products and divisions here do not cover (a load, a cast, a local not in ``ranges``),
    where the caller knows one (``codegen.checks``: the values kernels store). A result
    its dtype cannot hold (a sum that may wrap) is none."""
    if isinstance(e, Const) and not isinstance(e.value, (bool, float)):
        return int(e.value), int(e.value)
    if isinstance(e, Ref) and e.name in (ranges or {}):
        return ranges[e.name]
    if not (isinstance(e, Bin) and e.op in ("add", "sub", "mul", "floordiv", "mod")):
        return None if leaf is None else leaf(e)
    a, b = interval(e.a, ranges, leaf), interval(e.b, ranges, leaf)
    if e.op == "mod" and b is not None and b[0] == b[1] and b[0] > 0:
        # (a floor modulo: the divisor's sign; a dividend within it, itself)
        inside = a is not None and a[0] >= 0 and a[1] < b[0]
        return a if inside else (0, b[0] - 1)
    if e.op == "mul" and (a == (0, 0) or b == (0, 0)):
        return 0, 0
    if a is None or b is None:
        return None
    if e.op == "add":
        r = a[0] + b[0], a[1] + b[1]
    elif e.op == "sub":
        r = a[0] - b[1], a[1] - b[0]
    elif e.op == "mul":
        ends = [x * y for x in a for y in b]
        r = min(ends), max(ends)
    elif e.op == "floordiv" and b[0] == b[1] and b[0] > 0:
        r = a[0] // b[0], a[1] // b[0]
    else:
        return None
    return fits(r, e.dtype)


def _holds(c: Expr, ranges: dict | None = None) -> bool:
    """Whether the condition ``c`` holds whatever its variables are (``interval``; the
    variables in ``ranges`` within theirs): a slice of a minibatch at ``65536 * mod(j, 4)``
    starts inside its array, an index by a vector dim of 256 points into an axis of 256 lies
    inside it: a check that cannot fail."""
    if isinstance(c, Const):
        return c.value is True
    if not isinstance(c, Bin):
        return False
    if c.op == "and":
        return _holds(c.a, ranges) and _holds(c.b, ranges)
    if c.op not in ("lt", "le", "gt", "ge"):
        return False
    a, b = interval(c.a, ranges), interval(c.b, ranges)
    if a is None or b is None:
        return False
    return {
        "lt": a[1] < b[0],
        "le": a[1] <= b[0],
        "gt": a[0] > b[1],
        "ge": a[0] >= b[1],
    }[c.op]


def _mentions(e: Expr, names: set) -> bool:
    if isinstance(e, Ref):
        return e.name in names
    return any(_mentions(x, names) for x in kir.children(e))


# reductions of a slice whose length depends on the point (``_dynamic_reduce``)
_DYNAMIC = {"sum", "mean", "max", "min", "discounted_sum"}


def _dynamic_slice(r) -> bool:
    """Whether read ``r`` is a stored read through one slice whose length depends on the
    point."""
    if not r.stored:
        return False
    slices = [a for a in r.access if not isinstance(a, At)]
    return len(slices) == 1 and px.difference(slices[0].hi, slices[0].lo) is None


SMALL_K = 4  # a product over at most this many terms is an expression per element (_small_k)
BLAS_MIN_MACS = 2048  # below, generated loops are as fast as a BLAS call (docs/codegen.md)
# a product's operand the BLAS cannot read that holds more bytes than this is computed a tile
# of at most OPERAND_TILE_BYTES at a time (``_Lowering._tiled_gemm``), in at most
# MAX_OPERAND_TILES tiles
TILED_OPERAND_BYTES = 64 << 20
OPERAND_TILE_BYTES = 8 << 20
MAX_OPERAND_TILES = 64


def _contiguous(shape: tuple) -> tuple:
    out, stride = [], 1
    for n in reversed(shape):
        out.append(stride)
        stride *= n
    return tuple(reversed(out))


def _view_layout(op: str, attrs, x: Val, shape: tuple):
    """The layout of a shape op's result, where it is a strided view of its input's."""
    if x.layout is None:
        return None
    buf, off, st = x.layout
    if op == "transpose":
        return buf, off, tuple(st[p] for p in attrs["perm"])
    if op == "expand_dims":
        a = attrs["axis"]
        return buf, off, st[:a] + (0,) + st[a:]
    if op == "squeeze":
        return buf, off, tuple(s for k, s in enumerate(st) if k not in set(attrs["axes"]))
    if op == "reshape":
        live = [(n, s) for n, s in zip(x.shape, st) if n != 1]
        want = _contiguous(tuple(n for n, _ in live))
        if all(s == w for (_, s), w in zip(live, want)):
            return buf, off, _contiguous(shape)
        return None
    if op == "broadcast_to":
        lead = len(shape) - len(x.shape)
        return (
            buf,
            off,
            (0,) * lead
            + tuple(
                0 if x.shape[k] == 1 and shape[lead + k] != 1 else st[k] for k in range(len(st))
            ),
        )
    return None


def _matrix(v: Val, shape2: tuple):
    """How the BLAS reads ``v`` as the matrix of shape ``shape2`` (its last two axes; a
    vector as one row or one column): (transposed, buffer, offset, leading dimension), or
    None where it is not a strided matrix the BLAS can read."""
    if v.layout is None:
        return None
    buf, off, st = v.layout
    if len(v.shape) == 1:  # a row [1, K] (the left operand) or a column [K, 1] (the right)
        (s,) = st
        if shape2[0] == 1:
            return (False, buf, off, max(shape2[1], 1)) if s == 1 else None
        return (False, buf, off, s) if s >= 1 else None
    r, c = shape2[-2], shape2[-1]
    sr, sc = st[-2], st[-1]
    if r == 1:
        sr = max(c, 1)
    if c == 1:
        sc = 1 if sc == 0 else sc
    if sc == 1 and sr >= max(c, 1):
        return False, buf, off, sr
    if sr == 1 and sc >= max(r, 1):
        return True, buf, off, sc
    return None


def plan_expr(e) -> Expr:
    """A plan expression (``plan.expr``: ints, bools, names, ``[op, ...]``) as a kernel
    expression over locals of the same names."""
    if isinstance(e, bool):
        return Const("bool", e)
    if isinstance(e, int):
        return kir.i64(e)
    if isinstance(e, str):
        return Ref(e)
    op, *args = e
    xs = [plan_expr(a) for a in args]
    if op == "neg":
        return Bin("sub", kir.i64(0), xs[0], "i64")
    if op == "not":
        return Un("not", xs[0], "bool")
    if op == "select":
        return Sel(xs[0], xs[1], xs[2], "i64")
    name = _PLAN_OPS[op]
    dtype = "bool" if op in _CONDITIONS else "i64"
    acc = xs[0]
    for x in xs[1:]:
        acc = Bin(name, acc, x, dtype)
    return acc


_PLAN_OPS = {
    "add": "add",
    "sub": "sub",
    "mul": "mul",
    "min": "minimum",
    "max": "maximum",
    "fdiv_q": "floordiv",
    "pdiv_q": "floordiv",
    "mod": "mod",
    "pdiv_r": "mod",
    "zdiv_r": "rem",
    "eq": "eq",
    "ne": "ne",
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "and": "and",
    "or": "or",
}
_CONDITIONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "and", "or"})


def _scalar(v, dtype: str):
    if dtype == "bool":
        return bool(v)
    if dtype in ("i32", "i64"):
        return int(v)
    return float(v)


def _bcast(v: Val, idx: list, shape: tuple) -> Expr:
    """Element ``idx`` of an array of ``shape`` read from ``v`` by NumPy's broadcasting."""
    r = len(v.shape)
    lead = len(shape) - r
    return v.at([kir.i64(0) if v.shape[k] == 1 else idx[lead + k] for k in range(r)])


def _reducing(stmts: list, acc: str, op: str) -> list:
    """A reduction's loop nest (``short_loops``) marked as one (``For.reduce``: its
    iterations combine terms into the local ``acc`` with ``op``); written-out terms as
    they are."""
    if len(stmts) == 1 and isinstance(stmts[0], For):
        return [dataclasses.replace(stmts[0], reduce=((acc, op),))]
    return stmts


def _marked(nest: list, depth: int, **change) -> list:
    """A loop nest (``loops``) with its loop at ``depth`` changed (``For``'s fields)."""
    (loop,) = nest
    if depth == 0:
        return [dataclasses.replace(loop, **change)]
    return [dataclasses.replace(loop, body=tuple(_marked(list(loop.body), depth - 1, **change)))]


def _unravel(flat: Expr, shape: tuple) -> list:
    """The indices of the element at row-major position ``flat`` of an array of ``shape``."""
    out = []
    total = math.prod(shape)
    stride = total
    for n in shape:
        stride //= n
        if n == 1:
            out.append(kir.i64(0))
            continue
        q = flat if stride == 1 else Bin("floordiv", flat, kir.i64(stride), "i64")
        out.append(q if stride * n == total else Bin("mod", q, kir.i64(n), "i64"))
    return out


def _i32(v: int) -> int:
    """A uint32 as the i32 of the same bits."""
    v %= 1 << 32
    return v - (1 << 32) if v >= 1 << 31 else v


def _round(v: float, dtype: str) -> float:
    """``v`` rounded to the dtype, as NumPy's ``asarray(v, dtype)``."""
    import numpy as np

    return float(np.float32(v)) if dtype == "f32" else float(v)


def _clamp(e: Expr, n: int) -> Expr:
    """An index known to lie in ``[0, n)`` held there (no check, no failure)."""
    if isinstance(e, Const):
        return kir.i64(min(max(int(e.value), 0), n - 1))
    low = Bin("maximum", e, kir.i64(0), "i64")
    return Bin("minimum", low, kir.i64(n - 1), "i64")


def _wrap(e: Expr, n: int, ranges: dict | None = None) -> Expr:
    """A checked index in ``[-n, n)`` as a position in ``[0, n)`` (itself where it cannot
    be negative: ``interval`` with the variables in ``ranges``)."""
    if isinstance(e, Const):
        return kir.i64(e.value % n if n else e.value)
    known = interval(e, ranges)
    if known is not None and known[0] >= 0:
        return e
    return Sel(Bin("lt", e, kir.i64(0), "bool"), kir.add(e, kir.i64(n)), e, "i64")


def _bshape(a: tuple, b: tuple) -> tuple:
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = (1,) * (rank - len(b)) + tuple(b)
    return tuple(max(x, y) for x, y in zip(a, b))


def _bidx(bidx: list, batch: tuple, own: tuple) -> list:
    lead = len(batch) - len(own)
    return [kir.i64(0) if own[k] == 1 else bidx[lead + k] for k in range(len(own))]
