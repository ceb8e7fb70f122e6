"""Level-by-level schedules of strongly connected groups of PDG nodes.

A strongly connected group of nodes (each reads the others through some chain) is ordered
by guessing, per node, a coordinate ``phi`` = scale * one of its dims + shift such that no
read goes to a larger ``phi``: the reads that ``phi`` leaves equal are ordered again at the
next level. The guesses are cheap (a dim per node, scales from the slopes of the reads,
shifts from shortest paths) and proved with isl, so the result is exact: it is a schedule.
``poly.checks`` uses it to prove acyclicity, ``schedule`` to build the loop tree; isl's own
scheduler, far slower on large groups (minutes on PPO), is the fallback for what it cannot
order.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import gcd

import islpy as isl

from timerlc.ir import index as ix


def target(m: isl.Map) -> int:
    """The node id of a map's range tuple ``n<id>``."""
    return int(m.get_tuple_name(isl.dim_type.out)[1:])


def source(m: isl.Map) -> int:
    """The node id of a map's domain tuple ``n<id>``."""
    return int(m.get_tuple_name(isl.dim_type.in_)[1:])


def pair_maps(reads: dict[int, list]) -> dict[tuple[int, int], isl.Map]:
    """``{reader: [(union map, span), ...]}`` -> ``{(reader, read): map}``."""
    pairs: dict[tuple[int, int], isl.Map] = {}

    def add(nid, mp):
        key = (nid, target(mp))
        pairs[key] = pairs[key].union(mp) if key in pairs else mp

    for nid, rs in reads.items():
        for m, _ in rs:
            m.foreach_map(lambda mp, nid=nid: add(nid, mp))
    return pairs


def sccs(nodes, succ) -> list[list[int]]:
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


def cyclic_sccs(nodes, maps) -> list[list[int]]:
    succ: dict[int, set[int]] = {}
    for a, b in maps:
        succ.setdefault(a, set()).add(b)
    return [comp for comp in sccs(nodes, succ) if len(comp) > 1 or comp[0] in succ.get(comp[0], ())]


@dataclass(frozen=True)
class Level:
    """One level of a schedule of a strongly connected group: per node, the dim position it
    advances along (or None), and ``phi`` = scale * that dim + shift, as isl maps
    ``{ n<id>[dims] -> [phi] }``; ``residual`` holds the reads ``phi`` leaves unordered."""

    coords: dict[int, int | None]
    scale: dict[int, int]
    shift: dict[int, int]
    phi: dict[int, isl.Map]
    residual: dict[tuple[int, int], isl.Map]
    used: dict[int, tuple[int, ...]]
    exprs: dict[int, str] | None = None  # phi as isl text, where it is not scale * dim + shift


def split_level(dims_of, all_dims, comp, sub, used, progress: bool = False) -> Level | None:
    """A level for the group ``comp`` (node ids; ``dims_of[nid]`` their dims) whose reads are
    ``sub`` (``(reader, read) -> { reader point -> read points }``): a coordinate ``phi`` per
    node (one of its not yet used dims times a scale, or 0, plus a shift) that no read
    decreases. The guesses: each node's first unused dim, then each dim by name
    (``all_dims`` in order), then the r-th unused dims. With ``progress``, a guess must also
    order some read (a loop that carries nothing is no use to a schedule). None if no guess
    works."""
    free = {
        nid: [k for k in range(len(dims_of[nid])) if k not in used.get(nid, ())] for nid in comp
    }
    width = max(len(f) for f in free.values())
    positional = [
        {nid: (f[r] if r < len(f) else None) for nid, f in free.items()} for r in range(width)
    ]
    named = [
        {
            nid: (
                dims_of[nid].index(d)
                if d in dims_of[nid] and dims_of[nid].index(d) in free[nid]
                else None
            )
            for nid in comp
        }
        for d in all_dims
    ]
    tried = []
    for coords in positional[:1] + named + positional[1:]:
        if coords in tried or all(k is None for k in coords.values()):
            continue
        tried.append(coords)
        scales = _scales(comp, sub, coords)
        for sign in (1, -1):
            scale = {nid: sign * scales[nid] for nid in comp}
            phi = {nid: _phi(nid, dims_of[nid], coords[nid], scale[nid]) for nid in comp}
            shift = _offsets(comp, sub, phi)
            if shift is None:
                continue
            phi = {
                nid: _phi(nid, dims_of[nid], coords[nid], scale[nid], shift[nid]) for nid in comp
            }
            residual = {}
            moved = False
            for (a, b), m in sub.items():
                rest = m.intersect(phi[a].apply_range(phi[b].reverse()))
                if not rest.is_empty():
                    residual[(a, b)] = rest
                if not moved and not rest.is_equal(m):
                    moved = True
            if progress and not moved:
                continue
            now = dict(used)
            for nid, k in coords.items():
                if k is not None:
                    now[nid] = now.get(nid, ()) + (k,)
            return Level(coords, scale, shift, phi, residual, now)
    return None


