"""The device arena: one block of device memory for every buffer of a plan, each at an
offset fixed before the run.

The memory plan (``plan.memory``) says when each buffer lives: from the first top-level item
of the loop tree that uses it (a call of a statement that writes or reads it) to the
``Free`` after its last use (or to the end, for outputs and metrics), and which buffer takes
over a dying one's memory (a donation: they share one *storage*, whose life is both of
theirs). A buffer whose values never outlive an iteration of a top-level loop
(``iteration_local``) lives only from its first use to its last within an iteration (the
loop's calls numbered in the order an iteration makes them). Storages whose lives do not
meet may share bytes. ``layout`` places them greedily,
the largest first, each at the lowest offset (aligned to ``ALIGN`` bytes) where it meets no
storage already placed that lives at the same time; the arena is as large as the highest
end. A buffer's outputs lie one after another in its storage, each aligned.

The runtime allocates the arena once and carves each buffer out of it at its offset
(``runtime/cuda.py``), instead of asking an allocator per buffer: no allocation during the
run, and the addresses of the buffers are known before it. A plan with swaps (a memory
budget) or with a free or a swap inside a loop has no layout (its buffers come from the
device's allocator).

This module is data-side (the runtime's): it reads a plan and imports only the plan's
items.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from timerlc.plan import expr as px
from timerlc.plan.items import (
    DTYPES,
    At,
    Call,
    Free,
    If,
    Loop,
    Plan,
    SwapIn,
    SwapOut,
    walk,
)

ALIGN = 256  # bytes: cudaMalloc's alignment, so that every output is aligned as its own


@dataclass(frozen=True)
class Layout:
    """``size`` bytes in all; per buffer, the offset of each of its outputs."""

    size: int
    offsets: dict[int, tuple[int, ...]]
    peak: int  # the most bytes the buffers hold at once (the size's lower bound)
    # the buffers whose values live within an iteration of a loop (``iteration_local``):
    # their bytes are another's in between, and no zeroing is needed
    local: frozenset = frozenset()


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def first_fit(regions, align: int) -> list[int]:
    """Offsets for ``regions`` (``(bytes, start, stop)``: in use from ``start`` up to, not
    including, ``stop``; or ``(bytes, spans)``, in use in each ``(start, stop)`` of
    ``spans``), placed in the order given, each at the lowest ``align``-aligned offset
    where it meets no region placed before it that is in use at the same time (the arena's
    buffers; a cuda kernel's temporaries, ``codegen.lower._packed_temps``)."""
    placed: list[tuple[int, int, tuple]] = []  # (offset, bytes, spans)
    out = []
    for region in regions:
        n, spans = (region[0], ((region[1], region[2]),)) if len(region) == 3 else region

        at = 0
        for lo, hi in sorted(
            (o, o + m) for o, m, other in placed if m > 0 and _meet(spans, other)
        ):
            if at + n <= lo:
                break
            at = max(at, (hi + align - 1) // align * align)
        placed.append((at, n, spans))
        out.append(at)
    return out


def _meet(spans: tuple, other: tuple) -> bool:
    """Whether two sets of ``(start, stop)`` spans share a position."""
    return any(s < stop and start < t for start, stop in spans for s, t in other)


def output_bytes(plan: Plan, sid: int) -> list[int]:
    buf = plan.buffer(sid)
    return [buf.output_bytes(k) for k in range(len(buf.outputs))]


def layout(plan: Plan) -> Layout | None:
    """Where each buffer of ``plan`` lies in the arena, or None where the plan has swaps or
    a free inside a loop."""
    top = list(plan.tree)
    nested = [it for it in walk(top) if isinstance(it, (Free, SwapOut, SwapIn))]
    if any(isinstance(it, (SwapOut, SwapIn)) for it in nested):
        return None
    if len(nested) != sum(1 for it in top if isinstance(it, Free)):
        return None
    # positions: one per top-level item, but a top-level loop has one per call in its body
    # (in the order an iteration makes them)
    start: list[int] = []
    at_call: dict[int, tuple[int, int, int]] = {}  # id(call) -> (position, span's start, stop)
    pos = 0
    for it in top:
        start.append(pos)
        if isinstance(it, Loop):
            pos = _positions(it.body, pos, at_call)
            pos = max(pos, start[-1] + 1)
        else:
            pos += 1
    _fused_spans(plan, top, at_call)
    end = pos + 1  # (outputs are read after the last item)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for j, it in enumerate(top):
        if isinstance(it, Free):
            for sid in it.buffers:
                last.setdefault(sid, start[j])
            continue
        for call in walk([it]):
            if not isinstance(call, Call):
                continue
            sid = call.statement
            used = {sid} | {r.src for n in plan.statement(sid).nodes for r in n.inputs if r.stored}
            for s in used:
                first.setdefault(s, start[j])
    local = iteration_local(plan)
    # the storages: a donee shares its donor's
    owner = {b.id: b.id for b in plan.buffers}

    def root(s: int) -> int:
        while owner[s] != s:
            owner[s] = owner[owner[s]]
            s = owner[s]
        return s

    for b in plan.buffers:
        if b.donor is not None and b.donor in owner:
            owner[root(b.id)] = root(b.donor)
        if b.home is not None and b.home.buffer in owner:  # (its values in its home's)
            owner[root(b.id)] = root(b.home.buffer)
    lives: dict[int, list[int]] = {}
    sizes: dict[int, int] = {}
    offsets_in: dict[int, tuple[int, ...]] = {}
    for b in plan.buffers:
        sid = b.id
        outs, at = [], 0
        for n in output_bytes(plan, sid):
            outs.append(at)
            at += _aligned(max(n, 1))
        offsets_in[sid] = tuple(outs)
        r = root(sid)
        if sid in local:  # (from its first use to its last in an iteration of the loop,
            # along each way through its ifs)
            ids = {id(c) for c in local[sid]}
            loop = next(it for it in top if isinstance(it, Loop) and _uses(it, ids))
            own = {id(c) for c in local[sid] if c.statement == sid}
            ways = _path_lives(loop.body, ids, own, at_call)
            life = [(f, t) for f, t, wrote in ways if wrote]
        else:
            life = [(first.get(sid, pos), last.get(sid, end))]
        lives[r] = _merged(lives.get(r, []) + life)
        sizes[r] = max(sizes.get(r, 0), at)
    order = sorted(lives, key=lambda r: (-sizes[r], lives[r][0][0], r))
    at = first_fit([(sizes[r], tuple(lives[r])) for r in order], ALIGN)
    where = dict(zip(order, at))
    size = max((where[r] + sizes[r] for r in order), default=0)
    # the peak: the most bytes live at one position
    peak = 0
    for j in range(end + 1):
        peak = max(
            peak,
            sum(sizes[r] for r in order if any(s <= j < t for s, t in lives[r])),
        )
    offsets = {b.id: tuple(where[root(b.id)] + o for o in offsets_in[b.id]) for b in plan.buffers}
    return Layout(size, offsets, peak, frozenset(local))


def _uses(item, ids: set) -> bool:
    return any(isinstance(c, Call) and id(c) in ids for c in walk([item]))


def _path_lives(items, ids: set, own: set, at_call: dict) -> set[tuple]:
    """``(first, stop, written)`` of the uses of the calls ``ids`` along each way an
    iteration may take through ``items`` (an ``if``: either branch), from the spans in
    ``at_call``, and whether a call of ``own`` (the buffer's writer) is among them;
    ``(None, None, False)`` for a way without one. A buffer that both branches use (a
    weight's gradient, zeros at the last step) lives in each from its uses there only; on a
    way that does not write it (an iteration-local buffer: the iteration writes it before
    it reads it), its reads are not made (each lies in a branch of a merge that does not
    apply there) and it does not live."""
    paths: set[tuple] = {(None, None, False)}

    def met(path: tuple, lo, hi, wrote: bool) -> tuple:
        f, t, w = path
        if lo is None:
            return path
        return (lo if f is None else min(f, lo), hi if t is None else max(t, hi), w or wrote)

    for it in items:
        if isinstance(it, If):
            branches = _path_lives(it.then, ids, own, at_call)
            branches |= _path_lives(it.orelse, ids, own, at_call)
            if branches != {(None, None, False)}:
                paths = {met(p, *q) for p in paths for q in branches}
            continue
        mine = [c for c in walk([it]) if isinstance(c, Call) and id(c) in ids]
        if mine:
            spans = [at_call[id(c)] for c in mine]
            lo, hi = min(s for _, s, _ in spans), max(t for _, _, t in spans)
            wrote = any(id(c) in own for c in mine)
            paths = {met(p, lo, hi, wrote) for p in paths}
    return paths


def _merged(spans: list) -> list:
    """``spans`` (``(start, stop)``) with those that meet or touch as one, in order."""
    out: list = []
    for s, t in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], t))
        else:
            out.append((s, t))
    return out


