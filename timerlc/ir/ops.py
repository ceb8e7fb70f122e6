"""The op registry: every primitive PDG op declared once, with its type rule and its
NumPy meaning (the reference interpreter's semantics).

Ops are strict: their inputs already have the dtypes the rule asks for; the front end
inserts casts for dtype promotion. A type rule raises ``TypeRuleError`` with a message
that names both offending types; the front end attaches the source span.
Later stages add to each entry (derivative, CUDA and LLVM renderings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from timerlc.ir.types import TensorType, format_shape, is_float, numpy_dtype


class TypeRuleError(Exception):
    """An op applied to types it does not accept."""


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str  # elementwise | reduce | shape | index | source | control
    arity: int | None  # None: any number of inputs
    infer: Callable[[dict, list[TensorType]], TensorType]
    numpy: Callable[..., Any]  # (attrs, args, point) -> ndarray
    doc: str = ""


REGISTRY: dict[str, OpDef] = {}


def op(name: str, kind: str, arity: int | None, doc: str = ""):
    def register(rules):
        """``rules`` is ``(infer, impl)`` or a function returning it."""
        infer, impl = rules() if callable(rules) else rules
        REGISTRY[name] = OpDef(name, kind, arity, infer, impl, doc)
        return rules

    return register


def get(name: str) -> OpDef:
    return REGISTRY[name]


def infer(name: str, attrs: dict, types: list[TensorType]) -> TensorType:
    d = REGISTRY[name]
    if d.arity is not None and len(types) != d.arity:
        raise TypeRuleError(f"{name} takes {d.arity} inputs, got {len(types)}")
    return d.infer(attrs, types)


# ----------------------------------------------------------------------------- shape rules
def broadcast_shapes(*shapes) -> tuple:
    """NumPy broadcasting of static shapes (dynamic extents must match exactly)."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        extent = 1
        for s in shapes:
            j = k - (rank - len(s))
            if j < 0:
                continue
            e = s[j]
            if e == 1:
                continue
            if extent == 1:
                extent = e
            elif e != extent:
                raise TypeRuleError(
                    "shapes " + " and ".join(format_shape(s) for s in shapes) + " do not broadcast"
                )
        out.append(extent)
    return tuple(out)


def _same_dtype(types, what):
    dts = {t.dtype for t in types}
    if len(dts) > 1:
        raise TypeRuleError(f"{what}: dtypes {' and '.join(t.dtype for t in types)} differ")
    return types[0].dtype


def _need(pred, t: TensorType, what: str, words: str):
    if not pred(t.dtype):
        raise TypeRuleError(f"{what} needs {words}, got {t}")


def _static(t: TensorType, what: str):
    if not t.is_static:
        raise TypeRuleError(f"{what} cannot take a value of dynamic shape {format_shape(t.shape)}")


