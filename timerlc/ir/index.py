"""Index expressions and conditions over dims, as sympy expressions.

An index expression is quasi-affine in the dims (integer symbols): sums, products by
constants, ``//`` and ``%`` by positive constants (``floor``/``Mod``) and ``min``/``max``.
A condition is a sympy boolean of comparisons between index expressions. Both print as
RTL text (for IR dumps) and as isl text (for the polyhedral checks), and turn into the
plan's structured form (``to_plan``, ``cond_to_plan``), which ``compile_expr`` and
``compile_cond`` evaluate on scalars or whole index grids (for the reference interpreter)
without building source text.
"""

from __future__ import annotations

import functools
import math

import sympy
from sympy.logic.boolalg import Boolean, BooleanFalse, BooleanTrue

TRUE = sympy.true
FALSE = sympy.false
# comparison operators of RTL -> sympy relations
RELATIONS = {
    "<": sympy.Lt,
    "<=": sympy.Le,
    ">": sympy.Gt,
    ">=": sympy.Ge,
    "==": sympy.Eq,
    "!=": sympy.Ne,
}


@functools.lru_cache(maxsize=None)
def sym(name: str) -> sympy.Symbol:
    """The symbol of dim ``name``."""
    return sympy.Symbol(name, integer=True)


def const(value: int) -> sympy.Integer:
    return sympy.Integer(value)


def floordiv(a, c: int):
    return sympy.floor(sympy.sympify(a) / c)


def mod(a, c: int):
    return sympy.Mod(sympy.sympify(a), c)


def dims_of(e) -> frozenset[str]:
    return frozenset(s.name for s in sympy.sympify(e).free_symbols)


def is_constant(e) -> bool:
    return sympy.sympify(e).is_Integer


def substitute(e, mapping: dict[str, object]):
    """Replace dims by expressions (simultaneously)."""
    if not mapping:
        return e
    return sympy.sympify(e).xreplace({sym(k): sympy.sympify(v) for k, v in mapping.items()})


def conj(*conds) -> Boolean:
    return sympy.And(*conds)


def disj(*conds) -> Boolean:
    return sympy.Or(*conds)


def neg(c) -> Boolean:
    return sympy.Not(c)


def box(dims_and_bounds) -> Boolean:
    """``0 <= d < bound`` for each (dim, bound)."""
    parts = []
    for d, bound in dims_and_bounds:
        parts += [sym(d) >= 0, sym(d) < bound]
    return sympy.And(*parts)


# ----------------------------------------------------------------------------- printing
def _floor_parts(arg):
    num, den = sympy.fraction(sympy.together(arg))
    if not den.is_Integer:
        raise ValueError(f"not a quasi-affine floor: floor({arg})")
    return sympy.expand(num), int(den)


