"""The autodiff pass: replaces every ``grad`` node by reverse-mode derivatives over the PDG.

In: a PDG with ``grad(y, x)`` nodes. Out: the same PDG where each ``grad`` node copies the
adjoint of x, computed by new nodes. Guarantees (LANGUAGE.md section 8): the derivative is
total, through every recurrence (backpropagation through time and through merges), slices,
reductions and gathers; x's own value is an input (what x depends on is not traversed);
sampling, environment outputs, comparisons, integer values, argmax and stop_grad pass none.

How: the *region* is the set of nodes on a differentiable path from x to y. Every region
node N gets an adjoint node over N's domain, the sum of one *transposed contribution* per
edge that reads N from another region node C: the vector-Jacobian product of C's op
(``timerlc.ops``: each op's ``vjp``) at C's points, extended by zeros to C's bounding box, then read back at the
points of C that read each point of N (the inverse of the edge's access). A read ``x[t+1]``
so becomes ``adj_x[s] += contrib[s-1]``, a slice ``x[0:T]`` an index into the contribution,
a dim the reader has and x lacks a sum over it, a dynamic window ``x[t:T]`` under a sum a
sum of the weights over the inverse window ``[0, s]``. Adjoints of one ``grad`` are those of
the sum of y over the grad's points, which is exact because every region point belongs to
one grad point and every contribution stays within one (checked: a region edge keeps the
grad's dims in place, or holds only where its two ends belong to the same grad point).

The second case comes from reads of x's tensor at another point than the grad's: in
``grad(loss[i, k], net[i, k])``, the rollout of iteration i reads ``net[i, 0]``, which is x
at k == 0 and a point x depends on, so a constant, at k > 0. The rollout then belongs to
grad point (i, 0), and a minibatch node ``mb[i, k]`` that reads it passes its adjoint back
where k == 0 only (see ``_Backward.region`` and ``check_constants``).
"""

from __future__ import annotations

import islpy as isl
import sympy

from timerlc.diagnostics import ProgramError
from timerlc.ir import index as ix
from timerlc.ir.builder import NodeBuilder
from timerlc.ir.pdg import (
    Domain,
    Edge,
    Graph,
    Node,
    Point,
    Range,
    access_to_text,
    identity_access,
)
from timerlc.types import TensorType
from timerlc.ops.grads import Window, flows, vjp
from timerlc.poly import isl as pisl


def differentiate(graph: Graph) -> Graph:
    """Replace the ``grad`` nodes of ``graph`` by their derivatives."""
    grads = [n for n in graph.nodes if n.op == "grad"]
    if not grads:
        return graph
    b = NodeBuilder.extending(graph)
    groups: dict = {}
    for g in grads:
        y = g.inputs[0]
        groups.setdefault((y.src, y.access, g.domain), []).append(g)
    consumers = graph.consumers()
    for group in groups.values():
        _Backward(graph, b, consumers, group).run()
    return graph.replace(nodes=tuple(b.nodes))


def edge_type(nodes, e: Edge) -> TensorType:
    src = nodes[e.src].types[e.out]
    lengths = []
    for a in e.access:
        if isinstance(a, Range):
            n = sympy.simplify(a.hi - a.lo)
            lengths.append(int(n) if n.is_Integer else n)
    return TensorType(src.dtype, tuple(lengths) + src.shape)


class Emitter:
    """Builds nodes over one domain, for the VJP rules of one forward node."""

    def __init__(self, b: NodeBuilder, node: Node, span):
        self.b, self.node, self.span = b, node, span
        self.domain = node.domain

    def _edge(self, a) -> Edge:
        return a if isinstance(a, Edge) else self.b.identity(a, self.span)

    def type_of(self, a) -> TensorType:
        return edge_type(self.b.nodes, a) if isinstance(a, Edge) else self.b.type_of(a)

    def shape(self, a) -> tuple:
        return self.type_of(a).shape

    def op(self, name: str, *args, **attrs) -> int:
        edges = [self._edge(a) for a in args]
        types = [self.type_of(a) for a in args]
        return self.b.op(name, self.domain, edges, types, span=self.span, **attrs)

    def const(self, value, dtype: str) -> int:
        return self.b.const(value, dtype, ())

    def fwd(self, k: int) -> Edge:
        return self.node.inputs[k]

    def out(self) -> int:
        return self.node.id

    def in_type(self, k: int) -> TensorType:
        return edge_type(self.b.nodes, self.node.inputs[k])

    def window_length(self) -> int:
        (rng,) = [
            a for a in self.node.inputs[0].access if isinstance(a, Range) and not a.is_static
        ]
        return self.b.op(
            "index_value", self.domain, [], [], span=self.span, expr=sympy.expand(rng.hi - rng.lo)
        )


