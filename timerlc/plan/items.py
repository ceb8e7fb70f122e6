"""The plan's items: frozen dataclasses, their JSON, and the checks that reading one runs.

A plan (``docs/plan.md``) is what ``timerlc compile`` writes and the runtime runs: sizes,
environments, one buffer per statement with its storage, each statement's nodes with their
reads, and the loop tree. This module is data, shared by the compiler (``plan.build`` makes
these items) and the runtime (which prepares its own structures from them and never changes
them). It imports only NumPy-free standard modules and ``plan.expr``.

``from_json`` reads a decoded ``plan.json`` and checks every field: types, ranges, sizes
against the limits below, ids that exist, names from the plan's own dims and loops, and
every expression (``plan.expr.check``). Anything else raises ``PlanError`` with one line
that names the field (``statements[3].nodes[1].inputs[0].access[1]: ...``). Whether the
runtime knows each op and its attributes is the runtime's own check (``runtime.plan``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from timerlc.plan import expr as px

FORMAT_VERSION = 3
DTYPES = {"bool": 1, "i32": 4, "i64": 8, "f32": 4, "f64": 8}  # name -> bytes per element

# limits: far above what a real program needs, low enough that a corrupt plan is refused
# before it can cost much
MAX_EXTENT = 1 << 31  # a dim's bound, an extent, an axis of a shape
MAX_ELEMENTS = 1 << 40  # elements of one array
MAX_RANK = 16  # dims of a buffer, axes of a shape
MAX_ITEMS = 1 << 20  # entries of one list (statements, nodes, tree items, ...)
MAX_TREE_DEPTH = 32  # nesting of loops and ifs
MAX_NAME = 1000  # characters of a name (RTL's names have at most 100: frontend.parser)
MAX_TEXT = 4096  # characters of other text (a source path, an environment spec)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_KERNEL_FILE = re.compile(r"kernels/[A-Za-z0-9_]+\.(ll|cu)\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
MAX_SCRATCH = 1 << 34  # bytes of scratch memory one kernel call needs
MAX_PHASES = 64  # launches of one statement's CUDA kernel
MAX_THREADS = 1 << 31  # the threads a launch asks for
MAX_DYNAMIC_SHARED = 227 * 1024  # a chain's launch's dynamic shared memory (sm_90's most)
MAX_REPEAT = 1 << 20  # the times a call runs a CUDA kernel's launches (its blocks)
# the loop over a repeated CUDA kernel's blocks: its launches see it after the statement's
# loops (no dim is named so)
BLOCK_LOOP = "blk$"


def launch_loops(loops, repeated: bool) -> tuple[str, ...]:
    """The loop values a CUDA kernel's launches see: the statement's loops, then
    ``BLOCK_LOOP`` where a call repeats them."""
    return tuple(loops) + ((BLOCK_LOOP,) if repeated else ())


GEMM_KEYS = ("dtype", "m", "n", "k", "a", "b", "c", "when")

# What a native tree function returns (docs/plan.md, Kernels): 0, or one of these; ``err``
# then holds the failing statement and its loop values (1, 3), or the runtime's callback
# holds the exception it raised (2).
KERNEL_FAILED = 1
HOST_FAILED = 2
OUTSIDE_BOX = 3
NO_STEPS_LEFT = 4


class PlanError(Exception):
    """A plan that cannot be loaded; the message names the field."""


# ----------------------------------------------------------------------------- items
@dataclass(frozen=True, slots=True)
class Output:
    """One output array of a node or a buffer: its dtype and spatial shape."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Window:
    """A ring buffer along ``dim``: it keeps the last ``size`` values of that dim."""

    dim: str
    size: int


@dataclass(frozen=True, slots=True)
class Home:
    """A buffer that lives in another's memory (docs/plan.md, Storage): its point ``p`` is
    stored where ``buffer``'s point ``at(p)`` is (one index expression over its dims per
    dim of ``buffer``), and holds that point's value. An update written in place of the
    value it updates: Adam's new parameters at ``j`` where the merge ``net[j + 1]`` that
    reads them keeps its own (``at = (j + 1,)``); an initial value where the merge's first
    point is (``net[0]``: ``at = (0,)``)."""

    buffer: int
    at: tuple


@dataclass(frozen=True, slots=True)
class Buffer:
    """The storage of a statement's values: one array per output, of shape ``extents +
    output.shape``. A block spans ``box``, the bounding box of the statement's domain from
    index 0; a window replaces the extent along its dim by its size (docs/plan.md)."""

    id: int
    name: str | None
    dims: tuple[str, ...]
    box: tuple[int, ...]
    outputs: tuple[Output, ...]
    window: Window | None = None
    donor: int | None = None  # the buffer whose memory it takes at its first write
    # a second ring buffer, along a loop nested in ``window``'s (only with ``window``)
    inner: Window | None = None
    # the outputs that have ``inner`` (None: every output); the others keep every index of
    # its dim (an environment step's observation is read at the next step, its reward
    # after the rollout)
    inner_outputs: tuple[int, ...] | None = None
    home: Home | None = None  # the buffer whose memory holds its values

    @property
    def windows(self) -> tuple[Window, ...]:
        return tuple(w for w in (self.window, self.inner) if w is not None)

    def windows_of(self, out: int) -> tuple[Window, ...]:
        """The ring buffers of output ``out``."""
        if self.inner is None or self.inner_outputs is None or out in self.inner_outputs:
            return self.windows
        return () if self.window is None else (self.window,)

    def wraps(self, out: int) -> dict[int, int]:
        """axis -> slots of each ring buffer of output ``out``: where the index of a point
        wraps."""
        return {self.dims.index(w.dim): w.size for w in self.windows_of(out)}

    def extents(self, out: int) -> tuple[int, ...]:
        """The extents of output ``out``'s array along the dims (before its own shape)."""
        if self.window is None:
            return self.box
        out_ = list(self.box)
        for k, size in self.wraps(out).items():
            out_[k] = size
        return tuple(out_)

    def output_bytes(self, out: int) -> int:
        o = self.outputs[out]
        return math.prod(self.extents(out)) * math.prod(o.shape) * DTYPES[o.dtype]

    @property
    def nbytes(self) -> int:
        return sum(self.output_bytes(k) for k in range(len(self.outputs)))


@dataclass(frozen=True, slots=True)
class Ix:
    """An attribute that is an index expression over the node's dims (``plan.expr``)."""

    expr: Any


@dataclass(frozen=True, slots=True)
class At:
    """A read of one index of a source dim."""

    index: Any  # an expression over the reader's dims


@dataclass(frozen=True, slots=True)
class Slice:
    """A read of ``lo:hi`` of a source dim: a leading spatial axis of ``hi - lo``."""

    lo: Any
    hi: Any


@dataclass(frozen=True, slots=True)
class Read:
    """An input of a node: output ``out`` of a stored statement's buffer (``stored``) or of
    an earlier node of the same statement, at ``access`` (one entry per dim of the source),
    where ``cond`` holds (merges only; None: everywhere)."""

    src: int
    out: int
    stored: bool
    access: tuple[At | Slice, ...]
    cond: Any = None


@dataclass(frozen=True, slots=True)
class Node:
    """One op of a statement, computed at the statement's points. ``where``: the tensor it
    computes and its source line, for messages."""

    id: int
    op: str
    attrs: tuple[tuple[str, Any], ...]
    types: tuple[Output, ...]
    inputs: tuple[Read, ...]
    where: tuple[str, int | None]

    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)


@dataclass(frozen=True, slots=True)
class Statement:
    """A stored node and the nodes inlined into it (evaluation order; its own node last),
    run over the points of ``domain``; ``loops`` are the dims the loop tree gives each call,
    ``vector`` the dims a call covers at once."""

    id: int
    dims: tuple[str, ...]
    loops: tuple[str, ...]
    vector: tuple[str, ...]
    domain: Any  # a condition over dims
    nodes: tuple[Node, ...]

    @property
    def node(self) -> Node:
        return self.nodes[-1]


@dataclass(frozen=True, slots=True)
class Loop:
    """``for var = init; cond; var += inc: body``."""

    var: str
    init: Any
    cond: Any
    inc: int
    body: tuple


