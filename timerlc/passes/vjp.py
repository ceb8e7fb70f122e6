"""Vector-Jacobian products of the primitive ops, for the autodiff pass.

``vjp(em, node, k, g)`` returns the node (in ``em``'s domain, the forward node's) holding
the contribution of the adjoint ``g`` of ``node``'s output to its input ``k``, with the
type that input edge delivers; None when no gradient flows to that input. Forward inputs
are read through the forward node's own edges (``em.fwd(k)``), its output through
``em.out()``. Reductions over a slice whose length depends on a dim return a
``Window`` instead: the pass sums a weight over the inverse window (see autodiff).
"""

from __future__ import annotations

from dataclasses import dataclass

from timerlc.diagnostics import ProgramError
from timerlc.ir.types import is_float

# ops whose inputs never receive a gradient
CUTS = frozenset(
    {
        "stop_grad",
        "argmax",
        "argmin",
        "lt",
        "le",
        "gt",
        "ge",
        "eq",
        "ne",
        "logical_and",
        "logical_or",
        "logical_not",
        "sign",
        "floor",
        "ceil",
        "round",
        "dimval",
        "index_value",
        "const",
        "arange",
        "floordiv",
        "mod",
        "env_reset",  # environments pass no gradient (LANGUAGE.md section 8)
        "env_step",
    }
)


def flows(node, k: int, in_type) -> bool:
    """Whether a gradient can flow from ``node``'s output into its input ``k``."""
    if node.op in CUTS or not is_float(in_type.dtype) or not is_float(node.type.dtype):
        return False
    if node.op == "where":
        return k > 0
    if node.op in ("index", "take", "take_along"):
        return k == 0
    return True


@dataclass(frozen=True)
class Window:
    """A reduction over a dynamic window: the input's adjoint at point s is the sum over the
    consumer points c whose window holds s of ``weight[c]`` (kind "sum"), or of
    ``weight[c] * gamma ** (s - lo(c))`` (kind "discounted", gamma from input 1)."""

    weight: int
    kind: str


def vjp(em, node, k: int, g: int):
    op = node.op
    fn = _RULES.get(op)
    if fn is None:
        raise ProgramError(f"the gradient of '{op}' is not supported yet", node.span)
    return fn(em, node, k, g)


def _unbroadcast(em, x: int, shape: tuple) -> int:
    """Sum ``x`` down to ``shape`` (undo NumPy broadcasting)."""
    xs = em.shape(x)
    if xs == tuple(shape):
        return x
    lead = len(xs) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + j for j, s in enumerate(shape) if s == 1 and xs[lead + j] != 1
    )
    if axes:
        x = em.op("sum", x, axes=axes, keepdims=True)
    if em.shape(x) != tuple(shape):
        x = em.op("reshape", x, shape=tuple(shape))
    return x


def _like(em, x: int, k: int) -> int:
    return _unbroadcast(em, x, em.in_type(k).shape)


def _rule(*names):
    def register(fn):
        for n in names:
            _RULES[n] = fn
        return fn

    return register


_RULES: dict = {}


@_rule("copy", "merge")
def _copy(em, node, k, g):
    return g


@_rule("cast")
def _cast(em, node, k, g):
    return em.op("cast", g, dtype=em.in_type(k).dtype)


@_rule("neg")
def _neg(em, node, k, g):
    return em.op("neg", g)


@_rule("add")
def _add(em, node, k, g):
    return _like(em, g, k)


@_rule("sub")
def _sub(em, node, k, g):
    return _like(em, g if k == 0 else em.op("neg", g), k)


@_rule("mul")
def _mul(em, node, k, g):
    return _like(em, em.op("mul", g, em.fwd(1 - k)), k)


@_rule("div")
def _div(em, node, k, g):
    if k == 0:
        return _like(em, em.op("div", g, em.fwd(1)), k)
    return _like(em, em.op("neg", em.op("div", em.op("mul", g, em.out()), em.fwd(1))), k)


@_rule("pow")
def _pow(em, node, k, g):
    a, b = em.fwd(0), em.fwd(1)
    zero = em.const(0.0, node.type.dtype)
    if k == 0:
        one = em.const(1.0, node.type.dtype)
        d = em.op("mul", b, em.op("pow", a, em.op("sub", b, one)))
        d = em.op("where", em.op("eq", b, zero), zero, d)
    else:
        d = em.op("mul", em.out(), em.op("log", a))
        d = em.op("where", em.op("gt", a, zero), d, zero)
    return _like(em, em.op("mul", g, d), k)


@_rule("minimum", "maximum")
def _minmax(em, node, k, g):
    a, b = em.fwd(0), em.fwd(1)
    dt = node.type.dtype
    mine, other = (a, b) if k == 0 else (b, a)
    wins = em.op("lt" if node.op == "minimum" else "gt", mine, other)
    w = em.op(
        "where",
        em.op("eq", a, b),
        em.const(0.5, dt),
        em.op("where", wins, em.const(1.0, dt), em.const(0.0, dt)),
    )
    return _like(em, em.op("mul", g, w), k)


