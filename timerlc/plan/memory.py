"""The memory plan: how each statement's buffer is stored, when it is dropped, and which
dying buffer a statement takes over instead of allocating its own.

- **Windows.** A statement ``X`` in a top-level band of the schedule whose time vector has a
  coordinate along one of its dims ``d`` (``phi_X = s * d + c``) and whose readers are all in
  the same band needs only the last ``w`` values of ``d``: a ring buffer, indexed ``d mod w``.
  ``w`` comes from the largest distance, in that band's coordinate, between the write of a
  point of ``X`` and a read of it (``phi_Y(q) - phi_X(p)`` over every read ``q -> p``, with
  isl): the next write into the slot of ``p`` (the point ``p +- w`` along ``d``) runs at
  ``phi_X(p) + |s| * w``, so ``|s| * w > max distance`` keeps ``p`` there until its last
  read, whatever the order of the reader and ``X`` inside the band at an equal coordinate.
  A reader that runs before ``X`` at an equal coordinate (an earlier position in the band)
  and reads at a distance of exactly ``|s| * k`` needs only ``k`` slots: the write that
  takes its slot comes after it (Adam's new moments, read by the next step's parameters
  before the step writes its own: one slot, not two).
  Outputs, metrics, and tensors read at points they do not define (0 in a block) stay
  blocks. A windowed statement of a nest of two loops may get a second ring buffer along
  the inner loop's dim (``_inner_window``): the slots its reads in the same outer
  iteration need, and for reads after that iteration, enough that the point read is one of
  the last the iteration wrote. Each output gets the slots its own reads need, and
  outputs whose reads allow no second ring buffer keep every index of that dim (an
  environment step's observation is read at the next step, its reward after the rollout).
- **In place** (``_homes``). An update ``U`` read by the next step's merge ``M``
  (``net[j + 1] = adam(net[j], ...)``), both ring buffers of one slot, is stored where
  ``M[j + 1]`` is, over ``M[j]`` once every other reader has read it; the merge's initial
  value, a statement of no dims only the merge's first point reads, where that point is.
  The buffer then has no memory of its own (``Buffer.home``), and a merge all of whose
  inputs are in its memory is not called (``build._idle_merges``).
- **Frees.** A buffer that is not an output or a metric is dropped right after the last
  top-level item of the loop tree that writes or reads it (unless that is the last item).
- **Donation.** A statement that runs as one batch (no loop dims), is itself a top-level
  item of the loop tree, and writes every point of its bounding box takes the memory of a
  block it is the last reader of, if that block has one output of the same dtype and size.
- **Swaps** (only under a memory budget). The top-level items run in order; a buffer is
  on the device from the first item that uses it (writes or reads it) to its free (or the
  end of the run), so the bytes the buffers hold during each item are known. Where they
  exceed the budget, blocks that sit unused across that item (not outputs or metrics; a
  *gap* between two items that use them) are moved to host memory: a ``swap_out`` after the
  use before the gap, a ``swap_in`` right before the use after it. They are chosen as
  Belady would: the next use farthest away first; then those the item no longer needs
  (the smallest first) are given back. If swapping every gap still leaves some item over
  the budget, the plan aims at the lowest peak swapping can reach instead (swapping no
  more than that peak needs) and says the budget is not met. A buffer used by the
  training loop at every iteration is used by that one top-level item: it has no gap there
  and stays on the device.

In: the PDG, its ``Schedule`` and the plan's buffers and loop tree. Out: a ``MemoryPlan``;
``plan.build`` records it (``docs/plan.md``) and the runtime obeys it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import islpy as isl

from timerlc import ops
from timerlc.ir import index as ix
from timerlc.ir.pdg import Graph, Point
from timerlc.plan.items import Buffer, Call, Loop, Window
from timerlc.poly import isl as pisl
from timerlc.schedule.build import Schedule

_PHI = re.compile(r"^(-?\d+) \* (\w+) \+ (-?\d+)$")


@dataclass(frozen=True)
class MemoryPlan:
    windows: dict[int, tuple[str, int]]  # statement -> (dim, slots) of its ring buffer
    frees: dict[int, list[int]]  # top-level tree item -> statements dropped after it
    donors: dict[int, int]  # statement -> the statement whose memory it takes
    # top-level tree item -> statements moved to host memory after it / back before it
    swap_outs: dict[int, list[int]] = field(default_factory=dict)
    swap_ins: dict[int, list[int]] = field(default_factory=dict)
    budget: int | None = None  # bytes of device memory the buffers may hold, or None
    budget_met: bool | None = None  # None without a budget
    peak: int = 0  # the most bytes the buffers hold at once (by this plan's own count)
    unswapped_peak: int = 0  # the same without any swap
    # a budget not met: the top-level item where even swapping every gap leaves the most
    # bytes on the device, and the buffers on the device then (largest first): what keeps
    # the budget from being met; the smallest budget that can be met is their sum
    floor_item: int | None = None
    floor_buffers: tuple[int, ...] = ()
    # statement -> (dim, slots) of a second ring buffer, along a loop nested in its window's
    inner: dict[int, tuple[str, int]] = field(default_factory=dict)
    # statement -> the outputs that have that second ring buffer, where not all of them do
    inner_outputs: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # statement -> (the statement whose memory holds its values, where: its point p is that
    # one's at(p), one index expression in the plan's form)
    homes: dict[int, tuple[int, tuple]] = field(default_factory=dict)


def plan_memory(
    graph: Graph,
    schedule: Schedule,
    buffers: dict[int, Buffer],
    kept: set[int],
    budget: int | None = None,
) -> MemoryPlan:
    """``buffers``: per statement, its buffer as a block (its bounding box, its outputs);
    ``kept``: the statements the run must keep to the end (outputs and metrics); ``budget``:
    the bytes the buffers may hold at once on the device (None: no limit, no swaps)."""
    direct = {y: _direct_reads(graph, schedule, y) for y in schedule.statements}
    readers: dict[int, set[int]] = {}
    for y, xs in direct.items():
        for x in xs:
            readers.setdefault(x, set()).add(y)
    maps: dict[int, dict[int, isl.Map]] = {}
    for (y, x), m in schedule.reads.items():
        if x in direct[y]:  # not the order of an environment's calls
            maps.setdefault(x, {})[y] = m
    windows, inner, inner_outputs = {}, {}, {}
    for x in schedule.statements:
        w = _window(graph, schedule, x, readers.get(x, set()), maps.get(x, {}), buffers, kept)
        if w is not None:
            windows[x] = w
            v = _inner_windows(graph, schedule, x, maps.get(x, {}), buffers, w)
            if v is not None:
                inner[x], outs = v
                if outs is not None:
                    inner_outputs[x] = outs
    homes = _homes(graph, schedule, windows, inner, maps, kept, readers)
    uses: dict[int, list[int]] = {}  # per buffer, the top-level items that write or read it
    for k, item in enumerate(schedule.tree):
        touched: set[int] = set()
        for y in _calls(item):
            touched.add(y)
            touched |= direct[y]
        for x in {homes[x][0] if x in homes else x for x in touched}:
            uses.setdefault(x, []).append(k)
    last = {x: ks[-1] for x, ks in uses.items()}  # the last item that writes or reads it
    frees: dict[int, list[int]] = {}
    for x, k in sorted(last.items()):
        if x not in kept and k < len(schedule.tree) - 1:
            frees.setdefault(k, []).append(x)
    donors = _donations(graph, schedule, buffers, windows, direct, last, kept, homes)
    sizes = {
        x: 0
        if x in homes
        else buffer_bytes(buffers[x], windows.get(x), inner.get(x), inner_outputs.get(x))
        for x in schedule.statements
    }
    swap = _swaps(len(schedule.tree), uses, sizes, kept, windows, donors, budget)
    return MemoryPlan(
        windows, frees, donors, *swap, inner=inner, inner_outputs=inner_outputs, homes=homes
    )


def buffer_bytes(
    buf: Buffer,
    window: tuple[str, int] | None = None,
    inner: tuple[str, int] | None = None,
    inner_outputs: tuple[int, ...] | None = None,
) -> int:
    """The bytes of a statement's buffer: its box (``window``: ``(dim, slots)`` along one
    dim; ``inner``: along a second, for the outputs ``inner_outputs``, None: all) times
    each output's points."""
    if window is None:
        return buf.nbytes
    second = None if inner is None else Window(*inner)
    return replace(buf, window=Window(*window), inner=second, inner_outputs=inner_outputs).nbytes


