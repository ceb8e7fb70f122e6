"""The kernel IR: loop nests over buffers with explicit index arithmetic.

A ``Kernel`` is one function. Its buffers are named slots of a table the runtime passes in
(``Slot``: a plan buffer's output, by statement id and output number) and regions of a
scratch area (``Temp``: a per-point temporary of a materialized node). Its body is a list of
statements over scalar *expressions*, each of one dtype (``bool i32 i64 f32 f64``; indices
and loop variables are ``i64``):

- expressions: ``Const``, ``Ref`` (a local scalar: a loop variable, an argument, an
  accumulator), ``Load`` (an element of a buffer at a linear index), ``Un`` and ``Bin``
  (the scalar ops of ``UNARY``/``BINARY``, NumPy's semantics for the dtype: see
  ``docs/codegen.md``), ``Sel`` (a select), ``Cast`` (NumPy's ``astype``, floats to ints
  through ``trunc``) and ``Fn`` (a function of the runtime library: the random draws);
- statements: ``Let`` (set a local), ``Store``, ``For`` (``var`` from ``lo`` up to
  ``hi``, step 1), ``If`` and ``Fail`` (return an error code: the runtime turns it into
  the exit-3 message of the failed point).

Every object is a frozen dataclass: a kernel can be hashed, compared and printed
(``text``), and its renderers (``timerlc.llvm.render``) see nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DTYPES = ("bool", "i32", "i64", "f32", "f64")
SIZES = {"bool": 1, "i32": 4, "i64": 8, "f32": 4, "f64": 8}

UNARY = frozenset(
    [
        "neg",
        "abs",
        "sign",
        "exp",
        "log",
        "log1p",
        "sqrt",
        "tanh",
        "sigmoid",
        "sin",
        "cos",
        "floor",
        "ceil",
        "round",
        "not",
    ]
)
# comparisons give bool; the others give their operands' dtype
COMPARE = frozenset(["lt", "le", "gt", "ge", "eq", "ne"])
BINARY = (
    frozenset(
        [
            "add",
            "sub",
            "mul",
            "div",
            "floordiv",
            "mod",
            "rem",
            "pow",
            "minimum",
            "maximum",
            "and",
            "or",
        ]
    )
    | COMPARE
)
REDUCE_OPS = frozenset({"add", "mul", "maximum", "minimum"})  # a ``For.reduce``'s ops


@dataclass(frozen=True, slots=True)
class Const:
    dtype: str
    value: int | float | bool


@dataclass(frozen=True, slots=True)
class Ref:
    name: str
    dtype: str = "i64"


@dataclass(frozen=True, slots=True)
class Load:
    buf: str
    index: Expr
    dtype: str


@dataclass(frozen=True, slots=True)
class Un:
    op: str
    x: Expr
    dtype: str


@dataclass(frozen=True, slots=True)
class Bin:
    op: str
    a: Expr
    b: Expr
    dtype: str


@dataclass(frozen=True, slots=True)
class Sel:
    cond: Expr
    a: Expr
    b: Expr
    dtype: str


@dataclass(frozen=True, slots=True)
class Cast:
    x: Expr
    dtype: str


@dataclass(frozen=True, slots=True)
class Fn:
    name: str
    args: tuple
    dtype: str


Expr = Const | Ref | Load | Un | Bin | Sel | Cast | Fn


@dataclass(frozen=True, slots=True)
class Let:
    name: str
    dtype: str
    value: Expr


@dataclass(frozen=True, slots=True)
class Store:
    buf: str
    index: Expr
    value: Expr


@dataclass(frozen=True, slots=True)
class For:
    """``var`` from ``lo`` up to ``hi``; ``parallel``: its iterations are independent (a
    statement's loop over its vector dims: each computes its own point, its per-point
    temporaries its own), so that a renderer may run them on threads of their own.

    ``reduce``: ``(accumulator, op)`` pairs: the iterations are independent but for
    combining terms into each accumulator with ``op`` (``REDUCE_OPS``: associative, so that
    a renderer may combine them in another order, as a tree). An accumulator is a local the
    body assigns only as ``acc = op(acc, x)`` (``x`` not reading ``acc``), or a temporary
    that the body updates only as ``t[i] = op(t[i], x)``: of one element, or with the
    updates inside the body's one parallel loop, each iteration of that inner loop its own
    elements. A serial renderer ignores both marks."""

    var: str
    lo: Expr
    hi: Expr
    body: tuple
    parallel: bool = False
    reduce: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class If:
    cond: Expr
    then: tuple
    orelse: tuple = ()


@dataclass(frozen=True, slots=True)
class Fail:
    code: int


@dataclass(frozen=True, slots=True)
class Loop:
    """A loop of the plan's tree: ``var = init; while cond: body; var += inc`` (each step
    counts against the run's budget of loop steps)."""

    var: str
    init: Expr
    cond: Expr
    inc: int
    body: tuple


