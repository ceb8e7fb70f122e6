"""Gram chains: a small gram and the column sums of a statement's rows, computed with the
statement itself, a point at a time (the cpu target).

A weight's gradient over a layer of few inputs is a gram ``x^T @ dz`` over the points'
rows (``x``: the observations, four columns; ``dz``: the layer's gradient, a row of 64 a
point), its bias's gradient the column sums of ``dz``. Where ``dz`` is a statement whose
kernel is one loop nest over the rows, an element a point (REINFORCE's first layer:
``(dlogits @ w2^T) * (1 - h*h)``, 32,768 rows of 64 floats at 256 x 128), that kernel
wrote 8 MiB which the gram (the BLAS) and the sums then read back. A gram chain is one
kernel that computes ``dz``'s element into a local and adds it, at once, into the gram's
rows and into the sums: ``dz`` is written nowhere. It is a reduction over the rows
(``For.reduce``), which the renderer hands to the threads in chunks
(``llvm.render.outline_reduce``); the gram's accumulators are float64 (a float32
product's exact value, summed in float64: at least as accurate as the BLAS's float32
sums) and its result is rounded once, into the gram's buffer.

``gram_chains`` finds, in each list of the tree functions' launches, a statement kernel
``P`` that stores one buffer ``X`` a point at a time (a nest of constant loops over the
rows, then the row's elements, row-major) and, after it at the same loop values, the
launches of every statement that reads ``X``, each one of:

- a gram whose right operand is ``X`` over all its rows: ``C = A^T @ X``, ``A`` a matrix
  of at most ``GRAM_M`` columns whose rows are ``X``'s (``Gemm``, ``ta``), first in a
  statement kernel whose other statements read no ``X`` (a guarded copy of the product into
  the buffer): those run after the chain's loop;
- a reduction over ``X``'s rows (a kernel, fused or not, whose one loop over ``X`` is a
  ``For.reduce`` nest of the same rows, reading ``X`` at the point ``P`` stored it), with
  what it does before that loop (to temporaries only) and after it.

``X`` is nothing else's: no output, metric, home or donor, no other statement reads it,
and every launch of ``P`` and of those statements is one of these. The consumers' launches
move up to ``P``'s: each only over launches (also inside an ``if`` or a loop) and records
(``Host`` in mode 1) that write nothing it touches and touch nothing it writes (buffers by
identity: a donor's memory is its statement's); a statement the runtime runs (``Host`` in
mode 0) or a row loop stops it. Inside the chain a reduction's loop runs with the grams'
and its end after their results (``_Context._movable``). No kernel of the chain can fail.
The chain is a fused kernel of the plan (``kernels.fused``: ``P``, the grams' statements,
then the sums'); the statements' own kernels stay, for a run that launches a statement
alone.
"""

from __future__ import annotations

import dataclasses
import math

from timerlc.codegen import kir
from timerlc.codegen.fuse import ALIGN, _access, _has, _in_names_of, _kernel, parts
from timerlc.codegen.kir import (
    Bin,
    Cast,
    Const,
    For,
    Gemm,
    Launch,
    Let,
    Load,
    Ref,
    Store,
)

GRAM_M = 8  # the most columns of a gram's left operand (the layer's inputs) in a chain
ACC = "f64"  # the gram accumulators' dtype (float32: 10 % faster, as accurate as the BLAS)
# the rows of X a chain needs at least (at 2,048 to 8,000 rows, which the caches hold, the
# chain takes what the BLAS's gram and the sums' kernel took)
MIN_ROWS = 2048


@dataclasses.dataclass(frozen=True)
class _Nest:
    """A kernel's perfect nest of constant loops over the rows of ``X`` (``vars``, outer
    first, ``sizes``) and the row's elements (``evar`` over ``n``), and its innermost body."""

    vars: tuple[str, ...]
    sizes: tuple[int, ...]
    evar: str
    n: int
    body: tuple

    @property
    def rows(self) -> int:
        return math.prod(self.sizes)

    def row(self) -> kir.Expr:
        """The row of the point of the nest's variables."""
        return kir.linear([Ref(v) for v in self.vars], self.sizes)


