"""The built-in functions of RTL (LANGUAGE.md section 6), elaborated into primitive ops.

Each built-in binds its arguments like Python (positional, then keyword), evaluates the
ones that are values, reads the ones that are static (shapes, axes, dtypes) as constants,
and emits primitive ops from ``timerlc.ops``; composite functions (softmax, mse, ...)
are written here in terms of primitives. Functions whose meaning comes with a later part
of timerlc (random draws, environments, gradients, optimizers) say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from timerlc.diagnostics import ProgramError, did_you_mean
from timerlc.frontend import ast
from timerlc.frontend.indexing import shape_entries, to_constant
from timerlc.frontend.values import RecordVal, TupleVal, Val
from timerlc.ops import TypeRuleError, normalize_axes
from timerlc.types import DTYPES, is_float

REQUIRED = object()


@dataclass(frozen=True)
class Builtin:
    name: str
    params: tuple[tuple[str, object], ...]  # (name, default or REQUIRED)
    fn: Callable
    records: bool = False  # applies field by field to records

    def call(self, el, call: ast.Call, env):
        args = self.bind(call)
        a = Args(el, env, args, call, self.name)
        if self.records:
            first = self.params[0][0]
            v = a.raw(first)
            if isinstance(v, RecordVal):
                return el.map_fields(lambda x: self.fn(a.with_value(first, x)), [v], call.span)
        return self.fn(a)

    def bind(self, call: ast.Call) -> dict:
        names = [p for p, _ in self.params]
        required = [p for p, d in self.params if d is REQUIRED]
        return bind_arguments(self.name, names, required, call)


def bind_arguments(label: str, names: list[str], required: list[str], call: ast.Call) -> dict:
    """Python's binding of a call's arguments to parameter names (-> name: expression)."""
    if len(call.args) > len(names):
        raise ProgramError(
            f"{label} takes {_count(len(required), len(names))}, got {len(call.args)}",
            call.func.span,
        )
    bound = dict(zip(names, call.args))
    for kw in call.kwargs:
        if kw.name not in names:
            raise ProgramError(
                f"{label} has no argument '{kw.name}'" + did_you_mean(kw.name, names), kw.span
            )
        if kw.name in bound:
            raise ProgramError(f"{label} got argument '{kw.name}' twice", kw.span)
        bound[kw.name] = kw.value
    missing = [p for p in required if p not in bound]
    if missing:
        given = len(call.args) + len(call.kwargs)
        raise ProgramError(
            f"{label} takes {_count(len(required), len(names))}, got {given} "
            f"(missing {', '.join(missing)})",
            call.func.span,
        )
    return bound


def _count(lo: int, hi: int) -> str:
    word = "argument" if hi == 1 else "arguments"
    return f"{lo} {word}" if lo == hi else f"{lo} to {hi} {word}"


class Args:
    """The bound arguments of one call, evaluated on demand."""

    def __init__(self, el, env, bound: dict, call: ast.Call, name: str):
        self.el, self.env, self.bound, self.call, self.name = el, env, bound, call, name
        self._values: dict = {}
        self.span = call.func.span

    def with_value(self, key, v):
        other = Args(self.el, self.env, self.bound, self.call, self.name)
        other._values = dict(self._values, **{key: v})
        return other

    def given(self, key) -> bool:
        return key in self.bound

    def expr(self, key) -> ast.Expr:
        return self.bound[key]

    def raw(self, key):
        if key not in self._values:
            self._values[key] = self.el.value(self.bound[key], self.env)
        return self._values[key]

    def value(self, key) -> Val:
        v = self.raw(key)
        if isinstance(v, RecordVal):
            raise ProgramError(
                f"{self.name} needs a tensor here, got a record", self.bound[key].span
            )
        if isinstance(v, TupleVal):
            raise ProgramError(
                f"{self.name} needs a tensor here, got a tuple", self.bound[key].span
            )
        return v

    def const_int(self, key, default=None) -> int | None:
        if key not in self.bound:
            return default
        return to_constant(
            self.bound[key], self.el.scope(self.env, False), f"'{key}' of {self.name}"
        )

    def const_float(self, key, default: float) -> Val:
        """A scalar argument that may be any value (kept weak when it is a literal)."""
        if key not in self.bound:
            return self.el.const(default, span=self.span)
        return self.value(key)

    def int_list(self, key, default=None) -> tuple[int, ...] | None:
        """An int or a list of ints (shapes, axes, permutations)."""
        if key not in self.bound:
            return default
        e = self.bound[key]
        what = f"'{key}' of {self.name}"
        scope = self.el.scope(self.env, False)
        items = e.items if isinstance(e, (ast.ListLit, ast.TupleLit)) else (e,)
        return tuple(shape_entries(items, scope, what))

    def axes(self, key, rank: int, default="all") -> tuple[int, ...] | None:
        """Normalized axes; None when not given and the default is all axes."""
        if key not in self.bound or _is_none(self.bound[key]):
            return tuple(range(rank)) if default == "all" else default
        try:
            axes = self.int_list(key)
        except ProgramError as err:
            if self.name in ("max", "min"):
                err = ProgramError(
                    f"{err.message}; {self.name} is a reduction in a value, "
                    f"the elementwise {self.name}imum of two values is "
                    f"{self.name}imum(a, b)",
                    err.span,
                )
            raise err from None
        try:
            return normalize_axes(axes, rank, self.name)
        except TypeRuleError as err:
            hint = ""
            if self.name in ("max", "min") and rank == 0:
                hint = (
                    f"; for the elementwise {self.name}imum of two values use {self.name}imum(a, b)"
                )
            raise ProgramError(str(err) + hint, self.bound[key].span) from None

    def axis(self, key, rank: int, default=None, extra: int = 0) -> int | None:
        """One axis in [-(rank+extra), rank+extra), normalized."""
        if key not in self.bound or _is_none(self.bound[key]):
            return default
        a = self.const_int(key)
        n = rank + extra
        if not -n <= a < n or n == 0:
            raise ProgramError(
                f"axis {a} is out of range for {self.name} of a rank-{rank} value",
                self.bound[key].span,
            )
        return a % n

    def dtype(self, key, default: str | None) -> str | None:
        if key not in self.bound:
            return default
        e = self.bound[key]
        if isinstance(e, ast.Name) and e.id in DTYPES:
            return e.id
        raise ProgramError(f"'{key}' must be a dtype ({', '.join(DTYPES)})", e.span)

    def bool_flag(self, key, default=False) -> bool:
        if key not in self.bound:
            return default
        e = self.bound[key]
        if isinstance(e, ast.Bool):
            return e.value
        if isinstance(e, ast.Name) and e.id in self.el.info.configs:
            v = self.el.info.configs[e.id].value
            if isinstance(v, bool):
                return v
        raise ProgramError(f"'{key}' must be true or false", e.span)


def _is_none(e) -> bool:
    return isinstance(e, ast.Name) and e.id == "None"


BUILTINS: dict[str, Builtin] = {}


def builtin(name: str, *params, records: bool = False):
    spec = tuple((p, REQUIRED) if isinstance(p, str) else p for p in params)

    def register(fn):
        BUILTINS[name] = Builtin(name, spec, fn, records)
        return fn

    return register


# ----------------------------------------------------------------------------- elementwise
def _unary_float(op):
    def fn(a: Args):
        x = a.el.to_float(a.value("x"))
        return a.el.apply(op, [x], a.span)

    return fn


for _op in ("exp", "log", "log1p", "sqrt", "tanh", "sigmoid", "sin", "cos"):
    builtin(_op, "x", records=True)(_unary_float(_op))


@builtin("rsqrt", "x", records=True)
def _rsqrt(a: Args):
    el = a.el
    s = el.apply("sqrt", [el.to_float(a.value("x"))], a.span)
    return el.binary("/", el.const(1.0, span=a.span), s, a.span)


@builtin("softplus", "x", records=True)
def _softplus(a: Args):
    el = a.el
    x = el.to_float(a.value("x"))
    pos = _maximum(el, x, el.const(0.0), a.span)
    tail = el.apply(
        "log1p",
        [el.apply("exp", [el.unary("-", el.apply("abs", [x], a.span), a.span)], a.span)],
        a.span,
    )
    return el.binary("+", pos, tail, a.span)


def _maximum(el, x, y, span, op="maximum"):
    (x, y), weak = el.unify([x, y])
    return el.apply(op, [x, y], span, weak=weak)


for _op in ("abs", "sign"):
    builtin(_op, "x", records=True)(
        lambda a, _op=_op: a.el.apply(_op, [a.el.to_number(a.value("x"))], a.span)
    )

for _op in ("floor", "ceil", "round"):
    builtin(_op, "x", records=True)(
        lambda a, _op=_op: (
            a.el.apply(_op, [a.value("x")], a.span)
            if is_float(a.value("x").dtype)
            else a.el.to_number(a.value("x"))
        )
    )


@builtin("relu", "x", records=True)
def _relu(a: Args):
    # where(x > 0, x, 0): the derivative at 0 is 0, as in PyTorch and JAX
    el = a.el
    x = el.to_number(a.value("x"))
    zero = el.const(0, x.dtype)
    return _where(el, el.compare(">", x, zero, a.span), x, zero, a.span)


@builtin("elu", "x", ("alpha", None), records=True)
def _elu(a: Args):
    el = a.el
    x = el.to_float(a.value("x"))
    alpha = a.const_float("alpha", 1.0)
    neg = el.binary(
        "*", alpha, el.binary("-", el.apply("exp", [x], a.span), el.const(1.0), a.span), a.span
    )
    return _where(el, el.compare(">", x, el.const(0.0), a.span), x, neg, a.span)


def _where(el, c, x, y, span):
    c = el.to_bool(c)
    (x, y), weak = el.unify([x, y])
    return el.apply("where", [c, x, y], span)


@builtin("minimum", "x", "y")
def _minimum(a: Args):
    return a.el.map_fields(
        lambda x, y: _maximum(a.el, x, y, a.span, "minimum"), [a.raw("x"), a.raw("y")], a.span
    )


@builtin("maximum", "x", "y")
def _maximum_fn(a: Args):
    return a.el.map_fields(
        lambda x, y: _maximum(a.el, x, y, a.span), [a.raw("x"), a.raw("y")], a.span
    )


@builtin("clip", "x", "lo", "hi")
def _clip(a: Args):
    el = a.el

    def clip(x, lo, hi):
        (x, lo, hi), _ = el.unify([x, lo, hi])
        return el.apply("minimum", [el.apply("maximum", [x, lo], a.span), hi], a.span)

    return el.map_fields(clip, [a.raw("x"), a.raw("lo"), a.raw("hi")], a.span)


@builtin("where", "c", "a", "b")
def _where_fn(a: Args):
    el = a.el
    return el.map_fields(
        lambda c, x, y: _where(el, c, x, y, a.span), [a.raw("c"), a.raw("a"), a.raw("b")], a.span
    )


@builtin("pow", "x", "y")
def _pow(a: Args):
    return a.el.map_fields(
        lambda x, y: a.el.binary("**", x, y, a.span), [a.raw("x"), a.raw("y")], a.span
    )


for _dt in DTYPES:
    builtin(_dt, "x", records=True)(lambda a, _dt=_dt: _strong(a.el.cast(a.value("x"), _dt)))


def _strong(v: Val) -> Val:
    from dataclasses import replace

    return replace(v, weak=False)


@builtin("stop_grad", "x", records=True)
def _stop_grad(a: Args):
    x = a.value("x")
    return a.el.apply("stop_grad", [a.el.materialize(x)], a.span, weak=x.weak)


# ----------------------------------------------------------------------------- reductions
def _reduction(op, kind):
    def fn(a: Args):
        el = a.el
        x = a.value("x")
        if kind == "float":
            x = el.to_float(x)
        elif kind == "number":
            x = el.to_number(x)
        axes = a.axes("axis", x.type.rank)
        return el.apply(op, [x], a.span, axes=axes, keepdims=a.bool_flag("keepdims") or None)

    return fn


builtin("sum", "x", ("axis", None), ("keepdims", None))(_reduction("sum", "number"))
builtin("prod", "x", ("axis", None), ("keepdims", None))(_reduction("prod", "number"))
builtin("max", "x", ("axis", None), ("keepdims", None))(_reduction("max", None))
builtin("min", "x", ("axis", None), ("keepdims", None))(_reduction("min", None))
builtin("mean", "x", ("axis", None), ("keepdims", None))(_reduction("mean", "float"))
builtin("logsumexp", "x", ("axis", None), ("keepdims", None))(_reduction("logsumexp", "float"))


def _moments(a: Args, root: bool):
    el = a.el
    x = el.to_float(a.value("x"))
    if not x.type.is_static:
        from timerlc.frontend.elaborate import dynamic_slice_error

        raise dynamic_slice_error(x.span)
    axes = a.axes("axis", x.type.rank)
    keep = a.bool_flag("keepdims")
    ddof = a.const_int("ddof", 0)
    n = math.prod(x.shape[k] for k in axes)
    # over every axis: the mean a scalar, the node ``mean(x)`` is (common subexpressions
    # share it: a normalization's ``(x - mean(x)) / std(x)`` sums ``x`` once)
    whole = sorted(axes) == list(range(x.type.rank))
    m = el.apply("mean", [x], a.span, axes=axes, keepdims=None if whole else True)
    d = el.binary("-", x, m, a.span)
    s = el.apply("sum", [el.binary("*", d, d, a.span)], a.span, axes=axes, keepdims=keep or None)
    v = el.binary("/", s, el.const(float(n - ddof)), a.span)
    return el.apply("sqrt", [v], a.span) if root else v


builtin("var", "x", ("axis", None), ("keepdims", None), ("ddof", None))(
    lambda a: _moments(a, False)
)
builtin("std", "x", ("axis", None), ("keepdims", None), ("ddof", None))(lambda a: _moments(a, True))


def _arg(op):
    def fn(a: Args):
        x = a.value("x")
        return a.el.apply(op, [x], a.span, axis=a.axis("axis", x.type.rank))

    return fn


builtin("argmax", "x", ("axis", None))(_arg("argmax"))
builtin("argmin", "x", ("axis", None))(_arg("argmin"))


@builtin("discounted_sum", "x", "gamma")
def _discounted_sum(a: Args):
    el = a.el
    x = el.to_float(a.value("x"))
    g = a.value("gamma")
    if g.shape != ():
        raise ProgramError(
            f"the discount of discounted_sum must be a scalar, got {g.type}", a.expr("gamma").span
        )
    g = el.cast(g, x.dtype)
    return el.apply("discounted_sum", [x, g], a.span)


@builtin("cumsum", "x", ("axis", None))
def _cumsum(a: Args):
    x = a.el.to_number(a.value("x"))
    return a.el.apply("cumsum", [x], a.span, axis=a.axis("axis", x.type.rank))


# the array and learning built-ins register themselves into BUILTINS
from timerlc.frontend import builtins_array, builtins_learn, builtins_random  # noqa: E402, F401
