"""Lowering the plan's loop tree: each top-level item as one native function (``kir.Tree``).

A top-level loop (the training loop over iterations) stays in the runtime, which calls the
function of its body once per step: between two steps it streams the metrics and handles
Ctrl-C. Any other top-level item (a call, an ``if``) is one function. Frees and swaps are
top-level items the runtime runs itself.

Inside a function, every call of a statement with a kernel is a ``Launch`` (a direct call);
a statement without one (an environment call, an op the code generator does not lower yet)
is a ``Host`` call back into the runtime, which runs it with NumPy. After the kernel of an
output or a metric, a ``Host`` call in mode 1 lets the runtime record the points computed
and stream the metric's values.
"""

from __future__ import annotations

import dataclasses

from timerlc.codegen import kir
from timerlc.codegen.fuse import concat, fuse, seq
from timerlc.codegen.kir import If, Launch, Loop
from timerlc.codegen.lower import plan_expr as _expr
from timerlc.codegen.rows import loop_key
from timerlc.plan.items import Call, Free, Plan, SwapIn, SwapOut
from timerlc.plan.items import If as PlanIf
from timerlc.plan.items import Loop as PlanLoop

# the cuda target: two calls one after the other joined by ``fuse.seq`` where their kernel
# launches fewer functions than the two (False), or no more (True: larger kernels, whose
# steps the renderer may then join across statements, ``cuda.render``; PPO 2048's minibatch
# step in three kernels; not yet measured on a GPU: ``scripts/cuda_sweep.py --fuse-ties``)
SEQ_TIES = False


def lower_tree(
    plan: Plan,
    kernels: dict[int, kir.Kernel],
    fused: dict | None = None,
    horizontal: bool = False,
    cost=None,
    chains=None,
    rows=None,
) -> list[kir.Tree]:
    """The tree functions of ``plan`` (``kernels``: by statement, the kernels there are).
    Calls one after another at the same loop values launch one fused kernel where
    ``codegen.fuse`` can make one (``horizontal``: also where it can only put independent
    kernels one after the other, ``fuse.concat``, or, with ``cost``, what a kernel's
    launch costs, any two one after the other where that costs less, ``fuse.seq``, or,
    with ``chains``, the launches a kernel's chains save, where those of the two together
    save more: ``cuda.render.chain_saved``); ``fused`` collects them (by their
    statements). ``rows``: the loops that run by chunks of rows (``codegen.rows``, by
    ``rows.loop_key``), each a ``kir.Rows``."""
    recorded = {sid for _, sid, _ in plan.outputs + plan.metrics}
    fused = {} if fused is None else fused
    refused: set[tuple] = set()  # the runs fuse() refused (a run recurs in the tree)
    out = []
    for k, item in enumerate(plan.tree):
        if isinstance(item, (Free, SwapIn, SwapOut)):
            continue
        low = _Tree(plan, kernels, recorded, fused, refused, horizontal, cost, chains)
        low.rows = rows or {}
        if isinstance(item, PlanLoop):
            params = (item.var,)
            body = low.items(item.body, (item.var,))
        else:
            params = ()
            body = low.items((item,))
        scratch = max((k.scratch_bytes for k in low.launched.values()), default=0)
        out.append(kir.Tree(f"tree{k}", k, params, tuple(body), scratch))
    return out