class _Backward:
    def __init__(self, graph: Graph, b: NodeBuilder, consumers, group: list[Node]):
        self.graph, self.b, self.consumers, self.group = graph, b, consumers, group
        self.y = group[0].inputs[0]
        self.span = group[0].span
        self.bounds = graph.dim_bounds
        self.gdims = group[0].dims
        self.own = identity_access(self.gdims)
        self.pinnable = {s for s in self.stops() if graph.nodes[s].dims == self.gdims}
        self.back: dict = {}
        self.pins: dict = {}

    # ------------------------------------------------------------------ the region
    def stops(self) -> set[int]:
        """The x tensors read at the grad's own point (``net[i]`` in ``grad(loss[i], net[i])``):
        the traversal stops at them whole. A read of one at another point is x only where
        the two points coincide (see ``pinned``). Other reads of x (``h[0]`` of a recurrence
        ``h``) are masked point-wise instead: see ``masks``."""
        out = set()
        for g in self.group:
            x = g.inputs[1]
            src = self.graph.nodes[x.src]
            if set(src.dims) <= set(g.dims) and x.access == identity_access(src.dims):
                out.add(x.src)
        return out

    def pinned(self, c: Node, k: int) -> bool:
        """Whether input ``k`` of ``c`` reads x's tensor (one whose dims are the grad's) at
        another point than the consumer's own: ``net[i, 0]`` read by the rollout, where the
        grad is over ``[i, k]``. By section 8 that read is x for the grad point it reads
        (x is an input) and, for every other grad point, a point of the tensor that x
        depends on or that does not depend on x (checked: ``check_constants``): a constant."""
        e = c.inputs[k]
        return e.src in self.pinnable and e.access != self.own

    def masks(self) -> dict[int, object]:
        """For each x read at other points: the condition, over its tensor's dims, of the
        points that are not x. Its definition is traversed there only: x itself is an input
        (what it depends on is not traversed) while the tensor's other points, which may
        depend on x through a recurrence, are."""
        out: dict[int, object] = {}
        stops = self.stops()
        for g in self.group:
            x = g.inputs[1]
            if x.src in stops:
                continue
            src = self.graph.nodes[x.src]
            eqs = []
            for d, a in zip(src.dims, x.access):
                free = {str(s) for s in sympy.sympify(a.expr).free_symbols}
                if not free <= set(src.dims) & set(g.dims):
                    raise ProgramError(
                        f"a gradient with respect to {src.name}{access_to_text(x.access)} is "
                        "not supported: read x at the gradient's own point, or at constant "
                        "indices",
                        g.span,
                    )
                if sympy.sympify(a.expr) != ix.sym(d):
                    eqs.append(sympy.Eq(ix.sym(d), a.expr))
            cond = sympy.Not(sympy.And(*eqs)) if eqs else sympy.false
            out[x.src] = sympy.And(out.get(x.src, sympy.true), cond)
        return out

    def region(self) -> dict[int, tuple]:
        """The nodes on a differentiable path from x to y at the grad's own point, as
        ``{node: (cond, G, own)}``: the node is on it where ``cond`` holds, and its point p
        belongs to the grad point ``G(p)`` (index expressions over the node's dims, one per
        grad dim); ``own`` when G is the node's own point, everywhere.

        Paths are followed along the grad's dims with their offsets from the grad's point: a
        read ``v[i-1]`` leads to ``v`` one grad point earlier, and x is an input at offset 0
        only. So a loss that reads ``v[i]``, where ``v[i]`` was updated from ``w[i-1]``,
        does not put ``v`` on a path to x = ``w[i]`` (it depends on an earlier point of w,
        not on x). The offsets a node is reached at are kept as a range per grad dim
        (widened to the dim's whole range when a recurrence keeps moving them, so the walk
        does not grow with the number of iterations; None where a read is not a translation
        along that dim). A node reached both ways at an offset other than 0 (or at any
        offset) would mix grad points: ``_mixing`` refuses it.

        The ``pinned`` reads start a second walk (``pin_walk``), which carries the point of
        x's tensor that they read (``net[i, 0]`` read by the rollout of iteration i: grad
        point (i, 0)) to what depends on it. A node it reaches belongs to that grad point,
        on the part of its domain that the first walk has that point's y need: the
        rollout's ``flat[i]`` wholly, a minibatch ``mb[i, k]`` that reads it where k == 0.
        """
        nodes = self.graph.nodes
        gdims = self.gdims
        top = [self.bounds[d] - 1 for d in gdims]
        stops = self.stops()
        zero = tuple((0, 0) for _ in gdims)
        trans: dict[tuple[int, int], tuple] = {}

        def translation(c: Node, k: int) -> tuple:
            """Per grad dim, the offset of input ``k`` of ``c`` from ``c``'s point (None:
            not a translation along that dim)."""
            key = (c.id, k)
            if key not in trans:
                e, src = c.inputs[k], nodes[c.inputs[k].src]
                out = []
                for d in gdims:
                    a = e.access[src.dims.index(d)] if d in src.dims else None
                    moves = isinstance(a, Point) and d in c.dims
                    out.append(ix.affine_offset(a.expr, d) if moves else None)
                trans[key] = tuple(out)
            return trans[key]

        def shift(box, t, sign):
            """``box`` moved by ``sign * t``, within the dims' ranges; False if empty."""
            out = []
            for b, c, m in zip(box, t, top):
                if b is None or c is None:
                    out.append(None)
                    continue
                lo, hi = max(b[0] + sign * c, -m), min(b[1] + sign * c, m)
                if lo > hi:
                    return False
                out.append((lo, hi))
            return tuple(out)

        def without_zero(box):
            """Boxes covering ``box`` minus the grad's own point (x is an input there)."""
            if None in box:
                return [box]
            out, prefix = [], []
            for j, (lo, hi) in enumerate(box):
                rest = list(box[j + 1 :])
                if lo < 0:
                    out.append(tuple(prefix + [(lo, min(hi, -1))] + rest))
                if hi > 0:
                    out.append(tuple(prefix + [(max(lo, 1), hi)] + rest))
                if lo > 0 or hi < 0:
                    return [box]
                prefix.append((0, 0))
            return out

        def walk(starts, step) -> dict:
            seen: dict = dict(starts)
            todo = list(starts)
            while todo:
                nid = todo.pop()
                for nxt, box in step(nid, seen[nid]):
                    if box is False:
                        continue
                    old = seen.get(nxt, False)
                    new = _widen(old, box, top)
                    if new != old:
                        seen[nxt] = new
                        todo.append(nxt)
            return seen

        def back_step(nid, box):
            n = nodes[nid]
            sources = without_zero(box) if nid in stops else [box]
            for k, e in enumerate(n.inputs):
                if not flows(n, k, edge_type(nodes, e)):
                    continue
                if self.pinned(n, k):  # x where it is x, a constant elsewhere
                    yield e.src, zero
                    continue
                for b in sources:
                    yield e.src, shift(b, translation(n, k), 1)

        back = walk({self.y.src: zero}, back_step)

        def fwd_step(nid, box):
            for cid, k in self.consumers[nid]:
                c = nodes[cid]
                if cid not in back or self.pinned(c, k):
                    continue
                if flows(c, k, edge_type(nodes, c.inputs[k])):
                    yield cid, shift(box, translation(c, k), -1)

        fwd = walk({g.inputs[1].src: zero for g in self.group}, fwd_step)
        self.back, self.pins = back, self.pin_walk(back)
        pieces = {}
        for nid in (set(fwd) | set(self.pins)) & set(back):
            piece = self._piece(nodes[nid], fwd.get(nid), back[nid], self.pins.get(nid))
            if piece is not None:
                pieces[nid] = piece
        return pieces

    def pin_walk(self, back: dict) -> dict[int, tuple]:
        """From each ``pinned`` read, the point of x's tensor it reads, carried to the nodes
        (needed by y: in ``back``) that depend on it: ``{node: W}``, W one index expression
        per grad dim over the node's dims (None in a dim where two reads disagree or a
        slice spreads it). The walk stops at x's tensors: they are inputs."""
        nodes = self.graph.nodes
        stops = self.stops()
        out: dict[int, tuple] = {}
        todo: list[int] = []

        def put(nid: int, w: tuple):
            old = out.get(nid)
            new = w if old is None else tuple(a if _same(a, b) else None for a, b in zip(old, w))
            if new != old:
                out[nid] = new
                todo.append(nid)

        for s in sorted(self.pinnable):
            for cid, k in self.consumers[s]:
                c = nodes[cid]
                if cid not in back or not self.pinned(c, k):
                    continue
                if flows(c, k, edge_type(nodes, c.inputs[k])):
                    put(cid, _read_point(c.inputs[k]))
        while todo:
            nid = todo.pop()
            if nid in stops:
                continue
            for cid, k in self.consumers[nid]:
                c = nodes[cid]
                if cid in back and flows(c, k, edge_type(nodes, c.inputs[k])):
                    put(cid, _carry(out[nid], nodes[nid], c.inputs[k]))
        return out

    def _piece(self, node: Node, f, b, w):
        """``(cond, G, own)`` of ``node`` in the region, or None: from the offsets the first
        walk reaches it at (``f``, from x; ``b``, from y) and the point of x's tensor the
        second carries to it (``w``). Refuses a node whose points would belong to several
        grad points."""
        ident = tuple(ix.sym(d) for d in self.gdims)
        dom = node.domain.cond
        own = False
        if f is not None:
            meet = [
                None if p is None or q is None else (max(p[0], q[0]), min(p[1], q[1]))
                for p, q in zip(f, b)
            ]
            if not any(m is not None and m[0] > m[1] for m in meet):
                if any(m != (0, 0) for m in meet):
                    raise self._mixing(node)
                own = True
        if w is None:
            return (sympy.true, ident, True) if own else None
        conds, point, unknown = [], [], False
        for d, wd, bd in zip(self.gdims, w, b):
            if d not in node.dims:
                bd = None
            if bd is not None and wd is not None:  # y of grad point p - off needs it
                off = ix.sym(d) - wd
                if bd[0] == bd[1]:
                    conds.append(sympy.Eq(off, bd[0]))
                else:
                    conds += [off >= bd[0], off <= bd[1]]
                point.append(wd)
            elif bd is not None and bd[0] == bd[1]:
                point.append(ix.sym(d) - bd[0])
            elif wd is not None:
                point.append(wd)
            else:
                unknown = True
                point.append(None)
        cond = sympy.And(*conds)
        if pisl.is_empty(node.dims, sympy.And(dom, cond)):
            return (sympy.true, ident, True) if own else None
        if unknown:
            raise self._mixing(node)
        if own:
            same = sympy.And(*[sympy.Eq(p, q) for p, q in zip(point, ident)])
            if not pisl.is_empty(node.dims, sympy.And(dom, cond, sympy.Not(same))):
                raise self._mixing(node)
            return (sympy.true, ident, True)
        return (pisl.simplify(node.dims, cond, dom), tuple(point), False)

    def edge_conditions(self, pieces: dict) -> dict[tuple[int, int], object]:
        """For each region edge (consumer, input) that carries a gradient: the condition over
        the consumer's points under which its contribution is transposed (False: nowhere).
        Between nodes that belong to their own point, every edge but a ``pinned`` read keeps
        the grad's dims in place, so each region point belongs to one grad point and the
        adjoint of the sum over grad points is exact (checked; else the gradient would mix
        grad points). A pinned read, and an edge from or to a node of the second walk, holds
        where its two ends belong to the same grad point: elsewhere it reads a constant for
        the consumer's grad point."""
        nodes = self.graph.nodes

        def keeps(consumer_dims, src: Node, e: Edge) -> bool:
            for d in self.gdims:
                if d not in src.dims or d not in consumer_dims:
                    return False
                a = e.access[src.dims.index(d)]
                if not (isinstance(a, Point) and sympy.sympify(a.expr) == ix.sym(d)):
                    return False
            return True

        for g in self.group:
            for e in g.inputs:
                if e.src in pieces and pieces[e.src][2] and not keeps(g.dims, nodes[e.src], e):
                    raise self._mixing(nodes[e.src])
        out: dict[tuple[int, int], object] = {}
        for nid, (cond, point, own) in pieces.items():
            n = nodes[nid]
            for k, e in enumerate(n.inputs):
                if e.src not in pieces:
                    continue
                src = nodes[e.src]
                if own and pieces[e.src][2] and not self.pinned(n, k):
                    if not keeps(n.dims, src, e):
                        raise self._mixing(src)
                    out[(nid, k)] = sympy.true
                    continue
                if not flows(n, k, edge_type(nodes, e)):
                    continue
                read = _carry(pieces[e.src][1], src, e)
                if None in read:
                    raise self._mixing(src)
                c = sympy.And(cond, *[sympy.Eq(p, q) for p, q in zip(point, read)])
                out[(nid, k)] = False if pisl.is_empty(n.dims, sympy.And(n.domain.cond, c)) else c
        return out

    def check_constants(self):
        """The ``pinned`` reads are constants where they are not x: for each pair (g, q) of
        a grad point g whose y needs a node that depends on the point q != g of x's tensor
        (through pinned reads), x at g must not be something q depends on. Proved from the
        tensor's own recurrence: when every x at g depends on its point q, q cannot depend
        on x at g (the program has no cycles). The grad points that need a node are exact
        where the first walk reached it at one offset per grad dim: the pairs are collected
        at the first such node on every path from a pinned read to y (or at y)."""
        if not self.pins:
            return
        nodes = self.graph.nodes
        stops = self.stops()
        edges = []  # (consumer, input, point read, source in the walk or None, exact here)
        for m, w in self.pins.items():
            n = nodes[m]
            exact = all(
                bd is not None and bd[0] == bd[1] and d in n.dims
                for d, bd in zip(self.gdims, self.back[m])
            )
            for k, e in enumerate(n.inputs):
                if not flows(n, k, edge_type(nodes, e)):
                    continue
                if self.pinned(n, k):
                    q, src = _read_point(e), None
                elif e.src in self.pins and e.src not in stops:
                    q, src = _carry(self.pins[e.src], nodes[e.src], e), e.src
                else:
                    continue
                edges.append((m, k, q, src, exact or not all(map(_same, q, w))))
        covered = {m: True for m in self.pins}  # every path to it passed a collecting edge
        changed = True
        while changed:
            changed = False
            for m, _, _, src, collects in edges:
                if covered[m] and not (collects or (src is not None and covered[src])):
                    covered[m], changed = False, True
        pairs = []
        for m, k, q, src, collects in edges:
            if collects and not (src is not None and covered[src]):
                pairs.append(self._pairs(nodes[m], nodes[m].inputs[k].cond, self.back[m], q))
        if self.y.src in self.pins and not covered[self.y.src]:
            q = _carry(self.pins[self.y.src], nodes[self.y.src], self.y)
            pairs.append(self._pairs(self.group[0], None, tuple((0, 0) for _ in q), q))
        pairs = [p for p in pairs if not p.is_empty()]
        if not pairs:
            return
        for g in self.group:
            x = g.inputs[1].src
            chain = _chain(self.graph, x) if x in self.pinnable else None
            for p in pairs:
                tag = f"n{x}"
                p = p.set_tuple_name(isl.dim_type.in_, tag).set_tuple_name(isl.dim_type.out, tag)
                if chain is None or not isl.UnionMap.from_map(p).is_subset(chain):
                    raise self._mixing(nodes[x])

    def _pairs(self, m: Node, econd, box, q) -> isl.Map:
        """``{ g -> q }``, g != q: the grad points g whose y needs a point of ``m`` (where
        ``econd`` holds; ``box``: the offsets of those points from g) that reads the point
        ``q`` of x's tensor."""
        if None in q:
            raise self._mixing(m)
        cond = m.domain.cond if econd is None else sympy.And(m.domain.cond, econd)
        dom = Domain(m.dims, cond)
        to_q = pisl.access_map(dom, tuple(Point(v) for v in q), len(q))
        spread = []
        for d, bd in zip(self.gdims, box):
            if bd is None or d not in m.dims:
                spread.append(Range(sympy.Integer(0), sympy.Integer(self.bounds[d])))
            else:
                spread.append(Range(ix.sym(d) - bd[1], ix.sym(d) - bd[0] + 1))
        to_g = pisl.access_map(dom, tuple(spread), len(q))
        to_g = to_g.intersect_range(pisl.domain_set(self.group[0].domain))
        pairs = to_g.reverse().apply_range(to_q)
        return pairs.subtract(isl.Map.identity(pairs.get_space()))

    def _mixing(self, node: Node) -> ProgramError:
        what = f" through '{node.name}'" if node.name else ""
        return ProgramError(
            f"this gradient would mix different points of {', '.join(self.gdims)}{what}; "
            "a gradient must depend on the points of its own iteration only",
            self.span,
        )

    # ------------------------------------------------------------------ building
    def run(self):
        region = self.region()
        self.check_constants()
        nodes = self.graph.nodes
        if self.y.src not in region:
            for g in self.group:
                zero = self.b.const(0.0, g.type.dtype, g.type.shape)
                self.b.put(
                    g.id,
                    Node(g.id, "copy", g.domain, (Edge(zero, ()),), g.types, (), None, g.span),
                )
            return
        conds = self.edge_conditions(region)
        # placeholders, so that contributions can read adjoints before they are summed
        adj = {
            nid: self.b.add("copy", nodes[nid].domain, (), nodes[nid].type, span=nodes[nid].span)
            for nid in sorted(region)
        }
        incoming: dict[int, list[int]] = {nid: [] for nid in region}
        g0 = self.group[0]
        seed = self.b.const(1.0, nodes[self.y.src].type.dtype, ())
        seeded = g0.domain.cond
        _, point, own = region[self.y.src]
        if not own:  # y belongs to the grad point it reads x's tensor at
            read = _carry(point, nodes[self.y.src], self.y)
            if None in read:
                raise self._mixing(nodes[self.y.src])
            same = [sympy.Eq(ix.sym(d), r) for d, r in zip(self.gdims, read)]
            seeded = sympy.And(seeded, *same)
        self._transpose(g0, self.y, self._extend(g0, seed, seeded), incoming)
        masks = self.masks()
        for cid in sorted(set(region) - self.stops()):
            c = nodes[cid]
            em = Emitter(self.b, c, c.span or self.span)
            for k, e in enumerate(c.inputs):
                if e.src not in region or not flows(c, k, edge_type(nodes, e)):
                    continue
                held = conds[(cid, k)]
                if held is False:
                    continue
                if c.op == "merge":
                    contrib, cond = adj[cid], sympy.And(c.domain.cond, e.cond, held)
                else:
                    contrib, cond = vjp(em, c, k, adj[cid]), sympy.And(c.domain.cond, held)
                if cid in masks:
                    cond = sympy.And(cond, masks[cid])
                    if pisl.is_empty(c.dims, cond):
                        continue
                if isinstance(contrib, Window):
                    ext = self._extend(c, contrib.weight, cond)
                    self._transpose_window(c, e, ext, contrib.kind, incoming)
                else:
                    ext = self._extend(c, contrib, cond)
                    self._transpose(c, e, ext, incoming, _fixed(c.dims, held))
        for nid in region:
            self._fill_adjoint(nodes[nid], adj[nid], incoming[nid])
        for g in self.group:
            x = g.inputs[1]
            if x.src in adj:
                read = Edge(adj[x.src], x.access, span=g.span)
            else:  # y does not depend on this field
                read = Edge(self.b.const(0.0, g.type.dtype, g.type.shape), ())
            self.b.put(g.id, Node(g.id, "copy", g.domain, (read,), g.types, (), None, g.span))

    def _fill_adjoint(self, node: Node, slot: int, parts: list[int]):
        t = node.type
        if not parts:
            zero = self.b.const(0.0, t.dtype, t.shape)
            self.b.put(
                slot, Node(slot, "copy", node.domain, (Edge(zero, ()),), (t,), (), None, node.span)
            )
            return
        total = parts[0]
        for p in parts[1:-1]:
            total = self.b.op(
                "add",
                node.domain,
                [self.b.identity(total), self.b.identity(p)],
                [t, t],
                span=node.span,
            )
        if len(parts) == 1:
            inputs = (self.b.identity(total),)
            op = "copy"
        else:
            inputs = (self.b.identity(total), self.b.identity(parts[-1]))
            op = "add"
        self.b.put(slot, Node(slot, op, node.domain, inputs, (t,), (), None, node.span))

    def _box(self, node: Node) -> tuple[int, ...]:
        return pisl.extents(node.dims, node.domain.cond) if node.dims else ()

    def _extend(self, c: Node, contrib: int, cond) -> int:
        """``contrib`` (over c's domain, zero-extended): a node over c's bounding box that is
        ``contrib`` where ``cond`` holds and zero elsewhere."""
        box_extents = self._box(c)
        box = ix.box(zip(c.dims, box_extents))
        t = self.b.type_of(contrib)
        if pisl.is_empty(c.dims, sympy.And(box, sympy.Not(cond))):
            if self.b.nodes[contrib].dims == c.dims or not c.dims:
                return contrib
        zero = self.b.const(0.0, t.dtype, t.shape)
        branch = Edge(
            contrib,
            identity_access(self.b.nodes[contrib].dims),
            cond=pisl.simplify(c.dims, cond, box),
        )
        rest = Edge(zero, (), cond=pisl.simplify(c.dims, sympy.Not(cond), box))
        return self.b.add("merge", Domain(c.dims, box), [branch, rest], t, span=c.span)

    # ------------------------------------------------------------------ transposition
    def _transpose(self, c: Node, e: Edge, ext: int, incoming, fixed=None):
        """Add to ``incoming[e.src]`` the contributions ``ext`` (over c's bounding box) read
        back at the points of c that read each point of e's source. ``fixed``: consumer dims
        that ``ext`` is zero off an expression of the others (``{k: 0}`` for a contribution
        that holds where k == 0), read there only instead of summed over."""
        src = self.graph.nodes[e.src]
        ext_node = self.b.nodes[ext]
        extents = dict(zip(c.dims, self._box(c)))
        variants = [({}, [], [])]  # (solved consumer dims, conditions, element items)
        for j, a in enumerate(e.access):
            s = ix.sym(src.dims[j])
            nxt = []
            for solved, conds, items in variants:
                if isinstance(a, Point):
                    nxt.append(self._invert_point(a.expr, s, solved, conds, items, e))
                elif a.is_static:
                    nxt.extend(self._invert_static_range(a, s, solved, conds, items, e))
                else:
                    raise ProgramError(
                        "the gradient through a slice whose length depends on a dim is supported "
                        "only under sum, mean and discounted_sum",
                        e.span or c.span,
                    )
            variants = nxt
        for solved, conds, items in variants:
            for d, v in (fixed or {}).items():
                if d not in solved and ix.dims_of(v) <= set(solved):
                    solved = {**solved, d: ix.substitute(v, solved)}
            part = self._read_back(src, c, ext, ext_node, extents, solved, conds, items, e)
            if part is not None:
                incoming[e.src].append(part)

    def _invert_point(self, expr, s, solved, conds, items, e):
        expr = sympy.sympify(expr)
        solved, conds = dict(solved), list(conds)
        if expr.is_Integer:
            conds.append(sympy.Eq(s, expr))
            return solved, conds, items
        d = _translation(expr)
        if d is None:
            raise ProgramError(
                f"the gradient through the read index {ix.to_text(expr)} is not supported "
                "(only a dim plus a constant, or a constant)",
                e.span,
            )
        dim, off = d
        if dim in solved:
            conds.append(sympy.Eq(solved[dim], s - off))
        else:
            solved[dim] = s - off
        return solved, conds, items

    def _invert_static_range(self, a: Range, s, solved, conds, items, e):
        lo, hi = sympy.sympify(a.lo), sympy.sympify(a.hi)
        length = int(sympy.simplify(hi - lo))
        if lo.is_Integer:
            return [(dict(solved), list(conds) + [s >= lo, s < hi], list(items) + [s - lo])]
        d = _translation(lo)
        if d is None:
            raise ProgramError(
                f"the gradient through the slice {ix.to_text(lo)}:{ix.to_text(hi)} is not "
                "supported",
                e.span,
            )
        dim, off = d
        out = []
        for k in range(length):  # element k of the window at c reads s = c + off + k
            sv, cv = dict(solved), list(conds)
            if dim in sv:
                cv.append(sympy.Eq(sv[dim], s - off - k))
            else:
                sv[dim] = s - off - k
            out.append((sv, cv, list(items) + [sympy.Integer(k)]))
        return out

    def _read_back(
        self, src: Node, c: Node, ext: int, ext_node: Node, extents, solved, conds, items, e
    ):
        free = [d for d in c.dims if d not in solved]
        conds = list(conds) + [sympy.And(v >= 0, v < extents[d]) for d, v in solved.items()]
        cond = sympy.And(src.domain.cond, *conds)
        if pisl.is_empty(src.dims, cond):
            return None
        access = []
        for d in ext_node.dims:
            access.append(
                Point(solved[d])
                if d in solved
                else Range(sympy.Integer(0), sympy.Integer(extents[d]))
            )
        where = Domain(src.dims, pisl.simplify(src.dims, cond))
        val = self._emit_read(where, ext, tuple(access), len(free), items, src)
        return self._guard(src, val, cond)

    def _emit_read(self, where: Domain, ext: int, access, n_free: int, items, src: Node) -> int:
        read = Edge(ext, access)
        t = edge_type(self.b.nodes, read)
        if items:
            its = (("full",),) * n_free + tuple(("int", sympy.expand(i)) for i in items)
            nid = self.b.op("index", where, [read], [t], items=its)
        else:
            nid = self.b.op("copy", where, [read], [t])
        if n_free:
            nid = self.b.op(
                "sum",
                where,
                [self.b.identity(nid)],
                [self.b.type_of(nid)],
                axes=tuple(range(n_free)),
            )
        return nid

    def _guard(self, src: Node, val: int, cond) -> int:
        """``val`` where ``cond`` holds, zero elsewhere on src's domain."""
        if pisl.is_empty(src.dims, sympy.And(src.domain.cond, sympy.Not(cond))):
            if self.b.nodes[val].dims == src.dims:
                return val
        t = self.b.type_of(val)
        zero = self.b.const(0.0, t.dtype, t.shape)
        branch = Edge(
            val,
            identity_access(self.b.nodes[val].dims),
            cond=pisl.simplify(src.dims, cond, src.domain.cond),
        )
        rest = Edge(zero, (), cond=pisl.simplify(src.dims, sympy.Not(cond), src.domain.cond))
        return self.b.add("merge", src.domain, [branch, rest], t, span=src.span)

    def _transpose_window(self, c: Node, e: Edge, ext: int, kind: str, incoming):
        """A dynamic window under a reduction: sum the weights over the inverse window."""
        src = self.graph.nodes[e.src]
        extents = dict(zip(c.dims, self._box(c)))
        solved, conds, window, s_w = {}, [], None, None
        for j, a in enumerate(e.access):
            s = ix.sym(src.dims[j])
            if isinstance(a, Point):
                solved, conds, _ = self._invert_point(a.expr, s, solved, conds, [], e)
            elif a.is_static:
                raise ProgramError(
                    "the gradient through a window with a fixed slice beside it is not supported",
                    e.span,
                )
            else:
                window, s_w = _invert_window(a, s, extents, e), s
                conds += window[3]
        dim, lo_w, hi_w, _, off = window
        free = [d for d in c.dims if d not in solved and d != dim]
        if free or dim in solved:
            raise ProgramError("the gradient through this dynamic slice is not supported", e.span)
        cond = sympy.And(
            src.domain.cond,
            *[sympy.And(v >= 0, v < extents[d]) for d, v in solved.items()],
            *conds,
        )
        if pisl.is_empty(src.dims, cond):
            return
        where = Domain(src.dims, pisl.simplify(src.dims, cond))
        access = tuple(
            Point(solved[d]) if d in solved else Range(lo_w, hi_w) for d in self.b.nodes[ext].dims
        )
        read = Edge(ext, access)
        t = edge_type(self.b.nodes, read)
        if kind == "sum":
            val = self.b.op("sum", where, [read], [t], axes=(0,))
        else:
            gamma = c.inputs[1]
            if self.graph.nodes[gamma.src].dims:
                raise ProgramError(
                    "the gradient of discounted_sum needs a constant discount", e.span
                )
            if off is None:
                raise ProgramError(
                    "the gradient of this discounted_sum window is not supported", e.span
                )
            gt = edge_type(self.b.nodes, gamma)
            acc = self.b.op("discounted_sum", where, [read, gamma], [t, gt], reverse=True)
            expo = self.b.op("index_value", where, [], [], expr=sympy.expand(s_w - off - hi_w + 1))
            ef = self.b.op(
                "cast", where, [self.b.identity(expo)], [self.b.type_of(expo)], dtype=gt.dtype
            )
            factor = self.b.op(
                "pow", where, [gamma, self.b.identity(ef)], [gt, self.b.type_of(ef)]
            )
            val = self.b.op(
                "mul",
                where,
                [self.b.identity(acc), self.b.identity(factor)],
                [self.b.type_of(acc), gt],
            )
        incoming[e.src].append(self._guard(src, val, cond))


