"""Narrowing: a tensor is computed only at the points something reads.

In: a PDG after ``simplify``. Out: the same PDG where the domain of a node that nothing
reads at some of its points leaves those points out. PPO's diagnostics are the case:
``approx_kl[j]`` (a mean over the minibatch) is read only by ``last_kl[i] =
approx_kl[i * K + K - 1]``, one minibatch step in 16, and the value loss's, policy loss's
and entropy's means likewise, but each was computed at every step (a reduction over the
65,536 samples of a minibatch at 2048 environments, a launch each on a GPU).

The points a node's readers read (``_read``): for every edge that reads it, the image of the
reader's domain (within the edge's condition) under the edge's access, by isl. The node's
new domain (``_narrowed``) is its domain with the read points' strides along each dim
(``j`` is 15 modulo 16) and their least and greatest values added to its condition: an
over-approximation of the read points (it must hold them all: checked), kept where it
leaves points out (checked). Bounds alone narrow too (since 2026-11-28; they were thought
to split fused kernels for little): the last minibatch step's gradient, which no parameter
reads, was the zeros of the gradients' merges (``grad[j] = 0`` at ``j = K * I``), a step
of each of the minibatch step's kernels launched at every step to do nothing (PPO at 2048
x 128 on the cuda backend: 758.3 -> 653.3 launches an iteration, with the bypass below;
REINFORCE at 2048 x 128 27.1 -> 26.1: ``scripts/cuda_overheads.py --launches``).
Outputs, metrics and environment calls keep their domains.
A merge's branch that holds at none of the points left is dropped (``step[i] = step[i-1] +
1`` where only ``i = 0`` is left), and so is what only such branches read; a merge left one
branch that holds at all its points passes it on, and ``simplify``, run again on the
narrowed graph, bypasses it.

Readers first: a node narrowed reads less of its inputs, so the pass runs until nothing
changes. It starts from the full domains and only removes points that no reader, as it is
now, reads: a point that a recurrence needs is read by the recurrence's next point, which is
kept, so it is kept (a cycle of points that only read each other is kept too: the pass is
conservative there). The values at the points kept are those of before; a run-time failure
at a point left out is not reported (as in dead code, ``simplify``).
"""

from __future__ import annotations

from dataclasses import replace

import islpy as isl
import sympy

from timerlc import ops
from timerlc.ir import index as ix
from timerlc.ir.pdg import Domain, Graph
from timerlc.passes.simplify import _drop_dead, simplify
from timerlc.poly import isl as pisl

MAX_ROUNDS = 16  # passes over the graph (each narrows what the last one's narrowing allows)


def narrow(graph: Graph) -> Graph:
    keep = {graph.tensor(name).node for name in (*graph.outputs, *graph.metrics)}
    keep |= {n.id for n in graph.nodes if ops.is_env(n.op)}
    readers: dict[int, list] = {}
    for n in graph.nodes:
        for e in n.inputs:
            readers.setdefault(e.src, []).append((n.id, e))
    domains = {n.id: n.domain for n in graph.nodes}
    # (a node whose readers' domains are those it was last looked at with is left alone: it
    # would come out as it is, ``_narrowed`` of a narrowed domain being None; each round
    # looks at the others, as a round over every node would, in the same order)
    may = {n.id for n in graph.nodes if n.id not in keep and n.dims and n.id in readers}
    memo: dict = {}  # (dims, condition, the points read as isl's text) -> _narrowed's
    dirty = set(may)
    for _ in range(MAX_ROUNDS):
        if not dirty:
            break
        for n in reversed(graph.nodes):
            if n.id not in dirty:
                continue
            dirty.discard(n.id)
            read = _read(n, readers[n.id], domains)
            if read is None:
                continue
            # (PPO's 451 narrowings are of 5 domains and points read: each worked out once)
            key = (n.dims, domains[n.id].cond, str(read))
            if key not in memo:
                memo[key] = _narrowed(n.dims, domains[n.id].cond, read)
            cond = memo[key]
            if cond is not None:
                domains[n.id] = Domain(n.dims, cond)
                dirty |= {e.src for e in n.inputs if e.src in may}
    if all(domains[n.id] is n.domain for n in graph.nodes):
        return graph
    nodes = []
    for n in graph.nodes:
        d = domains[n.id]
        if d is n.domain:
            nodes.append(n)
            continue
        inputs = n.inputs
        if n.op == "merge":  # (a branch that holds at none of its points now: dropped)
            live = tuple(e for e in inputs if e.cond is None or _meets(d, e.cond))
            inputs = live or inputs
        nodes.append(replace(n, domain=d, inputs=inputs))
    # (a merge left one branch that holds at all its points passes it on: ``simplify``
    # bypasses it, the last update's gradient read where its product is)
    return simplify(_drop_dead(graph, nodes, keep))


