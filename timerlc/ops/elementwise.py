"""Elementwise ops: unary math, arithmetic and comparisons (NumPy broadcasting over the
spatial shapes), logical ops, ``where`` and ``cast``. All of them are cheap (inlined where
they are read)."""

from __future__ import annotations

import numpy as np

from timerlc.ops.core import (
    NO_GRAD,
    TypeRuleError,
    broadcast_shapes,
    define,
    need,
    no_bool,
    same_dtype,
    static,
)
from timerlc.ops.grads import identity, like
from timerlc.ops.kernel import align, numpy_dtype
from timerlc.types import TensorType, is_float


# ----------------------------------------------------------------------------- type rules
def _float_unary(attrs, ts):
    (t,) = ts
    need(is_float, t, attrs.get("_name", "op"), "a float")
    static(t, "an elementwise op")
    return t


def _number_unary(attrs, ts):
    (t,) = ts
    if t.dtype == "bool":
        raise TypeRuleError(f"this op needs a number, got {t}")
    static(t, "an elementwise op")
    return t


def _any_unary(attrs, ts):
    (t,) = ts
    static(t, "an elementwise op")
    return t


def _binary(check=None, result=None):
    def infer(attrs, ts):
        a, b = ts
        dtype = same_dtype(ts, attrs.get("_name", "operator"))
        if check is not None:
            check(a)
        for t in ts:
            static(t, "an elementwise op")
        return TensorType(result or dtype, broadcast_shapes(a.shape, b.shape))

    return infer


def _floats(t):
    need(is_float, t, "division", "floats")


def _bools(t):
    need(lambda d: d == "bool", t, "a logical operator", "bools")


# ----------------------------------------------------------------------------- numerics
def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _floor_divide(a, b):
    if a.dtype.kind == "f":
        return np.floor(a / b)
    return np.floor_divide(a, b)


def _power(a, b):
    if a.dtype.kind in "iu":
        # integer powers: negative exponents give 0 except for bases 1 and -1 (no error)
        neg = b < 0
        r = np.power(a, np.where(neg, 0, b))
        if np.any(neg):
            r = np.where(
                neg, np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0)), r
            )
        return r.astype(a.dtype)
    return np.power(a, b)


def _unary_kernel(fn):
    return lambda ctx, attrs, args: fn(args[0])


def _binary_kernel(fn):
    def kernel(ctx, attrs, args):
        a, b = align(args, ctx.nb)
        return fn(a, b)

    return kernel


def _identity(x):
    return x


# ----------------------------------------------------------------------------- gradients
def _one(node, em):
    return em.const(1.0, node.type.dtype)


def _neg(em, node, k, g):
    return em.op("neg", g)


def _abs(em, node, k, g):
    return em.op("mul", g, em.op("sign", em.fwd(0)))


def _exp(em, node, k, g):
    return em.op("mul", g, em.out())


def _log(em, node, k, g):
    return em.op("div", g, em.fwd(0))


def _log1p(em, node, k, g):
    return em.op("div", g, em.op("add", _one(node, em), em.fwd(0)))


def _sqrt(em, node, k, g):
    return em.op("div", g, em.op("mul", em.const(2.0, node.type.dtype), em.out()))


def _tanh(em, node, k, g):
    y = em.out()
    return em.op("mul", g, em.op("sub", _one(node, em), em.op("mul", y, y)))


def _sigmoid_vjp(em, node, k, g):
    y = em.out()
    return em.op("mul", g, em.op("mul", y, em.op("sub", _one(node, em), y)))


def _sin(em, node, k, g):
    return em.op("mul", g, em.op("cos", em.fwd(0)))


def _cos(em, node, k, g):
    return em.op("neg", em.op("mul", g, em.op("sin", em.fwd(0))))


def _cast_vjp(em, node, k, g):
    return em.op("cast", g, dtype=em.in_type(k).dtype)


def _add(em, node, k, g):
    return like(em, g, k)


def _sub(em, node, k, g):
    return like(em, g if k == 0 else em.op("neg", g), k)


def _mul(em, node, k, g):
    return like(em, em.op("mul", g, em.fwd(1 - k)), k)


def _div(em, node, k, g):
    if k == 0:
        return like(em, em.op("div", g, em.fwd(1)), k)
    return like(em, em.op("neg", em.op("div", em.op("mul", g, em.out()), em.fwd(1))), k)


def _pow(em, node, k, g):
    a, b = em.fwd(0), em.fwd(1)
    zero = em.const(0.0, node.type.dtype)
    if k == 0:
        d = em.op("mul", b, em.op("pow", a, em.op("sub", b, _one(node, em))))
        d = em.op("where", em.op("eq", b, zero), zero, d)
    else:
        d = em.op("mul", em.out(), em.op("log", a))
        d = em.op("where", em.op("gt", a, zero), d, zero)
    return like(em, em.op("mul", g, d), k)


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
    return like(em, em.op("mul", g, w), k)


