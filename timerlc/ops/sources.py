"""Sources: constants, ``arange``, the value of a dim (``dimval``) or of an index
expression (``index_value``) at the point. All cheap, none differentiable."""

from __future__ import annotations

import numpy as np

from timerlc.ops.core import NO_GRAD, define
from timerlc.ops.kernel import dim_at, index_at, lift, numpy_dtype
from timerlc.types import TensorType


# ----------------------------------------------------------------------------- kernels
def _const(ctx, attrs, args):
    v = np.asarray(attrs["value"], dtype=numpy_dtype(attrs["dtype"]))
    return lift(np.broadcast_to(v, tuple(attrs["shape"])), ctx.nb)


def _arange(ctx, attrs, args):
    r = np.arange(attrs["start"], attrs["stop"], attrs["step"], dtype=numpy_dtype(attrs["dtype"]))
    return lift(r, ctx.nb)


def _scalar_i32(v, nb: int) -> np.ndarray:
    if isinstance(v, np.ndarray):
        if v.size and (v.min() < -(2**31) or v.max() >= 2**31):  # as np.asarray(int, i32)
            raise OverflowError("an index value does not fit in i32")
        return v.astype(np.int32)
    return lift(np.asarray(v, np.int32), nb)


def _dimval(ctx, attrs, args):
    return _scalar_i32(dim_at(ctx.point, attrs["dim"]), ctx.nb)


def _index_value(ctx, attrs, args):
    return _scalar_i32(index_at(attrs["expr"], ctx.point), ctx.nb)


# ----------------------------------------------------------------------------- the ops
define(
    "const",
    "source",
    0,
    lambda attrs, ts: TensorType(attrs["dtype"], tuple(attrs["shape"])),
    _const,
    vjp=NO_GRAD,
    attrs={"value": "const", "dtype": "dtype", "shape": "shape"},
    cheap=True,
    doc="attrs: value (number or nested tuples), dtype, shape",
)


def _range_length(start: int, stop: int, step: int) -> int:
    """``len(range(start, stop, step))`` for ints of any size (``len`` overflows past
    2**63)."""
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // -step)


define(
    "arange",
    "source",
    0,
    lambda attrs, ts: TensorType(
        attrs["dtype"], (_range_length(attrs["start"], attrs["stop"], attrs["step"]),)
    ),
    _arange,
    vjp=NO_GRAD,
    attrs={"start": "int", "stop": "int", "step": "int", "dtype": "dtype"},
    cheap=True,
    doc="attrs: start, stop, step, dtype",
)
define(
    "dimval",
    "source",
    0,
    lambda attrs, ts: TensorType("i32", ()),
    _dimval,
    vjp=NO_GRAD,
    attrs={"dim": "dim"},
    cheap=True,
    doc="the current index of dim attrs.dim, as an i32 scalar",
)
define(
    "index_value",
    "source",
    0,
    lambda attrs, ts: TensorType("i32", ()),
    _index_value,
    vjp=NO_GRAD,
    attrs={"expr": "ix"},
    cheap=True,
    doc="the value of the index expression attrs.expr, as an i32 scalar",
)
