"""Running an op's kernel over a batch of points, and the helpers kernels share.

An op's ``kernel`` (``ops.core.Op``) gives its meaning at many points of the iteration space
at once: every input carries ``nb`` leading *batch* axes (one per vectorized dim) before its
spatial axes, and each batch axis has either the full extent of the batch or extent 1 (a
value shared along that axis, such as parameters shared by all environments). ``point``
maps a dim to an int (the same at every batch point) or to an integer array with ``nb``
dims broadcastable to the batch shape. With ``nb = 0`` a kernel computes one point: that is
how the reference interpreter runs every op, so the oracle and the runtime share the
numerics and differ in everything else (order, batching, memory).

``run_op`` returns an array of shape ``batch_shape + out_shape`` and dtype ``out_dtype``
equal, at every batch index, to the op at that point cast to ``out_dtype``.

Attribute values are a plan's (``timerlc.plan.items``): index expressions (``index`` items,
``index_value``) are ints or ``Ix`` (``timerlc.plan.expr``).
"""

from __future__ import annotations

import functools
import operator
from typing import Callable

import numpy as np

from timerlc.plan import expr as px
from timerlc.plan.items import Ix
from timerlc.types import NUMPY_DTYPES


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a dtype name (``f32``, ``i64``, ``bool``, ...)."""
    try:
        return NUMPY_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (known: {', '.join(NUMPY_DTYPES)})") from None


class Ctx:
    """What a kernel knows of its batch: ``nb`` batch axes of shape ``batch``, the value of
    each dim at each point (``point``: dim -> int | int64 array with nb dims, checked when a
    kernel first asks: most never do), and the result's spatial shape and dtype."""

    __slots__ = ("nb", "batch", "_raw", "_point", "out_shape", "dtype")

    def __init__(self, nb: int, batch: tuple, point: dict, out_shape: tuple, dtype: np.dtype):
        self.nb, self.batch, self._raw, self._point = nb, batch, point, None
        self.out_shape, self.dtype = out_shape, dtype

    @property
    def point(self) -> dict:
        if self._point is None:
            self._point = {d: _point_value(d, v, self.batch) for d, v in self._raw.items()}
        return self._point


Kernel = Callable[["Ctx", dict, list], np.ndarray]


# ----------------------------------------------------------------------------- entry point
def run_op(
    name: str,
    attrs: dict,
    args: list,
    batch_shape: tuple[int, ...],
    point: dict,
    out_dtype: str,
    out_shape: tuple[int, ...],
) -> np.ndarray:
    """Op ``name`` at every point of a batch: an array ``batch_shape + out_shape``."""
    fn = kernel_of(name)
    batch = tuple(operator.index(s) for s in batch_shape)
    nb = len(batch)
    arrays = []
    for k, a in enumerate(args):
        a = np.asarray(a)
        if a.ndim < nb or any(s not in (1, b) for s, b in zip(a.shape, batch)):
            raise ValueError(
                f"{name}: input {k} of shape {a.shape} does not start with batch axes "
                f"broadcastable to {batch}"
            )
        arrays.append(a)
    ctx = Ctx(
        nb, batch, point, tuple(operator.index(s) for s in out_shape), numpy_dtype(out_dtype)
    )
    with np.errstate(all="ignore"):
        out = fn(ctx, attrs, arrays)
    return _finish(name, out, ctx, arrays)


def kernel_of(name: str) -> Kernel:
    """The batched kernel of op ``name``, for ``run_prepared``."""
    from timerlc.ops.core import REGISTRY

    op = REGISTRY.get(name)
    if op is None or op.kernel is None:
        raise ValueError(f"op {name!r} has no batched kernel (the runtime runs it itself)")
    return op.kernel


def run_prepared(
    fn: Kernel, attrs: dict, args: list, n: int, point: dict, dtype: np.dtype, out_shape: tuple
) -> np.ndarray:
    """``run_op`` for the runtime, without its checks: ``args`` have one batch axis of ``n``
    or 1, as the plan's types say, and the caller is inside ``np.errstate(all="ignore")``.
    The result may keep a batch axis of 1 where it is the same at every point, and may be a
    view of an input (kernels never write into their inputs)."""
    out = np.asarray(fn(Ctx(1, (n,), point, out_shape, dtype), attrs, args))
    return out if out.dtype == dtype else out.astype(dtype)


