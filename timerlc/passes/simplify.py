"""Simplification: identities bypassed, common subexpressions shared, dead nodes dropped.

In: a PDG after autodiff. Out: an equivalent PDG with fewer nodes:
- **identities**: a read of a node that only passes its input on (``copy``, ``stop_grad``
  after autodiff, a one-equation tensor's ``merge`` whose condition covers its domain, a
  ``where`` whose condition is a constant: a config flag's branch not taken is not computed)
  reads that input directly, through the composed access (``y[t] = x[t+1]`` read at
  ``y[t-1]`` reads ``x[t]``). Defs, record fields and gradients leave many such chains.
- **common subexpressions**: nodes with the same op, domain, attributes and inputs are one
  node (random ops included: their values are a function of their key and point;
  environment calls never).
- **outer products summed over points**: ``sum`` over vector dims of a per-point outer
  product ``transpose(expand_dims(x)) @ expand_dims(g)`` (autodiff's per-sample weight
  gradient of a layer applied at every point) is one ``matmul`` of the points' values
  stacked as rows, ``transpose(X) @ G`` (``_contract``): the per-point products are not
  stored (REINFORCE at 2048x128: a 4x64 and a 64x2 gradient per point, 402 MB).
- **dead code**: nodes that no output, metric or environment call depends on are dropped,
  and ids are renumbered (a run-time failure in a dead tensor is not reported).
Named tensors that are outputs or metrics keep their nodes.
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from timerlc import ops
from timerlc.ir import index as ix
from timerlc.ir.pdg import (
    Edge,
    Graph,
    Node,
    Point,
    Range,
    identity_access,
    input_type,
    make_attrs,
)
from timerlc.poly import isl as pisl
from timerlc.types import TensorType


def simplify(graph: Graph) -> Graph:
    roots = {graph.tensor(name).node for name in (*graph.outputs, *graph.metrics)}
    roots |= {n.id for n in graph.nodes if ops.is_env(n.op)}
    nodes = list(graph.nodes)
    assert all(n.id == k for k, n in enumerate(nodes))
    identities = _identities(graph, nodes)
    first = len(nodes)
    for _ in range(len(nodes)):
        changed = _bypass(graph, nodes, identities)
        changed |= _forward_reshapes(nodes)
        changed |= _forward_env_rows(nodes)
        changed |= _share(nodes, roots)
        if not changed:
            break
    forwarded = range(first, len(nodes))
    if _contract(nodes):
        _share(nodes, roots)
    return _drop_dead(graph, _before_readers(nodes, forwarded), roots)


def _identities(graph: Graph, nodes: list[Node]) -> dict[int, int]:
    """Per node that passes one input on, which input: an identity's (below), or the branch
    a ``where`` takes where its condition is a constant (a config flag:
    ``where(clip_vloss, a, b)``) and that branch has the where's type."""
    out = {n.id: 0 for n in nodes if _is_identity(graph, n)}
    for n in nodes:
        picked = _constant_choice(graph, n)
        if picked is not None:
            out[n.id] = picked
    return out


def _constant_choice(graph: Graph, n: Node) -> int | None:
    if n.op != "where" or len(n.types) != 1:
        return None
    c = n.inputs[0]
    src = graph.node(c.src)
    value = src.attr("value")
    if src.op != "const" or c.cond is not None or not isinstance(value, bool):
        return None
    k = 1 if value else 2
    e = n.inputs[k]
    if e.cond is not None or input_type(graph, e) != n.types[0]:
        return None  # (a branch broadcast to the where's shape is not the where)
    return k


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


def _bypass(graph: Graph, nodes: list[Node], identities: dict[int, int]) -> bool:
    """Each read of a node of ``identities`` (per node, the input it passes on) reads that
    input instead (``nodes[k]`` is node ``k``, as it is now)."""
    changed = False
    for k, n in enumerate(nodes):
        inputs = list(n.inputs)
        for j, e in enumerate(inputs):
            seen = 0
            while e.src in identities and e.out == 0 and seen < len(nodes):
                new = _compose(e, nodes[e.src].inputs[identities[e.src]], graph.node(e.src))
                if new is None:
                    break
                e, seen = new, seen + 1
            if seen:
                inputs[j] = e
        if inputs != list(n.inputs):
            nodes[k] = replace(n, inputs=tuple(inputs))
            changed = True
    return changed


