"""The cpu runtime: runs a plan with NumPy kernels.

Everything a step needs is prepared when the plan is loaded: each statement's points,
grouped by the values of its loop dims (each group is one *batch*: the points of its vector
dims, as coordinate arrays), the compiled index functions of every read, and the loop tree
as nested Python closures. A call of a statement then gathers its reads with NumPy fancy
indexing (a read that does not depend on the vector dims is gathered once and broadcast),
runs its nodes as batched kernels (``ops.run_prepared``) and scatters the result into
the statement's buffer. Most statements are *uniform*: their vector dims cover the same box
at every loop point (the acting step over all of ``b``, a loss over all of ``b`` and ``t``);
one template batch then serves every call, and reads whose indices are loop expressions or
the vector dims themselves, and the writes, are NumPy views (basic indexing), not gathers.

Buffers follow the plan's memory plan: a buffer is allocated (zeros, so the points a
statement does not define read 0, as in the reference) when it is first written or read,
takes the memory of its ``donor`` instead if the plan gives one (after the statement's values
are computed), is indexed modulo its size along the dim of a ``window``, and is dropped at a
``free`` item of the tree. ``peak_bytes`` is the most memory the buffers held at once.
Under a memory budget the plan also has ``swap_out`` items (a buffer's arrays are copied into
a host pool, kept apart from the device buffers, and dropped, so ``live_bytes`` goes down)
and ``swap_in`` items (copied back before the next use); a read or a write of a buffer while
it is swapped out is an internal error.
"""

from __future__ import annotations

import ctypes
import math
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from timerlc import deepstack, ops
from timerlc.diagnostics import RunError
from timerlc.plan import expr as px
from timerlc.plan.items import MAX_TREE_DEPTH as _MAX_DEPTH
from timerlc.plan.items import (
    DTYPES,
    At,
    Call,
    Free,
    If,
    Loop,
    Plan,
    PlanError,
    Read,
    Slice,
    Statement,
    SwapIn,
    SwapOut,
    walk,
)
from timerlc.runtime.envs import EnvRunner

MetricSink = Callable[[str, dict, float], None]


@dataclass
class _Batch:
    coords: dict[str, np.ndarray]  # every dim of the statement: (n,) int64
    n: int
    branches: list | None  # merges: per input, the positions (into the batch) it defines
    where: tuple = ()  # the indices of the batch's points in the statement's buffer
    # a batch of a statement whose vector dims cover the same box at every loop point: the
    # loop dims' values (by name, vector dims 0) for the reads' basic indexing, else None
    scalars: list | None = None


class _LoopCoords(dict):
    """The coordinates of a uniform batch: the vector dims' from the template; a loop dim's
    (its value repeated n times) made only when something asks for it."""

    __slots__ = ("loop_values", "n")

    def __missing__(self, d: str) -> np.ndarray:
        v = self[d] = np.full(self.n, self.loop_values[d], np.int64)
        return v


class _PointOf:
    """A node's point for a kernel (``ops.kernel.Ctx`` asks for it only if the op needs it)."""

    __slots__ = ("coords", "dims")

    def __init__(self, coords, dims):
        self.coords, self.dims = coords, dims

    def items(self):
        return ((d, self.coords[d]) for d in self.dims)


class _OpFailed(Exception):
    """An op raised on a batch; the statement turns it into a RunError naming the point."""

    def __init__(self, where, error: Exception):
        self.what, self.line = where
        self.message = str(error)

    def error(self, point: str) -> RunError:
        at = f" at {point}" if point else ""
        line = f" (line {self.line})" if self.line is not None else ""
        return RunError(f"while computing {self.what}{at}{line}: {self.message}")


class _Read:
    """One input of a node, prepared: where it reads (a buffer, or a node of the same
    statement) and its index functions."""

    def __init__(self, read: Read, dims: tuple[str, ...], vector: set[str], plan: Plan):
        self.src = read.src
        self.out = read.out
        self.stored = read.stored
        self.window = _window(plan, self.src, self.out) if self.stored else None
        self.parts = []
        self.broadcast = True  # reads the same points for every point of the batch
        for a in read.access:
            exprs = (a.index,) if isinstance(a, At) else (a.lo, a.hi)
            if any(px.names(e) & vector for e in exprs):
                self.broadcast = False
            fns = [px.compile_expr(e, dims, vector=True) for e in exprs]
            self.parts.append(("pt" if isinstance(a, At) else "rg", fns))
        self.basic = self._basic(read.access, dims, vector)

    def _basic(self, access, dims, vector) -> list | None:
        """How to read with basic indexing (a view, no gather) in a batch whose vector dims
        cover a box: per source dim ``("int", fn)`` (a loop-dims expression), ``("vec", d)``
        (the consumer's vector dim ``d`` itself: a slice over the box) or ``("rg", lo, hi)``
        (a window from loop-dims bounds). The vector dims must all come, in the consumer's
        order, before any window, so that the view's axes are the batch's; None otherwise."""
        out, seen, ranged = [], [], False
        for k, a in enumerate(access):
            exprs = (a.index,) if isinstance(a, At) else (a.lo, a.hi)
            names = set().union(*(px.names(e) for e in exprs))
            windowed = self.window is not None and k in self.window
            if isinstance(a, At) and not names & vector:
                out.append(("int", px.compile_expr(a.index, dims)))
            elif isinstance(a, At) and a.index in vector and not ranged and not windowed:
                seen.append(a.index)
                out.append(("vec", a.index))
            elif not isinstance(a, At) and not names & vector and not windowed:
                ranged = True
                out.append(("rg", px.compile_expr(a.lo, dims), px.compile_expr(a.hi, dims)))
            else:
                return None
        if seen and seen != [d for d in dims if d in vector]:
            return None
        return out

    def index(self, values: list) -> tuple[tuple, bool]:
        """Fancy indices for the batch (``values``: each dim's coordinates, ``(n,)`` arrays)
        and whether they have the batch axis (else they read one place for the whole batch);
        the gathered array has the batch axis, then one axis per slice. The indices are the
        points' own: the caller wraps the dim of a ring buffer."""
        pieces = []
        batched = False
        n_ranges = sum(1 for kind, _ in self.parts if kind == "rg")
        r = 0
        for kind, fns in self.parts:
            if kind == "pt":
                v = _nonnegative(np.asarray(fns[0](*values), np.int64))
                batched = batched or v.ndim > 0
                pieces.append(v.reshape(v.shape + (1,) * n_ranges) if v.ndim else v)
            else:
                lo = _nonnegative(np.asarray(fns[0](*values), np.int64))
                hi = np.asarray(fns[1](*values), np.int64)
                if lo.ndim or hi.ndim:
                    lo, hi = np.broadcast_arrays(lo, hi)
                    batched = True
                length = int(np.max(hi - lo)) if (hi - lo).size else 0
                if (hi - lo).size and int(np.min(hi - lo)) != length:
                    raise RunError("internal error: a ragged window in a batched read")
                shape = [1] * n_ranges
                shape[r] = max(length, 0)
                offs = np.arange(max(length, 0), dtype=np.int64).reshape(shape)
                lo = lo.reshape(lo.shape + (1,) * n_ranges) if lo.ndim else lo
                pieces.append(lo + offs)
                r += 1
        return tuple(pieces), batched


