"""CUDA graphs for the device runtime: a run of the loop tree that only launches, captured once
and replayed.

A *run* is a sequence of consecutive items of one body of the loop tree (``runs``) whose
every call is a statement with a kernel that the host does nothing for (no metric, no
output's bookkeeping) and that holds no ``free`` or swap: the host's work in it is only the
tree's own (loop steps, conditions, loop values) and the launches. Such a run, where it comes
again with the same *key*, is captured as a CUDA graph the second time and replayed from then
on: one launch of the graph instead of the host walking the run.

What the graph fixes, and what a replay may change (``analyze``):

- the loop values a launch passes are fixed in the graph: each call's are split into a part
  over the loops *around* the run (``outer``) and a part over the run's own loops
  (``split``); a replay adds the outer part's change since the capture on the device (the
  kernels add ``shift``, ``cuda.render.tl_shifted``: each call site has its own 8 values in
  the graph's shift memory, which the host copies up before the replay);
- everything else the host computes (which branch a condition takes, a loop's bounds, a
  product's operand addresses and whether it runs) must come out the same: the *key* is the
  values of those expressions that depend on the outer loops (or of the outer loop values
  they name, where an expression mixes them with the run's own), and each key has its own
  graph. A run whose keys keep changing (more than ``MAX_GRAPHS``) runs as launches again.

Before each replay the host checks that every call's shifted loop values stay inside its
box (the ranges the capture saw, moved by the shift): a replay never launches a call that the
launches would have refused.

A graph's calls wait only for those that touch the same bytes before them (``Order``): the
device captures them as branches (``depend``), which a GPU runs at once.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from timerlc.diagnostics import TimerlcError
from timerlc.plan import expr as px
from timerlc.plan.items import (
    Call,
    Free,
    GemmCall,
    If,
    Loop,
    PlanError,
    SwapIn,
    SwapOut,
    walk,
)

ARGS = 8  # a call site's shift values (cuda.render.ARGS)
MAX_GRAPHS = 8  # graphs of one run (distinct keys) before it runs as launches for good
MAX_UNSEEN = 64  # keys seen once each, none twice, before a run runs as launches for good


def split(e, outer: frozenset):
    """``(g, h)`` with ``e == g + h``, ``g`` over the names ``outer`` only and ``h`` over
    none of them (constant terms go to ``h``: ``c1 + 1`` has the part ``c1``); None where
    ``e`` does not split so (a term that mixes them, as in ``(i + t) // 2``)."""
    if isinstance(e, int):  # (a bool among them)
        return 0, e
    if isinstance(e, str):
        return (e, 0) if e in outer else (0, e)
    op, args = e[0], e[1:]
    if op in ("add", "sub"):
        parts = [split(a, outer) for a in args]
        if any(p is None for p in parts):
            return None
        return _sum(op, [p[0] for p in parts]), _sum(op, [p[1] for p in parts])
    if op == "neg":
        p = split(args[0], outer)
        return None if p is None else (_neg(p[0]), _neg(p[1]))
    if op == "mul":
        consts = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
        rest = [a for a in args if not (isinstance(a, int) and not isinstance(a, bool))]
        if len(rest) == 1:
            p = split(rest[0], outer)
            if p is None:
                return None
            c = int(np.prod(consts)) if consts else 1
            return _scaled(c, p[0]), _scaled(c, p[1])
    names = px.names(e)
    if not names & outer:
        return 0, e
    if names <= outer:
        return e, 0
    return None


def _sum(op: str, terms: list):
    """``op`` (add or sub) of ``terms``, its zero terms left out."""
    if op == "add":
        kept = [t for t in terms if t != 0]
        return 0 if not kept else kept[0] if len(kept) == 1 else ("add", *kept)
    a, b = terms
    return a if b == 0 else _neg(b) if a == 0 else ("sub", a, b)


def _neg(x):
    return 0 if x == 0 else ("neg", x)


def _scaled(c: int, x):
    return 0 if x == 0 or c == 0 else x if c == 1 else ("mul", c, x)


@dataclass
class Shape:
    """What a run's graphs depend on (``analyze``)."""

    key: tuple = ()  # expressions over the outer loops: their values pick the graph
    parts: tuple = ()  # the distinct outer parts of the calls' loop values
    # per call site, in the order the run's items list them: its statement, and per loop
    # value 0 (no outer part) or 1 + the index of its outer part in ``parts``
    sites: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)


