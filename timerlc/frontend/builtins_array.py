"""Built-in functions on arrays: shapes, creation, the nn helpers, and the functions whose
meaning comes with a later part of timerlc. Registered into ``builtins.BUILTINS``.
"""

from __future__ import annotations

import math

from timerlc.diagnostics import ProgramError
from timerlc.frontend import ast
from timerlc.frontend.builtins import Args, _is_none, _where, builtin
from timerlc.frontend.values import Val
from timerlc.types import format_shape


# ----------------------------------------------------------------------------- shapes
def _static_shape(a: Args, key) -> tuple[int, ...]:
    shape = a.int_list(key)
    for s in shape:
        if s < 0:
            raise ProgramError(f"a shape entry must not be negative, got {s}", a.expr(key).span)
    return shape


@builtin("reshape", "x", "shape")
def _reshape(a: Args):
    x = a.value("x")
    shape = list(a.int_list("shape"))
    size = math.prod(x.shape) if x.type.is_static else None
    if shape.count(-1) > 1:
        raise ProgramError("reshape: at most one -1", a.expr("shape").span)
    if -1 in shape and size is not None:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or size % rest:
            raise ProgramError(f"cannot reshape {x.type} into {shape}", a.span)
        shape[shape.index(-1)] = size // rest
    return a.el.apply("reshape", [x], a.span, shape=tuple(shape))


@builtin("flatten", "x")
def _flatten(a: Args):
    x = a.value("x")
    n = math.prod(x.shape) if x.type.is_static else 0
    return a.el.apply("reshape", [x], a.span, shape=(n,))


@builtin("transpose", "x", ("perm", None))
def _transpose(a: Args):
    x = a.value("x")
    perm = a.int_list("perm", tuple(reversed(range(x.type.rank))))
    perm = tuple(p % x.type.rank if x.type.rank else p for p in perm)
    return a.el.apply("transpose", [x], a.span, perm=perm)


def _value_list(a: Args, key) -> list[Val]:
    e = a.expr(key)
    if not isinstance(e, (ast.ListLit, ast.TupleLit)):
        raise ProgramError(f"{a.name} takes a list of arrays like [a, b]", e.span)
    if not e.items:
        raise ProgramError(f"{a.name} needs at least one array", e.span)
    return [a.el.tensor_value(x, a.env, a.name) for x in e.items]


@builtin("concat", "xs", ("axis", None))
def _concat(a: Args):
    xs, _ = a.el.unify(_value_list(a, "xs"))
    axis = a.axis("axis", xs[0].type.rank, 0)
    return a.el.apply("concat", xs, a.span, axis=axis)


@builtin("stack", "xs", ("axis", None))
def _stack(a: Args):
    xs, _ = a.el.unify(_value_list(a, "xs"))
    for x in xs[1:]:
        if x.shape != xs[0].shape:
            raise ProgramError(
                f"stack needs arrays of one shape, got {format_shape(xs[0].shape)} and "
                f"{format_shape(x.shape)}",
                a.span,
            )
    axis = a.axis("axis", xs[0].type.rank, 0, extra=1)
    xs = [a.el.apply("expand_dims", [x], a.span, axis=axis) for x in xs]
    return a.el.apply("concat", xs, a.span, axis=axis)


@builtin("expand", "x", "axis")
def _expand(a: Args):
    x = a.value("x")
    return a.el.apply("expand_dims", [x], a.span, axis=a.axis("axis", x.type.rank, extra=1))


@builtin("squeeze", "x", ("axis", None))
def _squeeze(a: Args):
    x = a.value("x")
    if not a.given("axis") or _is_none(a.expr("axis")):
        axes = tuple(k for k, s in enumerate(x.shape) if s == 1)
    else:
        axes = a.axes("axis", x.type.rank)
    return a.el.apply("squeeze", [x], a.span, axes=axes)


@builtin("broadcast", "x", "shape")
def _broadcast(a: Args):
    x = a.value("x")
    return a.el.apply(
        "broadcast_to", [a.el.materialize(x)], a.span, shape=_static_shape(a, "shape")
    )


def _index_arg(a: Args, key) -> Val:
    v = a.value(key)
    if not v.dtype.startswith("i"):
        raise ProgramError(f"{a.name} needs integer indices, got {v.type}", a.expr(key).span)
    return v


@builtin("take", "x", "idx", ("axis", None))
def _take(a: Args):
    x = a.value("x")
    idx = _index_arg(a, "idx")
    return a.el.apply("take", [x, idx], a.span, axis=a.axis("axis", x.type.rank))


@builtin("take_along", "x", "idx", "axis")
def _take_along(a: Args):
    x = a.value("x")
    idx = _index_arg(a, "idx")
    return a.el.apply("take_along", [x, idx], a.span, axis=a.axis("axis", x.type.rank))


