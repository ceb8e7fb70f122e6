"""The cpu runtime: runs a plan with NumPy kernels.

Everything a step needs is prepared when the plan is loaded: each statement's points,
grouped by the values of its loop dims (each group is one *batch*: the points of its vector
dims, as coordinate arrays), the compiled index functions of every read, and the loop tree
as nested Python closures. A call of a statement then gathers its reads with NumPy fancy
indexing (a read that does not depend on the vector dims is gathered once and broadcast),
runs its nodes as batched kernels (``kernels.run_op``) and scatters the result into the
statement's buffer. Buffers are blocks over each statement's bounding box (0 outside its
domain), so the outputs are what the reference interpreter gives.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from timerlc.runtime import kernels
from timerlc.diagnostics import RunError
from timerlc.runtime.envs import EnvRunner
from timerlc.runtime.plan import compile_index, decode_attr, free_names

MetricSink = Callable[[str, dict, float], None]


@dataclass
class _Batch:
    coords: dict[str, np.ndarray]  # every dim of the statement: (n,) int64
    n: int
    branches: list | None  # merges: per input, the positions (into the batch) it defines


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
    """One input edge: where it reads (a buffer, or a node of the same statement)."""

    def __init__(self, edge: dict, dims: tuple[str, ...], vector: set[str]):
        self.src = edge["src"]
        self.out = edge["out"]
        self.stored = edge["stored"]
        self.parts = []
        self.broadcast = True  # reads the same points for every point of the batch
        for a in edge["access"]:
            texts = a[1:]
            for t in texts:
                if free_names(t) & vector:
                    self.broadcast = False
            fns = [compile_index(t, dims) for t in texts]
            self.parts.append((a[0], fns))

    def index(self, values: list) -> tuple[tuple, bool]:
        """Fancy indices for the batch (``values``: each dim's coordinates, ``(n,)`` arrays)
        and whether they have the batch axis (else they read one place for the whole batch);
        the gathered array has the batch axis, then one axis per slice."""
        pieces = []
        batched = False
        n_ranges = sum(1 for kind, _ in self.parts if kind == "rg")
        r = 0
        for kind, fns in self.parts:
            if kind == "pt":
                v = np.asarray(fns[0](*values), np.int64)
                batched = batched or v.ndim > 0
                pieces.append(v.reshape(v.shape + (1,) * n_ranges) if v.ndim else v)
            else:
                lo = np.asarray(fns[0](*values), np.int64)
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


class _Statement:
    def __init__(self, sid: int, spec: dict, plan: dict, runtime: CpuRuntime):
        self.id = sid
        self.dims = tuple(spec["dims"])
        self.loops = tuple(spec["loops"])
        self.vector = set(spec["vector"])
        self.nodes = {}
        for n in spec["nodes"]:
            self.nodes[n["id"]] = n
            n["_attrs"] = {k: decode_attr(v) for k, v in n["attrs"].items()}
            n["_reads"] = [_Read(e, tuple(n["dims"]), self.vector) for e in n["inputs"]]
            n["_conds"] = [
                None if e["cond"] is None else compile_index(e["cond"], tuple(n["dims"]))
                for e in n["inputs"]
            ]
        self.node = self.nodes[sid]
        self.rt = runtime
        self.batches = self._batches(spec)
        self.is_env = self.node["op"] in ("env_reset", "env_step")

    def _batches(self, spec) -> dict[tuple, _Batch]:
        buf = self.rt.plan["buffers"][str(self.id)]
        extents = tuple(buf["extents"])
        if not self.dims:
            return {(): _Batch({}, 1, self._branches({}, 1))}
        if 0 in extents:
            return {}
        grids = np.indices(extents, dtype=np.int64)
        inside = np.broadcast_to(
            np.asarray(compile_index(spec["domain"], self.dims)(*grids), bool), extents
        )
        pts = np.argwhere(inside)
        if len(pts) == 0:
            return {}
        loop_k = [self.dims.index(d) for d in self.loops]
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
            out[key] = _Batch(coords, len(g), self._branches(coords, len(g)))
        return out

    def _branches(self, coords, n):
        if self.node["op"] != "merge":
            return None
        values = [coords[d] for d in self.dims]
        taken = np.zeros(n, bool)
        out = []
        for cond in self.node["_conds"]:
            hold = (
                np.ones(n, bool)
                if cond is None
                else np.broadcast_to(np.asarray(cond(*values), bool), (n,))
            )
            mine = hold & ~taken
            taken |= mine
            out.append(np.flatnonzero(mine))
        return out

    # ------------------------------------------------------------------ running
    def run(self, key: tuple):
        batch = self.batches.get(key)
        if batch is None:
            return
        rt = self.rt
        bufs = rt.buffers[self.id]
        if self.is_env:
            point = {d: int(batch.coords[d][0]) for d in self.dims}
            action = None
            if self.node["inputs"]:
                action = self._value(self.node, 0, batch, {}, point)[0]
            outs = rt.envs.call(self.node["_attrs"]["env"], self.node["op"], action)
            idx = tuple(int(batch.coords[d][0]) for d in self.dims)
            for buf, v in zip(bufs, outs):
                buf[idx] = v
            return
        try:
            self._compute(batch)
        except _OpFailed as f:
            raise self._first_failure(batch, f) from None
        if self.id in rt.metric_of:
            rt.emit(self.id, batch)

    def _first_failure(self, batch: _Batch, failed: "_OpFailed") -> RunError:
        """The error of the first point of a failed batch, in the order of the statement's
        dims (a batched op cannot say which point failed): the batch is recomputed point by
        point."""
        cols = [batch.coords[d] for d in self.dims]
        for k in np.lexsort(list(reversed(cols))) if batch.n > 1 else range(batch.n):
            if batch.n > 1:
                one = _Batch({d: c[k : k + 1] for d, c in batch.coords.items()}, 1, None)
                if self.node["op"] == "merge":
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
        bufs = self.rt.buffers[self.id]
        idx = tuple(batch.coords[d] for d in self.dims)
        if self.node["op"] == "merge":
            for k, pos in enumerate(batch.branches):
                if len(pos) == 0:
                    continue
                sub = (
                    batch
                    if len(pos) == batch.n
                    else _Batch({d: c[pos] for d, c in batch.coords.items()}, len(pos), None)
                )
                v = self._value(self.node, k, sub, {}, None)
                bufs[0][tuple(i[pos] for i in idx) if idx else ()] = v if idx else v[0]
        else:
            outs = self._eval(self.id, batch, {})
            for buf, v in zip(bufs, outs):
                if idx:
                    buf[idx] = v
                else:
                    buf[()] = v[0]

    def _value(self, node: dict, k: int, batch: _Batch, memo: dict, point) -> np.ndarray:
        """Input ``k`` of ``node`` over the batch: ``(n or 1, ...)``."""
        read = node["_reads"][k]
        if not read.stored:
            if read.src not in memo:
                memo[read.src] = self._eval(read.src, batch, memo)
            return memo[read.src][read.out]
        src = self.rt.buffers[read.src][read.out]
        values = [batch.coords[d] for d in node["dims"]]
        if read.broadcast:
            values = [v[:1] for v in values]
        idx, batched = read.index(values)
        return src[idx] if batched else src[idx][None]  # [None]: one value for the batch

    def _eval(self, nid: int, batch: _Batch, memo: dict) -> tuple:
        node = self.nodes[nid]
        args = [self._value(node, k, batch, memo, None) for k in range(len(node["inputs"]))]
        t = node["types"][0]
        point = {d: batch.coords[d] for d in node["dims"]}
        try:
            out = kernels.run_op(
                node["op"], node["_attrs"], args, (batch.n,), point, t["dtype"], tuple(t["shape"])
            )
        except (ValueError, IndexError, OverflowError, ZeroDivisionError) as e:
            raise _OpFailed(node["where"], e) from None
        return (out,)


class CpuRuntime:
    def __init__(self, plan: dict, on_metric: MetricSink | None = None):
        self.plan = plan
        self.on_metric = on_metric
        self.buffers: dict[int, list[np.ndarray]] = {}
        for sid, b in plan["buffers"].items():
            ext = tuple(b["extents"])
            self.buffers[int(sid)] = [
                np.zeros(ext + tuple(o["shape"]), kernels.numpy_dtype(o["dtype"]))
                for o in b["outputs"]
            ]
        self.metric_of = {nid: name for name, (nid, _) in plan["metrics"].items()}
        self.envs = EnvRunner.of_plan(plan)
        self.statements = {
            int(sid): _Statement(int(sid), spec, plan, self)
            for sid, spec in plan["statements"].items()
        }
        self.tree = self._compile(plan["tree"])

    def emit(self, nid: int, batch: _Batch):
        if self.on_metric is None:
            return
        name = self.metric_of[nid]
        st = self.statements[nid]
        buf = self.buffers[nid][0]
        if not st.dims:
            self.on_metric(name, {}, buf[()])
            return
        cols = [batch.coords[d] for d in st.dims]
        for k in np.lexsort(list(reversed(cols))):
            p = tuple(int(c[k]) for c in cols)
            self.on_metric(name, dict(zip(st.dims, p)), buf[p][()])

    # ------------------------------------------------------------------ the loop tree
    def _compile(self, items) -> Callable[[dict], None]:
        steps = [self._item(it) for it in items]

        def run(env):
            for s in steps:
                s(env)

        return run

    def _item(self, it):
        if "for" in it:
            var, init, cond, inc = it["for"], _expr(it["init"]), _expr(it["cond"]), it["inc"]
            body = self._compile(it["body"])
            inc = int(inc)

            def loop(env):
                env[var] = init(env)
                while cond(env):
                    body(env)
                    env[var] += inc

            return loop
        if "if" in it:
            cond = _expr(it["if"])
            then, other = self._compile(it["then"]), self._compile(it["else"])

            def branch(env):
                if cond(env):
                    then(env)
                else:
                    other(env)

            return branch
        st = self.statements[it["call"]]
        args = [_expr(a) for a in it["args"]]

        def call(env):
            st.run(tuple(int(a(env)) for a in args))

        return call

    def run(self):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # nan of an empty mean is a value
            self.tree({})

    def value(self, name: str) -> np.ndarray:
        nid, out = self.plan["outputs"].get(name) or self.plan["metrics"][name]
        return self.buffers[nid][out]


def _expr(e) -> Callable[[dict], int]:
    """A loop-tree expression (JSON: int, name, or [op, args...]) as a function of the
    loop variables."""
    if isinstance(e, bool):
        return lambda env: e
    if isinstance(e, int):
        return lambda env: e
    if isinstance(e, str):
        return lambda env: env[e]
    op, *rest = e
    args = [_expr(a) for a in rest]
    if op == "neg":
        (a,) = args
        return lambda env: -a(env)
    if op == "select":
        c, a, b = args
        return lambda env: a(env) if c(env) else b(env)
    if op in ("and", "or", "add", "mul", "min", "max"):
        fn = _FOLD[op]

        def fold(env):
            acc = args[0](env)
            for a in args[1:]:
                acc = fn(acc, a(env))
            return acc

        return fold
    a, b = args
    fn = _BINARY[op]
    return lambda env: fn(a(env), b(env))


_FOLD = {
    "and": lambda x, y: bool(x) and bool(y),
    "or": lambda x, y: bool(x) or bool(y),
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
    "min": min,
    "max": max,
}
_BINARY = {
    "sub": lambda x, y: x - y,
    "fdiv_q": lambda x, y: x // y,
    "pdiv_q": lambda x, y: x // y,
    "pdiv_r": lambda x, y: x % y,
    "zdiv_r": lambda x, y: int(np.fmod(x, y)),
    "eq": lambda x, y: x == y,
    "le": lambda x, y: x <= y,
    "lt": lambda x, y: x < y,
    "ge": lambda x, y: x >= y,
    "gt": lambda x, y: x > y,
}
