"""``verify(graph)``: the invariants every PDG keeps between passes.

In: a PDG. Out: nothing, or ``VerifyError`` (an internal error: a pass broke the graph)
whose message names the broken invariant and shows the IR around the bad node.

- every dim is a name; every node's dims are dims of the graph, and its domain and the
  index expressions of its attributes use them only;
- every edge reads a node that exists, an output it has, with one access entry per dim of
  the source, over the reader's dims only (conditions too);
- every op is in the registry; ``grad`` only before the autodiff pass (``lowered``);
- every node's types are what its op's type rule gives for its inputs (``input_type``),
  for every op with a rule (merges: their inputs' type; environment calls are typed by
  the front end);
- every tensor, output and metric names a node that exists.

The polyhedral checks (reads inside domains, no cycles) are the front end's
(``poly.checks``); they cost seconds on a program like PPO, so they are not run again here.
"""

from __future__ import annotations

import re

from timerlc import ops
from timerlc.ir import index as ix
from timerlc.ir.pdg import Graph, Node, Range, input_type


class VerifyError(AssertionError):
    """A PDG that breaks an invariant: a bug in the pass that made it."""


def verify(graph: Graph, lowered: bool = False) -> None:
    """Check ``graph``'s invariants; ``lowered``: after autodiff (no ``grad`` left)."""
    dims = set()
    for d in graph.dims:
        if not isinstance(d.name, str) or not _NAME.match(d.name):
            raise VerifyError(f"{d.name!r:.60} is not a dim name")
        dims.add(d.name)
    names = {t.name for t in graph.tensors}
    for t in graph.tensors:
        if not 0 <= t.node < len(graph.nodes) or t.out >= len(graph.node(t.node).types):
            raise VerifyError(f"tensor {t.name} names %{t.node}.{t.out}, which does not exist")
    for name in graph.outputs + graph.metrics:
        if name not in names:
            raise VerifyError(f"output or metric {name} is not a tensor")
    for n in graph.nodes:
        if not set(n.dims) <= dims:
            _fail(graph, n, f"dims {list(n.dims)} are not all dims of the graph")
        used = ix.dims_of(n.domain.cond).union(*(_index_dims(v) for _, v in n.attrs))
        if not used <= set(n.dims):
            _fail(graph, n, f"its domain or attributes use {sorted(used - set(n.dims))}")
        _edges(graph, n, lowered)
    # each op's own type first, then merges (which only compare their inputs' types), so a
    # wrongly typed node is reported itself rather than at the merge that reads it
    for n in sorted(graph.nodes, key=lambda n: n.op == "merge"):
        _types(graph, n)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _index_dims(value) -> frozenset[str]:
    """The dims the index expressions in an attribute's value use (in tuples too)."""
    if isinstance(value, tuple):
        return frozenset().union(*(_index_dims(v) for v in value))
    if isinstance(value, (bool, int, float, str)) or value is None:
        return frozenset()
    return ix.dims_of(value)


def _fail(graph: Graph, n: Node, message: str):
    from timerlc.ir import serialize

    try:
        lines = serialize.to_text(graph).splitlines()
    except Exception:  # a graph broken enough not to print: the message alone says it
        lines = []
    mark = re.compile(rf"(^|\s)%{n.id} = ")
    at = next((k for k, line in enumerate(lines) if mark.search(line)), None)
    around = "" if at is None else "\n".join(lines[max(at - 3, 0) : at + 4])
    raise VerifyError(f"%{n.id} ({n.op}): {message}\n{around}")


def _edges(graph: Graph, n: Node, lowered: bool):
    if n.op not in ops.REGISTRY:
        _fail(graph, n, "an op the registry does not have")
    if lowered and n.op == "grad":
        _fail(graph, n, "a grad after the autodiff pass")
    dims = set(n.dims)
    for k, e in enumerate(n.inputs):
        if not 0 <= e.src < len(graph.nodes):
            _fail(graph, n, f"input {k} reads %{e.src}, which does not exist")
        src = graph.node(e.src)
        if e.out >= len(src.types):
            _fail(graph, n, f"input {k} reads output {e.out} of %{e.src}, which has fewer")
        if len(e.access) != len(src.dims):
            _fail(
                graph,
                n,
                f"input {k} indexes the {len(src.dims)} dims of %{e.src} "
                f"with {len(e.access)} entries",
            )
        used = set()
        for a in e.access:
            parts = (a.lo, a.hi) if isinstance(a, Range) else (a.expr,)
            for p in parts:
                used |= ix.dims_of(p)
        if e.cond is not None and not isinstance(e.cond, bool):
            used |= {str(s) for s in e.cond.free_symbols}
        if not used <= dims:
            _fail(graph, n, f"input {k} uses {sorted(used - dims)}, not dims of the reader")


def _types(graph: Graph, n: Node):
    if ops.get(n.op).kind in ("env", "control") and n.op != "merge":
        return  # environment calls are typed by the front end; grad by its arguments
    ins = [input_type(graph, e) for e in n.inputs]
    if n.op == "merge":
        if ins != [n.type] * len(ins):
            _fail(graph, n, f"merge of {', '.join(map(str, ins))} into {n.type}")
        return
    try:
        t = ops.infer(n.op, dict(n.attrs, _name=n.op), ins)
    except ops.TypeRuleError as e:
        _fail(graph, n, f"its inputs do not fit its op: {e}")
    if (t,) != n.types:
        _fail(graph, n, f"typed {', '.join(map(str, n.types))}, its op gives {t}")
