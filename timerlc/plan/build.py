"""The plan: what the runtime needs to run a scheduled PDG, as versioned JSON.

In: an optimized PDG and its ``Schedule``. Out: a JSON-ready dict (see ``docs/plan.md``):
sizes, environments, one buffer per statement with its storage (``plan.memory``: a block over
the bounding box of its domain, or a ring buffer along the iteration loop; the buffer whose
memory it takes, if any), each statement's nodes (the inlined ones, then its own) with their
reads, and the loop tree with the frees of the memory plan (and, under a device memory
budget, its swaps to host memory and back). Index expressions and conditions
are NumPy-vectorized Python expressions over dim names (``t + 1``, ``j // 16``,
``_np.minimum(t + 3, 15)``), which the runtime validates and compiles; attributes that hold
index expressions keep them as ``{"sympy": srepr}``.
"""

from __future__ import annotations

import math

import sympy

from timerlc.ir import index as ix
from timerlc.ir.pdg import Graph, Point
from timerlc.plan.memory import plan_memory
from timerlc.poly import isl as pisl
from timerlc.schedule.build import Schedule

FORMAT_VERSION = 2


def _py(e) -> str:
    return ix._PY.expr(sympy.sympify(e))


def _cond(c) -> str:
    return ix._PY.cond(c)


def _branch_cond(node, cond):
    """A merge branch's condition without what the merge's domain already says (the
    runtime evaluates it there only): ``not (t == 0 and 0 <= b < 16)`` over a domain with
    ``0 <= b < 16`` is ``not t == 0``, which names the loop dims only, so the runtime can
    work out the branches once per value of ``t`` and not once per batch."""
    dims, domain = node.dims, pisl.cond_set(node.dims, node.domain.cond)

    def simplify(c):
        if isinstance(c, sympy.logic.boolalg.BooleanAtom):
            return c
        a = pisl.cond_set(dims, c)
        if domain.is_subset(a):
            return sympy.true
        if domain.intersect(a).is_empty():
            return sympy.false
        if isinstance(c, (sympy.And, sympy.Or, sympy.Not)):
            return c.func(*[simplify(x) for x in c.args])
        return c

    return _cond(simplify(cond))


def _attr(v):
    if isinstance(v, sympy.Basic) and not isinstance(v, (sympy.logic.boolalg.BooleanAtom,)):
        if isinstance(v, sympy.Expr) and v.is_Integer:
            return int(v)
        if isinstance(v, sympy.Expr) and v.is_Number:
            return float(v)
        return {"sympy": sympy.srepr(v)}
    if isinstance(v, (tuple, list)):
        return [_attr(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}
    if isinstance(v, dict):
        return {"dict": [[_attr(k), _attr(x)] for k, x in v.items()]}
    return v


def build_plan(
    graph: Graph, schedule: Schedule, source: str = "", memory_budget: int | None = None
) -> dict:
    """``memory_budget``: the bytes of device memory the buffers may hold at once (None: no
    limit); the memory plan swaps blocks to host memory to stay within it."""
    bounds = graph.dim_bounds
    # the tensor each node computes part of, for messages: its own, else the first tensor
    # that reads it through unnamed nodes (``v = merge(%4)``, an env call under ``o``)
    tensor_names: dict[int, str] = {}
    for t in graph.tensors:
        todo = [t.node]
        while todo:
            k = todo.pop()
            if k in tensor_names:
                continue
            tensor_names[k] = t.name
            todo.extend(e.src for e in graph.node(k).inputs if not graph.node(e.src).name)
    buffers = {}
    statements = {}
    for nid in schedule.statements:
        node = graph.node(nid)
        box = pisl.extents(node.dims, node.domain.cond) if node.dims else ()
        buffers[nid] = {
            "name": node.name,
            "dims": list(node.dims),
            "box": list(box),
            "extents": list(box),
            "storage": {"kind": "block"},
            "outputs": [{"dtype": t.dtype, "shape": list(t.shape)} for t in node.types],
        }
    tensors = {t.name: [t.node, t.out] for t in graph.tensors}
    kept = {tensors[name][0] for name in graph.outputs + graph.metrics}
    memory = plan_memory(graph, schedule, buffers, kept, memory_budget)
    for nid, (dim, size) in memory.windows.items():
        buf = buffers[nid]
        buf["storage"] = {"kind": "window", "dim": dim, "size": size}
        buf["extents"][buf["dims"].index(dim)] = size
    for nid, donor in memory.donors.items():
        buffers[nid]["donor"] = donor
    tree = []
    for k, item in enumerate(schedule.tree):
        if k in memory.swap_ins:
            tree.append({"swap_in": memory.swap_ins[k]})
        tree.append(item)
        if k in memory.frees:
            tree.append({"free": memory.frees[k]})
        if k in memory.swap_outs:
            tree.append({"swap_out": memory.swap_outs[k]})
    for nid, st in schedule.statements.items():
        node = graph.node(nid)
        nodes = []
        for k in st.body:
            n = graph.node(k)
            nodes.append(
                {
                    "id": k,
                    "op": n.op,
                    "dims": list(n.dims),
                    "attrs": {a: _attr(v) for a, v in n.attrs},
                    "types": [{"dtype": t.dtype, "shape": list(t.shape)} for t in n.types],
                    "inputs": [
                        {
                            "src": e.src,
                            "out": e.out,
                            "stored": e.src in schedule.statements,
                            "access": [
                                ["pt", _py(a.expr)]
                                if isinstance(a, Point)
                                else ["rg", _py(a.lo), _py(a.hi)]
                                for a in e.access
                            ],
                            "cond": None if e.cond is None else _branch_cond(n, e.cond),
                        }
                        for e in n.inputs
                    ],
                    "where": _where(tensor_names, n, node),
                }
            )
        statements[str(nid)] = {
            "dims": list(node.dims),
            "loops": list(st.loops),
            "vector": list(st.vector),
            "domain": _cond(node.domain.cond),
            "nodes": nodes,
        }
    return {
        "format_version": FORMAT_VERSION,
        "source": source,
        "dims": {d: int(b) for d, b in bounds.items()},
        "dim_order": [d.name for d in graph.dims],
        "configs": {k: _attr(v) for k, v in graph.configs},
        "seed": int(dict(graph.configs).get("seed", 0)),
        "envs": [
            {"name": e.name, "spec": e.spec, "batch": e.batch, "num_envs": int(bounds[e.batch])}
            for e in graph.envs
        ],
        "buffers": {str(nid): buf for nid, buf in buffers.items()},
        "statements": statements,
        "order": list(schedule.order),
        "tree": tree,
        "outputs": {name: tensors[name] for name in graph.outputs},
        "metrics": {name: tensors[name] for name in graph.metrics},
        "memory_budget": memory.budget,
        "memory_budget_met": memory.budget_met,
        "memory_peak": memory.peak,
        "memory_peak_unswapped": memory.unswapped_peak,
    }


def _where(names: dict[int, str], n, owner) -> list:
    """For run-time error messages: the tensor a node computes (or the statement's tensor it
    is inlined into) and its source line (or None). ``names``: node id -> the tensor it holds
    (a pass that removes a copy points the tensor at the copied node, which has no name)."""
    name = n.name or names.get(n.id) or owner.name or names.get(owner.id) or f"%{n.id}"
    return [name, n.span.line if n.span is not None else None]
