"""The PDG data model: frozen nodes over polyhedral domains, connected by access edges.

A node is an op evaluated at every point of its domain (a set of integer points over some
of the program's dims, given by a condition that includes the bounds). Each input is an
``Edge`` that reads a source node at an *access*: one entry per source dim, either a
``Point`` (an index expression in the consumer's dims) or a ``Range`` ``lo:hi`` that adds a
leading spatial axis of length ``hi - lo``. A user tensor defined piecewise is a ``merge``
node whose input edges carry disjoint conditions (first match wins, resolved at lowering).
Source spans ride along for diagnostics and are excluded from equality.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import sympy

from timerlc.diagnostics import Span
from timerlc.ir import index as ix
from timerlc.types import TensorType

FORMAT_VERSION = 1


def _span():
    return field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Dim:
    name: str
    bound: int


@dataclass(frozen=True, slots=True)
class Domain:
    """The points ``{ [dims] : cond }``; ``cond`` includes every bound."""

    dims: tuple[str, ...]
    cond: Any  # sympy boolean over dims

    def __str__(self) -> str:
        return f"{{[{', '.join(self.dims)}] : {ix.cond_to_text(self.cond)}}}"


SCALAR_DOMAIN = Domain((), sympy.true)


@dataclass(frozen=True, slots=True)
class Point:
    expr: Any  # sympy integer expression over the consumer's dims


@dataclass(frozen=True, slots=True)
class Range:
    lo: Any
    hi: Any

    @property
    def length(self):
        return sympy.simplify(self.hi - self.lo) if not self.is_static else int(self.hi - self.lo)

    @property
    def is_static(self) -> bool:
        return sympy.sympify(self.hi - self.lo).is_Integer


Access = tuple  # tuple[Point | Range, ...]


def identity_access(dims: tuple[str, ...]) -> Access:
    return tuple(Point(ix.sym(d)) for d in dims)


def access_to_text(access: Access) -> str:
    parts = []
    for a in access:
        if isinstance(a, Point):
            parts.append(ix.to_text(a.expr))
        else:
            parts.append(f"{ix.to_text(a.lo)}:{ix.to_text(a.hi)}")
    return "[" + ", ".join(parts) + "]"


@dataclass(frozen=True, slots=True)
class Edge:
    src: int
    access: Access
    out: int = 0
    cond: Any = None  # sympy boolean over the consumer's dims (merge branches), or None
    span: Span | None = _span()

    def is_identity_of(self, dims: tuple[str, ...]) -> bool:
        return self.cond is None and self.access == identity_access(dims)


@dataclass(frozen=True, slots=True)
class Node:
    id: int
    op: str
    domain: Domain
    inputs: tuple[Edge, ...]
    types: tuple[TensorType, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    name: str | None = None
    span: Span | None = _span()

    @property
    def dims(self) -> tuple[str, ...]:
        return self.domain.dims

    @property
    def type(self) -> TensorType:
        (t,) = self.types
        return t

    def attr(self, key: str, default=None):
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)


def make_attrs(**kw) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _freeze(v)) for k, v in kw.items() if v is not None))


def _freeze(v):
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, tuple):
        return tuple(_freeze(x) for x in v)
    return v


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor the program names (a record field is ``rec.field``)."""

    name: str
    node: int
    out: int = 0


@dataclass(frozen=True, slots=True)
class Env:
    """An environment of the program: its plugin spec and its batch dim."""

    name: str
    spec: str
    batch: str


@dataclass(frozen=True, slots=True)
class Graph:
    dims: tuple[Dim, ...]
    nodes: tuple[Node, ...]
    tensors: tuple[Tensor, ...] = ()
    outputs: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    configs: tuple[tuple[str, Any], ...] = ()
    envs: tuple[Env, ...] = ()

    def __post_init__(self):
        for k, n in enumerate(self.nodes):
            assert n.id == k, f"node {n.id} at position {k}"

    def node(self, nid: int) -> Node:
        return self.nodes[nid]

    def tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def dim_bounds(self) -> dict[str, int]:
        return {d.name: d.bound for d in self.dims}

    def consumers(self) -> dict[int, list[tuple[int, int]]]:
        """node id -> [(consumer id, input position)]."""
        out: dict[int, list[tuple[int, int]]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for k, e in enumerate(n.inputs):
                out[e.src].append((n.id, k))
        return out

    def replace(self, **kw) -> "Graph":
        return replace(self, **kw)


def input_type(graph: Graph, edge: Edge) -> TensorType:
    """The type of the value an edge delivers: one leading axis per Range, then the source's."""
    src = graph.node(edge.src).types[edge.out]
    lengths = []
    for a in edge.access:
        if isinstance(a, Range):
            n = sympy.simplify(a.hi - a.lo)
            lengths.append(int(n) if n.is_Integer else n)
    return TensorType(src.dtype, tuple(lengths) + src.shape)
