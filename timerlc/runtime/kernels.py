"""Batched NumPy kernels of the ops: one op evaluated at many points of the iteration space.

The op registry of the compiler (``timerlc.ir.ops``) gives each op's meaning at ONE point:
its inputs are the arrays of that point (their "spatial" shapes) and ``point`` maps each dim
to an int. The cpu runtime vectorizes over dims: every input here carries ``nb`` leading
*batch* axes (one per vectorized dim) before its spatial axes, and each batch axis has either
the full extent of ``batch_shape`` or extent 1 (a value shared along that axis, such as
parameters shared by all environments). ``point`` maps a dim to an int (the same at every
batch position) or to an integer array with ``nb`` dims broadcastable to the batch shape.

``run_op`` returns an array of shape ``batch_shape + out_shape`` and dtype ``out_dtype``
equal, at every batch index, to the op's per-point meaning cast to ``out_dtype``: bit for
bit for integer, bool and random ops, and to float rounding for float ops (the same formulas,
in the same dtypes, so they normally agree exactly).

Attribute values are those of a plan (``timerlc.plan.items``): index expressions
(``index`` items, ``index_value``) are ints or ``Ix`` (``timerlc.plan.expr``). ``SIGNATURES`` says what each kernel takes: its number of
inputs and its attributes, which ``runtime.plan`` checks when it loads a plan.

This module belongs to the runtime: it imports NumPy, the standard library,
``timerlc.rng`` (the reference of every random draw) and the plan's data modules, never the
compiler.
"""

from __future__ import annotations

import functools
import math
import operator
import warnings
from typing import Callable

import numpy as np

from timerlc import rng
from timerlc.plan import expr as px
from timerlc.plan.items import Ix

__all__ = ["PER_POINT", "SUPPORTED", "numpy_dtype", "run_op"]

DTYPES: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a PDG dtype name (``f32``, ``i64``, ``bool``, ...)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (known: {', '.join(DTYPES)})") from None


class _Ctx:
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


Kernel = Callable[[_Ctx, dict, list], np.ndarray]
_KERNELS: dict[str, Kernel] = {}


def _kernel(*names: str):
    def register(fn: Kernel) -> Kernel:
        for n in names:
            _KERNELS[n] = fn
        return fn

    return register


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
    ctx = _Ctx(
        nb, batch, point, tuple(operator.index(s) for s in out_shape), numpy_dtype(out_dtype)
    )
    with np.errstate(all="ignore"):
        out = fn(ctx, attrs, arrays)
    return _finish(name, out, ctx, arrays)


def kernel_of(name: str) -> Kernel:
    """The batched kernel of op ``name``, for ``run_prepared``."""
    fn = _KERNELS.get(name)
    if fn is None:
        raise ValueError(f"op {name!r} has no batched kernel (the runtime runs it itself)")
    return fn


def run_prepared(
    fn: Kernel, attrs: dict, args: list, n: int, point: dict, dtype: np.dtype, out_shape: tuple
) -> np.ndarray:
    """``run_op`` for the runtime, without its checks: ``args`` have one batch axis of ``n``
    or 1, as the plan's types say, and the caller is inside ``np.errstate(all="ignore")``.
    The result may keep a batch axis of 1 where it is the same at every point, and may be a
    view of an input (kernels never write into their inputs)."""
    out = np.asarray(fn(_Ctx(1, (n,), point, out_shape, dtype), attrs, args))
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


def _finish(name: str, out, ctx: _Ctx, args: list) -> np.ndarray:
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


def _lift(x: np.ndarray, nb: int) -> np.ndarray:
    """A value the same at every batch point, given nb size-1 batch axes."""
    x = np.asarray(x)
    return x.reshape((1,) * nb + x.shape)


def _bshape(a: np.ndarray, nb: int) -> tuple:
    return a.shape[:nb]


def _spatial(a: np.ndarray, nb: int) -> tuple:
    return a.shape[nb:]


