"""Fusing kernels: statements over the same loops, called one after another at the same loop
values, computed by one kernel whose vector loops are one loop.

The schedule makes a statement of every node it stores (a value two statements read, an
environment's state field): a step of an environment written in RTL is some thirty
statements over the environments ``b``, each a loop over ``b``. The tree calls them one
after another with the same loop values. ``fuse(a, b)`` makes one kernel of two: ``a``'s
work before its vector loop, then ``b``'s, then one loop whose body computes ``a``'s point
and then ``b``'s. A point of ``b`` that reads what ``a`` wrote reads it in the same
iteration, where LLVM forwards the value from the store.

It fuses only where that computes the same values, checked on the kernel IR:

- both kernels end with their vector loop, over the same range; nothing of ``b``'s before
  its loop touches what ``a``'s loop writes, nor writes what it reads;
- ``b``'s loop writes nothing ``a``'s loop reads or writes (its buffer is its own);
- where ``b``'s loop reads a buffer ``a``'s loop writes, it reads it at the one index ``a``
  stores it at, an affine function of the loop's variable with a nonzero coefficient (each
  iteration writes its own element), outside any inner loop: iteration ``v`` of ``b`` reads
  what iteration ``v`` of ``a`` wrote, as when ``a`` ran first;
- no buffer shares memory with another (a donor's), no environment state, and ``b``'s loop
  cannot fail (a failing statement is computed again by the interpreter, which must find
  its inputs complete).

A ``Fail`` of the n-th statement of a fused kernel returns n, so that the runtime knows
which statement failed (``Launch.sids``).
"""

from __future__ import annotations

import dataclasses

from timerlc.codegen import kir
from timerlc.codegen.kir import (
    Bin,
    Cast,
    Const,
    Fail,
    Fn,
    For,
    Gemm,
    If,
    Let,
    Load,
    Permute,
    Ref,
    Sel,
    Store,
    Un,
)

ALIGN = 8  # of a temporary's offset in the scratch area


def parts(k: kir.Kernel) -> tuple[int, ...]:
    return k.parts or (k.sid,)


def fuse(a: kir.Kernel, b: kir.Kernel, name: str) -> kir.Kernel | None:
    """One kernel named ``name`` computing ``a``'s statements, then ``b``'s, their vector
    loops fused; None where that could compute other values (see the module's docstring)."""
    if not _joinable(a, b) or not isinstance(a.body[-1], For):
        return None
    if not isinstance(b.body[-1], For):
        return None
    fora = a.body[-1]
    forb0 = b.body[-1]
    # (b's loop variable is a's)
    sub = _in_names_of(a, b, {forb0.var: Ref(fora.var)})
    b_pre = tuple(sub.stmt(s) for s in b.body[:-1])
    b_pre = _checked_once(a.body, b_pre)
    forb = sub.stmt(forb0)
    if (fora.lo, fora.hi) != (forb.lo, forb.hi):
        return None
    if _has(forb.body, (Fail, Gemm, Permute, kir.Loop, kir.Launch, kir.Host)):
        return None
    ra, wa = _access(fora.body)
    rp, wp = _access(b_pre)
    rb, wb = _access(forb.body)
    if set(rp) & set(wa) or set(wp) & (set(ra) | set(wa)):
        return None
    if set(wb) & (set(ra) | set(wa)):
        return None
    for buf in set(wa) & set(rb):
        stores = wa[buf]
        if any(nested for _, nested in stores):
            return None
        index = stores[0][0]
        if any(i != index for i, _ in stores) or not _injective(index, fora.var):
            return None
        if any(i != index for i, _ in rb[buf]):
            return None
    body = _join(fora.body, forb.body)
    par = fora.parallel and forb.parallel  # each iteration still computes its own points
    loop = For(fora.var, fora.lo, fora.hi, body, par)
    return _kernel(name, a, b, sub, a.body[:-1] + b_pre + (loop,))