class _Node:
    """A node of a statement, prepared for its kernel (the runtime's own structure: the
    plan's items are never changed)."""

    __slots__ = (
        "id",
        "op",
        "dims",
        "attrs",
        "reads",
        "conds",
        "kernel",
        "dtype",
        "shape",
        "where",
    )

    def __init__(self, node, dims: tuple[str, ...], vector: set[str], plan: Plan):
        self.id, self.op, self.dims, self.where = node.id, node.op, dims, node.where
        self.attrs = node.attr_dict()
        self.reads = [_Read(r, dims, vector, plan) for r in node.inputs]
        self.conds = [
            None if r.cond is None else px.compile_expr(r.cond, dims, vector=True)
            for r in node.inputs
        ]
        self.kernel = self.dtype = self.shape = None
        if node.op != "merge" and not ops.is_env(node.op):
            self.kernel = ops.kernel_of(node.op)
            self.dtype = ops.numpy_dtype(node.types[0].dtype)
            self.shape = node.types[0].shape


class _Statement:
    def __init__(self, spec: Statement, plan: Plan, runtime: CpuRuntime):
        self.id = spec.id
        self.dims = spec.dims
        self.loops = spec.loops
        self.vector = set(spec.vector)
        self.nodes = {n.id: _Node(n, spec.dims, self.vector, plan) for n in spec.nodes}
        self.node = self.nodes[spec.id]
        self._template = None  # vector dims' coordinates, where the batches are uniform
        named = set()
        for r in spec.node.inputs if self.node.op == "merge" else ():
            if r.cond is not None:
                named |= px.names(r.cond)
        self._cond_loops = [k for k, d in enumerate(self.dims) if d in named and d in self.loops]
        self._branch_cache: dict[tuple, list] = {}
        self.rt = runtime
        self.native = None  # the kernel's ctypes function, if the plan has one
        self.window = _window(plan, spec.id, 0)
        self.home = plan.buffer(spec.id).home  # (its values in another buffer's memory)
        # outputs whose ring buffers are not output 0's: output -> their wraps
        self.n_outputs = len(spec.node.types)
        self.own_windows = {
            k: w
            for k in range(1, self.n_outputs)
            if (w := _window(plan, spec.id, k)) != self.window
        }
        box = plan.buffer(spec.id).box
        self.loop_box = tuple(box[self.dims.index(d)] for d in self.loops)
        self._spec, self._box, self._points = spec, box, None
        # (the points are found when a call first needs them: a run of native kernels
        # never does for most statements, and finding them takes time in the domain's
        # points, 0.9 s for REINFORCE's at 1000 x 256 x 128; the domain and the merges'
        # conditions are evaluated at the box's corners now, so that a corrupt plan's
        # ints that NumPy cannot hold are refused when it is loaded)
        self._guard(lambda: self._corners(spec, box))
        self.is_env = ops.is_env(self.node.op)

    def _guard(self, find):
        try:
            return find()
        except (OverflowError, ValueError, TypeError, IndexError) as e:
            # a domain or a merge's condition whose ints NumPy cannot hold (a corrupt plan)
            raise PlanError(
                f"the plan is not valid: the points of statement {self.id} "
                f"({self.rt._name(self.id)}) cannot be found ({px.clip(str(e))})"
            ) from e

    @property
    def batches(self) -> dict[tuple, _Batch]:
        """The statement's calls' points by their loop values (empty where every call has
        the whole box of the vector dims: ``template``)."""
        if self._points is None:
            self._points = self._guard(lambda: self._batches(self._spec, self._box))
        return self._points

    @property
    def template(self):
        """The vector dims' coordinates of every call, where the batches are uniform."""
        if self._points is None:
            _ = self.batches  # (finds them, and the template)
        return self._template

    def _corners(self, spec: Statement, extents: tuple[int, ...]):
        """The domain and the merges' conditions evaluated at the corners of the box (where
        a corrupt plan's huge ints overflow as they would at its points)."""
        if not self.dims or 0 in extents:
            return
        ends = [np.unique(np.array([0, e - 1], np.int64)) for e in extents]
        grids = [
            x.reshape([-1 if j == k else 1 for j in range(len(extents))])
            for k, x in enumerate(ends)
        ]
        domain = px.compile_expr(spec.domain, self.dims, vector=True)
        np.asarray(domain(*grids), bool)
        values = [g.ravel() for g in np.meshgrid(*ends, indexing="ij")]
        self._branches(values, len(values[0]))

    def _batches(self, spec: Statement, extents: tuple[int, ...]) -> dict[tuple, _Batch]:
        if not self.dims:
            return {(): _Batch({}, 1, self._branches([], 1))}
        if 0 in extents:
            return {}
        # open grids: the domain's condition broadcasts to the box
        grids = [
            np.arange(e, dtype=np.int64).reshape(
                [-1 if j == k else 1 for j in range(len(extents))]
            )
            for k, e in enumerate(extents)
        ]
        domain = px.compile_expr(spec.domain, self.dims, vector=True)
        inside = np.broadcast_to(np.asarray(domain(*grids), bool), extents)
        total = int(np.count_nonzero(inside))
        if total == 0:
            return {}
        loop_k = [self.dims.index(d) for d in self.loops]
        vec_k = [k for k, d in enumerate(self.dims) if d in self.vector]
        # loop points with some point inside, and the bounding box of the vector dims
        n_keys = int(np.count_nonzero(inside.any(axis=tuple(vec_k)))) if loop_k else 1
        los, lens = [], []
        for k in vec_k:
            hit = np.flatnonzero(inside.any(axis=tuple(j for j in range(len(extents)) if j != k)))
            los.append(int(hit[0]))
            lens.append(int(hit[-1]) - int(hit[0]) + 1)
        if total == n_keys * int(np.prod(lens)):
            # every loop point has the whole box of the vector dims: one template serves
            # every batch, and reads and writes can be views (basic indexing)
            shape = tuple(int(x) for x in lens)
            grid = np.indices(shape, dtype=np.int64).reshape(len(vec_k), int(np.prod(shape)))
            self._template = {self.dims[k]: grid[j] + los[j] for j, k in enumerate(vec_k)}
            self.n = int(np.prod(lens))
            self.box = tuple(int(x) for x in lens)
            self.vec_slice = {
                self.dims[k]: slice(int(lo), int(lo + ln)) for k, lo, ln in zip(vec_k, los, lens)
            }
            return {}
        pts = np.argwhere(inside)
        if loop_k:
            order = np.lexsort([pts[:, k] for k in reversed(loop_k)])
            pts = pts[order]
            keys = pts[:, loop_k]
            cuts = np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1
            groups = np.split(np.arange(len(pts)), cuts)
        else:
            groups = [np.arange(len(pts))]
        out = {}
        for g in groups:
            sel = pts[g]
            coords = {d: sel[:, k].copy() for k, d in enumerate(self.dims)}
            key = tuple(int(sel[0, k]) for k in loop_k)
            values = [coords[d] for d in self.dims]
            out[key] = _Batch(coords, len(g), self._branches(values, len(g)))
            out[key].where = self._where(coords)
        return out

    def _fancy(self, batch: _Batch) -> tuple:
        if batch.where is None:
            batch.where = self._where(batch.coords)
        return batch.where

    def _where(self, coords) -> tuple:
        idx = tuple(coords[d] for d in self.dims)
        return idx if self.window is None else _wrapped(idx, self.window)

    def _out_index(self, idx: tuple, k: int) -> tuple:
        """Where output ``k`` holds the point ``idx`` (its own indices, or their arrays)."""
        wraps = self.own_windows.get(k, self.window)
        return idx if wraps is None else _wrapped(idx, wraps)

    def _branches(self, values, n):
        """Merges: per input, the positions of the batch it defines (``values``: per dim,
        the batch's coordinates or one number)."""
        if self.node.op != "merge":
            return None
        conds = self.node.conds
        holds = [True if c is None else c(*values) for c in conds]
        if all(np.ndim(h) == 0 for h in holds):  # conditions on the loop dims only
            first = next((k for k, h in enumerate(holds) if h), None)
            none = np.zeros(0, np.int64)
            return [np.arange(n) if k == first else none for k in range(len(conds))]
        taken = np.zeros(n, bool)
        out = []
        for h in holds:
            hold = np.broadcast_to(np.asarray(h, bool), (n,))
            mine = hold & ~taken
            taken |= mine
            out.append(np.flatnonzero(mine))
        return out

    def bind_native(self, fn, scratch: int, spec: Statement):
        """Run this statement's calls with its kernel ``fn`` (``scratch``: its bytes of
        scratch memory)."""
        self.native = fn
        self.scratch = np.zeros(max(scratch, 8), np.uint8)
        self.args = np.zeros(max(len(self.loops), 1), np.int64)
        self.touched = _touched(self.rt.plan, {self.id})
        self.pointers = (self.rt.table_address, self.args.ctypes.data, self.scratch.ctypes.data)
        self.bookkeeping = (
            self.id in self.rt.valid
            or self.id in self.rt.metric_of
            or ((self.window is not None or self.home is not None) and self.rt.slots is not None)
        )

    def rerun(self, key: tuple):
        """After this statement's kernel failed at ``key``: the interpreter computes the call
        again, and raises the error that names the failing op and point."""
        rt = self.rt
        donor, sid = rt.donated.get(self.id), self.id
        # the kernel failed before it wrote: its memory still holds the donor's values
        if donor is not None and rt.buffers[donor] is None and rt.buffers[sid] is not None:
            spec = rt.plan.buffer(donor)
            rt.buffers[donor] = [
                rt.buffers[sid][0].reshape(spec.extents(0) + spec.outputs[0].shape)
            ]
            rt._freed.discard(donor)
        self.native = None
        self._run(key, explain=self.is_env)
        raise RunError(f"internal error: the kernel of statement {self.id} failed at {key}")

    def after_native(self, key: tuple):
        """What the runtime records after this statement's kernel ran at ``key``: the
        points of an output, the values of a metric."""
        rt = self.rt
        batch = self._uniform(key) if self.template is not None else self.batches.get(key)
        if batch is not None:
            self._record(batch)
            if self.id in rt.metric_of:
                rt.emit(self.id, batch)

    def _run_native(self, key: tuple):
        rt = self.rt
        rt.allocate(self.touched)
        args = self.args
        for k, v in enumerate(key):
            args[k] = v
        if self.native(*self.pointers):
            self.rerun(key)
        if self.bookkeeping:
            self.after_native(key)

    # ------------------------------------------------------------------ running
    def _uniform(self, key: tuple) -> _Batch:
        n = self.n
        coords = _LoopCoords(self.template)
        scalars = [0] * len(self.dims)
        basic = []
        values = dict(zip(self.loops, key))
        coords.loop_values, coords.n = values, n
        for k, d in enumerate(self.dims):
            if d in values:
                v = values[d]
                scalars[k] = v
                if self.window is not None and k in self.window:
                    v = v % self.window[k]
                basic.append(v)
            else:
                basic.append(self.vec_slice[d])
        branches = None
        if self.node.op == "merge":
            # the conditions see the loop dims as numbers; their answer depends only on the
            # loop dims they name (the vector dims' box is the same at every loop point)
            ckey = tuple(scalars[k] for k in self._cond_loops)
            branches = self._branch_cache.get(ckey)
            if branches is None:
                values = [
                    coords[d] if d in self.template else scalars[k]
                    for k, d in enumerate(self.dims)
                ]
                branches = self._branch_cache[ckey] = self._branches(values, n)
        batch = _Batch(coords, n, branches, scalars=scalars)
        batch.where = None  # the fancy indices, made if a path needs them
        batch.basic_where = tuple(basic)
        return batch

    def run(self, key: tuple):
        """One call: the batch of the points with the loop dims at ``key``."""
        try:
            # a loop value outside the box would write elsewhere (NumPy wraps -1 to the end)
            if not all(0 <= v < e for v, e in zip(key, self.loop_box)):
                raise IndexError(f"a call outside its box {list(self.loop_box)}")
            if self.native is not None:
                self._run_native(key)
            else:
                self._run(key)
        except (IndexError, ValueError, TypeError, OverflowError) as e:
            # the kernels' failures are _OpFailed (a RunError by then): what is left is a
            # read or a write that the plan's own sizes do not allow
            at = ", ".join(f"{d}={_number(v)}" for d, v in zip(self.loops, key))
            raise PlanError(
                f"the plan is not valid: statement {self.id} ({self.rt._name(self.id)}) at "
                f"{at or 'its only call'} reads or writes outside its buffers ({px.clip(str(e))})"
            ) from e

    def _run(self, key: tuple, explain: bool = False):
        """Compute the call at ``key``; ``explain``: an environment call whose generated
        code failed, which only says why (what the NumPy form would have raised)."""
        if self.template is not None:
            batch = self._uniform(key)
        else:
            batch = self.batches.get(key)
            if batch is None:
                return
        rt = self.rt
        if self.is_env:
            point = {d: int(batch.coords[d][0]) for d in self.dims}
            action = None
            if self.node.reads:
                action = self._value(self.node, 0, batch, {}, point)[0]
            name = self.node.attrs["env"]
            try:
                if explain:
                    started = rt.env_state[(name, "started")][0] != 0
                    rt.envs.explain(name, self.node.op, action, started)
                outs = rt.envs.call(name, self.node.op, action)
            except RunError as e:
                at = ", ".join(f"{d}={v}" for d, v in point.items())
                raise _OpFailed(self.node.where, e).error(at) from e
            at = tuple(point[d] for d in self.dims)
            idxs = [self._out_index(at, k) for k in range(len(outs))]
            for buf, idx, v in zip(rt.written_at(self.id, idxs), idxs, outs):
                buf[idx] = v
            self._record(batch)
            return
        try:
            self._compute(batch)
        except _OpFailed as f:
            raise self._first_failure(batch, f) from None
        self._record(batch)
        if self.id in rt.metric_of:
            rt.emit(self.id, batch)

    def _record(self, batch: _Batch):
        """The points an output's statement computed; in checking mode, which point of the
        window dim each written slot now holds."""
        if self.id in self.rt.valid:
            mask = self.rt._valid(self.id)
            if not self.dims:
                mask[()] = True
            elif batch.scalars is not None:
                mask[batch.basic_where] = True
            else:
                mask[self._fancy(batch)] = True
        if self.home is not None and self.window is None and self.rt.slots is not None:
            # (a value of no dims in another's memory: it holds its home's point ``at``)
            self.rt.slot_owner(self.id, 0)[(0,)] = _slot_code([self.rt.home_point(self.id, ())])
        if self.window is not None and self.rt.slots is not None:
            raw = tuple(batch.coords[d] for d in self.dims)
            for k in range(self.n_outputs):
                wraps = self.own_windows.get(k, self.window)
                if wraps is not None:
                    where = self._fancy(batch) if wraps is self.window else _wrapped(raw, wraps)
                    coords = [batch.coords[self.dims[j]] for j in wraps]
                    if self.home is not None:  # (recorded as its home's points)
                        coords = [self.rt.home_point(self.id, raw)]
                    self.rt.slot_owner(self.id, k)[where] = _slot_code(coords)

    def _first_failure(self, batch: _Batch, failed: "_OpFailed") -> RunError:
        """The error of the first point of a failed batch, in the order of the statement's
        dims (a batched op cannot say which point failed): the batch is recomputed point by
        point."""
        cols = [batch.coords[d] for d in self.dims]
        for k in np.lexsort(list(reversed(cols))) if batch.n > 1 else range(batch.n):
            if batch.n > 1:
                one = _Batch({d: batch.coords[d][k : k + 1] for d in self.dims}, 1, None)
                one.where = self._where(one.coords)
                if self.node.op == "merge":
                    one.branches = [np.flatnonzero(pos == k)[:1] * 0 for pos in batch.branches]
                try:
                    self._compute(one)
                    continue
                except _OpFailed as f:
                    failed = f
            point = ", ".join(f"{d}={int(c[k])}" for d, c in zip(self.dims, cols))
            return failed.error(point)
        return failed.error("")

    def _compute(self, batch: _Batch):
        # every value first, then the writes: the buffer may take the memory of an input
        if self.node.op == "merge":
            parts = []
            for k, pos in enumerate(batch.branches):
                if len(pos) == 0:
                    continue
                sub = (
                    batch
                    if len(pos) == batch.n
                    else _Batch({d: batch.coords[d][pos] for d in self.dims}, len(pos), None)
                )
                parts.append((pos, sub is batch, self._value(self.node, k, sub, {}, None)))
            (buf,) = self.rt.written(self.id)
            for pos, whole, v in parts:
                if not self.dims:
                    buf[()] = v[0]
                elif whole and batch.scalars is not None:
                    self._write_box(buf, batch, v)
                else:
                    buf[tuple(i[pos] for i in self._fancy(batch))] = v
        else:
            outs = self._node_values(self.id, batch, {})
            for k, (buf, v) in enumerate(zip(self.rt.written(self.id), outs)):
                if not self.dims:
                    buf[()] = v[0]
                elif k in self.own_windows:
                    raw = tuple(batch.coords[d] for d in self.dims)
                    buf[self._out_index(raw, k)] = v
                elif batch.scalars is not None:
                    self._write_box(buf, batch, v)
                else:
                    buf[self._fancy(batch)] = v

    def _write_box(self, buf: np.ndarray, batch: _Batch, v: np.ndarray):
        """A uniform batch's values into its box of the buffer: a basic-indexed view."""
        if v.shape[0] == batch.n:
            buf[batch.basic_where] = v.reshape(self.box + v.shape[1:])
        else:
            buf[batch.basic_where] = v[0]

    def _value(self, node: _Node, k: int, batch: _Batch, memo: dict, point) -> np.ndarray:
        """Input ``k`` of ``node`` over the batch: ``(n or 1, ...)``."""
        read = node.reads[k]
        if not read.stored:
            if read.src not in memo:
                memo[read.src] = self._node_values(read.src, batch, memo)
            return memo[read.src][read.out]
        src = self.rt.read(read.src)[read.out]
        if batch.scalars is not None and read.basic is not None and self.rt.slots is None:
            return self._view(read, src, batch)
        values = [batch.coords[d] for d in node.dims]
        if read.broadcast:
            values = [v[:1] for v in values]
        idx, batched = read.index(values)
        if read.window is not None:
            if self.rt.slots is not None:
                self.rt.check_slots(read.src, read.out, idx, read.window, node.where)
            idx = _wrapped(idx, read.window)
        return src[idx] if batched else src[idx][None]  # [None]: one value for the batch

    def _view(self, read: _Read, src: np.ndarray, batch: _Batch) -> np.ndarray:
        """A read with basic indexing (see ``_Read._basic``): ``(n or 1, ...)``."""
        sc = batch.scalars
        idx = []
        vec = 0
        for k, e in enumerate(read.basic):
            if e[0] == "int":
                v = int(e[1](*sc))
                if v < 0:  # before the wrap of a ring buffer, which would hide it
                    raise IndexError(f"index {_number(v)} is below 0")
                if read.window is not None and k in read.window:
                    v %= read.window[k]
                idx.append(v)
            elif e[0] == "vec":
                idx.append(self.vec_slice[e[1]])
                vec += 1
            else:
                lo, hi = int(e[1](*sc)), int(e[2](*sc))
                if not 0 <= lo <= hi <= src.shape[k]:  # NumPy would clip the slice
                    raise IndexError(f"slice {_number(lo)}:{_number(hi)} outside its axis")
                idx.append(slice(lo, hi))
        v = src[tuple(idx)]
        return v.reshape((batch.n,) + v.shape[vec:]) if vec else v[None]

    def _node_values(self, nid: int, batch: _Batch, memo: dict) -> tuple:
        node = self.nodes[nid]
        args = [self._value(node, k, batch, memo, None) for k in range(len(node.reads))]
        point = _PointOf(batch.coords, node.dims)
        try:
            out = ops.run_prepared(
                node.kernel, node.attrs, args, batch.n, point, node.dtype, node.shape
            )
        except (ValueError, IndexError, OverflowError, ZeroDivisionError) as e:
            raise _OpFailed(node.where, e) from None
        return (out,)