def _reshaped(n: Node) -> Edge | None:
    """The read a ``reshape`` node reshapes (its one input, unconditional), or None."""
    if n.op != "reshape" or len(n.inputs) != 1 or n.inputs[0].cond is not None:
        return None
    return n.inputs[0]


def _forward_reshapes(nodes: list[Node]) -> bool:
    """Each read of a ``reshape`` node ``r`` (whose value is its input's elements in their
    row-major order) reads ``r``'s input instead, where that composes:

    - a ``reshape`` reading ``r`` reshapes ``r``'s input (a reshape of a reshape is one);
    - any other node reading ``r`` at points (``take(flat_o[j // K], idx[j], 0)``, where
      ``flat_o[i] = reshape(o[i, 0:B, 0:T], [B * T, E.obs_dim])``) reads a reshape of its own,
      over its domain, of ``r``'s input at the composed points
      (``reshape(o[j // K, 0:B, 0:T], ...)``), which the schedule computes with it: a view
      of the stored input, so ``r`` need not be stored (a copy of every observation of an
      iteration, PPO's), where no other node reads ``r`` at its own point.

    New nodes are appended (``_drop_dead`` renumbers)."""
    changed = False
    for k in range(len(nodes)):
        n = nodes[k]
        inputs = list(n.inputs)
        for j, e in enumerate(inputs):
            r = nodes[e.src]
            inner = _reshaped(r)
            if inner is None or e.out != 0:
                continue
            if n.op == "reshape":
                new = _compose(e, inner, r)
                if new is not None:
                    inputs[j] = new
                continue
            if r.dims == n.dims and e.access == identity_access(n.dims):
                continue  # (computed with n already where nothing else stores it)
            if not all(isinstance(a, Point) for a in e.access):
                continue
            inputs[j] = _own_view(nodes, n, e, r, inner, r.attrs)
        if inputs != list(n.inputs):
            nodes[k] = replace(n, inputs=tuple(inputs))
            changed = True
    return changed


def _own_view(nodes: list[Node], n: Node, e: Edge, r: Node, inner: Edge, attrs) -> Edge:
    """For node ``n``'s read ``e`` (at points) of a view ``r`` of ``inner``'s source: a node
    of ``r``'s op with ``attrs``, over ``n``'s domain (where ``e`` applies), reading that
    source at the composed points, which the schedule computes with ``n`` (``_forward_*``);
    appended, and the edge by which ``n`` reads it."""
    read = replace(_compose(e, inner, r), cond=None)
    dom = n.domain if e.cond is None else type(n.domain)(n.dims, n.domain.cond & e.cond)
    m = Node(len(nodes), r.op, dom, (read,), r.types, attrs, span=r.span)
    nodes.append(m)
    return Edge(m.id, identity_access(n.dims), 0, e.cond, e.span)


def _env_row(n: Node, nodes: list[Node]) -> Edge | None:
    """The read an ``index`` node makes of an environment's batched output where it takes
    one environment's row of it (items: the env's batch dim alone, as the front end writes
    ``o[i, b, t+1] = E.step(...)``), or None."""
    if n.op != "index" or len(n.inputs) != 1 or n.inputs[0].cond is not None:
        return None
    e = n.inputs[0]
    if not ops.is_env(nodes[e.src].op) or not all(isinstance(a, Point) for a in e.access):
        return None
    items = dict(n.attrs).get("items")
    if not items or len(items) != 1 or items[0][0] != "int":
        return None
    d = items[0][1]
    if not isinstance(d, sympy.Symbol) or str(d) not in n.dims:
        return None
    if any(d in a.expr.free_symbols for a in e.access):
        return None
    return e