@_rule("abs")
def _abs(em, node, k, g):
    return em.op("mul", g, em.op("sign", em.fwd(0)))


@_rule("exp")
def _exp(em, node, k, g):
    return em.op("mul", g, em.out())


@_rule("log")
def _log(em, node, k, g):
    return em.op("div", g, em.fwd(0))


@_rule("log1p")
def _log1p(em, node, k, g):
    return em.op("div", g, em.op("add", em.const(1.0, node.type.dtype), em.fwd(0)))


@_rule("sqrt")
def _sqrt(em, node, k, g):
    return em.op("div", g, em.op("mul", em.const(2.0, node.type.dtype), em.out()))


@_rule("tanh")
def _tanh(em, node, k, g):
    y = em.out()
    return em.op("mul", g, em.op("sub", em.const(1.0, node.type.dtype), em.op("mul", y, y)))


@_rule("sigmoid")
def _sigmoid(em, node, k, g):
    y = em.out()
    return em.op("mul", g, em.op("mul", y, em.op("sub", em.const(1.0, node.type.dtype), y)))


@_rule("sin")
def _sin(em, node, k, g):
    return em.op("mul", g, em.op("cos", em.fwd(0)))


@_rule("cos")
def _cos(em, node, k, g):
    return em.op("neg", em.op("mul", g, em.op("sin", em.fwd(0))))


@_rule("where")
def _where(em, node, k, g):
    zero = em.const(0.0, node.type.dtype)
    picked = em.op("where", em.fwd(0), g, zero) if k == 1 else em.op("where", em.fwd(0), zero, g)
    return _like(em, picked, k)


def _expand_reduced(em, node, x: int) -> int:
    """A reduction's output (or adjoint) with the reduced axes back, as length 1."""
    if node.attr("keepdims"):
        return x
    for a in sorted(node.attr("axes")):
        x = em.op("expand_dims", x, axis=a)
    return x


def _dynamic(em, k: int) -> bool:
    return not em.in_type(k).is_static


@_rule("sum", "mean")
def _sum(em, node, k, g):
    shape = em.in_type(k).shape
    if _dynamic(em, k):
        # the weight each element of the window gets: g with the other reduced axes back
        w = em.op("squeeze", _expand_reduced(em, node, g), axes=(0,))
        w = em.op("broadcast_to", w, shape=shape[1:])
        if node.op == "mean":
            others = 1
            for a in node.attr("axes"):
                others *= shape[a] if a else 1
            n = em.op("cast", em.window_length(), dtype=node.type.dtype)
            if others != 1:
                n = em.op("mul", n, em.const(float(others), node.type.dtype))
            w = em.op("div", w, n)
        return Window(w, "sum")
    ge = em.op("broadcast_to", _expand_reduced(em, node, g), shape=shape)
    if node.op == "mean":
        n = 1
        for a in node.attr("axes"):
            n *= shape[a]
        ge = em.op("div", ge, em.const(float(n), node.type.dtype))
    return ge


@_rule("prod")
def _prod(em, node, k, g):
    """The product of the other elements, also where some are zero."""
    shape = em.in_type(k).shape
    dt = node.type.dtype
    axes = node.attr("axes")
    x = em.fwd(0)
    zero, one = em.const(0.0, dt), em.const(1.0, dt)
    is0 = em.op("eq", x, zero)
    zeros = em.op("sum", em.op("cast", is0, dtype=dt), axes=axes, keepdims=True)
    nonzero = em.op("prod", em.op("where", is0, one, x), axes=axes, keepdims=True)
    nonzero = em.op("broadcast_to", nonzero, shape=shape)
    zeros = em.op("broadcast_to", zeros, shape=shape)
    # no zero: prod / x; one zero: the others' product at it, 0 elsewhere; more: 0
    d = em.op(
        "where",
        em.op("eq", zeros, zero),
        em.op("div", nonzero, em.op("where", is0, one, x)),
        em.op("where", em.op("logical_and", is0, em.op("eq", zeros, one)), nonzero, zero),
    )
    ge = em.op("broadcast_to", _expand_reduced(em, node, g), shape=shape)
    return em.op("mul", ge, d)


@_rule("max", "min")
def _max(em, node, k, g):
    if _dynamic(em, k):
        raise ProgramError(
            f"the gradient of {node.op} over a dynamic slice is not supported yet", node.span
        )
    shape = em.in_type(k).shape
    dt = node.type.dtype
    hit = em.op("cast", em.op("eq", em.fwd(0), _expand_reduced(em, node, em.out())), dtype=dt)
    count = em.op("sum", hit, axes=node.attr("axes"), keepdims=True)
    ge = em.op("broadcast_to", _expand_reduced(em, node, g), shape=shape)
    return em.op("div", em.op("mul", ge, hit), count)


@_rule("logsumexp")
def _logsumexp(em, node, k, g):
    if _dynamic(em, k):
        raise ProgramError(
            "the gradient of logsumexp over a dynamic slice is not supported yet", node.span
        )
    shape = em.in_type(k).shape
    p = em.op("exp", em.op("sub", em.fwd(0), _expand_reduced(em, node, em.out())))
    return em.op("mul", em.op("broadcast_to", _expand_reduced(em, node, g), shape=shape), p)