def _fused_spans(plan: Plan, top, at_call: dict):
    """A fused kernel (``kernels.fused``) computes its statements point by point: a point
    of the last writes before a later point of the first reads. So each call of a run of
    calls that one fused kernel may make spans the whole run."""
    fused = plan.kernels.fused if plan.kernels is not None else ()
    if not fused:
        return

    def bodies(items):
        yield items
        for it in items:
            if isinstance(it, Loop):
                yield from bodies(it.body)
            elif isinstance(it, If):
                yield from bodies(it.then)
                yield from bodies(it.orelse)

    for items in bodies(list(top)):
        for k, it in enumerate(items):
            if not isinstance(it, Call):
                continue
            for parts in fused:
                run = items[k : k + len(parts)]
                if len(run) == len(parts) and all(
                    isinstance(c, Call) and c.statement == p and c.args == it.args
                    for c, p in zip(run, parts)
                ):
                    spans = [at_call[id(c)] for c in run if id(c) in at_call]
                    if not spans:
                        continue
                    lo = min(s for _, s, _ in spans)
                    hi = max(t for _, _, t in spans)
                    for c in run:
                        if id(c) in at_call:
                            p0, s0, t0 = at_call[id(c)]
                            at_call[id(c)] = (p0, min(s0, lo), max(t0, hi))