def _forward_env_rows(nodes: list[Node]) -> bool:
    """Each read at other points of an environment's row of its batched output
    (``_env_row``: the observation ``o[i, b, t+1]`` of ``E.step``, which the merge ``o``
    reads at ``t - 1``) reads a row of its own, over its domain, of the output at the
    composed point, which the schedule computes with it: the row is no buffer of its own
    (a copy of each step's observations, read one step later), the output's buffer keeps the
    steps instead (the same bytes: the rows are all of it).

    Only rows every read of which is at points: a row also read through a range (a sum of
    the rewards over a rollout) stays stored, and the output's buffer would keep the steps
    as well.

    New nodes are appended (``_drop_dead`` renumbers)."""
    changed = False
    pointwise = {}
    for n in nodes:
        for e in n.inputs:
            ok = e.out == 0 and all(isinstance(a, Point) for a in e.access)
            pointwise[e.src] = pointwise.get(e.src, True) and ok
    for k in range(len(nodes)):
        n = nodes[k]
        inputs = list(n.inputs)
        for j, e in enumerate(inputs):
            r = nodes[e.src]
            if not pointwise.get(e.src):
                continue
            inner = _env_row(r, nodes)
            if inner is None:
                continue
            if r.dims == n.dims and e.access == identity_access(n.dims):
                continue  # (computed with n already where nothing else stores it)
            at = {d: a.expr for d, a in zip(r.dims, e.access)}
            (item,) = dict(r.attrs)["items"]
            row = sympy.expand(ix.substitute(item[1], at))
            attrs = tuple((key, (("int", row),) if key == "items" else v) for key, v in r.attrs)
            inputs[j] = _own_view(nodes, n, e, r, inner, attrs)
        if inputs != list(n.inputs):
            nodes[k] = replace(n, inputs=tuple(inputs))
            changed = True
    return changed


def _contract(nodes: list[Node]) -> bool:
    """Each ``sum`` over the leading (range) axes of its one input, where that input reads a
    per-point outer product ``transpose(expand_dims(x, 0)) @ expand_dims(g, 0)`` over ranges of
    constant bounds, becomes ``transpose(reshape(X)) @ reshape(G)``: X and G read x's and g's
    sources over the same ranges (each point's vector a row, the points in the same order),
    so the sum of the points' products is one product of the stacked rows (the same terms,
    summed in another order). New nodes are appended (``_drop_dead`` renumbers)."""
    changed = False
    for k in range(len(nodes)):
        s = nodes[k]
        found = _outer_sum(nodes, s)
        if found is None:
            continue
        ex, eg, ranged, rows = found
        m = nodes[s.inputs[0].src]
        (kx,), (ng,) = nodes[ex.src].types[ex.out].shape, nodes[eg.src].types[eg.out].shape
        dt = m.type.dtype
        x_rows = _stacked(ex, m, s.inputs[0], ranged)
        g_rows = _stacked(eg, m, s.inputs[0], ranged)
        xs = _append(nodes, s, "reshape", [x_rows], TensorType(dt, (rows, kx)), shape=(rows, kx))
        gs = _append(nodes, s, "reshape", [g_rows], TensorType(dt, (rows, ng)), shape=(rows, ng))
        xt = _append(nodes, s, "transpose", [xs], TensorType(dt, (kx, rows)), perm=(1, 0))
        nodes[k] = replace(s, op="matmul", inputs=(xt, gs), attrs=())
        changed = True
    return changed


def _append(nodes: list[Node], at: Node, op: str, inputs: list, t: TensorType, **attrs) -> Edge:
    """A new node over ``at``'s domain (appended to ``nodes``), and the edge reading it at
    ``at``'s point."""
    n = Node(len(nodes), op, at.domain, tuple(inputs), (t,), make_attrs(**attrs), span=at.span)
    nodes.append(n)
    return Edge(n.id, identity_access(at.dims), span=at.span)