@dataclass(frozen=True, slots=True)
class Launch:
    """A call of statement ``sid``'s kernel with its loop dims at ``args`` (each checked to
    lie in ``box``); of a fused kernel (``Kernel.parts``), ``sids`` are its statements."""

    kernel: str
    sid: int
    args: tuple
    box: tuple
    sids: tuple = ()


@dataclass(frozen=True, slots=True)
class Host:
    """A call back into the runtime for statement ``sid`` at ``args``: ``mode`` 0 runs the
    statement there (an environment call, or a statement without a kernel), 1 records what
    its kernel computed (an output's points, a metric's values)."""

    sid: int
    mode: int
    args: tuple


@dataclass(frozen=True, slots=True)
class Gemm:
    """``c[coff:] = op(a) @ op(b)`` by the BLAS (``sgemm``/``dgemm``, row-major): ``op``
    transposes where ``ta``/``tb``; ``m x k`` times ``k x n``; ``lda``, ``ldb``, ``ldc``
    the leading dimensions, offsets in elements."""

    dtype: str
    ta: bool
    tb: bool
    m: int | Expr  # (an expression in a row variant's products: ``codegen.rows``)
    n: int
    k: int
    a: str
    aoff: Expr
    lda: int
    b: str
    boff: Expr
    ldb: int
    c: str
    coff: Expr
    ldc: int


@dataclass(frozen=True, slots=True)
class Permute:
    """``out[0:n]`` = the random permutation of ``range(n)`` at point index ``p`` (the
    runtime library's ``tl_rng_permutation``; ``scratch``: a temporary of 2n i64)."""

    seed: int
    site: int
    p: Expr
    n: int
    out: str
    scratch: str


@dataclass(frozen=True, slots=True)
class Rows:
    """A loop of the tree that runs by chunks of rows (``codegen.rows``): ``loop`` as it
    runs on one thread, and ``chunk``, the same loop whose launches call each kernel's row
    variant (two more arguments: the chunk's first row and its end). The threads take
    chunks of the rows ``lo ..< hi`` (at least ``grain`` rows each), each of them runs
    ``chunk`` with ``scratch`` bytes of its own; where the budget of loop steps would run
    out, ``loop`` runs instead. ``sids``: the statements the body calls, in order (a
    profile counts the loop's time at the first)."""

    loop: Loop
    chunk: Loop
    lo: int
    hi: int
    grain: int
    scratch: int
    sids: tuple[int, ...] = ()


Stmt = Let | Store | For | If | Fail | Loop | Launch | Host | Gemm | Permute | Rows


@dataclass(frozen=True, slots=True)
class Slot:
    """A buffer of the runtime's table: output ``out`` of statement ``sid``'s buffer, at
    entry ``index`` of the table; or, with ``state`` (``E.name``), an array of an
    environment's state that the runtime owns (``codegen.envs``; ``sid`` and ``out`` -1)."""

    name: str
    dtype: str
    index: int
    sid: int
    out: int
    write: bool
    state: str = ""


