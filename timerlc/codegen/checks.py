"""Checks that cannot fail: the ranges of the integers kernels store, and the checks they
decide.

A kernel checks what its loads will index or what an environment is given before it
computes (``if not(0 <= a and a < 2): fail 1``: an environment's step checks each action).
Where the checked values are integers that kernels stored, their range is known from the
stores: an action drawn by ``categorical`` over two logits is the position of the largest
of two values, ``0`` or the loop variable of ``1 ..< 2``. ``prove`` takes such checks out:
each ``if`` whose branch only fails and whose condition never holds at any value the
kernel can see.

The ranges (``_Ranges``) are intervals of the ``bool``, ``i32`` and ``i64`` values:

- a buffer's, the union of every value any kernel stores into it (a statement without a
  kernel, whose values the interpreter writes, gives none; so does a buffer that shares
  its memory with another's values: a ``home``, a buffer whose values live in it, a donor
  and the buffer that takes its memory; and an environment's state);
- a local's, the union of every value the kernel sets it to (a loop's variable: its
  bounds); a temporary's, the union of every value the kernel stores into it; a
  statement's kernel's arguments, its statement's box (the runtime checks a call's loop
  values against it before the call); anything else: none.

A value that depends on itself (``acc = acc + x``, a buffer that stores loads of itself)
has none. ``None`` is "any value": a check is only taken out where its condition is
decided for every value in the intervals.
"""

from __future__ import annotations

import dataclasses

from timerlc.codegen import kir
from timerlc.codegen.kir import (
    Bin,
    Cast,
    Const,
    Fail,
    For,
    If,
    Let,
    Load,
    Ref,
    Sel,
    Store,
    Un,
)
from timerlc.codegen.lower import fits, interval

_INTS = ("bool", "i32", "i64")
SMALL_TEMP = 8  # the most elements of a temporary whose dynamic stores become selects
_BUSY = object()  # (a range being found: asked again, the value depends on itself)


def prove(plan, kernels: list[kir.Kernel]) -> list[kir.Kernel]:
    """``kernels`` with the checks their stores' ranges decide taken out (``_Ranges``)."""
    ranges = _Ranges(plan, kernels)
    return [ranges.proved(k) for k in kernels]


def _union(a, b):
    if a is None or b is None:
        return None
    return (min(a[0], b[0]), max(a[1], b[1]))


class _Ranges:
    def __init__(self, plan, kernels: list[kir.Kernel]):
        # the stores into each buffer (statement, output), with their kernel
        self.stores: dict[tuple[int, int], list] = {}
        self.unknown: set[tuple[int, int]] = set()
        shared = set()
        for b in plan.buffers:
            if b.home is not None:
                shared |= {b.id, b.home.buffer}
            if b.donor is not None:
                shared |= {b.id, b.donor}
        with_kernel = {k.sid for k in kernels}
        for st in plan.statements:
            if st.id not in with_kernel or st.id in shared:
                for out in range(len(st.node.types)):
                    self.unknown.add((st.id, out))
        self.kernel_of: dict[str, _Kernel] = {}
        for k in kernels:
            st = plan.statement(k.sid)
            box = plan.buffer(k.sid).box
            # (a call's loop values lie in the statement's box: the runtime checks them
            # before it calls the kernel)
            loops = {}
            if len(k.params) == len(st.loops) and k.repeat == 1:
                loops = {p: (0, box[st.dims.index(d)] - 1) for p, d in zip(k.params, st.loops)}
            kk = self.kernel_of[k.name] = _Kernel(self, k, loops)
            for s in kir.walk_tree(k.body):
                if isinstance(s, Store) and s.buf in kk.slots:
                    slot = kk.slots[s.buf]
                    key = (slot.sid, slot.out)
                    self.stores.setdefault(key, []).append((kk, s.value))
                elif isinstance(s, (kir.Gemm, kir.Permute)):
                    for name in kir.own_buffers(s)[1]:
                        if name in kk.slots:
                            slot = kk.slots[name]
                            self.unknown.add((slot.sid, slot.out))
        self.buffers: dict[tuple[int, int], object] = {}

    def buffer(self, key: tuple[int, int]):
        """The range of the values of buffer ``key`` (statement, output), or None."""
        got = self.buffers.get(key)
        if got is _BUSY:
            return None
        if key in self.buffers:
            return got
        if key in self.unknown or key not in self.stores:
            self.buffers[key] = None
            return None
        self.buffers[key] = _BUSY
        r = None
        for n, (kk, value) in enumerate(self.stores[key]):
            v = kk.value(value)
            r = v if n == 0 else _union(r, v)
            if r is None:
                break
        self.buffers[key] = r
        return r

    def proved(self, k: kir.Kernel) -> kir.Kernel:
        body = self.kernel_of[k.name].without_checks(k.body)
        return k if body == k.body else dataclasses.replace(k, body=body)


