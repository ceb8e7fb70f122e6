"""The device arena: one block of device memory for every buffer of a plan, each at an
offset fixed before the run.

The memory plan (``plan.memory``) says when each buffer lives: from the first top-level item
of the loop tree that uses it (a call of a statement that writes or reads it) to the
``Free`` after its last use (or to the end, for outputs and metrics), and which buffer takes
over a dying one's memory (a donation: they share one *storage*, whose life is both of
theirs). Storages whose lives do not meet may share bytes. ``layout`` places them greedily,
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

from timerlc.plan.items import DTYPES, Call, Free, Plan, SwapIn, SwapOut, walk

ALIGN = 256  # bytes: cudaMalloc's alignment, so that every output is aligned as its own


@dataclass(frozen=True)
class Layout:
    """``size`` bytes in all; per buffer, the offset of each of its outputs."""

    size: int
    offsets: dict[int, tuple[int, ...]]
    peak: int  # the most bytes the buffers hold at once (the size's lower bound)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def output_bytes(plan: Plan, sid: int) -> list[int]:
    buf = plan.buffer(sid)
    points = math.prod(buf.extents)
    return [points * math.prod(o.shape) * DTYPES[o.dtype] for o in buf.outputs]


def layout(plan: Plan) -> Layout | None:
    """Where each buffer of ``plan`` lies in the arena, or None where the plan has swaps or
    a free inside a loop."""
    top = list(plan.tree)
    nested = [it for it in walk(top) if isinstance(it, (Free, SwapOut, SwapIn))]
    if any(isinstance(it, (SwapOut, SwapIn)) for it in nested):
        return None
    if len(nested) != sum(1 for it in top if isinstance(it, Free)):
        return None
    end = len(top) + 1  # (outputs are read after the last item)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for j, it in enumerate(top):
        if isinstance(it, Free):
            for sid in it.buffers:
                last.setdefault(sid, j)
            continue
        for call in walk([it]):
            if not isinstance(call, Call):
                continue
            sid = call.statement
            used = {sid} | {r.src for n in plan.statement(sid).nodes for r in n.inputs if r.stored}
            for s in used:
                first.setdefault(s, j)
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
        start, stop = first.get(sid, len(top)), last.get(sid, end)
        if r in lives:
            lives[r] = [min(lives[r][0], start), max(lives[r][1], stop)]
        else:
            lives[r] = [start, stop]
        sizes[r] = max(sizes.get(r, 0), at)
    placed: list[tuple[int, int, int, int]] = []  # (offset, bytes, start, stop)
    where: dict[int, int] = {}
    for r in sorted(lives, key=lambda r: (-sizes[r], lives[r][0], r)):
        start, stop = lives[r]
        clash = sorted((o, o + n) for o, n, s, t in placed if s < stop and start < t and n > 0)
        at = 0
        for lo, hi in clash:
            if at + sizes[r] <= lo:
                break
            at = max(at, _aligned(hi))
        where[r] = at
        placed.append((at, sizes[r], start, stop))
    size = max((o + n for o, n, _, _ in placed), default=0)
    # the peak: the most bytes live during one item
    peak = 0
    for j in range(end + 1):
        peak = max(peak, sum(n for _, n, s, t in placed if s <= j < t))
    offsets = {b.id: tuple(where[root(b.id)] + o for o in offsets_in[b.id]) for b in plan.buffers}
    return Layout(size, offsets, peak)
