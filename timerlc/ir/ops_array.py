"""Array ops of the registry: matmul, shape changes, indexing and sources.

Registered into ``timerlc.ir.ops.REGISTRY`` when ``timerlc.ir.ops`` is imported; see there.
"""

from __future__ import annotations

import numpy as np

from timerlc.ir import index as ix
from timerlc.ir.ops import (
    TypeRuleError,
    _no_bool,
    _same_dtype,
    _static,
    broadcast_shapes,
    op,
)
from timerlc.ir.types import TensorType, format_shape, numpy_dtype


# ----------------------------------------------------------------------------- linear algebra
@op("matmul", "other", 2, "NumPy matmul: batched over leading axes")
def _():
    def infer(attrs, ts):
        a, b = ts
        _same_dtype(ts, "@")
        _no_bool(a)
        _static(a, "@")
        _static(b, "@")
        if a.rank == 0 or b.rank == 0:
            raise TypeRuleError(f"@ needs arrays, got {a} and {b}")
        sa = (1,) + a.shape if a.rank == 1 else a.shape
        sb = b.shape + (1,) if b.rank == 1 else b.shape
        if sa[-1] != sb[-2]:
            raise TypeRuleError(
                f"@ shapes {format_shape(a.shape)} and {format_shape(b.shape)} do not match "
                f"({sa[-1]} != {sb[-2]})"
            )
        batch = broadcast_shapes(sa[:-2], sb[:-2])
        shape = batch + (sa[-2], sb[-1])
        if a.rank == 1:
            shape = shape[:-2] + shape[-1:]
        if b.rank == 1:
            shape = shape[:-1]
        return TensorType(a.dtype, shape)

    return infer, lambda attrs, args, point: np.matmul(args[0], args[1])


# ----------------------------------------------------------------------------- shape ops
@op("reshape", "shape", 1, "attrs: shape (resolved, no -1)")
def _():
    def infer(attrs, ts):
        (t,) = ts
        _static(t, "reshape")
        shape = tuple(attrs["shape"])
        if int(np.prod(shape)) != int(np.prod(t.shape)):
            raise TypeRuleError(f"cannot reshape {t} into {format_shape(shape)}")
        return t.with_shape(shape)

    return infer, lambda attrs, args, point: np.reshape(args[0], attrs["shape"])


@op("transpose", "shape", 1, "attrs: perm")
def _():
    def infer(attrs, ts):
        (t,) = ts
        _static(t, "transpose")
        perm = tuple(attrs["perm"])
        if sorted(perm) != list(range(t.rank)):
            raise TypeRuleError(f"transpose permutation {list(perm)} does not fit {t}")
        return t.with_shape(tuple(t.shape[p] for p in perm))

    return infer, lambda attrs, args, point: np.transpose(args[0], attrs["perm"])


@op("broadcast_to", "shape", 1, "attrs: shape")
def _():
    def infer(attrs, ts):
        (t,) = ts
        _static(t, "broadcast")
        shape = tuple(attrs["shape"])
        if len(shape) < t.rank or broadcast_shapes(t.shape, shape) != shape:
            raise TypeRuleError(f"cannot broadcast {t} to {format_shape(shape)}")
        return t.with_shape(shape)

    return infer, lambda attrs, args, point: np.broadcast_to(args[0], attrs["shape"]).copy()


@op("expand_dims", "shape", 1, "attrs: axis (normalized)")
def _():
    def infer(attrs, ts):
        (t,) = ts
        _static(t, "expand")
        axis = attrs["axis"]
        if not 0 <= axis <= t.rank:
            raise TypeRuleError(f"expand: axis {axis} is out of range for {t}")
        return t.with_shape(t.shape[:axis] + (1,) + t.shape[axis:])

    return infer, lambda attrs, args, point: np.expand_dims(args[0], attrs["axis"])


@op("squeeze", "shape", 1, "attrs: axes (normalized)")
def _():
    def infer(attrs, ts):
        (t,) = ts
        _static(t, "squeeze")
        axes = tuple(attrs["axes"])
        for a in axes:
            if t.shape[a] != 1:
                raise TypeRuleError(f"squeeze: axis {a} of {t} has length {t.shape[a]}, not 1")
        return t.with_shape(tuple(s for k, s in enumerate(t.shape) if k not in axes))

    return infer, lambda attrs, args, point: np.squeeze(args[0], tuple(attrs["axes"]))