def _swaps(n: int, uses, sizes, kept, windows, donors, budget):
    """``(swap_outs, swap_ins, budget, budget_met, peak, unswapped_peak, floor_item,
    floor_buffers)`` over the ``n`` top-level items (see the module's docstring)."""
    live = [0] * n  # the bytes the buffers hold during each item (before the frees after it)
    on_device: dict[int, range] = {}  # per buffer, the items it is on the device for
    for x, ks in uses.items():
        start = ks[0]
        donor = donors.get(x)
        if donor is not None and uses.get(donor, [None])[-1] == start:
            start += 1  # x holds its donor's memory during that item, then in its place
        end = n - 1 if x in kept else ks[-1]
        on_device[x] = range(start, end + 1)
        for k in on_device[x]:
            live[k] += sizes[x]
    unswapped = max(live, default=0)
    if budget is None:
        return {}, {}, None, None, unswapped, unswapped, None, ()
    # the gaps a swap may use: (item of the use before, item of the use after, buffer)
    gaps = [
        (a, b, x)
        for x, ks in sorted(uses.items())
        if x not in kept and x not in windows and sizes[x] > 0
        for a, b in zip(ks, ks[1:])
        if b - a > 1
    ]
    floor = list(live)
    for a, b, x in gaps:
        for k in range(a + 1, b):
            floor[k] -= sizes[x]
    reachable = max(floor, default=0)
    target = max(budget, reachable)
    chosen: set[tuple[int, int, int]] = set()
    for k in range(n):
        if live[k] <= target:
            continue
        # Belady: the gaps across item k whose next use is farthest away first
        around = sorted(
            (g for g in gaps if g[0] < k < g[1] and g not in chosen),
            key=lambda g: (-g[1], -sizes[g[2]], g[2]),
        )
        now = []
        for g in around:
            if live[k] <= target:
                break
            now.append(g)
            chosen.add(g)
            for j in range(g[0] + 1, g[1]):
                live[j] -= sizes[g[2]]
        # give back what item k (and the items before it in the gap) do not need
        for g in sorted(now, key=lambda g: (sizes[g[2]], g[2])):
            size = sizes[g[2]]
            if all(live[j] + size <= target for j in range(g[0] + 1, k + 1)):
                chosen.discard(g)
                for j in range(g[0] + 1, g[1]):
                    live[j] += size
    outs: dict[int, list[int]] = {}
    ins: dict[int, list[int]] = {}
    for a, b, x in sorted(chosen):
        outs.setdefault(a, []).append(x)
        ins.setdefault(b, []).append(x)
    for d in (outs, ins):
        for k in d:
            d[k].sort()
    peak = max(live, default=0)
    if reachable <= budget:
        return outs, ins, budget, True, peak, unswapped, None, ()
    worst = floor.index(reachable)
    gapped = {x for a, b, x in gaps if a < worst < b}
    stuck = sorted(
        (x for x, r in on_device.items() if worst in r and x not in gapped and sizes[x] > 0),
        key=lambda x: (-sizes[x], x),
    )
    return outs, ins, budget, False, peak, unswapped, worst, tuple(stuck)