class CpuRuntime:
    def __init__(
        self,
        plan: Plan,
        on_metric: MetricSink | None = None,
        check_windows: bool = False,
        profile: bool = False,
        allow_nonfinite: bool = False,
        native: str | None = None,
        cache=None,
        kernels=None,
    ):
        """``native``: the text of the plan's kernel file (``plan.kernels``), checked
        against the plan and compiled for this machine; its statements run natively, the
        others (and all of them without it) with NumPy kernels; ``cache``: a folder where the
        compiled machine code is kept for the next run (a build's ``kernels/``);
        ``kernels``: per kernel name, a function of the same signature to call instead of
        the native one (the CUDA C kernels run on the CPU, ``timerlc.cuda.emu``), or without
        ``native`` the only kernels there are (``runtime.cuda``): the statements then run
        one by one, not by the tree functions."""
        self.plan = plan
        # profiling: per statement, seconds spent in its calls and how many calls
        self.profile = profile
        self.seconds: dict[int, float] = {}
        self.calls: dict[int, int] = {}
        self.on_metric = on_metric
        # per statement: its arrays once allocated (None before, and after its free)
        self.buffers: dict[int, list[np.ndarray] | None] = {b.id: None for b in plan.buffers}
        self._freed: set[int] = set()
        self.live_bytes = 0  # bytes the buffers hold now
        self.peak_bytes = 0  # the most they held at once
        # the host pool: per buffer swapped out, a copy of its arrays (None: it had none yet)
        self.host: dict[int, list[np.ndarray] | None] = {}
        self.host_bytes = 0  # bytes the host pool holds now
        self.host_peak_bytes = 0  # the most it held at once
        self.swapped = 0  # buffers copied to the host pool (each swap_out of an array)
        self.swapped_bytes = 0  # bytes copied to the host pool, all swaps together
        # the memory taken: each statement's donor, and each donor's statement (the latest
        # donation: a plan gives a buffer one donor, but a loop's donations repeat)
        self.donated: dict[int, int] = {}
        self.donee: dict[int, int] = {}
        # checking mode: per ring buffer, the window dim's index each slot holds (-1: none)
        self.slots: dict[tuple[int, int], np.ndarray] | None = {} if check_windows else None
        # the buffers that live in another's memory (``Buffer.home``): each its home's arrays
        self.homes = {b.id: b.home.buffer for b in plan.buffers if b.home is not None}
        # (and where in it: ``Home.at`` as a function of their points' index arrays)
        self._home_at = {
            b.id: px.compile_expr(b.home.at[0], b.dims, vector=True)
            for b in plan.buffers
            if b.home is not None
        }
        self._views: dict[int, tuple] = {}  # per such buffer: (its home's arrays, views)
        self.metric_of = {sid: name for name, sid, _ in plan.metrics}
        self.envs = EnvRunner.of_plan(plan, allow_nonfinite)
        # per output statement, which points of its box are computed (docs/interruptions.md)
        self.valid: dict[int, np.ndarray | None] = {sid: None for _, sid, _ in plan.outputs}
        self.statements = {s.id: _Statement(s, plan, self) for s in plan.statements}
        self.module = None
        self.native_seconds = 0.0  # compiling the kernels for this CPU (or loading them)
        self.slot = plan.slots()
        # the state of each environment that runs as generated code (codegen.envs), at the
        # table entries after the buffers', zero before the first call
        self.env_state: dict[tuple[str, str], np.ndarray] = {}
        states = _env_states(plan) if native is not None or kernels is not None else []
        self.table = np.zeros(max(len(self.slot) + len(states), 1), np.uint64)  # addresses
        self.table_address = self.table.ctypes.data
        for a in states:
            arr = np.zeros(a.size, ops.numpy_dtype(a.dtype))
            self.env_state[(a.env, a.name)] = arr
            self.table[a.index] = arr.ctypes.data
        trees = not check_windows and kernels is None  # (the tree functions run the tree)
        if native is not None:
            from timerlc.runtime.native import NativeModule, check_kernels, roots_of

            check_kernels(plan, native)
            started = time.perf_counter()
            # (where the tree functions run, only what they and the statements outside the
            # fused kernels call is compiled now: the rest at its first call, if any)
            self.module = NativeModule(native, cache, roots_of(plan) if trees else None)
            self.native_seconds = time.perf_counter() - started
            for sid, name, scratch in plan.kernels.statements:
                fn = (kernels or {}).get(name) or self.module.function(name)
                self.statements[sid].bind_native(fn, scratch, plan.statement(sid))
        elif kernels is not None:  # only these (the device runtime's launches)
            for sid, name, scratch in plan.kernels.statements:
                if name in kernels:
                    self.statements[sid].bind_native(kernels[name], scratch, plan.statement(sid))
        # a loop tree runs no more loop steps than its statements have calls (the points of
        # their loop dims), with room to spare: a corrupt plan whose loops would run on and
        # on is stopped
        calls = sum(
            math.prod(plan.buffer(s.id).box[s.dims.index(d)] for d in s.loops)
            for s in plan.statements
        )
        self.steps_left = 4 * calls + 1_000_000
        # whole top-level items of the tree as native functions (not while checking
        # windows, which checks each read); while profiling, their kernel calls count the
        # CPU's cycles per statement (``tl_launch``) into ``self.cycles``
        self.trees: dict[int, tuple] = {}
        self.cycles: np.ndarray | None = None
        if self.module is not None and trees:
            self._bind_trees(plan)
        self.tree = self._build(plan.tree, ())

    # ------------------------------------------------------------------ buffers
    def read(self, sid: int) -> list[np.ndarray]:
        """The arrays of ``sid`` for a read (a buffer in another's memory: views of that
        one's, in its own shape)."""
        home = self.homes.get(sid)
        if home is not None:
            return self._viewed(sid, self.read(home))
        bufs = self.buffers[sid]
        return bufs if bufs is not None else self._allocate(sid, False)

    def written(self, sid: int) -> list[np.ndarray]:
        """The arrays of ``sid`` for a write: its donor's memory at its first write."""
        home = self.homes.get(sid)
        if home is not None:
            return self._viewed(sid, self.written(home))
        bufs = self.buffers[sid]
        return bufs if bufs is not None else self._allocate(sid, True)

    def _viewed(self, sid: int, bufs: list[np.ndarray]) -> list[np.ndarray]:
        """``bufs`` (its home's arrays) in the shapes of ``sid``'s (the same memory: one slot
        of the home, all of a value of no dims)."""
        got = self._views.get(sid)
        if got is None or got[0] is not bufs:
            spec = self.plan.buffer(sid)
            views = [
                b.reshape(spec.extents(k) + o.shape)
                for k, (b, o) in enumerate(zip(bufs, spec.outputs))
            ]
            got = self._views[sid] = (bufs, views)
        return got[1]

    def written_at(self, sid: int, idxs: list[tuple]) -> list[np.ndarray]:
        """The arrays of ``sid`` for a write of one point, at ``idxs`` in each output's array
        (ints, one per dim)."""
        return self.written(sid)

    def _allocate(self, sid: int, write: bool) -> list[np.ndarray]:
        if sid in self._freed:
            raise RunError(f"internal error: buffer {sid} used after its free (a bad plan)")
        if sid in self.host:
            raise RunError(
                f"internal error: buffer {sid} ({self._name(sid)}) "
                f"{'written' if write else 'read'} while it is swapped out to host memory "
                "(a bad plan: no swap_in before this use)"
            )
        spec = self.plan.buffer(sid)
        shapes = [spec.extents(k) + o.shape for k, o in enumerate(spec.outputs)]
        dtypes = [ops.numpy_dtype(o.dtype) for o in spec.outputs]
        donor = spec.donor
        given = self.buffers.get(donor) if write and donor is not None else None
        if (
            given is not None
            and len(given) == len(shapes) == 1
            and given[0].dtype == dtypes[0]
            and given[0].size == math.prod(shapes[0])
            and given[0].flags.c_contiguous
        ):
            bufs = [given[0].reshape(shapes[0])]
            # its memory is sid's now; the table keeps its address, the same memory, for
            # sid's kernel, which reads the donor's values before it writes its own
            self.buffers[donor] = None
            self._freed.add(donor)
            self.donated[sid] = donor
            self.donee[donor] = sid
        else:
            bufs = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
            self._grow(sum(b.nbytes for b in bufs))
            donor = None
        self._set(sid, bufs, donor)
        return bufs

    def allocate(self, touched: list[tuple[int, bool]]):
        """The buffers of ``_touched`` that have no arrays yet, before native code uses
        them (it reads their addresses from the table)."""
        for sid, write in touched:
            if self.buffers[sid] is None:
                self.written(sid) if write else self.read(sid)

    def _set(self, sid: int, bufs, donor: int | None = None):
        """Buffer ``sid``'s arrays (None: none), and their addresses for the kernels;
        ``donor``: the buffer whose memory they are (a donation)."""
        self.buffers[sid] = bufs
        if bufs is None and self._views:  # (no views keep a freed home's arrays alive)
            self._views = {x: v for x, v in self._views.items() if self.homes[x] != sid}
        for k in range(len(self.plan.buffer(sid).outputs)):
            self.table[self.slot[(sid, k)]] = 0 if bufs is None else bufs[k].ctypes.data

    def _grow(self, nbytes: int):
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _name(self, sid: int) -> str:
        return self.plan.buffer(sid).name or f"%{sid}"

    def swap_out(self, sid: int):
        """Copy the buffer's arrays into the host pool and drop them from the device."""
        if sid in self.host or sid in self._freed:
            state = "already swapped out" if sid in self.host else "freed"
            raise RunError(
                f"internal error: swap_out of buffer {sid} ({self._name(sid)}), {state} "
                "(a bad plan)"
            )
        bufs = self.buffers[sid]
        if bufs is None:  # never used yet (no call wrote or read it): nothing to keep
            self.host[sid] = None
            return
        copies = [np.array(b, copy=True) for b in bufs]
        nbytes = sum(b.nbytes for b in bufs)
        self.host[sid] = copies
        self._set(sid, None)
        self.live_bytes -= nbytes
        self.host_bytes += nbytes
        self.host_peak_bytes = max(self.host_peak_bytes, self.host_bytes)
        self.swapped += 1
        self.swapped_bytes += nbytes

    def swap_in(self, sid: int):
        """Copy a swapped-out buffer back from the host pool before its next use."""
        if sid not in self.host:
            raise RunError(
                f"internal error: swap_in of buffer {sid} ({self._name(sid)}), which is not "
                "swapped out (a bad plan)"
            )
        copies = self.host.pop(sid)
        if copies is None:
            return  # it had no arrays: its first use allocates them
        bufs = []
        for h in copies:
            b = np.empty_like(h)
            np.copyto(b, h)
            bufs.append(b)
        nbytes = sum(b.nbytes for b in bufs)
        self.host_bytes -= nbytes
        self._grow(nbytes)
        self._set(sid, bufs)

    def home_point(self, sid: int, idx: tuple) -> np.ndarray:
        """The index, along its home's dim, where a buffer in another's memory holds its
        points ``idx`` (index arrays, one per dim): ``Home.at``."""
        return np.asarray(self._home_at[sid](*idx))

    def slot_owner(self, sid: int, out: int) -> np.ndarray:
        """Checking mode: per slot of output ``out`` of ``sid``, the point it holds (of the
        buffer whose memory it is: a buffer in another's memory records its points as that
        one's, at ``Home.at``)."""
        sid = self.homes.get(sid, sid)
        if (sid, out) not in self.slots:
            shape = self.plan.buffer(sid).extents(out)
            self.slots[(sid, out)] = np.full(shape, -1, np.int64)
        return self.slots[(sid, out)]

    def check_slots(self, sid: int, out: int, idx: tuple, wraps: dict[int, int], where):
        """Checking mode: a read of a ring buffer must find the points it asks for
        (``wraps``: axis -> slots of output ``out``)."""
        if sid in self.homes:  # (its point p is its home's at(p))
            idx = (self.home_point(sid, idx),)
            wraps = self.plan.buffer(self.homes[sid]).wraps(out)
        held = self.slot_owner(sid, out)[_wrapped(idx, wraps)]
        want = _slot_code([idx[k] for k in wraps])
        wrong = held != np.broadcast_to(want, np.shape(held))
        if np.any(wrong):
            at = tuple(np.broadcast_to(i, np.shape(held))[wrong][0] for i in idx)
            got = int(held[wrong][0])
            if len(wraps) > 1:
                got = (got >> 32, got & 0xFFFFFFFF)
            raise RunError(
                f"internal error: while computing {where[0]}, a read of buffer {sid} at "
                f"{at} found the slot holding index {got} (a window too small for the plan)"
            )

    def free(self, sid: int):
        bufs = self.buffers[sid]
        if bufs is not None:
            self.live_bytes -= sum(b.nbytes for b in bufs)
        held = self.host.pop(sid, None)  # a plan frees a buffer on the device, but be safe
        if held is not None:
            self.host_bytes -= sum(h.nbytes for h in held)
        self._set(sid, None)
        self._freed.add(sid)

    def emit(self, nid: int, batch: _Batch):
        if self.on_metric is None:
            return
        name = self.metric_of[nid]
        st = self.statements[nid]
        buf = self.read(nid)[0]
        if not st.dims:
            self.on_metric(name, {}, buf[()])
            return
        cols = [batch.coords[d] for d in st.dims]
        for k in np.lexsort(list(reversed(cols))):
            p = tuple(int(c[k]) for c in cols)
            self.on_metric(name, dict(zip(st.dims, p)), buf[p][()])

    # ------------------------------------------------------------------ the loop tree
    # The loop variables in scope live in one list, ``env``: the variable of the loop at
    # depth d at ``env[d]``; the tree's expressions are functions of that list.
    def _bind_trees(self, plan: Plan):
        from timerlc.runtime.native import HOST, TREE

        self.pending: BaseException | None = None
        self.callback = HOST(self._host)  # kept alive as long as the runtime
        self.callback_address = ctypes.cast(self.callback, ctypes.c_void_p).value
        self.err = np.zeros(2 + 16, np.int64)
        self.tree_args = np.zeros(1, np.int64)
        if self.profile and plan.kernels.trees:
            at = self.module.engine.get_global_value_address("tl_prof")
            if at:
                top = max(s.id for s in plan.statements) + 1
                self.cycles = np.zeros(2 * top, np.int64)  # per statement: cycles, calls
                ctypes.c_void_p.from_address(at).value = self.cycles.ctypes.data
                self.clock = ctypes.CFUNCTYPE(ctypes.c_uint64)(self.module.address("tl_cycles"))
        for item, name, scratch in plan.kernels.trees:
            fn = TREE(self.module.address(name))
            buf = np.zeros(max(scratch, 8), np.uint8)
            calls = {it.statement for it in walk((plan.tree[item],)) if isinstance(it, Call)}
            touched = _touched(plan, calls)
            self.trees[item] = (fn, buf, touched)

    def _host(self, sid: int, mode: int, args: int) -> int:
        """The callback of the native tree functions: run statement ``sid`` at the loop
        values at ``args`` (mode 0), or record what its kernel computed (mode 1)."""
        try:
            deepstack.check()  # a signal that came during the native code
            started = time.perf_counter() if self.profile else 0.0
            st = self.statements[sid]
            n = len(st.loops)
            key = tuple((ctypes.c_int64 * n).from_address(args)) if n else ()
            if mode == 0:
                st.run(key)
            else:
                st.after_native(key)
            if self.profile:
                self.seconds[sid] = self.seconds.get(sid, 0.0) + time.perf_counter() - started
                self.calls[sid] = self.calls.get(sid, 0) + (mode == 0)
            return 0
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller of the tree
            self.pending = e
            return 1

    def _run_tree(self, item: int, env_value: int | None):
        fn, scratch, touched = self.trees[item]
        self.allocate(touched)
        if env_value is not None:
            self.tree_args[0] = env_value
        err = self.err
        err[0] = self.steps_left
        with deepstack.held():  # Ctrl-C: at the next callback, or when the call returns
            code = fn(
                self.table_address,
                self.tree_args.ctypes.data,
                scratch.ctypes.data,
                self.callback_address,
                err.ctypes.data,
            )
        self.steps_left = int(err[0])
        if code:
            self._tree_failed(code)

    def _tree_failed(self, code: int):
        from timerlc.plan.items import HOST_FAILED, NO_STEPS_LEFT, OUTSIDE_BOX

        if code == HOST_FAILED and self.pending is not None:
            e, self.pending = self.pending, None
            raise e
        if code == NO_STEPS_LEFT:
            self._step()
        sid = int(self.err[1])
        st = self.statements.get(sid)
        if st is None:
            raise RunError(f"internal error: a native tree function failed ({code})")
        key = tuple(int(v) for v in self.err[2 : 2 + len(st.loops)])
        if code == OUTSIDE_BOX:
            st.run(key)  # raises the PlanError of a call outside the statement's box
        st.rerun(key)

    def _build(self, items, scope: tuple[str, ...]) -> Callable[[list], None]:
        if not scope and self.trees:
            steps = [
                self._native_item(k, it) if k in self.trees else self._item(it, scope)
                for k, it in enumerate(items)
            ]
        else:
            steps = [self._item(it, scope) for it in items]

        def run(env):
            for s in steps:
                s(env)

        return run

    def _step(self):
        """One step of a loop of the tree: a plan's loops run no more steps than its
        statements have calls (with room to spare)."""
        self.steps_left -= 1
        if self.steps_left < 0:
            raise PlanError(
                "the plan is not valid: its loop tree runs far more steps than its statements "
                "have calls"
            )

    def _native_item(self, k: int, it):
        """Top-level item ``k`` run by its native function: a loop steps here and runs its
        body natively, so that metrics stream and Ctrl-C stops the run between steps."""
        if not isinstance(it, Loop):
            return lambda env: self._run_tree(k, None)
        init = px.compile_packed(it.init, ())
        cond = px.compile_packed(it.cond, (it.var,))
        inc = it.inc

        def loop(env):
            env[0] = init(env)
            while cond(env):
                self._run_tree(k, env[0])
                env[0] += inc
                self._step()

        return loop

    def _item(self, it, scope: tuple[str, ...]):
        if isinstance(it, (Free, SwapOut, SwapIn)):
            fn = {Free: self.free, SwapOut: self.swap_out, SwapIn: self.swap_in}[type(it)]
            sids = it.buffers

            def buffers(env):
                for s in sids:
                    fn(s)

            return buffers
        if isinstance(it, (Loop, If)):
            return self._control(it, scope, self._build)
        assert isinstance(it, Call)
        st = self.statements[it.statement]
        args = [px.compile_packed(a, scope) for a in it.args]

        def call(env):
            st.run(tuple(int(a(env)) for a in args))

        if not self.profile:
            return call
        sid = st.id
        self.seconds.setdefault(sid, 0.0)
        self.calls.setdefault(sid, 0)

        def timed(env):
            started = time.perf_counter()
            call(env)
            self.seconds[sid] += time.perf_counter() - started
            self.calls[sid] += 1

        return timed

    def _control(self, it, scope: tuple[str, ...], build):
        """A loop or an ``if`` of the tree as a function of ``env``, its bodies made by
        ``build(items, scope)`` (the tree's own; a CUDA graph's capture, ``runtime.graphs``)."""
        if isinstance(it, Loop):
            k = len(scope)
            init = px.compile_packed(it.init, scope)
            cond = px.compile_packed(it.cond, scope + (it.var,))
            body = build(it.body, scope + (it.var,))
            inc = it.inc

            def loop(env):
                env[k] = init(env)
                while cond(env):
                    body(env)
                    env[k] += inc
                    self._step()

            return loop
        cond = px.compile_packed(it.cond, scope)
        then, other = build(it.then, scope), build(it.orelse, scope)

        def branch(env):
            if cond(env):
                then(env)
            else:
                other(env)

        return branch

    def run(self):
        clock = (self.clock(), time.perf_counter()) if self.cycles is not None else None
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # nan of an empty mean is a value
                self.tree([0] * (_MAX_DEPTH + 1))
        finally:
            if clock is not None:
                self._count_cycles(*clock)

    def _count_cycles(self, c0: int, t0: float):
        """Add the native calls' cycles (``tl_launch``'s count while profiling) to the
        statements' seconds, at the rate the cycle counter ran during the run."""
        c1, t1 = self.clock(), time.perf_counter()
        if c1 <= c0 or t1 <= t0:
            return
        rate = (c1 - c0) / (t1 - t0)  # counts per second
        counts = self.cycles.reshape(-1, 2)
        for sid in np.flatnonzero(counts[:, 1]):
            sid = int(sid)
            self.seconds[sid] = self.seconds.get(sid, 0.0) + float(counts[sid, 0]) / rate
            self.calls[sid] = self.calls.get(sid, 0) + int(counts[sid, 1])
        counts[:] = 0

    @property
    def scratch_bytes(self) -> int:
        """The bytes of the kernels' scratch memory, which the buffers' count leaves out:
        each statement's kernel and each tree function has its own, reserved for the run
        (zeroed pages, which cost nothing until touched: a statement whose calls all go
        through a tree function's never touches its own)."""
        own = sum(getattr(s, "scratch", np.zeros(0)).nbytes for s in self.statements.values())
        return own + sum(t[1].nbytes for t in self.trees.values())

    def value(self, name: str) -> np.ndarray:
        sid, out = self.plan.tensor(name)
        return self.read(sid)[out]

    def computed(self, name: str) -> np.ndarray:
        """Which points of an output's box the run computed (bool)."""
        sid, _ = self.plan.tensor(name)
        return self._valid(sid).copy()

    def _valid(self, sid: int) -> np.ndarray:
        mask = self.valid[sid]
        if mask is None:
            # (an output's buffer is a block: every output has its box)
            mask = self.valid[sid] = np.zeros(self.plan.buffer(sid).box, bool)
        return mask