def analyze(items, scope: tuple[str, ...], loops_of, phases: dict, repeated) -> Shape:
    """The shape of the run ``items`` in a body whose loop variables are ``scope``;
    ``loops_of``: a statement's loop dims (a call's values, in order); ``phases``: per
    statement with a kernel its phases (``GemmCall``s among them); ``repeated``: the
    statements whose launches repeat over blocks."""
    outer = frozenset(scope)
    key: dict = {}
    parts: dict = {}
    shape = Shape()

    def note(e):
        """``e`` is computed by the host in the run: where it depends on the outer loops,
        the graph is for its value (or the values of the outer loops it names)."""
        names = px.names(e)
        if not names & outer:
            return
        if names <= outer:
            key.setdefault(e, None)
        else:
            for n in sorted(names & outer):
                key.setdefault(n, None)

    def call(it: Call):
        slots = []
        for a in it.args:
            p = split(a, outer)
            if p is None:
                note(a)  # (the graph is for these outer values: no shift)
                slots.append(0)
            elif px.names(p[0]) and (p[0] in parts or len(parts) < ARGS):
                slots.append(1 + parts.setdefault(p[0], len(parts)))
            else:  # (no outer part; or more than tl_set_shift takes: the graph is for it)
                if px.names(p[0]):
                    key.setdefault(p[0], None)
                slots.append(0)
        shape.sites.append((it.statement, tuple(slots)))
        values = dict(zip(loops_of(it.statement), it.args))
        for f in phases.get(it.statement, ()):
            if not isinstance(f, GemmCall):
                continue
            note(px.substitute(f.when, values))
            for o in (f.a, f.b, f.c):
                off = px.substitute(o.offset, values)
                p = split(off, outer)
                if p is None:
                    note(off)
                elif px.names(p[0]):
                    key.setdefault(p[0], None)

    def walk(body):
        for it in body:
            if isinstance(it, Loop):
                note(it.init)
                note(it.cond)
                walk(it.body)
            elif isinstance(it, If):
                note(it.cond)
                walk(it.then)
                walk(it.orelse)
            elif isinstance(it, Call):
                call(it)
            else:  # (runs hold none: ``runs``)
                raise TypeError(f"a run holds a {type(it).__name__}")

    walk(items)
    shape.key = tuple(key)
    shape.parts = tuple(parts)
    return shape


def runs(items, capturable) -> list:
    """``items`` in order, consecutive capturable ones grouped into lists (runs) where a
    group holds a loop or more than one call: a graph of one launch saves nothing."""
    out: list = []
    group: list = []

    def flush():
        inside = list(walk(group))
        if (
            any(isinstance(it, Loop) for it in inside)
            or sum(isinstance(it, Call) for it in inside) > 1
        ):
            out.append(list(group))
        else:
            out.extend(group)
        group.clear()

    for it in items:
        if capturable(it):
            group.append(it)
        else:
            flush()
            out.append(it)
    flush()
    return out


def capturable_fn(launch_only: set[int]):
    """Whether an item of the tree can be in a run: ``launch_only`` holds the statements
    whose calls are launches and nothing else on the host."""
    # (by id, each item kept with its answer: a tree built anew, ``_fuse_calls``'s, freed
    # items whose ids later items took, and those got the answers of the freed ones: a loop
    # holding a metric's call captured, once in a few runs)
    memo: dict[int, tuple[object, bool]] = {}

    def ok(it) -> bool:
        got = memo.get(id(it), (None, None))[1]
        if got is None:
            if isinstance(it, Call):
                got = it.statement in launch_only
            elif isinstance(it, Loop):
                got = all(ok(b) for b in it.body)
            elif isinstance(it, If):
                got = all(ok(b) for b in it.then) and all(ok(b) for b in it.orelse)
            else:
                assert isinstance(it, (Free, SwapIn, SwapOut))
                got = False
            memo[id(it)] = (it, got)
        return got

    return ok


