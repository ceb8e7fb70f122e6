"""The reference interpreter: evaluates a PDG point by point with NumPy, on demand.

It is the semantic oracle of timerlc: simple rather than fast. Every node that is read at
another point than its consumer's (tensors, constants, anything read through a shifted
index or a slice) is *stored* in a dense buffer over its domain's bounding box, with a
mask of the points computed so far. Asking for a point computes first the stored points it
reads (an explicit stack, so long recurrences do not exhaust Python's recursion), then the
point itself, walking the expression nodes of its equation. Every point of every tensor is
computed, in the lexicographic order of the dims, so metrics stream in the order a user
expects. Points outside a tensor's domain stay 0 in its buffer.
"""

from __future__ import annotations

import math

import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from timerlc import ops
from timerlc.diagnostics import RunError
from timerlc.ir import index as ix
from timerlc.ir.pdg import Edge, Graph, Node, Point, identity_access
from timerlc.poly import isl as pisl
from timerlc.reference.envs import EnvCalls

MetricSink = Callable[[str, dict, float], None]


@dataclass
class _Store:
    node: Node
    extents: tuple[int, ...]
    bufs: list[np.ndarray]  # one per output of the node
    done: np.ndarray  # bool, over extents
    active: np.ndarray  # bool: expanded on the stack, waiting for its inputs
    inside: np.ndarray  # bool: in the node's domain
    branch: np.ndarray | None  # merges: the input chosen at each point (-1: none)


class _Access:
    """An edge's access, compiled to Python functions of the consumer's dims."""

    def __init__(self, edge: Edge, dims: tuple[str, ...]):
        self.parts = []
        for a in edge.access:
            if isinstance(a, Point):
                self.parts.append((ix.compile_expr(a.expr, dims), None))
            else:
                self.parts.append((ix.compile_expr(a.lo, dims), ix.compile_expr(a.hi, dims)))

    def at(self, values: tuple[int, ...]) -> tuple:
        out = []
        for lo, hi in self.parts:
            if hi is None:
                out.append(int(lo(*values)))
            else:
                out.append(slice(int(lo(*values)), int(hi(*values))))
        return tuple(out)


def stored_nodes(graph: Graph) -> set[int]:
    """The nodes the interpreter keeps a buffer of: tensors, scalars, and whatever some
    consumer reads at another point."""
    stored = set()
    for n in graph.nodes:
        if n.op == "merge" or ops.is_env(n.op) or not n.dims:
            stored.add(n.id)
        for e in n.inputs:
            src = graph.node(e.src)
            if src.dims != n.dims or e.access != identity_access(n.dims):
                stored.add(e.src)
    return stored


def needed_bytes(graph: Graph) -> int:
    """The bytes of the buffers ``run`` makes: per stored node, its values and its masks
    over the bounding box of its domain."""
    total = 0
    for nid in stored_nodes(graph):
        node = graph.node(nid)
        points = math.prod(pisl.extents(node.dims, node.domain.cond)) if node.dims else 1
        per_point = sum(
            math.prod(t.shape) * np.dtype(ops.numpy_dtype(t.dtype)).itemsize for t in node.types
        )
        masks = 3 + (8 if node.op == "merge" else 0) + 8 * len(node.dims)  # and the grids
        total += points * (per_point + masks)
    return total