@_rule("discounted_sum")
def _discounted_sum(em, node, k, g):
    if k == 1:
        raise ProgramError(
            "the gradient with respect to the discount of discounted_sum is not supported",
            node.span,
        )
    if _dynamic(em, k):
        if node.attr("reverse"):
            raise ProgramError(
                "the gradient of a reversed discounted_sum is not supported", node.span
            )
        return Window(g, "discounted")
    shape = em.in_type(0).shape
    dt = node.type.dtype
    n = shape[0]
    rev = bool(node.attr("reverse"))
    exps = em.op(
        "arange",
        start=n - 1 if rev else 0,
        stop=-1 if rev else n,
        step=-1 if rev else 1,
        dtype="i32",
    )
    powers = em.op("pow", em.fwd(1), em.op("cast", exps, dtype=dt))
    powers = em.op("reshape", powers, shape=(n,) + (1,) * (len(shape) - 1))
    return em.op("mul", em.op("broadcast_to", em.op("expand_dims", g, axis=0), shape=shape), powers)


@_rule("cumsum")
def _cumsum(em, node, k, g):
    shape = em.in_type(0).shape
    axis = node.attr("axis")
    if axis is None:
        total = em.op("broadcast_to", em.op("sum", g, axes=(0,), keepdims=True), shape=em.shape(g))
        d = em.op("add", em.op("sub", total, em.op("cumsum", g, axis=0)), g)
        return em.op("reshape", d, shape=shape)
    total = em.op("broadcast_to", em.op("sum", g, axes=(axis,), keepdims=True), shape=shape)
    return em.op("add", em.op("sub", total, em.op("cumsum", g, axis=axis)), g)


def _swap(em, x: int) -> int:
    r = len(em.shape(x))
    return em.op("transpose", x, perm=tuple(range(r - 2)) + (r - 1, r - 2))


@_rule("matmul")
def _matmul(em, node, k, g):
    a_t, b_t = em.in_type(0), em.in_type(1)
    a, b = em.fwd(0), em.fwd(1)
    if a_t.rank == 1 and b_t.rank == 1:  # a dot product: g is a scalar
        return em.op("mul", g, b if k == 0 else a)
    if a_t.rank == 1:
        a = em.op("expand_dims", a, axis=0)
        g = em.op("expand_dims", g, axis=len(em.shape(g)) - 1)
    if b_t.rank == 1:
        b = em.op("expand_dims", b, axis=1)
        g = em.op("expand_dims", g, axis=len(em.shape(g)))
    if k == 0:
        d = em.op("matmul", g, _swap(em, b))
        d = _unbroadcast(em, d, em.shape(a))
        return em.op("reshape", d, shape=a_t.shape) if a_t.rank == 1 else d
    d = em.op("matmul", _swap(em, a), g)
    d = _unbroadcast(em, d, em.shape(b))
    return em.op("reshape", d, shape=b_t.shape) if b_t.rank == 1 else d


@_rule("reshape", "squeeze")
def _reshape(em, node, k, g):
    return em.op("reshape", g, shape=em.in_type(0).shape)


@_rule("transpose")
def _transpose(em, node, k, g):
    perm = node.attr("perm")
    inverse = tuple(sorted(range(len(perm)), key=lambda j: perm[j]))
    return em.op("transpose", g, perm=inverse)


@_rule("broadcast_to")
def _broadcast(em, node, k, g):
    return _like(em, g, 0)


@_rule("expand_dims")
def _expand_dims(em, node, k, g):
    return em.op("squeeze", g, axes=(node.attr("axis"),))


@_rule("concat")
def _concat(em, node, k, g):
    axis = node.attr("axis")
    start = sum(em.in_type(j).shape[axis] for j in range(k))
    n = em.in_type(k).shape[axis]
    from sympy import Integer

    items = (("full",),) * axis + (("slice", Integer(start), n),)
    return em.op("index", g, items=items)


@_rule("index")
def _index(em, node, k, g):
    args = [g] + ([em.fwd(1)] if len(node.inputs) > 1 else [])
    return em.op("index_add", *args, items=node.attr("items"), shape=em.in_type(0).shape)


@_rule("take")
def _take(em, node, k, g):
    shape = em.in_type(0).shape
    axis = node.attr("axis")
    if axis is None:
        n = 1
        for s in shape:
            n *= s
        flat = em.op("index_add", g, em.fwd(1), items=(("gather",),), shape=(n,))
        return em.op("reshape", flat, shape=shape)
    items = (("full",),) * axis + (("gather",),)
    return em.op("index_add", g, em.fwd(1), items=items, shape=shape)


@_rule("take_along")
def _take_along(em, node, k, g):
    return em.op("take_along_add", g, em.fwd(1), axis=node.attr("axis"), shape=em.in_type(0).shape)


@_rule("grad")
def _grad(em, node, k, g):
    raise ProgramError("a gradient of a gradient is not supported", node.span)