def gram_chains(plan, trees, kernels: dict) -> tuple[list, list]:
    """``trees`` with each gram chain's launch in place of its statements' launches, and the
    chains' kernels (``kernels``: every kernel the trees may launch, by name)."""
    readers: dict[int, set] = {}
    for st in plan.statements:
        for node in st.nodes:
            for r in node.inputs:
                if r.stored:
                    readers.setdefault(r.src, set()).add(st.id)
    launches: dict[int, int] = {}  # statement -> launches of a kernel that computes it
    for t in trees:
        for s in kir.walk_tree(t.body):
            if isinstance(s, Launch):
                k = kernels.get(s.kernel)
                for sid in parts(k) if k is not None else (s.sid,):
                    launches[sid] = launches.get(sid, 0) + 1
    ctx = _Context(plan, kernels, readers, launches)
    out = []
    for t in trees:
        body = ctx.body(t.body)
        # (a chain's scratch: its statements' temporaries and the grams' accumulators)
        made = {k.name: k for k in ctx.made}
        scratch = max(
            [t.scratch_bytes]
            + [
                made[s.kernel].scratch_bytes
                for s in kir.walk_tree(body)
                if isinstance(s, Launch) and s.kernel in made
            ]
        )
        out.append(dataclasses.replace(t, body=body, scratch_bytes=scratch))
    return out, ctx.made


class _Context:
    def __init__(self, plan, kernels: dict, readers: dict, launches: dict):
        self.plan, self.kernels, self.readers, self.launches = plan, kernels, readers, launches
        self.recorded = {sid for _, sid, _ in plan.outputs + plan.metrics}
        # a buffer's identity: its donor's, whose memory it takes (a chain of donors)
        donor = {b.id: b.donor for b in plan.buffers if b.donor is not None}
        self.shared = {b.home.buffer for b in plan.buffers if b.home is not None}
        self.shared |= set(donor) | set(donor.values())
        self.identity = {}
        for b in plan.buffers:
            x = b.id
            seen = set()
            while x in donor and x not in seen:
                seen.add(x)
                x = donor[x]
            self.identity[b.id] = x
        self.made: list[kir.Kernel] = []

    # ------------------------------------------------------------------ the tree
    def body(self, stmts: tuple) -> tuple:
        out = []
        for s in stmts:
            if isinstance(s, kir.Loop):
                s = dataclasses.replace(s, body=self.body(s.body))
            elif isinstance(s, kir.If):
                s = dataclasses.replace(s, then=self.body(s.then), orelse=self.body(s.orelse))
            out.append(s)
        p = 0
        while p < len(out):
            got = self.chain(out, p)
            if got is not None:
                launch, gone = got
                out = [launch if j == p else s for j, s in enumerate(out) if j not in gone]
            p += 1
        return tuple(out)

    def chain(self, out: list, p: int):
        """The chain of the launch ``out[p]`` and the positions of the launches it takes
        after it, or None."""
        s = out[p]
        if not isinstance(s, Launch) or self.launches.get(s.sid) != 1:
            return None
        k = self.kernels.get(s.kernel)
        got = None if k is None else _producer(k)
        if got is None:
            return None
        xslot, nest, value = got
        if nest.rows < MIN_ROWS or not self._own(xslot):
            return None
        need = self.readers.get(xslot.sid, set())
        if not need or any(self.launches.get(sid) != 1 for sid in need):
            return None
        grams, reductions, taken = [], [], []
        covered: set = set()
        for q in range(p + 1, len(out)):
            if need <= covered:
                break
            c = out[q]
            if isinstance(c, (kir.Host, kir.If, kir.Loop)):
                continue  # (what a consumer may move over: _movable)
            if not isinstance(c, Launch):
                return None
            ck = self.kernels.get(c.kernel)
            if ck is None or not _touches(ck, xslot):
                continue
            if c.args != s.args or ck.params != k.params or len(c.box) != len(s.box):
                return None
            g = _gram(ck, xslot, nest)
            r = None if g is not None else _reduction(ck, xslot, nest)
            if g is None and r is None:
                return None
            (grams if g is not None else reductions).append((q, ck, g if g else r))
            taken.append(q)
            covered |= set(parts(ck))
        if not need <= covered or not grams or len(reductions) > 1:
            return None
        if not self._movable(out, p, xslot, grams, reductions):
            return None
        chain = _build(f"g{s.sid}_{len(self.made)}", k, xslot, nest, value, grams, reductions)
        if chain is None:
            return None
        self.made.append(chain)
        # (the loop values every statement's box holds, as a fused kernel's launch)
        box = s.box
        for q in taken:
            box = tuple(min(x, y) for x, y in zip(box, out[q].box))
        return Launch(chain.name, s.sid, s.args, box, chain.parts), set(taken)

    def _own(self, xslot: kir.Slot) -> bool:
        """Whether ``X`` is the chain's alone: no output or metric, nobody's home or donor,
        without one of its own."""
        b = self.plan.buffer(xslot.sid)
        return (
            xslot.sid not in self.recorded
            and xslot.sid not in self.shared
            and b.donor is None
            and b.home is None
        )

    def _id(self, s: kir.Slot):
        return (s.state,) if s.state else (self.identity.get(s.sid, s.sid), s.out)

    def _ids(self, k: kir.Kernel, written: bool, names=None) -> set:
        """The buffers ``k`` writes (``written``) or touches, by identity (of the slots
        ``names`` only, where given)."""
        return {
            self._id(s)
            for s in k.slots
            if (s.write or not written) and (names is None or s.name in names)
        }

    def _movable(self, out: list, p: int, xslot, grams: list, reductions: list) -> bool:
        """Whether the chain computes what the launches did: each consumer's launch moves
        up to ``out[p]`` over launches that neither write what it touches nor touch what
        it writes; and inside the chain, where a reduction's loop (and what comes before
        it) runs with the grams' and its end after their results are stored, no
        consumer's write meets another's access but where the tree had them in that
        order (a reduction's end reading a gram's result made before it)."""
        cons = [(q, ck) for q, ck, _ in grams + reductions]
        if any(ck.shared for _, ck in cons):  # (the producer has none: _producer)
            return False
        gw = [self._ids(ck, True) for _, ck, _ in grams]
        gr = [self._ids(ck, False) for _, ck, _ in grams]
        for j, w in enumerate(gw):
            if any(w & r for i, r in enumerate(gr) if i != j):
                return False
        for q, rk, (pre, loop, _) in reductions:
            rw, rr = self._ids(rk, True), self._ids(rk, False)
            reads, _ = _access((*pre, loop))
            early = self._ids(rk, False, set(reads))
            for (qg, _, _), w, r in zip(grams, gw, gr):
                if w & rw or rw & r or w & early or (q < qg and w & rr):
                    return False
        taken = [q for q, _ in cons]
        for q in range(p + 1, max(taken)):
            if q in taken:
                continue
            later = [c for q2, c in cons if q2 > q]
            for j in kir.walk_tree((out[q],)):
                if isinstance(j, (kir.If, kir.Loop)):
                    continue  # (what they hold is walked)
                if isinstance(j, kir.Host) and j.mode == 1:
                    # a record of a statement's values: none a consumer moving over it writes
                    seen = {
                        (self.identity.get(j.sid, j.sid), k)
                        for k in range(len(self.plan.buffer(j.sid).outputs))
                    }
                    if any(seen & self._ids(c, True) for c in later):
                        return False
                    continue
                if not isinstance(j, Launch):
                    return False  # (a statement the runtime runs, a row loop)
                jk = self.kernels.get(j.kernel)
                if jk is None or jk.shared or _touches(jk, xslot):
                    return False
                jw, jr = self._ids(jk, True), self._ids(jk, False)
                if any(jw & self._ids(c, False) or jr & self._ids(c, True) for c in later):
                    return False
        return True


