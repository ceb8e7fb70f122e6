"""The loop shapes the CUDA renderer (``cuda.render``) recognizes: a reduction that sums a
product's B by columns (``_column_sum``), the elementwise epilogue of a rows product
(``_epilogue``), the statements of a chain's levels that stay within their rows
(``_levels_local``, ``_rows_local``, ``_row_stride``), a grid loop's inner element loops
that its threads take apart (``_spread``, ``_merged_elements``) and a reduction's lanes
(``_lanes_combine``)."""

from __future__ import annotations

import dataclasses
import math

from timerlc.codegen import kir
from timerlc.codegen.kir import (
    Bin,
    Cast,
    Const,
    Fn,
    For,
    Gemm,
    If,
    Let,
    Load,
    Ref,
    Store,
)
from timerlc.cuda.facts import (
    _buffers,
    _collect,
    _facts,
    _independent,
    _lets,
    _lin,
    _nestable,
    _refs_of,
    _same_index,
)


def _column_sum(red, s: Gemm) -> str | None:
    """The float64 temporary that reduction ``red`` sums the columns of gemm ``s``'s B
    into (``t[e] = t[e] + f64(B[r, e])`` over B's k rows r and n columns e; r may be a
    nest of loops, ``r = (r1 * n2 + r2) * n3 + ...``, as REINFORCE's environments and
    steps), or None."""
    if not (isinstance(red, For) and len(red.reduce) == 1 and red.reduce[0][1] == "add"):
        return None
    acc, rows, inner = red.reduce[0][0], [], red
    while not inner.parallel or inner is red:  # (the row loops, down to the parallel one)
        if not (
            isinstance(inner, For)
            and inner.lo == kir.i64(0)
            and isinstance(inner.hi, Const)
            and len(inner.body) == 1
            and isinstance(inner.body[0], For)
        ):
            return None
        rows.append((inner.var, inner.hi.value))
        inner = inner.body[0]
    if not (
        math.prod(extent for _, extent in rows) == s.k
        and (inner.lo, inner.hi) == (kir.i64(0), kir.i64(s.n))
        and len(inner.body) == 1
        and isinstance(inner.body[0], Store)
    ):
        return None
    st, e = inner.body[0], Ref(inner.var)
    v = st.value
    if not (
        st.buf == acc
        and st.index == e
        and isinstance(v, Bin)
        and v.op == "add"
        and v.a == Load(acc, e, "f64")
        and isinstance(v.b, Cast)
        and v.b.dtype == "f64"
        and isinstance(v.b.x, Load)
        and v.b.x.buf == s.b
        and v.b.x.dtype == "f32"
    ):
        return None
    from timerlc.codegen.lower import _affine

    stride = 1 if s.tb else s.ldb  # (a row's step in B's memory)
    want = {inner.var: s.ldb if s.tb else 1}
    for var, extent in reversed(rows):
        want[var] = stride
        stride *= extent
    got = _affine(v.b.x.index, {inner.var, *(var for var, _ in rows)})
    if got is None or got[0] != s.boff or got[1] != want:
        return None
    return acc


def _epilogue(nest, s: Gemm, params) -> tuple | None:
    """Whether ``nest`` is an elementwise epilogue of gemm ``s``'s C: parallel loops over
    its m rows (one, or a nest whose iterations in order are C's rows: REINFORCE's
    environments and steps) around one over its n columns, whose one statement stores C's
    element (``C[coff + row * ldc + column]``), reading C only there, no local but its
    loops' variables and the call's loop values (``params``), no draw: what a rows
    function of ours can store in its place (``_rows_epilogues``). ``(rows, column)``, the
    row loops' ``(variable, extent)`` outer first and the column loop's variable, or
    None."""
    from timerlc.codegen.lower import _affine

    rows, inner = [], nest
    while isinstance(inner, For) and len(inner.body) == 1 and isinstance(inner.body[0], For):
        if not (
            inner.parallel
            and not inner.reduce
            and inner.lo == kir.i64(0)
            and isinstance(inner.hi, Const)
        ):
            return None
        rows.append((inner.var, inner.hi.value))
        inner = inner.body[0]
    if not (
        rows
        and math.prod(extent for _, extent in rows) == s.m
        and isinstance(inner, For)
        and not inner.reduce
        and (inner.lo, inner.hi) == (kir.i64(0), kir.i64(s.n))
        and len(inner.body) == 1
        and isinstance(inner.body[0], Store)
    ):
        return None
    st, names = inner.body[0], {inner.var, *(v for v, _ in rows)}
    want, stride = {inner.var: 1}, s.ldc
    for var, extent in reversed(rows):
        want[var] = stride
        stride *= extent
    if st.buf != s.c or _affine(st.index, names) != (s.coff, want):
        return None
    allowed = names | set(params)
    for e in kir.subexprs(st.value):
        if isinstance(e, Load) and e.buf == s.c:
            if e.dtype != s.dtype or _affine(e.index, names) != (s.coff, want):
                return None
        elif isinstance(e, Ref) and e.name not in allowed or isinstance(e, Fn):
            return None
    return rows, inner.var


