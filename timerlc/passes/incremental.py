"""Incrementalization: a reduction over a window that grows or shrinks by one point per step
of a dim becomes a recurrence along that dim, O(1) work per point instead of O(window).

In: a PDG after autodiff. Out: an equivalent PDG where each matching reduction node ``R``
is computed by a piecewise recurrence ``y`` (a ``merge``, built as the front end builds
``g[T-1] = ...; g[t] = ...``):
- **shrinking suffix** ``x[..., lo:E]`` (``lo`` moves with dim t, ``E`` does not):
  ``sum``/``mean``/``max``/``min``: ``y[t] = x[lo] (+|max|min) y[t+1]``;
  ``discounted_sum(., gamma)``: ``y[t] = x[lo] + gamma * y[t+1]`` (Horner, in the order
  the reference uses, so the float result is the same);
- **growing prefix** ``x[..., S:hi]`` (``hi`` moves with t, ``S`` does not):
  ``sum``/``mean``/``max``/``min``: ``y[t] = y[t-1] (+|max|min) x[hi-1]``, and the reversed
  ``discounted_sum`` (what the gradient of a suffix one is): ``y[t] = x[hi-1] + gamma y[t-1]``;
- ``mean`` is the sum recurrence divided by the window length;
- ``sum``/``mean`` of f32 accumulate in f64 (then cast back): a running f32 sum over
  hundreds of points drifts from the reference's pairwise sum by more than the backends'
  tolerance, an f64 one does not.
The recurrence holds where the neighbour along t is in R's domain and its window is R's
window less its first (suffix) or last (prefix) point; elsewhere the window has one point
(``y = x[lo]``) or t starts a line of the domain (``y`` is R's own reduction there, e.g.
``sum(x[0:t+1]) when t >= 3`` at t = 3). Consumers keep reading node ``R``'s id: R becomes
the merge (or the cast/division of it), unless R's only reader is a one-branch merge of a
named tensor (``g_ds[t] = discounted_sum(r[t:T], gamma)``), which then becomes the
recurrence itself, so that the tensor's statement is the loop.

Rewritten only when exactly equivalent (proved with isl over R's domain): R reduces exactly
the window axis (axis 0, no keepdims), the window is the only slice of the read and its
length is at least 1 everywhere; the read's other indices, and the discount's read, do not
depend on t; every point whose neighbour along t is in the domain is either a one-point
window or follows from the neighbour's window. Left alone: *sliding* windows (both ends
move, ``r[t:min(t+N, T)]``, ``x[max(0, t-W+1):t+1]``: an O(1) update would need a
subtraction, which is not exact in floats and does not exist for max/min), the non-reversed
``discounted_sum`` over a prefix and the reversed one over a suffix (each step would need
``gamma ** length``), ``prod``/``logsumexp``/``std``/..., reductions over more than the
window axis, and windows over a dim the read also uses elsewhere (``x[t, t:T]``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy

from timerlc.ir import index as ix
from timerlc import ops
from timerlc.ir.builder import NodeBuilder
from timerlc.ir.pdg import Domain, Edge, Graph, Node, Point, Range, identity_access, make_attrs
from timerlc.types import TensorType
from timerlc.poly import isl as pisl

# op -> (how the recurrence combines, which windows it accepts: "suffix" | "prefix")
_KINDS = {
    "sum": ("add", ("suffix", "prefix")),
    "mean": ("add", ("suffix", "prefix")),
    "max": ("maximum", ("suffix", "prefix")),
    "min": ("minimum", ("suffix", "prefix")),
}


_FLIPPED = {
    sympy.Lt: sympy.Gt,
    sympy.Le: sympy.Ge,
    sympy.Gt: sympy.Lt,
    sympy.Ge: sympy.Le,
    sympy.Eq: sympy.Eq,
    sympy.Ne: sympy.Ne,
}


@dataclass(frozen=True)
class _Match:
    dim: str  # the dim t the window moves with
    step: int  # +1: y[t] reads y[t+1] (suffix window); -1: y[t] reads y[t-1] (prefix)
    pos: int  # position of the window Range in the read's access
    window: Range
    combine: str  # add | maximum | minimum | discount
    length: object  # hi - lo, a sympy expression of R's dims
    rec: object  # where the recurrence applies (a condition relative to R's domain)
    one: object  # where the window has one point
    start: object  # where t starts a line with a longer window (R's reduction there)


def incrementalize(graph: Graph) -> Graph:
    b = NodeBuilder.extending(graph)
    consumers = graph.consumers()
    tensor_nodes = {t.node for t in graph.tensors}
    changed = False
    for n in graph.nodes:
        m = _match(graph, n)
        if m is None:
            continue
        _Rewrite(graph, b, n, m, _absorbing_merge(graph, n, consumers, tensor_nodes)).run()
        changed = True
    return graph.replace(nodes=tuple(b.nodes)) if changed else graph


# ----------------------------------------------------------------------------- matching
def _kind(graph: Graph, n: Node) -> tuple[str, tuple[str, ...]] | None:
    if n.op == "discounted_sum":
        return ("discount", ("prefix",) if n.attr("reverse") else ("suffix",))
    if n.op not in _KINDS or n.attr("keepdims"):
        return None
    x = n.inputs[0]
    rank = 1 + len(graph.node(x.src).types[x.out].shape)  # the window axis, then the source's
    axes = n.attr("axes")
    if axes is None:
        axes = tuple(range(rank))
    elif isinstance(axes, int):
        axes = (axes,)
    if tuple(sorted(a % rank for a in axes)) != (0,):
        return None
    return _KINDS[n.op]


def _match(graph: Graph, n: Node) -> _Match | None:
    if len(n.types) != 1 or not n.dims or not n.inputs:
        return None
    x = n.inputs[0]
    ranges = [k for k, a in enumerate(x.access) if isinstance(a, Range)]
    if len(ranges) != 1 or x.cond is not None or any(e.cond is not None for e in n.inputs):
        return None
    if n.op not in _KINDS and n.op != "discounted_sum":
        return None
    kind = _kind(graph, n)
    if kind is None:
        return None
    combine, forms = kind
    if not _combinable(combine, n.type):
        return None
    (pos,) = ranges
    window = x.access[pos]
    lo, hi = sympy.sympify(window.lo), sympy.sympify(window.hi)
    if window.is_static:
        return None  # a constant length: the window slides (or does not move)
    others = [a.expr for k, a in enumerate(x.access) if k != pos]
    if combine == "discount":
        gamma = n.inputs[1]
        if any(isinstance(a, Range) for a in gamma.access):
            return None
        others += [a.expr for a in gamma.access]
    used = set().union(*(ix.dims_of(e) for e in others)) if others else set()
    length = sympy.expand(hi - lo)
    dom = n.domain.cond
    if pisl.is_empty(n.dims, dom) or not pisl.is_empty(n.dims, dom & (length < 1)):
        return None
    for dim in n.dims:
        if dim in used or dim not in ix.dims_of(lo) | ix.dims_of(hi):
            continue
        t = ix.sym(dim)
        for form in forms:
            step = 1 if form == "suffix" else -1
            at = {dim: t + step}
            lo_n, hi_n = ix.substitute(lo, at), ix.substitute(hi, at)
            follows = (
                sympy.And(sympy.Eq(lo_n, lo + 1), sympy.Eq(hi_n, hi))
                if form == "suffix"
                else sympy.And(sympy.Eq(lo_n, lo), sympy.Eq(hi_n, hi - 1))
            )
            has_next = _tidy(pisl.simplify(n.dims, ix.substitute(dom, at), dom))
            # the moving end first, so that conditions print as the front end's (t == 15)
            ends = (lo, hi - 1) if form == "suffix" else (hi - 1, lo)
            one = sympy.Eq(*ends)
            longer = sympy.Lt(*ends) if form == "suffix" else sympy.Gt(*ends)
            # every point with a neighbour must follow from it (or be a one-point window)
            if not pisl.is_empty(n.dims, sympy.And(dom, has_next, longer, sympy.Not(follows))):
                continue
            rec = _tidy(pisl.simplify(n.dims, sympy.And(has_next, longer), dom))
            if pisl.is_empty(n.dims, sympy.And(dom, rec)):
                continue
            start = sympy.And(sympy.Not(has_next), longer)
            return _Match(
                dim,
                step,
                pos,
                window,
                combine,
                length,
                rec,
                _simplified(n, one),
                _simplified(n, start),
            )
    return None


def _simplified(n: Node, cond):
    """``cond`` simplified on R's domain, or None where it holds nowhere."""
    if pisl.is_empty(n.dims, sympy.And(n.domain.cond, cond)):
        return None
    return _tidy(pisl.simplify(n.dims, cond, n.domain.cond))