class _Tree:
    def __init__(
        self,
        plan: Plan,
        kernels: dict,
        recorded: set,
        fused: dict,
        refused: set,
        horizontal: bool = False,
        cost=None,
        chains=None,
    ):
        self.plan, self.kernels, self.recorded = plan, kernels, recorded
        self.fused, self.refused, self.horizontal = fused, refused, horizontal
        self.cost = cost  # what a kernel's launch costs (lower_tree), with a cache
        self.chains = chains  # the launches a kernel's chains save (lower_tree)
        self.costs: dict[str, int] = {}
        self._cap: int | None = None
        self.launched: dict[str, kir.Kernel] = {}  # by name
        self.rows: dict = {}  # the loops that run by chunks of rows (``lower_tree``)

    def items(self, items, scope: tuple[str, ...] = ()) -> list:
        return self.fuse(self.lower(items, scope))

    def fuse(self, items: list) -> list:
        """Consecutive launches at the same loop values as one fused kernel where
        ``codegen.fuse`` makes one (``join_calls``); then, with ``chains``, two fused
        kernels one after the other as one where a chain then crosses them
        (``join_fused``: the fusion goes call by call, and a call that joined nothing
        before it, PPO's gathers of a minibatch's rows, whose loop reads no row of theirs
        as the first layer's does, may join the kernel the next calls made)."""
        out = self.pairs(items, self.join_calls)
        return self.pairs(out, self.join_fused) if self.chains is not None else out

    def pairs(self, items: list, join) -> list:
        """``items`` with each launch that ``join`` (its kernel's and the next launch's
        kernel, and a name: a kernel or None) joins with the next at the same loop values
        one launch, the joins kept (``fused``, ``refused``)."""
        out: list = []
        for it in items:
            prev = out[-1] if out else None
            if (
                isinstance(it, Launch)
                and isinstance(prev, Launch)
                and prev.args == it.args
                and len(prev.box) == len(it.box)
            ):
                sids = (prev.sids or (prev.sid,)) + (it.sids or (it.sid,))
                k = self.fused.get(sids)
                if k is None and sids not in self.refused:
                    a, b = self.launched[prev.kernel], self.launched[it.kernel]
                    k = join(a, b, f"f{sids[0]}_{len(self.fused)}")
                    if k is None:
                        self.refused.add(sids)
                    else:
                        self.fused[sids] = k
                if k is not None:
                    self.launched[k.name] = k
                    box = tuple(min(x, y) for x, y in zip(prev.box, it.box))
                    out[-1] = Launch(k.name, sids[0], it.args, box, sids)
                    continue
            out.append(it)
        return out

    def join_calls(self, a: kir.Kernel, b: kir.Kernel, name: str) -> kir.Kernel | None:
        """Kernel ``a`` (a call's or a fused one) then a call's kernel ``b`` as one, where
        ``codegen.fuse`` makes one (``fuse``; ``horizontal``: ``concat``, and with ``cost``
        ``seq`` where that costs less or a chain then crosses them), within the scratch
        memory's cap; else None."""
        k = fuse(a, b, name)
        if k is None and self.horizontal:
            k = concat(a, b, name)
        if k is None and self.horizontal and self.cost is not None:
            k = seq(a, b, name)
            both = self.cost_of(a) + self.cost_of(b)
            if k is not None and self.cost_of(k) >= both + SEQ_TIES and not self.chained(k, a, b):
                k = None
        if k is not None and self.horizontal and k.scratch_bytes > self.cap():
            # (the cuda target's scratch is one block, the largest any kernel needs: a fused
            # kernel's temporaries side by side must not grow it; PPO's second layers' two
            # products, 16 MiB each: 32 MiB)
            return None
        return k

    def join_fused(self, a: kir.Kernel, b: kir.Kernel, name: str) -> kir.Kernel | None:
        """Two fused kernels one after the other as one (``seq``) where a chain then
        crosses them (``chained``), within the scratch memory's cap; else None."""
        k = seq(a, b, name)
        if k is None or k.scratch_bytes > self.cap() or not self.chained(k, a, b):
            return None
        return k

    def chained(self, k: kir.Kernel, a: kir.Kernel, b: kir.Kernel) -> bool:
        """Whether kernel ``k`` (``a`` then ``b``, ``fuse.seq``) saves more launches by its
        chains than the two apart (``chains``: a chain across them, the weights'
        gradients of PPO's layers one function each where they were a kernel each), at
        no more of the launch's other cost (``cost``) than the two's."""
        if self.chains is None:
            return False
        saved = self.chains(k) - self.chains(a) - self.chains(b)
        return saved > 0 and self.cost_of(k) - saved < self.cost_of(a) + self.cost_of(b)

    def cost_of(self, k: kir.Kernel) -> int:
        """What a launch of kernel ``k`` costs (``cost``; one without it)."""
        if self.cost is None:
            return 1
        if k.name not in self.costs:
            self.costs[k.name] = self.cost(k)
        return self.costs[k.name]

    def cap(self) -> int:
        """The most scratch one statement's kernel takes: what a fused kernel may take."""
        if self._cap is None:
            self._cap = max((k.scratch_bytes for k in self.kernels.values()), default=0)
        return self._cap

    def lower(self, items, scope: tuple[str, ...] = ()) -> list:
        out = []
        for it in items:
            if isinstance(it, PlanLoop):
                inner = scope + (it.var,)
                body = tuple(self.items(it.body, inner))
                loop = Loop(it.var, _expr(it.init), _expr(it.cond), it.inc, body)
                by_rows = self.rows.get(loop_key(scope, it))
                if by_rows is not None:
                    chunk = Loop(
                        loop.var, loop.init, loop.cond, loop.inc, self.chunk(it.body, by_rows)
                    )
                    loop = kir.Rows(
                        loop,
                        chunk,
                        by_rows.lo,
                        by_rows.hi,
                        by_rows.grain,
                        by_rows.scratch,
                        tuple(by_rows.variants),
                    )
                out.append(loop)
            elif isinstance(it, PlanIf):
                out.append(
                    If(
                        _expr(it.cond),
                        tuple(self.items(it.then, scope)),
                        tuple(self.items(it.orelse, scope)),
                    )
                )
            elif isinstance(it, Call):
                out += self.call(it)
            else:  # frees and swaps are top-level items only (plan.items checks it)
                raise TypeError(f"a {type(it).__name__} inside a loop")
        return out

    def chunk(self, items, by_rows) -> tuple:
        """The body of a row loop's chunk: each call a launch of its statement's row variant
        (``codegen.rows.variant``), none fused (``row_loops`` took a body of calls and
        ``if``s, every call's statement with a kernel, none recorded)."""
        out = []
        for it in items:
            if isinstance(it, PlanIf):
                then, orelse = self.chunk(it.then, by_rows), self.chunk(it.orelse, by_rows)
                out.append(If(_expr(it.cond), then, orelse))
                continue
            k = by_rows.variants[it.statement]
            self.launched[k.name] = k
            args = tuple(_expr(a) for a in it.args)
            out.append(Launch(k.name, it.statement, args, self.loop_box(it.statement)))
        return tuple(out)

    def loop_box(self, sid: int) -> tuple[int, ...]:
        """The box of statement ``sid``'s calls' loop values (a launch checks them)."""
        st = self.plan.statement(sid)
        box = self.plan.buffer(sid).box
        return tuple(box[st.dims.index(d)] for d in st.loops)

    def call(self, it: Call) -> list:
        sid = it.statement
        args = tuple(_expr(a) for a in it.args)
        k = self.kernels.get(sid)
        if k is None:
            return [kir.Host(sid, 0, args)]
        self.launched[k.name] = k
        out = [Launch(k.name, sid, args, self.loop_box(sid))]
        if sid in self.recorded:
            out.append(kir.Host(sid, 1, args))
        return out