def _epilogue_apart(nest, s: Gemm, params) -> tuple:
    """``(epilogue, rest)``: ``nest`` itself where it is an epilogue of gemm ``s``'s C
    (``_epilogue``; rest None); or, where the renderer merged it with other loops over the
    same rows (``_row_merged``: a layer's bias and ``tanh`` beside another layer's
    gradient, in one row loop, even one column loop), the epilogue's loops with its store
    alone and ``nest`` without that store, where nothing else in it touches what the store
    touches; else ``(None, None)``."""
    if _epilogue(nest, s, params):
        return nest, None
    mine, rest = _store_apart(nest, s.c)
    if mine is None or rest is None or not _epilogue(mine, s, params):
        return None, None
    if not _independent([rest], [mine]):
        return None, None
    return mine, rest


def _store_apart(x, c: str) -> tuple:
    """Loops ``x`` as ``(the loops around the one statement that touches buffer c, with
    it alone; x without it)``, each None where empty; ``(None, None)`` where more than one
    statement of a body touches ``c`` or one that does is not a loop's or a store."""
    if isinstance(x, Store):
        return (x, None) if x.buf == c else (None, None)
    if not isinstance(x, For):
        return None, None
    touching = [k for k, y in enumerate(x.body) if c in _buffers([y])]
    if len(touching) != 1:
        return None, None
    k = touching[0]
    mine, rest = _store_apart(x.body[k], c)
    if mine is None:
        return None, None
    others = x.body[:k] + ((rest,) if rest is not None else ()) + x.body[k + 1 :]
    return (
        dataclasses.replace(x, body=(mine,)),
        dataclasses.replace(x, body=others) if others else None,
    )


def _one_column(x, s: Gemm | None = None):
    """A scalar accumulator's statement in the form of an array's of one element
    (``_gram_sums``, a gram of one column, PPO's value head's: ``_zeros`` and
    ``_column_sum`` then match): ``t[0] = 0`` as a parallel loop of one that sets it;
    the reduction ``t[0] = t[0] + f64(B[r])`` (``s``'s B, over the rows' loops) with its
    store in a parallel loop over B's one column (``c``: ``t[c] = t[c] + f64(B[r + c *
    stride])``, the column's stride in B's memory). Anything else as it is."""
    zero = kir.i64(0)
    if isinstance(x, Store) and x.index == zero and isinstance(x.value, Const):
        v = f"{x.buf}$one"
        return For(v, zero, kir.i64(1), (Store(x.buf, Ref(v), x.value),), True)
    if not (s is not None and isinstance(x, For) and len(x.reduce) == 1):
        return x
    acc = x.reduce[0][0]

    def inner(loop: For):
        (body,) = loop.body if len(loop.body) == 1 else (None,)
        if isinstance(body, For) and not body.parallel:
            got = inner(body)
            return None if got is None else dataclasses.replace(loop, body=(got,))
        v = body.value if isinstance(body, Store) else None
        if not (
            isinstance(body, Store)
            and body.buf == acc
            and body.index == zero
            and isinstance(v, Bin)
            and v.op == "add"
            and v.a == Load(acc, zero, "f64")
            and isinstance(v.b, Cast)
            and isinstance(v.b.x, Load)
            and v.b.x.buf == s.b
        ):
            return None
        c = Ref(f"{acc}$one")
        at = kir.add(v.b.x.index, kir.mul(c, s.ldb if s.tb else 1))
        term = dataclasses.replace(v.b, x=dataclasses.replace(v.b.x, index=at))
        store = Store(acc, c, Bin("add", Load(acc, c, "f64"), term, v.dtype))
        return dataclasses.replace(loop, body=(For(c.name, zero, kir.i64(1), (store,), True),))

    got = inner(x)
    return x if got is None else got