def concat(a: kir.Kernel, b: kir.Kernel, name: str) -> kir.Kernel | None:
    """One kernel named ``name`` computing ``a``'s statements, then ``b``'s, each as it
    was, where ``b`` touches nothing ``a`` writes and writes nothing ``a`` reads (the two are
    independent: a renderer may run their loops at once); None otherwise. For the cuda
    target, whose renderer runs consecutive independent parallel loops in one function
    (``cuda.render``): a step's 36 copies of the parameters and the moments, or its 12
    tensors' Adam updates, as one launch."""
    return _one_after(a, b, name, apart=True)


def seq(a: kir.Kernel, b: kir.Kernel, name: str) -> kir.Kernel | None:
    """One kernel named ``name`` computing ``a``'s statements, then ``b``'s, each as it
    was, whatever they touch of each other's (statements one after another compute what
    they did apart); None where one kernel may not hold both (``_joinable``). For the cuda
    target, whose renderer merges the loops over one range that meet only at their row
    (``cuda.render._row_merged``): a gradient's loops after the loss's, one launch, where
    it saves one (``codegen.tree``)."""
    return _one_after(a, b, name, apart=False)


def _one_after(a: kir.Kernel, b: kir.Kernel, name: str, apart: bool) -> kir.Kernel | None:
    """``a``'s statements then ``b``'s as one kernel (``concat``, ``seq``); ``apart``: only
    where they touch nothing of each other's."""
    if not _joinable(a, b):
        return None
    sub = _in_names_of(a, b, {})
    body_b = tuple(sub.stmt(s) for s in b.body)
    if _has(body_b, (kir.Loop, kir.Launch, kir.Host)):
        return None
    if apart:
        ra, wa = _access(a.body)
        rb, wb = _access(body_b)
        if set(wb) & (set(ra) | set(wa)) or set(rb) & set(wa):
            return None
    return _kernel(name, a, b, sub, a.body + _checked_once(a.body, body_b))


def _checked_once(first, then) -> tuple:
    """The statements ``then`` (the second kernel's, which read nothing the first's write)
    without each check (a loop or ``if`` that only fails) that one of ``first``'s top-level
    statements makes already, but for its failure's code: it would pass or fail as that one
    did, and that one comes first (PPO's minibatch step gathers five tensors at the
    permutation's indices, each checking the same 65,536 indices: one check)."""
    made = {_canonical(s, {}) for s in first if _only_fails(s)}
    return tuple(s for s in then if not (_only_fails(s) and _canonical(s, {}) in made))


def _only_fails(s) -> bool:
    """Whether statement ``s`` stores nothing, assigns no local and may fail."""
    return (
        isinstance(s, (For, If))
        and _has([s], (Fail,))
        and not _has([s], (Store, Let, Gemm, Permute, kir.Loop, kir.Launch, kir.Host))
    )


def _canonical(x, names: dict):
    """``x`` (a statement or an expression) as a value that two equal but for their loop
    variables' names and their failures' codes share."""
    if isinstance(x, For):
        inner = names | {x.var: f"#{len(names)}"}
        body = tuple(_canonical(s, inner) for s in x.body)
        lo, hi = _canonical(x.lo, names), _canonical(x.hi, names)
        return ("For", lo, hi, body, x.parallel, x.reduce)
    if isinstance(x, Fail):
        return ("Fail",)
    if isinstance(x, Ref):
        return ("Ref", names.get(x.name, x.name), x.dtype)
    if dataclasses.is_dataclass(x):
        fields = dataclasses.fields(x)
        return (type(x).__name__, *(_canonical(getattr(x, f.name), names) for f in fields))
    if isinstance(x, tuple):
        return tuple(_canonical(e, names) for e in x)
    return x


def _joinable(a: kir.Kernel, b: kir.Kernel) -> bool:
    """Whether one kernel may hold both: no donor's memory, no environment state, the same
    number of loop values, both with a body, a slot of both at one table entry."""
    if a.shared or b.shared or len(a.params) != len(b.params) or not a.body or not b.body:
        return False
    if any(s.state for s in a.slots + b.slots):
        return False
    slots = {s.name: s.index for s in a.slots}
    return all(slots.get(s.name, s.index) == s.index for s in b.slots)


