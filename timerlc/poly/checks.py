"""Polyhedral checks of a PDG (LANGUAGE.md section 11), each ``check_<property>(graph)``.

- ``check_reads``: every read lands inside the domain of what it reads, slices have no
  negative length, and dim-dependent spatial indices stay inside their axes.
- ``check_acyclic``: no point depends on itself.
Failures are ``ProgramError``s at the span of the read or equation, with an example point.
"""
from __future__ import annotations

import islpy as isl

from timerlc.diagnostics import ProgramError
from timerlc.ir import index as ix
from timerlc.ir.pdg import Graph, Node, Range, access_to_text, input_type
from timerlc.poly import isl as pisl


def check_all(graph: Graph):
    check_reads(graph)
    check_acyclic(graph)


def _label(graph: Graph, nid: int) -> str:
    n = graph.node(nid)
    return n.name if n.name is not None else f"%{nid}"


def check_reads(graph: Graph):
    sets: dict[int, isl.Set] = {}

    def dom(n: Node) -> isl.Set:
        if n.id not in sets:
            sets[n.id] = pisl.domain_set(n.domain)
        return sets[n.id]

    for n in graph.nodes:
        if n.op == "merge":
            continue
        if n.op == "index":
            _check_spatial(graph, n)
        consumer = dom(n)
        if consumer.is_empty():
            continue
        for e in n.inputs:
            src = graph.node(e.src)
            for a in e.access:
                if isinstance(a, Range) and not a.is_static:
                    bad = pisl.cond_set(n.dims, n.domain.cond & (a.hi < a.lo))
                    p = pisl.sample(bad, n.dims)
                    if p is not None:
                        raise ProgramError(
                            f"slice {ix.to_text(a.lo)}:{ix.to_text(a.hi)} of '{_label(graph, e.src)}' has "
                            f"negative length at {pisl.format_point(p)}",
                            e.span or n.span,
                        )
            if not src.dims:
                continue
            amap = pisl.access_map(n.domain, e.access, len(src.dims))
            target = _rename(dom(src), len(src.dims))
            bad = amap.subtract_range(target)
            if bad.is_empty():
                continue
            where = bad.domain().lexmin()
            p = pisl.point_of(where.sample_point(), n.dims)
            reads = bad.intersect_domain(where).range().lexmin().sample_point()
            q = [reads.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(len(src.dims))]
            name = _label(graph, e.src)
            raise ProgramError(
                f"read {name}{access_to_text(e.access)} falls outside the domain of '{name}': "
                f"at {pisl.format_point(p)} it reads {name}[{', '.join(map(str, q))}], which is not defined",
                e.span or n.span,
            )


def _rename(s: isl.Set, n: int) -> isl.Set:
    """The same set with its dims named s_0..s_{n-1} (the producer side of access maps)."""
    for k in range(n):
        s = s.set_dim_name(isl.dim_type.set, k, f"s_{k}")
    return s.reset_tuple_id()


def _check_spatial(graph: Graph, n: Node):
    shape = input_type(graph, n.inputs[0]).shape
    for axis, item in enumerate(n.attr("items")):
        if item[0] not in ("int", "slice") or ix.is_constant(item[1]):
            continue
        length = item[2] if item[0] == "slice" else 1
        extent = shape[axis]
        bad = pisl.cond_set(n.dims, n.domain.cond & ((item[1] < 0) | (item[1] + length > extent)))
        p = pisl.sample(bad, n.dims)
        if p is not None:
            what = "index" if item[0] == "int" else "slice start"
            raise ProgramError(
                f"spatial {what} {ix.to_text(item[1])} falls outside axis {axis} of length {extent} "
                f"at {pisl.format_point(p)}",
                n.span,
            )