def _point_value(dim: str, v, batch: tuple):
    if np.ndim(v) == 0:
        return operator.index(v)
    v = np.asarray(v)
    if v.dtype.kind not in "iu" or v.ndim != len(batch):
        raise ValueError(
            f"the value of dim {dim} must be an int or an integer array with {len(batch)} dims, "
            f"got {v.dtype} {v.shape}"
        )
    np.broadcast_shapes(v.shape, batch)
    return v.astype(np.int64, copy=False)


def _finish(name: str, out, ctx: Ctx, args: list) -> np.ndarray:
    """Checks the kernel's shape, broadcasts size-1 batch axes, casts; never aliases an input."""
    out = np.asarray(out)
    full = ctx.batch + ctx.out_shape
    if out.shape[ctx.nb :] != ctx.out_shape or out.ndim != len(full):
        raise ValueError(f"{name}: result of shape {out.shape}, expected {full}")
    if out.shape != full:
        out = np.broadcast_to(out, full)
    if (
        out.dtype != ctx.dtype
        or not out.flags.writeable
        or not out.flags.c_contiguous
        or any(np.may_share_memory(out, a) for a in args)
    ):
        out = out.astype(ctx.dtype, order="C", copy=True)
    return out


def lift(x: np.ndarray, nb: int) -> np.ndarray:
    """A value the same at every batch point, given nb size-1 batch axes."""
    x = np.asarray(x)
    return x.reshape((1,) * nb + x.shape)


def bshape(a: np.ndarray, nb: int) -> tuple:
    return a.shape[:nb]


def spatial(a: np.ndarray, nb: int) -> tuple:
    return a.shape[nb:]


def to_rank(a: np.ndarray, nb: int, rank: int) -> np.ndarray:
    """``a`` with size-1 axes inserted between its batch and spatial axes, up to ``rank``
    spatial axes: its spatial shape then broadcasts from the right as at one point."""
    return a.reshape(a.shape[:nb] + (1,) * (rank - a.ndim + nb) + a.shape[nb:])


def align(args: list, nb: int) -> list:
    """The inputs of an elementwise op, their spatial parts brought to one rank."""
    rank = max((a.ndim - nb for a in args), default=0)
    return [to_rank(a, nb, rank) for a in args]


def batch_axes(axes, x: np.ndarray, nb: int) -> tuple[int, ...]:
    """Spatial axes (None: all) as non-negative axes of the batched array."""
    rank = x.ndim - nb
    if axes is None:
        return tuple(range(nb, x.ndim))
    if isinstance(axes, (int, np.integer)):
        axes = (axes,)
    out = []
    for a in axes:
        a = operator.index(a)
        if not -rank <= a < rank:
            raise ValueError(f"axis {a} is out of range for rank {rank}")
        out.append(a % rank + nb)
    return tuple(out)


def batch_axis(axis, x: np.ndarray, nb: int) -> int:
    return batch_axes((axis,), x, nb)[0]


# ----------------------------------------------------------------------------- index expressions
def index_at(e, point: dict):
    """An index expression's value (an int, or a plan's ``Ix``): an int, or an int64 array
    over the batch."""
    if isinstance(e, (bool, np.bool_)):
        raise ValueError(f"not an index expression: {e!r}")
    if isinstance(e, (int, np.integer)):
        return int(e)
    if isinstance(e, Ix):
        params = tuple(sorted(px.names(e.expr)))
        return _plan_index(e.expr, params)(*(dim_at(point, d) for d in params))
    raise ValueError(f"not an index expression: {e!r}")


@functools.lru_cache(maxsize=4096)
def _plan_index(e, params: tuple[str, ...]):
    return px.compile_expr(e, params, vector=True)


def dim_at(point: dict, name: str):
    try:
        return point[name]
    except KeyError:
        raise ValueError(f"index expression over dim {name}, which the point lacks") from None


def batched_ix(v, nb: int, rank: int):
    """An index value with ``rank`` size-1 axes after its batch axes (ints stay ints)."""
    if isinstance(v, np.ndarray):
        return v.reshape(v.shape[:nb] + (1,) * rank)
    return v