# ----------------------------------------------------------------------------- kernels
def _loops(body: tuple) -> tuple[list[For], tuple] | None:
    """The perfect nest ``body`` is (each loop's body one loop, but the innermost's), its
    loops outer first, and the innermost body; None where ``body`` is not one loop."""
    loops = []
    while len(body) == 1 and isinstance(body[0], For):
        loops.append(body[0])
        body = body[0].body
    if not loops or not all(
        isinstance(f.lo, Const) and f.lo.value == 0 and isinstance(f.hi, Const) for f in loops
    ):
        return None
    return loops, body


def _producer(k: kir.Kernel):
    """``(X's slot, nest, value)`` where ``k`` is a statement kernel storing one buffer a
    point at a time: ``X[row * n + e] = value``, row-major over the nest's rows."""
    if k.parts or k.repeat != 1 or k.temps or k.shared or k.alone:
        return None
    got = _loops(k.body)
    if got is None:
        return None
    loops, inner = got
    if len(loops) < 2 or not all(f.parallel and not f.reduce for f in loops):
        return None
    if len(inner) != 1 or not isinstance(inner[0], Store):
        return None
    st = inner[0]
    slots = {s.name: s for s in k.slots}
    xslot = slots.get(st.buf)
    if xslot is None or xslot.state or xslot.dtype not in ("f32", "f64"):
        return None
    nest = _Nest(
        tuple(f.var for f in loops[:-1]),
        tuple(int(f.hi.value) for f in loops[:-1]),
        loops[-1].var,
        int(loops[-1].hi.value),
        inner,
    )
    if not _at_point(st.index, nest) or _reads(st.value, xslot.name):
        return None
    if any(isinstance(e, kir.Fn) for e in kir.subexprs(st.value)):
        return None
    return xslot, nest, st.value