def _axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < max(rank, 1) or (rank == 0 and axis not in (0, -1)):
        raise TypeRuleError(f"{what}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def normalize_axes(axes, rank: int, what: str) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    if isinstance(axes, int):
        axes = (axes,)
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise TypeRuleError(f"{what}: axis {a} is out of range for rank {rank}")
        a %= rank
        if a in out:
            raise TypeRuleError(f"{what}: axis {a} repeated")
        out.append(a)
    return tuple(sorted(out))


# ----------------------------------------------------------------------------- elementwise
def _float_unary(fn):
    def infer(attrs, ts):
        (t,) = ts
        _need(is_float, t, attrs.get("_name", "op"), "a float")
        _static(t, "an elementwise op")
        return t

    return infer, lambda attrs, args, point: fn(args[0])


def _same_unary(fn, allow_bool=False):
    def infer(attrs, ts):
        (t,) = ts
        if t.dtype == "bool" and not allow_bool:
            raise TypeRuleError(f"this op needs a number, got {t}")
        _static(t, "an elementwise op")
        return t

    return infer, lambda attrs, args, point: fn(args[0])


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


for _name, _fn in {
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "sin": np.sin,
    "cos": np.cos,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
}.items():
    op(_name, "elementwise", 1)(_float_unary(_fn))

op("neg", "elementwise", 1)(_same_unary(np.negative))
op("abs", "elementwise", 1)(_same_unary(np.abs))
op("sign", "elementwise", 1)(_same_unary(np.sign))
op("stop_grad", "elementwise", 1, "identity; no gradient flows through")(
    _same_unary(lambda x: x, allow_bool=True)
)
op("copy", "elementwise", 1, "identity")(_same_unary(lambda x: x, allow_bool=True))


@op("logical_not", "elementwise", 1)
def _():
    def infer(attrs, ts):
        (t,) = ts
        _need(lambda d: d == "bool", t, "not", "a bool")
        return t

    return infer, lambda attrs, args, point: np.logical_not(args[0])


@op("cast", "elementwise", 1, "attrs: dtype")
def _():
    def infer(attrs, ts):
        (t,) = ts
        _static(t, "a cast")
        return t.with_dtype(attrs["dtype"])

    def impl(attrs, args, point):
        x = args[0]
        dt = numpy_dtype(attrs["dtype"])
        if dt.kind in "iu" and x.dtype.kind == "f":
            x = np.trunc(x)
        return x.astype(dt)

    return infer, impl


def _binary(fn, result=None, check=None):
    def infer(attrs, ts):
        a, b = ts
        dtype = _same_dtype(ts, attrs.get("_name", "operator"))
        if check is not None:
            check(a)
        for t in ts:
            _static(t, "an elementwise op")
        return TensorType(result or dtype, broadcast_shapes(a.shape, b.shape))

    return infer, lambda attrs, args, point: fn(args[0], args[1])


def _no_bool(t):
    if t.dtype == "bool":
        raise TypeRuleError(f"arithmetic needs numbers, got {t}")


def _floats(t):
    _need(is_float, t, "division", "floats")


def _bools(t):
    _need(lambda d: d == "bool", t, "a logical operator", "bools")


def _floor_divide(a, b):
    if a.dtype.kind == "f":
        return np.floor(a / b)
    return np.floor_divide(a, b)


def _power(a, b):
    if a.dtype.kind in "iu":
        # integer powers: negative exponents give 0 except for bases 1 and -1 (no error)
        safe = np.where(b < 0, 0, b)
        r = np.power(a, safe)
        neg = b < 0
        if np.any(neg):
            r = np.where(
                neg, np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0)), r
            )
        return r.astype(a.dtype)
    return np.power(a, b)


for _name, _fn, _chk in [
    ("add", np.add, _no_bool),
    ("sub", np.subtract, _no_bool),
    ("mul", np.multiply, _no_bool),
    ("div", np.divide, _floats),
    ("floordiv", _floor_divide, _no_bool),
    ("mod", np.mod, _no_bool),
    ("pow", _power, _no_bool),
    ("minimum", np.minimum, None),
    ("maximum", np.maximum, None),
]:
    op(_name, "elementwise", 2)(_binary(_fn, check=_chk))

for _name, _fn in [
    ("lt", np.less),
    ("le", np.less_equal),
    ("gt", np.greater),
    ("ge", np.greater_equal),
    ("eq", np.equal),
    ("ne", np.not_equal),
]:
    op(_name, "elementwise", 2)(_binary(_fn, result="bool"))

op("logical_and", "elementwise", 2)(_binary(np.logical_and, check=_bools))
op("logical_or", "elementwise", 2)(_binary(np.logical_or, check=_bools))


@op("where", "elementwise", 3)
def _():
    def infer(attrs, ts):
        c, a, b = ts
        _need(lambda d: d == "bool", c, "where", "a bool condition")
        dtype = _same_dtype([a, b], "where")
        for t in ts:
            _static(t, "where")
        return TensorType(dtype, broadcast_shapes(c.shape, a.shape, b.shape))

    return infer, lambda attrs, args, point: np.where(args[0], args[1], args[2])


# ----------------------------------------------------------------------------- reductions
def _reduce(fn, dtype_check=None, result=None):
    def infer(attrs, ts):
        (t,) = ts
        if dtype_check is not None:
            dtype_check(t)
        axes = normalize_axes(attrs.get("axes"), t.rank, "reduction")
        for k, s in enumerate(t.shape):
            if k not in axes and not isinstance(s, int):
                raise TypeRuleError(
                    f"a reduction must reduce the dynamic axis {k} of its argument "
                    f"{format_shape(t.shape)}"
                )
        if attrs.get("keepdims"):
            shape = tuple(1 if k in axes else s for k, s in enumerate(t.shape))
        else:
            shape = tuple(s for k, s in enumerate(t.shape) if k not in axes)
        return TensorType(result or t.dtype, shape)

    def impl(attrs, args, point):
        x = args[0]
        axes = attrs.get("axes")
        axes = tuple(range(x.ndim)) if axes is None else tuple(axes)
        return fn(x, axes, bool(attrs.get("keepdims")))

    return infer, impl