def by_level(plan: Plan, kernels: dict[int, kir.Kernel], recorded: set[int], cost=None) -> Plan:
    """``plan`` with the items of each body inside its loops in an order that makes fewer
    launches (for the cuda target, whose launches ``fuse.concat`` and ``fuse.seq`` join),
    where one does without its own buffers holding more bytes at once (``peak``):

    - two ``if``s of one condition with only calls between them are one, the calls in
      both branches (``joined``: the schedule parts a minibatch step into several
      ``if c1 <= 31`` blocks, the weight gradients between them, unconditional: zeros at
      the last step);
    - of the schedule's order and two others, among those whose own buffers (the ones
      only the body uses) hold no more bytes at once than the schedule's order's or the
      one by level's (give or take ``PEAK_SLACK``), the one that lowers to the fewest
      launches (``cost``: what a kernel's launch costs, the cuda renderer's functions,
      ``render.functions``; default one), then the fewest bytes. The others: each run of
      consecutive movable calls by level (``arrange``: a call's level is one more than
      the highest of the earlier calls of the run it must follow; a minibatch step's Adam
      moments, then its updates, two launches), and the whole body as a list schedule
      (``scheduled``): each next item one whose predecessors are placed, first a movable
      call that joins the launch before it at no cost, else the one that frees the most
      bytes, else an item that is not a movable call that a movable call waits for (it
      parts runs of calls anyway), else a movable call, else the first by the schedule's
      order (an item nothing waits for stays late: a metric's ``if`` at the step's end,
      which would part its CUDA graph). A call moves across an ``if`` it touches nothing
      of (the learning rate's calls join the minibatch indices' slice).

    A movable call is a call of a statement with a kernel that neither records (an
    output's, a metric's), nor takes a donor's memory, nor touches an environment's state;
    the other items (those, an ``if``, a loop) keep their order among themselves. The
    top-level items keep their order (the memory plan numbers them)."""
    from collections import Counter

    from timerlc.plan.arena import output_bytes
    from timerlc.plan.items import walk

    low = _Tree(plan, kernels, recorded, {}, set(), True, cost)
    uses_of: dict[int, frozenset] = {}

    def statement_uses(sid: int) -> frozenset:
        """The buffers a call of statement ``sid`` writes or reads."""
        if sid not in uses_of:
            st = plan.statement(sid)
            uses_of[sid] = frozenset(
                {sid} | {r.src for n in st.nodes for r in n.inputs if r.stored}
            )
        return uses_of[sid]

    def used(items) -> Counter:
        """The buffers the calls of ``items`` use, each as often as one of them does."""
        got: Counter = Counter()
        for c in walk(items):
            if isinstance(c, Call):
                got.update(statement_uses(c.statement))
        return got

    everywhere = used(plan.tree)
    size: dict[int, int] = {}

    def nbytes(b: int) -> int:
        if b not in size:
            size[b] = sum(output_bytes(plan, b))
        return size[b]

    def launched_uses(x) -> set:
        """The buffers a lowered item uses (a fused launch: each of its statements')."""
        if isinstance(x, Launch):
            return set().union(*(statement_uses(sid) for sid in (x.sids or (x.sid,))))
        if isinstance(x, kir.Host):
            return set(statement_uses(x.sid))
        inner = x.then + x.orelse if isinstance(x, kir.If) else getattr(x, "body", ())
        return set().union(set(), *(launched_uses(y) for y in inner))

    def peak(order: list) -> int:
        """The most bytes the buffers that only the calls of ``order`` use hold at once,
        each from the first launch that uses it to the last, as ``order`` lowers (a fused
        kernel's calls at once, as ``plan.arena`` has them)."""
        mine = used(order)
        inside = {b for b in mine if mine[b] == everywhere[b]}
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        steps = low.items(tuple(order))
        for k, x in enumerate(steps):
            for b in launched_uses(x) & inside:
                first.setdefault(b, k)
                last[b] = k
        return max(
            (sum(nbytes(b) for b in first if first[b] <= k <= last[b]) for k in range(len(steps))),
            default=0,
        )

    def cost_of(name: str) -> int:
        return low.cost_of(low.launched[name])

    def launches(items: list) -> int:
        return sum(
            cost_of(x.kernel)
            for x in kir.walk_tree(low.items(tuple(items)))
            if isinstance(x, Launch)
        )

    def one(items: list) -> int | None:
        """What the calls ``items`` cost as one launch; None where they are not one."""
        got = low.items(tuple(items))
        return cost_of(got[0].kernel) if len(got) == 1 and isinstance(got[0], Launch) else None

    def touches(it) -> tuple[set, set]:
        """The buffers item ``it`` reads, and those it writes (a donor's among them)."""
        reads, writes = set(), set()
        for c in walk((it,)):
            if isinstance(c, Call):
                reads |= statement_uses(c.statement) - {c.statement}
                writes.add(c.statement)
                donor = plan.buffer(c.statement).donor
                if donor is not None:
                    writes.add(donor)
        return reads, writes

    def movable(it) -> bool:
        if not isinstance(it, Call) or it.statement in recorded:
            return False
        k = kernels.get(it.statement)
        return (
            k is not None
            and plan.buffer(it.statement).donor is None
            and not k.shared
            and not any(s.state for s in k.slots)
        )

    def after(seen: list, it) -> list[int]:
        """The indices of the items of ``seen`` (their ``touches``) that ``it`` must
        follow: that wrote what it reads or writes, or read what it writes."""
        reads, writes = touches(it)
        return [k for k, (r2, w2) in enumerate(seen) if w2 & (reads | writes) or r2 & writes]

    def arrange(run: list) -> list:
        if len(run) < 3:
            return run
        level: list[int] = []
        seen: list[tuple[set, set]] = []
        for it in run:
            level.append(max((level[k] + 1 for k in after(seen, it)), default=0))
            seen.append(touches(it))
        order = sorted(range(len(run)), key=lambda k: (level[k], k))
        return [run[k] for k in order]

    def by_runs(items: list) -> list:
        out: list = []
        run: list = []
        for it in items:
            if movable(it):
                run.append(it)
                continue
            out += arrange(run)
            run = []
            out.append(it)
        return out + arrange(run)

    def scheduled(items: list) -> list:
        n = len(items)
        seen = [touches(it) for it in items]
        fixed = [not movable(it) for it in items]
        preds: list[set[int]] = []
        last_fixed = None
        for k, it in enumerate(items):
            p = set(after(seen[:k], it))
            if fixed[k]:
                if last_fixed is not None:
                    p.add(last_fixed)
                last_fixed = k
            preds.append(p)
        uses = [used((it,)) for it in items]
        left = used(items)  # (a buffer only these items use: its uses not placed yet)
        inside = {b for b in left if left[b] == everywhere[b]}
        # (what counts: a quarter of the largest such buffer, at least a MiB)
        unit = max([1 << 20] + [nbytes(b) // 4 for b in inside])

        def freed(k: int) -> int:
            """What placing item ``k`` frees of the bytes the body's own buffers hold, in
            ``unit``s: a buffer's share for each of its uses left; a new one's taken."""
            got = 0.0
            for b, n in uses[k].items():
                if b not in inside:
                    continue
                if left[b] == everywhere[b] and n < left[b]:  # (its first use)
                    got -= nbytes(b)
                elif left[b] != everywhere[b]:
                    got += nbytes(b) * n / left[b]
            return int(got / unit)

        placed: list[int] = []
        done: set[int] = set()
        group: list = []  # the movable calls the last launch holds, and what it costs
        paid = 0
        while len(placed) < n:
            ready = [k for k in range(n) if k not in done and preds[k] <= done]
            pick = None
            if group:  # (a call that joins the launch at no cost)
                for k in [k for k in ready if not fixed[k]][:SCHEDULE_TRIES]:
                    got = one(group + [items[k]])
                    if got is not None and got <= paid:
                        pick = k
                        break
            if pick is None:
                # (the one that frees the most; else an item that is not a movable call
                # and that one is waiting for: it parts runs anyway; else a movable call;
                # the others last, as the schedule has them, so that a run does not part
                # where nothing waits: a metric's if, at the step's end)
                waited = {k for j in range(n) if j not in done and not fixed[j] for k in preds[j]}
                pick = max(
                    ready,
                    key=lambda k, waited=waited: (
                        freed(k),
                        fixed[k] and k in waited,
                        not fixed[k],
                        -k,
                    ),
                )
            placed.append(pick)
            done.add(pick)
            left.subtract(uses[pick])
            if fixed[pick]:
                group, paid = [], 0
                continue
            got = one(group + [items[pick]]) if group else None
            if got is not None:
                group, paid = group + [items[pick]], got
            else:
                group, paid = [items[pick]], one([items[pick]]) or 0
        return [items[k] for k in placed]

    def copied(it):
        """``it`` anew, its calls other objects (the arena tells calls apart by identity)."""
        if isinstance(it, Call):
            return Call(it.statement, it.args)
        if isinstance(it, PlanLoop):
            return PlanLoop(it.var, it.init, it.cond, it.inc, tuple(map(copied, it.body)))
        if isinstance(it, PlanIf):
            return PlanIf(it.cond, tuple(map(copied, it.then)), tuple(map(copied, it.orelse)))
        return it

    def merged(items) -> tuple[list, set[int]]:
        """``items`` with each two ``if``s of one condition with only calls between them as
        one (a condition reads only the loop values, which nothing in a body changes), and
        the positions of the ``if``s made so: ``if c: A else: B; X; if c: C else: D`` is
        ``X; if c: A C else: B D`` where the ``if``s hold a call the host records and the
        calls ``X`` may run before the first (``movable``, touching nothing its branches
        write, writing nothing they read), else ``if c: A X C else: B X D`` (the calls in
        both branches, where they may join a branch's launches). A branch with a host's
        record is no device graph's (``runtime.graphs``): PPO's minibatch clip fraction,
        in both branches of its statistics' ``if``, was a launch of its own each step."""
        out = list(items)
        made: set[int] = set()
        k = 0
        while k < len(out):
            first = out[k]
            j = k + 1
            while j < len(out) and isinstance(out[j], Call):
                j += 1
            if not (
                isinstance(first, PlanIf)
                and j < len(out)
                and isinstance(out[j], PlanIf)
                and out[j].cond == first.cond
            ):
                k += 1
                continue
            between, last = tuple(out[k + 1 : j]), out[j]
            if before(between, first) and recording(first, last):
                joint = PlanIf(first.cond, first.then + last.then, first.orelse + last.orelse)
                out[k : j + 1] = [*between, joint]
                made.add(k + len(between))
                k += len(between)
                continue
            then = first.then + between + last.then
            orelse = first.orelse + tuple(map(copied, between)) + last.orelse
            out[k : j + 1] = [PlanIf(first.cond, then, orelse)]
            made.add(k)
        return out, made

    def recording(*its) -> bool:
        """Whether the items ``its`` hold a call whose values the host records."""
        return any(isinstance(c, Call) and c.statement in recorded for c in walk(its))

    def before(calls: tuple, it) -> bool:
        """Whether the ``calls`` right after item ``it`` may run before it (``merged``)."""
        if not calls or not all(movable(c) for c in calls):
            return False
        reads, writes = touches(it)
        return not any(w & (reads | writes) or r & writes for r, w in map(touches, calls))

    def joined(order: list) -> list:
        """``order`` with its ``if``s of one condition joined (``merged``), the branches of
        each made so arranged anew (``body``)."""
        out, made = merged(order)
        for k in made:
            out[k] = PlanIf(out[k].cond, body(out[k].then), body(out[k].orelse))
        return out

    def body(items) -> tuple:
        inner: list = []
        for it in merged(items)[0]:
            if isinstance(it, PlanLoop):
                it = PlanLoop(it.var, it.init, it.cond, it.inc, body(it.body))
            elif isinstance(it, PlanIf):
                it = PlanIf(it.cond, body(it.then), body(it.orelse))
            inner.append(it)
        candidates = [inner]
        for order in (by_runs(inner), scheduled(inner)):
            candidates.append(inner if order == inner else joined(order))
        costs = [(peak(c), launches(c)) for c in candidates]
        # (no more than the schedule's order's or the one by level's, give or take a MiB)
        budget = min(costs[0][0], costs[1][0]) + PEAK_SLACK
        best = min(
            (k for k in range(len(candidates)) if costs[k][0] <= budget),
            key=lambda k: (costs[k][1], costs[k][0], k),
        )
        return tuple(candidates[best])

    tree = tuple(
        PlanLoop(it.var, it.init, it.cond, it.inc, body(it.body))
        if isinstance(it, PlanLoop)
        else it
        for it in plan.tree
    )
    return plan if tree == plan.tree else dataclasses.replace(plan, tree=tree)


PEAK_SLACK = 1 << 20  # bytes an order's own buffers may hold at once above the budget
SCHEDULE_TRIES = 8  # the ready calls a list schedule tries to join to the launch before
