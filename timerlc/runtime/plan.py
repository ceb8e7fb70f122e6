"""Loading a plan: the JSON file ``timerlc compile`` writes (``docs/plan.md``).

A plan of another format version, or one that is not valid, is refused with a clear
``PlanError``. Index expressions in a plan are Python expressions over dim names; they are
parsed and checked against a small whitelist (names, integers, arithmetic, comparisons and
a few ``_np`` functions) before they are compiled, so a corrupt plan cannot run code.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np

FORMAT_VERSION = 2
REQUIRED = ("format_version", "dims", "buffers", "statements", "tree", "outputs", "metrics")
_NP_FUNCS = {"minimum", "maximum", "logical_and", "logical_or", "logical_not", "floor_divide"}
_NODES = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.Compare,
    ast.BoolOp,
    ast.Call,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.Attribute,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.FloorDiv,
    ast.Mod,
    ast.USub,
    ast.UAdd,
    ast.Not,
    ast.And,
    ast.Or,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.Pow,
)


class PlanError(Exception):
    """A plan that cannot be loaded."""


def load_plan(path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "plan.json"
    try:
        plan = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(f"no plan at {path} (run `timerlc compile` first)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PlanError(f"{path} is not a valid plan: {e}") from None
    if not isinstance(plan, dict) or "format_version" not in plan:
        raise PlanError(f"{path} is not a timerlc plan (no format_version)")
    if plan["format_version"] != FORMAT_VERSION:
        raise PlanError(
            f"{path} has plan format {plan['format_version']!r}; this timerlc reads format "
            f"{FORMAT_VERSION}: compile the program again"
        )
    missing = [k for k in REQUIRED if k not in plan]
    if missing:
        raise PlanError(f"{path} is not a valid plan: missing {', '.join(missing)}")
    return plan


def compile_index(text: str, dims) -> callable:
    """``text`` (an expression over ``dims``) as a function of the dims' values."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise PlanError(f"bad index expression in plan: {text!r} ({e.msg})") from None
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise PlanError(f"index expression not allowed in a plan: {text!r}")
        if isinstance(node, ast.Name) and node.id not in dims and node.id != "_np":
            raise PlanError(f"unknown name {node.id!r} in plan expression {text!r}")
        if isinstance(node, ast.Attribute) and not (
            isinstance(node.value, ast.Name) and node.value.id == "_np" and node.attr in _NP_FUNCS
        ):
            raise PlanError(f"function not allowed in plan expression {text!r}")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, bool)):
            raise PlanError(f"constant not allowed in plan expression {text!r}")
    args = ", ".join(dims)
    code = compile(f"lambda {args}: ({text})", "<plan>", "eval")
    return eval(code, {"_np": np, "__builtins__": {}})  # noqa: S307 - validated above


def free_names(text: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)} - {
        "_np"
    }


def decode_attr(v):
    """Plan attribute values back to what the kernels take (tuples, sympy index values)."""
    if isinstance(v, list):
        return tuple(decode_attr(x) for x in v)
    if isinstance(v, dict):
        if "float" in v:
            return float(v["float"])
        if "dict" in v:
            return {decode_attr(k): decode_attr(x) for k, x in v["dict"]}
        if "sympy" in v:
            return _sympy(v["sympy"])
    return v


_SYMPY_NAMES = {
    "Symbol",
    "Integer",
    "Rational",
    "Add",
    "Mul",
    "Pow",
    "Mod",
    "floor",
    "ceiling",
    "Min",
    "Max",
    "And",
    "Or",
    "Not",
    "Eq",
    "Ne",
    "Lt",
    "Le",
    "Gt",
    "Ge",
    "StrictLessThan",
    "LessThan",
    "StrictGreaterThan",
    "GreaterThan",
    "Equality",
    "Unequality",
    "true",
    "false",
    "BooleanTrue",
    "BooleanFalse",
    "NegativeOne",
    "One",
    "Zero",
    "Half",
}


def _sympy(text: str):
    """An index expression attribute (``sympy.srepr`` text), checked before sympy reads it."""
    import sympy

    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise PlanError(f"bad index expression in plan: {text!r}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in _SYMPY_NAMES:
            raise PlanError(f"name {node.id!r} not allowed in plan expression {text!r}")
        if isinstance(node, ast.Attribute):
            raise PlanError(f"attribute not allowed in plan expression {text!r}")
    return sympy.sympify(text)