class Order:
    """What each call of a graph must wait for (its launches wait as one): the calls before it
    that wrote what it reads or writes, or read what it writes. What a call touches is
    named by resources (a buffer's id, the scratch memory's halves ``"scratch"`` and
    ``"scratch-top"``, ``"env"``); ``alias`` maps a resource
    to those whose bytes meet its (itself among them: the arena gives buffers that do not
    live at once the same bytes, a donee its donor's). The device runs calls that need not
    wait for each other at once (``depend``): a replay is a graph, not a chain."""

    def __init__(self, alias: dict):
        self.alias = alias
        self.writer: dict = {}  # resource -> the call that wrote it last
        self.readers: dict = {}  # resource -> the calls that read it since
        self.calls = 0
        # per call, the launches and products on the longest chain of waits that ends with
        # it (its own included); the longest of all: what a GPU must run one after another
        self.depth: list[int] = []
        self.chain = 0
        self.weight = 0  # (the last call's)

    def call(self, reads, writes, weight: int = 1) -> set[int]:
        """The calls the next call waits for (calls are numbered from 0); ``weight``: the
        launches and products the call makes, one after another (``chain``)."""
        after: set[int] = set()
        for r in reads:
            for a in self.alias.get(r, (r,)):
                if a in self.writer:
                    after.add(self.writer[a])
        for r in writes:
            for a in self.alias.get(r, (r,)):
                if a in self.writer:
                    after.add(self.writer[a])
                after.update(self.readers.get(a, ()))
        me = self.calls
        self.calls += 1
        self.depth.append(weight + max((self.depth[p] for p in after), default=0))
        self.weight = weight
        self.chain = max(self.chain, self.depth[-1])
        for r in writes:
            self.writer[r] = me
            self.readers[r] = set()
        for r in reads:
            if r not in writes:
                self.readers.setdefault(r, set()).add(me)
        return after

    def weigh(self, made: int):
        """The last call made ``made`` launches and products, where ``call`` was told its
        weight before they were known (a product's: ours, its functions one after another,
        or the BLAS's and what runs after it; none where it does not run at the call)."""
        if made == self.weight or not self.depth:
            return
        self.depth[-1] += made - self.weight
        self.weight = made
        self.chain = max(self.depth)


def aliases(layout, sizes: dict[int, int]) -> dict:
    """Per buffer of the arena ``layout``, the buffers whose bytes meet its (``sizes``: each
    buffer's bytes from its first output's offset)."""
    spans = sorted(
        (min(offs), min(offs) + sizes[sid], sid) for sid, offs in layout.offsets.items() if offs
    )
    out: dict = {sid: [sid] for _, _, sid in spans}
    for k, (lo, hi, a) in enumerate(spans):
        for lo2, _, b in spans[k + 1 :]:
            if lo2 >= hi:
                break
            out[a].append(b)
            out[b].append(a)
    return out


_FAR = 1 << 62  # beyond any loop value: the ranges of a site the capture never launched


def part_bounds(index, lo, hi, box, parts: int) -> list[tuple[int, int]] | None:
    """Per outer part, the least and most change of its value since a graph's capture at
    which every call site's loop values stay inside its box: value ``j`` of site ``k``
    ranged over ``lo[k, j]..hi[k, j]`` then, is shifted by the change of part
    ``index[k, j] - 1`` (none where it is 0) and must stay in ``0..box[k, j] - 1`` (a
    replay's check, worked out once); None where a value no part shifts is outside it."""
    bounds = [[-_FAR, _FAR] for _ in range(parts)]
    for row, los, his, boxes in zip(index.tolist(), lo.tolist(), hi.tolist(), box.tolist()):
        for p, a, b, n in zip(row, los, his, boxes):
            if p == 0:
                if a < 0 or b >= n:
                    return None
                continue
            got = bounds[p - 1]
            got[0] = max(got[0], -a)
            got[1] = min(got[1], n - 1 - b)
    return [(a, b) for a, b in bounds]