@dataclass(frozen=True, slots=True)
class Temp:
    """A region of the scratch area: ``size`` elements at byte ``offset``."""

    name: str
    dtype: str
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class Kernel:
    """One function ``i32 name(table, args, scratch)``: ``args`` holds ``nargs`` i64 values
    (named ``params``, locals of the body); it returns 0, or the code of a ``Fail``."""

    name: str
    sid: int
    params: tuple[str, ...]
    slots: tuple[Slot, ...]
    temps: tuple[Temp, ...]
    body: tuple
    # slots that may share memory (a donor's buffer and the statement's own, which takes
    # the donor's memory): every other pair of buffers is disjoint memory
    shared: tuple[str, ...] = ()
    # a fused kernel (``codegen.fuse``): the statements it computes, in order; a ``Fail``
    # of the n-th returns n (1 for the first)
    parts: tuple[int, ...] = ()
    # a call runs the body this many times, its last param (``plan.items.BLOCK_LOOP``) 0, 1,
    # ... (the cuda target's blocks of a statement over many points, ``lower``)
    repeat: int = 1
    # runs inside a chunk of a row loop (``Rows``): on the chunk's thread alone, its products
    # by the BLAS on that thread
    alone: bool = False

    @property
    def scratch_bytes(self) -> int:
        return max((t.offset + t.size * SIZES[t.dtype] for t in self.temps), default=0)


MAX_ARGS = 16  # loop dims of a statement (plan.items.MAX_RANK)


@dataclass(frozen=True, slots=True)
class Tree:
    """One top-level item of the plan's loop tree as a function ``i32 name(table, args,
    scratch, host, err)``: for a loop, its body (``params``: the loop's variable), else the
    item itself. ``host`` is the runtime's callback ``i32(sid, mode, args)``; ``err`` holds
    i64 values: the loop steps left, then, when the function returns non-zero, the failing
    statement and its loop values (``runtime.cpu`` reads them)."""

    name: str
    item: int
    params: tuple[str, ...]
    body: tuple
    scratch_bytes: int


# ----------------------------------------------------------------------------- helpers
def i64(v: int) -> Const:
    return Const("i64", int(v))


def add(a: Expr, b: Expr) -> Expr:
    """``a + b`` on i64, folded where both are constants or one is 0."""
    if isinstance(a, Const) and isinstance(b, Const):
        return i64(a.value + b.value)
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(b, Const) and b.value == 0:
        return a
    return Bin("add", a, b, "i64")


def mul(a: Expr, k: int) -> Expr:
    """``a * k`` on i64 for an int ``k``, folded."""
    if k == 0:
        return i64(0)
    if k == 1:
        return a
    if isinstance(a, Const):
        return i64(a.value * k)
    return Bin("mul", a, i64(k), "i64")


def conj(a: Expr | None, b: Expr) -> Expr:
    """``a and b`` on bools, ``b`` where there is no ``a`` (a guard built condition by
    condition)."""
    return b if a is None else Bin("and", a, b, "bool")


def linear(idx: list, shape: tuple) -> Expr:
    """The row-major position of element ``idx`` of an array of ``shape``."""
    out: Expr = i64(0)
    stride = 1
    for e, n in reversed(list(zip(idx, shape))):
        if n != 1:
            out = add(out, mul(e, stride))
        stride *= n
    return out


def children(e) -> tuple:
    """An expression's operands (a load's index; none for a constant or a local)."""
    if isinstance(e, Load):
        return (e.index,)
    if isinstance(e, (Un, Cast)):
        return (e.x,)
    if isinstance(e, Bin):
        return (e.a, e.b)
    if isinstance(e, Sel):
        return (e.cond, e.a, e.b)
    if isinstance(e, Fn):
        return tuple(e.args)
    return ()


def walk_tree(body):
    """Every statement of a kernel's or a tree function's body, outer first, loops' and ifs'
    bodies included (``nested``)."""
    for s in body:
        yield s
        yield from walk_tree(nested(s))