def _widen(old, box, top):
    """The offsets reached so far (``old``; False: none yet) joined with ``box``, per grad
    dim (None: any offset); a bound that moves again goes straight to the end of its dim's
    range (a recurrence would move it one step per visit)."""
    if old is False:
        return box
    out = []
    for o, b, m in zip(old, box, top):
        if o is None or b is None:
            out.append(None)
        else:
            (lo, hi), (l2, h2) = o, b
            out.append((lo if l2 >= lo else -m, hi if h2 <= hi else m))
    return tuple(out)


def _same(a, b) -> bool:
    """Two index expressions (None: unknown) that are known to be equal."""
    return a is not None and b is not None and (a == b or sympy.simplify(a - b) == 0)


def _read_point(e: Edge) -> tuple:
    """The point an edge reads, per producer dim (None where it reads a slice)."""
    return tuple(a.expr if isinstance(a, Point) else None for a in e.access)


def _carry(point: tuple, src: Node, e: Edge) -> tuple:
    """``point`` (index expressions over ``src``'s dims) at the consumer's points that read
    ``src`` through ``e``: None where it depends on a dim that ``e`` slices."""
    sub, sliced = {}, set()
    for d, a in zip(src.dims, e.access):
        if isinstance(a, Point):
            sub[d] = a.expr
        else:
            sliced.add(d)
    out = []
    for p in point:
        if p is None or ix.dims_of(p) & sliced:
            out.append(None)
        else:
            out.append(sympy.expand(ix.substitute(p, sub)))
    return tuple(out)


