"""Polyhedral checks of a PDG (LANGUAGE.md section 11), each ``check_<property>(graph)``.

- ``check_reads``: every read lands inside the domain of what it reads, slices have no
  negative length, and dim-dependent spatial indices stay inside their axes.
- ``check_acyclic``: no point depends on itself.
Failures are ``ProgramError``s at the span of the read or equation, with an example point.
"""

from __future__ import annotations

import islpy as isl

from timerlc import ops
from timerlc.diagnostics import ProgramError
from timerlc.ir import index as ix
from timerlc.ir.pdg import Graph, Node, Range, access_to_text, input_type
from timerlc.poly import isl as pisl
from timerlc.poly import levels as lv


def check_all(graph: Graph):
    check_reads(graph)
    check_env_order(graph)
    check_acyclic(graph)


def _label(graph: Graph, nid: int) -> str:
    n = graph.node(nid)
    if ops.is_env(n.op):
        return f"{n.attr('env')}.{n.op[4:]}()"
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
            target = pisl.producer_side(dom(src), len(src.dims))
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


def _anchor(op: str) -> bool:
    """Tensors (merges) and environment calls."""
    return op == "merge" or ops.is_env(op)


def anchor_reads(graph: Graph, anchors: set[int]) -> dict[int, list[tuple[isl.UnionMap, object]]]:
    """``_merge_reads`` for any set of anchor nodes (the scheduler's statements)."""
    return _merge_reads(graph, anchors)


def _merge_reads(
    graph: Graph, anchors: set[int] | None = None
) -> dict[int, list[tuple[isl.UnionMap, object]]]:
    """For each anchor node (a tensor or an environment call), one relation per read of
    another anchor through the nodes of its equation: point -> the anchor points it reads,
    with the span of the read. An environment call also reads every earlier call of its
    environment (section 10's order)."""
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
            if _anchor(src.op) if anchors is None else (src.id in anchors):
                out.append((m, e.span))
            else:
                out.extend((m.apply_range(sub), span) for sub, span in frontier(src.id))
        return _distinct([(m, span) for m, span in out if not m.is_empty()])

    def frontier(nid: int) -> list:
        if nid not in reach:
            reach[nid] = reads(graph.node(nid))
        return reach[nid]

    out = {
        n.id: reads(n)
        for n in graph.nodes
        if (_anchor(n.op) if anchors is None else (n.id in anchors))
    }
    for calls in _env_calls(graph).values():
        for c in calls:
            for c2 in calls:
                m = _earlier(c, c2)
                if not m.is_empty():
                    out[c.id].append((isl.UnionMap.from_map(m), c.span))
    return {nid: rs for nid, rs in out.items() if rs}


def _distinct(reads: list) -> list:
    """``reads`` less the repeats of a relation (the same isl text), each kept once with its
    earliest span, in the order of first occurrence. A chain ``x + c + c + ...`` reads ``c``
    once per link: without this the frontier of each link holds one copy per link before
    it, and the walk is quadratic in the chain's length. The repeats change nothing: the
    union of a relation with itself is the relation, and an error names the earliest read."""
    kept: dict[str, tuple] = {}
    for m, span in reads:
        key = str(m)
        if key not in kept or _span_order(span) < _span_order(kept[key][1]):
            kept[key] = (m, span)
    return list(kept.values())


def _span_order(span) -> tuple[int, int]:
    """The order in which reads are tried for an error's span (a read without one first)."""
    return (span.line, span.col) if span else (0, 0)


def _env_calls(graph: Graph) -> dict[str, list[Node]]:
    calls: dict[str, list[Node]] = {}
    for n in graph.nodes:
        if ops.is_env(n.op):
            calls.setdefault(n.attr("env"), []).append(n)
    return calls


def _key_map(c: Node) -> isl.Map:
    """{ call point -> key } of an environment call."""
    dims = ", ".join(ix.isl_name(d) for d in c.dims)
    keys = ", ".join(ix.to_isl(k) for k in c.attr("key"))
    return isl.Map(f"{{ n{c.id}[{dims}] -> [{keys}] : {ix.cond_to_isl(c.domain.cond)} }}")


def _earlier(c: Node, c2: Node) -> isl.Map:
    """{ c[p] -> c2[q] : key(c2 at q) lexicographically before key(c at p) }."""
    before = _key_map(c).lex_gt_map(_key_map(c2))
    return before


