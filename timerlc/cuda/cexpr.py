"""Scalars in CUDA C (``cuda.render``): the C types of the kernel IR's dtypes, and each
scalar op, cast and constant as C text with NumPy's semantics for its dtype (the helpers of
``prelude.PRELUDE``)."""

from __future__ import annotations

import math
import struct

CTYPE = {"bool": "bool", "i32": "int", "i64": "long long", "f32": "float", "f64": "double"}


MTYPE = {
    "bool": "unsigned char",
    "i32": "int",
    "i64": "long long",
    "f32": "float",
    "f64": "double",
}


SUFFIX = {"bool": "b", "i32": "i32", "i64": "i64", "f32": "f32", "f64": "f64"}


class Unsupported(Exception):
    """A kernel this renderer does not render yet."""


_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


_FMATH = {
    "exp": "exp",
    "log": "log",
    "log1p": "log1p",
    "sqrt": "sqrt",
    "tanh": "tanh",
    "sin": "sin",
    "cos": "cos",
    "floor": "floor",
    "ceil": "ceil",
    "round": "rint",
}


def unary(op: str, x: str, dt: str) -> str:
    s = SUFFIX[dt]
    isf = dt in ("f32", "f64")
    if op == "not":
        return f"(!{x})"
    if op == "neg":
        return f"(-{x})" if isf else f"tl_neg_{s}({x})"
    if op in ("abs", "sign"):
        if isf and op == "abs":
            return f"fabs{'f' if dt == 'f32' else ''}({x})"
        return f"tl_{op}_{s}({x})"
    if op == "sigmoid" and isf:
        return f"tl_sigmoid_{s}({x})"
    if op in _FMATH and isf:
        return f"{_FMATH[op]}{'f' if dt == 'f32' else ''}({x})"
    raise Unsupported(f"{op} of {dt}")


def binary(op: str, a: str, b: str, dt: str) -> str:
    s = SUFFIX[dt]
    isf = dt in ("f32", "f64")
    if op in _CMP:
        return f"({a} {_CMP[op]} {b})"
    if op == "and":
        return f"({a} && {b})"
    if op == "or":
        return f"({a} || {b})"
    if op in ("add", "sub", "mul"):
        if isf:
            return f"({a} {'+-*'[('add', 'sub', 'mul').index(op)]} {b})"
        return f"tl_{op}_{s}({a}, {b})"
    if op == "div" and isf:
        return f"({a} / {b})"
    if op in ("minimum", "maximum"):
        if dt == "bool":
            return f"({a} {'&&' if op == 'minimum' else '||'} {b})"
        return f"tl_{op[:3]}_{s}({a}, {b})"
    if op == "pow":
        return f"pow{'f' if dt == 'f32' else ''}({a}, {b})" if isf else f"tl_pow_{s}({a}, {b})"
    if op in ("floordiv", "mod") or (op == "rem" and not isf):
        return f"tl_{op}_{s}({a}, {b})"
    raise Unsupported(f"{op} of {dt}")


def cast(x: str, src: str, dst: str) -> str:
    if src == dst:
        return x
    if dst == "bool":
        return f"({x} != 0)"
    if src in ("f32", "f64") and dst in ("i32", "i64"):
        return f"tl_f2{dst}((double)({x}))"
    return f"(({CTYPE[dst]})({x}))"


def const(v, dtype: str) -> str:
    if dtype == "bool":
        return "true" if v else "false"
    if dtype == "i32":
        return f"({int(v)})" if int(v) != -(2**31) else "((int)0x80000000u)"
    if dtype == "i64":
        return f"({int(v)}LL)" if int(v) != -(2**63) else "((long long)0x8000000000000000ull)"
    x = float(v)
    f = "f" if dtype == "f32" else ""
    if math.isnan(x):
        return f"(({CTYPE[dtype]})tl_f64_bits(0x7FF8000000000000ull))"
    if math.isinf(x):
        return f"(({CTYPE[dtype]})({'-' if x < 0 else ''}tl_f64_bits(0x7FF0000000000000ull)))"
    if dtype == "f32":
        import numpy as np

        x = float(np.float32(x))
    bits = struct.unpack(">Q", struct.pack(">d", x))[0]
    return f"({x.hex()}{f})" if bits else f"(0.0{f})"


RNG_FUNCTIONS = frozenset(
    f"tl_rng_{f}"
    for f in (
        "uniform_f32",
        "uniform_f64",
        "uniform_range_f32",
        "uniform_range_f64",
        "normal_f32",
        "normal_f64",
        "normal_affine_f32",
        "normal_affine_f64",
        "gumbel_f64",
    )
)


def identity(op: str, dt: str) -> str:
    """The value ``op`` (``kir.REDUCE_OPS``) leaves any value of ``dt`` alone with."""
    isf = dt in ("f32", "f64")
    bits = 32 if dt == "i32" else 64
    v = {
        "add": 0.0 if isf else 0,
        "mul": 1.0 if isf else 1,
        "maximum": -math.inf if isf else -(2 ** (bits - 1)),
        "minimum": math.inf if isf else 2 ** (bits - 1) - 1,
    }[op]
    return const(v, dt)