def _scales(comp, sub, coords) -> dict[int, int]:
    """Integer scales that make the chosen coordinates advance together: a read of
    ``x[K * i]`` from ``y[i]`` scales ``y``'s ``i`` by K relative to ``x``'s dim."""
    ratio: dict[int, list[tuple[int, Fraction]]] = {nid: [] for nid in comp}
    for (a, b), m in sub.items():
        if a == b or coords[a] is None or coords[b] is None:
            continue
        rho = _slope(m, coords[a], coords[b])
        if rho is not None:  # b's coordinate ~ rho * a's coordinate
            ratio[a].append((b, 1 / rho))
            ratio[b].append((a, rho))
    scale: dict[int, Fraction] = {}
    for root in comp:
        if root in scale:
            continue
        scale[root] = Fraction(1)
        todo = [root]
        while todo:
            a = todo.pop()
            for b, f in ratio[a]:
                if b not in scale:  # scale[b] * coord_b == scale[a] * coord_a
                    scale[b] = scale[a] * f
                    todo.append(b)
    den = 1
    for s in scale.values():
        den = den * s.denominator // gcd(den, s.denominator)
    return {nid: int(s * den) for nid, s in scale.items()}


def _slope(m: isl.Map, ka: int, kb: int) -> Fraction | None:
    """The slope of the read coordinate ``kb`` against the reader coordinate ``ka`` in ``m``,
    from its constraints that bind both (None when there is none, or they disagree)."""
    n_in, n_out = m.dim(isl.dim_type.in_), m.dim(isl.dim_type.out)
    m2 = m.project_out(isl.dim_type.out, kb + 1, n_out - kb - 1).project_out(
        isl.dim_type.out, 0, kb
    )
    m2 = m2.project_out(isl.dim_type.in_, ka + 1, n_in - ka - 1).project_out(
        isl.dim_type.in_, 0, ka
    )
    found: set[Fraction] = set()

    def visit(bm):
        for c in bm.get_constraints():
            if any(
                not c.get_coefficient_val(isl.dim_type.div, d).is_zero()
                for d in range(bm.dim(isl.dim_type.div))
            ):
                continue
            ca = c.get_coefficient_val(isl.dim_type.in_, 0).to_python()
            cb = c.get_coefficient_val(isl.dim_type.out, 0).to_python()
            if ca and cb and -ca * cb > 0:
                found.add(Fraction(-ca, cb))

    m2.foreach_basic_map(visit)
    return found.pop() if len(found) == 1 else None


def _phi(nid: int, dims, k: int | None, scale: int, shift: int = 0) -> isl.Map:
    names = ", ".join(ix.isl_name(d) for d in dims)
    value = f"{shift}" if k is None else f"{scale} * {ix.isl_name(dims[k])} + {shift}"
    return isl.Map(f"{{ n{nid}[{names}] -> [{value}] }}")


def _offsets(comp, sub, phi) -> dict[int, int] | None:
    """Constant shifts ``s`` with ``phi + s`` non-decreasing along every read (a reader may
    read a later coordinate, as ``y[t] = x[t+1]`` does, if the read tensor is shifted): the
    shortest paths of the difference constraints, or None where a read is unbounded or the
    constraints have a negative cycle."""
    weight: dict[tuple[int, int], int] = {}
    for (a, b), m in sub.items():
        ahead = m.apply_domain(phi[a]).apply_range(phi[b]).deltas().dim_max_val(0)
        if not ahead.is_int():
            return None
        weight[(a, b)] = -ahead.to_python()  # s_b - s_a <= min(phi_a - phi_b)
    dist = dict.fromkeys(comp, 0)
    for _ in range(len(comp) + 1):
        changed = False
        for (a, b), w in weight.items():
            if dist[a] + w < dist[b]:
                dist[b] = dist[a] + w
                changed = True
        if not changed:
            return dist
    return None