def needed_bytes(plan: Plan) -> int:
    """An upper bound of the memory a run of ``plan`` takes: the buffers' peak (swapped
    blocks stay in the same memory on the cpu) and the temporaries of the largest call.
    A call of a statement covers the points of its ``vector`` dims; for each it holds the
    coordinates, every node's values and every read (a slice read at most the whole extent
    of its source dim)."""
    widest = 0
    for st in plan.statements:
        box = dict(zip(st.dims, plan.buffer(st.id).box))
        points = math.prod(box[d] for d in st.vector)
        per_point = 8 * len(st.dims)
        for node in st.nodes:
            per_point += sum(math.prod(o.shape) * DTYPES[o.dtype] for o in node.types)
            for r in node.inputs:
                if not any(isinstance(a, Slice) for a in r.access):
                    continue
                if r.stored:
                    src_box, out = plan.buffer(r.src).box, plan.buffer(r.src).outputs[r.out]
                else:  # an earlier node of the statement, over the statement's dims
                    src_box = plan.buffer(st.id).box
                    out = next(n for n in st.nodes if n.id == r.src).types[r.out]
                span = math.prod(b for b, a in zip(src_box, r.access) if isinstance(a, Slice))
                per_point += span * math.prod(out.shape) * DTYPES[out.dtype]
        widest = max(widest, points * per_point)
    return plan.memory_peak_unswapped + widest