class _Kernel:
    """The ranges of one kernel's locals and temporaries."""

    def __init__(self, ranges: _Ranges, k: kir.Kernel, loops: dict):
        self.ranges, self.k = ranges, k
        self.slots = {s.name: s for s in k.slots if not s.state}
        self.temps = {t.name for t in k.temps}
        self.sets: dict[str, list] = {}  # a local: the values it is set to (a loop: bounds)
        self.temp_stores: dict[str, list] = {}
        for s in kir.walk_tree(k.body):
            if isinstance(s, Let):
                self.sets.setdefault(s.name, []).append(s.value)
            elif isinstance(s, For):
                self.sets.setdefault(s.var, []).append(s)
            elif isinstance(s, Store) and s.buf in self.temps:
                self.temp_stores.setdefault(s.buf, []).append(s.value)
            elif isinstance(s, (kir.Gemm, kir.Permute)):
                for name in kir.own_buffers(s)[1]:
                    self.temp_stores.setdefault(name, []).append(None)
        for p in k.params:
            self.sets.setdefault(p, []).append(("box", loops[p]) if p in loops else None)
        self.memo: dict = {}
        self.sizes = {t.name: t.size for t in k.temps}
        self.each: list[str] = []  # (the loops _at_each made)

    def _all(self, values):
        r = None
        for n, v in enumerate(values):
            if isinstance(v, tuple):  # (a loop value: its box)
                got = v[1]
            elif isinstance(v, For):
                got = self._loop(v)
            else:
                got = None if v is None else self.value(v)
            r = got if n == 0 else _union(r, got)
            if r is None:
                return None
        return r

    def _loop(self, s: For):
        lo, hi = self.value(s.lo), self.value(s.hi)
        if lo is None or hi is None or hi[1] - 1 < lo[0]:
            return None
        return (lo[0], hi[1] - 1)

    def _named(self, table: dict, name: str):
        key = ("name", id(table), name)
        got = self.memo.get(key)
        if got is _BUSY:
            return None
        if key in self.memo:
            return got
        self.memo[key] = _BUSY
        values = table.get(name)
        r = self._all(values) if values else None
        self.memo[key] = r
        return r

    def value(self, e):
        """The range of integer (or bool) expression ``e``, or None: ``lower.interval``'s
        arithmetic, its leaves' ranges from the kernels' stores (``_leaf``)."""
        return interval(e, None, self._leaf) if e.dtype in _INTS else None

    def _leaf(self, e):
        """The range of an expression ``interval`` does not cover, or None."""
        if e.dtype not in _INTS:
            return None
        if isinstance(e, Const):  # (a bool)
            v = int(e.value)
            return (v, v)
        if isinstance(e, Ref):
            return self._named(self.sets, e.name)
        if isinstance(e, Load):
            if e.buf in self.temps:
                return self._named(self.temp_stores, e.buf)
            slot = self.slots.get(e.buf)
            return None if slot is None else self.ranges.buffer((slot.sid, slot.out))
        if isinstance(e, Cast):
            if e.x.dtype not in _INTS:
                return None
            return fits(self.value(e.x), e.dtype)
        if isinstance(e, Sel):
            got = self.decide(e.cond)
            if got is not None:  # (one branch only: a negative index's wrap never taken)
                return fits(self.value(e.a if got else e.b), e.dtype)
            return fits(_union(self.value(e.a), self.value(e.b)), e.dtype)
        if isinstance(e, Bin) and e.op in kir.COMPARE or isinstance(e, Un) and e.op == "not":
            got = self.decide(e)
            return (0, 1) if got is None else (int(got), int(got))
        if isinstance(e, Bin) and e.op in ("and", "or"):
            got = self.decide(e)
            return (0, 1) if got is None else (int(got), int(got))
        if isinstance(e, Bin) and e.op in ("minimum", "maximum"):
            a, b = self.value(e.a), self.value(e.b)
            if a is None or b is None:
                return None
            pick = min if e.op == "minimum" else max
            return pick(a[0], b[0]), pick(a[1], b[1])
        return None

    def decide(self, c) -> bool | None:
        """Whether condition ``c`` holds at every value (True), at none (False), or None."""
        if isinstance(c, Const) and c.dtype == "bool":
            return bool(c.value)
        if isinstance(c, Un) and c.op == "not":
            got = self.decide(c.x)
            return None if got is None else not got
        if isinstance(c, Bin) and c.op in ("and", "or"):
            a, b = self.decide(c.a), self.decide(c.b)
            if c.op == "and":
                if a is False or b is False:
                    return False
                return True if a is True and b is True else None
            if a is True or b is True:
                return True
            return False if a is False and b is False else None
        if isinstance(c, Bin) and c.op in kir.COMPARE and c.a.dtype in _INTS:
            a, b = self.value(c.a), self.value(c.b)
            if a is None or b is None:
                return None
            table = {
                "lt": (a[1] < b[0], a[0] >= b[1]),
                "le": (a[1] <= b[0], a[0] > b[1]),
                "gt": (a[0] > b[1], a[1] <= b[0]),
                "ge": (a[0] >= b[1], a[1] < b[0]),
                "eq": (a[0] == a[1] == b[0] == b[1], a[1] < b[0] or a[0] > b[1]),
                "ne": (a[1] < b[0] or a[0] > b[1], a[0] == a[1] == b[0] == b[1]),
            }
            yes, no = table[c.op]
            return True if yes else (False if no else None)
        return None

    def without_checks(self, body) -> tuple:
        """``body`` without the ``if``s that only fail where their condition never holds
        (and without the loops that held only those); a store into a small temporary at an
        index its range keeps inside it, a store at each of its elements (``_at_each``)."""
        out = []
        for s in body:
            if isinstance(s, Store) and s.buf in self.temps:
                s = self._at_each(s)
            if isinstance(s, If) and not s.orelse and all(isinstance(x, Fail) for x in s.then):
                if self.decide(s.cond) is False:
                    continue
            elif isinstance(s, If):
                s = dataclasses.replace(
                    s, then=self.without_checks(s.then), orelse=self.without_checks(s.orelse)
                )
            elif isinstance(s, For):
                inner = self.without_checks(s.body)
                if not inner:
                    continue
                s = dataclasses.replace(s, body=inner)
            out.append(s)
        return tuple(out)

    def _at_each(self, s: Store):
        """A store ``t[idx] = v`` into a temporary of at most ``SMALL_TEMP`` elements, at an
        index loaded at the point (a gradient of a gather into its few actions) and
        whose range lies inside it, as ``t[j] = idx == j ? v : t[j]`` for each element
        ``j`` (``v``'s loads of ``t[idx]`` at ``t[j]``): every index a constant, so that
        the temporary can be registers and the loop around it vectorized. The same
        values: the other elements stay, and ``v`` is computed before its element changes.
        Else ``s``."""
        size = self.sizes.get(s.buf, 0)
        if size > SMALL_TEMP or not any(isinstance(x, Load) for x in kir.subexprs(s.index)):
            return s  # (a loop's variable: a loop written out makes it a constant)
        r = self.value(s.index)
        if r is None or r[0] < 0 or r[1] >= size:
            return s
        if any(
            isinstance(x, Load) and x.buf == s.buf and x.index != s.index
            for x in kir.subexprs(s.value)
        ):
            return s  # (another element of t: left as is)
        j = f"j${len(self.each)}"
        self.each.append(j)
        at = Ref(j)

        def swap(e):
            if isinstance(e, Load) and e.buf == s.buf:
                return Load(e.buf, at, e.dtype)
            return e

        value = Sel(
            Bin("eq", s.index, at, "bool"),
            kir.rewrite(s.value, swap),
            Load(s.buf, at, s.value.dtype),
            s.value.dtype,
        )
        return For(j, Const("i64", 0), Const("i64", size), (Store(s.buf, at, value),))
