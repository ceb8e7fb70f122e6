"""Index expressions and conditions of RTL source, as sympy (``timerlc.ir.index``).

Temporal indices, slice bounds, ``when`` clauses, spatial integer indices and static
arguments (shapes, axes) are index expressions: affine in dims and int configs, with
``//`` and ``%`` by positive constants and ``min``/``max``. ``NotIndex`` tells a caller
that an expression is not one (a spatial index then becomes a gather); a ``ProgramError``
is a definite mistake, such as a dim the equation does not iterate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from timerlc.diagnostics import ProgramError, did_you_mean
from timerlc.frontend import ast
from timerlc.ir import index as ix


class NotIndex(Exception):
    def __init__(self, reason: str, span):
        super().__init__(reason)
        self.reason = reason
        self.span = span


@dataclass
class IndexScope:
    configs: dict  # name -> Config
    dims: dict  # name -> bound (all declared dims)
    iterated: frozenset | None  # the dims the equation iterates; None: no dims allowed
    shadowed: frozenset = field(default_factory=frozenset)  # local names hiding globals
    known: frozenset | None = None  # every other name the program declares (None: unchecked)
    envs: dict = field(default_factory=dict)  # env name -> timerlc.envs.EnvSpec


ENV_ATTRIBUTES = ("obs_shape", "obs_dim", "num_actions", "act_dim")


def env_attribute(expr: ast.Expr, scope: IndexScope):
    """The value of ``E.attr`` (an int, or a tuple for obs_shape), or None if ``expr`` is not
    an environment attribute."""
    if not (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name)):
        return None
    name = expr.value.id
    if name not in scope.envs or name in scope.shadowed:
        return None
    if expr.name not in ENV_ATTRIBUTES:
        raise ProgramError(
            f"environment '{name}' has no attribute '{expr.name}' (it has "
            f"{', '.join(ENV_ATTRIBUTES)})" + did_you_mean(expr.name, ENV_ATTRIBUTES),
            expr.name_span,
        )
    from timerlc.envs import EnvError

    try:
        return scope.envs[name].attribute(expr.name)
    except EnvError as e:
        raise ProgramError(e.message, expr.span) from None


def shape_entries(items, scope: IndexScope, what: str) -> list[int]:
    """The ints of a shape list, where ``E.obs_shape`` stands for all its entries."""
    out = []
    for e in items:
        v = env_attribute(e, scope)
        if isinstance(v, tuple):
            out.extend(v)
        else:
            out.append(to_constant(e, scope, what))
    return out


def _check_dim(name: str, scope: IndexScope, span):
    if scope.iterated is None:
        raise ProgramError(f"dim '{name}' cannot be used here: a constant is needed", span)
    if name not in scope.iterated:
        raise ProgramError(
            f"this equation does not iterate dim '{name}' (its left side uses "
            f"{_dims_words(scope.iterated, scope.dims)})",
            span,
        )


def _dims_words(iterated, dims) -> str:
    names = [d for d in dims if d in iterated]
    return "no dims" if not names else "dims " + ", ".join(names)


def to_index(expr: ast.Expr, scope: IndexScope) -> sympy.Expr:
    if isinstance(expr, ast.Int):
        return sympy.Integer(expr.value)
    if isinstance(expr, ast.Name):
        name = expr.id
        if name in scope.shadowed:
            raise NotIndex(f"'{name}' is a value, not an index", expr.span)
        if name in scope.dims:
            _check_dim(name, scope, expr.span)
            return ix.sym(name)
        if name in scope.configs:
            v = scope.configs[name].value
            if isinstance(v, bool) or not isinstance(v, int):
                raise NotIndex(f"config '{name}' is not an int", expr.span)
            return sympy.Integer(v)
        if scope.known is not None and name not in scope.known:
            raise ProgramError(
                f"unknown name '{name}'"
                + did_you_mean(name, list(scope.dims) + list(scope.configs)),
                expr.span,
            )
        raise NotIndex(f"'{name}' is not a dim or an int config", expr.span)
    if isinstance(expr, ast.Attribute):
        v = env_attribute(expr, scope)
        if isinstance(v, int):
            return sympy.Integer(v)
        if v is not None:
            raise NotIndex(
                f"E.{expr.name} is a shape, not an int (use it in a shape list)", expr.span
            )
    if isinstance(expr, ast.Unary) and expr.op in "+-":
        v = to_index(expr.operand, scope)
        return -v if expr.op == "-" else v
    if isinstance(expr, ast.Binary):
        if expr.op in ("+", "-"):
            a, b = to_index(expr.left, scope), to_index(expr.right, scope)
            return a + b if expr.op == "+" else a - b
        if expr.op == "*":
            a, b = to_index(expr.left, scope), to_index(expr.right, scope)
            if not (a.is_Integer or b.is_Integer):
                raise NotIndex("a product of two dims is not affine", expr.op_span)
            return sympy.expand(a * b)
        if expr.op in ("//", "%"):
            a, b = to_index(expr.left, scope), to_index(expr.right, scope)
            if not b.is_Integer or int(b) <= 0:
                if b.is_Integer and int(b) == 0:
                    # (a config's value made it so, as cumsum.rtl's P = T // 4 at T < 4)
                    what = (
                        f"'{expr.right.id}' is 0"
                        if isinstance(expr.right, ast.Name)
                        else "its divisor is 0"
                    )
                    raise ProgramError(
                        f"division by zero in an index expression: {what}", expr.op_span
                    )
                raise NotIndex(
                    f"'{expr.op}' in an index needs a positive constant divisor", expr.op_span
                )
            return ix.floordiv(a, int(b)) if expr.op == "//" else ix.mod(a, int(b))
        raise NotIndex(f"'{expr.op}' is not allowed in an index expression", expr.op_span)
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id in ("min", "max")
    ):
        if expr.func.id not in scope.shadowed and not expr.kwargs and len(expr.args) >= 2:
            args = [to_index(a, scope) for a in expr.args]
            return (sympy.Min if expr.func.id == "min" else sympy.Max)(*args)
    raise NotIndex("not an index expression", expr.span)


def to_constant(expr: ast.Expr, scope: IndexScope, what: str) -> int:
    """A compile-time int (literal, int config, arithmetic of those)."""
    const_scope = IndexScope(
        scope.configs, scope.dims, None, scope.shadowed, scope.known, scope.envs
    )
    try:
        v = to_index(expr, const_scope)
    except NotIndex as e:
        raise ProgramError(f"{what} must be an int constant ({e.reason})", e.span) from None
    if not v.is_Integer:
        raise ProgramError(f"{what} must be an int constant", expr.span)
    return int(v)


def _chain(expr: ast.Binary) -> list[ast.Expr]:
    """The operands of the chain ``a op b op c ...`` (parsed ``((a op b) op c)``), in order."""
    op, operands = expr.op, []
    while isinstance(expr, ast.Binary) and expr.op == op:
        operands.append(expr.right)
        expr = expr.left
    operands.append(expr)
    return operands[::-1]


def _ranges(parts: list) -> list:
    """An ``or`` chain's equalities of one index expression to integers as the ranges they
    make (``t == 0 or t == 1 or t == 2 or t == 5``: ``0 <= t <= 2 or t == 5``), in the
    place of the first of them; the chain's other parts as they are, and an expression
    equal to one integer only, as written. A chain of a thousand equalities took
    seconds to check, each step of the compiler's over a sympy ``Or`` of as many parts
    (quadratic in them): it is one range now."""
    values: dict = {}  # the expression -> its integers, in the chain's order
    place = []  # each part: the expression it is an equality of, or None
    for p in parts:
        key = None
        if isinstance(p, sympy.Eq):
            c, x = sympy.expand(p.lhs - p.rhs).as_coeff_Add()
            if c.is_Integer and x.free_symbols:
                if x.could_extract_minus_sign():
                    c, x = -c, -x
                key = x
                values.setdefault(x, set()).add(-int(c))
        place.append(key)
    merged = {x for x, vs in values.items() if len(vs) > 1}
    if not merged:
        return parts
    out, done = [], set()
    for p, x in zip(parts, place):
        if x not in merged:
            out.append(p)
        elif x not in done:
            done.add(x)
            vs = sorted(values[x])
            start = 0
            for k in range(1, len(vs) + 1):
                if k == len(vs) or vs[k] != vs[k - 1] + 1:
                    lo, hi = vs[start], vs[k - 1]
                    out.append(
                        sympy.Eq(x, lo)
                        if lo == hi
                        else sympy.And(sympy.Ge(x, lo), sympy.Le(x, hi))
                    )
                    start = k
    return out


def _join(op, parts: list):
    """``op(...op(op(parts[0], parts[1]), parts[2])...)``, as written, in one call when
    that gives the same expression: sympy re-sorts the whole argument list at each step,
    so the fold is quadratic in a long chain (``t == 0 or t == 1 or ...``). One call differs
    only where relations repeat or contradict each other (the fold sees those only
    between two plain relations), and such chains are folded."""
    canon = [p.canonical if p.is_Relational else None for p in parts]
    seen = set(canon)
    if (
        None not in seen
        and len(seen) == len(parts)
        and not any(c.negated.canonical in seen for c in canon)
    ):
        return op(*parts)
    result = parts[0]
    for p in parts[1:]:
        result = op(result, p)
    return result


def to_condition(expr: ast.Expr, scope: IndexScope):
    """A ``when`` condition as a sympy boolean."""
    if isinstance(expr, ast.Bool):
        return sympy.true if expr.value else sympy.false
    if isinstance(expr, ast.Name) and expr.id in scope.configs and expr.id not in scope.shadowed:
        v = scope.configs[expr.id].value
        if isinstance(v, bool):
            return sympy.true if v else sympy.false
    if isinstance(expr, ast.Binary) and expr.op in ("and", "or"):
        parts = [to_condition(e, scope) for e in _chain(expr)]
        if expr.op == "or":
            parts = _ranges(parts)
        return _join(sympy.And if expr.op == "and" else sympy.Or, parts)
    if isinstance(expr, ast.Unary) and expr.op == "not":
        return sympy.Not(to_condition(expr.operand, scope))
    if isinstance(expr, ast.Compare):
        parts = []
        for k, op in enumerate(expr.ops):
            a, b = expr.operands[k], expr.operands[k + 1]
            try:
                parts.append(ix.RELATIONS[op](to_index(a, scope), to_index(b, scope)))
            except NotIndex as e:
                raise ProgramError(
                    f"a condition compares index expressions of dims and int configs ({e.reason})",
                    e.span,
                ) from None
        return sympy.And(*parts)
    raise ProgramError(
        "a condition must compare index expressions (dims, int configs), joined by and/or/not",
        expr.span,
    )