@op("concat", "shape", None, "attrs: axis (normalized)")
def _():
    def infer(attrs, ts):
        if not ts:
            raise TypeRuleError("concat needs at least one array")
        dtype = _same_dtype(ts, "concat")
        axis = attrs["axis"]
        first = ts[0]
        for t in ts:
            _static(t, "concat")
            if t.rank != first.rank or t.rank == 0:
                raise TypeRuleError(f"concat needs arrays of one rank, got {first} and {t}")
            for k in range(t.rank):
                if k != axis and t.shape[k] != first.shape[k]:
                    raise TypeRuleError(
                        f"concat: shapes {format_shape(first.shape)} and {format_shape(t.shape)} "
                        f"differ off axis {axis}"
                    )
        shape = list(first.shape)
        shape[axis] = sum(t.shape[axis] for t in ts)
        return TensorType(dtype, tuple(shape))

    return infer, lambda attrs, args, point: np.concatenate(args, axis=attrs["axis"])


# ----------------------------------------------------------------------------- indexing
def index_items(items, point):
    """The NumPy index tuple of an ``index`` op at a point (gather array left as None)."""
    out = []
    for item in items:
        kind = item[0]
        if kind == "int":
            out.append(ix.evaluate(item[1], point))
        elif kind == "slice":
            start = ix.evaluate(item[1], point)
            out.append(slice(start, start + item[2]))
        elif kind == "full":
            out.append(slice(None))
        else:  # gather
            out.append(None)
    return out


@op(
    "index",
    "index",
    None,
    "attrs: items, each ('int', e) | ('slice', start, length) | ('full',) | ('gather',)",
)
def _():
    def infer(attrs, ts):
        x = ts[0]
        _static(x, "indexing")
        items = attrs["items"]
        if len(items) > x.rank:
            raise TypeRuleError(f"too many indices ({len(items)}) for {x}")
        gathers = [k for k, it in enumerate(items) if it[0] == "gather"]
        if len(gathers) != len(ts) - 1 or len(gathers) > 1:
            raise TypeRuleError("at most one tensor index is allowed")
        dummy = []
        for k, it in enumerate(items):
            if it[0] == "int":
                dummy.append(0)
            elif it[0] == "slice":
                if it[2] > x.shape[k] or it[2] < 0:
                    raise TypeRuleError(f"slice of length {it[2]} does not fit axis {k} of {x}")
                dummy.append(slice(0, it[2]))
            elif it[0] == "full":
                dummy.append(slice(None))
            else:
                idx = ts[1]
                if idx.dtype not in ("i32", "i64"):
                    raise TypeRuleError(f"a tensor index must be an integer, got {idx}")
                _static(idx, "a tensor index")
                dummy.append(np.zeros(idx.shape, np.intp))
        shape = np.broadcast_to(np.empty((), np.int8), x.shape)[tuple(dummy)].shape
        return x.with_shape(tuple(int(s) for s in shape))

    def impl(attrs, args, point):
        x = args[0]
        idx = index_items(attrs["items"], point)
        for k, it in enumerate(attrs["items"]):
            if it[0] == "gather":
                _check_indices(args[1], x.shape[k], "gather")
                idx[k] = args[1]
            elif it[0] == "int":
                if not -x.shape[k] <= idx[k] < x.shape[k]:
                    raise IndexError(
                        f"index {idx[k]} is out of range for an axis of length {x.shape[k]}"
                    )
                idx[k] %= x.shape[k]
            elif it[0] == "slice" and not (0 <= idx[k].start and idx[k].stop <= x.shape[k]):
                raise IndexError(
                    f"slice {idx[k].start}:{idx[k].stop} is out of range for an axis of length "
                    f"{x.shape[k]}"
                )
        return x[tuple(idx)]

    return infer, impl


def _check_indices(idx: np.ndarray, n: int, what: str):
    """Integer indices must lie in [-n, n), as NumPy requires (negative ones count back)."""
    bad = (idx < -n) | (idx >= n)
    if np.any(bad):
        first = idx[bad].flat[0]
        raise IndexError(f"{what}: index {first} is out of range for an axis of length {n}")


@op("index_add", "index", None, "zeros(attrs.shape) with the input added at attrs.items")
def _():
    """The transpose of ``index``: scatter-add (repeated gather indices accumulate)."""

    def infer(attrs, ts):
        g = ts[0]
        return g.with_shape(tuple(attrs["shape"]))

    def impl(attrs, args, point):
        g = args[0]
        out = np.zeros(attrs["shape"], g.dtype)
        idx = index_items(attrs["items"], point)
        for k, it in enumerate(attrs["items"]):
            if it[0] == "gather":
                idx[k] = args[1]
            elif it[0] == "int":
                idx[k] %= attrs["shape"][k]
        np.add.at(out, tuple(idx), g)
        return out

    return infer, impl


