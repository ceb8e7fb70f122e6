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
        if n.op in ("max", "min", "argmax", "argmin"):
            _check_nonempty(graph, n)
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
                            f"slice {ix.to_text(a.lo)}:{ix.to_text(a.hi)} of "
                            f"'{_label(graph, e.src)}' has "
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
            q = [
                reads.get_coordinate_val(isl.dim_type.set, k).to_python()
                for k in range(len(src.dims))
            ]
            name = _label(graph, e.src)
            raise ProgramError(
                f"read {name}{access_to_text(e.access)} falls outside the domain of '{name}': "
                f"at {pisl.format_point(p)} it reads {name}[{', '.join(map(str, q))}], which is "
                "not defined",
                e.span or n.span,
            )


def _rename(s: isl.Set, n: int) -> isl.Set:
    """The same set with its dims named s_0..s_{n-1} (the producer side of access maps)."""
    for k in range(n):
        s = s.set_dim_name(isl.dim_type.set, k, f"s_{k}")
    return s.reset_tuple_id()


def _check_spatial(graph: Graph, n: Node):
    """Dim-dependent spatial indices: an index may count from the end as in NumPy
    (-extent <= e < extent); a slice [start, start + length) must lie inside the axis."""
    shape = input_type(graph, n.inputs[0]).shape
    for axis, item in enumerate(n.attr("items")):
        if item[0] not in ("int", "slice") or ix.is_constant(item[1]):
            continue
        e, extent = item[1], shape[axis]
        if item[0] == "int":
            out = (e < -extent) | (e >= extent)
        else:
            out = (e < 0) | (e + item[2] > extent)
        bad = pisl.cond_set(n.dims, n.domain.cond & out)
        p = pisl.sample(bad, n.dims)
        if p is not None:
            what = "index" if item[0] == "int" else "slice start"
            raise ProgramError(
                f"spatial {what} {ix.to_text(e)} falls outside axis {axis} of length {extent} "
                f"at {pisl.format_point(p)} (it is {ix.evaluate(e, p)} there)",
                n.span,
            )


def _check_nonempty(graph: Graph, n: Node):
    """max, min, argmax and argmin have no value on an empty slice."""
    if n.op in ("argmax", "argmin"):
        axis = n.attr("axis")
        reduced = None if axis is None else {axis}
    else:
        reduced = set(n.attr("axes"))
    ranges = [a for a in n.inputs[0].access if isinstance(a, Range)]
    for k, a in enumerate(ranges):
        if reduced is not None and k not in reduced:
            continue
        bad = pisl.cond_set(n.dims, n.domain.cond & (a.hi <= a.lo))
        p = pisl.sample(bad, n.dims)
        if p is not None:
            at = f" at {pisl.format_point(p)}" if p else ""
            raise ProgramError(
                f"{n.op} of an empty slice: the slice {ix.to_text(a.lo)}:{ix.to_text(a.hi)} is "
                f"empty{at}",
                n.span,
            )


def _merge_reads(graph: Graph) -> dict[int, list[tuple[isl.UnionMap, object]]]:
    """For each merge node, one relation per read of another merge in its equations:
    merge point -> the points of the merge it reads (through the equation's other nodes),
    with the span of the read."""
    reach: dict[int, list] = {}

    def tag(nid):
        return f"n{nid}"

    def edge_map(n: Node, e) -> isl.UnionMap:
        src = graph.node(e.src)
        consumer = n.domain if e.cond is None else type(n.domain)(n.dims, n.domain.cond & e.cond)
        m = pisl.access_map(
            consumer, e.access, len(src.dims), src_tag=tag(src.id), dst_tag=tag(n.id)
        )
        return isl.UnionMap.from_map(m)

    def reads(n: Node) -> list:
        out = []
        for e in n.inputs:
            m = edge_map(n, e)
            src = graph.node(e.src)
            if src.op == "merge":
                out.append((m, e.span))
            else:
                out.extend((m.apply_range(sub), span) for sub, span in frontier(src.id))
        return [(m, span) for m, span in out if not m.is_empty()]

    def frontier(nid: int) -> list:
        if nid not in reach:
            reach[nid] = reads(graph.node(nid))
        return reach[nid]

    return {n.id: rs for n in graph.nodes if n.op == "merge" and (rs := reads(n))}


def _target(m: isl.Map) -> int:
    return int(m.get_tuple_name(isl.dim_type.out)[1:])


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
    reads = _merge_reads(graph)
    rel: dict[int, isl.UnionMap] = {}
    succ: dict[int, set[int]] = {}
    for nid, rs in reads.items():
        total = rs[0][0]
        for m, _ in rs[1:]:
            total = total.union(m)
        rel[nid] = total
        targets: set[int] = set()
        total.foreach_map(lambda mp: targets.add(_target(mp)))
        succ[nid] = targets
    for comp in _sccs(list(rel), succ):
        if len(comp) == 1 and comp[0] not in succ.get(comp[0], ()):
            continue
        members = set(comp)
        maps: list[isl.Map] = []
        for nid in comp:
            rel[nid].foreach_map(lambda mp: maps.append(mp) if _target(mp) in members else None)
        total = isl.UnionMap.from_map(maps[0])
        for mp in maps[1:]:
            total = total.union(isl.UnionMap.from_map(mp))
        closure, exact = total.transitive_closure()
        loops: list[isl.Map] = []
        closure.foreach_map(
            lambda mp: (
                loops.append(mp)
                if _target(mp) == int(mp.get_tuple_name(isl.dim_type.in_)[1:])
                else None
            )
        )
        for mp in sorted(loops, key=_target):
            nid = _target(mp)
            fixed = mp.intersect(isl.Map.identity(mp.get_space()))
            if fixed.is_empty():
                continue
            start = fixed.domain().lexmin()
            if not exact and not _confirm_cycle(total, start):
                continue
            node = graph.node(nid)
            p = pisl.point_of(start.sample_point(), node.dims)
            others = sorted({graph.node(m).name or f"%{m}" for m in comp if m != nid})
            via = f" (through {', '.join(others)})" if others else ""
            raise ProgramError(
                f"cyclic definition: '{node.name}' at {pisl.format_point(p)} depends on "
                f"itself{via}",
                _closing_read(reads[nid], start, closure) or _defining_span(node, p),
            )


def _closing_read(reads, start: isl.Set, closure: isl.UnionMap):
    """The span of the read, among those of ``start``'s equation, that leads back to it."""
    point = isl.UnionSet.from_set(start)
    for m, span in sorted(reads, key=lambda r: (r[1].line, r[1].col) if r[1] else (0, 0)):
        image = point.apply(m)
        if image.is_empty():
            continue
        if (
            not image.intersect(point).is_empty()
            or not image.apply(closure).intersect(point).is_empty()
        ):
            return span
    return None


def _confirm_cycle(rel: isl.UnionMap, start: isl.Set, limit: int = 100000) -> bool:
    """Whether ``start`` really reaches itself (the closure was only an approximation)."""
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