def _zeros(init, acc: str, n: int) -> bool:
    """Whether ``init`` is a parallel loop that sets the ``n`` elements of ``acc`` to 0."""
    if not (
        isinstance(init, For)
        and init.parallel
        and (init.lo, init.hi) == (kir.i64(0), kir.i64(n))
        and len(init.body) == 1
        and isinstance(init.body[0], Store)
    ):
        return False
    st = init.body[0]
    return (
        st.buf == acc
        and st.index == Ref(init.var)
        and isinstance(st.value, Const)
        and st.value.value == 0
    )


def _own_grid(line: str) -> str:
    """A line of a product's or a loop's that runs on a part of its launch's blocks
    (``_Kernel.own_beside``): its block's number and the grid's, those of its part."""
    return line.replace("blockIdx.x", "tl_bx").replace("gridDim.x", "tl_gx")


def _levels_local(items: list) -> bool:
    """Whether each buffer one of the loops of ``items`` (``(loop, its row levels)``:
    ``_row_levels``; a row ``r`` the points of its levels, ``sum((v - start) * W)``, the
    last level's ``W`` 1) writes and another touches is accessed, in all of them, only at
    ``S * r + f + base``: one row stride ``S`` per buffer, ``f`` within ``[0, S)`` over the
    inner loops' ranges, ``base`` of the call's values alone and the same for all (a ring
    buffer's slot) — a thread doing every loop's points of its rows touches nothing of
    another's rows (``_rows_local``'s rule over one loop variable, here over levels)."""
    accesses, varying = _level_accesses(items)
    for uses in accesses.values():
        if not any(w for _, _, _, w in uses) or len({k for k, _, _, _ in uses}) < 2:
            continue
        if _row_stride(uses, items, varying) is None:
            return False
    return True


def _level_accesses(items: list) -> tuple[dict, set]:
    """The loads and stores of the loops of ``items`` (``_levels_local``'s), by buffer
    (``_collect``: ``[(loop number, index, inner ranges, written)]``), and the locals their
    bodies set."""
    accesses: dict = {}
    for k, (loop, levels) in enumerate(items):
        node = loop
        for _ in levels[1:]:  # (the nest's levels: each the only statement of the one before)
            node = node.body[0]
        _collect(node.body, k, {}, accesses)
    return accesses, set().union(*(_lets(loop.body) for loop, _ in items))


def _row_stride(uses: list, items: list, varying: set) -> int | None:
    """The row stride ``S`` of a buffer whose every access of ``uses`` (``_level_accesses``'
    of the loops of ``items``) is at ``S * r + f + base`` (``_levels_local``); else None."""
    stride, base = None, None
    for k, index, ranges, _ in uses:
        levels = items[k][1]
        lin = _lin(index)
        if lin is None:
            return None
        s = lin.get(levels[-1][0], 0)
        if s <= 0 or stride not in (None, s):
            return None
        stride = s
        rest = {v: c for v, c in lin.items() if v not in {x for x, _, _ in levels}}
        w = 1
        for var, lo, n in reversed(levels):
            if lin.get(var, 0) != s * w:
                return None
            for v, c in _lin(lo).items():  # (the start's part: the base's)
                rest[v] = rest.get(v, 0) + s * w * c
            w *= n
        lo = hi = rest.pop(None, 0)
        sym = {}
        for v, c in rest.items():
            r = ranges.get(v)
            if v in ranges and r is None or v in varying and c:
                return None  # (an inner loop's of no constant bounds; a local's)
            if r is not None:
                lo += min(c * r[0], c * r[1])
                hi += max(c * r[0], c * r[1])
            elif c:
                sym[v] = c
        if base not in (None, sym) or lo < 0 or hi >= s:
            return None
        base = sym
    return stride