def _at_point(index, nest: _Nest) -> bool:
    """Whether ``index`` is ``row * n + e`` at the nest's point."""
    from timerlc.codegen.lower import _affine

    names = set(nest.vars) | {nest.evar}
    aff = _affine(index, names)
    if aff is None or aff[0] != Const("i64", 0):
        return False
    want = {nest.evar: 1}
    stride = nest.n
    for v, size in zip(reversed(nest.vars), reversed(nest.sizes)):
        want[v] = stride
        stride *= size
    return {v: c for v, c in aff[1].items() if c} == want


def _reads(e, buf: str) -> bool:
    return any(isinstance(x, Load) and x.buf == buf for x in kir.subexprs(e))


def _touches(k: kir.Kernel, xslot: kir.Slot) -> bool:
    return any(s.sid == xslot.sid and s.out == xslot.out and not s.state for s in k.slots)


def _slot_name(k: kir.Kernel, xslot: kir.Slot) -> str | None:
    for s in k.slots:
        if s.sid == xslot.sid and s.out == xslot.out and not s.state:
            return s.name
    return None


def _gram(k: kir.Kernel, xslot: kir.Slot, nest: _Nest):
    """``(product, after)`` where ``k`` is a statement kernel that starts with one gram
    ``A^T @ X`` over all of ``X``'s rows, of at most ``GRAM_M`` rows (into its buffer or
    a temporary), and reads ``X`` nowhere after it (a copy of the temporary into the
    buffer where a condition holds)."""
    if k.parts or k.repeat != 1 or not k.body or _has(k.body, kir.Fail):
        return None
    g, after = k.body[0], k.body[1:]
    x = _slot_name(k, xslot)
    if not isinstance(g, Gemm) or x is None or g.b != x or g.a == x or g.c == x:
        return None
    if any(_mentions(s, x) for s in after):
        return None
    slots = {s.name: s for s in k.slots}
    if not (g.ta and not g.tb and g.dtype == xslot.dtype and isinstance(g.m, int)):
        return None
    if not (1 <= g.m <= GRAM_M and g.n == nest.n and g.k == nest.rows and g.ldb == nest.n):
        return None
    if g.boff != Const("i64", 0) or g.ldc != nest.n or g.lda < g.m:
        return None
    if g.a not in slots or slots[g.a].write:
        return None
    return g, after


def _reduction(k: kir.Kernel, xslot: kir.Slot, nest: _Nest):
    """``(before, loop, after)`` of ``k``'s statements where its one access of ``X`` is a
    reduction nest over ``X``'s rows (``For.reduce``) reading it at the point ``P``
    stored it, what comes before it writing temporaries only; else None."""
    x = _slot_name(k, xslot)
    if x is None or k.repeat != 1 or k.shared or _has(k.body, kir.Fail):
        return None
    at = [j for j, s in enumerate(k.body) if isinstance(s, For) and s.reduce]
    at = [j for j in at if _mentions(k.body[j], x)]
    if len(at) != 1:
        return None
    j = at[0]
    before, loop, after = k.body[:j], k.body[j], k.body[j + 1 :]
    if any(_mentions(s, x) for s in before + after):
        return None
    temps = {t.name for t in k.temps}
    if any(isinstance(s, Store) and s.buf not in temps for s in kir.walk_tree(before)):
        return None
    got = _loops((loop,))
    if got is None:
        return None
    loops, inner = got
    if [int(f.hi.value) for f in loops] != [*nest.sizes, nest.n]:
        return None
    if not loops[-1].parallel or any(f.reduce for f in loops[1:]):
        return None
    if any(isinstance(s, (For, kir.If)) for s in inner):
        return None
    own = _Nest(tuple(f.var for f in loops[:-1]), nest.sizes, loops[-1].var, nest.n, inner)
    for s in inner:
        if isinstance(s, Store) and (s.buf == x or s.buf not in temps):
            return None
        for e in kir.own_exprs(s):
            for sub in kir.subexprs(e):
                if isinstance(sub, Load) and sub.buf == x and not _at_point(sub.index, own):
                    return None
    return before, loop, after