def _in_names_of(a: kir.Kernel, b: kir.Kernel, refs: dict) -> _Subst:
    """``b``'s statements in ``a``'s names: its parameters are ``a``'s (the same loop
    values), ``refs`` as given, its other locals and its temporaries get a suffix of their
    own, and its failures return its position in the kernel (after ``a``'s parts)."""
    n = len(parts(a))
    refs = {p: Ref(q) for p, q in zip(b.params, a.params)} | refs
    names: dict = {}
    _locals(b.body, names)
    for v in names:
        if v not in refs:
            refs[v] = f"{v}.{n}"
    return _Subst(refs, {t.name: f"{t.name}.{n}" for t in b.temps}, n + 1)


def _kernel(name: str, a: kir.Kernel, b: kir.Kernel, sub: _Subst, body: tuple) -> kir.Kernel:
    """The kernel of ``a`` and ``b`` (``sub``: ``b`` in ``a``'s names) with ``body``: the
    slots of both (written where either writes), ``b``'s temporaries after ``a``'s in the
    scratch area."""
    merged = {s.name: s for s in a.slots}
    for s in b.slots:
        t = merged.get(s.name)
        merged[s.name] = s if t is None else dataclasses.replace(t, write=t.write or s.write)
    base = -(-a.scratch_bytes // ALIGN) * ALIGN
    temps = tuple(kir.Temp(sub.temps[t.name], t.dtype, base + t.offset, t.size) for t in b.temps)
    return kir.Kernel(
        name,
        a.sid,
        a.params,
        tuple(sorted(merged.values(), key=lambda s: s.index)),
        a.temps + temps,
        body,
        (),
        parts(a) + parts(b),
    )


def _join(x: tuple, y: tuple) -> tuple:
    """``x`` then ``y``, a guard that ends ``x`` and starts ``y`` (the same domain) taken
    once."""
    if (
        x
        and y
        and isinstance(x[-1], If)
        and isinstance(y[0], If)
        and not x[-1].orelse
        and not y[0].orelse
        and x[-1].cond == y[0].cond
    ):
        return x[:-1] + (If(x[-1].cond, x[-1].then + y[0].then),) + y[1:]
    return tuple(x) + tuple(y)


def _injective(index, var: str) -> bool:
    """Whether ``index`` is ``rest + c * var`` with ``c`` nonzero and ``rest`` free of
    ``var``: distinct values of ``var`` give distinct elements."""
    from timerlc.codegen.lower import _affine

    aff = _affine(index, {var})
    return aff is not None and aff[1].get(var, 0) != 0


# ----------------------------------------------------------------------------- walks
def _locals(body, out: dict):
    for s in body:
        if isinstance(s, Let):
            out[s.name] = True
        elif isinstance(s, For):
            out[s.var] = True
            _locals(s.body, out)
        elif isinstance(s, If):
            _locals(s.then, out)
            _locals(s.orelse, out)


def _has(body, kinds) -> bool:
    for s in body:
        if isinstance(s, kinds):
            return True
        if isinstance(s, For) and _has(s.body, kinds):
            return True
        if isinstance(s, If) and (_has(s.then, kinds) or _has(s.orelse, kinds)):
            return True
    return False


def _access(body) -> tuple[dict, dict]:
    """The buffers ``body`` reads and writes: buffer -> [(index, inside an inner loop)]
    (a gemm or a permutation: its whole buffer, index None)."""
    reads: dict = {}
    writes: dict = {}

    def expr(e, nested: bool):
        if isinstance(e, Load):
            reads.setdefault(e.buf, []).append((e.index, nested))
        for x in kir.children(e):
            expr(x, nested)

    def stmts(body, nested: bool):
        for s in body:
            if isinstance(s, Let):
                expr(s.value, nested)
            elif isinstance(s, Store):
                expr(s.index, nested)
                expr(s.value, nested)
                writes.setdefault(s.buf, []).append((s.index, nested))
            elif isinstance(s, For):
                expr(s.lo, nested)
                expr(s.hi, nested)
                stmts(s.body, True)
            elif isinstance(s, If):
                expr(s.cond, nested)
                stmts(s.then, nested)
                stmts(s.orelse, nested)
            elif isinstance(s, Gemm):
                for e in (s.aoff, s.boff, s.coff):
                    expr(e, nested)
                reads.setdefault(s.a, []).append((None, True))
                reads.setdefault(s.b, []).append((None, True))
                writes.setdefault(s.c, []).append((None, True))
            elif isinstance(s, Permute):
                expr(s.p, nested)
                writes.setdefault(s.out, []).append((None, True))
                writes.setdefault(s.scratch, []).append((None, True))

    stmts(body, False)
    return reads, writes


class _Subst:
    """A kernel's statements in another's names: ``refs`` maps a local to an expression
    (a parameter, the loop variable) or to its new name; ``temps`` renames temporaries;
    a ``Fail`` returns ``code``."""

    def __init__(self, refs: dict, temps: dict, code: int):
        self.refs, self.temps, self.code = refs, temps, code

    def name(self, v: str) -> str:
        r = self.refs.get(v, v)
        if isinstance(r, str):
            return r
        assert isinstance(r, Ref)
        return r.name

    def buf(self, b: str) -> str:
        return self.temps.get(b, b)

    def expr(self, e):
        if isinstance(e, Const):
            return e
        if isinstance(e, Ref):
            r = self.refs.get(e.name)
            if r is None:
                return e
            return Ref(r, e.dtype) if isinstance(r, str) else Ref(r.name, e.dtype)
        if isinstance(e, Load):
            return Load(self.buf(e.buf), self.expr(e.index), e.dtype)
        if isinstance(e, Un):
            return Un(e.op, self.expr(e.x), e.dtype)
        if isinstance(e, Bin):
            return Bin(e.op, self.expr(e.a), self.expr(e.b), e.dtype)
        if isinstance(e, Sel):
            return Sel(self.expr(e.cond), self.expr(e.a), self.expr(e.b), e.dtype)
        if isinstance(e, Cast):
            return Cast(self.expr(e.x), e.dtype)
        if isinstance(e, Fn):
            return Fn(e.name, tuple(self.expr(x) for x in e.args), e.dtype)
        raise TypeError(f"not a kernel expression: {e!r}")

    def stmt(self, s):
        if isinstance(s, Let):
            return Let(self.name(s.name), s.dtype, self.expr(s.value))
        if isinstance(s, Store):
            return Store(self.buf(s.buf), self.expr(s.index), self.expr(s.value))
        if isinstance(s, For):
            body = tuple(self.stmt(x) for x in s.body)
            red = tuple((self.temps.get(a) or self.name(a), op) for a, op in s.reduce)
            return For(self.name(s.var), self.expr(s.lo), self.expr(s.hi), body, s.parallel, red)
        if isinstance(s, If):
            then = tuple(self.stmt(x) for x in s.then)
            orelse = tuple(self.stmt(x) for x in s.orelse)
            return If(self.expr(s.cond), then, orelse)
        if isinstance(s, Fail):
            return Fail(self.code)
        if isinstance(s, Gemm):
            return dataclasses.replace(
                s,
                a=self.buf(s.a),
                b=self.buf(s.b),
                c=self.buf(s.c),
                aoff=self.expr(s.aoff),
                boff=self.expr(s.boff),
                coff=self.expr(s.coff),
            )
        if isinstance(s, Permute):
            return dataclasses.replace(
                s, p=self.expr(s.p), out=self.buf(s.out), scratch=self.buf(s.scratch)
            )
        raise TypeError(f"not a kernel statement: {s!r}")
