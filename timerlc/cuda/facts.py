"""What the CUDA renderer (``cuda.render``) asks of kernel IR statements before it cuts a
kernel into steps: what a statement reads, writes and assigns (``_facts``, ``_touched``,
``_buffers``, ``_written``, ``_lets``), whether runs of statements touch apart
(``_independent``, ``_joins``, ``_apart_sums``), the nests of parallel loops (``_nest``),
the loads a point makes first (``_first_loads``), index expressions as linear forms
(``_lin``) and as plan expressions (``_plan_expr``). Questions only: nothing here renders
text."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

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
from timerlc.cuda.cexpr import RNG_FUNCTIONS, Unsupported


def _check_supported(body):
    facts = [_facts(s) for s in body]
    why = next((f.tree for f in facts if f.tree), None)  # (a tree's statement first)
    why = why or next((f.call for f in facts if f.call), None)
    if why is not None:
        raise Unsupported(why)


def _pushed_in(s):
    """``if c: for v (parallel): body`` as ``for v (parallel): if c: body``, so that the loop
    is a step of its own, where ``c`` is the same at every iteration and on every thread: it
    cannot name ``v``, and it reads no memory the loop writes and no local the loop assigns
    (a thread would see another's writes, or its own uninitialized local); any other
    statement as it is."""
    if (
        isinstance(s, If)
        and not s.orelse
        and len(s.then) == 1
        and isinstance(s.then[0], For)
        and s.then[0].parallel
    ):
        loop = s.then[0]
        reads = {e.buf for e in kir.subexprs(s.cond) if isinstance(e, Load)}
        if reads & _written(loop.body) or _refs_of(s.cond) & set(_lets(loop.body)):
            return s
        inner = loop.body[0] if len(loop.body) == 1 else None
        if _nestable(inner):  # (below the parallel loops nested in it: the nest stays whole)
            return dataclasses.replace(loop, body=(_pushed_in(If(s.cond, (inner,), ())),))
        return dataclasses.replace(loop, body=(If(s.cond, loop.body, ()),))
    return s


def _independent_of_run(loop: For, run: list, shared=()) -> bool:
    """Whether parallel ``loop`` and the statements ``run`` (on one thread) touch nothing
    of each other's (``_independent``), and the loop reads no local the run assigns."""
    return _independent([loop], run, shared) and not _refs([loop]) & set(_lets(run))


def _independent(a: list, b: list, shared=()) -> bool:
    """Whether the statements ``a`` and ``b`` touch nothing of each other's: neither writes
    a buffer the other reads or writes (parallel loops may then run in any order, on any
    threads); ``shared``: buffers that may be one memory (``kir.Kernel.shared``: a donor's
    and its donee's), each standing for all of them."""

    def of(names: set) -> set:
        return {"\0shared" if x in shared else x for x in names} if shared else names

    wa, wb = of(_written(a)), of(_written(b))
    return not (wa & of(_buffers(b)) or wb & of(_buffers(a)))


def _lets(body) -> dict:
    """The locals ``body`` assigns, with their dtypes (the first's)."""
    out: dict = {}
    for s in kir.walk_tree(body):
        if isinstance(s, Let):
            out.setdefault(s.name, s.dtype)
    return out


def _exprs(body):
    """Every expression of the statements of ``body``, nested ones included."""
    for s in kir.walk_tree(body):
        for e in kir.own_exprs(s):
            yield from kir.subexprs(e)


def _refs(body) -> set[str]:
    """Every local (and loop variable) the statements of ``body`` read."""
    return set().union(*(_facts(s).refs for s in body))


class _Facts(NamedTuple):
    """What the renderer asks of a statement and the statements inside it, again and again
    (``_facts``): the locals it reads, a tree's statement in it or a call it has no function
    for (why it cannot render it: ``_check_supported``), whether it has a failure, a product
    or a permutation, and whether it calls a function (``_row_loop``)."""

    refs: frozenset
    tree: str | None
    call: str | None
    stops: bool
    calls: bool


# per statement, by its identity: its ``_Facts``, each statement walked once a build
_FACTS: dict[int, tuple] = {}


def _facts(s) -> _Facts:
    """Statement ``s``'s ``_Facts``."""
    return _by_id(_FACTS, s, _facts_of)


def _facts_of(s) -> _Facts:
    # (its own expressions, then the facts of the statements it holds, each kept: a nest's
    # statements are walked once, not once for each statement around them)
    refs: set[str] = set()
    tree = call = None
    calls = False
    if isinstance(s, (kir.Loop, kir.Launch, kir.Host)):
        tree = f"a {type(s).__name__} (a tree's statement)"
    stops = isinstance(s, (Fail, Gemm, Permute))
    for own in kir.own_exprs(s):
        for e in kir.subexprs(own):
            if isinstance(e, Ref):
                refs.add(e.name)
            elif isinstance(e, Fn):
                calls = True
                if call is None and e.name not in RNG_FUNCTIONS:
                    call = f"a call of {e.name}"
    for x in kir.nested(s):
        f = _facts(x)
        refs |= f.refs
        tree = tree or f.tree
        call = call or f.call
        stops = stops or f.stops
        calls = calls or f.calls
    return _Facts(frozenset(refs), tree, call, stops, calls)


def _by_id(store: dict, x, make):
    """``make(x)``, kept in ``store`` by ``x``'s identity with ``x`` itself (so that its id is
    not another's while it is there): ``_TOUCHED``, ``_FACTS``, ``_KEYS``, each emptied by
    ``render_kernels`` (a build's fused kernels share their parts' statements)."""
    got = store.get(id(x))
    if got is None or got[0] is not x:
        got = store[id(x)] = (x, make(x))
    return got[1]


# a statement's buffers (``_touched``), by its identity
_TOUCHED: dict[int, tuple] = {}


def _touched(s) -> tuple[frozenset, frozenset]:
    """The buffers statement ``s`` reads or writes, and those it writes."""
    return _by_id(_TOUCHED, s, _touched_of)


def _touched_of(s) -> tuple[frozenset, frozenset]:
    # (its own, then those of the statements it holds, each kept, as ``_facts_of``)
    both = {e.buf for own in kir.own_exprs(s) for e in kir.subexprs(own) if isinstance(e, Load)}
    read, wrote = kir.own_buffers(s)
    both.update(read + wrote)
    written = set(wrote)
    for x in kir.nested(s):
        b, w = _touched(x)
        both |= b
        written |= w
    return frozenset(both), frozenset(written)


def _read(s) -> set[str]:
    """The buffers statement ``s`` reads."""
    out = {e.buf for e in _exprs((s,)) if isinstance(e, Load)}
    for x in kir.walk_tree((s,)):
        out.update(kir.own_buffers(x)[0])
    return out


def _buffers(body) -> set[str]:
    """Every buffer (slot or temporary) the statements of ``body`` read or write."""
    return set().union(*(_touched(s)[0] for s in body))


def _written(body) -> set[str]:
    """Every buffer the statements of ``body`` write."""
    return set().union(*(_touched(s)[1] for s in body))


def _constant_nest(nest: list) -> bool:
    """Whether ``nest`` is two loops or more, each of constant bounds and some iterations
    (a nest ``_nest_lets`` numbers the points of)."""
    return len(nest) >= 2 and all(
        isinstance(x.lo, Const) and isinstance(x.hi, Const) and int(x.hi.value) > int(x.lo.value)
        for x in nest
    )


def _carried(body, accs: dict) -> bool:
    """Whether a statement of ``body`` (a loop's) reads a local that ``body`` assigns later
    (a value one iteration passes the next), but for the accumulators ``accs``."""
    later = set(_lets(body)) - set(accs)
    for x in kir.walk_tree(body):  # (in the order they are written, nested ones too)
        for e in kir.own_exprs(x):
            if any(isinstance(r, Ref) and r.name in later for r in kir.subexprs(e)):
                return True
        if isinstance(x, Let):
            later.discard(x.name)
    return False


def _apart_sums(a: For, b: For, between: list) -> bool:
    """Whether the reduction ``b`` may run with ``a``, before the statements ``between``: none of them can fail (a check may be what
    allows ``b``'s reads), it reads nothing they or ``a`` write nor a local they assign,
    and they touch nothing of its accumulator's."""
    others = [a, *between]
    if _fails_any(between):
        return False
    accs = {acc for acc, _ in b.reduce}
    mine = accs | {x.var for x in kir.walk_tree(b.body) if isinstance(x, For)} | {b.var}
    lets = set(_lets(others)) | {x.var for x in kir.walk_tree(others) if isinstance(x, For)}
    return (
        _independent([b], others)
        and not (_refs([b]) - mine) & lets
        and not accs & (_refs(others) | lets)
        and not {acc for acc, _ in a.reduce} & _refs([b])
    )


def _groups(stmts) -> list[list]:
    """``stmts`` in groups, in order, two statements in one where one writes a buffer the
    other touches or they share a local (one assigns what the other reads or assigns),
    directly or through others."""
    n = len(stmts)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    info = [
        (_written([x]), _buffers([x]), set(_lets([x])), _refs([x]) | set(_lets([x])))
        for x in stmts
    ]
    for i in range(n):
        for j in range(i):
            wi, bi, li, ri = info[i]
            wj, bj, lj, rj = info[j]
            if wi & bj or wj & bi or li & rj or lj & ri:
                parent[root(i)] = root(j)
    groups: dict[int, list] = {}
    for i, x in enumerate(stmts):
        groups.setdefault(root(i), []).append(x)
    return list(groups.values())


def _subst(refs: dict):
    from timerlc.codegen.fuse import _Subst

    return _Subst(refs, {}, 0)


def _rewrites(stmts) -> bool:
    """Whether each buffer the statements ``stmts`` write is read, by any of them, only after
    one of them stored into it (in their order, nested statements in theirs; a store's own
    expressions read before it writes): run again, they make the same values (a merged row
    loop's temporaries, each written, then read; not ``x = x + 1``, nor a read of a slot
    another iteration left)."""
    written = _written(stmts)
    stored: set[str] = set()
    for x in kir.walk_tree(stmts):
        if not isinstance(x, (Store, Let, For, If)):  # (a product's reads are not loads)
            return False
        for e in kir.own_exprs(x):
            for y in kir.subexprs(e):
                if isinstance(y, Load) and y.buf in written and y.buf not in stored:
                    return False
        if isinstance(x, Store):
            stored.add(x.buf)
    return True


def _lin(e) -> dict | None:
    """The integer expression ``e`` as a sum of its names each times a constant, and a
    constant (key None), where it is one (sums, differences, products by constants)."""
    if isinstance(e, Const) and not isinstance(e.value, (bool, float)):
        return {None: int(e.value)}
    if isinstance(e, Ref):
        return {e.name: 1}
    if not (isinstance(e, Bin) and e.op in ("add", "sub", "mul")):
        return None
    a, b = _lin(e.a), _lin(e.b)
    if a is None or b is None:
        return None
    if e.op == "mul":
        if set(b) <= {None}:
            a, b = b, a
        if not set(a) <= {None}:
            return None
        k = a.get(None, 0)
        return {v: c * k for v, c in b.items()}
    sign = -1 if e.op == "sub" else 1
    out = dict(a)
    for v, c in b.items():
        out[v] = out.get(v, 0) + sign * c
    return out


def _collect(stmts, k: int, ranges: dict, accesses: dict):
    """The loads and stores of ``stmts`` into ``accesses`` (buffer -> ``[(k, index, the
    inner loops' ranges, written)]``), each inner loop's range where its bounds are
    constants, else None (``_rows_local``, ``_levels_local``)."""
    for x in stmts:
        if isinstance(x, For):
            inner = dict(ranges)
            if isinstance(x.lo, Const) and isinstance(x.hi, Const):
                inner[x.var] = (int(x.lo.value), int(x.hi.value) - 1)
            else:
                inner[x.var] = None
            _collect(x.body, k, inner, accesses)
            continue
        if isinstance(x, If):
            _collect(x.then, k, ranges, accesses)
            _collect(x.orelse, k, ranges, accesses)
        if isinstance(x, Store):
            accesses.setdefault(x.buf, []).append((k, x.index, ranges, True))
        for e in kir.own_exprs(x):
            for y in kir.subexprs(e):
                if isinstance(y, Load):
                    accesses.setdefault(y.buf, []).append((k, y.index, ranges, False))


def _same_index(a, b) -> bool:
    """Whether the i64 expressions ``a`` and ``b`` are one value: the same, or the same sum
    of its variables times constants plus a constant (``(t * 2) + ((b * 256) + e)`` and
    ``((t * 2) + (b * 256)) + e``)."""
    if a == b:
        return True
    from timerlc.codegen.lower import _affine

    names = {e.name for x in (a, b) for e in kir.subexprs(x) if isinstance(e, Ref)}
    fa, fb = _affine(a, names), _affine(b, names)
    if fa is None or fb is None:
        return False
    (ra, ca), (rb, cb) = fa, fb
    if not (isinstance(ra, Const) and isinstance(rb, Const)) or ra.value != rb.value:
        return False
    return {v: c for v, c in ca.items() if c} == {v: c for v, c in cb.items() if c}


def _joins(run: list, prev, shared=()) -> bool:
    """Whether the run on one thread ``run`` may be a loop of one point in the parallel step
    ``prev``'s launch (``_Kernel._steps``): it assigns no local (a later step would read it
    from the scratch memory), cannot fail, and touches nothing of the step's loops'."""
    if prev is None or prev.kind not in ("parallel", "either") or not prev.form:
        return False
    loops = prev.body if prev.kind == "either" else (prev.body,)
    return not _lets(run) and not _fails_any(run) and _independent(list(loops), run, shared)


def _nestable(x) -> bool:
    """Whether ``x`` is a parallel loop (not a reduction) whose bounds are constants: one
    that joins a nest over the grid (``_nest``)."""
    return (
        isinstance(x, For)
        and x.parallel
        and not x.reduce
        and isinstance(x.lo, Const)
        and isinstance(x.hi, Const)
    )


def _nest(loop: For) -> list[For]:
    """``loop`` and the parallel loops perfectly nested in it whose bounds are constants
    (each the only statement of the one before): one loop over the grid (``grid_loop``)."""
    nest = [loop]
    while len(nest[-1].body) == 1 and _nestable(nest[-1].body[0]):
        nest.append(nest[-1].body[0])
    return nest


def _column_loads(body, var: str, params: set, written: set, shared: set) -> list:
    """The loads in the statements of ``body`` before any that is not an assignment (an
    ``if``, a loop, a failure), outside any part of an expression that may not run (a
    selection's branches, the second operand of a logical one), whose index reads only
    ``var`` and ``params`` and no memory, of a buffer not in ``written`` (nor sharing memory
    with one: ``shared``), not bool: the loads a thread whose ``var`` is fixed may read
    once (``_Kernel.column_loop``)."""
    allowed = {var} | params
    return _first_loads(body, lambda refs: refs <= allowed, written, shared)


def _assignment(st) -> bool:
    return isinstance(st, (Let, Store))


def _point_loads(body, written: set, shared: set) -> list:
    """The loads ``_column_loads`` would take, but whose index may read any local the
    statements of ``body`` do not assign (the point's variables): the loads a point may
    make before its first statement (``_Kernel.point``)."""
    lets = set(_lets(body))
    return _first_loads(body, lambda refs: not refs & lets, written, shared)


def _first_loads(body, index_ok, written: set, shared: set) -> list:
    """``_column_loads``'s loads, of an index whose locals ``index_ok`` takes."""
    out: list = []

    def visit(e):
        if isinstance(e, Load):
            idx = list(kir.subexprs(e.index))
            if (
                e.buf not in written
                and e.buf not in shared
                and e.dtype != "bool"
                and not any(isinstance(x, (Load, Fn)) for x in idx)
                and index_ok(_refs_of(e.index))
            ):
                if e not in out:
                    out.append(e)
                return
            visit(e.index)
            return
        if isinstance(e, Sel):  # (one of its branches runs)
            visit(e.cond)
            return
        if (
            isinstance(e, Bin)
            and e.op in ("and", "or", "minimum", "maximum")
            and e.dtype == "bool"
        ):
            visit(e.a)  # (&&, ||: the second may not run)
            return
        for c in kir.children(e):
            visit(c)

    for st in body:
        if isinstance(st, Let):
            visit(st.value)
        elif isinstance(st, Store):
            visit(st.index)
            visit(st.value)
        else:
            break
    return out


def _uniform_checks(run: list, params: set) -> list:
    """The statements of ``run`` where each is a check of the call's loop values alone
    (``if c: fail k``, ``c`` the same on every thread), else []."""
    ok = all(
        isinstance(x, If)
        and not x.orelse
        and len(x.then) == 1
        and isinstance(x.then[0], Fail)
        and _uniform(x.cond, params)
        for x in run
    )
    return list(run) if run and ok else []


def _runs(loop: For) -> bool:
    """Whether the parallel loop runs at least once at every call (constant bounds)."""
    return (
        isinstance(loop.lo, Const)
        and isinstance(loop.hi, Const)
        and int(loop.hi.value) > int(loop.lo.value)
    )


def _fails_any(run: list) -> bool:
    return any(isinstance(x, Fail) for x in kir.walk_tree(run))


def _uniform(e, params: set) -> bool:
    """Whether expression ``e`` is the same on every thread of a call: it reads only the
    call's loop values (no memory, no local, no draw)."""
    return all(
        isinstance(x, (Const, Bin, Un, Cast, Sel)) or isinstance(x, Ref) and x.name in params
        for x in kir.subexprs(e)
    )


def _grid_work(s: If) -> bool:
    """Whether the ``if`` holds a statement that runs on the grid."""
    return any(
        isinstance(x, (Gemm, Permute)) or isinstance(x, For) and (x.parallel or bool(x.reduce))
        for x in kir.walk_tree(s.then + s.orelse)
    )


def _updates(body, accs: dict) -> bool:
    """Whether ``body`` stores only into the temporaries ``accs`` (name -> (op, dtype)),
    each store ``acc[i] = op(acc[i], x)`` (``x`` reading no accumulator), and reads them
    nowhere else; each is stored."""
    stores = [s for s in kir.walk_tree(body) if isinstance(s, Store)]
    loads = [e for e in _exprs(body) if isinstance(e, Load) and e.buf in accs]
    for s in stores:
        v = s.value
        if s.buf not in accs:
            return False
        op, dt = accs[s.buf]
        if not (
            isinstance(v, Bin)
            and v.op == op
            and v.a == Load(s.buf, s.index, dt)
            and not accs.keys() & {e.buf for e in kir.subexprs(v.b) if isinstance(e, Load)}
        ):
            return False
    return {s.buf for s in stores} == set(accs) and len(loads) == len(stores)


_PLAN_OPS = {
    "add": "add",
    "sub": "sub",
    "mul": "mul",
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "eq": "eq",
    "ne": "ne",
    "and": "and",
    "or": "or",
    "minimum": "min",
    "maximum": "max",
}


def _plan_expr(e, params: tuple):
    """Kernel IR expression ``e`` (an index or a condition over the kernel's parameters) as
    a plan expression (``plan.expr``), or None where it is not one (a load, a local, a
    division by other than a positive constant, ...)."""
    if isinstance(e, Const):
        if e.dtype == "bool":
            return bool(e.value)
        return int(e.value) if e.dtype == "i64" else None
    if isinstance(e, Ref):
        return e.name if e.name in params and e.dtype == "i64" else None
    if isinstance(e, Bin):
        a, b = _plan_expr(e.a, params), _plan_expr(e.b, params)
        if a is None or b is None:
            return None
        if e.op in ("floordiv", "mod"):
            if not (isinstance(e.b, Const) and int(e.b.value) > 0):
                return None
            return ("fdiv_q" if e.op == "floordiv" else "mod", a, b)
        op = _PLAN_OPS.get(e.op)
        return None if op is None else (op, a, b)
    if isinstance(e, Un) and e.op in ("not", "neg"):
        x = _plan_expr(e.x, params)
        return None if x is None else (e.op, x)
    if isinstance(e, Sel):
        parts = [_plan_expr(x, params) for x in (e.cond, e.a, e.b)]
        return None if None in parts else ("select", *parts)
    return None


def _exclusive(a: frozenset, b: frozenset) -> bool:
    """Whether guards with the literals ``a`` and ``b`` never hold at once (one has a
    condition that the other negates: the branches of one ``if``)."""
    return any((c, not holds) in b for c, holds in a)


def _refs_of(e) -> set[str]:
    return {x.name for x in kir.subexprs(e) if isinstance(x, Ref)}
