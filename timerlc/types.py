"""Value types: a dtype and a spatial shape, shared by the compiler, the op records
(``timerlc.ops``) and the runtime.

A shape entry is an int, or (in the compiler) a sympy index expression for the length of a
dynamic slice (only reductions may consume such a value, LANGUAGE.md section 5). Importing
this module does not import sympy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DTYPES = ("bool", "i32", "i64", "f32", "f64")
_RANK = {d: k for k, d in enumerate(DTYPES)}
NUMPY_DTYPES = {
    "bool": np.dtype(np.bool_),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}
FLOATS = frozenset({"f32", "f64"})
INTS = frozenset({"i32", "i64"})


def promote(*dtypes: str) -> str:
    """The join of dtypes along ``bool < i32 < i64 < f32 < f64``."""
    return max(dtypes, key=_RANK.__getitem__)


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    return dtype in INTS


def numpy_dtype(dtype: str) -> np.dtype:
    return NUMPY_DTYPES[dtype]


@dataclass(frozen=True, slots=True)
class TensorType:
    dtype: str
    shape: tuple  # of int | sympy.Expr

    def __post_init__(self):
        assert self.dtype in _RANK, self.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(s, int) for s in self.shape)

    def with_dtype(self, dtype: str) -> "TensorType":
        return TensorType(dtype, self.shape)

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, tuple(shape))

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(format_extent(s) for s in self.shape)}]"


def format_extent(s) -> str:
    if isinstance(s, (int, str)):  # a str: a dynamic length as text (a plan's)
        return str(s)
    from timerlc.ir.index import to_text

    return to_text(s)


def normalize_extent(s):
    """Shape entries are ints when constant, sympy expressions otherwise."""
    if isinstance(s, (int, np.integer)):
        return int(s)
    import sympy

    s = sympy.sympify(s)
    if s.is_Integer:
        return int(s)
    return s


def format_shape(shape) -> str:
    return "[" + ", ".join(format_extent(s) for s in shape) + "]"