def _fixed(dims: tuple[str, ...], cond) -> dict:
    """The dims that ``cond`` sets equal to an expression of the others, by one of its
    conjuncts: ``{d: expr}``."""
    out = {}
    for eq in cond.args if isinstance(cond, sympy.And) else (cond,):
        if not isinstance(eq, sympy.Eq):
            continue
        diff = sympy.expand(eq.lhs - eq.rhs)
        for d in dims:
            s = ix.sym(d)
            coeff = diff.coeff(s)
            rest = sympy.expand(diff - coeff * s)
            if d not in out and coeff in (1, -1) and s not in rest.free_symbols:
                out[d] = sympy.expand(-rest / coeff)
                break
    return out


def _chain(graph: Graph, pid: int):
    """``{ p -> q }``: the point p of tensor ``pid`` depends on its point q, through its
    own equations (the paths to its reads of itself that pass no other tensor), closed
    transitively; None where isl's closure is not exact. An under-approximation of what
    depends on what, which is all ``check_constants`` needs."""
    nodes = graph.nodes
    memo: dict[int, isl.UnionMap | None] = {}

    def reads(nid: int):
        if nid in memo:
            return memo[nid]
        memo[nid] = None
        n, out = nodes[nid], None
        for e in n.inputs:
            src = nodes[e.src]
            dom = n.domain if e.cond is None else Domain(n.dims, sympy.And(n.domain.cond, e.cond))
            m = pisl.access_map(
                dom, e.access, len(src.dims), src_tag=f"n{src.id}", dst_tag=f"n{nid}"
            )
            m = isl.UnionMap.from_map(m)
            if src.id == pid:
                part = m
            elif src.op == "merge":
                continue
            else:
                sub = reads(src.id)
                if sub is None:
                    continue
                part = m.apply_range(sub)
            out = part if out is None else out.union(part)
        memo[nid] = out
        return out

    rel = reads(pid)
    if rel is None:
        return None
    closure, exact = rel.transitive_closure()
    return closure if exact else None