def check_env_order(graph: Graph):
    """Two calls of one environment must not define the same point of their first output."""
    for env, calls in _env_calls(graph).items():
        lens = {len(c.attr("key")) for c in calls}
        if len(lens) > 1:
            raise ProgramError(
                f"the calls of environment '{env}' define tensors over different dims; "
                "their order is unclear",
                calls[-1].span,
            )
        for j, c in enumerate(calls):
            for c2 in calls[j:]:
                same = _key_map(c).apply_range(_key_map(c2).reverse())
                if c2 is c:
                    same = same.subtract(isl.Map.identity(same.get_space()))
                if not same.is_empty():
                    p = pisl.point_of(same.domain().lexmin().sample_point(), c.dims)
                    raise ProgramError(
                        f"two calls of environment '{env}' would define the same point of their "
                        f"first output (at {pisl.format_point(p)}); each call must come at its own "
                        "point",
                        c2.span,
                    )


def check_acyclic(graph: Graph):
    """No point depends on itself. Cheap first: each strongly connected group of tensors is
    split level by level along a guessed time coordinate per tensor (a dim, scaled to match the
    others), proved non-decreasing along every read; what a level does not order is checked
    again at the next level. Groups no guess splits go to isl's scheduler, then to the exact
    transitive-closure check, which also reports the cycle."""
    reads = _merge_reads(graph)
    pairs = lv.pair_maps(reads)
    dims_of = {n.id: n.dims for n in graph.nodes}
    all_dims = [d.name for d in graph.dims]
    work = [(comp, pairs, {}) for comp in lv.cyclic_sccs(list(reads), pairs)]
    while work:
        comp, maps, used = work.pop()
        members = set(comp)
        sub = {k: m for k, m in maps.items() if k[0] in members and k[1] in members}
        level = lv.split_level(dims_of, all_dims, comp, sub, used)
        if level is None:
            _check_component(graph, comp, sub, reads)
            continue
        work.extend((c, level.residual, level.used) for c in lv.cyclic_sccs(comp, level.residual))


def _check_component(graph: Graph, comp, sub, reads):
    if not sub:
        return
    maps = list(sub.values())
    total = isl.UnionMap.from_map(maps[0])
    for mp in maps[1:]:
        total = total.union(isl.UnionMap.from_map(mp))
    found = _search_cycle(comp, sub, total) if len(comp) >= SEARCH_FIRST_NODES else None
    if found is not None:
        nid, start, layers = found
        _cycle_error(graph, comp, reads, nid, start, _search_lead(start, layers, total))
    if _schedulable(graph, comp, maps):
        return
    closure, exact = total.transitive_closure()
    loops: list[isl.Map] = []
    closure.foreach_map(
        lambda mp: (
            loops.append(mp)
            if lv.target(mp) == int(mp.get_tuple_name(isl.dim_type.in_)[1:])
            else None
        )
    )
    for mp in sorted(loops, key=lv.target):
        nid = lv.target(mp)
        fixed = mp.intersect(isl.Map.identity(mp.get_space()))
        if fixed.is_empty():
            continue
        start = fixed.domain().lexmin()
        if not exact and not _confirm_cycle(total, start):
            continue
        point = isl.UnionSet.from_set(start)

        def leads_back(image, point=point):
            return (
                not image.intersect(point).is_empty()
                or not image.apply(closure).intersect(point).is_empty()
            )

        _cycle_error(graph, comp, reads, nid, start, leads_back)


def _cycle_error(graph: Graph, comp, reads, nid: int, start: isl.Set, leads_back):
    """The error of point ``start`` of node ``nid`` depending on itself, at the read that
    closes the cycle (``_closing_read`` with ``leads_back``), else at the equation that
    defines the point."""
    node = graph.node(nid)
    p = pisl.point_of(start.sample_point(), node.dims)
    others = sorted({_label(graph, m) for m in comp if m != nid})
    via = f" (through {', '.join(others)})" if others else ""
    raise ProgramError(
        f"cyclic definition: '{node.name}' at {pisl.format_point(p)} depends on itself{via}",
        _closing_read(reads[nid], start, leads_back) or _defining_span(node, p),
    )