def _mentions(s, buf: str) -> bool:
    """Whether statement ``s`` (or one it holds) reads or writes ``buf``."""
    reads, writes = _access((s,))
    return buf in reads or buf in writes


# ----------------------------------------------------------------------------- the chain
def _build(name: str, k: kir.Kernel, xslot, nest: _Nest, value, grams, reductions):
    """The chain's kernel (see the module's docstring), or None where its accumulators
    would not fit the threads' partial sums."""
    from timerlc.llvm.render import PAR_PARTIALS, PAR_REDUCE_CHUNKS

    value_name = f"x${name}"
    x = Ref(value_name, xslot.dtype)
    acc = dataclasses.replace(k, body=())
    subs = []
    for n, (_, ck, got) in enumerate(grams + reductions):
        refs = {}
        if n >= len(grams):  # (a reduction: its loops' variables are the rows')
            loops, _ = _loops((got[1],))
            refs = {f.var: Ref(v) for f, v in zip(loops, (*nest.vars, nest.evar))}
        sub = _in_names_of(acc, ck, refs)
        subs.append(sub)
        acc = _kernel(name, acc, ck, sub, ())
    # the grams' accumulators, after every temporary
    base = -(-acc.scratch_bytes // ALIGN) * ALIGN
    temps = list(acc.temps)
    reduce = []
    inits, adds, ends = [], [], []
    e = Ref(nest.evar)
    row = nest.row()
    for j, (_, ck, (g, gafter)) in enumerate(grams):
        sub = subs[j]
        gname = f"g${name}.{j}"
        size = g.m * g.n
        temps.append(kir.Temp(gname, ACC, base, size))
        base += -(-size * kir.SIZES[ACC] // ALIGN) * ALIGN
        reduce.append((gname, "add"))
        q = f"q${j}"
        inits.append(
            For(q, kir.i64(0), kir.i64(size), (Store(gname, Ref(q), Const(ACC, 0.0)),), True)
        )
        a = sub.buf(g.a)
        for i in range(g.m):
            at = kir.add(kir.mul(kir.i64(i), g.n), e)
            aval = Load(
                a, kir.add(sub.expr(g.aoff), kir.add(kir.mul(row, g.lda), kir.i64(i))), g.dtype
            )
            term = Bin("mul", Cast(aval, ACC), Cast(x, ACC), ACC)
            adds.append(Store(gname, at, Bin("add", Load(gname, at, ACC), term, ACC)))
        cval = Cast(Load(gname, Ref(q), ACC), g.dtype)
        # C[i * ldc + e] for C's row i and column e: element q of the accumulator
        store = Store(sub.buf(g.c), kir.add(sub.expr(g.coff), Ref(q)), cval)
        ends.append(For(q, kir.i64(0), kir.i64(size), (store,), True))
        ends += [sub.stmt(st) for st in gafter]
    before, after, own = [], [], []
    for (_, ck, (pre, loop, post)), sub in zip(reductions, subs[len(grams) :]):
        xname = _slot_name(ck, xslot)
        before += [sub.stmt(s) for s in pre]
        after += [sub.stmt(s) for s in post]
        reduce += [(sub.temps.get(a) or sub.name(a), op) for a, op in loop.reduce]
        loops, inner = _loops((loop,))
        for s in inner:
            own.append(_replace_loads(sub.stmt(s), xname, x))
    sizes = {t.name: t.size * kir.SIZES[t.dtype] for t in temps}
    if sum(sizes.get(a, 8) for a, _ in reduce) * PAR_REDUCE_CHUNKS > PAR_PARTIALS:
        return None
    body: tuple = (Let(value_name, xslot.dtype, value), *own, *adds)
    body = (For(nest.evar, kir.i64(0), kir.i64(nest.n), body, True),)
    for v, size in reversed(list(zip(nest.vars, nest.sizes))):
        outer = v == nest.vars[0]
        body = (For(v, kir.i64(0), kir.i64(size), body, False, tuple(reduce) if outer else ()),)
    slots = tuple(s for s in acc.slots if not (s.sid == xslot.sid and s.out == xslot.out))
    return dataclasses.replace(
        acc,
        slots=slots,
        temps=tuple(temps),
        body=(*inits, *before, *body, *ends, *after),
    )


def _replace_loads(s, buf: str, value: Ref):
    """Statement ``s`` with every load of ``buf`` (in the chain's names) the local ``value``."""
    return kir.rewrite(s, lambda e: value if isinstance(e, Load) and e.buf == buf else e)