def _to_rank(a: np.ndarray, nb: int, rank: int) -> np.ndarray:
    """``a`` with size-1 axes inserted between its batch and spatial axes, up to ``rank``
    spatial axes: its spatial shape then broadcasts from the right as at one point."""
    return a.reshape(a.shape[:nb] + (1,) * (rank - a.ndim + nb) + a.shape[nb:])


def _align(args: list, nb: int) -> list:
    """The inputs of an elementwise op, their spatial parts brought to one rank."""
    rank = max((a.ndim - nb for a in args), default=0)
    return [_to_rank(a, nb, rank) for a in args]


def _axes(axes, x: np.ndarray, nb: int) -> tuple[int, ...]:
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


def _axis(axis, x: np.ndarray, nb: int) -> int:
    return _axes((axis,), x, nb)[0]


# ----------------------------------------------------------------------------- elementwise
def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _floor_divide(a, b):
    if a.dtype.kind == "f":
        return np.floor(a / b)
    return np.floor_divide(a, b)


def _power(a, b):
    if a.dtype.kind in "iu":
        # integer powers: negative exponents give 0 except for bases 1 and -1 (no error)
        neg = b < 0
        r = np.power(a, np.where(neg, 0, b))
        if np.any(neg):
            r = np.where(
                neg, np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0)), r
            )
        return r.astype(a.dtype)
    return np.power(a, b)


def _identity(x):
    return x


_UNARY = {
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "sin": np.sin,
    "cos": np.cos,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
    "neg": np.negative,
    "abs": np.abs,
    "sign": np.sign,
    "stop_grad": _identity,
    "copy": _identity,
    "logical_not": np.logical_not,
}

_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "floordiv": _floor_divide,
    "mod": np.mod,
    "pow": _power,
    "minimum": np.minimum,
    "maximum": np.maximum,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
}


def _unary_kernel(fn):
    return lambda ctx, attrs, args: fn(args[0])


def _binary_kernel(fn):
    def kernel(ctx, attrs, args):
        a, b = _align(args, ctx.nb)
        return fn(a, b)

    return kernel


for _name, _fn in _UNARY.items():
    _kernel(_name)(_unary_kernel(_fn))
for _name, _fn in _BINARY.items():
    _kernel(_name)(_binary_kernel(_fn))


@_kernel("where")
def _where(ctx, attrs, args):
    c, a, b = _align(args, ctx.nb)
    return np.where(c, a, b)


@_kernel("cast")
def _cast(ctx, attrs, args):
    x = args[0]
    dt = numpy_dtype(attrs["dtype"])
    if dt.kind in "iu" and x.dtype.kind == "f":
        x = np.trunc(x)
    return x.astype(dt)


# ----------------------------------------------------------------------------- reductions
def _reduction(fn, empty_error: str | None = None, quiet: bool = False):
    def kernel(ctx, attrs, args):
        x = args[0]
        axes = _axes(attrs.get("axes"), x, ctx.nb)
        if empty_error and any(x.shape[a] == 0 for a in axes):
            raise ValueError(f"{empty_error} of an empty slice")
        keep = bool(attrs.get("keepdims"))
        if quiet:  # the mean of an empty slice is nan, as at one point
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                return fn(x, axis=axes, keepdims=keep)
        return fn(x, axis=axes, keepdims=keep)

    return kernel


_kernel("sum")(_reduction(np.sum))
_kernel("prod")(_reduction(np.prod))
_kernel("max")(_reduction(np.max, "max"))
_kernel("min")(_reduction(np.min, "min"))
_kernel("mean")(_reduction(np.mean, quiet=True))


@_kernel("logsumexp")
def _logsumexp(ctx, attrs, args):
    x = args[0]
    axes = _axes(attrs.get("axes"), x, ctx.nb)
    keep = bool(attrs.get("keepdims"))
    if math.prod(_spatial(x, ctx.nb)) == 0:
        shape = tuple(1 if k in axes else s for k, s in enumerate(x.shape))
        r = np.full(shape, -np.inf, x.dtype)
        return r if keep else np.squeeze(r, axes)
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    r = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return r if keep else np.squeeze(r, axes)