# A group of this many tensors or more is first searched for a cycle from one point of each
# (``_search_cycle``), before isl's scheduler and closure: on a large group with a cycle
# those take long to fail (PPO with ``grad(loss[j], net[I])``, 69 tensors: the scheduler 10
# s, the closure 7 s), where a cycle through the first point of a tensor's reads is found in
# a few dozen steps. Smaller groups go to them at once (each takes milliseconds there).
SEARCH_FIRST_NODES = 16
SEARCH_STEPS = 64  # the search's steps in all, over every start (a bound, not a time)


def _search_cycle(comp, sub, total: isl.UnionMap):
    """A point that depends on itself, searched from the first point of each tensor's reads
    inside the group (in the order of the tensors' ids): ``(nid, start, layers)``, the
    points reached at each step from ``start`` (``_steps``: the last holds it), or None
    where none of the starts is found on a cycle within ``SEARCH_STEPS`` steps in all (the
    group may still have a cycle elsewhere: the exact checks follow)."""
    reading: dict[int, isl.Set] = {}  # (each tensor's points that read inside the group)
    for (nid, _), m in sub.items():
        reading[nid] = reading[nid].union(m.domain()) if nid in reading else m.domain()
    budget = SEARCH_STEPS
    for nid in sorted(reading):
        start = reading[nid].lexmin()
        start_u = isl.UnionSet.from_set(start)
        layers = []
        for frontier in _steps(total, start_u):
            if budget == 0:
                return None
            budget -= 1
            layers.append(frontier)
            if not start_u.intersect(frontier).is_empty():
                return nid, start, layers
    return None


def _search_lead(start: isl.Set, layers: list, total: isl.UnionMap):
    """``_closing_read``'s ``leads_back`` from a search's ``layers`` (``_search_cycle``)
    instead of a closure: the points of the first layer that lead back to ``start``, found
    from the last layer to the first."""
    back = total.reverse()
    lead = isl.UnionSet.from_set(start)
    for layer in reversed(layers[:-1]):
        lead = lead.apply(back).intersect(layer).coalesce()
    return lambda image: not image.intersect(lead).is_empty()


def _schedulable(graph: Graph, comp, maps: list[isl.Map]) -> bool:
    """A certificate of acyclicity that is cheap where transitive closures are not: isl's
    scheduler finds an order of the points that puts every point after what it reads. No
    order is found for a cycle (and, rarely, for an acyclic but non-affine dependence: then
    the exact check runs)."""
    domains = [pisl.domain_set(graph.node(nid).domain, tag=f"n{nid}") for nid in comp]
    return lv.isl_schedule(domains, maps) is not None


def _closing_read(reads, start: isl.Set, leads_back):
    """The span of the read, among those of ``start``'s equation, that leads back to it: the
    first (in source order) whose image of ``start`` ``leads_back`` says so of."""
    point = isl.UnionSet.from_set(start)
    for m, span in sorted(reads, key=lambda r: _span_order(r[1])):
        image = point.apply(m)
        if not image.is_empty() and leads_back(image):
            return span
    return None


def _steps(rel: isl.UnionMap, start: isl.UnionSet):
    """The points ``start`` reaches through ``rel`` first at step 1, 2, ..., each step's set
    coalesced, until a step reaches nothing new. Coalesced: without it their pieces
    multiplied (PPO with ``grad(loss[j], net[I])``, a cycle 26 steps long: each step's sets
    split by ``mod 16`` constraints, 4 s by the 20th step, no answer in minutes; coalesced,
    2 s in all)."""
    frontier = start.apply(rel).coalesce()
    reached = frontier
    while not frontier.is_empty():
        yield frontier
        frontier = frontier.apply(rel).subtract(reached).coalesce()
        reached = reached.union(frontier).coalesce()


def _confirm_cycle(rel: isl.UnionMap, start: isl.Set, limit: int = 100000) -> bool:
    """Whether ``start`` really reaches itself (the closure was only an approximation): the
    points it reaches, step by step (``_steps``; ``limit`` steps without an answer count as
    yes)."""
    start_u = isl.UnionSet.from_set(start)
    for k, frontier in enumerate(_steps(rel, start_u)):
        if k == limit or not start_u.intersect(frontier).is_empty():
            return True
    return False


def _defining_span(node: Node, point: dict[str, int]):
    for e in node.inputs:
        if e.cond is None or ix.holds(e.cond, point):
            return e.span or node.span
    return node.span
