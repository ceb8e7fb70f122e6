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
from timerlc.codegen.fuse import concat, fuse
from timerlc.codegen.kir import If, Launch, Loop
from timerlc.codegen.lower import plan_expr as _expr
from timerlc.plan.items import Call, Free, Plan, SwapIn, SwapOut
from timerlc.plan.items import If as PlanIf
from timerlc.plan.items import Loop as PlanLoop


def lower_tree(
    plan: Plan,
    kernels: dict[int, kir.Kernel],
    fused: dict | None = None,
    horizontal: bool = False,
) -> list[kir.Tree]:
    """The tree functions of ``plan`` (``kernels``: by statement, the kernels there are).
    Calls one after another at the same loop values launch one fused kernel where
    ``codegen.fuse`` can make one (``horizontal``: also where it can only put independent
    kernels one after the other, ``fuse.concat``); ``fused`` collects them (by their
    statements)."""
    recorded = {sid for _, sid, _ in plan.outputs + plan.metrics}
    fused = {} if fused is None else fused
    refused: set[tuple] = set()  # the runs fuse() refused (a run recurs in the tree)
    out = []
    for k, item in enumerate(plan.tree):
        if isinstance(item, (Free, SwapIn, SwapOut)):
            continue
        low = _Tree(plan, kernels, recorded, fused, refused, horizontal)
        if isinstance(item, PlanLoop):
            params = (item.var,)
            body = low.items(item.body)
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
    ):
        self.plan, self.kernels, self.recorded = plan, kernels, recorded
        self.fused, self.refused, self.horizontal = fused, refused, horizontal
        self._cap: int | None = None
        self.launched: dict[str, kir.Kernel] = {}  # by name

    def items(self, items) -> list:
        return self.fuse(self.lower(items))

    def fuse(self, items: list) -> list:
        """Consecutive launches at the same loop values as one fused kernel where
        ``codegen.fuse`` makes one."""
        out: list = []
        for it in items:
            prev = out[-1] if out else None
            if (
                isinstance(it, Launch)
                and isinstance(prev, Launch)
                and prev.args == it.args
                and len(prev.box) == len(it.box)
            ):
                sids = (prev.sids or (prev.sid,)) + (it.sid,)
                k = self.fused.get(sids)
                if k is None and sids not in self.refused:
                    a = self.launched[prev.kernel]
                    name = f"f{sids[0]}_{len(self.fused)}"
                    k = fuse(a, self.kernels[it.sid], name)
                    if k is None and self.horizontal:
                        k = concat(a, self.kernels[it.sid], name)
                    if k is not None and self.horizontal and k.scratch_bytes > self.cap():
                        # (the cuda target's scratch is one block, the largest any kernel
                        # needs: a fused kernel's temporaries side by side must not grow it;
                        # PPO's second layers' two products, 16 MiB each: 32 MiB)
                        k = None
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

    def cap(self) -> int:
        """The most scratch one statement's kernel takes: what a fused kernel may take."""
        if self._cap is None:
            self._cap = max((k.scratch_bytes for k in self.kernels.values()), default=0)
        return self._cap

    def lower(self, items) -> list:
        out = []
        for it in items:
            if isinstance(it, PlanLoop):
                out.append(
                    Loop(
                        it.var, _expr(it.init), _expr(it.cond), it.inc, tuple(self.items(it.body))
                    )
                )
            elif isinstance(it, PlanIf):
                out.append(
                    If(_expr(it.cond), tuple(self.items(it.then)), tuple(self.items(it.orelse)))
                )
            elif isinstance(it, Call):
                out += self.call(it)
            else:  # frees and swaps are top-level items only (plan.items checks it)
                raise TypeError(f"a {type(it).__name__} inside a loop")
        return out

    def call(self, it: Call) -> list:
        sid = it.statement
        args = tuple(_expr(a) for a in it.args)
        k = self.kernels.get(sid)
        if k is None:
            return [kir.Host(sid, 0, args)]
        self.launched[k.name] = k
        st = self.plan.statement(sid)
        box = self.plan.buffer(sid).box
        loop_box = tuple(box[st.dims.index(d)] for d in st.loops)
        out = [Launch(k.name, sid, args, loop_box)]
        if sid in self.recorded:
            out.append(kir.Host(sid, 1, args))
        return out


def by_level(plan: Plan, kernels: dict[int, kir.Kernel], recorded: set[int]) -> Plan:
    """``plan`` with each run of consecutive calls inside its loops in an order that makes
    fewer launches, where one does (for the cuda target, whose launches ``fuse.concat``
    joins when independent): the calls by their level (a call's is one more than the
    highest of the earlier calls of the run it must follow: that wrote what it reads or
    writes, or read what it writes), in their order within a level. A minibatch step's Adam
    updates came as six dependent pairs (a tensor's moments, then its update joined with the
    next tensor's moments): now every moment, then every update, two launches.

    A run holds only calls of statements with a kernel that neither record (an output's, a
    metric's), nor take a donor's memory, nor touch an environment's state; the others, an
    ``if`` and a loop keep their places. The top-level items keep their order (the memory
    plan numbers them)."""

    def touches(sid: int) -> tuple[set, set]:
        reads = {r.src for n in plan.statement(sid).nodes for r in n.inputs if r.stored}
        return reads, {sid}

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

    def launches(run: list) -> int:
        low = _Tree(plan, kernels, recorded, {}, set(), horizontal=True)
        return sum(isinstance(x, Launch) for x in low.items(tuple(run)))

    def arrange(run: list) -> list:
        if len(run) < 3:
            return run
        level: list[int] = []
        seen: list[tuple[set, set]] = []
        for it in run:
            reads, writes = touches(it.statement)
            lv = 0
            for k, (r2, w2) in enumerate(seen):
                if w2 & (reads | writes) or r2 & writes:
                    lv = max(lv, level[k] + 1)
            level.append(lv)
            seen.append((reads, writes))
        order = sorted(range(len(run)), key=lambda k: (level[k], k))
        sorted_run = [run[k] for k in order]
        if order == list(range(len(run))) or launches(sorted_run) >= launches(run):
            return run
        return sorted_run

    def body(items) -> tuple:
        out: list = []
        run: list = []
        for it in items:
            if movable(it):
                run.append(it)
                continue
            out += arrange(run)
            run = []
            if isinstance(it, PlanLoop):
                it = PlanLoop(it.var, it.init, it.cond, it.inc, body(it.body))
            elif isinstance(it, PlanIf):
                it = PlanIf(it.cond, body(it.then), body(it.orelse))
            out.append(it)
        out += arrange(run)
        return tuple(out)

    tree = tuple(
        PlanLoop(it.var, it.init, it.cond, it.inc, body(it.body))
        if isinstance(it, PlanLoop)
        else it
        for it in plan.tree
    )
    return plan if tree == plan.tree else dataclasses.replace(plan, tree=tree)
