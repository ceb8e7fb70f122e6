"""Index expressions and conditions in a plan: one structured form, never source text.

An expression ``E`` is an int, a bool, a name (a dim, or a loop variable of the loop tree)
or a tuple ``(op, E, ...)`` (a JSON list in ``plan.json``) with ``op`` one of ``OPS``:

    add sub mul neg min max            integers (add, mul, min, max take 2 or more)
    fdiv_q pdiv_q mod pdiv_r zdiv_r    by a positive int literal: floor quotient (fdiv_q;
                                       pdiv_q, isl's, is the same on its operands >= 0),
                                       floor remainder (mod; pdiv_r likewise), remainder of
                                       the truncated quotient (zdiv_r, C's ``%``)
    eq ne lt le gt ge                  comparisons of integers
    and or not                         of conditions (and, or take 2 or more)
    select                             (condition, integer, integer)

This module is data, shared by the compiler (which writes expressions) and the runtime
(which evaluates them): ``check`` validates a decoded expression against the names it may
use, ``names`` lists the names it uses, ``compile_expr`` turns it into a Python function by
nesting closures (no text is built or evaluated), and ``text`` prints it. It imports only
NumPy and the standard library.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np

Expr = Any  # int | bool | str | tuple

# op -> (least number of arguments, most or None, kind of result, kind of the arguments)
# kinds: "int" (an integer), "bool" (a condition)
OPS: dict[str, tuple[int, int | None, str, str]] = {
    "add": (2, None, "int", "int"),
    "sub": (2, 2, "int", "int"),
    "mul": (2, None, "int", "int"),
    "neg": (1, 1, "int", "int"),
    "min": (2, None, "int", "int"),
    "max": (2, None, "int", "int"),
    "fdiv_q": (2, 2, "int", "int"),
    "pdiv_q": (2, 2, "int", "int"),
    "mod": (2, 2, "int", "int"),
    "pdiv_r": (2, 2, "int", "int"),
    "zdiv_r": (2, 2, "int", "int"),
    "eq": (2, 2, "bool", "int"),
    "ne": (2, 2, "bool", "int"),
    "lt": (2, 2, "bool", "int"),
    "le": (2, 2, "bool", "int"),
    "gt": (2, 2, "bool", "int"),
    "ge": (2, 2, "bool", "int"),
    "and": (2, None, "bool", "bool"),
    "or": (2, None, "bool", "bool"),
    "not": (1, 1, "bool", "bool"),
    "select": (3, 3, "int", "bool"),  # the condition, then two integers
}
DIVISIONS = frozenset({"fdiv_q", "pdiv_q", "mod", "pdiv_r", "zdiv_r"})

# limits that keep a corrupt plan from costing more than a real one could
MAX_DEPTH = 64  # nesting of one expression
MAX_NODES = 4096  # ops and leaves in one expression
MAX_INT = 1 << 40  # the largest int literal (indices and bounds are far smaller)


class ExprError(ValueError):
    """An expression that is not one of this form (the message says what is wrong)."""


def check(e: Expr, names, kind: str = "int") -> Expr:
    """``e`` decoded from JSON (lists become tuples), checked: known ops with their numbers
    of arguments, ints within ``MAX_INT``, only ``names``, conditions where conditions go,
    a positive int literal after every division, at most ``MAX_DEPTH`` deep and
    ``MAX_NODES`` big. Raises ``ExprError``."""
    count = [0]

    def walk(x, want: str, depth: int):
        count[0] += 1
        if count[0] > MAX_NODES:
            raise ExprError(f"an expression of more than {MAX_NODES} terms")
        if depth > MAX_DEPTH:
            raise ExprError(f"an expression nested more than {MAX_DEPTH} deep")
        if isinstance(x, bool):
            if want != "bool":
                raise ExprError(f"{str(x).lower()} where an integer belongs")
            return x
        if isinstance(x, int):
            if want != "int":
                raise ExprError(f"the integer {x} where a condition belongs")
            if abs(x) > MAX_INT:
                raise ExprError(f"the integer {x} is out of range")
            return x
        if isinstance(x, str):
            if want != "int":
                raise ExprError(f"the name {_quote(x)} where a condition belongs")
            if x not in names:
                raise ExprError(f"unknown name {_quote(x)}")
            return x
        if not isinstance(x, (list, tuple)) or not x or not isinstance(x[0], str):
            raise ExprError(f"not an expression: {_short(x)}")
        op, args = x[0], x[1:]
        if op not in OPS:
            raise ExprError(f"unknown operator {_quote(op)}")
        least, most, result, arg_kind = OPS[op]
        if result != want:
            raise ExprError(f"{op} gives {'a condition' if result == 'bool' else 'an integer'}")
        if len(args) < least or (most is not None and len(args) > most):
            raise ExprError(
                f"{op} takes {least if most == least else f'{least} or more'} "
                f"arguments, got {len(args)}"
            )
        if op == "select":
            out = (walk(args[0], "bool", depth + 1),) + tuple(
                walk(a, "int", depth + 1) for a in args[1:]
            )
        else:
            out = tuple(walk(a, arg_kind, depth + 1) for a in args)
        if op in DIVISIONS and not (isinstance(out[1], int) and out[1] > 0):
            raise ExprError(f"{op} needs a positive integer divisor, got {_short(args[1])}")
        return (op,) + out

    return walk(e, kind, 0)


def _quote(s: str) -> str:
    return repr(s[:40] + ("..." if len(s) > 40 else ""))


def clip(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters for a one-line message (a corrupt file's values
    can be any size)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(x) -> str:
    return clip(repr(x), 60)


def names(e: Expr) -> set[str]:
    """The names ``e`` uses."""
    out: set[str] = set()
    todo = [e]
    while todo:
        x = todo.pop()
        if isinstance(x, str):
            out.add(x)
        elif isinstance(x, tuple):
            todo.extend(x[1:])
    return out


def difference(a: Expr, b: Expr) -> int | None:
    """``a - b`` when it is the same int at every point (terms that are not sums or integer
    multiples must cancel exactly, as in ``(16*j + 16) - 16*j``), else None."""
    terms: dict = {}

    def add(e, c: int):
        if isinstance(e, bool):
            terms["?"] = 1  # not an integer: never constant
        elif isinstance(e, int):
            terms[1] = terms.get(1, 0) + c * e
        elif isinstance(e, tuple) and e[0] in ("add", "sub"):
            add(e[1], c)
            for x in e[2:]:
                add(x, c if e[0] == "add" else -c)
        elif isinstance(e, tuple) and e[0] == "neg":
            add(e[1], -c)
        elif isinstance(e, tuple) and e[0] == "mul" and isinstance(e[1], int) and len(e) == 3:
            add(e[2], c * e[1])
        else:  # a name or another term, as a whole
            terms[e] = terms.get(e, 0) + c

    add(a, 1)
    add(b, -1)
    if any(v for k, v in terms.items() if k != 1):
        return None
    return terms.get(1, 0)


def substitute(e: Expr, values: dict) -> Expr:
    """``e`` with each name of ``values`` replaced by its expression."""
    if isinstance(e, str):
        return values.get(e, e)
    if isinstance(e, tuple):
        return (e[0], *(substitute(a, values) for a in e[1:]))
    return e


def to_json(e: Expr):
    return [e[0]] + [to_json(a) for a in e[1:]] if isinstance(e, tuple) else e


# ----------------------------------------------------------------------------- evaluation
def compile_expr(e: Expr, params: tuple[str, ...], vector: bool = False) -> Callable[..., Any]:
    """``e`` as a function of the values of ``params`` (positional). With ``vector`` the
    values may be NumPy arrays (broadcast together; conditions give bool arrays), else they
    are ints (and the result an int or a bool). ``e`` must have been ``check``ed over names
    among ``params``."""
    fn = _closure(e, {p: k for k, p in enumerate(params)}, vector)
    return lambda *values: fn(values)


def compile_packed(e: Expr, params: tuple[str, ...], vector: bool = False):
    """``compile_expr``, as a function of one sequence holding the values of ``params``
    (and possibly more after them)."""
    return _closure(e, {p: k for k, p in enumerate(params)}, vector)


def _closure(e: Expr, pos: dict[str, int], vector: bool) -> Callable[[tuple], Any]:
    if isinstance(e, (bool, int)):
        return lambda v: e
    if isinstance(e, str):
        return operator.itemgetter(pos[e])
    op, *rest = e
    if op in ("add", "sub") and len(rest) == 2 and isinstance(rest[0], str):
        if isinstance(rest[1], int) and not isinstance(rest[1], bool):  # t + 1, the usual
            k, c = pos[rest[0]], rest[1] if op == "add" else -rest[1]
            return lambda v: v[k] + c
    args = [_closure(a, pos, vector) for a in rest]
    if op == "select":
        c, a, b = args
        if vector:
            return lambda v: np.where(c(v), a(v), b(v))
        return lambda v: a(v) if c(v) else b(v)
    if op == "neg":
        (a,) = args
        return lambda v: -a(v)
    if op == "not":
        (a,) = args
        return (lambda v: np.logical_not(a(v))) if vector else (lambda v: not a(v))
    fn = (_VECTOR if vector else _SCALAR).get(op) or _BINARY[op]
    if len(args) == 2:
        a, b = args
        return lambda v: fn(a(v), b(v))

    def fold(v):
        acc = args[0](v)
        for a in args[1:]:
            acc = fn(acc, a(v))
        return acc

    return fold


def _zdiv_r(x: int, y: int) -> int:
    """C's remainder of ints (``y > 0``), exact at any size (``math.fmod`` goes through a
    float, which a corrupt plan's huge ints overflow)."""
    r = abs(x) % y
    return -r if x < 0 else r