class _Printer:
    """Prints an index expression in one of two syntaxes."""

    def __init__(self, flavor: str):
        self.flavor = flavor  # "rtl" | "isl"

    def name(self, s: sympy.Symbol) -> str:
        if self.flavor == "isl":
            return "d_" + s.name
        return s.name

    def expr(self, e, prec: int = 0) -> str:
        # prec: 0 top/add context, 1 mul operand, 2 atom needed
        e = sympy.sympify(e)
        if e.is_Integer:
            v = int(e)
            return f"({v})" if v < 0 and prec > 0 else str(v)
        if e.is_Symbol:
            return self.name(e)
        if e.is_Add:
            terms = e.as_ordered_terms()
            out = self.expr(terms[0], 0)
            for t in terms[1:]:
                coeff, rest = t.as_coeff_Mul()
                if coeff.is_negative:
                    out += " - " + self.expr(-t, 1)
                else:
                    out += " + " + self.expr(t, 1)
            return f"({out})" if prec > 0 else out
        if e.is_Mul:
            coeff, rest = e.as_coeff_Mul()
            if not coeff.is_Integer:
                raise ValueError(f"not an integer index expression: {e}")
            if coeff == -1:
                s = "-" + self.expr(rest, 2)
                return f"({s})" if prec > 0 else s
            s = f"{int(coeff)}*{self.expr(rest, 2)}"
            return f"({s})" if prec > 1 else s
        if isinstance(e, sympy.floor):
            num, den = _floor_parts(e.args[0])
            if self.flavor == "isl":
                return f"floor(({self.expr(num)})/{den})"
            s = f"{self.expr(num, 2)} // {den}"
            return f"({s})" if prec > 0 else s
        if isinstance(e, sympy.Mod):
            a, c = e.args
            if self.flavor == "isl":
                return f"(({self.expr(a)}) mod {int(c)})"
            s = f"{self.expr(a, 2)} % {self.expr(c, 2)}"
            return f"({s})" if prec > 0 else s
        if isinstance(e, (sympy.Min, sympy.Max)):
            fn = "min" if isinstance(e, sympy.Min) else "max"
            args = sorted(e.args, key=sympy.default_sort_key)
            out = self.expr(args[-1])
            for a in reversed(args[:-1]):
                out = f"{fn}({self.expr(a)}, {out})"
            return out
        raise ValueError(f"not an index expression: {e}")

    _REL = {
        "rtl": {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="},
        "isl": {"==": "=", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="},
    }

    def cond(self, c, prec: int = 0) -> str:
        # prec: 0 top, 1 inside and/or, 2 operand of not
        if c is True or isinstance(c, BooleanTrue):
            return {"rtl": "true", "isl": "0 = 0"}[self.flavor]
        if c is False or isinstance(c, BooleanFalse):
            return {"rtl": "false", "isl": "1 = 0"}[self.flavor]
        if isinstance(c, sympy.And) or isinstance(c, sympy.Or):
            word = "and" if isinstance(c, sympy.And) else "or"
            args = sorted(c.args, key=sympy.default_sort_key)
            parts = [self.cond(a, 1) for a in args]
            s = f" {word} ".join(parts)
            return f"({s})" if prec > 0 else s
        if isinstance(c, sympy.Not):
            inner = self.cond(c.args[0], 2)
            return f"not {inner}" if prec < 2 else f"(not {inner})"
        if isinstance(c, sympy.core.relational.Relational):
            c = _integral(c)
            op = c.rel_op
            if self.flavor == "isl" and op == "!=":
                return f"not ({self.expr(c.lhs)} = {self.expr(c.rhs)})"
            s = f"{self.expr(c.lhs)} {self._REL[self.flavor][op]} {self.expr(c.rhs)}"
            # comparisons bind tighter than and/or/not in RTL; isl gets parentheses
            return f"({s})" if prec > 0 and self.flavor == "isl" else s
        raise ValueError(f"not a condition: {c}")


def _integral(rel):
    """A comparison with integer coefficients: sympy rewrites ``floor(t/2) >= 2`` as
    ``t/2 >= 2``; multiply by the denominators (a positive factor keeps the relation)."""
    d = sympy.expand(rel.lhs - rel.rhs)
    dens = [sympy.fraction(c)[1] for c in d.as_coefficients_dict().values()]
    m = lcm(*(int(x) for x in dens if x.is_Integer))
    if m == 1:
        return rel
    return type(rel)(sympy.expand(d * m), 0, evaluate=False)


_RTL, _ISL = _Printer("rtl"), _Printer("isl")

_PLAN_RELATIONS = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}


# a plan repeats the same few index expressions and conditions over and over (each read of
# ``x[i, b, t]``): converting each once saves a tenth of PPO's plan stage
@functools.lru_cache(maxsize=4096, typed=True)
def to_plan(e):
    """An index expression in the plan's structured form (``timerlc.plan.expr``): an int,
    a dim name or a tuple ``(op, E, ...)``, shaped as the terms print (``t - 1`` is
    ``("sub", "t", 1)``, ``min(a, b, c)`` is ``("min", a, ("min", b, c))``)."""
    e = sympy.sympify(e)
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return e.name
    if e.is_Add:
        terms = e.as_ordered_terms()
        out = to_plan(terms[0])
        for t in terms[1:]:
            coeff, _ = t.as_coeff_Mul()
            out = ("sub", out, to_plan(-t)) if coeff.is_negative else ("add", out, to_plan(t))
        return out
    if e.is_Mul:
        coeff, rest = e.as_coeff_Mul()
        if not coeff.is_Integer:
            raise ValueError(f"not an integer index expression: {e}")
        return ("neg", to_plan(rest)) if coeff == -1 else ("mul", int(coeff), to_plan(rest))
    if isinstance(e, sympy.floor):
        num, den = _floor_parts(e.args[0])
        return ("fdiv_q", to_plan(num), den)
    if isinstance(e, sympy.Mod):
        return ("mod", to_plan(e.args[0]), to_plan(e.args[1]))
    if isinstance(e, (sympy.Min, sympy.Max)):
        fn = "min" if isinstance(e, sympy.Min) else "max"
        args = sorted(e.args, key=sympy.default_sort_key)
        out = to_plan(args[-1])
        for a in reversed(args[:-1]):
            out = (fn, to_plan(a), out)
        return out
    raise ValueError(f"not an index expression: {e}")


def plan_value(v):
    """An attribute value of the PDG as a plan (and the op kernels) hold it: index
    expressions become ``Ix`` (``timerlc.plan.items``), integer and float sympy numbers
    Python numbers, tuples stay tuples."""
    from timerlc.plan.items import Ix

    if isinstance(v, sympy.Basic) and not isinstance(v, sympy.logic.boolalg.BooleanAtom):
        if isinstance(v, sympy.Expr) and v.is_Integer:
            return int(v)
        if isinstance(v, sympy.Expr) and v.is_Number:
            return float(v)
        return Ix(to_plan(v))
    if isinstance(v, (tuple, list)):
        return tuple(plan_value(x) for x in v)
    return v


@functools.lru_cache(maxsize=4096, typed=True)
def cond_to_plan(c):
    """A condition in the plan's structured form (``timerlc.plan.expr``): a bool or a
    tuple of ``and``/``or`` (n-ary, as sympy's: a chain of 150 ``or``s is one level, not
    150), ``not`` and comparisons."""
    if c is True or isinstance(c, BooleanTrue):
        return True
    if c is False or isinstance(c, BooleanFalse):
        return False
    if isinstance(c, (sympy.And, sympy.Or)):
        word = "and" if isinstance(c, sympy.And) else "or"
        parts = [cond_to_plan(a) for a in sorted(c.args, key=sympy.default_sort_key)]
        return (word, *parts)
    if isinstance(c, sympy.Not):
        return ("not", cond_to_plan(c.args[0]))
    if isinstance(c, sympy.core.relational.Relational):
        c = _integral(c)
        return (_PLAN_RELATIONS[c.rel_op], to_plan(c.lhs), to_plan(c.rhs))
    raise ValueError(f"not a condition: {c}")


def to_text(e) -> str:
    return _RTL.expr(e)


def cond_to_text(c) -> str:
    return _RTL.cond(c)


@functools.lru_cache(maxsize=65536)
def to_isl(e) -> str:
    return _ISL.expr(e)


@functools.lru_cache(maxsize=65536)  # the checks and the schedule convert the same conditions
def cond_to_isl(c) -> str:
    return _ISL.cond(c)


def isl_name(dim: str) -> str:
    return "d_" + dim


# ----------------------------------------------------------------------------- evaluation
@functools.lru_cache(maxsize=4096)
def compile_expr(e, dims: tuple[str, ...]):
    """A function of the dims' values (ints or NumPy index grids) giving ``e``: the plan's
    structured form of ``e`` turned into nested closures (``plan.expr``), no source text."""
    from timerlc.plan import expr as px

    return px.compile_expr(to_plan(e), tuple(dims), vector=True)


@functools.lru_cache(maxsize=4096)
def compile_cond(c, dims: tuple[str, ...]):
    """A function of the dims' values giving the truth of ``c`` (bool or bool array)."""
    from timerlc.plan import expr as px

    return px.compile_expr(cond_to_plan(c), tuple(dims), vector=True)


def evaluate(e, point: dict[str, int]) -> int:
    e = sympy.sympify(e)
    if e.is_Integer:
        return int(e)
    names = tuple(sorted(dims_of(e)))
    return int(compile_expr(e, names)(*(point[n] for n in names)))


def holds(c, point: dict[str, int]) -> bool:
    names = tuple(sorted(dims_of(c) if not isinstance(c, bool) else ()))
    if not names:
        return bool(c)
    return bool(compile_cond(c, names)(*(point[n] for n in names)))


# ----------------------------------------------------------------------------- helpers
def affine_offset(e, dim: str):
    """If ``e`` is ``dim + c`` return c, else None."""
    d = sympy.sympify(e) - sym(dim)
    return int(d) if d.is_Integer else None


def lcm(*xs: int) -> int:
    return functools.reduce(math.lcm, xs, 1)
