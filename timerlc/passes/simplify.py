"""Simplification: identities bypassed, common subexpressions shared, dead nodes dropped.

In: a PDG after autodiff. Out: an equivalent PDG with fewer nodes:
- **identities**: a read of a node that only passes its input on (``copy``, ``stop_grad``
  after autodiff, a one-equation tensor's ``merge`` whose condition covers its domain)
  reads that input directly, through the composed access (``y[t] = x[t+1]`` read at
  ``y[t-1]`` reads ``x[t]``). Defs, record fields and gradients leave many such chains.
- **common subexpressions**: nodes with the same op, domain, attributes and inputs are one
  node (random ops included: their values are a function of their key and point;
  environment calls never).
- **dead code**: nodes that no output, metric or environment call depends on are dropped,
  and ids are renumbered (a run-time failure in a dead tensor is not reported).
Named tensors that are outputs or metrics keep their nodes.
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from timerlc import ops
from timerlc.ir import index as ix
from timerlc.ir.pdg import Edge, Graph, Node, Point, Range, identity_access, input_type
from timerlc.poly import isl as pisl


def simplify(graph: Graph) -> Graph:
    roots = {graph.tensor(name).node for name in (*graph.outputs, *graph.metrics)}
    roots |= {n.id for n in graph.nodes if ops.is_env(n.op)}
    nodes = list(graph.nodes)
    identities = {n.id: n.inputs[0] for n in nodes if _is_identity(graph, n)}
    for _ in range(len(nodes)):
        changed = _bypass(graph, nodes, identities)
        changed |= _share(nodes, roots)
        if not changed:
            break
    return _drop_dead(graph, nodes, roots)


def _is_identity(graph: Graph, n: Node) -> bool:
    if len(n.inputs) != 1 or len(n.types) != 1 or ops.is_env(n.op):
        return False
    e = n.inputs[0]
    if input_type(graph, e) != n.types[0]:
        return False
    if n.op in ("copy", "stop_grad"):
        return e.cond is None
    if n.op != "merge" or not n.dims:
        return False
    if e.cond is None:
        return True
    dom = pisl.cond_set(n.dims, n.domain.cond)
    return dom.is_subset(pisl.cond_set(n.dims, n.domain.cond & e.cond))


def _compose(outer: Edge, inner: Edge, mid: Node) -> Edge | None:
    """The edge that reads ``inner``'s source where ``outer`` reads ``mid`` (which passes
    ``inner`` on), or None when the accesses do not compose to points and ranges."""
    if all(isinstance(a, Point) for a in outer.access):
        at = {d: a.expr for d, a in zip(mid.dims, outer.access)}
        access = tuple(
            Point(sympy.expand(ix.substitute(a.expr, at)))
            if isinstance(a, Point)
            else Range(
                sympy.expand(ix.substitute(a.lo, at)), sympy.expand(ix.substitute(a.hi, at))
            )
            for a in inner.access
        )
    elif inner.access == identity_access(mid.dims):
        access = outer.access
    else:
        return None
    return Edge(inner.src, access, inner.out, outer.cond, outer.span)


def _bypass(graph: Graph, nodes: list[Node], identities: dict[int, Edge]) -> bool:
    changed = False
    for k, n in enumerate(nodes):
        inputs = list(n.inputs)
        for j, e in enumerate(inputs):
            seen = 0
            while e.src in identities and e.out == 0 and seen < len(nodes):
                new = _compose(e, identities[e.src], graph.node(e.src))
                if new is None:
                    break
                e, seen = new, seen + 1
            if seen:
                inputs[j] = e
        if inputs != list(n.inputs):
            nodes[k] = replace(n, inputs=tuple(inputs))
            if n.id in identities:
                identities[n.id] = nodes[k].inputs[0]
            changed = True
    return changed


def _key(n: Node):
    return (
        n.op,
        n.domain,
        n.types,
        _exact(n.attrs),
        tuple((e.src, e.out, e.access, e.cond) for e in n.inputs),
    )


def _exact(v):
    """``v`` with every float as its exact text: -0.0 is not 0.0 here (``x / -0.0`` is
    -inf), and a nan is equal to itself."""
    if isinstance(v, float):
        return ("float", v.hex())
    if isinstance(v, tuple):
        return tuple(_exact(x) for x in v)
    return v


def _share(nodes: list[Node], roots: set[int]) -> bool:
    canonical: dict = {}
    alias: dict[int, int] = {}
    for n in nodes:
        if ops.is_env(n.op) or n.op == "merge":
            continue
        key = _key(n)
        if key in canonical:
            alias[n.id] = canonical[key]
        else:
            canonical[key] = n.id
    if not alias:
        return False
    changed = False
    for k, n in enumerate(nodes):
        if any(e.src in alias for e in n.inputs):
            inputs = tuple(replace(e, src=alias[e.src]) if e.src in alias else e for e in n.inputs)
            nodes[k] = replace(n, inputs=inputs)
            changed = True
    return changed


def _drop_dead(graph: Graph, nodes: list[Node], roots: set[int]) -> Graph:
    live: set[int] = set()
    todo = list(roots)
    while todo:
        k = todo.pop()
        if k in live:
            continue
        live.add(k)
        todo.extend(e.src for e in nodes[k].inputs)
    order = [n for n in nodes if n.id in live]
    new_id = {n.id: k for k, n in enumerate(order)}
    renumbered = tuple(
        replace(
            n,
            id=new_id[n.id],
            inputs=tuple(replace(e, src=new_id[e.src]) for e in n.inputs),
        )
        for n in order
    )
    tensors = tuple(replace(t, node=new_id[t.node]) for t in graph.tensors if t.node in new_id)
    return graph.replace(nodes=renumbered, tensors=tensors)