def _tidy(cond):
    """Comparisons with their constant on the right: ``t + 1 < 16`` is ``t < 15``."""

    def tidy(rel):
        d = sympy.expand(rel.lhs - rel.rhs)
        c, rest = d.as_coeff_Add()
        if not c.is_Integer or rest == 0:
            return rel
        if rest.could_extract_minus_sign():  # -t >= -14 is t <= 14
            return _FLIPPED[type(rel)](-rest, c)
        return type(rel)(rest, -c)

    rels = sympy.sympify(cond).atoms(sympy.core.relational.Relational)
    return cond.xreplace({r: tidy(r) for r in rels}) if rels else cond


def _combinable(combine: str, t: TensorType) -> bool:
    if combine == "discount":
        return True
    try:
        ops.infer(combine, {"_name": combine}, [t, t])
    except ops.TypeRuleError:
        return False
    return True


def _absorbing_merge(graph: Graph, n: Node, consumers, tensor_nodes) -> Node | None:
    """The one-branch merge that is R's only reader over R's own domain (a tensor defined by
    one equation), which can become the recurrence itself; None if there is none."""
    if n.id in tensor_nodes or n.name is not None or len(consumers[n.id]) != 1:
        return None
    (cid, k) = consumers[n.id][0]
    m = graph.node(cid)
    if m.op != "merge" or len(m.inputs) != 1 or m.types != n.types or m.dims != n.dims:
        return None
    e = m.inputs[0]
    if e.access != identity_access(n.dims) or e.out != 0:
        return None
    here = pisl.domain_set(m.domain)
    if not here.is_equal(pisl.domain_set(n.domain)):
        return None
    if e.cond is not None and not here.is_subset(pisl.cond_set(m.dims, m.domain.cond & e.cond)):
        return None
    return m