def _translation(expr):
    """``d + a`` -> (d, a) for a single dim d with coefficient 1, else None."""
    expr = sympy.sympify(expr)
    syms = list(expr.free_symbols)
    if len(syms) != 1:
        return None
    off = ix.affine_offset(expr, syms[0].name)
    return None if off is None else (syms[0].name, off)


def _bound(expr):
    """A window bound: ("const", K) | ("trans", d, a) | ("max", K, d, a) | ("min", K, d, a)."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return ("const", int(expr))
    t = _translation(expr)
    if t is not None:
        return ("trans", *t)
    if isinstance(expr, (sympy.Max, sympy.Min)) and len(expr.args) == 2:
        consts = [a for a in expr.args if a.is_Integer]
        rest = [a for a in expr.args if not a.is_Integer]
        if len(consts) == 1 and len(rest) == 1 and _translation(rest[0]) is not None:
            kind = "max" if isinstance(expr, sympy.Max) else "min"
            return (kind, int(consts[0]), *_translation(rest[0]))
    return None


def _invert_window(a: Range, s, extents, e):
    """For ``lo(c) <= s < hi(c)`` over one consumer dim c: (c, L(s), U(s), conds, off) with
    c in [L, U), where ``lo(c) = c + off`` when lo is a plain translation (else off None)."""
    lo, hi = _bound(a.lo), _bound(a.hi)
    if lo is None or hi is None or "min" == lo[0] or "max" == hi[0]:
        raise ProgramError(
            f"the gradient through the slice {ix.to_text(a.lo)}:{ix.to_text(a.hi)} is not "
            "supported",
            e.span,
        )
    dims = {b[-2] for b in (lo, hi) if b[0] != "const"}
    if len(dims) != 1:
        raise ProgramError("the gradient through this dynamic slice is not supported", e.span)
    (dim,) = dims
    n = extents[dim]
    lower, upper, conds, off = sympy.Integer(0), sympy.Integer(n), [], None
    if lo[0] == "const":
        conds.append(s >= lo[1])
    else:  # lo = c + a or max(K, c + a): lo <= s  <=>  c <= s - a (and K <= s)
        upper = sympy.Min(upper, s - lo[-1] + 1)
        if lo[0] == "max":
            conds.append(s >= lo[1])
        else:
            off = lo[-1]
    if hi[0] == "const":
        conds.append(s < hi[1])
    else:  # hi = c + b or min(K, c + b): s < hi  <=>  c >= s - b + 1 (and s < K)
        lower = sympy.Max(lower, s - hi[-1] + 1)
        if hi[0] == "min":
            conds.append(s < hi[1])
    return dim, lower, sympy.Max(lower, upper), conds, off