@dataclass(frozen=True, slots=True)
class If:
    cond: Any
    then: tuple
    orelse: tuple = ()


@dataclass(frozen=True, slots=True)
class Call:
    """Run statement ``statement`` at the values ``args`` of its loop dims."""

    statement: int
    args: tuple


@dataclass(frozen=True, slots=True)
class Free:
    buffers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SwapOut:
    buffers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SwapIn:
    buffers: tuple[int, ...]


Item = Loop | If | Call | Free | SwapOut | SwapIn


@dataclass(frozen=True, slots=True)
class Env:
    name: str
    spec: str  # the plugin, as in the program's ``env`` line (or ``--env``)
    batch: str
    num_envs: int


@dataclass(frozen=True, slots=True)
class Operand:
    """A matrix of a ``GemmCall``: in ``space`` ``table`` (the buffer at entry ``at`` of the
    runtime's table) or ``scratch`` (from byte ``at`` of the statement's scratch memory),
    from element ``offset`` (an expression over the statement's loop dims), its rows ``ld``
    elements apart, read transposed where ``t``."""

    space: str
    at: int
    offset: Any
    ld: int
    t: bool = False


@dataclass(frozen=True, slots=True)
class GemmCall:
    """A step of a statement's CUDA kernel that the device's BLAS computes (``docs/cuda.md``):
    ``c = op(a) @ op(b)`` in ``dtype``, ``m x k`` times ``k x n``, row-major, at a call
    where ``when`` holds (a condition over the statement's loop dims). ``own``: functions
    of the module that compute the same product, one after another (``cuda.products``:
    each a function and the threads it asks for), which the runtime may run instead.
    ``then``: functions launched after the BLAS's product (not after ours), where ours
    make more than the product (an epilogue's elementwise loop, ``cuda.render``).
    ``tf32``: functions that compute what ``own``'s do with TF32 operands (the tensor
    cores'), which run in their place where TF32 is asked for (``--matmul-precision``).
    ``joint``: TF32 functions that make this product and the next launch's (a product with
    TF32 functions too, ``cuda.products.joint_tf32_lines``) with what each one's functions
    of ours make, in one pass over their rows: where TF32 is asked for, the runtime may run
    them in place of both."""

    dtype: str
    m: int
    n: int
    k: int
    a: Operand
    b: Operand
    c: Operand
    when: Any = True
    own: tuple[tuple[str, int], ...] = ()
    then: tuple[tuple[str, int], ...] = ()
    tf32: tuple[tuple[str, int], ...] = ()
    joint: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ChainCall:
    """A chain's functions (``cuda.render._Kernel._chains``: steps over the same rows run
    as one function, each block a few rows through all of them) and the launches they
    stand for: the next ``covers`` launches of the call, which the runtime runs instead
    where it chooses (as it chooses between a product of ours and the BLAS's: timed both
    ways at the first call, ``fastest``; ``ours``: the chain; ``blas``: the launches).
    ``tf32``: functions that do what ``functions`` do with the products that have TF32
    functions made as those make them (``cuda.products.tf32_form``), run instead of them
    where TF32 products are asked for (``--matmul-precision tensorfloat32``)."""

    functions: tuple[tuple[str, int], ...]
    covers: int
    tf32: tuple[tuple[str, int], ...] = ()
    # the bytes of dynamic shared memory a launch of each of ``functions`` (of ``tf32``'s)
    # asks for: 0, or what the function's array past the 48 KB it may declare takes
    shared: int = 0
    tf32_shared: int = 0


@dataclass(frozen=True, slots=True)
class Kernels:
    """The plan's native code (``docs/plan.md``, Kernels): the LLVM IR file of the build
    folder, its SHA-256, per statement with a kernel its function and the bytes of scratch
    memory a call needs, and per top-level item of the tree (but frees and swaps) the
    function that runs it (a loop: one step of its body)."""

    file: str
    sha256: str
    statements: tuple[tuple[int, str, int], ...]  # (statement, function, scratch bytes)
    trees: tuple[tuple[int, str, int], ...] = ()  # (item of the tree, function, scratch)
    # the statements of each fused kernel the trees launch, in order (codegen.fuse): its
    # time in a profile is counted at the first
    fused: tuple[tuple[int, ...], ...] = ()
    # a CUDA kernel file: per statement with a kernel, what a call runs one after another
    # (its phases, docs/cuda.md): a function and the threads it asks for, a GemmCall, or a
    # ChainCall (and the phases it stands for after it)
    launches: tuple[tuple[int, tuple[tuple[str, int] | GemmCall | ChainCall, ...]], ...] = ()
    # a CUDA kernel file: the statements whose kernels cannot fail (no failure code to read
    # back after them: the device runs on while the host goes on)
    unfailing: tuple[int, ...] = ()
    # a CUDA kernel file: the statements whose launches a call runs more than once, and how
    # many times (the kernel's blocks: ``BLOCK_LOOP`` 0, 1, ... after the statement's loops)
    repeats: tuple[tuple[int, int], ...] = ()
    # a CUDA kernel file: per fused kernel (``fused``, in order), the bytes of scratch memory
    # a call needs and what it runs one after another (as ``launches``' phases): the calls
    # of its statements one after another at the same loop values are one call of it
    fused_launches: tuple[tuple[int, tuple], ...] = ()
    # a CUDA kernel file: the loops of the tree that run as one kernel each (cuda/loops.py):
    # the statements the loop's body calls (in order), the blocks its launch asks for and
    # the bytes of scratch memory it needs; its function is named after the loop
    loops: tuple[tuple[tuple[int, ...], int, int], ...] = ()
    # a CUDA kernel file: the statements whose every call is a fused kernel's (``fused``), so
    # that only a profile launches their own kernels: their functions (each phase's) are in
    # the module under ``#ifndef TL_FUSED_ONLY`` (cuda.nvrtc.FUSED_ONLY), which a run that
    # is not profiled defines (docs/cuda.md, "What a run compiles")
    covered: tuple[int, ...] = ()
    # an LLVM kernel file: the statements of each loop of the tree that runs by chunks of
    # rows (codegen.rows), in the order its body calls them: a profile counts the loop's
    # time at the first
    row_loops: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    source: str
    dims: tuple[tuple[str, int], ...]  # canonical order, with bounds
    configs: tuple[tuple[str, Any], ...]
    seed: int
    envs: tuple[Env, ...]
    buffers: tuple[Buffer, ...]
    statements: tuple[Statement, ...]
    tree: tuple
    outputs: tuple[tuple[str, int, int], ...]  # (tensor, statement, output)
    metrics: tuple[tuple[str, int, int], ...]
    memory_budget: int | None = None
    memory_budget_met: bool | None = None
    memory_peak: int = 0
    memory_peak_unswapped: int = 0
    # a budget not met: the top-level item of ``tree`` where the buffers hold the most bytes
    # that no swap can move, and those buffers (largest first): their sum is the smallest
    # budget the plan can meet (``plan.memory``)
    memory_floor_item: int | None = None
    memory_floor: tuple[int, ...] = ()
    kernels: Kernels | None = None

    _buffers: dict = field(init=False, repr=False, compare=False)
    _statements: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_buffers", {b.id: b for b in self.buffers})
        object.__setattr__(self, "_statements", {s.id: s for s in self.statements})

    @property
    def bounds(self) -> dict[str, int]:
        return dict(self.dims)

    def buffer(self, sid: int) -> Buffer:
        return self._buffers[sid]

    def statement(self, sid: int) -> Statement:
        return self._statements[sid]

    def readers(self) -> dict[int, list[tuple[int, Any]]]:
        """Per buffer, the statements that read it, each with its read (an input of one of
        its nodes that is stored), in the plan's order."""
        out: dict[int, list[tuple[int, Any]]] = {}
        for st in self.statements:
            for n in st.nodes:
                for r in n.inputs:
                    if r.stored:
                        out.setdefault(r.src, []).append((st.id, r))
        return out

    def tensor(self, name: str) -> tuple[int, int]:
        """The (statement, output) of an output or a metric."""
        for n, sid, out in self.outputs + self.metrics:
            if n == name:
                return sid, out
        raise KeyError(name)

    def slots(self) -> dict[tuple[int, int], int]:
        """The entry of each buffer's output in the table of addresses a kernel receives:
        the buffers' outputs in the plan's order."""
        out: dict[tuple[int, int], int] = {}
        n = 0
        for b in self.buffers:
            if b.home is None:
                for k in range(len(b.outputs)):
                    out[(b.id, k)] = n
                    n += 1
        for b in self.buffers:  # (a buffer in another's memory: that one's entries)
            if b.home is not None:
                for k in range(len(b.outputs)):
                    out[(b.id, k)] = out[(b.home.buffer, k)]
        return out

    def storage_of(self, sid: int) -> int:
        """The buffer whose memory holds ``sid``'s values: its ``home``'s, else its own."""
        home = self.buffer(sid).home
        return sid if home is None else home.buffer


