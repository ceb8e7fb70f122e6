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


def first_fit(regions, align: int) -> list[int]:
    """Offsets for ``regions`` (``(bytes, start, stop)``: in use from ``start`` up to, not
    including, ``stop``), placed in the order given, each at the lowest ``align``-aligned
    offset where it meets no region placed before it that is in use at the same time (the
    arena's buffers; a cuda kernel's temporaries, ``codegen.lower._packed_temps``)."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, bytes, start, stop)
    out = []
    for n, start, stop in regions:
        at = 0
        for lo, hi in sorted(
            (o, o + m) for o, m, s, t in placed if s < stop and start < t and m > 0
        ):
            if at + n <= lo:
                break
            at = max(at, (hi + align - 1) // align * align)
        placed.append((at, n, start, stop))
        out.append(at)
    return out


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
    order = sorted(lives, key=lambda r: (-sizes[r], lives[r][0], r))
    at = first_fit([(sizes[r], *lives[r]) for r in order], ALIGN)
    where = dict(zip(order, at))
    size = max((where[r] + sizes[r] for r in order), default=0)
    # the peak: the most bytes live during one item
    peak = 0
    for j in range(end + 1):
        peak = max(peak, sum(sizes[r] for r in order if lives[r][0] <= j < lives[r][1]))
    offsets = {b.id: tuple(where[root(b.id)] + o for o in offsets_in[b.id]) for b in plan.buffers}
    return Layout(size, offsets, peak)