class Interpreter:
    def __init__(
        self,
        graph: Graph,
        on_metric: MetricSink | None = None,
        profile: bool = False,
        allow_nonfinite: bool = False,
    ):
        self.graph = graph
        self.on_metric = on_metric
        self.metric_nodes = {graph.tensor(m).node: m for m in graph.metrics}
        self.stored = stored_nodes(graph)
        self.stores: dict[int, _Store] = {}
        self.access: dict[tuple[int, int], _Access] = {}
        for n in graph.nodes:
            for k, e in enumerate(n.inputs):
                self.access[(n.id, k)] = _Access(e, n.dims)
        self.profile = profile
        self.seconds: dict[int, float] = {}
        self.attrs: dict[int, dict] = {}  # per node, its attributes for the kernels
        self.owners = self._owners()
        self.envs = EnvCalls(
            graph, lambda nid: np.argwhere(self.store(nid).inside), allow_nonfinite
        )

    # ------------------------------------------------------------------ setup
    def _owners(self) -> dict[int, str]:
        """For error messages: the tensor each unnamed node computes a part of."""
        owner: dict[int, str] = {}
        for n in self.graph.nodes:
            if n.op != "merge":
                continue
            todo = [e.src for e in n.inputs]
            while todo:
                nid = todo.pop()
                node = self.graph.node(nid)
                if node.op == "merge" or nid in owner:
                    continue
                owner[nid] = n.name
                todo.extend(e.src for e in node.inputs)
        return owner

    def store(self, nid: int) -> _Store:
        st = self.stores.get(nid)
        if st is None:
            st = self.stores[nid] = self._make_store(self.graph.node(nid))
        return st

    def _make_store(self, node: Node) -> _Store:
        extents = pisl.extents(node.dims, node.domain.cond) if node.dims else ()
        bufs = [np.zeros(extents + tuple(t.shape), ops.numpy_dtype(t.dtype)) for t in node.types]
        grids = np.indices(extents, dtype=np.int64) if node.dims else ()
        inside = np.asarray(ix.compile_cond(node.domain.cond, node.dims)(*grids), bool)
        inside = np.broadcast_to(inside, extents).copy()
        branch = None
        if node.op == "merge":
            branch = np.full(extents, -1, np.int64)
            for k, e in enumerate(node.inputs):
                hold = np.broadcast_to(
                    np.asarray(ix.compile_cond(e.cond, node.dims)(*grids), bool), extents
                )
                branch[hold & (branch == -1) & inside] = k
        return _Store(
            node, extents, bufs, np.zeros(extents, bool), np.zeros(extents, bool), inside, branch
        )

    # ------------------------------------------------------------------ evaluation
    def run(self) -> None:
        """Compute every point of every tensor, in the lexicographic order of the dims."""
        order = [d.name for d in self.graph.dims]
        roots = []
        for rank, tensor in enumerate(self.graph.tensors):
            node = self.graph.node(tensor.node)
            st = self.store(node.id)
            pts = np.argwhere(st.inside) if node.dims else np.zeros((1, 0), np.int64)
            if len(pts) == 0:
                continue
            keys = np.full((len(pts), len(order)), -1, np.int64)
            for k, d in enumerate(node.dims):
                keys[:, order.index(d)] = pts[:, k]
            roots.append((keys, np.full(len(pts), rank), pts, node.id))
        if not roots:
            return
        keys = np.concatenate([r[0] for r in roots])
        ranks = np.concatenate([r[1] for r in roots])
        which = np.concatenate([np.full(len(r[2]), j) for j, r in enumerate(roots)])
        local = np.concatenate([np.arange(len(r[2])) for r in roots])
        perm = np.lexsort([ranks] + [keys[:, k] for k in reversed(range(keys.shape[1]))])
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # nan of an empty mean is a value
            for j in perm:
                _, _, pts, nid = roots[which[j]]
                self.ensure(nid, tuple(int(v) for v in pts[local[j]]))

    def value(self, name: str) -> np.ndarray:
        """A tensor's buffer (computed by ``run``): its bounding box, 0 outside its domain."""
        t = self.graph.tensor(name)
        return self.store(t.node).bufs[t.out]

    def computed(self, name: str) -> np.ndarray:
        """Which points of a tensor's bounding box ``run`` computed (bool)."""
        return self.store(self.graph.tensor(name).node).done.copy()

    def ensure(self, nid: int, point: tuple[int, ...]) -> None:
        """Compute a stored point, after the stored points it reads."""
        if self.store(nid).done[point]:
            return
        stack = [(nid, point)]
        while stack:
            n, p = stack[-1]
            st = self.store(n)
            if st.done[p]:
                stack.pop()
                continue
            try:
                self._compute_stored(n, p)
            except _Missing as missing:
                # ``active`` marks the points on the current path of the depth-first walk;
                # needing one of them again is a cycle
                st.active[p] = True
                for m in missing.points:
                    if self.store(m[0]).active[m[1]]:
                        raise RunError(
                            f"cyclic definition: {self._where(*m)} depends on itself"
                        ) from None
                    stack.append(m)
                continue
            stack.pop()

    def _where(self, nid: int, p, span=None) -> str:
        node = self.graph.node(nid)
        what = node.name or self.owners.get(nid) or f"%{nid}"
        span = span or node.span
        line = f" (line {span.line})" if span is not None else ""
        return f"{what} at {pisl.format_point(dict(zip(node.dims, p)))}{line}"

    def _edges_at(self, node: Node, point: dict) -> list[tuple[int, Edge]]:
        if node.op == "merge":
            st = self.store(node.id)
            k = int(st.branch[tuple(point[d] for d in node.dims)])
            return [(k, node.inputs[k])]
        return list(enumerate(node.inputs))

    def _compute_stored(self, nid: int, p: tuple[int, ...]):
        st = self.store(nid)
        point = dict(zip(st.node.dims, p))
        start = time.perf_counter() if self.profile else 0.0
        try:
            value = self._compute(nid, point, {})
        except (RunError, _Missing):
            raise
        except (ValueError, IndexError, OverflowError, ZeroDivisionError) as e:
            # (the line of the op that failed, as the cpu runtime's message names it)
            span = getattr(e, "timerlc_span", None)
            raise RunError(f"while computing {self._where(nid, p, span)}: {e}") from None
        for buf, v in zip(st.bufs, value):
            buf[p] = v
        st.done[p] = True
        st.active[p] = False
        if self.profile:
            self.seconds[nid] = self.seconds.get(nid, 0.0) + time.perf_counter() - start
        if nid in self.metric_nodes and self.on_metric is not None:
            self.on_metric(self.metric_nodes[nid], point, st.bufs[0][p][()])

    def _compute(self, nid: int, point: dict, memo: dict) -> tuple:
        """The outputs of node ``nid`` at ``point`` (a tuple, one array per output)."""
        node = self.graph.node(nid)
        values = tuple(point[d] for d in node.dims)
        if ops.is_env(node.op):
            first = self.envs.before(nid, values)
            if first is not None and not self.store(first[0]).done[first[1]]:
                raise _Missing([first])
        args = []
        for k, e in self._edges_at(node, point):
            if e.src in self.stored:
                src = self.store(e.src)
                idx = self.access[(nid, k)].at(values)
                done = src.done[idx]
                if not (done if done.ndim == 0 else done.all()):
                    raise _Missing(_missing_points(done, idx, src, self.graph, e.src))
                args.append(src.bufs[e.out][idx])
            else:
                if e.src not in memo:
                    memo[e.src] = self._compute(e.src, point, memo)
                args.append(memo[e.src][e.out])
        if node.op == "merge":
            return (args[0],)
        if ops.is_env(node.op):
            try:
                return self.envs.call(node, args[0] if args else None)
            except RunError as e:
                raise RunError(f"while computing {self._where(nid, values)}: {e}") from e
        # the op's kernel at this one point (the numerics the cpu runtime runs over batches)
        try:
            out = ops.run_op(node.op, self._attrs(node), args, (), point, *self._type(node))
        except (ValueError, IndexError, OverflowError, ZeroDivisionError) as e:
            if node.span is not None:
                e.timerlc_span = node.span  # (this op's: the one that failed)
            raise
        return (out,)

    def _attrs(self, node: Node) -> dict:
        """The node's attributes as the kernels take them (index expressions as ``Ix``)."""
        attrs = self.attrs.get(node.id)
        if attrs is None:
            attrs = self.attrs[node.id] = {k: ix.plan_value(v) for k, v in node.attrs}
        return attrs

    @staticmethod
    def _type(node: Node) -> tuple[str, tuple]:
        (t,) = node.types
        return t.dtype, t.shape