def _arg_reduction(fn):
    def kernel(ctx, attrs, args):
        x = args[0]
        if math.prod(_spatial(x, ctx.nb)) == 0:
            raise ValueError("argmax/argmin of an empty array")
        axis = attrs.get("axis")
        if axis is None:  # the flat index over the spatial axes
            return fn(x.reshape(_bshape(x, ctx.nb) + (-1,)), axis=-1)
        return fn(x, axis=_axis(axis, x, ctx.nb))

    return kernel


_kernel("argmax")(_arg_reduction(np.argmax))
_kernel("argmin")(_arg_reduction(np.argmin))


@_kernel("discounted_sum")
def _discounted_sum(ctx, attrs, args):
    nb = ctx.nb
    x, g = args
    if x.ndim == nb:
        raise ValueError("discounted_sum needs an array")
    if attrs.get("reverse"):
        x = np.flip(x, axis=nb)
    rest = x.shape[nb + 1 :]
    g = g.reshape(_bshape(g, nb) + (1,) * len(rest))
    acc = np.zeros(np.broadcast_shapes(_bshape(x, nb), _bshape(g, nb)) + rest, x.dtype)
    lead = (slice(None),) * nb
    for k in range(x.shape[nb] - 1, -1, -1):  # Horner: x0 + g (x1 + g (x2 + ...))
        acc = x[lead + (k,)] + g * acc
    return acc


@_kernel("cumsum")
def _cumsum(ctx, attrs, args):
    x = args[0]
    axis = attrs.get("axis")
    if axis is None:  # over the flattened spatial axes
        return np.cumsum(x.reshape(_bshape(x, ctx.nb) + (-1,)), axis=-1)
    return np.cumsum(x, axis=_axis(axis, x, ctx.nb))


# ----------------------------------------------------------------------------- linear algebra
@_kernel("matmul")
def _matmul(ctx, attrs, args):
    nb = ctx.nb
    a, b = args
    ra, rb = a.ndim - nb, b.ndim - nb
    if ra == 0 or rb == 0:
        raise ValueError("matmul needs arrays")
    if ra == 1:
        a = a.reshape(_bshape(a, nb) + (1,) + _spatial(a, nb))
    if rb == 1:
        b = b.reshape(_bshape(b, nb) + _spatial(b, nb) + (1,))
    sa, sb = _spatial(a, nb), _spatial(b, nb)
    stack = max(len(sa), len(sb)) - 2  # NumPy's stacked matmul axes, within one point
    a = a.reshape(_bshape(a, nb) + (1,) * (stack + 2 - len(sa)) + sa)
    b = b.reshape(_bshape(b, nb) + (1,) * (stack + 2 - len(sb)) + sb)
    r = np.matmul(a, b)
    if ra == 1:
        r = r[..., 0, :]
    if rb == 1:
        r = r[..., 0]
    return r


# ----------------------------------------------------------------------------- shape ops
@_kernel("reshape")
def _reshape(ctx, attrs, args):
    x = args[0]
    return x.reshape(_bshape(x, ctx.nb) + tuple(attrs["shape"]))


@_kernel("transpose")
def _transpose(ctx, attrs, args):
    nb = ctx.nb
    return np.transpose(args[0], tuple(range(nb)) + tuple(nb + p for p in attrs["perm"]))


@_kernel("broadcast_to")
def _broadcast_to(ctx, attrs, args):
    nb = ctx.nb
    shape = tuple(attrs["shape"])
    x = _to_rank(args[0], nb, len(shape))
    return np.broadcast_to(x, _bshape(x, nb) + shape)


@_kernel("expand_dims")
def _expand_dims(ctx, attrs, args):
    x = args[0]
    axis = attrs["axis"]
    rank = x.ndim - ctx.nb + 1
    if not -rank <= axis < rank:
        raise ValueError(f"expand_dims: axis {axis} is out of range for rank {rank}")
    return np.expand_dims(x, axis % rank + ctx.nb)


