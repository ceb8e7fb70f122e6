"""Configs: compile-time constants, evaluated in order, with ``--set`` overrides.

A config expression may use literals, earlier configs, ``+ - * / // %`` and ``min``/``max``
(LANGUAGE.md section 3). ``/`` is true division (a float), ``//`` and ``%`` floor like
Python. ``seed`` always exists (default 0).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from timerlc.diagnostics import ProgramError, Span, did_you_mean
from timerlc.frontend import ast

ConfigValue = int | float | bool


@dataclass(frozen=True)
class Config:
    name: str
    value: ConfigValue
    span: Span | None


def parse_override(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` -> (name, value text); raises ValueError when malformed."""
    if "=" not in text:
        raise ValueError(f"expected NAME=VALUE, got '{text}'")
    name, value = text.split("=", 1)
    name, value = name.strip(), value.strip()
    if not name.isidentifier() or not value:
        raise ValueError(f"expected NAME=VALUE, got '{text}'")
    return name, value


_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][+-]?[0-9]+)?")


def _literal(text: str) -> ConfigValue | None:
    """A ``--set`` value: ``true``/``false``, an int or a float, written as RTL writes them
    (ASCII decimal digits only: no ``1_6``, no full-width digits, no ``nan``/``inf``)."""
    t = text.strip()
    if t in ("true", "false"):
        return t == "true"
    if t.isascii() and _INT.fullmatch(t):
        return int(t)
    if t.isascii() and _FLOAT.fullmatch(t):
        return float(t)
    return None


def _kind(v) -> str:
    return "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float"


def _coerce(name: str, declared: ConfigValue, text: str, span) -> ConfigValue:
    v = _literal(text)
    if text.strip().lstrip("+-").lower() in ("nan", "inf", "infinity"):
        raise ProgramError(f"--set {name}={text}: '{text}' is not a finite number", span)
    if v is None:
        raise ProgramError(
            f"--set {name}={text}: '{text}' is not a number or true/false (numbers are "
            "written with ASCII digits, as in a program: 16, -2, 0.5, 1e-3)",
            span,
        )
    if isinstance(v, float) and not math.isfinite(v):
        raise ProgramError(f"--set {name}={text}: '{text}' is not a finite number", span)
    want, got = _kind(declared), _kind(v)
    if want == got:
        return v
    if want == "float" and got == "int":
        return float(v)
    raise ProgramError(
        f"--set {name}={text}: {name} is {'an' if want == 'int' else 'a'} {want} config, "
        f"'{text}' is {'an' if got == 'int' else 'a'} {got}",
        span,
    )


def evaluate_configs(program: ast.Program, overrides: dict[str, str]) -> dict[str, Config]:
    """All configs of the program, in order, with overrides applied."""
    configs: dict[str, Config] = {}
    declared_spans = {}
    for stmt in program.statements:
        if not isinstance(stmt, ast.ConfigDecl):
            continue
        for ident, expr in stmt.items:
            if ident.name in configs:
                raise ProgramError(f"config '{ident.name}' is declared twice", ident.span)
            value = evaluate(expr, configs)
            if ident.name in overrides:
                value = _coerce(ident.name, value, overrides[ident.name], ident.span)
            configs[ident.name] = Config(ident.name, value, ident.span)
            declared_spans[ident.name] = ident.span
    if "seed" not in configs:
        value = 0
        if "seed" in overrides:
            value = _coerce("seed", 0, overrides["seed"], None)
        configs["seed"] = Config("seed", value, None)
    first = next((c.span for c in configs.values() if c.span is not None), None)
    for name in overrides:
        if name not in configs:
            raise ProgramError(
                f"--set {name}={overrides[name]}: the program has no config '{name}'"
                + did_you_mean(name, configs),
                first,
            )
    return configs


def evaluate(expr: ast.Expr, configs: dict[str, Config]) -> ConfigValue:
    """Evaluate a config expression."""
    if isinstance(expr, (ast.Int, ast.Float, ast.Bool)):
        return expr.value
    if isinstance(expr, ast.Name):
        if expr.id not in configs:
            raise ProgramError(
                f"unknown config '{expr.id}' (a config may use only earlier configs)"
                + did_you_mean(expr.id, configs),
                expr.span,
            )
        return configs[expr.id].value
    if isinstance(expr, ast.Unary) and expr.op in "+-":
        v = evaluate(expr.operand, configs)
        _number(v, expr.operand)
        return -v if expr.op == "-" else v
    if isinstance(expr, ast.Binary) and expr.op in ("+", "-", "*", "/", "//", "%"):
        a, b = evaluate(expr.left, configs), evaluate(expr.right, configs)
        _number(a, expr.left)
        _number(b, expr.right)
        if expr.op in ("/", "//", "%") and b == 0:
            raise ProgramError("division by zero in a config expression", expr.op_span)
        value = {
            "+": lambda: a + b,
            "-": lambda: a - b,
            "*": lambda: a * b,
            "/": lambda: a / b,
            "//": lambda: a // b,
            "%": lambda: a % b,
        }[expr.op]()
        if isinstance(value, float) and not math.isfinite(value):
            raise ProgramError(
                f"this config expression is not a finite number ({value})", expr.op_span
            )
        return value
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id in ("min", "max")
        and not expr.kwargs
    ):
        if len(expr.args) < 2:
            raise ProgramError(
                f"{expr.func.id} takes 2 or more arguments, got {len(expr.args)}", expr.func.span
            )
        values = [evaluate(a, configs) for a in expr.args]
        for v, a in zip(values, expr.args):
            _number(v, a)
        return (min if expr.func.id == "min" else max)(values)
    raise ProgramError(
        "a config expression may use only numbers, earlier configs, + - * / // % and min/max",
        expr.span,
    )


def _number(v, expr):
    if isinstance(v, bool):
        raise ProgramError("a bool config cannot be used in arithmetic", expr.span)