def _positions(items, pos: int, at_call: dict, span: list | None = None) -> int:
    """Number the calls of ``items`` from ``pos`` in the order an iteration makes them
    (both branches of an ``if``, one after the other); each call's span is its own
    position, or, inside a loop of the body, that loop's positions (a value can live from
    one of its iterations to the next). Returns the next position."""
    for it in items:
        if isinstance(it, Call):
            at_call[id(it)] = (pos, pos, pos + 1) if span is None else (pos, *span)
            pos += 1
        elif isinstance(it, Loop):
            if span is None:
                inner: dict = {}
                stop = _positions(it.body, pos, inner, [pos, pos])
                for key, (p, _, _) in inner.items():
                    at_call[key] = (p, pos, stop)
                pos = stop
            else:
                pos = _positions(it.body, pos, at_call, span)
        elif isinstance(it, If):
            pos = _positions(it.then, pos, at_call, span)
            pos = _positions(it.orelse, pos, at_call, span)
    return pos


def iteration_local(plan: Plan) -> dict[int, list[Call]]:
    """The buffers whose values never outlive an iteration of the top-level loop they are
    used in, with every call that writes or reads them: a buffer with a window over a dim
    ``d`` that is its statement's only loop dim, whose statement writes every point of its
    window's slot at each call (its domain names only ``d``), called only in the loop with
    ``d`` its variable, and read only there, by calls that read it at ``d`` = the loop's
    variable (not an output, not a metric). Such a buffer is written in an iteration before
    the iteration reads it, and nothing reads it after: between its last use in an
    iteration and its first in the next its bytes can hold another buffer's (and it needs no
    zeroing: every point is written before it is read)."""
    kept = {sid for _, sid, _ in plan.outputs} | {sid for _, sid, _ in plan.metrics}
    loop_of: dict[int, Loop] = {}  # id(call) -> its top-level loop
    calls: dict[int, list[Call]] = {}
    for it in plan.tree:
        for c in walk([it]):
            if isinstance(c, Call):
                calls.setdefault(c.statement, []).append(c)
                if isinstance(it, Loop):
                    loop_of[id(c)] = it
    readers = plan.readers()
    # (a buffer in another's memory, and that one: their bytes hold a value from one
    # iteration to the next)
    kept |= {x for b in plan.buffers if b.home is not None for x in (b.id, b.home.buffer)}
    out: dict[int, list[Call]] = {}
    for b in plan.buffers:
        st = plan.statement(b.id)
        if b.window is None or b.id in kept or st.loops != (b.window.dim,):
            continue
        if not px.names(st.domain) <= {b.window.dim} or not calls.get(b.id):
            continue
        loop = loop_of.get(id(calls[b.id][0]))
        if loop is None or any(
            loop_of.get(id(c)) is not loop or c.args != (loop.var,) for c in calls[b.id]
        ):
            continue
        k = b.dims.index(b.window.dim)
        uses = list(calls[b.id])
        for sid, r in readers.get(b.id, ()):
            reader = plan.statement(sid)
            a = r.access[k]
            if not isinstance(a, At):
                break
            for c in calls.get(sid, ()):
                values = dict(zip(reader.loops, c.args))
                if loop_of.get(id(c)) is not loop or px.substitute(a.index, values) != loop.var:
                    break
                uses.append(c)
            else:
                continue
            break
        else:
            out[b.id] = uses
    return out