def _where_vjp(em, node, k, g):
    zero = em.const(0.0, node.type.dtype)
    picked = em.op("where", em.fwd(0), g, zero) if k == 1 else em.op("where", em.fwd(0), zero, g)
    return like(em, picked, k)


# ----------------------------------------------------------------------------- the ops
for _name, _fn, _vjp in [
    ("exp", np.exp, _exp),
    ("log", np.log, _log),
    ("log1p", np.log1p, _log1p),
    ("sqrt", np.sqrt, _sqrt),
    ("tanh", np.tanh, _tanh),
    ("sigmoid", _sigmoid, _sigmoid_vjp),
    ("sin", np.sin, _sin),
    ("cos", np.cos, _cos),
    ("floor", np.floor, NO_GRAD),
    ("ceil", np.ceil, NO_GRAD),
    ("round", np.round, NO_GRAD),
]:
    define(_name, "elementwise", 1, _float_unary, _unary_kernel(_fn), vjp=_vjp, cheap=True)

define("neg", "elementwise", 1, _number_unary, _unary_kernel(np.negative), vjp=_neg, cheap=True)
define("abs", "elementwise", 1, _number_unary, _unary_kernel(np.abs), vjp=_abs, cheap=True)
define("sign", "elementwise", 1, _number_unary, _unary_kernel(np.sign), vjp=NO_GRAD, cheap=True)
define(
    "stop_grad",
    "elementwise",
    1,
    _any_unary,
    _unary_kernel(_identity),
    vjp=NO_GRAD,
    cheap=True,
    doc="identity; no gradient flows through",
)
define(
    "copy",
    "elementwise",
    1,
    _any_unary,
    _unary_kernel(_identity),
    vjp=identity,
    cheap=True,
    doc="identity",
)


def _logical_not(attrs, ts):
    (t,) = ts
    need(lambda d: d == "bool", t, "not", "a bool")
    return t


define(
    "logical_not",
    "elementwise",
    1,
    _logical_not,
    _unary_kernel(np.logical_not),
    vjp=NO_GRAD,
    cheap=True,
)


def _cast_infer(attrs, ts):
    (t,) = ts
    static(t, "a cast")
    return t.with_dtype(attrs["dtype"])


def _cast(ctx, attrs, args):
    x = args[0]
    dt = numpy_dtype(attrs["dtype"])
    if dt.kind in "iu" and x.dtype.kind == "f":
        x = np.trunc(x)
    return x.astype(dt)


define(
    "cast",
    "elementwise",
    1,
    _cast_infer,
    _cast,
    vjp=_cast_vjp,
    attrs={"dtype": "dtype"},
    cheap=True,
    doc="attrs: dtype",
)

for _name, _fn, _chk, _vjp in [
    ("add", np.add, no_bool, _add),
    ("sub", np.subtract, no_bool, _sub),
    ("mul", np.multiply, no_bool, _mul),
    ("div", np.divide, _floats, _div),
    ("floordiv", _floor_divide, no_bool, NO_GRAD),
    ("mod", np.mod, no_bool, NO_GRAD),
    ("pow", _power, no_bool, _pow),
    ("minimum", np.minimum, None, _minmax),
    ("maximum", np.maximum, None, _minmax),
]:
    define(_name, "elementwise", 2, _binary(_chk), _binary_kernel(_fn), vjp=_vjp, cheap=True)

for _name, _fn in [
    ("lt", np.less),
    ("le", np.less_equal),
    ("gt", np.greater),
    ("ge", np.greater_equal),
    ("eq", np.equal),
    ("ne", np.not_equal),
]:
    define(
        _name,
        "elementwise",
        2,
        _binary(result="bool"),
        _binary_kernel(_fn),
        vjp=NO_GRAD,
        cheap=True,
    )

for _name, _fn in [("logical_and", np.logical_and), ("logical_or", np.logical_or)]:
    define(_name, "elementwise", 2, _binary(_bools), _binary_kernel(_fn), vjp=NO_GRAD, cheap=True)


def _where_infer(attrs, ts):
    c, a, b = ts
    need(lambda d: d == "bool", c, "where", "a bool condition")
    dtype = same_dtype([a, b], "where")
    for t in ts:
        static(t, "where")
    return TensorType(dtype, broadcast_shapes(c.shape, a.shape, b.shape))


def _where(ctx, attrs, args):
    c, a, b = align(args, ctx.nb)
    return np.where(c, a, b)


define(
    "where",
    "elementwise",
    3,
    _where_infer,
    _where,
    vjp=_where_vjp,
    grad_inputs=(1, 2),
    cheap=True,
)
