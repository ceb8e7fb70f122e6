"""The schedule: which nodes are statements, which of their dims are loops and which are
vectorized, in what order everything runs, and the loop tree isl's AST builder makes of it.

Statements are the nodes some other node reads at another point (tensors, environment calls,
scalars, anything read through a shifted index or a slice); every other node is *inlined*
into the statements that read it and computed with them, at the same points. Statements are
ordered level by level (``poly.levels``): a strongly connected group of statements gets a
loop along a guessed, scaled and shifted coordinate per statement, proved to order the reads
it carries, and its members are ordered again inside it; what no loop needs stays an array
axis (vectorized), so a statement outside every recurrence runs as one batched op over all
its points, and a loss after a rollout runs once per iteration over all of ``b`` and ``t``.
Dims on which the length of a window read depends stay loops too (ragged windows do not
batch). A group that no guess orders (a wavefront only a skewed loop orders) goes to isl's
scheduler, with all its dims loops. The result is an isl schedule map
``S[loop dims] -> [time vector]``, and isl's AST builder turns it into the loop tree (loops
may run backward, as returns do).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import islpy as isl
import sympy

from timerlc import ops
from timerlc.diagnostics import ProgramError
from timerlc.ir import index as ix
from timerlc.ir.pdg import Graph, Range, identity_access
from timerlc.plan.items import Call, If, Loop
from timerlc.poly import checks
from timerlc.poly import isl as pisl
from timerlc.poly import levels as lv


@dataclass(frozen=True)
class Statement:
    nid: int
    loops: tuple[str, ...]  # the dims that are loops, in the node's dim order
    vector: tuple[str, ...]  # the dims that are array axes
    body: tuple[int, ...]  # inlined nodes in evaluation order, then the statement's node


@dataclass(frozen=True)
class Schedule:
    statements: dict[int, Statement]
    order: tuple[int, ...]  # the statements in the order the loop tree first runs them
    times: dict[int, tuple[str, ...]]  # isl time vector of each statement (its loop dims)
    tree: tuple  # the loop tree: plan items (``Loop``, ``If``, ``Call``)
    reads: dict[tuple[int, int], isl.Map]  # (reader, read statement) -> points it reads


def stored_nodes(graph: Graph) -> set[int]:
    """Tensors, environment calls, dimensionless nodes, whatever some consumer reads at
    another point (the reference interpreter stores the same nodes), and costly nodes
    (matmuls, reductions, gathers, random draws, chains of more than ``CHEAP_CHAIN`` cheap
    ops) that would otherwise be inlined into, and computed again by, several statements."""
    stored = set()
    for n in graph.nodes:
        if n.op == "grad":
            raise ValueError("the schedule needs a graph after the autodiff pass")
        if n.op == "merge" or ops.is_env(n.op) or (not n.dims and not _filled(n)) or _noise(n):
            stored.add(n.id)
        for e in n.inputs:
            src = graph.node(e.src)
            if _filled(src):
                continue
            if src.dims != n.dims or e.access != identity_access(n.dims):
                stored.add(e.src)
    readers: dict[int, set[int]] = {}
    for n in graph.nodes:
        for e in n.inputs:
            readers.setdefault(e.src, set()).add(n.id)
    operands = _gathered_operands(graph, readers, stored)
    while True:
        uses: dict[int, int] = {}
        for nid in stored:
            for k in _body(graph, nid, stored)[:-1]:
                uses[k] = uses.get(k, 0) + 1
        shared = {k for k, c in uses.items() if c > 1} - operands
        # the costly nodes first: once they are stored, a chain of cheap ops above them is
        # short (``tanh(x @ w + b)`` is two ops over a stored matmul, not four)
        costly = {k for k in shared if _costly(graph.node(k).op)}
        # ... but of a chain of costly nodes, the last: once it is stored, the ones below
        # may have one reader left, the statement that computes it (``tanh(x @ w + b)``
        # stores the tanh; its matmul is computed in the tanh's kernel, no buffer of its own)
        below = {j for k in costly for j in _body(graph, k, stored)[:-1]}
        if costly - below:
            stored |= {
                _sole_reader_top(graph, k, readers, stored | operands) for k in costly - below
            }
            continue
        long = {k for k in shared if len(_body(graph, k, stored)) > CHEAP_CHAIN}
        if not long:
            return stored
        stored |= long


# a gather of more bytes than this that only products read is computed in each of them (a
# tile at a time, ``codegen.lower``), never stored
GATHER_OPERAND_BYTES = 64 << 20


def _gathered_operands(graph: Graph, readers: dict, stored: set[int]) -> set[int]:
    """The gathers of more than ``GATHER_OPERAND_BYTES`` (``take``: a minibatch's rows of
    image-sized observations) that products alone read, at the same point, directly or
    through views that only products read; and those views. Not stored: each product gathers
    the rows it multiplies, a tile at a time (``codegen.lower``: ``_tiled_gemm``), where a
    buffer of them would hold a minibatch's observations from the first layers' products to
    their weights' gradients (PyTorch's ``obs[mb_inds]`` copy)."""
    out: set[int] = set()
    for n in graph.nodes:
        if n.op != "take" or n.id in stored or not n.types[0].shape:
            continue
        t = n.types[0]
        if math.prod(t.shape) * ops.numpy_dtype(t.dtype).itemsize <= GATHER_OPERAND_BYTES:
            continue
        views: set[int] = set()
        if readers.get(n.id) and _products_only(graph, n.id, readers, stored, views):
            out |= {n.id} | views
    return out


def _products_only(graph: Graph, k: int, readers: dict, stored: set[int], views: set) -> bool:
    """Whether products alone read node ``k`` (none stored), each at ``k``'s point,
    directly or through transposes that products alone read (added to ``views``)."""
    for r in readers.get(k, ()):
        node = graph.node(r)
        if r in stored or node.dims != graph.node(k).dims:
            return False
        if any(e.src == k and e.access != identity_access(node.dims) for e in node.inputs):
            return False
        if node.op == "transpose":
            views.add(r)
            if not _products_only(graph, r, readers, stored, views):
                return False
        elif node.op != "matmul" or len(node.inputs) != 2:
            return False
    return True


def _sole_reader_top(graph: Graph, k: int, readers: dict, stored: set[int]) -> int:
    """What to store for a costly node ``k`` that several statements would compute: ``k``,
    or, when ``k`` has one reader, at the same point, which has one reader... the last of
    that chain. Its other statements read ``k`` only through it: stored, it computes ``k``
    once, in its own kernel (the backward of ``tanh(x @ w)``: ``dh * (1 - h * h)`` with
    ``dh = dz @ w.T``, read by the weight's and the bias's gradients and the next layer's,
    stores the product and computes the matmul in its kernel)."""
    while len(readers.get(k, ())) == 1:
        (r,) = readers[k]
        node = graph.node(r)
        if r in stored or node.dims != graph.node(k).dims:
            break
        if any(e.src == k and e.access != identity_access(node.dims) for e in node.inputs):
            break
        k = r
    return k


def _filled(n) -> bool:
    """An array of one value (``zeros([obs_dim, 64])``, Adam's first moments): computed in
    each statement that reads it, never stored (a buffer of it would hold as many bytes as a
    parameter, for as long as its last reader runs)."""
    return (
        n.op == "const"
        and not n.dims
        and bool(n.types[0].shape)
        and not isinstance(dict(n.attrs).get("value"), tuple)
    )


def _noise(n) -> bool:
    """A random draw that reads nothing (its value is a function of its key and point):
    stored, it runs ahead of the loops that read it, batched over all their points."""
    return not n.inputs and n.op.startswith("random_") and bool(n.dims)


CHEAP_CHAIN = 2  # a shared chain of cheap ops longer than this is stored, not recomputed
# elementwise ops that cost tens of operations an element: computed once where shared
TRANSCENDENTAL = frozenset(["exp", "log", "log1p", "tanh", "sigmoid", "sin", "cos", "pow"])


def _costly(op: str) -> bool:
    return op in TRANSCENDENTAL or not ops.get(op).cheap


def _body(graph: Graph, nid: int, stored: set[int]) -> tuple[int, ...]:
    order: list[int] = []
    seen: set[int] = set()

    def visit(k: int, top: bool):
        if k in seen or (not top and k in stored):
            return
        seen.add(k)
        for e in graph.node(k).inputs:
            visit(e.src, False)
        order.append(k)

    visit(nid, True)
    return tuple(order)


def _ragged_dims(graph: Graph, body) -> set[str]:
    """Dims on which the length of a window read inside the body depends."""
    out: set[str] = set()
    for k in body:
        for e in graph.node(k).inputs:
            for a in e.access:
                if isinstance(a, Range) and not a.is_static:
                    out |= {str(s) for s in sympy.sympify(a.hi - a.lo).free_symbols}
    return out


def build_schedule(graph: Graph) -> Schedule:
    stored = stored_nodes(graph)
    reads = checks.anchor_reads(graph, stored)
    pairs = lv.pair_maps(reads)
    dims_of = {n.id: n.dims for n in graph.nodes}
    all_dims = [d.name for d in graph.dims]
    bodies = {nid: _body(graph, nid, stored) for nid in stored}

    # the tree: ("leaf", nid) | ("band", Level, [children]); children in execution order
    def build(nodes, maps, used, top: bool = False) -> list:
        succ: dict[int, set[int]] = {}
        for a, b in maps:
            succ.setdefault(a, set()).add(b)
        items = []
        for comp in lv.sccs(sorted(nodes), succ):  # producers first
            cyclic = len(comp) > 1 or comp[0] in succ.get(comp[0], ())
            if not cyclic:
                items.append(("leaf", comp[0]))
                continue
            members = set(comp)
            sub = {k: m for k, m in maps.items() if k[0] in members and k[1] in members}
            try:
                items.extend(group(comp, sub, used))
            except _Unschedulable:
                if not top:
                    raise
                # the last resort: the group's points one by one, in an order of their reads
                calls = _point_order(comp, sub, graph)
                if calls is None:
                    raise
                items.append(("points", None, [("leaf", n) for n in sorted(comp)], calls))
        return items

    def group(comp, sub, used) -> list:
        level = lv.split_level(dims_of, all_dims, comp, sub, used, progress=True)
        if level is not None:
            return [("band", level, build(comp, level.residual, level.used))]
        # no guess orders it: isl's scheduler does, with every dim a loop
        rows = lv.isl_levels({n: _domain(graph, n) for n in comp}, comp, sub)
        if rows is None:
            names = sorted({graph.node(c).name or f"%{c}" for c in comp})
            raise _Unschedulable(
                "timerlc cannot schedule this recurrence (no loop order of its dims, nor "
                "isl's scheduler, nor its points one by one: it has more than "
                f"{POINT_LIMIT} points): {', '.join(names)}",
                graph.node(comp[0]).span,
            )
        nested = [("leaf", n) for n in sorted(comp)]
        for level in reversed(rows):
            nested = [("band", level, nested)]
        return nested

    tree = build(list(stored), pairs, {}, top=True)
    metric_nodes = {graph.tensor(name).node for name in graph.metrics} & stored
    fuse = _Fuse(graph, pairs, build, _carried_updates(graph, bodies))
    tree = _stream_metrics(tree, fuse, metric_nodes)
    tree = _join_producers(tree, fuse)

    statements: dict[int, Statement] = {}
    times: dict[int, list[str]] = {}
    order: list[int] = []

    def phi(level: lv.Level, nid: int) -> str:
        if level.exprs is not None:
            return level.exprs[nid]
        k = level.coords[nid]
        if k is None:
            return str(level.shift[nid])
        d = ix.isl_name(graph.node(nid).dims[k])
        return f"{level.scale[nid]} * {d} + {level.shift[nid]}"

    def place(items, prefix_of, used):
        for pos, item in enumerate(items):
            if item[0] == "points":
                for _, nid in item[2]:
                    dims = graph.node(nid).dims
                    statements[nid] = Statement(nid, dims, (), bodies[nid])
                    times[nid] = prefix_of(nid) + [str(pos)]
                    order.append(nid)
                points.append((times[item[2][0][1]], item[3]))
                continue
            if item[0] == "band":
                level = item[1]
                place(
                    item[2],
                    lambda nid, pos=pos, level=level: prefix_of(nid) + [str(pos), phi(level, nid)],
                    level.used,
                )
                continue
            nid = item[1]
            node = graph.node(nid)
            banded = {node.dims[k] for k in used.get(nid, ())}
            loops = set(banded)
            if ops.is_env(node.op):
                loops = set(node.dims)
            loops |= _ragged_dims(graph, bodies[nid]) & set(node.dims)
            inner = [ix.isl_name(d) for d in node.dims if d in loops and d not in banded]
            statements[nid] = Statement(
                nid,
                tuple(d for d in node.dims if d in loops),
                tuple(d for d in node.dims if d not in loops),
                bodies[nid],
            )
            times[nid] = prefix_of(nid) + [str(pos)] + inner
            slots[nid] = (tuple(prefix_of(nid)), pos, tuple(inner))
            order.append(nid)

    slots: dict[int, tuple] = {}
    points: list[tuple[list[str], list]] = []  # (time, calls) of the groups run point by point
    place(tree, lambda nid: [], {})
    width = max((len(t) for t in times.values()), default=0)
    padded = {nid: tuple(t + ["0"] * (width - len(t))) for nid, t in times.items()}
    looped = [nid for nid in order if nid in slots]
    groups = _groups(graph, statements, looped, slots)
    tree = _loop_tree(graph, statements, padded, groups, points, width)
    return Schedule(statements, tuple(order), padded, tree, pairs)


def _carried_updates(graph: Graph, bodies: dict) -> dict[int, int]:
    """The stored nodes a merge reads (``net[j + 1] = U[j]``) that read the merge too
    (``U[j] = adam(net[j], ...)``): each update carried to the next step, with its merge."""
    out = {}
    for m in bodies:
        if graph.node(m).op != "merge":
            continue
        for e in graph.node(m).inputs:
            u = e.src
            if (
                u != m
                and u in bodies
                and any(x.src == m for k in bodies[u] for x in graph.node(k).inputs)
            ):
                out[u] = m
    return out


def _domain(graph: Graph, nid: int) -> isl.Set:
    """Node ``nid``'s points as the isl set ``n<id>[dims]`` (memoized by ``poly.isl``)."""
    return pisl.domain_set(graph.node(nid).domain, tag=f"n{nid}")


class _Unschedulable(ProgramError):
    pass


POINT_LIMIT = 100_000  # the most points (and reads between them) run one by one


def _point_order(comp, sub, graph: Graph) -> list | None:
    """The points of a group that no loop orders (a recurrence that runs outward from a
    seed in the middle: backward on one side, forward on the other), one call each, in an
    order that puts every point after what it reads: Kahn's algorithm over the points, the
    smallest (statement, point) first. None when there are more than ``POINT_LIMIT`` points
    or reads (a plan that size is no use), or the reads have a cycle."""
    pts: list[tuple[int, tuple]] = []
    for nid in sorted(comp):
        dom = _domain(graph, nid)
        if dom.is_empty():
            continue
        if len(pts) + dom.count_val().to_python() > POINT_LIMIT:
            return None
        dom.foreach_point(
            lambda p, nid=nid, n=dom.dim(isl.dim_type.set): pts.append(
                (
                    nid,
                    tuple(p.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(n)),
                )
            )
        )
        if len(pts) > POINT_LIMIT:
            return None
    deps: dict[tuple, list] = {}
    indeg = dict.fromkeys(pts, 0)
    n_reads = 0
    for (a, b), m in sub.items():
        pairs = m.wrap()
        n_reads += pairs.count_val().to_python()
        if n_reads > POINT_LIMIT:
            return None
        n_in, n_all = m.dim(isl.dim_type.in_), pairs.dim(isl.dim_type.set)

        def add(p, a=a, b=b, n_in=n_in, n_all=n_all):
            c = [p.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(n_all)]
            reader, read = (a, tuple(c[:n_in])), (b, tuple(c[n_in:]))
            if reader in indeg and read in indeg:
                deps.setdefault(read, []).append(reader)
                indeg[reader] += 1

        pairs.foreach_point(add)
    ready = [p for p, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        p = heapq.heappop(ready)
        out.append(p)
        for q in deps.get(p, ()):
            indeg[q] -= 1
            if indeg[q] == 0:
                heapq.heappush(ready, q)
    return out if len(out) == len(pts) else None


# ----------------------------------------------------------------------------- outer fusion
# A metric is reported as soon as each point is computed, so a metric must not wait for the
# end of the run: a metric statement (with what it reads that runs after the iteration loop)
# joins the last loop it depends on, at a coordinate of its own proved not to run ahead of
# what it reads. A metric that depends on no loop gets a loop of its own over its first dim,
# which later metrics join, so that all of them stream in the order of their dims.


def _members(item) -> list[int]:
    return [item[1]] if item[0] == "leaf" else _leaves(item[2])


class _Fuse:
    """What outer fusion needs to know of the graph: the reads between stored nodes (isl
    maps), each node's dims and domain, the level builder of ``build_schedule`` and the
    updates carried to the next step (``_carried_updates``)."""

    def __init__(self, graph: Graph, pairs, build, updates: dict[int, int]):
        self.graph, self.pairs, self.build = graph, pairs, build
        self.dims_of = {n.id: n.dims for n in graph.nodes}
        self._spans: dict[tuple, tuple | None] = {}  # (node, its map) -> (lo, hi), () empty
        self.reads_of: dict[int, set[int]] = {}
        self.updates = updates  # an update carried to the next step -> its merge
        for a, b in pairs:
            if a != b:
                self.reads_of.setdefault(a, set()).add(b)

    def domain(self, nid: int) -> isl.Set:
        return _domain(self.graph, nid)

    def span(self, phi: dict[int, isl.Map], nodes) -> tuple[int, int] | None:
        """The least and greatest coordinate ``phi`` gives the points of ``nodes``."""
        lo = hi = None
        for n in nodes:
            key = (n, phi[n].to_str())  # a band's members are measured again and again
            got = self._spans.get(key)
            if got is None:
                image = self.domain(n).apply(phi[n])
                if image.is_empty():
                    got = self._spans[key] = ()
                else:
                    a, b = image.dim_min_val(0), image.dim_max_val(0)
                    ok = a.is_int() and b.is_int()
                    got = (a.to_python(), b.to_python()) if ok else None
                    self._spans[key] = got
            if got == ():
                continue
            if got is None:
                return None
            a, b = got
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
        return (lo, hi) if lo is not None else None


def _stream_metrics(items, fuse: _Fuse, metric_nodes) -> list:
    dims_of = fuse.dims_of
    items = list(items)
    k = 0
    while k < len(items):
        x = items[k]
        metrics = [n for n in _members(x) if n in metric_nodes and dims_of[n]]
        if not metrics:
            k += 1
            continue
        stream = dims_of[metrics[0]][0]  # the dim the metric streams along
        where = {n: j for j, it in enumerate(items) for n in _members(it)}
        deps = [
            {where[b] for n in _members(it) for b in fuse.reads_of.get(n, ()) if where[b] != j}
            for j, it in enumerate(items)
        ]
        closure = _closure(deps, k)
        # the loops along that dim it depends on, the largest first (the training loop);
        # else the last such loop before it (another metric's)
        hosts = sorted(
            (j for j in closure if stream in _loop_names(items[j], dims_of)),
            key=lambda j: (-len(_members(items[j])), j),
        )
        hosts += [j for j in range(k - 1, -1, -1) if stream in _loop_names(items[j], dims_of)][:1]
        joined = None
        for host in hosts:
            after = sorted(j for j in closure if j > host)
            moved = [j for j in after if host in _closure(deps, j)] + [k]
            hoisted = [j for j in after if j not in moved]
            joined = _join(items[host], [items[j] for j in moved], fuse, stream)
            if joined is not None:
                break
        if joined is None:
            if x[0] == "leaf":
                items[k] = _own_loop(x[1], dims_of)
            k += 1
            continue
        rest = items[k + 1 :]
        items = (
            items[:host]
            + [items[j] for j in hoisted]
            + [joined]
            + [items[j] for j in range(host + 1, k) if j not in after]
            + rest
        )
        k = len(items) - len(rest)
    return items


def _loop_names(item, dims_of) -> set[str]:
    if item[0] != "band":
        return set()
    return {dims_of[n][c] for n, c in item[1].coords.items() if c is not None}


def _join_producers(items, fuse: _Fuse) -> list:
    """A statement outside every loop that only one loop reads joins that loop as its first
    statement, at the latest coordinate that still runs before every read of it: per
    iteration, one batched op over the points that iteration reads (a random draw for every
    env and step; a minibatch step's constants), instead of one op over the whole run whose
    result would be held, and grow with the iterations, until the loop ends."""
    items = list(items)
    k = len(items) - 1  # consumers first: a producer of a joined statement may precede it
    while k >= 0:
        x = items[k]
        if x[0] != "leaf" or not fuse.dims_of[x[1]] or ops.is_env(fuse.graph.node(x[1]).op):
            k -= 1
            continue
        nid = x[1]
        readers = {a for a, b in fuse.pairs if b == nid and a != nid}
        hosts = [j for j, it in enumerate(items) if readers & set(_members(it))]
        if (
            len(hosts) != 1
            or items[hosts[0]][0] != "band"
            or not readers <= set(_members(items[hosts[0]]))
        ):
            k -= 1
            continue
        joined = _join_ahead(items[hosts[0]], nid, readers, fuse)
        if joined is not None:
            items[hosts[0]] = joined
            del items[k]
        k -= 1
    return items


def _join_ahead(host, nid: int, readers: set[int], fuse: _Fuse):
    level = host[1]
    dims = fuse.dims_of[nid]
    # the host's loop dims first; then the producer's others, along which its readers may
    # still advance with the loop (``perm[e]`` read as ``perm[j // 4]`` in a loop over j)
    names = _loop_names(host, fuse.dims_of)
    for name in sorted(dims, key=lambda d: (d not in names, dims.index(d))):
        c = dims.index(name)
        scales = set()
        for r in readers:
            if level.coords.get(r) is None:
                continue
            rho = lv._slope(fuse.pairs[(r, nid)], level.coords[r], c)  # x ~ rho * reader's
            if rho is None:
                break
            scales.add(level.scale[r] / rho)
        else:
            if len(scales) != 1:
                continue
            f = scales.pop()
            if f <= 0 or f != int(f):
                continue
            base = lv._phi(nid, dims, c, int(f))
            ahead = None
            for r in readers:
                m = fuse.pairs[(r, nid)].apply_domain(level.phi[r]).apply_range(base)
                v = m.deltas().dim_max_val(0)
                if not v.is_int():
                    ahead = None
                    break
                ahead = v.to_python() if ahead is None else max(ahead, v.to_python())
            if ahead is None:
                continue
            phi = lv._phi(nid, dims, c, int(f), -ahead)
            bounds, span = fuse.span(level.phi, _members(host)), fuse.span({nid: phi}, [nid])
            if (
                bounds is None
                or span is None
                or not (bounds[0] <= span[0] <= span[1] <= bounds[1])
            ):
                continue
            new = lv.Level(
                {**level.coords, nid: c},
                {**level.scale, nid: int(f)},
                {**level.shift, nid: -ahead},
                {**level.phi, nid: phi},
                level.residual,
                {**level.used, nid: (c,)},
            )
            return ("band", new, [("leaf", nid)] + list(host[2]))
    return None


def _closure(deps, k) -> set[int]:
    out: set[int] = set()
    todo = [k]
    while todo:
        for j in deps[todo.pop()]:
            if j not in out:
                out.add(j)
                todo.append(j)
    return out


def _own_loop(nid: int, dims_of):
    phi = lv._phi(nid, dims_of[nid], 0, 1)
    level = lv.Level({nid: 0}, {nid: 1}, {nid: 0}, {nid: phi}, {}, {nid: (0,)})
    return ("band", level, [("leaf", nid)])


def _join(host, items, fuse: _Fuse, stream: str):
    """``host`` (a band) with ``items`` (in order; each reads only the host, items before it,
    or what runs before the host) run inside it, each at a coordinate along a dim of the
    host's loop that orders every read and stays within the host's range (joining never
    makes a loop longer), the last one (the metric) along ``stream``; None where some item
    has no such coordinate."""
    dims_of = fuse.dims_of
    level = host[1]
    coords, scale, shift = dict(level.coords), dict(level.scale), dict(level.shift)
    phi, used = dict(level.phi), dict(level.used)
    children = list(host[2])
    bounds = fuse.span(phi, _members(host))
    if bounds is None:
        return None
    names: list[str] = []
    for n, c in level.coords.items():
        if c is not None and dims_of[n][c] not in names:
            names.append(dims_of[n][c])
    # the updates carried to the next step at the end of the host's body (Adam's, an SGD
    # step's): an item that reads their merges and not them goes before them, so that the
    # memory plan can write each over its merge's value (``plan.memory._homes``); once one
    # goes after them, every later one does
    at = len(children)
    while at and children[at - 1][0] == "leaf" and children[at - 1][1] in fuse.updates:
        at -= 1
    ups = {it[1] for it in children[at:]}
    merges = {fuse.updates[u] for u in ups}
    for pos, item in enumerate(items):
        mine = _members(item)
        # the host's loop dims this item has, most shared first; if none, a fixed coordinate
        ranked = sorted(names, key=lambda d: -sum(d in dims_of[n] for n in mine))
        ranked = [d for d in ranked if any(d in dims_of[n] for n in mine)] or [None]
        if pos == len(items) - 1:
            ranked = [stream]
        for name in ranked:
            c = {n: dims_of[n].index(name) if name in dims_of[n] else None for n in mine}
            placed = _place_at(c, mine, coords, scale, phi, fuse)
            if placed is None:
                continue
            s, sh, ph = placed
            span = fuse.span(ph, mine)
            if span is not None and not (bounds[0] <= span[0] and span[1] <= bounds[1]):
                continue
            inner = {
                (a, b): m.intersect(ph[a].apply_range(ph[b].reverse()))
                for (a, b), m in fuse.pairs.items()
                if a in c and b in c
            }
            inner = {key: m for key, m in inner.items() if not m.is_empty()}
            now = {n: () if c[n] is None else (c[n],) for n in mine}
            try:
                sub = fuse.build(mine, inner, now)
            except ProgramError:
                continue
            coords.update(c)
            scale.update(s)
            shift.update(sh)
            phi.update(ph)
            used.update(now)
            reads = set().union(*(fuse.reads_of.get(n, set()) for n in mine))
            if ups and reads & merges and not reads & ups:
                children[at:at] = sub
                at += len(sub)
            else:
                children.extend(sub)
                ups = set()
            break
        else:
            return None
    return ("band", lv.Level(coords, scale, shift, phi, level.residual, used), children)


def _place_at(c, mine, coords, scale, phi, fuse: _Fuse):
    """Scales and shifts for the nodes ``mine`` at dim positions ``c`` so that no read from
    them goes ahead of the placed nodes' ``phi`` or of each other; None if there are none."""
    pairs, reads_of, dims_of = fuse.pairs, fuse.reads_of, fuse.dims_of
    found = set()
    for n in mine:
        for b in reads_of.get(n, ()):
            if b in phi and c[n] is not None and coords.get(b) is not None:
                rho = lv._slope(pairs[(n, b)], c[n], coords[b])
                if rho is not None:
                    found.add(scale[b] * rho)
    if len(found) > 1:
        return None
    f = found.pop() if found else 1
    if f <= 0 or f != int(f):
        return None
    s = {n: 0 if c[n] is None else int(f) for n in mine}
    base = {n: lv._phi(n, dims_of[n], c[n], s[n]) for n in mine}

    def ahead(m, a, b_phi):
        v = m.apply_domain(base[a]).apply_range(b_phi).deltas().dim_max_val(0)
        return v.to_python() if v.is_int() else None

    sh = dict.fromkeys(mine, 0)
    internal = {}
    for n in mine:
        for b in reads_of.get(n, ()):
            if b in phi or b in base:
                v = ahead(pairs[(n, b)], n, phi[b] if b in phi else base[b])
                if v is None:
                    return None
                if b in phi:
                    sh[n] = max(sh[n], v)
                else:
                    internal[(n, b)] = v
    for _ in range(len(mine) + 1):
        changed = False
        for (n, b), v in internal.items():
            if sh[b] + v > sh[n]:
                sh[n] = sh[b] + v
                changed = True
        if not changed:
            ph = {n: lv._phi(n, dims_of[n], c[n], s[n], sh[n]) for n in mine}
            return s, sh, ph
    return None


def instance_set(graph: Graph, st: Statement) -> isl.Set:
    """The points of a statement's loop dims: its domain with the vector dims projected out."""
    node = graph.node(st.nid)
    names = ", ".join(ix.isl_name(d) for d in node.dims)
    s = isl.Set(f"{{ S{st.nid}[{names}] : {ix.cond_to_isl(node.domain.cond)} }}")
    for d in reversed(node.dims):
        if d in st.vector:
            k = node.dims.index(d)
            s = s.project_out(isl.dim_type.set, k, 1)
    return s.set_tuple_name(f"S{st.nid}")


def _groups(graph: Graph, statements, order, slots) -> dict[int, list[int]]:
    """Runs of statements that are next to each other in one loop body with the same loops
    over the same points: isl's AST builder gets one statement per run (it is much faster
    with fewer statements), which the loop tree expands back into the run's calls."""
    groups: dict[int, list[int]] = {}
    sets: dict[int, isl.Set] = {}  # per statement, its points (one isl set per statement)
    leader = prev = None
    for nid in order:
        if prev is not None:
            (pre_a, pos_a, in_a), (pre_b, pos_b, in_b) = slots[prev], slots[nid]
            a, b = statements[leader], statements[nid]
            if (
                pre_a == pre_b
                and pos_b == pos_a + 1
                and in_a == in_b
                and a.loops == b.loops
                and _points(graph, a, sets).is_equal(_points(graph, b, sets))
            ):
                groups[leader].append(nid)
                prev = nid
                continue
        leader = prev = nid
        groups[leader] = [nid]
    return groups


def _points(graph: Graph, st: Statement, sets: dict) -> isl.Set:
    """``instance_set`` of ``st`` in a space without the statement's name, kept in
    ``sets``."""
    got = sets.get(st.nid)
    if got is None:
        got = sets[st.nid] = instance_set(graph, st).set_tuple_name("G")
    return got


def _loop_tree(graph: Graph, statements, times, groups, points=(), width: int = 0) -> tuple:
    sched = None
    for k, (time, _) in enumerate(points):  # one isl statement stands for each such group
        t = ", ".join(time + ["0"] * (width - len(time)))
        um = isl.UnionMap.from_map(isl.Map(f"{{ P{k}[] -> [{t}] }}"))
        sched = um if sched is None else sched.union(um)
    for nid in groups:
        st = statements[nid]
        node = graph.node(nid)
        dom = instance_set(graph, st)
        names = ", ".join(ix.isl_name(d) for d in node.dims if d in st.loops)
        m = isl.Map(f"{{ S{nid}[{names}] -> [{', '.join(times[nid])}] }}").intersect_domain(dom)
        um = isl.UnionMap.from_map(m)
        sched = um if sched is None else sched.union(um)
    if sched is None:
        return ()
    build = isl.AstBuild.from_context(isl.Set("{ : }"))
    calls = [c for _, c in points]
    return _expand(_convert(build.node_from_schedule_map(sched)), groups, calls)


@dataclass(frozen=True)
class _Points:
    """Where isl's AST runs group ``k`` of the statements run point by point."""

    k: int


def _expand(items, groups: dict[int, list[int]], points=()) -> tuple:
    out = []
    for it in items:
        if isinstance(it, _Points):
            out.extend(Call(nid, tuple(pt)) for nid, pt in points[it.k])
        elif isinstance(it, Call):
            out.extend(Call(nid, it.args) for nid in groups[it.statement])
        elif isinstance(it, Loop):
            out.append(Loop(it.var, it.init, it.cond, it.inc, _expand(it.body, groups, points)))
        else:
            out.append(
                If(it.cond, _expand(it.then, groups, points), _expand(it.orelse, groups, points))
            )
    return tuple(out)


# ----------------------------------------------------------------------------- isl AST -> tree
# The loop tree is plan items (``timerlc.plan.items``): ``Loop``, ``If`` and ``Call`` (the
# values of the statement's loop dims), over expressions of ``timerlc.plan.expr``: ints,
# loop variables and ``(op, E, ...)`` with isl's operators (``fdiv_q`` floor, ``pdiv_q``
# and ``pdiv_r`` on operands >= 0, ``zdiv_r`` C's remainder, ``select``, ...).
_OPS = {
    isl.ast_expr_op_type.and_: "and",
    isl.ast_expr_op_type.and_then: "and",
    isl.ast_expr_op_type.or_: "or",
    isl.ast_expr_op_type.or_else: "or",
    isl.ast_expr_op_type.max: "max",
    isl.ast_expr_op_type.min: "min",
    isl.ast_expr_op_type.minus: "neg",
    isl.ast_expr_op_type.add: "add",
    isl.ast_expr_op_type.sub: "sub",
    isl.ast_expr_op_type.mul: "mul",
    isl.ast_expr_op_type.div: "fdiv_q",  # exact division: any rounding agrees
    isl.ast_expr_op_type.fdiv_q: "fdiv_q",
    isl.ast_expr_op_type.pdiv_q: "pdiv_q",
    isl.ast_expr_op_type.pdiv_r: "pdiv_r",
    isl.ast_expr_op_type.zdiv_r: "zdiv_r",
    isl.ast_expr_op_type.cond: "select",
    isl.ast_expr_op_type.select: "select",
    isl.ast_expr_op_type.eq: "eq",
    isl.ast_expr_op_type.le: "le",
    isl.ast_expr_op_type.lt: "lt",
    isl.ast_expr_op_type.ge: "ge",
    isl.ast_expr_op_type.gt: "gt",
}


def _expr(e: isl.AstExpr):
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        return e.get_val().to_python()
    if t == isl.ast_expr_type.id:
        return e.get_id().get_name()
    op = e.get_op_type()
    if op not in _OPS:
        raise ValueError(f"isl AST expression not handled: {e.to_C_str()}")
    return (_OPS[op],) + tuple(_expr(e.get_op_arg(k)) for k in range(e.get_op_n_arg()))


def _convert(node: isl.AstNode) -> list:
    t = node.get_type()
    if t == isl.ast_node_type.block:
        out = []
        children = node.block_get_children()
        for k in range(children.n_ast_node()):
            out.extend(_convert(children.get_at(k)))
        return out
    if t == isl.ast_node_type.for_:
        return [
            Loop(
                _expr(node.for_get_iterator()),
                _expr(node.for_get_init()),
                _expr(node.for_get_cond()),
                _expr(node.for_get_inc()),
                tuple(_convert(node.for_get_body())),
            )
        ]
    if t == isl.ast_node_type.if_:
        other = _convert(node.if_get_else_node()) if node.if_has_else_node() else []
        return [
            If(_expr(node.if_get_cond()), tuple(_convert(node.if_get_then_node())), tuple(other))
        ]
    if t == isl.ast_node_type.user:
        call = node.user_get_expr()
        name = call.get_op_arg(0).get_id().get_name()
        if name.startswith("P"):
            return [_Points(int(name[1:]))]
        return [
            Call(
                int(name[1:]),
                tuple(_expr(call.get_op_arg(k)) for k in range(1, call.get_op_n_arg())),
            )
        ]
    if t == isl.ast_node_type.mark:
        return _convert(node.mark_get_node())
    raise ValueError(f"isl AST node not handled: {t}")


def _leaves(items) -> list[int]:
    out = []
    for item in items:
        if item[0] == "leaf":
            out.append(item[1])
        else:
            out.extend(_leaves(item[2]))
    return out