def _direct_reads(graph: Graph, schedule: Schedule, y: int) -> set[int]:
    """The statements whose buffers ``y`` reads (through its inlined nodes)."""
    return {
        e.src
        for k in schedule.statements[y].body
        for e in graph.node(k).inputs
        if e.src in schedule.statements
    }


def _window(graph: Graph, schedule: Schedule, x: int, readers, maps, buffers, kept):
    """``(dim, slots)`` of the ring buffer ``x`` needs, or None (a block)."""
    node = graph.node(x)
    if x in kept or not node.dims:
        return None
    times = schedule.times
    phi = _PHI.match(times[x][1]) if len(times[x]) > 1 else None
    if phi is None:
        return None
    scale = abs(int(phi.group(1)))
    names = {ix.isl_name(d): d for d in node.dims}
    dim = names.get(phi.group(2))
    if dim is None or scale == 0 or any(times[y][0] != times[x][0] for y in readers):
        return None
    defined = _written(graph, x)
    phi_x = _phi_map(graph, x, times[x][1])
    size = 1
    for y, m in maps.items():
        if not m.range().is_subset(defined):
            return None  # reads a point x does not write: a block reads 0 there
        delta = m.apply_domain(_phi_map(graph, y, times[y][1])).apply_range(phi_x).deltas()
        if delta.is_empty():
            continue
        lo, hi = delta.dim_min_val(0), delta.dim_max_val(0)  # phi_X(p) - phi_Y(q)
        if not (lo.is_int() and hi.is_int()) or hi.to_python() > 0:
            return None  # unbounded, or a read before the write (no schedule does that)
        far = -lo.to_python()
        if (
            far
            and far % scale == 0
            and (
                _runs_before(times[y], times[x])
                or _reads_first(graph, schedule, x, y, m, phi_x, far)
            )
        ):
            # the write that takes the slot, |s| * w later, comes after y's read at that
            # coordinate: w = far / |s| slots (Adam's new moment, read by the next step's
            # merge before the step writes its own: one slot, where there were two)
            size = max(size, far // scale)
        else:
            size = max(size, far // scale + 1)
    if size >= buffers[x].box[node.dims.index(dim)]:
        return None
    return dim, size


def _homes(graph: Graph, schedule: Schedule, windows, inner, maps, kept, readers) -> dict:
    """``{update: (merge, (d + 1,))}``: the updates written in place of the values they
    update; and ``{initial value: (merge, (first,))}``: the initial values written where the
    merge's first point is (``_initial``).

    ``net[j + 1] = adam(net[j], ...)`` is a merge ``M`` (``net[j]``: the initial value at
    ``j = 0``, else ``U[j - 1]``) and an update ``U``, both ring buffers of one slot along
    ``j``: the merge copies the update into its own slot at every step. The update's values
    can be stored in the merge's slot instead (``U[p]`` where ``M[p + 1]`` is), and the copy
    left out: the merge's slot holds ``M[p]`` until ``U[p]`` is written over it, and
    ``U[p]``, which is ``M[p + 1]``, from then on. That is right where

    - ``M`` and ``U`` are statements of one dim, the window's, with one output of one type,
      ``M`` reads ``U`` at ``d - 1`` only, and takes that input wherever ``U[d - 1]`` is
      defined (first match wins: no input before it applies there);
    - every read of ``M[p]`` by another statement comes before ``U[p]`` is written (by the
      band's coordinate, then the position at an equal one); ``U[p]``'s reads, before
      ``U[p + 1]``'s write, as its window of one slot already says;
    - ``U`` reads ``M`` at its own point only, through elementwise ops (each element of its
      value is computed from the same element of ``M`` before it is written over), and
      cannot fail (a failed call is computed again from its inputs: ``runtime``).

    Adam's new parameters and moments, in every program: a buffer each less (PPO at 3x256x256
    observations: 288 MiB)."""
    times = schedule.times
    homes: dict[int, tuple[int, tuple]] = {}
    for m in sorted(schedule.statements):
        node = graph.node(m)
        w = windows.get(m)
        if node.op != "merge" or w is None or w[1] != 1 or m in inner or node.dims != (w[0],):
            continue
        if len(node.types) != 1:
            continue
        dim = w[0]
        for k, e in enumerate(node.inputs):
            u = e.src
            if (
                not _may_live_in(u, m, schedule, kept, homes)
                or windows.get(u) != w
                or u in inner
                or graph.node(u).dims != node.dims
                or graph.node(u).types != node.types
                or not isinstance(e.access[0], Point)
                or ix.affine_offset(e.access[0].expr, dim) != -1
            ):
                continue
            if _in_place(graph, schedule, m, u, k, maps.get(m, {}), times):
                homes[u] = (m, (ix.to_plan(ix.sym(dim) + 1),))
                break
        at = _initial(graph, schedule, m, homes, readers, kept)
        if at is not None:
            homes[at[0]] = (m, (at[1],))
    return homes


def _initial(graph: Graph, schedule: Schedule, m: int, homes, readers, kept):
    """``(x, first)``: the initial value ``x`` of merge ``m`` (``net[0]``, the orthogonal
    weights) written where ``m``'s first point ``first`` is, or None. The merge would copy
    it there at its first call, and nothing but that call reads it: it lived through the
    training loop (a weight's size more). Right where ``x`` is a statement of no dims with
    ``m``'s type, read by ``m`` alone through one input, which applies at ``m``'s first
    point only; and nothing else is written into ``m``'s memory before that point (an
    update in place, ``U[p]`` at ``p + 1``, writes after it)."""
    node = graph.node(m)
    first = pisl.domain_set(node.domain, f"n{m}").lexmin()
    if not first.is_singleton():
        return None
    for e, where in zip(node.inputs, _applies(graph, m)):
        x = e.src
        if (
            not _may_live_in(x, m, schedule, kept, homes)
            or graph.node(x).dims
            or ops.is_env(graph.node(x).op)
            or graph.node(x).types != node.types
            or readers.get(x, set()) != {m}
            or _reads_of(graph, schedule, m, x) != 1
            or not where.is_equal(first)
        ):
            continue
        p0 = first.dim_min_val(0).to_python()
        for u, (h, _) in homes.items():  # (each U[p] at p + 1: after the first point)
            if h == m:
                later = _next_points(graph, u, m)
                if not later.is_empty() and later.dim_min_val(0).to_python() <= p0:
                    return None
        return x, p0
    return None


def _in_place(graph: Graph, schedule: Schedule, m: int, u: int, k: int, maps, times) -> bool:
    """Whether update ``u`` may be written in place of merge ``m``, whose input ``k`` reads
    ``u`` at ``d - 1`` (``_homes``)."""
    node = graph.node(m)
    if _reads_of(graph, schedule, m, u) != 1:
        return False
    if times[u][0] != times[m][0] or _PHI.match(times[u][1]) is None:
        return False
    # where U[p - 1] is defined, M[p] takes input k: U[p - 1] is M[p]
    covered = _next_points(graph, u, m).intersect(pisl.domain_set(node.domain, f"n{m}"))
    if not covered.is_subset(_applies(graph, m)[k]):
        return False
    # U reads M at its own point only, through elementwise ops that cannot fail
    for j in schedule.statements[u].body:
        n = graph.node(j)
        kind = ops.get(n.op).kind
        if kind != "elementwise" and not (kind == "source" and not n.inputs):
            return False
        for e in n.inputs:
            if e.src == m and (
                e.cond is not None
                or not isinstance(e.access[0], Point)
                or ix.affine_offset(e.access[0].expr, node.dims[0]) != 0
            ):
                return False
    # every other read of M[p] comes before U[p]'s write
    (d,) = (ix.isl_name(x) for x in node.dims)
    own = isl.Map(f"{{ n{u}[{d}] -> n{m}[{d}] }}")
    overwritten = _written(graph, u).apply(own)
    phi_u = _phi_map(graph, m, times[u][1])
    for y, rmap in maps.items():
        if y == u:
            continue
        delta = (
            rmap.intersect_range(overwritten)
            .apply_domain(_phi_map(graph, y, times[y][1]))
            .apply_range(phi_u)
            .deltas()
        )  # phi_U(p) - phi_Y(q)
        if delta.is_empty():
            continue
        lo = delta.dim_min_val(0)
        if not lo.is_int() or lo.to_python() < 0:
            return False
        if lo.to_python() == 0 and not _runs_before(times[y], times[u]):
            return False
    return True


def _may_live_in(x: int, m: int, schedule: Schedule, kept, homes) -> bool:
    """Whether ``x`` is a statement other than ``m`` that the run does not keep and that
    lives in no memory but its own yet: one that may live in ``m``'s (``_homes``)."""
    return x != m and x in schedule.statements and x not in kept and x not in homes


def _applies(graph: Graph, m: int) -> list[isl.Set]:
    """Where each input of merge ``m`` applies, as points of ``m`` (first match wins)."""
    node = graph.node(m)
    dom = pisl.domain_set(node.domain, f"n{m}")
    taken = dom.subtract(dom)
    out = []
    for e in node.inputs:
        where = dom if e.cond is None else pisl.cond_set(node.dims, e.cond, f"n{m}")
        where = where.intersect(dom).subtract(taken)
        taken = taken.union(where)
        out.append(where)
    return out


def _next_points(graph: Graph, u: int, m: int) -> isl.Set:
    """The points ``u`` writes, as points of ``m`` one further along their dim: where an
    update in place holds them (``U[p]`` at ``M[p + 1]``)."""
    (d,) = (ix.isl_name(x) for x in graph.node(m).dims)
    return _written(graph, u).apply(isl.Map(f"{{ n{u}[{d}] -> n{m}[{d} + 1] }}"))


def _reads_of(graph: Graph, schedule: Schedule, y: int, x: int) -> int:
    """How many inputs of the nodes of statement ``y`` read ``x``."""
    return sum(e.src == x for k in schedule.statements[y].body for e in graph.node(k).inputs)


def _reads_first(graph: Graph, schedule: Schedule, x: int, y: int, m, phi_x, far: int) -> bool:
    """Whether, in a nest of two loops, each read ``m`` (``y``'s of ``x``) of a point
    ``far`` outer coordinates back comes before every write of ``x`` in the reader's outer
    iteration: then that iteration's writes, which take the slots of the iteration ``far``
    back, come after it (PPO's first observation of an iteration, the last step's of the
    iteration before, read before the iteration's first step: one iteration's slots, where
    there were two; the inner window, ``_inner_window``, keeps the step apart within it)."""
    tx, ty = schedule.times[x], schedule.times[y]
    if len(tx) != 5 or len(ty) != 5 or tx[2] != ty[2]:
        return False
    if _PHI.match(tx[3]) is None or _PHI.match(ty[3]) is None:
        return False
    phi_y = _phi_map(graph, y, ty[1])
    back = isl.Map(f"{{ [a] -> [a - {far}] }}")
    far_reads = m.intersect(phi_y.apply_range(back).apply_range(phi_x.reverse()))
    if far_reads.is_empty():
        return True
    same = phi_y.apply_range(phi_x.reverse())  # q -> each p2 of its outer iteration
    same = same.intersect_domain(far_reads.domain()).intersect_range(_written(graph, x))
    if same.is_empty():
        return True
    inner_y, inner_x = _phi_map(graph, y, ty[3]), _phi_map(graph, x, tx[3])
    lo = same.apply_domain(inner_y).apply_range(inner_x).deltas().dim_min_val(0)
    if not lo.is_int():
        return False
    first = lo.to_python()  # phi_2 of the earliest such write - phi_2 of the read
    return first > 0 or (first == 0 and _runs_before(ty, tx, 4))


def _runs_before(ty: tuple, tx: tuple, level: int = 2) -> bool:
    """Whether, at an equal coordinate of their band (``t[level - 1]``: the outer loop's,
    or with ``level`` 4 the inner loop's of a nest of two), the statement of time vector
    ``ty`` runs before that of ``tx``: an earlier position at the next level (statements of
    one nested loop share theirs: then not)."""
    return len(ty) > level and len(tx) > level and int(ty[level]) < int(tx[level])


def _inner_windows(graph: Graph, schedule: Schedule, x: int, maps, buffers, outer):
    """``((dim, slots), outputs)`` of the second ring buffer of ``x`` (``_inner_window``),
    or None: each output gets the slots its own readers need (a reader of several outputs
    counts for each), and the buffer the most of them; ``outputs``: those that have it,
    None where every output does (an environment step's observation is read at the next
    step, its reward and ``done`` after the rollout: only the observation has it)."""
    n = len(graph.node(x).types)
    if n == 1:
        v = _inner_window(graph, schedule, x, maps, buffers, outer)
        return None if v is None else (v, None)
    read = {}  # reader -> the outputs of x it reads
    for y in maps:
        read[y] = {
            e.out for k in schedule.statements[y].body for e in graph.node(k).inputs if e.src == x
        }
    each = [
        _inner_window(
            graph, schedule, x, {y: m for y, m in maps.items() if k in read[y]}, buffers, outer
        )
        for k in range(n)
    ]
    have = tuple(k for k, v in enumerate(each) if v is not None)
    if not have:
        return None
    (dim,) = {each[k][0] for k in have}
    size = max(each[k][1] for k in have)
    return (dim, size), (None if len(have) == n else have)


def _inner_window(graph: Graph, schedule: Schedule, x: int, maps, buffers, outer):
    """``(dim, slots)`` of a second ring buffer for ``x``, along the inner loop of a nest of
    two (its time vector ``(top, phi_1, position, phi_2, position)``), or None.

    A read of ``x`` in the same nest and the same iteration of the outer loop needs the
    slots the distance along ``phi_2`` asks for (as ``_window``'s along ``phi_1``). Any
    other read comes after the outer iteration that wrote the point (a later iteration, a
    statement after the inner loop, a later top-level item): there the point must be one
    of the last ``slots`` its outer iteration wrote, so that no later write of that
    iteration took its slot (PPO's first observation of an iteration is the step's
    observation at ``t = T - 1`` of the iteration before: 2 slots along ``t``, where there
    were ``T``). The outer window (``outer``, ``_window``'s) keeps the outer iterations
    apart."""
    node = graph.node(x)
    tx = schedule.times[x]
    if len(tx) != 5 or _PHI.match(tx[1]) is None:
        return None
    phi = _PHI.match(tx[3])
    if phi is None:
        return None
    names = {ix.isl_name(d): d for d in node.dims}
    dim, scale = names.get(phi.group(2)), abs(int(phi.group(1)))
    if dim is None or scale == 0 or dim == outer[0]:
        return None
    outer_x, inner_x = _phi_map(graph, x, tx[1]), _phi_map(graph, x, tx[3])
    size = 1
    late = []  # the points read after the outer iteration that wrote them
    for y, m in maps.items():
        ty = schedule.times[y]
        if ty[0] != tx[0]:
            if int(ty[0]) < int(tx[0]):
                return None  # (no schedule reads a point before its write)
            late.append(m.range())
            continue
        outer_y = _phi_map(graph, y, ty[1])
        same = outer_y.apply_range(outer_x.reverse())  # q -> p in one outer iteration
        now, before = m.intersect(same), m.subtract(same)
        if not before.is_empty():
            delta = before.apply_domain(outer_y).apply_range(outer_x).deltas()
            hi = delta.dim_max_val(0)
            if not hi.is_int() or hi.to_python() >= 0:
                return None  # not an earlier iteration's point
            late.append(before.range())
        if now.is_empty():
            continue
        if len(ty) == 5 and ty[2] == tx[2] and _PHI.match(ty[3]) is not None:
            delta = now.apply_domain(_phi_map(graph, y, ty[3])).apply_range(inner_x).deltas()
            lo, hi = delta.dim_min_val(0), delta.dim_max_val(0)
            if not (lo.is_int() and hi.is_int()) or hi.to_python() > 0:
                return None
            far = -lo.to_python()
            if far and far % scale == 0 and _runs_before(ty, tx, 4):
                # the write that takes the slot, |s2| * w later, comes after y's read at
                # that coordinate (as _window's): w = far / |s2| (the merge o reads the
                # step's observation before the step writes the next: one slot)
                size = max(size, far // scale)
            else:
                size = max(size, far // scale + 1)
        elif int(ty[2]) > int(tx[2]):
            late.append(now.range())  # after the inner loop, in the same outer iteration
        else:
            return None
    if late:
        read = late[0]
        for s in late[1:]:
            read = read.union(s)
        # p -> each point p2 its outer iteration writes: phi_2(p2) - phi_2(p) is below the
        # slots' span, so that no write after p's takes p's slot
        plane = outer_x.apply_range(outer_x.reverse())
        plane = plane.intersect_domain(read).intersect_range(_written(graph, x))
        hi = plane.apply_domain(inner_x).apply_range(inner_x).deltas().dim_max_val(0)
        if not hi.is_int():
            return None
        size = max(size, hi.to_python() // scale + 1)
    if size >= buffers[x].box[node.dims.index(dim)]:
        return None
    return dim, size


def _phi_map(graph: Graph, nid: int, phi: str) -> isl.Map:
    names = ", ".join(ix.isl_name(d) for d in graph.node(nid).dims)
    return isl.Map(f"{{ n{nid}[{names}] -> [{phi}] }}")


def _calls(item) -> set[int]:
    if isinstance(item, Call):
        return {item.statement}
    kids = item.body if isinstance(item, Loop) else item.then + item.orelse
    out: set[int] = set()
    for kid in kids:
        out |= _calls(kid)
    return out


def _donations(graph, schedule: Schedule, buffers, windows, direct, last, kept, homes) -> dict:
    donors: dict[int, int] = {}
    taken: set[int] = set(homes)  # (in another's memory: it neither takes nor gives one)
    for k, item in enumerate(schedule.tree):
        y = item.statement if isinstance(item, Call) else None
        if y is None or schedule.statements[y].loops or len(buffers[y].outputs) != 1:
            continue
        if y in homes:
            continue
        if not _fills_box(graph, y, buffers[y].box):
            continue
        want = _signature(buffers[y])
        if want[1] == 0:
            continue
        for x in sorted(direct[y]):
            if (
                x != y
                and x not in kept
                and x not in windows
                and x not in taken
                and last.get(x) == k
                and len(buffers[x].outputs) == 1
                and _signature(buffers[x]) == want
            ):
                donors[y] = x
                taken.add(x)
                break
    return donors


def _signature(buf: Buffer) -> tuple[str, int]:
    (out,) = buf.outputs
    return out.dtype, buf.nbytes


def _fills_box(graph: Graph, y: int, box) -> bool:
    """Whether one call of ``y`` writes every point of its bounding box."""
    node = graph.node(y)
    if not node.dims:
        return True
    names = ", ".join(ix.isl_name(d) for d in node.dims)
    bounds = " and ".join(f"0 <= {ix.isl_name(d)} < {e}" for d, e in zip(node.dims, box))
    return isl.Set(f"{{ n{y}[{names}] : {bounds} }}").is_subset(_written(graph, y))


def _written(graph: Graph, nid: int) -> isl.Set:
    """The points a statement writes: its domain, where (a merge) some equation applies."""
    node = graph.node(nid)
    out = pisl.domain_set(node.domain, f"n{nid}")
    conds = [e.cond for e in node.inputs]
    if node.op == "merge" and all(c is not None for c in conds):
        covered = out.subtract(out)
        for c in conds:
            covered = covered.union(pisl.cond_set(node.dims, c, f"n{nid}"))
        out = out.intersect(covered)
    return out