# ----------------------------------------------------------------------------- rewriting
class _Rewrite:
    """Builds the recurrence of one matched reduction node into the builder."""

    def __init__(self, graph: Graph, b: NodeBuilder, n: Node, m: _Match, merge: Node | None):
        self.graph, self.b, self.n, self.m, self.merge = graph, b, n, m, merge
        self.dims = n.dims
        self.dom = n.domain
        out = n.type.dtype
        self.widen = n.op in ("sum", "mean") and out == "f32"
        self.acc = TensorType("f64" if self.widen else out, n.type.shape)

    def run(self):
        n, m, b = self.n, self.m, self.b
        final_is_y = not self.widen and n.op != "mean"
        if final_is_y and self.merge is not None:
            y = self.merge.id  # the named tensor's merge becomes the recurrence
        elif final_is_y:
            y = n.id
        else:
            y = b.reserve()
        head = self._head()
        branches = []
        if m.one is not None:
            branches.append(replace(head, cond=m.one))
        if m.start is not None:
            branches.append(Edge(self._direct(), identity_access(self.dims), cond=m.start))
        rec_dom = Domain(self.dims, sympy.And(self.dom.cond, m.rec))
        shift = tuple(
            Point(ix.sym(d) + m.step) if d == m.dim else Point(ix.sym(d)) for d in self.dims
        )
        prev = Edge(y, shift, span=n.span)
        at = n.id if final_is_y and self.merge is not None else None
        rec = self._combine(rec_dom, head, prev, at)
        branches.append(Edge(rec, identity_access(self.dims), cond=m.rec))
        ynode = Node(y, "merge", self.dom, tuple(branches), (self.acc,), (), None, n.span)
        if final_is_y and self.merge is not None:
            b.put(y, replace(ynode, name=self.merge.name, span=self.merge.span))
            return
        if final_is_y:
            b.put(y, replace(ynode, name=n.name))
            return
        b.fill(y, ynode)
        value, last = y, self.acc == n.type  # the last op is built at R's id
        if n.op == "mean":
            length = self._add("index_value", self.dom, [], expr=m.length)
            length = self._add("cast", self.dom, [self._id(length)], dtype=self.acc.dtype)
            at = n.id if last else None
            value = self._add("div", self.dom, [self._id(value), self._id(length)], at=at)
        if not last:
            self._add("cast", self.dom, [self._id(value)], dtype=n.type.dtype, at=n.id)
        b.put(n.id, replace(b.nodes[n.id], name=n.name))

    # the window's new point: x[lo] (suffix) or x[hi - 1] (prefix), widened when accumulating
    def _head(self) -> Edge:
        x, m = self.n.inputs[0], self.m
        at = m.window.lo if m.step == 1 else m.window.hi - 1
        access = list(x.access)
        access[m.pos] = Point(sympy.expand(at))
        read = Edge(x.src, tuple(access), x.out, None, x.span)
        if not self.widen:
            return read
        return self._id(self._add("cast", self.dom, [read], dtype=self.acc.dtype))

    def _direct(self) -> int:
        """R's own reduction (a sum for a mean), where t starts a line of the domain."""
        n, where = self.n, Domain(self.dims, sympy.And(self.dom.cond, self.m.start))
        op = "sum" if n.op == "mean" else n.op
        nid = self._add(op, where, list(n.inputs), **dict(n.attrs))
        if self.widen:
            nid = self._add("cast", where, [self._id(nid)], dtype=self.acc.dtype)
        return nid

    def _combine(self, where: Domain, head: Edge, prev: Edge, at: int | None) -> int:
        m = self.m
        if m.combine == "discount":
            gamma = self.n.inputs[1]
            scaled = self._add("mul", where, [gamma, prev], types=[self._type(gamma), self.acc])
            return self._add(
                "add", where, [head, self._id(scaled)], types=[self._type(head), self.acc], at=at
            )
        types = [self._type(head), self.acc]
        if m.step == 1:
            return self._add(m.combine, where, [head, prev], types=types, at=at)
        return self._add(m.combine, where, [prev, head], types=types[::-1], at=at)

    # ------------------------------------------------------------------------ helpers
    def _id(self, nid: int) -> Edge:
        return self.b.identity(nid)

    def _type(self, e: Edge) -> TensorType:
        """The type an edge delivers (``pdg.input_type`` over the nodes being built)."""
        src = self.b.nodes[e.src].types[e.out]
        lengths = [sympy.simplify(a.hi - a.lo) for a in e.access if isinstance(a, Range)]
        lengths = [int(v) if v.is_Integer else v for v in lengths]
        return TensorType(src.dtype, tuple(lengths) + src.shape)

    def _add(self, op: str, where: Domain, inputs, types=None, at=None, **attrs) -> int:
        in_types = types if types is not None else [self._type(e) for e in inputs]
        t = ops.infer(op, dict(attrs, _name=op), list(in_types))
        node_attrs = make_attrs(**attrs)
        if at is None:
            return self.b.add(op, where, inputs, t, node_attrs, span=self.n.span)
        self.b.put(at, Node(at, op, where, tuple(inputs), (t,), node_attrs, None, self.n.span))
        return at