def nested(s) -> tuple:
    """The statements statement ``s`` holds: a loop's body, an if's branches one after the
    other."""
    if isinstance(s, (For, Loop)):
        return s.body
    if isinstance(s, If):
        return (*s.then, *s.orelse)
    if isinstance(s, Rows):
        return (s.loop, s.chunk)
    return ()


def rewrite(x, fn):
    """``x`` (a statement, an expression, a tuple of them) with ``fn`` applied to every
    node, inner ones first."""
    if isinstance(x, tuple):
        return tuple(rewrite(y, fn) for y in x)
    if dataclasses.is_dataclass(x):
        changes = {}
        for f in dataclasses.fields(x):
            v = getattr(x, f.name)
            if isinstance(v, tuple) or dataclasses.is_dataclass(v):
                w = rewrite(v, fn)
                if w is not v:
                    changes[f.name] = w
        return fn(dataclasses.replace(x, **changes) if changes else x)
    return x


_LEAVES = (Const, Ref)  # (expressions without operands)


def subexprs(e):
    """``e`` and every expression inside it, each before its operands, left to right."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        t = type(x)
        if t is Bin:
            stack.append(x.b)
            stack.append(x.a)
        elif t is Load:
            stack.append(x.index)
        elif t is Un or t is Cast:
            stack.append(x.x)
        elif t is Sel:
            stack.append(x.b)
            stack.append(x.a)
            stack.append(x.cond)
        elif t is Fn:
            stack.extend(reversed(x.args))
        elif t not in _LEAVES:  # (any other kind: what ``children`` says)
            stack.extend(reversed(children(x)))


def own_exprs(s) -> tuple:
    """The expressions of statement ``s`` itself (not those of the statements it holds)."""
    if isinstance(s, Let):
        return (s.value,)
    if isinstance(s, Store):
        return (s.index, s.value)
    if isinstance(s, For):
        return (s.lo, s.hi)
    if isinstance(s, If):
        return (s.cond,)
    if isinstance(s, Gemm):
        return (s.aoff, s.boff, s.coff)
    if isinstance(s, Permute):
        return (s.p,)
    return ()


def own_buffers(s) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(read, written): the buffers statement ``s`` itself uses other than by a ``Load``."""
    if isinstance(s, Store):
        return (), (s.buf,)
    if isinstance(s, Gemm):
        return (s.a, s.b), (s.c,)
    if isinstance(s, Permute):
        return (), (s.out, s.scratch)
    return (), ()


# ----------------------------------------------------------------------------- printing
def text(k: Kernel) -> str:
    """A readable listing of a kernel."""
    what = f"statements {', '.join(map(str, k.parts))}" if k.parts else f"statement {k.sid}"
    lines = [f"kernel {k.name}  ({what})  args({', '.join(k.params)})"]
    if k.repeat > 1:
        lines[0] += f"  repeated {k.repeat} times ({k.params[-1]} = 0 ..< {k.repeat})"
    if k.shared:
        lines.append(f"  shared memory: {', '.join(k.shared)}")
    for s in k.slots:
        mode = "rw" if s.write else "r"
        what = f"state {s.state}" if s.state else f"buffer {s.sid}.{s.out}"
        lines.append(f"  slot {s.name}: {s.dtype}* = table[{s.index}]  ({what}, {mode})")
    for t in k.temps:
        lines.append(f"  temp {t.name}: {t.dtype}[{t.size}] at scratch+{t.offset}")
    _stmts(k.body, 1, lines)
    return "\n".join(lines)


def tree_text(t: Tree) -> str:
    """A readable listing of a tree function."""
    lines = [f"tree {t.name}  (item {t.item} of the loop tree)  args({', '.join(t.params)})"]
    _stmts(t.body, 1, lines)
    return "\n".join(lines)