@_kernel("squeeze")
def _squeeze(ctx, attrs, args):
    x = args[0]
    return np.squeeze(x, _axes(tuple(attrs["axes"]), x, ctx.nb))


@_kernel("concat")
def _concat(ctx, attrs, args):
    nb = ctx.nb
    batch = np.broadcast_shapes(*(_bshape(a, nb) for a in args))
    parts = [np.broadcast_to(a, batch + _spatial(a, nb)) for a in args]
    return np.concatenate(parts, axis=_axis(attrs["axis"], args[0], nb))


# ----------------------------------------------------------------------------- index expressions
def _ix(e, point: dict):
    """An index expression's value (an int, or a plan's ``Ix``): an int, or an int64 array
    over the batch."""
    if isinstance(e, (bool, np.bool_)):
        raise ValueError(f"not an index expression: {e!r}")
    if isinstance(e, (int, np.integer)):
        return int(e)
    if isinstance(e, Ix):
        params = tuple(sorted(px.names(e.expr)))
        return _plan_ix(e.expr, params)(*(_dim(point, d) for d in params))
    raise ValueError(f"not an index expression: {e!r}")


@functools.lru_cache(maxsize=4096)
def _plan_ix(e, params: tuple[str, ...]):
    return px.compile_expr(e, params, vector=True)


def _dim(point: dict, name: str):
    try:
        return point[name]
    except KeyError:
        raise ValueError(f"index expression over dim {name}, which the point lacks") from None


def _batched_ix(v, nb: int, rank: int):
    """An index value with ``rank`` size-1 axes after its batch axes (ints stay ints)."""
    if isinstance(v, np.ndarray):
        return v.reshape(v.shape[:nb] + (1,) * rank)
    return v


# ----------------------------------------------------------------------------- indexing
def _check_indices(idx: np.ndarray, n: int, what: str):
    """Integer indices must lie in [-n, n), as NumPy requires (negative ones count back)."""
    bad = (idx < -n) | (idx >= n)
    if np.any(bad):
        first = np.asarray(idx)[bad].flat[0]
        raise IndexError(f"{what}: index {first} is out of range for an axis of length {n}")


def _first(v, bad):
    return np.broadcast_to(v, np.shape(bad))[bad].flat[0] if np.ndim(bad) else v


def _fancy(nb: int, items: list, sx: tuple, tbatch: tuple):
    """Advanced-index arrays that select ``x[items]`` at every batch point at once from an
    array of shape ``tbatch + sx``, with the result laid out ``batch + out``, and ``out``
    (the per-point result shape, by NumPy's rules: a tensor index and the int indices
    together are advanced indices; their axes go where the first one is when they are
    adjacent, else first).

    ``items`` are resolved: ``("int", v)`` (v in [0, n)), ``("slice", start, length)``,
    ``("full",)``, ``("gather", g)`` (g in [0, n), shape batch + index shape).
    """
    items = list(items) + [("full",)] * (len(sx) - len(items))
    basic = [k for k, it in enumerate(items) if it[0] in ("slice", "full")]
    gathers = [k for k, it in enumerate(items) if it[0] == "gather"]
    sg: tuple = ()
    group = len(basic)
    if gathers:
        sg = _spatial(items[gathers[0]][1], nb)
        adv = [k for k, it in enumerate(items) if it[0] in ("int", "gather")]
        adjacent = adv[-1] - adv[0] == len(adv) - 1
        group = sum(1 for k in basic if k < adv[0]) if adjacent else 0
    rank = len(basic) + len(sg)
    pos = {k: j if j < group else j + len(sg) for j, k in enumerate(basic)}

    def place(vec: np.ndarray, p: int) -> np.ndarray:
        return vec.reshape((1,) * (nb + p) + (len(vec),) + (1,) * (rank - p - 1))

    arrays = [place(np.arange(n), j - nb) for j, n in enumerate(tbatch)]
    out = [0] * rank
    for k, it in enumerate(items):
        if it[0] == "int":
            arrays.append(_batched_ix(it[1], nb, rank))
        elif it[0] == "slice":
            _, start, length = it
            arrays.append(_batched_ix(start, nb, rank) + place(np.arange(length), pos[k]))
            out[pos[k]] = length
        elif it[0] == "full":
            arrays.append(place(np.arange(sx[k]), pos[k]))
            out[pos[k]] = sx[k]
        else:
            g = it[1]
            after = rank - group - len(sg)
            arrays.append(g.reshape(_bshape(g, nb) + (1,) * group + sg + (1,) * after))
            out[group : group + len(sg)] = sg
    return tuple(arrays), tuple(out)