def _env_states(plan: Plan) -> list:
    """The state arrays of the environments with a generated form (``codegen.envs``)."""
    from timerlc.codegen.envs import state_arrays
    from timerlc.envs import EnvError

    try:
        return state_arrays(plan)
    except EnvError as e:
        raise RunError(f"an environment of the plan could not be made: {e.message}") from None


def _touched(plan: Plan, calls: set[int]) -> list[tuple[int, bool]]:
    """The buffers the statements ``calls`` write or read, with whether they are written
    (allocated before native code runs them; not an interpreted statement that takes a
    donor's memory, which allocates itself)."""
    kernels = {sid for sid, _, _ in plan.kernels.statements}
    out: dict[int, bool] = {}
    for sid in calls:
        if sid not in kernels and plan.buffer(sid).donor is not None:
            continue  # interpreted: it allocates, and takes its donor's memory, itself
        out[plan.storage_of(sid)] = True  # (a buffer in another's memory: that one)
        for n in plan.statement(sid).nodes:
            for r in n.inputs:
                if r.stored and plan.storage_of(r.src) not in out:
                    out[plan.storage_of(r.src)] = False
    # the reads first: a donor is allocated before the statement takes its memory
    return sorted(out.items(), key=lambda kv: (kv[1], kv[0]))