def _stmts(body, depth: int, lines: list):
    pad = "  " * depth
    for s in body:
        if isinstance(s, For):
            par = " (parallel)" if s.parallel else ""
            if s.reduce:
                par += " (reduce " + ", ".join(f"{a}: {op}" for a, op in s.reduce) + ")"
            lines.append(f"{pad}for {s.var} in {expr_text(s.lo)} ..< {expr_text(s.hi)}{par}:")
            _stmts(s.body, depth + 1, lines)
        elif isinstance(s, If):
            lines.append(f"{pad}if {expr_text(s.cond)}:")
            _stmts(s.then, depth + 1, lines)
            if s.orelse:
                lines.append(f"{pad}else:")
                _stmts(s.orelse, depth + 1, lines)
        elif isinstance(s, Let):
            lines.append(f"{pad}{s.name}: {s.dtype} = {expr_text(s.value)}")
        elif isinstance(s, Store):
            lines.append(f"{pad}{s.buf}[{expr_text(s.index)}] = {expr_text(s.value)}")
        elif isinstance(s, Fail):
            lines.append(f"{pad}fail {s.code}")
        elif isinstance(s, Permute):
            lines.append(
                f"{pad}{s.out}[0:{s.n}] = permutation(seed {s.seed}, site {s.site}, "
                f"point {expr_text(s.p)})"
            )
        elif isinstance(s, Gemm):
            ta, tb = "T" if s.ta else "", "T" if s.tb else ""
            m = s.m if isinstance(s.m, int) else f"({expr_text(s.m)})"
            lines.append(
                f"{pad}{s.c}[{expr_text(s.coff)}:] = gemm.{s.dtype} {m}x{s.k}x{s.n} "
                f"{s.a}[{expr_text(s.aoff)}:]{ta} (ld {s.lda}) @ "
                f"{s.b}[{expr_text(s.boff)}:]{tb} (ld {s.ldb}), ldc {s.ldc}"
            )
        elif isinstance(s, Loop):
            lines.append(
                f"{pad}loop {s.var} = {expr_text(s.init)} while {expr_text(s.cond)} step {s.inc}:"
            )
            _stmts(s.body, depth + 1, lines)
        elif isinstance(s, Launch):
            args = ", ".join(expr_text(a) for a in s.args)
            lines.append(f"{pad}launch {s.kernel}({args})")
        elif isinstance(s, Rows):
            lines.append(
                f"{pad}rows {s.lo} ..< {s.hi} by chunks of at least {s.grain} "
                f"({s.scratch} bytes of scratch each):"
            )
            _stmts((s.chunk,), depth + 1, lines)
            lines.append(f"{pad}else (too few loop steps left):")
            _stmts((s.loop,), depth + 1, lines)
        elif isinstance(s, Host):
            args = ", ".join(expr_text(a) for a in s.args)
            what = "run" if s.mode == 0 else "record"
            lines.append(f"{pad}host {what} statement {s.sid}({args})")
        else:  # pragma: no cover - a new statement kind without a printer
            raise TypeError(f"not a kernel statement: {s!r}")


_INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
    "and": "&&",
    "or": "||",
}


def expr_text(e) -> str:
    if isinstance(e, Const):
        return str(e.value) if e.dtype in ("i64", "bool") else f"{e.value!r}:{e.dtype}"
    if isinstance(e, Ref):
        return e.name
    if isinstance(e, Load):
        return f"{e.buf}[{expr_text(e.index)}]"
    if isinstance(e, Un):
        return f"{e.op}({expr_text(e.x)})"
    if isinstance(e, Bin):
        if e.op in _INFIX:
            return f"({expr_text(e.a)} {_INFIX[e.op]} {expr_text(e.b)})"
        return f"{e.op}({expr_text(e.a)}, {expr_text(e.b)})"
    if isinstance(e, Sel):
        return f"({expr_text(e.cond)} ? {expr_text(e.a)} : {expr_text(e.b)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({expr_text(e.x)})"
    if isinstance(e, Fn):
        return f"{e.name}({', '.join(expr_text(a) for a in e.args)})"
    raise TypeError(f"not a kernel expression: {e!r}")