def isl_schedule(domains, reads, proximity: bool = False) -> isl.UnionMap | None:
    """isl's scheduler over the node ``domains`` (sets ``n<id>[dims]``) and their ``reads``
    (maps ``reader point -> read points``): the schedule map ``n<id>[dims] -> [time]``,
    checked to put every point strictly after what it reads; None if isl finds no such
    schedule. ``proximity``: also ask isl to keep each read close to its reader."""
    domain = deps = None
    for s in domains:
        u = isl.UnionSet.from_set(s)
        domain = u if domain is None else domain.union(u)
    for m in reads:
        d = isl.UnionMap.from_map(m.reverse())  # read point -> reader point
        deps = d if deps is None else deps.union(d)
    if deps is None:
        return None
    try:
        sc = isl.ScheduleConstraints.on_domain(domain).set_validity(deps)
        sched = (sc.set_proximity(deps) if proximity else sc).compute_schedule()
        if sched is None:
            return None
        times = sched.get_map()
        order = deps.apply_domain(times).apply_range(times)
        maps: list[isl.Map] = []
        order.foreach_map(maps.append)
        if all(m.is_subset(isl.Map.lex_lt(m.get_space().domain())) for m in maps):
            return times
    except isl.Error:
        pass
    return None


def isl_levels(domains: dict[int, isl.Set], comp, sub) -> list[Level] | None:
    """The fallback for a group no guess splits (a wavefront that only a skewed coordinate
    such as ``i + j`` orders): isl's scheduler, one Level per row of its schedule, each
    node's ``phi`` an affine function of its dims, all of which become loops. None when isl
    finds no schedule (or one that is not affine with integer coefficients)."""
    times = isl_schedule([domains[n] for n in comp], sub.values(), proximity=True)
    if times is None:
        return None
    by_node: dict[int, isl.Map] = {}
    times.foreach_map(lambda mp: by_node.__setitem__(source(mp), mp))
    width = max(by_node[nid].dim(isl.dim_type.out) for nid in comp)
    rows: dict[int, list[str]] = {}
    for nid in comp:
        exprs = _affine_rows(by_node[nid])
        if exprs is None:
            return None
        rows[nid] = exprs + ["0"] * (width - len(exprs))
    n_dims = {nid: domains[nid].dim(isl.dim_type.set) for nid in comp}
    names = {
        nid: ", ".join(domains[nid].get_dim_name(isl.dim_type.set, j) for j in range(n))
        for nid, n in n_dims.items()
    }
    used = {nid: tuple(range(n)) for nid, n in n_dims.items()}
    levels = []
    for k in range(width):
        exprs = {nid: rows[nid][k] for nid in comp}
        phi = {nid: isl.Map(f"{{ n{nid}[{names[nid]}] -> [{exprs[nid]}] }}") for nid in comp}
        zeros = dict.fromkeys(comp, 0)
        levels.append(Level(dict.fromkeys(comp), zeros, zeros, phi, {}, used, exprs))
    return levels


def _affine_rows(m: isl.Map) -> list[str] | None:
    """The rows of a schedule map ``n[dims] -> [rows]`` as isl text, affine in the dims."""
    pieces = []
    isl.PwMultiAff.from_map(m).foreach_piece(lambda _, maff: pieces.append(maff))
    if len(pieces) != 1:
        return None
    maff = pieces[0]
    out = []
    for k in range(maff.dim(isl.dim_type.out)):
        aff = maff.get_aff(k)
        if not aff.get_denominator_val().is_one() or aff.dim(isl.dim_type.div):
            return None
        terms = []
        for d in range(aff.dim(isl.dim_type.in_)):
            c = aff.get_coefficient_val(isl.dim_type.in_, d).to_python()
            if c:
                terms.append(f"{c} * {m.get_dim_name(isl.dim_type.in_, d)}")
        terms.append(str(aff.get_constant_val().to_python()))
        out.append(" + ".join(terms))
    return out