@dataclass
class _Graph:
    """One key's graph: the device's graph and its shift memory, the outer parts' values
    when it was captured, the least and most loop value each call site launched then, and
    what one replay does (loop steps, launches, products)."""

    graph: object
    shift: int
    at: tuple
    lo: np.ndarray
    hi: np.ndarray
    steps: int = 0
    launches: int = 0
    blas: int = 0
    chain: int = 0  # the launches and products on its longest chain of waits (``Order``)
    last: tuple = ()  # the outer parts' changes its shifts were set from (``deltas``)
    index: int = 0  # the device address of the shifts' indices (tl_set_shift's)
    # (per outer part: the least and most change of it since the capture that keeps every
    # call site inside its box; None where a site with no part is outside its own:
    # part_bounds)
    bounds: list | None = None


class GraphRun:
    """A run of the tree (``runs``) in the device runtime ``rt``: launched as the cpu
    runtime's tree would, until a key comes the second time; then captured, and replayed
    for that key from then on (see the module's text)."""

    def __init__(self, rt, items: list, scope: tuple[str, ...]):
        self.rt = rt
        self.shape = shape = analyze(items, scope, rt.loops_of, rt.phases, set(rt._repeats))
        # (as launches, its loops' bodies have runs of their own: a run that comes once, a
        # loop at the top of the tree, replays its loop's body)
        normal = [rt._item(it, scope) for it in items]

        def launches(env):
            for s in normal:
                s(env)

        self.launches = launches
        self.key_fns = [px.compile_packed(e, scope) for e in shape.key]
        self.part_fns = [px.compile_packed(e, scope) for e in shape.parts]
        n = len(shape.sites)
        self.index = np.zeros((n, ARGS), np.int64)  # per site and value: 1 + its part, or 0
        self.box = np.full((n, ARGS), _FAR, np.int64)  # per site and value: its box's bound
        for k, (sid, slots) in enumerate(shape.sites):
            self.index[k, : len(slots)] = slots
            st = rt.statements[sid]
            self.box[k, : len(st.loop_box)] = st.loop_box
        self.index32 = self.index.astype(np.int32).reshape(-1)
        sids = {sid for sid, _ in shape.sites}
        self.touched = rt.touched_of(sids)
        from timerlc.runtime.cuda import DEVICE

        # (the run's buffers' state after a replay)
        self.on_device = dict.fromkeys(sorted({p for sid in sids for p in rt.parts(sid)}), DEVICE)
        self.failable = [(sid, None) for sid in sorted(sids) if rt.can_fail(sid)]
        self._sites = iter(range(n))
        self.capture = self._build(items, scope)
        first = rt._name(rt.parts(shape.sites[0][0])[0]) if shape.sites else "nothing"
        self.name = f"{n} calls from {first} (depth {len(scope)})"
        self.graphs: dict[tuple, _Graph] = {}
        self.seen: set[tuple] = set()
        self.off = False
        self._current: _Graph | None = None  # the graph being captured

    def __call__(self, env):
        if self.off:
            return self.launches(env)
        key = tuple(f(env) for f in self.key_fns)
        g = self.graphs.get(key)
        if g is not None:
            return self._replay(g, env)
        if key not in self.seen:  # (the first time: launches, as a run that comes once)
            self.seen.add(key)
            if len(self.seen) > MAX_UNSEEN and not self.graphs:
                self.off = True
            return self.launches(env)
        if len(self.graphs) >= MAX_GRAPHS:
            self.off = True
            return self.launches(env)
        g = self._capture(env)
        if g is not None:
            self.graphs[key] = g

    # ------------------------------------------------------------------ capture
    def _parts(self, env) -> tuple:
        return tuple(f(env) for f in self.part_fns)

    def _capture(self, env) -> _Graph:
        """Capture the run at ``env`` (its launches made, not run), then replay it."""
        rt = self.rt
        device = rt.device
        rt.prepare(self.touched)
        n = len(self.shape.sites)
        shift = rt._alloc(8 * ARGS * max(n, 1))
        device.zero(shift, 8 * ARGS * max(n, 1))
        g = _Graph(
            None,
            shift,
            self._parts(env),
            np.full((n, ARGS), _FAR, np.int64),
            np.full((n, ARGS), -_FAR, np.int64),
            last=(0,) * len(self.shape.parts),
        )
        before = (rt.steps_left, rt.launches, rt.blas_calls)
        self._current = g
        rt._order = Order(rt.aliases())
        rt._capturing = True
        refused: Exception | None = None
        try:
            device.begin_capture()
            try:
                self.capture(env)
            except BaseException:
                # (the capture's own failure is the one to report, not its end's)
                with contextlib.suppress(Exception):
                    device.end_capture()
                raise
            g.graph = device.end_capture()
        except (TimerlcError, PlanError):  # (the run's own errors: as without graphs)
            raise
        except Exception as e:  # noqa: BLE001 - the device refused the capture (its error)
            refused = e
        finally:
            rt._capturing = False
            rt._shift = 0
            self._current = None
        if refused is not None:  # the run goes as launches from here, said once
            rt.steps_left, rt.launches, rt.blas_calls = before
            self.off = True
            rt.graph_refused(refused)
            self.launches(env)
            return None
        g.steps = before[0] - rt.steps_left
        g.launches = rt.launches - before[1]
        g.blas = rt.blas_calls - before[2]
        g.chain = rt._order.chain
        rt.chained -= g.launches + g.blas  # (counted as launched: the replay's chain instead)
        rt.graphs_made += 1
        if len(self.shape.parts):  # the shifts' indices, on the device for tl_set_shift
            g.index = rt._alloc(max(self.index32.nbytes, 8))
            device.upload(g.index, self.index32)
        if g.launches or g.blas:  # (the launches counted while captured: this replay's)
            self._launch(g)
        self._after(g)
        g.bounds = part_bounds(self.index, g.lo, g.hi, self.box, len(self.shape.parts))
        return g

    def _build(self, items, scope: tuple[str, ...]):
        """The run's items as the cpu runtime's tree runs them, but that each call notes
        its loop values' range and hands its site's shifts to its launches."""
        steps = [self._node(it, scope) for it in items]

        def run(env):
            for s in steps:
                s(env)

        return run

    def _node(self, it, scope: tuple[str, ...]):
        rt = self.rt
        if isinstance(it, (Loop, If)):
            return rt._control(it, scope, self._build)
        site = next(self._sites)
        st = rt.statements[it.statement]
        args = [px.compile_packed(a, scope) for a in it.args]

        def call(env):
            key = tuple(int(a(env)) for a in args)
            g = self._current
            lo, hi = g.lo[site], g.hi[site]
            for j, v in enumerate(key):
                lo[j] = min(lo[j], v)
                hi[j] = max(hi[j], v)
            rt._shift = g.shift + 8 * ARGS * site
            st.run(key)

        return call

    # ------------------------------------------------------------------ replay
    def _replay(self, g: _Graph, env):
        rt = self.rt
        deltas = tuple(p - a for p, a in zip(self._parts(env), g.at))
        if g.bounds is None or any(
            d < lo or d > hi for d, (lo, hi) in zip(deltas, g.bounds)
        ):  # a call outside its box: the launches refuse it, saying which
            return self.launches(env)
        rt.prepare(self.touched)
        if deltas != g.last:  # (the shifts are the parts' changes, set on the device)
            fn = rt.shift_function()
            rt.device.set_shift(fn, g.shift, g.index, self.index.size, deltas)
            g.last = deltas
        rt.steps_left -= g.steps
        if rt.steps_left < 0:
            rt._step()  # (raises: the plan's loops run on and on)
        if g.launches or g.blas:  # (a graph of nothing: the run's calls all skipped)
            self._launch(g)
        rt.launches += g.launches
        rt.blas_calls += g.blas
        self._after(g)

    def _launch(self, g: _Graph):
        """The graph's replay on the device (between marks, where the runtime times them)."""
        rt = self.rt
        if not rt.time_graphs:
            rt.device.replay(g.graph)
            return
        start = rt.device.mark()
        rt.device.replay(g.graph)
        rt.mark_replay(self.name, start, rt.device.mark())

    def _after(self, g: _Graph):
        """What the runtime knows after a replay: the run's buffers current on the device,
        its calls that can fail read at the next wait (the record names the call)."""
        rt = self.rt
        rt.fresh.update(self.on_device)
        rt._pending.extend(self.failable)
        rt.graph_replays += 1
        rt.graph_launches += g.launches + g.blas
        rt.chained += g.chain