def _number(v: int) -> str:
    """An int for a message: a corrupt plan's loop values can have thousands of digits
    (more than ``str`` converts)."""
    if abs(v) < 1 << 63:
        return str(v)
    return f"{'-' if v < 0 else ''}2^{v.bit_length() - 1} or more"


def _nonnegative(index: np.ndarray) -> np.ndarray:
    """``index`` (an index of a read), unless it is negative somewhere: NumPy would wrap it
    to the end of the axis instead of failing, as an index past the end does."""
    if index.size and index.min() < 0:
        raise IndexError(f"index {int(index.min())} is below 0")
    return index


def _window(plan: Plan, sid: int, out: int) -> dict[int, int] | None:
    """axis -> slots of each ring buffer of output ``out`` of a buffer (its window's, then
    its inner window's), or None for a block."""
    return plan.buffer(sid).wraps(out) or None


def _wrapped(idx, wraps: dict[int, int]) -> tuple:
    """A point's index in a buffer: each axis of a ring buffer (``wraps``: axis -> slots)
    modulo its slots."""
    return tuple(v % wraps[k] if k in wraps else v for k, v in enumerate(idx))


def _slot_code(coords):
    """Checking mode: the points of the windowed dims a slot holds, as one number (two
    dims: the first's index in the high 32 bits; an index is below 2**31)."""
    code = np.asarray(coords[0], np.int64)
    for c in coords[1:]:
        code = code * (1 << 32) + np.asarray(c, np.int64)
    return code