_BINARY = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "fdiv_q": operator.floordiv,
    "pdiv_q": operator.floordiv,
    "mod": operator.mod,
    "pdiv_r": operator.mod,
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}
_SCALAR = {
    "min": min,
    "max": max,
    "and": lambda x, y: bool(x) and bool(y),
    "or": lambda x, y: bool(x) or bool(y),
    "zdiv_r": _zdiv_r,
}
_VECTOR = {
    "min": np.minimum,
    "max": np.maximum,
    "and": np.logical_and,
    "or": np.logical_or,
    "zdiv_r": np.fmod,
}


# ----------------------------------------------------------------------------- text
_INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "fdiv_q": "//",
    "pdiv_q": "//",
    "pdiv_r": "%",
    "zdiv_r": "%",
    "eq": "==",
    "le": "<=",
    "lt": "<",
    "ge": ">=",
    "gt": ">",
    "and": "and",
    "or": "or",
}


def text(e: Expr) -> str:
    """``e`` as readable text: binary operators in parentheses, others as calls."""
    if isinstance(e, (bool, int, str)):
        return str(e)
    op, *args = e
    if op in _INFIX and len(args) == 2 or op in ("and", "or"):
        return "(" + f" {_INFIX[op]} ".join(text(a) for a in args) + ")"
    if op == "neg":
        return f"-{text(args[0])}"
    if op == "select":
        return f"({text(args[1])} if {text(args[0])} else {text(args[2])})"
    return f"{op}({', '.join(text(a) for a in args)})"