def _outer_sum(nodes: list[Node], s: Node):
    """``(x's edge, g's edge, the ranged dims of the product, the points)`` where ``s`` is a
    sum of per-point outer products ``_contract`` rewrites, else None."""
    if s.op != "sum" or len(s.inputs) != 1 or len(s.types) != 1 or s.attr("keepdims"):
        return None
    e = s.inputs[0]
    m = nodes[e.src]
    if e.cond is not None or e.out != 0 or m.op != "matmul" or len(m.types) != 1:
        return None
    ranges = [(d, a) for d, a in zip(m.dims, e.access) if isinstance(a, Range)]
    if not ranges or any(
        not (sympy.sympify(a.lo).is_Integer and sympy.sympify(a.hi).is_Integer) for _, a in ranges
    ):
        return None
    axes = s.attr("axes")
    if axes is None or tuple(sorted(a % (len(ranges) + 2) for a in axes)) != tuple(
        range(len(ranges))
    ):
        return None
    if len(m.type.shape) != 2 or s.type.shape != m.type.shape:
        return None
    ranged = [d for d, _ in ranges]
    x = _vector_of(nodes, m, m.inputs[0], transposed=True)
    g = _vector_of(nodes, m, m.inputs[1], transposed=False)
    if x is None or g is None:
        return None
    for edge in (x, g):
        # each ranged dim read at itself, in the sum's order, and nowhere else
        if any(isinstance(a, Range) for a in edge.access):
            return None
        exprs = [sympy.sympify(a.expr) for a in edge.access]
        if [str(v) for v in exprs if v.is_Symbol and str(v) in ranged] != ranged:
            return None
        for v in exprs:
            if not (v.is_Symbol and str(v) in ranged) and {str(f) for f in v.free_symbols} & set(
                ranged
            ):
                return None
    rows = 1
    for _, a in ranges:
        rows *= int(a.hi - a.lo)
    return x, g, {d: a for d, a in ranges}, rows


def _vector_of(nodes: list[Node], m: Node, e: Edge, transposed: bool) -> Edge | None:
    """The edge of the vector ``v`` where ``e`` (an input of ``m``, read at ``m``'s point)
    is ``transpose(expand_dims(v, 0))`` (``transposed``) or ``expand_dims(v, 0)``."""
    if not e.is_identity_of(m.dims) or e.out != 0:
        return None
    n = nodes[e.src]
    if transposed:
        if n.op != "transpose" or tuple(n.attr("perm")) != (1, 0) or n.dims != m.dims:
            return None
        e = n.inputs[0]
        if not e.is_identity_of(m.dims) or e.out != 0:
            return None
        n = nodes[e.src]
    if n.op != "expand_dims" or n.attr("axis") != 0 or n.dims != m.dims:
        return None
    v = n.inputs[0]
    if v.cond is not None or len(nodes[v.src].types[v.out].shape) != 1:
        return None
    return v


def _stacked(v: Edge, m: Node, read: Edge, ranged: dict) -> Edge:
    """``v`` (an edge over ``m``'s dims) read where ``read`` reads ``m``: its ranged dims over
    their ranges (the leading axes, in ``m``'s order), the others at ``read``'s points."""
    at = {d: a.expr for d, a in zip(m.dims, read.access) if isinstance(a, Point)}
    exprs = [sympy.sympify(a.expr) for a in v.access]
    access = tuple(
        ranged[str(e)]
        if e.is_Symbol and str(e) in ranged
        else Point(sympy.expand(ix.substitute(e, at)))
        for e in exprs
    )
    return Edge(v.src, access, v.out, None, read.span)


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


def _before_readers(nodes: list[Node], moved) -> list[Node]:
    """``nodes`` with each of ``moved`` (nodes appended by a rewrite) placed right before
    the first node that reads it (at the end if none does), the others in their order: the
    numbering ``_drop_dead`` gives then keeps every other node where it was, and the
    schedule's ties, broken by number, fall as they did without the rewrite."""
    moved = set(moved)
    if not moved:
        return nodes
    at: dict[int, list[Node]] = {}
    placed: set[int] = set()
    for n in nodes:
        if n.id in moved:
            continue
        for e in n.inputs:
            if e.src in moved and e.src not in placed:
                placed.add(e.src)
                at.setdefault(n.id, []).append(nodes[e.src])
    out: list[Node] = []
    for n in nodes:
        if n.id in moved:
            continue
        out.extend(at.get(n.id, ()))
        out.append(n)
    out.extend(nodes[k] for k in sorted(moved - placed))
    return out


def _drop_dead(graph: Graph, nodes: list[Node], roots: set[int]) -> Graph:
    by_id = {n.id: n for n in nodes}
    live: set[int] = set()
    todo = list(roots)
    while todo:
        k = todo.pop()
        if k in live:
            continue
        live.add(k)
        todo.extend(e.src for e in by_id[k].inputs)
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