@builtin("one_hot", "k", "n", ("dtype", None))
def _one_hot(a: Args):
    el = a.el
    k = _index_arg(a, "k")
    n = a.const_int("n")
    if n < 0:
        raise ProgramError(f"one_hot needs n >= 0, got {n}", a.expr("n").span)
    dtype = a.dtype("dtype", "f32")
    r = el.apply("arange", [], a.span, start=0, stop=n, step=1, dtype=k.dtype)
    kk = el.apply("expand_dims", [el.materialize(k)], a.span, axis=k.type.rank)
    return el.cast(el.apply("eq", [kk, r], a.span), dtype)


# ----------------------------------------------------------------------------- creation
def _filled(a: Args, value):
    dtype = a.dtype("dtype", "f32")
    return a.el.const(value, dtype, _static_shape(a, "shape"), weak=False, span=a.span)


builtin("zeros", "shape", ("dtype", None))(lambda a: _filled(a, 0))
builtin("ones", "shape", ("dtype", None))(lambda a: _filled(a, 1))


@builtin("full", "value", "shape", ("dtype", None))
def _full(a: Args):
    el = a.el
    v = a.value("value")
    if v.shape != ():
        raise ProgramError(f"full takes a scalar value, got {v.type}", a.expr("value").span)
    dtype = a.dtype("dtype", v.dtype)
    shape = _static_shape(a, "shape")
    if v.const is not None:
        return el.const(v.const, dtype, shape, weak=False, span=a.span)
    return el.apply("broadcast_to", [el.cast(v, dtype)], a.span, shape=shape)


@builtin("arange", "start", ("stop", None), ("step", None), ("dtype", None))
def _arange(a: Args):
    start = a.const_int("start")
    stop = a.const_int("stop")
    if stop is None:
        start, stop = 0, start
    step = a.const_int("step", 1)
    if step == 0:
        raise ProgramError("arange step must not be 0", a.expr("step").span)
    dtype = a.dtype("dtype", "i32")
    if dtype == "bool":  # NumPy refuses it too (beyond length 2)
        raise ProgramError(
            "arange cannot make bools; compare instead: arange(n) % 2 == 0", a.expr("dtype").span
        )
    return a.el.apply("arange", [], a.span, start=start, stop=stop, step=step, dtype=dtype)


# ----------------------------------------------------------------------------- nn
def _log_softmax(el, x, axis, span):
    x = el.to_float(x)
    lse = el.apply("logsumexp", [x], span, axes=(axis,), keepdims=True)
    return el.binary("-", x, lse, span)


@builtin("log_softmax", "x", ("axis", None))
def _log_softmax_fn(a: Args):
    x = a.value("x")
    return _log_softmax(a.el, x, a.axis("axis", x.type.rank, x.type.rank - 1), a.span)


@builtin("softmax", "x", ("axis", None))
def _softmax(a: Args):
    x = a.value("x")
    return a.el.apply(
        "exp", [_log_softmax(a.el, x, a.axis("axis", x.type.rank, x.type.rank - 1), a.span)], a.span
    )


@builtin("entropy_logits", "logits")
def _entropy(a: Args):
    el = a.el
    x = a.value("logits")
    if x.type.rank == 0:
        raise ProgramError(
            f"entropy_logits needs logits with an action axis, got {x.type}", a.expr("logits").span
        )
    lsm = _log_softmax(el, x, x.type.rank - 1, a.span)
    p_logp = el.binary("*", el.apply("exp", [lsm], a.span), lsm, a.span)
    return el.unary("-", el.apply("sum", [p_logp], a.span, axes=(x.type.rank - 1,)), a.span)


@builtin("mse", "a", "b")
def _mse(a: Args):
    el = a.el
    d = el.binary("-", el.to_float(a.value("a")), a.value("b"), a.span)
    sq = el.binary("*", d, d, a.span)
    return el.apply("mean", [sq], a.span, axes=tuple(range(sq.type.rank)))


@builtin("huber", "a", "b", ("delta", None))
def _huber(a: Args):
    el = a.el
    delta = a.const_float("delta", 1.0)
    d = el.apply("abs", [el.binary("-", el.to_float(a.value("a")), a.value("b"), a.span)], a.span)
    quad = el.binary("*", el.const(0.5), el.binary("*", d, d, a.span), a.span)
    lin = el.binary(
        "*", delta, el.binary("-", d, el.binary("*", el.const(0.5), delta, a.span), a.span), a.span
    )
    loss = _where(el, el.compare("<=", d, delta, a.span), quad, lin, a.span)
    return el.apply("mean", [loss], a.span, axes=tuple(range(loss.type.rank)))


@builtin("normal_logp", "x", "mean", "log_std")
def _normal_logp(a: Args):
    el = a.el
    x, mean, log_std = a.value("x"), a.value("mean"), a.value("log_std")
    (x, mean, log_std), _ = el.unify([x, mean, log_std], "float")
    z = el.binary("/", el.binary("-", x, mean, a.span), el.apply("exp", [log_std], a.span), a.span)
    quad = el.binary("*", el.const(-0.5), el.binary("*", z, z, a.span), a.span)
    return el.binary(
        "-", el.binary("-", quad, log_std, a.span), el.const(0.5 * math.log(2 * math.pi)), a.span
    )