def _basic(items: list, nb: int):
    """A basic index tuple (batch axes kept) when no item depends on the batch point."""
    out = [slice(None)] * nb
    for it in items:
        if it[0] == "gather" or any(isinstance(v, np.ndarray) for v in it[1:2]):
            return None
        if it[0] == "int":
            out.append(it[1])
        elif it[0] == "slice":
            out.append(slice(it[1], it[1] + it[2]))
        else:
            out.append(slice(None))
    return tuple(out)


def _resolve_items(ctx, spec, shape, gathers, what: str, check_ints: bool) -> list:
    """An index's items (``int`` E, ``slice`` E length, ``full``, ``gather``) at the batch's
    points, against the axes ``shape``: ints wrapped (and, with ``check_ints``, bounds
    checked), slices bounds checked, the gather indices (``gathers[0]``) checked as
    ``what``."""
    items = []
    for k, it in enumerate(spec):
        n = shape[k]
        if it[0] == "int":
            v = _ix(it[1], ctx.point)
            if check_ints:
                bad = (v < -n) | (v >= n)
                if np.any(bad):
                    raise IndexError(
                        f"index {_first(v, bad)} is out of range for an axis of length {n}"
                    )
            items.append(("int", v % n))
        elif it[0] == "slice":
            start, length = _ix(it[1], ctx.point), it[2]
            bad = (start < 0) | (start + length > n)
            if np.any(bad):
                s = _first(start, bad)
                raise IndexError(
                    f"slice {s}:{s + length} is out of range for an axis of length {n}"
                )
            items.append(("slice", start, length))
        elif it[0] == "full":
            items.append(("full",))
        else:
            g = gathers[0]
            _check_indices(g, n, what)
            items.append(("gather", g % n if n else g))
    return items


@_kernel("index")
def _index(ctx, attrs, args):
    nb = ctx.nb
    x = args[0]
    sx = _spatial(x, nb)
    if len(attrs["items"]) > len(sx):
        raise IndexError(f"too many indices ({len(attrs['items'])}) for rank {len(sx)}")
    items = _resolve_items(ctx, attrs["items"], sx, args[1:], "gather", check_ints=True)
    basic = _basic(items, nb)
    if basic is not None:
        return x[basic]
    arrays, _ = _fancy(nb, items, sx, _bshape(x, nb))
    return x[arrays]


@_kernel("index_add")
def _index_add(ctx, attrs, args):
    """The transpose of ``index``: scatter-add (repeated gather indices accumulate)."""
    nb = ctx.nb
    g = args[0]
    shape = tuple(attrs["shape"])
    items = _resolve_items(ctx, attrs["items"], shape, args[1:], "index_add", check_ints=False)
    out = np.zeros(ctx.batch + shape, g.dtype)
    arrays, sub = _fancy(nb, items, shape, ctx.batch)
    gv = np.broadcast_to(_to_rank(g, nb, len(sub)), ctx.batch + sub)
    basic = _basic(items, nb)
    if basic is not None:
        out[basic] += gv
    elif any(it[0] == "gather" for it in items):
        np.add.at(out, arrays, gv)
    else:  # distinct positions at every point (and across points): a plain add
        out[arrays] += gv
    return out