def _gram_loop(g: Gemm, var: str) -> For:
    """Gram ``g``'s reads of A and B (each k x its columns, row by row) as a loop nest over
    its rows (``var``): row ``r``'s m elements of A and n of B (``_chain_local``)."""
    row, i, j = Ref(var), Ref(f"{var}_m"), Ref(f"{var}_n")

    def at(off, ld: int, x):
        return Bin("add", Bin("add", off, Bin("mul", row, kir.i64(ld), "i64"), "i64"), x, "i64")

    a, b = Load(g.a, at(g.aoff, g.lda, i), g.dtype), Load(g.b, at(g.boff, g.ldb, j), g.dtype)
    both = Bin("mul", a, b, g.dtype)
    inner = For(f"{var}_n", kir.i64(0), kir.i64(g.n), (Let(f"{var}_v", g.dtype, both),))
    mid = For(f"{var}_m", kir.i64(0), kir.i64(g.m), (inner,))
    return For(var, kir.i64(0), kir.i64(g.k), (mid,), True)


def _product_loop(g: Gemm, var: str) -> For:
    """Rows product ``g``'s accesses of A and C as a loop nest over its rows (``var``):
    row ``r``'s k elements of A read, its n of C written (``_chain_local``)."""
    row, kk, col = Ref(var), Ref(f"{var}_k"), Ref(f"{var}_n")

    def at(off, ld: int, x):
        return Bin("add", Bin("add", off, Bin("mul", row, kir.i64(ld), "i64"), "i64"), x, "i64")

    store = Store(g.c, at(g.coff, g.ldc, col), Load(g.a, at(g.aoff, g.lda, kk), g.dtype))
    inner = For(f"{var}_n", kir.i64(0), kir.i64(g.n), (store,))
    mid = For(f"{var}_k", kir.i64(0), kir.i64(g.k), (inner,))
    return For(var, kir.i64(0), kir.i64(g.m), (mid,), True)


def _row_loop(s) -> bool:
    """A parallel loop over a constant range with nothing in it that stops (a failure) or
    needs the grid (a product, a permutation) or an order (a draw)."""
    return _nestable(s) and not any(f.stops or f.calls for f in map(_facts, s.body))


def _rows_local(loops: list) -> bool:
    """Whether each buffer one of ``loops`` (over one range) writes and another touches is
    accessed, in all of them, only at ``C * row + f`` (the loop's variable ``row``, one
    ``C`` per buffer, ``f`` within ``[0, C)`` over the inner loops' ranges): a thread doing
    every loop's iteration for its row touches nothing another thread's row does."""
    from timerlc.codegen.lower import _affine

    accesses: dict = {}  # buffer -> [(loop number, index, inner ranges, written)]
    for k, loop in enumerate(loops):
        _collect(loop.body, k, {loop.var: "row"}, accesses)
    # (a buffer's accesses may all start at one offset that is not a constant, the same for
    # every thread: of the call's values alone, as a ring buffer's slot, ``mod(j, 2) * 256``)
    varying = set().union(*(_lets(loop.body) for loop in loops))
    for uses in accesses.values():
        if not any(w for _, _, _, w in uses) or len({k for k, _, _, _ in uses}) < 2:
            continue
        stride, base = None, None
        for n, (k, index, ranges, _) in enumerate(uses):
            row = loops[k].var
            names = set(ranges)
            aff = _affine(index, names)
            if aff is None:
                return False
            rest = None if isinstance(aff[0], Const) else aff[0]
            if rest is not None and (
                any(isinstance(x, (Load, kir.Fn)) for x in kir.subexprs(rest))
                or _refs_of(rest) & varying
            ):
                return False
            if n and rest != base:
                return False
            base = rest
            coef = aff[1]
            c = coef.get(row, 0)
            if c <= 0 or stride not in (None, c):
                return False
            stride = c
            lo = hi = int(aff[0].value) if rest is None else 0
            for v, a in coef.items():
                if v == row:
                    continue
                r = ranges.get(v)
                if r is None or r == "row":
                    return False
                lo += min(a * r[0], a * r[1])
                hi += max(a * r[0], a * r[1])
            if lo < 0 or hi >= c:
                return False
    return True


def _spread(body) -> tuple:
    """``body`` with the element loop of a parallel loop over rows marked parallel where its
    iterations are independent (its body only stores, each at an index that its variable
    moves: ``t1[b * 64 + e] = tanh(...)``): the nest is one loop over the grid, a thread per
    element (``_nest``), where a thread per row would leave most of a GPU idle and each
    warp's accesses a row apart (PPO's [65536, 64] layers: 65,536 threads, each storing 64
    floats 256 bytes from its neighbour's; now 4,194,304 threads, a warp's stores in one
    stretch). A loop kernel's block has a few rows: the same, over its threads."""
    out = []
    for s in body:
        if isinstance(s, For) and s.parallel:
            s = _spread_nest(s)
        elif isinstance(s, If):
            s = dataclasses.replace(s, then=_spread(s.then), orelse=_spread(s.orelse))
        out.append(s)
    return tuple(out)


