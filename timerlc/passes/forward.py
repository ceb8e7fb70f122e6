"""The forward pass: reads of a piecewise tensor that always land in one of its equations
read that equation's value directly.

In: a PDG. Out: the same PDG where an edge reading a merge at points that all fall in the
condition of one of its inputs reads that input instead, through the composed access
(``x[T-1]`` read from ``x[t] = x[t-1] + x[T-1]`` reads the node of ``x[T-1] = 2.0``).
Values are unchanged (the merge copies that input there). Why: the schedule orders whole
statements, and a statement that reads a later point of itself that another equation
defines (``x[1]`` reads ``x[T-1]``) has no loop order; once the read goes to the
equation's own node, it has one. Only point reads are forwarded, never slices.
"""

from __future__ import annotations

import sympy

from timerlc.ir import index as ix
from timerlc.ir.pdg import Domain, Edge, Graph, Point
from timerlc.poly import isl as pisl


def forward_merge_reads(graph: Graph) -> Graph:
    nodes = list(graph.nodes)
    changed = False
    for k, n in enumerate(nodes):
        inputs = list(n.inputs)
        for j, e in enumerate(inputs):
            new = _forward(graph, n, e)
            if new is not None:
                inputs[j] = new
                changed = True
        if inputs != list(n.inputs):
            nodes[k] = type(n)(
                n.id, n.op, n.domain, tuple(inputs), n.types, n.attrs, n.name, n.span
            )
    return graph.replace(nodes=tuple(nodes)) if changed else graph


def _forward(graph: Graph, n, e: Edge) -> Edge | None:
    src = graph.node(e.src)
    if src.op != "merge" or len(src.inputs) < 2 or not src.dims:
        return None
    if not all(isinstance(a, Point) for a in e.access):
        return None
    if n.op == "merge" and e.cond is None:
        return None
    consumer = n.domain if e.cond is None else Domain(n.dims, n.domain.cond & e.cond)
    amap = pisl.access_map(consumer, e.access, len(src.dims))
    if amap.is_empty():
        return None
    read = amap.range()
    names = [f"s_{k}" for k in range(len(src.dims))]
    mapping = {d: ix.sym(s) for d, s in zip(src.dims, names)}
    for branch in src.inputs:
        where = (
            pisl.cond_set(tuple(names), ix.substitute(branch.cond, mapping))
            if (branch.cond is not None)
            else None
        )
        if where is None or not read.is_subset(where.reset_tuple_id()):
            continue
        if not all(isinstance(a, Point) for a in branch.access):
            return None
        point = {d: a.expr for d, a in zip(src.dims, e.access)}
        access = tuple(Point(sympy.expand(ix.substitute(a.expr, point))) for a in branch.access)
        return Edge(branch.src, access, branch.out, e.cond, e.span)
    return None