@_kernel("take")
def _take(ctx, attrs, args):
    nb = ctx.nb
    x, idx = args
    axis = attrs.get("axis")
    if axis is None:  # over the flattened spatial axes
        x = x.reshape(_bshape(x, nb) + (-1,))
        axis = 0
    else:
        axis = _axis(axis, x, nb) - nb
    n = x.shape[nb + axis]
    _check_indices(idx, n, "take")
    items = [("full",)] * axis + [("gather", idx % n if n else idx)]
    arrays, _ = _fancy(nb, items, _spatial(x, nb), _bshape(x, nb))
    return x[arrays]


@_kernel("take_along")
def _take_along(ctx, attrs, args):
    nb = ctx.nb
    x, idx = args
    sx, si = _spatial(x, nb), _spatial(idx, nb)
    if len(si) != len(sx):
        raise ValueError("take_along needs indices of the rank of the array")
    axis = _axis(attrs["axis"], x, nb) - nb
    n = sx[axis]
    _check_indices(idx, n, "take_along")
    rank = len(sx)
    arrays = [
        np.arange(s).reshape((1,) * j + (s,) + (1,) * (nb + rank - j - 1))
        for j, s in enumerate(x.shape)
    ]
    arrays[nb + axis] = idx % n if n else idx
    return x[tuple(arrays)]


@_kernel("take_along_add")
def _take_along_add(ctx, attrs, args):
    """The transpose of ``take_along``: where x was broadcast against the indices, the
    contributions of the broadcast copies are summed."""
    nb = ctx.nb
    g, idx = args
    shape, axis = tuple(attrs["shape"]), attrs["axis"]
    si, sg = _spatial(idx, nb), _spatial(g, nb)
    full = list(
        np.broadcast_shapes(tuple(1 if k == axis else s for k, s in enumerate(shape)), si, sg)
    )
    full[axis] = shape[axis]
    gfull = np.broadcast_shapes(si, sg)
    idx, g = _align([idx, g], nb)
    rank = len(gfull)
    arrays = [
        np.arange(s).reshape((1,) * j + (s,) + (1,) * (nb + rank - j - 1))
        for j, s in enumerate(ctx.batch + gfull)
    ]
    arrays[nb + axis % rank] = idx % shape[axis]
    out = np.zeros(ctx.batch + tuple(full), g.dtype)
    np.add.at(out, tuple(arrays), np.broadcast_to(g, ctx.batch + gfull))
    extra = tuple(nb + k for k, s in enumerate(shape) if s == 1 and full[k] != 1)
    return out.sum(axis=extra, keepdims=True) if extra else out


# ----------------------------------------------------------------------------- sources
@_kernel("const")
def _const(ctx, attrs, args):
    v = np.asarray(attrs["value"], dtype=numpy_dtype(attrs["dtype"]))
    return _lift(np.broadcast_to(v, tuple(attrs["shape"])), ctx.nb)


@_kernel("arange")
def _arange(ctx, attrs, args):
    r = np.arange(attrs["start"], attrs["stop"], attrs["step"], dtype=numpy_dtype(attrs["dtype"]))
    return _lift(r, ctx.nb)


def _scalar_i32(v, nb: int) -> np.ndarray:
    if isinstance(v, np.ndarray):
        if v.size and (v.min() < -(2**31) or v.max() >= 2**31):  # as np.asarray(int, i32)
            raise OverflowError("an index value does not fit in i32")
        return v.astype(np.int32)
    return _lift(np.asarray(v, np.int32), nb)


@_kernel("dimval")
def _dimval(ctx, attrs, args):
    return _scalar_i32(_dim(ctx.point, attrs["dim"]), ctx.nb)


@_kernel("index_value")
def _index_value(ctx, attrs, args):
    return _scalar_i32(_ix(attrs["expr"], ctx.point), ctx.nb)