def _merge_relations(graph: Graph) -> dict[int, isl.UnionMap]:
    """For each merge node, the merge points each of its points reads (transitively
    through the non-merge nodes of its equations)."""
    reach: dict[int, isl.UnionMap] = {}

    def tag(nid):
        return f"n{nid}"

    def edge_map(n: Node, e) -> isl.UnionMap:
        src = graph.node(e.src)
        consumer = n.domain if e.cond is None else type(n.domain)(n.dims, n.domain.cond & e.cond)
        m = pisl.access_map(consumer, e.access, len(src.dims), src_tag=tag(src.id), dst_tag=tag(n.id))
        return isl.UnionMap.from_map(m)

    def frontier(nid: int) -> isl.UnionMap | None:
        if nid in reach:
            return reach[nid]
        n = graph.node(nid)
        total = None
        for e in n.inputs:
            m = edge_map(n, e)
            src = graph.node(e.src)
            if src.op != "merge":
                sub = frontier(src.id)
                if sub is None:
                    continue
                m = m.apply_range(sub)
            total = m if total is None else total.union(m)
        reach[nid] = total
        return total

    out = {}
    for n in graph.nodes:
        if n.op == "merge":
            total = None
            for e in n.inputs:
                m = edge_map(n, e)
                src = graph.node(e.src)
                if src.op != "merge":
                    sub = frontier(src.id)
                    if sub is None:
                        continue
                    m = m.apply_range(sub)
                total = m if total is None else total.union(m)
            if total is not None and not total.is_empty():
                out[n.id] = total
    return out


def _sccs(nodes, succ) -> list[list[int]]:
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        work = [(v, iter(succ.get(v, ())))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(succ.get(w, ()))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                out.append(comp)

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def check_acyclic(graph: Graph):
    rel = _merge_relations(graph)
    succ: dict[int, set[int]] = {}
    for nid, m in rel.items():
        targets = set()
        m.foreach_map(lambda mp: targets.add(int(mp.get_tuple_name(isl.dim_type.out)[1:])))
        succ[nid] = targets
    for comp in _sccs(list(rel), succ):
        if len(comp) == 1 and comp[0] not in succ.get(comp[0], ()):
            continue
        members = set(comp)
        total = None
        for nid in comp:
            part = rel[nid]
            keep = []
            part.foreach_map(lambda mp: keep.append(mp) if int(mp.get_tuple_name(isl.dim_type.out)[1:]) in members else None)
            for mp in keep:
                u = isl.UnionMap.from_map(mp)
                total = u if total is None else total.union(u)
        if total is None:
            continue
        closure, exact = total.transitive_closure()
        for nid in sorted(comp):
            node = graph.node(nid)
            space_maps = []
            closure.foreach_map(lambda mp: space_maps.append(mp))
            for mp in space_maps:
                if mp.get_tuple_name(isl.dim_type.in_) != f"n{nid}" or mp.get_tuple_name(isl.dim_type.out) != f"n{nid}":
                    continue
                fixed = mp.intersect(isl.Map.identity(mp.get_space()))
                if fixed.is_empty():
                    continue
                pt = fixed.domain().lexmin().sample_point()
                p = pisl.point_of(pt, node.dims)
                if not exact and not _confirm_cycle(total, nid, fixed.domain().lexmin()):
                    continue
                others = sorted({graph.node(m).name or f"%{m}" for m in comp if m != nid})
                via = f" (through {', '.join(others)})" if others else ""
                span = _defining_span(node, p)
                raise ProgramError(
                    f"cyclic definition: '{node.name}' at {pisl.format_point(p)} depends on itself{via}",
                    span,
                )


def _confirm_cycle(rel: isl.UnionMap, nid: int, start: isl.Set, limit: int = 100000) -> bool:
    start_u = isl.UnionSet.from_set(start)
    frontier = start_u.apply(rel)
    reached = frontier
    for _ in range(limit):
        if not start_u.intersect(reached).is_empty():
            return True
        frontier = frontier.apply(rel).subtract(reached)
        if frontier.is_empty():
            return False
        reached = reached.union(frontier)
    return True


def _defining_span(node: Node, point: dict[str, int]):
    for e in node.inputs:
        if e.cond is None or ix.holds(e.cond, point):
            return e.span or node.span
    return node.span