class _Missing(Exception):
    """A point needs stored points that are not computed yet."""

    def __init__(self, points):
        super().__init__(len(points))
        self.points = points


def _missing_points(done, idx: tuple, st: _Store, graph: Graph, src: int):
    """The (src, point) pairs not yet computed among those ``idx`` reads."""
    if done.ndim == 0:
        if not st.inside[idx]:
            raise RunError(
                f"internal error: read of {graph.node(src).name or src} outside its domain at {idx}"
            )
        return [(src, idx)]
    out = []
    inside = st.inside[idx]
    for rel in np.argwhere(~done):
        p, j = [], 0
        for part in idx:
            if isinstance(part, slice):
                p.append(part.start + int(rel[j]))
                j += 1
            else:
                p.append(part)
        if not inside[tuple(rel)]:
            raise RunError(
                f"internal error: read of {graph.node(src).name or src} outside its domain at {p}"
            )
        out.append((src, tuple(p)))
    return out


def run_graph(
    graph: Graph, on_metric: MetricSink | None = None, profile: bool = False
) -> Interpreter:
    interp = Interpreter(graph, on_metric, profile)
    interp.run()
    return interp


def outputs(interp: Interpreter) -> dict[str, np.ndarray]:
    """The ``out`` tensors, as LANGUAGE.md section 12 says ``--outputs`` holds them."""
    return {name: interp.value(name) for name in interp.graph.outputs}
