"""The plan: what the runtime needs to run a scheduled PDG, as plan items.

In: an optimized PDG and its ``Schedule``. Out: a ``Plan`` (``plan.items``; its JSON is
``docs/plan.md``): sizes, environments, one buffer per statement with its storage
(``plan.memory``: a block over the bounding box of its domain, or a ring buffer along the
iteration loop; the buffer whose memory it takes, if any), each statement's nodes (the
inlined ones, then its own) with their reads, and the loop tree with the frees of the
memory plan (and, under a device memory budget, its swaps to host memory and back). Index
expressions and conditions are structured expressions (``plan.expr``) over dim names.
"""

from __future__ import annotations

import collections
import math
from dataclasses import replace

import sympy

from timerlc.diagnostics import ProgramError
from timerlc.ir import index as ix
from timerlc.ir.pdg import Graph, Point
from timerlc.plan.items import (
    MAX_ELEMENTS,
    MAX_EXTENT,
    MAX_RANK,
    At,
    Buffer,
    Env,
    Call,
    Free,
    Home,
    If,
    Loop,
    Node,
    Output,
    Plan,
    Read,
    Slice,
    Statement,
    SwapIn,
    SwapOut,
    Window,
)
from timerlc.plan.memory import plan_memory
from timerlc.poly import isl as pisl
from timerlc.schedule.build import Schedule


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

    return ix.cond_to_plan(simplify(cond))


def _idle_merges(graph: Graph, homes: dict) -> set[int]:
    """The merges every input of which lives in the merge's own memory (``memory._homes``:
    ``net[0]``, the initial value, and ``net[j + 1]``, the update, both where the merge keeps
    ``net[j]``): at every point the value is there already, and a call would do nothing."""
    inside: dict[int, set[int]] = {}
    for x, (m, _) in homes.items():
        inside.setdefault(m, set()).add(x)
    return {m for m, xs in inside.items() if {e.src for e in graph.node(m).inputs} <= xs}


def _without_calls(item, idle: set[int]):
    """``item`` without the calls of the statements ``idle`` (None where nothing is left)."""
    if isinstance(item, Call):
        return None if item.statement in idle else item
    if isinstance(item, Loop):
        body = tuple(x for x in (_without_calls(x, idle) for x in item.body) if x is not None)
        return replace(item, body=body) if body else None
    if isinstance(item, If):
        then = tuple(x for x in (_without_calls(x, idle) for x in item.then) if x is not None)
        orelse = tuple(x for x in (_without_calls(x, idle) for x in item.orelse) if x is not None)
        return replace(item, then=then, orelse=orelse) if then or orelse else None
    return item


def _outputs(types) -> tuple[Output, ...]:
    return tuple(Output(t.dtype, tuple(int(s) for s in t.shape)) for t in types)


def build_plan(
    graph: Graph, schedule: Schedule, source: str = "", memory_budget: int | None = None
) -> Plan:
    """``memory_budget``: the bytes of device memory the buffers may hold at once (None: no
    limit); the memory plan swaps blocks to host memory to stay within it."""
    bounds = graph.dim_bounds
    # the tensor each node computes part of, for messages: its own, else the nearest tensor
    # that reads it through unnamed nodes (``v = merge(%4)``, an env call under ``o``; a
    # tensor further down the graph, which reads it through other tensors' unnamed nodes,
    # does not), the earliest declared on a tie; the program's own tensors before hidden
    # ones (an optimizer's state, ``net@adam.m``)
    tensor_names: dict[int, str] = {}
    for hidden in (False, True):
        todo = collections.deque(
            (t.node, t.name) for t in graph.tensors if ("@" in t.name) == hidden
        )
        while todo:
            k, name = todo.popleft()
            if k in tensor_names:
                continue
            tensor_names[k] = name
            todo.extend((e.src, name) for e in graph.node(k).inputs if not graph.node(e.src).name)
    blocks = {}
    for nid in schedule.statements:
        node = graph.node(nid)
        box = pisl.extents(node.dims, node.domain.cond) if node.dims else ()
        blocks[nid] = Buffer(
            nid, node.name, node.dims, tuple(int(x) for x in box), _outputs(node.types)
        )
    tensors = {t.name: (t.node, t.out) for t in graph.tensors}
    kept = {tensors[name][0] for name in graph.outputs + graph.metrics}
    memory = plan_memory(graph, schedule, blocks, kept, memory_budget)
    buffers = []
    for nid, b in blocks.items():
        window, inner = memory.windows.get(nid), memory.inner.get(nid)
        buffers.append(
            Buffer(
                b.id,
                b.name,
                b.dims,
                b.box,
                b.outputs,
                None if window is None else Window(*window),
                memory.donors.get(nid),
                None if inner is None else Window(*inner),
                memory.inner_outputs.get(nid),
                None if nid not in memory.homes else Home(*memory.homes[nid]),
            )
        )
    tree = []
    floor_item = None  # the plan's index of memory.floor_item
    idle = _idle_merges(graph, memory.homes)
    for k, item in enumerate(schedule.tree):
        item = _without_calls(item, idle) if idle else item
        if k in memory.swap_ins:
            tree.append(SwapIn(tuple(memory.swap_ins[k])))
        if k == memory.floor_item and item is not None:
            floor_item = len(tree)
        if item is not None:
            tree.append(item)
        if k in memory.frees:
            tree.append(Free(tuple(memory.frees[k])))
        if k in memory.swap_outs:
            tree.append(SwapOut(tuple(memory.swap_outs[k])))
    statements = []
    for nid, st in schedule.statements.items():
        node = graph.node(nid)
        nodes = tuple(_node(graph.node(k), node, schedule, tensor_names) for k in st.body)
        statements.append(
            Statement(
                nid,
                node.dims,
                tuple(st.loops),
                tuple(st.vector),
                ix.cond_to_plan(node.domain.cond),
                nodes,
            )
        )
    configs = tuple((k, _config(v)) for k, v in graph.configs)
    return Plan(
        source=source,
        dims=tuple((d.name, int(bounds[d.name])) for d in graph.dims),
        configs=configs,
        seed=int(dict(graph.configs).get("seed", 0)),
        envs=tuple(Env(e.name, e.spec, e.batch, int(bounds[e.batch])) for e in graph.envs),
        buffers=tuple(buffers),
        statements=tuple(statements),
        tree=tuple(tree),
        outputs=tuple((name, *tensors[name]) for name in graph.outputs),
        metrics=tuple((name, *tensors[name]) for name in graph.metrics),
        memory_budget=memory.budget,
        memory_budget_met=memory.budget_met,
        memory_peak=memory.peak,
        memory_peak_unswapped=memory.unswapped_peak,
        memory_floor_item=floor_item,
        memory_floor=memory.floor_buffers,
    )