def _meets(d: Domain, cond) -> bool:
    return not pisl.cond_set(d.dims, d.cond & cond).is_empty()


def _read(n, edges, domains) -> isl.Set | None:
    """The points of ``n`` that ``edges`` (reader, edge) read, over ``[s_0, ...]``."""
    read = None
    for rid, e in edges:
        d = domains[rid]
        if e.cond is not None:
            d = Domain(d.dims, d.cond & e.cond)
        image = pisl.access_map(d, e.access, len(n.dims)).range()
        read = image if read is None else read.union(image)
    return None if read is None else read.coalesce()


def _narrowed(dims: tuple[str, ...], cond, read: isl.Set):
    """``cond`` (a domain's condition over ``dims``) and the strides and bounds of ``read``
    (the points read, over ``[s_0, ...]``) along each dim, where that holds every point read
    and leaves some of the domain's out; else None."""
    if read.is_empty():
        return None
    whole = pisl.producer_side(pisl.cond_set(dims, cond), len(dims))
    if whole.is_subset(read):
        return None  # (every point is read)
    # each dim's least and greatest value read and its stride (None: none), as isl's text
    # first: where they leave no point out, no formula is built and simplified
    hull, found = [], []
    for k in range(len(dims)):
        lo, hi = _constant(read.dim_min(k)), _constant(read.dim_max(k))
        info = read.get_stride_info(k)
        stride, offset = info.get_stride().to_python(), info.get_offset()
        c = offset.get_constant_val().to_python() if stride > 1 and offset.is_cst() else None
        found.append((lo, hi, stride, c))
        hull += [f"s_{k} >= {lo}"] if lo is not None else []
        hull += [f"s_{k} <= {hi}"] if hi is not None else []
        hull += [f"(s_{k} - ({c})) mod {stride} = 0"] if c is not None else []
    names = ", ".join(f"s_{k}" for k in range(len(dims)))
    if whole.is_subset(isl.Set(f"{{ [{names}] : {' and '.join(hull) or 'true'} }}")):
        return None
    terms = []
    for d, (lo, hi, stride, c) in zip(dims, found):
        x = ix.sym(d)
        terms += [x >= lo] if lo is not None else []
        terms += [x <= hi] if hi is not None else []
        terms += [sympy.Eq(ix.mod(x - c, stride), 0)] if c is not None else []
    new = _as_box(dims, pisl.simplify(dims, ix.conj(cond, *terms)))
    narrowed = pisl.producer_side(pisl.cond_set(dims, new), len(dims))
    if not read.is_subset(narrowed) or whole.is_subset(narrowed):
        return None
    return new


def _as_box(dims: tuple[str, ...], cond):
    """``cond`` as bounds on each dim where its points are exactly a box (``i <= 2 and
    ((i - 1 >= 0 and i - 1 < 3) or i == 0)`` is ``0 <= i <= 2``: the kernels lower a box's
    statement without a guard, a product into its buffer in place); else ``cond``."""
    points = pisl.cond_set(dims, cond)
    if points.is_empty():
        return cond
    bounds = []
    for k, d in enumerate(dims):
        lo, hi = _constant(points.dim_min(k)), _constant(points.dim_max(k))
        if lo is None or hi is None:
            return cond
        x = ix.sym(d)
        bounds += [x >= lo, x <= hi]
    box = ix.conj(*bounds)
    return box if pisl.cond_set(dims, box).is_equal(points) else cond


def _constant(pa: isl.PwAff) -> int | None:
    """The value of a piecewise affine function that is one constant, else None."""
    pieces = pa.get_pieces()
    if len(pieces) != 1 or not pieces[0][1].is_cst():
        return None
    return pieces[0][1].get_constant_val().to_python()