def _spread_nest(s: For) -> For:
    """The parallel loop ``s`` with the loop its nest of parallel loops (``_nest``) ends on
    marked parallel where that loop's iterations are independent (``_spread``)."""
    inner = s.body[0] if len(s.body) == 1 else _merged_elements(s.body)
    if not isinstance(inner, For) or inner.reduce:
        return s
    if inner.parallel:
        return dataclasses.replace(s, body=(_spread_nest(inner),)) if _nestable(inner) else s
    if _independent_elements(inner):
        return dataclasses.replace(s, body=(dataclasses.replace(inner, parallel=True),))
    return s


def _merged_elements(body) -> For | None:
    """The loops ``body`` (a fused kernel's statements at a row: PPO's first layers of the
    actor and the critic, which read the same observations) as one loop, the later loops'
    variables renamed to the first's, where they run over one constant range and the one
    loop's iterations are independent (``_independent_elements``); else None."""
    from timerlc.codegen.fuse import _Subst

    first = body[0] if body else None
    if len(body) < 2 or not isinstance(first, For):
        return None
    stmts: list = []
    for x in body:
        if not (
            isinstance(x, For)
            and not x.parallel
            and not x.reduce
            and isinstance(x.lo, Const)
            and x.lo == first.lo
            and x.hi == first.hi
        ):
            return None
        sub = _Subst({x.var: first.var}, {}, 0)
        stmts += [sub.stmt(y) for y in x.body] if x.var != first.var else list(x.body)
    merged = dataclasses.replace(first, body=tuple(stmts))
    return merged if _independent_elements(merged) else None


def _independent_elements(loop: For) -> bool:
    """Whether ``loop``'s iterations are independent: it only stores, each store at an
    index its variable moves, no draw, and a buffer it stores is read only at an index the
    same iteration stored before (a fused kernel's value passed on at its element) or, where
    the loop stores it at that index alone, the one it stores (in place)."""
    from timerlc.codegen.fuse import _injective

    if loop.reduce or not (isinstance(loop.lo, Const) and isinstance(loop.hi, Const)):
        return False
    if not loop.body or not all(isinstance(x, Store) for x in loop.body):
        return False
    stored = {x.buf for x in loop.body}
    # where each store of a buffer is at one index, an iteration may read that element
    # before it stores it (an epilogue in place: ``b[e] = tanh(b[e] + c[e])``)
    at: dict = {}
    for x in loop.body:
        at.setdefault(x.buf, []).append(x.index)
    before: set = set()  # (buffer, index) the iteration stored so far
    for x in loop.body:
        if not _injective(x.index, loop.var):
            return False
        for e in kir.subexprs(x.value):
            if (
                isinstance(e, Load)
                and e.buf in stored
                and (e.buf, e.index) not in before
                and not all(_same_index(e.index, i) for i in at[e.buf])
            ):
                return False
            if isinstance(e, kir.Fn):  # (a draw: its own order)
                return False
        before.add((x.buf, x.index))
    return True


def _lanes_combine(loop) -> tuple | None:
    """``(guard, loops)`` where ``loop`` combines an array reduction's copies
    (``_Kernel._combine``: each element ``q`` of the temporaries, a loop over the blocks'
    copies in block order for each, under the reduction's guard), else None."""
    if not isinstance(loop, For):
        return None
    guard, inner = None, loop.body
    if len(inner) == 1 and isinstance(inner[0], If) and not inner[0].orelse:
        guard, inner = inner[0].cond, inner[0].then
    q = loop.var
    if not (
        q.startswith("tl_q")
        and isinstance(loop.lo, Const)
        and isinstance(loop.hi, Const)
        and inner
        and all(
            isinstance(f, For)
            and f.var == f"tl_b{q.removeprefix('tl_q')}"
            and isinstance(f.hi, Load)
            and len(f.body) == 1
            and isinstance(f.body[0], Store)
            and f.body[0].index == Ref(q)
            and isinstance(f.body[0].value, Bin)
            and isinstance(f.body[0].value.b, Load)
            for f in inner
        )
    ):
        return None
    return guard, inner