def _logsumexp(x, axes, keepdims):
    if x.size == 0:
        shape = tuple(1 if k in axes else s for k, s in enumerate(x.shape))
        r = np.full(shape, -np.inf, x.dtype)
        return r if keepdims else np.squeeze(r, axes)
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    r = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return r if keepdims else np.squeeze(r, axes)


def _empty_check(name):
    def fn(x, axes, keepdims):
        if any(x.shape[a] == 0 for a in axes):
            raise ValueError(f"{name} of an empty slice")
        return getattr(np, name)(x, axis=axes, keepdims=keepdims)

    return fn


op("sum", "reduce", 1)(_reduce(lambda x, a, k: np.sum(x, axis=a, keepdims=k), _no_bool))
op("prod", "reduce", 1)(_reduce(lambda x, a, k: np.prod(x, axis=a, keepdims=k), _no_bool))
op("max", "reduce", 1)(_reduce(_empty_check("max")))
op("min", "reduce", 1)(_reduce(_empty_check("min")))
op("mean", "reduce", 1)(
    _reduce(
        lambda x, a, k: np.mean(x, axis=a, keepdims=k),
        lambda t: _need(is_float, t, "mean", "floats"),
    )
)
op("logsumexp", "reduce", 1)(
    _reduce(_logsumexp, lambda t: _need(is_float, t, "logsumexp", "floats"))
)


def _arg_reduce(fn):
    def infer(attrs, ts):
        (t,) = ts
        _static(t, "argmax/argmin")
        axis = attrs.get("axis")
        if axis is None:
            return TensorType("i32", ())
        axis = _axis(axis, t.rank, "argmax/argmin")
        return TensorType("i32", tuple(s for k, s in enumerate(t.shape) if k != axis))

    def impl(attrs, args, point):
        x = args[0]
        if x.size == 0:
            raise ValueError("argmax/argmin of an empty array")
        return fn(x, axis=attrs.get("axis"))

    return infer, impl


op("argmax", "reduce", 1, "attrs: axis (None: flat index)")(_arg_reduce(np.argmax))
op("argmin", "reduce", 1, "attrs: axis (None: flat index)")(_arg_reduce(np.argmin))


@op("discounted_sum", "reduce", 2, "sum_k gamma**k x[k] along axis 0 (reverse: gamma**(n-1-k))")
def _():
    def infer(attrs, ts):
        x, g = ts
        _need(is_float, x, "discounted_sum", "floats")
        _same_dtype([x, g], "discounted_sum")
        if x.rank == 0:
            raise TypeRuleError(f"discounted_sum needs an array, got {x}")
        if g.shape != ():
            raise TypeRuleError(f"discounted_sum needs a scalar discount, got {g}")
        for s in x.shape[1:]:
            if not isinstance(s, int):
                raise TypeRuleError("discounted_sum reduces only axis 0")
        return TensorType(x.dtype, x.shape[1:])

    def impl(attrs, args, point):
        x, g = args
        if attrs.get("reverse"):
            x = x[::-1]
        acc = np.zeros(x.shape[1:], x.dtype)
        for k in range(x.shape[0] - 1, -1, -1):  # Horner: x0 + g (x1 + g (x2 + ...))
            acc = x[k] + g * acc
        return acc

    return infer, impl


@op("grad", "control", 2, "d y / d x at this point: inputs (y, x); replaced by the autodiff pass")
def _():
    def infer(attrs, ts):
        y, x = ts
        if y.shape != () or not is_float(y.dtype) or not is_float(x.dtype):
            raise TypeRuleError(f"grad of {y} with respect to {x}")
        return x

    def impl(attrs, args, point):
        raise RuntimeError("grad nodes must be replaced by timerlc.passes.autodiff before running")

    return infer, impl


@op("cumsum", "reduce", 1, "attrs: axis (None: flattened)")
def _():
    def infer(attrs, ts):
        (t,) = ts
        _no_bool(t)
        _static(t, "cumsum")
        axis = attrs.get("axis")
        if axis is None:
            n = 1
            for s in t.shape:
                n *= s
            return TensorType(t.dtype, (n,))
        _axis(axis, t.rank, "cumsum")
        return t

    return infer, lambda attrs, args, point: np.cumsum(args[0], axis=attrs.get("axis"))


# the array ops register themselves into REGISTRY
from timerlc.ir import ops_array, ops_rl  # noqa: E402, F401