# ----------------------------------------------------------------------------- random draws
def _draw_points(ctx: _Ctx, attrs: dict, params=()):
    """The draw's points and bounds: a tuple of ints when no dim of ``attrs.space`` varies
    over the batch (and no parameter has batch extents), else an int64 array
    ``bshape + [ndims]`` with ``bshape`` the broadcast of the varying dims' and the
    parameters' batch shapes; then the bshape (None for a single point)."""
    space = attrs["space"]
    values = [_dim(ctx.point, d) for d, _ in space]
    bounds = tuple(b for _, b in space)
    shapes = [v.shape for v in values if isinstance(v, np.ndarray)]
    shapes += [_bshape(p, ctx.nb) for p in params if any(s != 1 for s in _bshape(p, ctx.nb))]
    if not shapes:
        return tuple(values), bounds, None
    bshape = np.broadcast_shapes(*shapes)
    pts = np.empty(bshape + (len(values),), np.int64)
    for k, v in enumerate(values):
        pts[..., k] = v
    return pts, bounds, bshape


def _draw(ctx: _Ctx, result: np.ndarray, bshape) -> np.ndarray:
    return _lift(result, ctx.nb) if bshape is None else result


def _random(fn):
    def kernel(ctx, attrs, args):
        pts, bounds, bshape = _draw_points(ctx, attrs)
        shape, dt = tuple(attrs["shape"]), numpy_dtype(attrs["dtype"])
        return _draw(ctx, fn(attrs["seed"], attrs["site"], pts, bounds, shape, dt), bshape)

    return kernel


_kernel("random_uniform")(_random(rng.uniform))
_kernel("random_normal")(_random(rng.normal))
_kernel("random_gumbel")(_random(rng.gumbel))


def _param_draw(fn):
    """Categorical and bernoulli: the parameter's batch axes must be the points' batch."""

    def kernel(ctx, attrs, args):
        (param,) = args
        pts, bounds, bshape = _draw_points(ctx, attrs, [param])
        if bshape is None:
            param = param.reshape(_spatial(param, ctx.nb))
        else:
            param = np.broadcast_to(param, bshape + _spatial(param, ctx.nb))
        return _draw(ctx, fn(attrs["seed"], attrs["site"], pts, bounds, param), bshape)

    return kernel


_kernel("random_categorical")(_param_draw(rng.categorical))
_kernel("random_bernoulli")(_param_draw(rng.bernoulli))


@_kernel("random_permutation")
def _random_permutation(ctx, attrs, args):
    pts, bounds, bshape = _draw_points(ctx, attrs)
    return _draw(
        ctx, rng.permutation(attrs["seed"], attrs["site"], pts, bounds, attrs["n"]), bshape
    )


def _orthogonal(seed, site, pts, bounds, shape, gain, dt):
    """``rng.orthogonal`` over a batch of points: one stacked QR (the same LAPACK calls)."""
    if not isinstance(pts, np.ndarray):
        return rng.orthogonal(seed, site, pts, bounds, shape, gain, dt)
    if len(shape) < 2:
        raise ValueError("orthogonal needs a shape with at least 2 dims")
    rows, cols = shape[0], math.prod(shape[1:])
    a = rng.normal(seed, site, pts, bounds, (rows, cols), np.float64)
    if rows < cols:
        a = np.swapaxes(a, -1, -2)
    q, r = np.linalg.qr(a)
    d = np.sign(np.diagonal(r, axis1=-2, axis2=-1))
    q = q * np.where(d == 0, 1.0, d)[..., None, :]
    if rows < cols:
        q = np.swapaxes(q, -1, -2)
    return (q * gain).reshape(pts.shape[:-1] + tuple(shape)).astype(dt)