def walk(items):
    """Every item of a loop tree, depth first."""
    for it in items:
        yield it
        if isinstance(it, Loop):
            yield from walk(it.body)
        elif isinstance(it, If):
            yield from walk(it.then)
            yield from walk(it.orelse)


# ----------------------------------------------------------------------------- JSON out
def to_json(plan: Plan) -> dict:
    """A JSON-ready dict of ``plan`` (``docs/plan.md``)."""
    return {
        "format_version": FORMAT_VERSION,
        "source": plan.source,
        "dims": [[d, b] for d, b in plan.dims],
        "configs": [[k, _value_json(v)] for k, v in plan.configs],
        "seed": plan.seed,
        "envs": [
            {"name": e.name, "spec": e.spec, "batch": e.batch, "num_envs": e.num_envs}
            for e in plan.envs
        ],
        "buffers": [_buffer_json(b) for b in plan.buffers],
        "statements": [_statement_json(s) for s in plan.statements],
        "tree": [_item_json(it) for it in plan.tree],
        "outputs": [list(o) for o in plan.outputs],
        "metrics": [list(m) for m in plan.metrics],
        "memory": {
            "budget": plan.memory_budget,
            "budget_met": plan.memory_budget_met,
            "peak": plan.memory_peak,
            "peak_unswapped": plan.memory_peak_unswapped,
            "floor_item": plan.memory_floor_item,
            "floor": list(plan.memory_floor),
        },
        **(
            {}
            if plan.kernels is None
            else {
                "kernels": {
                    "file": plan.kernels.file,
                    "sha256": plan.kernels.sha256,
                    "statements": [list(k) for k in plan.kernels.statements],
                    "trees": [list(k) for k in plan.kernels.trees],
                    "fused": [list(k) for k in plan.kernels.fused],
                    **(
                        {
                            "launches": [
                                [sid, [_phase_json(f) for f in phases]]
                                + (
                                    [dict(plan.kernels.repeats)[sid]]
                                    if sid in dict(plan.kernels.repeats)
                                    else []
                                )
                                for sid, phases in plan.kernels.launches
                            ]
                        }
                        if plan.kernels.launches
                        else {}
                    ),
                    **(
                        {"unfailing": list(plan.kernels.unfailing)}
                        if plan.kernels.unfailing
                        else {}
                    ),
                    **(
                        {
                            "fused_launches": [
                                [scratch, [_phase_json(f) for f in phases]]
                                for scratch, phases in plan.kernels.fused_launches
                            ]
                        }
                        if plan.kernels.fused_launches
                        else {}
                    ),
                    **(
                        {
                            "loops": [
                                [list(sids), blocks, scratch]
                                for sids, blocks, scratch in plan.kernels.loops
                            ]
                        }
                        if plan.kernels.loops
                        else {}
                    ),
                    **({"covered": list(plan.kernels.covered)} if plan.kernels.covered else {}),
                    **(
                        {"row_loops": [list(k) for k in plan.kernels.row_loops]}
                        if plan.kernels.row_loops
                        else {}
                    ),
                }
            }
        ),
    }


def dumps(plan: Plan) -> str:
    return json.dumps(to_json(plan), separators=(",", ":")) + "\n"


MAX_LOOP_BLOCKS = 1 << 20  # of a loop kernel's launch
MAX_LOOP_SCRATCH = 1 << 40  # bytes of a loop kernel's scratch memory
KERNELS_HEADER = "; timerlc kernels for the plan of sha256 "  # + digest(plan): line 1 of the file
CUDA_KERNELS_HEADER = "// timerlc kernels for the plan of sha256 "  # the same, of a .cu file
# the kernel file's gemm loops for a machine without a BLAS: functions whose names start so
# are compiled only where the runtime finds no BLAS (``runtime.native``)
GEMM_FALLBACK = "tl_gemm_loops_"


def digest(plan: Plan) -> str:
    """The SHA-256 of the plan without its ``kernels`` field: a kernel file records the
    digest of the plan it was generated for."""
    import dataclasses
    import hashlib

    return hashlib.sha256(dumps(dataclasses.replace(plan, kernels=None)).encode()).hexdigest()


def _phase_json(f) -> list | dict:
    if isinstance(f, ChainCall):
        d = {"functions": [list(x) for x in f.functions], "covers": f.covers}
        d |= {"tf32": [list(x) for x in f.tf32]} if f.tf32 else {}
        d |= {key: v for key in ("shared", "tf32_shared") if (v := getattr(f, key))}
        return {"chain": d}
    if not isinstance(f, GemmCall):
        return list(f)

    def operand(o: Operand) -> dict:
        return {"in": o.space, "at": o.at, "offset": px.to_json(o.offset), "ld": o.ld, "t": o.t}

    return {
        "gemm": {
            "dtype": f.dtype,
            "m": f.m,
            "n": f.n,
            "k": f.k,
            "a": operand(f.a),
            "b": operand(f.b),
            "c": operand(f.c),
            "when": px.to_json(f.when),
        }
        | ({"own": [list(x) for x in f.own]} if f.own else {})
        | ({"then": [list(x) for x in f.then]} if f.then else {})
        | ({"tf32": [list(x) for x in f.tf32]} if f.tf32 else {})
        | ({"joint": [list(x) for x in f.joint]} if f.joint else {})
    }


def _buffer_json(b: Buffer) -> dict:
    storage = {"kind": "block"}
    if b.window is not None:
        storage = {"kind": "window", "dim": b.window.dim, "size": b.window.size}
    if b.inner is not None:
        storage["inner"] = {"dim": b.inner.dim, "size": b.inner.size}
        if b.inner_outputs is not None:
            storage["inner"]["outputs"] = list(b.inner_outputs)
    if b.home is not None:
        storage["home"] = {"buffer": b.home.buffer, "at": [px.to_json(e) for e in b.home.at]}
    return {
        "id": b.id,
        "name": b.name,
        "dims": list(b.dims),
        "box": list(b.box),
        "outputs": [{"dtype": o.dtype, "shape": list(o.shape)} for o in b.outputs],
        "storage": storage,
        "donor": b.donor,
    }


def _statement_json(s: Statement) -> dict:
    return {
        "id": s.id,
        "dims": list(s.dims),
        "loops": list(s.loops),
        "vector": list(s.vector),
        "domain": px.to_json(s.domain),
        "nodes": [_node_json(n) for n in s.nodes],
    }


def _node_json(n: Node) -> dict:
    return {
        "id": n.id,
        "op": n.op,
        "attrs": {k: _value_json(v) for k, v in n.attrs},
        "types": [{"dtype": t.dtype, "shape": list(t.shape)} for t in n.types],
        "inputs": [
            {
                "src": r.src,
                "out": r.out,
                "stored": r.stored,
                "access": [
                    ["at", px.to_json(a.index)]
                    if isinstance(a, At)
                    else ["slice", px.to_json(a.lo), px.to_json(a.hi)]
                    for a in r.access
                ],
                "cond": None if r.cond is None else px.to_json(r.cond),
            }
            for r in n.inputs
        ],
        "where": list(n.where),
    }