def check_limits(graph: Graph, plan: Plan) -> None:
    """The sizes of ``plan`` within what a plan may hold (``plan.items``: an axis, a bound,
    an array's elements), else a ``ProgramError`` at the tensor: the runtime would refuse
    the plan (and no machine could hold it)."""
    for name, bound in plan.dims:
        if bound > MAX_EXTENT:
            raise ProgramError(
                f"dim {name} has {bound} points; timerlc's limit is {MAX_EXTENT} (2^31)", None
            )
    limits = (
        f"timerlc's limits are {MAX_EXTENT} (2^31) per axis, {MAX_ELEMENTS} (2^40) elements "
        f"and {MAX_RANK} axes per array"
    )
    for b in plan.buffers:
        for o in b.outputs:
            what = _past_limits(b.box + o.shape)
            if what is not None:
                name = f"{b.name!r}" if b.name else "this value"
                raise ProgramError(
                    f"{name} has {what} over its dims and shape; {limits}",
                    graph.node(b.id).span,
                )
    # a value computed where it is read, no buffer of its own (``zeros([A])``: an array of
    # one value), at each point of its statement
    for st in plan.statements:
        for n in st.nodes:
            for o in n.types:
                what = _past_limits(o.shape)
                if what is not None:
                    raise ProgramError(f"this value has {what}; {limits}", graph.node(n.id).span)


def _past_limits(axes: tuple[int, ...]) -> str | None:
    """What of an array of extents ``axes`` is past a plan's limits (an axis, its elements,
    its number of axes), or None."""
    big = [n for n in axes if n > MAX_EXTENT]
    if big:
        return f"an axis of {big[0]}"
    if math.prod(axes) > MAX_ELEMENTS:
        return f"{math.prod(axes)} elements"
    if len(axes) > MAX_RANK:
        return f"{len(axes)} axes"
    return None


def _config(v):
    if isinstance(v, sympy.Basic):
        return int(v) if v.is_Integer else float(v)
    return v


def _node(n, owner, schedule: Schedule, names: dict[int, str]) -> Node:
    return Node(
        n.id,
        n.op,
        tuple((a, ix.plan_value(v)) for a, v in n.attrs),
        _outputs(n.types),
        tuple(
            Read(
                e.src,
                e.out,
                e.src in schedule.statements,
                tuple(
                    At(ix.to_plan(a.expr))
                    if isinstance(a, Point)
                    else Slice(ix.to_plan(a.lo), ix.to_plan(a.hi))
                    for a in e.access
                )
                # an array of one value, computed in the statement (``schedule.build``,
                # ``_filled``): the same at each of its points
                or _here(e, owner, schedule),
                None if e.cond is None else _branch_cond(n, e.cond),
            )
            for e in n.inputs
        ),
        _where(names, n, owner),
    )


def _here(e, owner, schedule: Schedule) -> tuple:
    """The access of an inlined node of no dims read in a statement over some: the
    statement's point (a plan's inlined node is computed at the statement's points)."""
    if e.src in schedule.statements:
        return ()
    return tuple(At(d) for d in owner.dims)


def _where(names: dict[int, str], n, owner) -> tuple[str, int | None]:
    """For run-time error messages: the tensor a node computes (or the statement's tensor it
    is inlined into) and its source line (or None). ``names``: node id -> the tensor it holds
    (a pass that removes a copy points the tensor at the copied node, which has no name)."""
    name = n.name or names.get(n.id) or owner.name or names.get(owner.id) or f"%{n.id}"
    return name, n.span.line if n.span is not None else None