@op("take_along_add", "index", 2, "zeros(attrs.shape) + g put along attrs.axis at idx (adding)")
def _():
    """The transpose of ``take_along``: where x was broadcast against the indices, the
    contributions of the broadcast copies are summed."""

    def infer(attrs, ts):
        g, idx = ts
        return g.with_shape(tuple(attrs["shape"]))

    def impl(attrs, args, point):
        g, idx = args
        shape, axis = tuple(attrs["shape"]), attrs["axis"]
        full = list(np.broadcast_shapes(
            tuple(1 if k == axis else s for k, s in enumerate(shape)), idx.shape, g.shape
        ))
        full[axis] = shape[axis]
        out = np.zeros(full, g.dtype)
        gfull = np.broadcast_shapes(idx.shape, g.shape)
        idx, g = np.broadcast_to(idx, gfull), np.broadcast_to(g, gfull)
        grids = list(np.indices(gfull, sparse=True))
        grids[axis] = idx % shape[axis]
        np.add.at(out, tuple(grids), g)
        extra = tuple(k for k, s in enumerate(shape) if s == 1 and full[k] != 1)
        return out.sum(axis=extra, keepdims=True) if extra else out

    return infer, impl


@op("take", "index", 2, "np.take; attrs: axis (None: flattened)")
def _():
    def infer(attrs, ts):
        x, idx = ts
        _static(x, "take")
        if idx.dtype not in ("i32", "i64"):
            raise TypeRuleError(f"take needs integer indices, got {idx}")
        axis = attrs.get("axis")
        if axis is None:
            return x.with_shape(idx.shape)
        return x.with_shape(x.shape[:axis] + idx.shape + x.shape[axis + 1 :])

    def impl(attrs, args, point):
        x, idx = args
        axis = attrs.get("axis")
        _check_indices(idx, x.size if axis is None else x.shape[axis], "take")
        return np.take(x, idx, axis=axis)

    return infer, impl


@op("take_along", "index", 2, "np.take_along_axis; attrs: axis")
def _():
    def infer(attrs, ts):
        x, idx = ts
        _static(x, "take_along")
        if idx.dtype not in ("i32", "i64"):
            raise TypeRuleError(f"take_along needs integer indices, got {idx}")
        if idx.rank != x.rank:
            raise TypeRuleError(f"take_along needs indices of the rank of {x}, got {idx}")
        axis = attrs["axis"]
        other_x = tuple(s for k, s in enumerate(x.shape) if k != axis)
        other_i = tuple(s for k, s in enumerate(idx.shape) if k != axis)
        shape = broadcast_shapes(other_x, other_i)
        shape = shape[:axis] + (idx.shape[axis],) + shape[axis:]
        return x.with_shape(shape)

    def impl(attrs, args, point):
        x, idx = args
        _check_indices(idx, x.shape[attrs["axis"]], "take_along")
        return np.take_along_axis(x, idx, axis=attrs["axis"])

    return infer, impl


# ----------------------------------------------------------------------------- sources
@op("const", "source", 0, "attrs: value (number or nested tuples), dtype, shape")
def _():
    def infer(attrs, ts):
        return TensorType(attrs["dtype"], tuple(attrs["shape"]))

    def impl(attrs, args, point):
        v = np.asarray(attrs["value"], dtype=numpy_dtype(attrs["dtype"]))
        return np.broadcast_to(v, attrs["shape"]).copy()

    return infer, impl


@op("arange", "source", 0, "attrs: start, stop, step, dtype")
def _():
    def infer(attrs, ts):
        n = len(range(attrs["start"], attrs["stop"], attrs["step"]))
        return TensorType(attrs["dtype"], (n,))

    def impl(attrs, args, point):
        return np.arange(
            attrs["start"], attrs["stop"], attrs["step"], dtype=numpy_dtype(attrs["dtype"])
        )

    return infer, impl


@op("dimval", "source", 0, "the current index of dim attrs.dim, as an i32 scalar")
def _():
    return (lambda attrs, ts: TensorType("i32", ())), (
        lambda attrs, args, point: np.asarray(point[attrs["dim"]], np.int32)
    )


@op("index_value", "source", 0, "the value of the index expression attrs.expr, as an i32 scalar")
def _():
    return (lambda attrs, ts: TensorType("i32", ())), (
        lambda attrs, args, point: np.asarray(ix.evaluate(attrs["expr"], point), np.int32)
    )


@op("merge", "control", None, "the first input whose edge condition holds")
def _():
    def infer(attrs, ts):
        first = ts[0]
        for t in ts[1:]:
            if t != first:
                raise TypeRuleError(f"merge branches differ: {first} and {t}")
        return first

    def impl(attrs, args, point):  # the interpreter picks the branch; it passes only that one
        return args[0]

    return infer, impl