@_kernel("random_init")
def _random_init(ctx, attrs, args):
    pts, bounds, bshape = _draw_points(ctx, attrs)
    shape, dt = tuple(attrs["shape"]), numpy_dtype(attrs["dtype"])
    seed, site, kind = attrs["seed"], attrs["site"], attrs["kind"]
    if kind == "glorot":
        r = rng.glorot_uniform(seed, site, pts, bounds, shape, dt)
    elif kind == "orthogonal":
        r = _orthogonal(seed, site, pts, bounds, shape, attrs["gain"], dt)
    elif kind == "normal":
        r = rng.normal_init(seed, site, pts, bounds, shape, attrs["std"], 0.0, dt)
    elif kind == "uniform":
        r = rng.uniform_init(seed, site, pts, bounds, shape, attrs["lo"], attrs["hi"], dt)
    else:
        raise ValueError(f"unknown initializer {kind}")
    return _draw(ctx, r, bshape)


# ----------------------------------------------------------------------------- signatures
# Per op: its number of inputs (None: any) and its attributes, name -> kind, a kind ending
# in "?" for one that may be absent. Kinds (``runtime.plan`` checks them): dtype, shape,
# int, ints (a tuple), axes (null, an int or ints), bool, float, const (a number, a bool or
# nested tuples of them), dim (a dim of the node), ix (an index expression), items (an
# index's items), space (pairs of a dim of the node and its bound), init (an initializer).
_UNARY_SIGNATURE = (1, {})
_BINARY_SIGNATURE = (2, {})
_REDUCTION_SIGNATURE = (1, {"axes": "axes?", "keepdims": "bool?"})
_DRAW = {"seed": "int", "site": "int", "space": "space"}
SIGNATURES: dict[str, tuple[int | None, dict[str, str]]] = {
    **{name: _UNARY_SIGNATURE for name in _UNARY},
    **{name: _BINARY_SIGNATURE for name in _BINARY},
    "where": (3, {}),
    "cast": (1, {"dtype": "dtype"}),
    **{name: _REDUCTION_SIGNATURE for name in ("sum", "prod", "max", "min", "mean", "logsumexp")},
    "argmax": (1, {"axis": "int?"}),
    "argmin": (1, {"axis": "int?"}),
    "discounted_sum": (2, {"reverse": "bool?"}),
    "cumsum": (1, {"axis": "int?"}),
    "matmul": (2, {}),
    "reshape": (1, {"shape": "shape"}),
    "transpose": (1, {"perm": "ints"}),
    "broadcast_to": (1, {"shape": "shape"}),
    "expand_dims": (1, {"axis": "int"}),
    "squeeze": (1, {"axes": "ints"}),
    "concat": (None, {"axis": "int"}),
    "index": (None, {"items": "items"}),
    "index_add": (None, {"items": "items", "shape": "shape"}),
    "take": (2, {"axis": "int?"}),
    "take_along": (2, {"axis": "int"}),
    "take_along_add": (2, {"axis": "int", "shape": "shape"}),
    "const": (0, {"value": "const", "dtype": "dtype", "shape": "shape"}),
    "arange": (0, {"start": "int", "stop": "int", "step": "int", "dtype": "dtype"}),
    "dimval": (0, {"dim": "dim"}),
    "index_value": (0, {"expr": "ix"}),
    "random_uniform": (0, {**_DRAW, "shape": "shape", "dtype": "dtype"}),
    "random_normal": (0, {**_DRAW, "shape": "shape", "dtype": "dtype"}),
    "random_gumbel": (0, {**_DRAW, "shape": "shape", "dtype": "dtype"}),
    "random_categorical": (1, _DRAW),
    "random_bernoulli": (1, _DRAW),
    "random_permutation": (0, {**_DRAW, "n": "int"}),
    "random_init": (
        0,
        {
            **_DRAW,
            "shape": "shape",
            "dtype": "dtype",
            "kind": "init",
            "gain": "float?",
            "std": "float?",
            "lo": "float?",
            "hi": "float?",
        },
    ),
}

# ----------------------------------------------------------------------------- fallback
# Ops evaluated by a loop over the batch points, each with the reason it cannot be
# vectorized. None: every kernel above is vectorized over the batch (the orthogonal
# initializer too, by NumPy's stacked QR).
PER_POINT: frozenset[str] = frozenset()

SUPPORTED: frozenset[str] = frozenset(_KERNELS)