def _value_json(v):
    if isinstance(v, Ix):
        return {"ix": px.to_json(v.expr)}
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}
    if isinstance(v, (tuple, list)):
        return [_value_json(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"a plan attribute cannot hold {type(v).__name__} {v!r}")


def _item_json(it) -> dict:
    if isinstance(it, Loop):
        return {
            "for": it.var,
            "init": px.to_json(it.init),
            "cond": px.to_json(it.cond),
            "inc": it.inc,
            "body": [_item_json(x) for x in it.body],
        }
    if isinstance(it, If):
        return {
            "if": px.to_json(it.cond),
            "then": [_item_json(x) for x in it.then],
            "else": [_item_json(x) for x in it.orelse],
        }
    if isinstance(it, Call):
        return {"call": it.statement, "args": [px.to_json(a) for a in it.args]}
    key = {Free: "free", SwapOut: "swap_out", SwapIn: "swap_in"}[type(it)]
    return {key: list(it.buffers)}


# ----------------------------------------------------------------------------- JSON in
def loads(text: str, where: str = "plan") -> Plan:
    """A plan from the text of ``plan.json``; ``PlanError`` if it is not a valid one."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise PlanError(f"{where} is not a valid plan: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, or an int too long to convert
        raise PlanError(f"{where} is not a valid plan: not JSON ({e})") from None
    return from_json(data, where)


def from_json(data, where: str = "plan") -> Plan:
    """A plan from decoded JSON, every field checked (see the module docstring)."""
    if not isinstance(data, dict) or "format_version" not in data:
        raise PlanError(f"{where} is not a timerlc plan (no format_version)")
    version = data["format_version"]
    if type(version) is not int or version != FORMAT_VERSION:  # 3.0 == 3 in Python
        raise PlanError(
            f"{where} has plan format {_short(version)}; this timerlc reads format "
            f"{FORMAT_VERSION}: compile the program again"
        )
    try:
        return _Reader(where).plan(data)
    except RecursionError:  # the checks below bound every depth; this is a last guard
        raise PlanError(f"{where} is not a valid plan: nested too deeply") from None


def _short(v) -> str:
    return px.clip(json.dumps(v) if not isinstance(v, str) else repr(v), 60)


class _Reader:
    """Reads a decoded plan field by field; ``self.path`` names the field being read."""

    def __init__(self, where: str):
        self.origin = where
        self.path: list[str] = []

    def fail(self, message: str):
        field = "".join(self.path).lstrip(".")
        at = f" at {field}" if field else ""
        raise PlanError(f"{self.origin} is not a valid plan{at}: {message}")

    # ------------------------------------------------------------ basic fields
    def obj(self, v, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
        if not isinstance(v, dict):
            self.fail(f"expected an object, got {_short(v)}")
        missing = [k for k in keys if k not in v]
        if missing:
            self.fail(f"missing {', '.join(missing)}")
        extra = sorted(set(v) - set(keys) - set(optional))
        if extra:
            self.fail(f"unknown field {_short(extra[0])}")
        return v

    def field(self, d: dict, key: str, read, *args, **kwargs):
        self.path.append(f".{key}")
        value = read(d[key], *args, **kwargs)
        self.path.pop()
        return value

    def each(self, v, read, *args, limit: int = MAX_ITEMS) -> tuple:
        if not isinstance(v, list):
            self.fail(f"expected a list, got {_short(v)}")
        if len(v) > limit:
            self.fail(f"a list of {len(v)} entries (at most {limit})")
        out = []
        for k, x in enumerate(v):
            self.path.append(f"[{k}]")
            out.append(read(x, *args))
            self.path.pop()
        return tuple(out)

    def int_(self, v, lo: int = 0, hi: int = MAX_EXTENT) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(f"expected an integer, got {_short(v)}")
        if not lo <= v <= hi:
            self.fail(f"{_short(v)} is out of range ({lo} to {hi})")
        return v

    def opt_int(self, v, lo: int = 0, hi: int = MAX_EXTENT) -> int | None:
        return None if v is None else self.int_(v, lo, hi)

    def bool_(self, v) -> bool:
        if not isinstance(v, bool):
            self.fail(f"expected true or false, got {_short(v)}")
        return v

    def text(self, v, limit: int = MAX_TEXT) -> str:
        if not isinstance(v, str):
            self.fail(f"expected a string, got {_short(v)}")
        if len(v) > limit:
            self.fail(f"a string of {len(v)} characters (at most {limit})")
        if not v.isprintable():
            self.fail(f"a string with control characters: {_short(v)}")
        return v

    def ident(self, v) -> str:
        self.text(v, MAX_NAME)
        if not _IDENT.match(v):
            self.fail(f"{_short(v)} is not a name")
        return v

    def name_in(self, v, names, what: str) -> str:
        if not isinstance(v, str) or v not in names:
            self.fail(f"{_short(v)} is not {what}")
        return v

    def names_in(self, v, names, what: str, order=None) -> tuple[str, ...]:
        out = self.each(v, self.name_in, names, what, limit=MAX_RANK)
        if len(set(out)) != len(out):
            self.fail(f"a name repeated in {list(out)}")
        if order is not None and list(out) != [d for d in order if d in out]:
            self.fail(f"{list(out)} is not in the order {list(order)}")
        return out

    def expr(self, v, names, kind: str = "int"):
        try:
            return px.check(v, names, kind)
        except px.ExprError as e:
            self.fail(str(e))

    # ------------------------------------------------------------ the plan
    def plan(self, d) -> Plan:
        keys = ("format_version", "source", "dims", "configs", "seed", "envs", "buffers")
        keys += ("statements", "tree", "outputs", "metrics", "memory")
        self.obj(d, keys, ("kernels",))
        dims = self.field(d, "dims", self.each, self.dim, limit=MAX_RANK * 4)
        names = [n for n, _ in dims]
        if len(set(names)) != len(names):
            self.fail("a dim is declared twice")
        self.dim_order = tuple(names)
        self.bounds = dict(dims)
        configs = self.field(d, "configs", self.each, self.config)
        envs = self.field(d, "envs", self.each, self.env, limit=256)
        buffers = self.field(d, "buffers", self.each, self.buffer)
        self.buffers = {}
        for k, b in enumerate(buffers):
            if b.id in self.buffers:
                self.path.append(f".buffers[{k}]")
                self.fail(f"buffer id {b.id} repeated")
            self.buffers[b.id] = b
        self.path.append(".buffers")
        donors = {b.donor for b in buffers if b.donor is not None}
        for b in buffers:
            if b.donor is not None and (b.donor not in self.buffers or b.donor == b.id):
                self.fail(f"buffer {b.id} takes the memory of {b.donor}, not another buffer")
            if b.home is not None:
                self._check_home(b, donors)
        self.path.pop()
        statements = self.field(d, "statements", self.each, self.statement)
        if {s.id for s in statements} != set(self.buffers) or len(statements) != len(buffers):
            self.path.append(".statements")
            self.fail("the statements and the buffers do not match one to one")
        self.statements = {s.id: s for s in statements}
        self.path.append(".statements")
        for s in statements:  # every stored read names a statement that exists
            for n in s.nodes:
                for r in n.inputs:
                    self._check_stored(s, n, r)
        self.path.pop()
        self.depth = 0
        tree = self.field(d, "tree", self.items, (), True)
        outputs = self.field(d, "outputs", self.each, self.tensor, "an output")
        metrics = self.field(d, "metrics", self.each, self.tensor, "a metric")
        for what, rows in (("outputs", outputs), ("metrics", metrics)):
            if len({r[0] for r in rows}) != len(rows):
                self.path.append(f".{what}")
                self.fail("a tensor named twice")
        memory = self.field(d, "memory", self.memory)
        item = memory["memory_floor_item"]
        if item is not None and not (item < len(tree) and isinstance(tree[item], (Loop, Call))):
            self.path.append(".memory.floor_item")
            self.fail(f"item {item} of the tree is not a loop or a call")
        for b in buffers:  # every buffer is on the device during some item of the tree
            if b.nbytes > memory["memory_peak_unswapped"]:
                self.path.append(".memory.peak_unswapped")
                self.fail(f"buffer {b.id} alone takes {b.nbytes} bytes, more than the peak")
        return Plan(
            source=self.field(d, "source", self.text),
            dims=dims,
            configs=configs,
            seed=self.field(d, "seed", self.int_, -(1 << 63), (1 << 64) - 1),
            envs=envs,
            buffers=buffers,
            statements=statements,
            tree=tree,
            outputs=outputs,
            metrics=metrics,
            **memory,
            kernels=self.field(d, "kernels", self.kernels, tree) if "kernels" in d else None,
        )

    def kernels(self, v, tree: tuple) -> Kernels:
        d = self.obj(
            v,
            ("file", "sha256", "statements", "trees"),
            ("fused", "launches", "unfailing", "fused_launches", "loops", "covered", "row_loops"),
        )
        file = self.field(d, "file", self.text, 200)
        if not _KERNEL_FILE.match(file):
            self.path.append(".file")
            self.fail(f"{_short(file)} is not a file kernels/NAME.ll or kernels/NAME.cu")
        sha = self.field(d, "sha256", self.text, 64)
        if not _SHA256.match(sha):
            self.path.append(".sha256")
            self.fail(f"{_short(sha)} is not a SHA-256 in hex")
        rows = self.field(d, "statements", self.each, self.kernel_row)
        trees = self.field(d, "trees", self.each, self.tree_row, tree)
        for what, got in (("statements", rows), ("trees", trees)):
            if len({r[0] for r in got}) != len(got):
                self.path.append(f".{what}")
                self.fail("an entry named twice")
        if len({r[1] for r in rows + trees}) != len(rows) + len(trees):
            self.fail("a function named twice")
        fused = self.field(d, "fused", self.each, self.fused_row) if "fused" in d else ()
        if file.endswith(".cu") and trees:
            # the device runtime launches the statements' kernels itself (docs/cuda.md)
            self.path.append(".trees")
            self.fail("a CUDA kernel file has no tree functions")
        with_kernel = {r[0] for r in rows}
        for k, f in enumerate(fused):
            if not set(f) <= with_kernel:
                self.path.append(f".fused[{k}]")
                self.fail("a statement without a kernel in a fused kernel")
            if file.endswith(".cu") and len({len(self.statements[s].loops) for s in f}) != 1:
                self.path.append(f".fused[{k}]")
                self.fail("statements with different numbers of loop dims in a fused kernel")
        fused_launches = ()
        if file.endswith(".cu") and fused:
            if "fused_launches" not in d:
                self.fail("a CUDA kernel file's plan with fused kernels has no 'fused_launches'")
            got = self.field(d, "fused_launches", self.each, lambda r: r)
            if len(got) != len(fused):
                self.path.append(".fused_launches")
                self.fail("not one entry per fused kernel of 'fused', in their order")
            out = []
            for k, (row, f) in enumerate(zip(got, fused)):
                self.path.append(f".fused_launches[{k}]")
                out.append(self.fused_launch_row(row, self.statements[f[0]].loops))
                self.path.pop()
            fused_launches = tuple(out)
        elif "fused_launches" in d:
            self.path.append(".fused_launches")
            self.fail("only a CUDA kernel file's plan with fused kernels has fused_launches")
        launches, repeats = (), ()
        if file.endswith(".cu"):
            if "launches" not in d:
                self.fail("a CUDA kernel file's plan has no 'launches'")
            rows3 = self.field(d, "launches", self.each, self.launch_row)
            launches = tuple((sid, phases) for sid, phases, _ in rows3)
            repeats = tuple((sid, n) for sid, _, n in rows3 if n > 1)
            functions = {r[0]: r[1] for r in rows}
            if [r[0] for r in launches] != [r[0] for r in rows]:
                self.path.append(".launches")
                self.fail("not one entry per statement of 'statements', in their order")
            names = [
                g[0]
                for _, phases in launches + fused_launches
                for f in phases
                for g in (f.functions + f.tf32 if isinstance(f, ChainCall) else (f,))
                if isinstance(g, tuple)
            ]
            if len(set(names)) != len(names):
                self.path.append(".launches")
                self.fail("a function named twice")
            for k, (sid, phases) in enumerate(launches):
                fns = [f[0] for f in phases if isinstance(f, tuple)]
                if fns and fns[0] != functions[sid]:
                    self.path.append(f".launches[{k}]")
                    self.fail(f"the first function launched is not the kernel of statement {sid}")
        elif "launches" in d:
            self.path.append(".launches")
            self.fail("only a CUDA kernel file's plan has launches")
        unfailing = self.cuda_statements(d, file, "unfailing", with_kernel, "with a kernel")
        loops = ()
        if "loops" in d:
            if not file.endswith(".cu"):
                self.path.append(".loops")
                self.fail("only a CUDA kernel file's plan has loop kernels")
            loops = self.field(d, "loops", self.each, self.loop_row, with_kernel)
        in_fused = {s for f in fused for s in f}
        covered = self.cuda_statements(d, file, "covered", in_fused, "of fused kernels")
        row_loops = ()
        if "row_loops" in d:
            if file.endswith(".cu"):
                self.path.append(".row_loops")
                self.fail("only an LLVM kernel file's plan has row loops")
            row_loops = self.field(d, "row_loops", self.each, self.row_loop_row, with_kernel)
        return Kernels(
            file,
            sha,
            rows,
            trees,
            fused,
            launches,
            unfailing,
            repeats,
            fused_launches,
            loops,
            covered,
            row_loops,
        )

    def cuda_statements(self, d: dict, file: str, key: str, allowed: set, which: str) -> tuple:
        """``d[key]`` (() where absent): distinct statements among ``allowed`` (``which``
        says what they are, in the refusal), in a CUDA kernel file's plan only."""
        if key not in d:
            return ()
        if not file.endswith(".cu"):
            self.path.append(f".{key}")
            self.fail(f"only a CUDA kernel file's plan has {key} kernels")
        got = self.field(d, key, self.each, self.int_)
        if not set(got) <= allowed or len(set(got)) != len(got):
            self.path.append(f".{key}")
            self.fail(f"not distinct statements {which}")
        return got

    def loop_row(self, v, with_kernel: set) -> tuple[tuple[int, ...], int, int]:
        """``[[statement, ...], blocks, scratch bytes]``: a loop kernel (cuda/loops.py)."""
        if not isinstance(v, list) or len(v) != 3 or not isinstance(v[0], list) or not v[0]:
            self.fail(f"expected [[statement, ...], blocks, scratch bytes], got {_short(v)}")
        self.path.append("[0]")
        sids = tuple(self.each(v[0], self.int_))
        if not set(sids) <= with_kernel:
            self.fail("a statement without a kernel in a loop kernel")
        self.path[-1] = "[1]"
        blocks = self.int_(v[1], 1, MAX_LOOP_BLOCKS)
        self.path[-1] = "[2]"
        scratch = self.int_(v[2], 0, MAX_LOOP_SCRATCH)
        self.path.pop()
        return sids, blocks, scratch

    def launch_row(self, v) -> tuple[int, tuple[tuple[str, int], ...], int]:
        if not isinstance(v, list) or len(v) not in (2, 3) or not isinstance(v[1], list):
            self.fail(
                f"expected [statement, [[function, threads], ...]] (and the times a call "
                f"runs them), got {_short(v)}"
            )
        sid = self.int_(v[0])
        if sid not in self.statements:
            self.fail(f"statement {sid} does not exist")
        repeat = 1
        if len(v) == 3:
            self.path.append("[2]")
            repeat = self.int_(v[2], 2, MAX_REPEAT)
            self.path.pop()
        loops = launch_loops(self.statements[sid].loops, repeat > 1)
        return sid, self.phases(v[1], loops), repeat

    def phases(self, v: list, loops: tuple) -> tuple:
        """A call's steps, one after another: ``[function, threads]`` or a product for the
        device's BLAS (``{"gemm": ...}``, its expressions over ``loops``)."""
        if not 1 <= len(v) <= MAX_PHASES:
            self.fail(f"expected 1 to {MAX_PHASES} launches, got {len(v)}")
        phases = []
        for q, f in enumerate(v):
            if isinstance(f, dict) and "chain" in f:
                self.path.append(f"[{q}]")
                phases.append(self.chain_call(f))
                self.path.pop()
                continue
            if isinstance(f, dict):
                phases.append(self.gemm_call(f, loops))
                continue
            if not isinstance(f, list) or len(f) != 2:
                self.fail(
                    f"expected [function, threads], {{'gemm': ...}} or {{'chain': ...}}, got "
                    f"{_short(f)}"
                )
            phases.append((self.ident(f[0]), self.int_(f[1], 1, MAX_THREADS)))
        ends: list[int] = []  # (the launches a chain stands for: after it, of the call, all
        for q, f in enumerate(phases):  # of them inside each chain it is inside of)
            while ends and q >= ends[-1]:
                ends.pop()
            if not isinstance(f, ChainCall):
                continue
            if q + f.covers >= len(phases) or ends and q + f.covers >= ends[-1]:
                self.path.append(f"[{q}].chain.covers")
                self.fail(
                    f"a chain stands for {f.covers} launches after it, where the call has "
                    f"{len(phases) - q - 1}, or past the end of a chain's it is inside of"
                )
            ends.append(q + f.covers + 1)
        for q, f in enumerate(phases):  # (a product's joint functions make the next one's)
            if not (isinstance(f, GemmCall) and f.joint):
                continue
            after = phases[q + 1] if q + 1 < len(phases) else None
            if any(  # (both among a chain's launches, or neither)
                isinstance(c, ChainCall) and (x < q <= x + c.covers) != (x < q + 1 <= x + c.covers)
                for x, c in enumerate(phases)
            ):
                self.path.append(f"[{q}].gemm.joint")
                self.fail("joint functions whose two products a chain's launches part")
            if not (isinstance(after, GemmCall) and after.tf32) or after.joint:
                self.path.append(f"[{q}].gemm.joint")
                self.fail(
                    "joint functions make the next launch's product too, which is not a "
                    "product with TF32 functions of ours (and no joint functions of its own)"
                )
        return tuple(phases)

    def chain_call(self, v) -> ChainCall:
        d = self.field(
            self.obj(v, ("chain",)),
            "chain",
            self.obj,
            ("functions", "covers"),
            ("tf32", "shared", "tf32_shared"),
        )
        functions = self.functions(d, "functions")  # (1 to MAX_PHASES of them)
        covers = self.field(d, "covers", self.int_, 1, MAX_PHASES)
        tf32 = self.functions(d, "tf32")
        if tf32 and len(tf32) != len(functions):
            self.path.append(".chain.tf32")
            self.fail(f"{len(tf32)} TF32 functions for {len(functions)}")
        shared, tf32_shared = (
            self.field(d, key, self.int_, 0, MAX_DYNAMIC_SHARED) if key in d else 0
            for key in ("shared", "tf32_shared")
        )
        if tf32_shared and not tf32:
            self.path.append(".chain.tf32_shared")
            self.fail("dynamic shared memory for TF32 functions the chain has none of")
        return ChainCall(functions, covers, tf32, shared, tf32_shared)

    def fused_launch_row(self, v, loops: tuple) -> tuple[int, tuple]:
        """``[scratch bytes, [[function, threads] | {gemm}, ...]]`` of a fused kernel whose
        calls see ``loops``."""
        if not isinstance(v, list) or len(v) != 2 or not isinstance(v[1], list):
            self.fail(f"expected [scratch bytes, [[function, threads], ...]], got {_short(v)}")
        scratch = self.int_(v[0], 0, MAX_SCRATCH)
        return scratch, self.phases(v[1], tuple(loops))

    def gemm_call(self, v, loops: tuple) -> GemmCall:
        d = self.field(
            self.obj(v, ("gemm",)),
            "gemm",
            self.obj,
            GEMM_KEYS,
            ("own", "then", "tf32", "joint"),
        )
        dtype = self.field(d, "dtype", self.text, 8)
        if dtype not in ("f32", "f64"):
            self.path.append(".dtype")
            self.fail(f"{_short(dtype)} is not f32 or f64")
        m, n, k = (self.field(d, key, self.int_, 1, MAX_EXTENT) for key in ("m", "n", "k"))
        a = self.field(d, "a", self.operand, loops, (k, m), (m, k))
        b = self.field(d, "b", self.operand, loops, (n, k), (k, n))
        c = self.field(d, "c", self.operand, loops, None, (m, n))
        when = self.field(d, "when", self.expr, loops, "bool")
        own, then = self.functions(d, "own"), self.functions(d, "then")
        tf32, joint = self.functions(d, "tf32"), self.functions(d, "joint")
        for key, got in (("then", then), ("tf32", tf32)):
            if got and not own:
                self.path.append(f".{key}")
                self.fail(f"{key} functions where the product has none of ours")
        if tf32 and len(tf32) != len(own):
            self.path.append(".tf32")
            self.fail(f"{len(tf32)} TF32 functions for {len(own)} of ours")
        if joint and not tf32:
            self.path.append(".joint")
            self.fail("joint functions where the product has no TF32 functions of ours")
        return GemmCall(dtype, m, n, k, a, b, c, when, own, then, tf32, joint)

    def functions(self, d: dict, key: str) -> tuple:
        """A product's optional list of ``[function, threads]`` (``own``, ``then``)."""
        if key not in d:
            return ()
        self.path.append(f".{key}")
        v = d[key]
        if not isinstance(v, list) or not 1 <= len(v) <= MAX_PHASES:
            self.fail(f"expected 1 to {MAX_PHASES} [function, threads], got {_short(v)}")
        for f in v:
            if not isinstance(f, list) or len(f) != 2:
                self.fail(f"expected [function, threads], got {_short(f)}")
        out = tuple((self.ident(f[0]), self.int_(f[1], 1, MAX_THREADS)) for f in v)
        self.path.pop()
        return out

    def operand(self, v, loops: tuple, transposed, plain) -> Operand:
        d = self.obj(v, ("in", "at", "offset", "ld", "t"))
        space = self.field(d, "in", self.text, 16)
        if space not in ("table", "scratch"):
            self.path.append(".in")
            self.fail(f"{_short(space)} is not 'table' or 'scratch'")
        at = self.field(d, "at", self.int_, 0, MAX_SCRATCH)
        offset = self.field(d, "offset", self.expr, loops)
        t = self.field(d, "t", self.bool_)
        if t and transposed is None:
            self.path.append(".t")
            self.fail("the product is not stored transposed")
        _, cols = transposed if t else plain
        ld = self.field(d, "ld", self.int_, 1, MAX_EXTENT)
        if ld < cols:
            self.path.append(".ld")
            self.fail(f"rows {ld} elements apart hold {cols} elements")
        return Operand(space, at, offset, ld, t)

    def fused_row(self, v) -> tuple[int, ...]:
        return self._sids(v, 2, self.statements, "does not exist")

    def row_loop_row(self, v, with_kernel: set) -> tuple[int, ...]:
        return self._sids(v, 1, with_kernel, "has no kernel")

    def _sids(self, v, least: int, known, missing: str) -> tuple[int, ...]:
        """A list of at least ``least`` statements, each in ``known`` (else the statement
        ``missing``), none twice."""
        if not isinstance(v, list) or len(v) < least:
            what = (
                "a list of statements" if least == 1 else f"a list of at least {least} statements"
            )
            self.fail(f"expected {what}, got {_short(v)}")
        sids = tuple(self.int_(s) for s in v)
        for sid in sids:
            if sid not in known:
                self.fail(f"statement {sid} {missing}")
        if len(set(sids)) != len(sids):
            self.fail("a statement named twice")
        return sids

    def tree_row(self, v, tree: tuple) -> tuple[int, str, int]:
        if not isinstance(v, list) or len(v) != 3:
            self.fail(f"expected [item, function, scratch bytes], got {_short(v)}")
        item = self.int_(v[0], 0, len(tree) - 1)
        if isinstance(tree[item], (Free, SwapIn, SwapOut)):
            self.fail(f"item {item} of the tree is a free or a swap")
        return item, self.ident(v[1]), self.int_(v[2], 0, MAX_SCRATCH)

    def kernel_row(self, v) -> tuple[int, str, int]:
        if not isinstance(v, list) or len(v) != 3:
            self.fail(f"expected [statement, function, scratch bytes], got {_short(v)}")
        sid = self.int_(v[0])
        if sid not in self.statements:
            self.fail(f"statement {sid} does not exist")
        name = self.ident(v[1])
        return sid, name, self.int_(v[2], 0, MAX_SCRATCH)

    def dim(self, v) -> tuple[str, int]:
        if not isinstance(v, list) or len(v) != 2:
            self.fail(f"expected [name, bound], got {_short(v)}")
        return self.ident(v[0]), self.int_(v[1])

    def config(self, v) -> tuple[str, Any]:
        if not isinstance(v, list) or len(v) != 2:
            self.fail(f"expected [name, value], got {_short(v)}")
        value = v[1]
        if isinstance(value, dict):
            value = self.special_float(value)
        elif not isinstance(value, (bool, int, float)):
            self.fail(f"a config value must be a number or a bool, got {_short(value)}")
        return self.ident(v[0]), value

    def env(self, v) -> Env:
        d = self.obj(v, ("name", "spec", "batch", "num_envs"))
        batch = self.field(d, "batch", self.name_in, self.bounds, "a dim of the plan")
        env = Env(
            self.field(d, "name", self.ident),
            self.field(d, "spec", self.text),
            batch,
            self.field(d, "num_envs", self.int_),
        )
        if env.num_envs != self.bounds[batch]:
            self.fail(f"num_envs {env.num_envs} is not the bound of {batch}")
        return env

    def output(self, v) -> Output:
        d = self.obj(v, ("dtype", "shape"))
        dtype = self.field(d, "dtype", self.name_in, DTYPES, "a dtype")
        shape = self.field(d, "shape", self.shape)
        return Output(dtype, shape)

    def shape(self, v) -> tuple[int, ...]:
        shape = self.each(v, self.int_, limit=MAX_RANK)
        if math.prod(shape) > MAX_ELEMENTS:
            self.fail(f"a shape of {math.prod(shape)} elements (at most {MAX_ELEMENTS})")
        return shape

    def _check_home(self, b: Buffer, donors: set[int]):
        """A buffer in another's memory: the home a ring buffer of one slot along its only
        dim, with one output, in no other memory itself; the buffer a ring buffer of one
        slot along the same dim, its only one, or a block of no dims, with the same output;
        neither a donor's memory nor a donor (``donors``: the plan's)."""
        h = self.buffers.get(b.home.buffer)
        what = f"buffer {b.id} lives in the memory of buffer {b.home.buffer}"
        if h is None or h.id == b.id:
            self.fail(f"{what}, not another buffer")
        for x in (h, b) if b.window is not None else (h,):
            if x.window is None or x.window.size != 1 or x.inner is not None:
                self.fail(f"{what}: buffer {x.id} is not a ring buffer of one slot")
            if x.dims != (h.window.dim,):
                self.fail(f"{what}: buffer {x.id} has dims other than {h.window.dim}")
        if b.window is None and b.dims:
            self.fail(f"{what}: a block over dims {', '.join(b.dims)}")
        if h.home is not None or h.outputs != b.outputs or len(b.outputs) != 1:
            self.fail(f"{what}, which has other outputs or lives in another's memory")
        if b.donor is not None or h.donor is not None or {b.id, h.id} & donors:
            self.fail(f"{what}: one of them takes or gives a donor's memory")

    def buffer(self, v) -> Buffer:
        d = self.obj(v, ("id", "name", "dims", "box", "outputs", "storage", "donor"))
        dims = self.field(d, "dims", self.names_in, self.bounds, "a dim", self.dim_order)
        box = self.field(d, "box", self.each, self.int_, limit=MAX_RANK)
        if len(box) != len(dims):
            self.fail(f"a box of {len(box)} extents for {len(dims)} dims")
        outputs = self.field(d, "outputs", self.each, self.output, limit=8)
        if not outputs:
            self.fail("a buffer with no outputs")
        storage = self.obj(d["storage"], ("kind",), ("dim", "size", "inner", "home"))
        window = inner = inner_outputs = home = None
        self.path.append(".storage")
        if "home" in storage:
            self.path.append(".home")
            h = self.obj(storage["home"], ("buffer", "at"))
            home = Home(
                self.field(h, "buffer", self.int_),
                self.field(h, "at", self.each, self.expr, set(dims), limit=1),
            )
            if len(home.at) != 1:
                self.fail("expected one index (a home has one dim)")
            self.path.pop()
        if storage["kind"] == "window":
            self.obj(storage, ("kind", "dim", "size"), ("inner", "home"))
            dim = self.field(storage, "dim", self.name_in, dims, "a dim of the buffer")
            size = self.field(storage, "size", self.int_, 1)
            window = Window(dim, size)
            if "inner" in storage:
                self.path.append(".inner")
                w = self.obj(storage["inner"], ("dim", "size"), ("outputs",))
                other = tuple(x for x in dims if x != dim)
                inner = Window(
                    self.field(w, "dim", self.name_in, other, "another dim of the buffer"),
                    self.field(w, "size", self.int_, 1),
                )
                if "outputs" in w:
                    inner_outputs = self.field(w, "outputs", self.each, self.int_, limit=8)
                    if not inner_outputs or list(inner_outputs) != sorted(set(inner_outputs)):
                        self.fail(f"outputs {_short(w['outputs'])}: not increasing numbers")
                    if inner_outputs[-1] >= len(outputs):
                        self.fail(f"output {inner_outputs[-1]} of {len(outputs)} outputs")
                self.path.pop()
        elif storage["kind"] != "block" or len(storage) != 1 + (home is not None):
            self.fail(f"unknown storage {_short(storage)}")
        self.path.pop()
        b = Buffer(
            self.field(d, "id", self.int_),
            self.field(d, "name", self.opt_name),
            dims,
            box,
            outputs,
            window,
            self.field(d, "donor", self.opt_int),
            inner,
            inner_outputs,
            home,
        )
        for k, o in enumerate(outputs):
            if math.prod(b.extents(k)) * math.prod(o.shape) > MAX_ELEMENTS:
                self.fail(f"a buffer of more than {MAX_ELEMENTS} elements")
        return b

    def opt_name(self, v) -> str | None:
        return None if v is None else self.text(v, MAX_NAME)

    # ------------------------------------------------------------ statements
    def statement(self, v) -> Statement:
        d = self.obj(v, ("id", "dims", "loops", "vector", "domain", "nodes"))
        sid = self.field(d, "id", self.int_)
        if sid not in self.buffers:
            self.fail(f"statement {sid} has no buffer")
        dims = self.field(d, "dims", self.names_in, self.bounds, "a dim", self.dim_order)
        if dims != self.buffers[sid].dims:
            self.fail(f"dims {list(dims)} are not those of buffer {sid}")
        loops = self.field(d, "loops", self.names_in, dims, "a dim of the statement", dims)
        vector = self.field(d, "vector", self.names_in, dims, "a dim of the statement", dims)
        if set(loops) & set(vector) or set(loops) | set(vector) != set(dims):
            self.fail("loops and vector do not split the statement's dims")
        domain = self.field(d, "domain", self.expr, dims, "bool")
        self.nodes: dict[int, Node] = {}
        self.dims = dims
        nodes = self.field(d, "nodes", self.each, self.node)
        if not nodes or nodes[-1].id != sid:
            self.fail(f"the last node of statement {sid} is not node {sid}")
        out = self.buffers[sid].outputs
        if nodes[-1].types != out:
            self.fail(f"the outputs of node {sid} are not those of its buffer")
        return Statement(sid, dims, loops, vector, domain, nodes)

    def node(self, v) -> Node:
        d = self.obj(v, ("id", "op", "attrs", "types", "inputs", "where"))
        nid = self.field(d, "id", self.int_)
        if nid in self.nodes:
            self.fail(f"node id {nid} repeated in the statement")
        op = self.field(d, "op", self.ident)
        attrs = self.field(d, "attrs", self.attrs)
        types = self.field(d, "types", self.each, self.output, limit=8)
        if not types:
            self.fail("a node with no outputs")
        inputs = self.field(d, "inputs", self.each, self.read, limit=4096)
        where = self.field(d, "where", self.where)
        node = Node(nid, op, attrs, types, inputs, where)
        self.nodes[nid] = node
        return node

    def attrs(self, v) -> tuple[tuple[str, Any], ...]:
        if not isinstance(v, dict):
            self.fail(f"expected an object, got {_short(v)}")
        if len(v) > 32:
            self.fail(f"{len(v)} attributes")
        out = []
        for k in sorted(v):
            self.ident(k)  # before it names the field: a corrupt key can be any text
            self.path.append(f".{k}")
            out.append((k, self.value(v[k], 0)))
            self.path.pop()
        return tuple(out)

    def value(self, v, depth: int):
        """An attribute's value: null, a bool, an int, a finite float, a string, a list
        (a tuple), ``{"ix": E}`` (an index expression over the statement's dims) or
        ``{"float": "inf" | "-inf" | "nan"}``."""
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, int):
            return self.int_(v, -(1 << 63), (1 << 64) - 1)
        if isinstance(v, float):
            return v
        if isinstance(v, str):
            return self.text(v, MAX_NAME)
        if isinstance(v, list):
            if depth >= 4:
                self.fail("an attribute nested too deeply")
            return self.each(v, self.value, depth + 1, limit=1 << 16)
        if isinstance(v, dict) and set(v) == {"ix"}:
            return Ix(self.expr(v["ix"], self.dims))
        if isinstance(v, dict):
            return self.special_float(v)
        self.fail(f"not an attribute value: {_short(v)}")

    def special_float(self, v: dict) -> float:
        if set(v) != {"float"} or v["float"] not in ("inf", "-inf", "nan"):
            self.fail(f"not a value: {_short(v)}")
        return float(v["float"])

    def where(self, v) -> tuple[str, int | None]:
        if not isinstance(v, list) or len(v) != 2:
            self.fail(f"expected [tensor, line], got {_short(v)}")
        return self.text(v[0], MAX_NAME), self.opt_int(v[1], 1)

    def read(self, v) -> Read:
        d = self.obj(v, ("src", "out", "stored", "access", "cond"))
        src = self.field(d, "src", self.int_)
        out = self.field(d, "out", self.int_, 0, 7)
        stored = self.field(d, "stored", self.bool_)
        access = self.field(d, "access", self.each, self.access, limit=MAX_RANK)
        cond = None
        if d["cond"] is not None:
            cond = self.field(d, "cond", self.expr, self.dims, "bool")
        if not stored:
            # an inlined node: an earlier node of the statement, at the same point
            if src not in self.nodes:
                self.fail(f"node {src} is not an earlier node of the statement")
            if out >= len(self.nodes[src].types):
                self.fail(f"node {src} has no output {out}")
            if access != tuple(At(d) for d in self.dims):
                self.fail("a read of an inlined node is at the same point")
        return Read(src, out, stored, access, cond)

    def access(self, v) -> At | Slice:
        if isinstance(v, list) and len(v) == 2 and v[0] == "at":
            return At(self.expr(v[1], self.dims))
        if isinstance(v, list) and len(v) == 3 and v[0] == "slice":
            return Slice(self.expr(v[1], self.dims), self.expr(v[2], self.dims))
        self.fail(f'expected ["at", E] or ["slice", LO, HI], got {_short(v)}')

    def _check_stored(self, s: Statement, n: Node, r: Read):
        if not r.stored:
            return
        b = self.buffers.get(r.src)
        where = f"node {n.id} of statement {s.id}"
        if b is None:
            self.fail(f"{where} reads buffer {r.src}, which does not exist")
        if r.out >= len(b.outputs):
            self.fail(
                f"{where} reads output {r.out} of buffer {r.src}, which has {len(b.outputs)}"
            )
        if len(r.access) != len(b.dims):
            self.fail(
                f"{where} reads buffer {r.src} with {len(r.access)} indices for {len(b.dims)} dims"
            )

    # ------------------------------------------------------------ the loop tree
    def items(self, v, scope: tuple[str, ...], top: bool) -> tuple:
        self.depth += 1
        if self.depth > MAX_TREE_DEPTH:
            self.fail(f"a loop tree nested more than {MAX_TREE_DEPTH} deep")
        out = self.each(v, self.item, scope, top)
        self.depth -= 1
        return out

    def item(self, v, scope: tuple[str, ...], top: bool):
        if not isinstance(v, dict):
            self.fail(f"expected a loop tree item, got {_short(v)}")
        if "for" in v:
            d = self.obj(v, ("for", "init", "cond", "inc", "body"))
            var = self.field(d, "for", self.ident)
            if var in scope or var in self.bounds:
                self.fail(f"the loop variable {var} hides another name")
            init = self.field(d, "init", self.expr, scope)
            cond = self.field(d, "cond", self.expr, scope + (var,), "bool")
            inc = self.field(d, "inc", self.int_, -MAX_EXTENT, MAX_EXTENT)
            if inc == 0:
                self.fail("a loop that does not advance (inc 0)")
            body = self.field(d, "body", self.items, scope + (var,), False)
            return Loop(var, init, cond, inc, body)
        if "if" in v:
            d = self.obj(v, ("if", "then", "else"))
            cond = self.field(d, "if", self.expr, scope, "bool")
            then = self.field(d, "then", self.items, scope, False)
            orelse = self.field(d, "else", self.items, scope, False)
            return If(cond, then, orelse)
        if "call" in v:
            d = self.obj(v, ("call", "args"))
            sid = self.field(d, "call", self.int_)
            if sid not in self.statements:
                self.fail(f"a call of statement {sid}, which does not exist")
            args = self.field(d, "args", self.each, self.expr, scope, limit=MAX_RANK)
            if len(args) != len(self.statements[sid].loops):
                self.fail(
                    f"statement {sid} has {len(self.statements[sid].loops)} loop dims, "
                    f"the call gives {len(args)} values"
                )
            return Call(sid, args)
        for key, kind in (("free", Free), ("swap_out", SwapOut), ("swap_in", SwapIn)):
            if key in v:
                d = self.obj(v, (key,))
                if not top:
                    self.fail(f"a {key} item inside a loop or an if (only at the top level)")
                sids = self.field(d, key, self.each, self.int_)
                unknown = [s for s in sids if s not in self.buffers]
                if unknown:
                    self.fail(f"buffer {unknown[0]} does not exist")
                homed = [s for s in sids if self.buffers[s].home is not None]
                if homed:
                    home = self.buffers[homed[0]].home.buffer
                    self.fail(f"buffer {homed[0]} lives in the memory of buffer {home}")
                return kind(sids)
        self.fail(f"unknown loop tree item with fields {_short(sorted(v))}")

    def tensor(self, v, what: str) -> tuple[str, int, int]:
        if not isinstance(v, list) or len(v) != 3:
            self.fail(f"expected [tensor, statement, output], got {_short(v)}")
        name = self.text(v[0], MAX_NAME)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name):
            self.fail(f"{_short(name)} is not a tensor name")
        sid, out = self.int_(v[1]), self.int_(v[2], 0, 7)
        if sid not in self.buffers or out >= len(self.buffers[sid].outputs):
            self.fail(f"{what} {name} names buffer {sid} output {out}, which does not exist")
        return name, sid, out

    def memory(self, v) -> dict:
        d = self.obj(
            v, ("budget", "budget_met", "peak", "peak_unswapped"), ("floor_item", "floor")
        )
        big = 1 << 62
        met = None if d["budget_met"] is None else self.field(d, "budget_met", self.bool_)
        floor = self.field(d, "floor", self.each, self.int_) if "floor" in d else ()
        for sid in floor:
            if sid not in self.buffers:
                self.fail(f"memory.floor names buffer {sid}, which does not exist")
        return {
            "memory_budget": self.field(d, "budget", self.opt_int, 0, big),
            "memory_budget_met": met,
            "memory_peak": self.field(d, "peak", self.int_, 0, big),
            "memory_peak_unswapped": self.field(d, "peak_unswapped", self.int_, 0, big),
            "memory_floor_item": (
                self.field(d, "floor_item", self.opt_int, 0, MAX_ITEMS)
                if "floor_item" in d
                else None
            ),
            "memory_floor": floor,
        }
