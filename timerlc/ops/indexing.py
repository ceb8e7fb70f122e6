"""Indexing: ``index`` (ints, constant-length slices and one tensor index, NumPy's rules)
and its transpose ``index_add``; ``take`` and ``take_along`` and the transpose of the
latter. Index expressions in attributes are evaluated at the batch's points
(``kernel.index_at``); every index is bounds checked as NumPy would (negative ones count
back), so a failure is an ``IndexError`` naming the index."""

from __future__ import annotations

import numpy as np

from timerlc.ops.core import TypeRuleError, broadcast_shapes, define, static
from timerlc.ops.kernel import align, batch_axis, batched_ix, bshape, index_at, spatial, to_rank

_ITEMS = {"items": "items"}


# ----------------------------------------------------------------------------- kernels
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
        sg = spatial(items[gathers[0]][1], nb)
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
            arrays.append(batched_ix(it[1], nb, rank))
        elif it[0] == "slice":
            _, start, length = it
            arrays.append(batched_ix(start, nb, rank) + place(np.arange(length), pos[k]))
            out[pos[k]] = length
        elif it[0] == "full":
            arrays.append(place(np.arange(sx[k]), pos[k]))
            out[pos[k]] = sx[k]
        else:
            g = it[1]
            after = rank - group - len(sg)
            arrays.append(g.reshape(bshape(g, nb) + (1,) * group + sg + (1,) * after))
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
            v = index_at(it[1], ctx.point)
            if check_ints:
                bad = (v < -n) | (v >= n)
                if np.any(bad):
                    raise IndexError(
                        f"index {_first(v, bad)} is out of range for an axis of length {n}"
                    )
            items.append(("int", v % n))
        elif it[0] == "slice":
            start, length = index_at(it[1], ctx.point), it[2]
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


def _index_kernel(ctx, attrs, args):
    nb = ctx.nb
    x = args[0]
    sx = spatial(x, nb)
    if len(attrs["items"]) > len(sx):
        raise IndexError(f"too many indices ({len(attrs['items'])}) for rank {len(sx)}")
    items = _resolve_items(ctx, attrs["items"], sx, args[1:], "gather", check_ints=True)
    basic = _basic(items, nb)
    if basic is not None:
        return x[basic]
    arrays, _ = _fancy(nb, items, sx, bshape(x, nb))
    return x[arrays]


def _index_add_kernel(ctx, attrs, args):
    """The transpose of ``index``: scatter-add (repeated gather indices accumulate)."""
    nb = ctx.nb
    g = args[0]
    shape = tuple(attrs["shape"])
    items = _resolve_items(ctx, attrs["items"], shape, args[1:], "index_add", check_ints=False)
    out = np.zeros(ctx.batch + shape, g.dtype)
    arrays, sub = _fancy(nb, items, shape, ctx.batch)
    gv = np.broadcast_to(to_rank(g, nb, len(sub)), ctx.batch + sub)
    basic = _basic(items, nb)
    if basic is not None:
        out[basic] += gv
    elif any(it[0] == "gather" for it in items):
        np.add.at(out, arrays, gv)
    else:  # distinct positions at every point (and across points): a plain add
        out[arrays] += gv
    return out


def _take_kernel(ctx, attrs, args):
    nb = ctx.nb
    x, idx = args
    axis = attrs.get("axis")
    if axis is None:  # over the flattened spatial axes
        x = x.reshape(bshape(x, nb) + (-1,))
        axis = 0
    else:
        axis = batch_axis(axis, x, nb) - nb
    n = x.shape[nb + axis]
    _check_indices(idx, n, "take")
    items = [("full",)] * axis + [("gather", idx % n if n else idx)]
    arrays, _ = _fancy(nb, items, spatial(x, nb), bshape(x, nb))
    return x[arrays]


def _take_along_kernel(ctx, attrs, args):
    nb = ctx.nb
    x, idx = args
    sx, si = spatial(x, nb), spatial(idx, nb)
    if len(si) != len(sx):
        raise ValueError("take_along needs indices of the rank of the array")
    axis = batch_axis(attrs["axis"], x, nb) - nb
    n = sx[axis]
    _check_indices(idx, n, "take_along")
    rank = len(sx)
    arrays = [
        np.arange(s).reshape((1,) * j + (s,) + (1,) * (nb + rank - j - 1))
        for j, s in enumerate(x.shape)
    ]
    arrays[nb + axis] = idx % n if n else idx
    return x[tuple(arrays)]


def _take_along_add_kernel(ctx, attrs, args):
    """The transpose of ``take_along``: where x was broadcast against the indices, the
    contributions of the broadcast copies are summed."""
    nb = ctx.nb
    g, idx = args
    shape, axis = tuple(attrs["shape"]), attrs["axis"]
    si, sg = spatial(idx, nb), spatial(g, nb)
    full = list(
        np.broadcast_shapes(tuple(1 if k == axis else s for k, s in enumerate(shape)), si, sg)
    )
    full[axis] = shape[axis]
    gfull = np.broadcast_shapes(si, sg)
    idx, g = align([idx, g], nb)
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


# ----------------------------------------------------------------------------- the ops
def _index_infer(attrs, ts):
    x = ts[0]
    static(x, "indexing")
    items = attrs["items"]
    if len(items) > x.rank:
        raise TypeRuleError(f"too many indices ({len(items)}) for {x}")
    gathers = [k for k, it in enumerate(items) if it[0] == "gather"]
    if len(gathers) != len(ts) - 1 or len(gathers) > 1:
        raise TypeRuleError("at most one tensor index is allowed")
    for k, it in enumerate(items):
        empty = x.shape[k] == 0 and (it[0] == "int" or it[0] == "gather" and 0 not in ts[1].shape)
        if empty:  # (no index is in range)
            raise TypeRuleError(f"an index into axis {k} of {x}, which is empty")
        if it[0] == "slice" and not 0 <= it[2] <= x.shape[k]:
            raise TypeRuleError(f"slice of length {it[2]} does not fit axis {k} of {x}")
        if it[0] == "gather":
            idx = ts[1]
            if idx.dtype not in ("i32", "i64"):
                raise TypeRuleError(f"a tensor index must be an integer, got {idx}")
            static(idx, "a tensor index")
    shape = index_shape(x.shape, items, ts[1].shape if gathers else None)
    return x.with_shape(tuple(int(s) for s in shape))


def index_shape(shape: tuple, items, gathered: tuple | None) -> tuple:
    """The shape of NumPy's ``x[items]`` for ``x`` of ``shape``: an item ``("int", i)``
    drops its axis, ``("slice", start, n)`` keeps ``n`` of it, ``("full",)`` all of it,
    ``("gather",)`` an index of shape ``gathered``. With a gather the ints are advanced
    indices too (NumPy's rule): the gather's shape stands where they and it are, when they
    are next to each other, else first. Worked out from the extents, not by indexing an
    array of ``shape`` (whose extents NumPy refuses past 2^63 before timerlc's limits can
    say so: ``check_limits``)."""
    rest = list(shape[len(items) :])
    kept = [
        shape[k] if it[0] == "full" else it[2] if it[0] == "slice" else None
        for k, it in enumerate(items)
    ]
    advanced = [k for k, it in enumerate(items) if it[0] in ("int", "gather")]
    basic = [n for k, n in enumerate(kept) if k not in advanced]
    if gathered is None:
        return tuple(basic + rest)
    if advanced == list(range(advanced[0], advanced[-1] + 1)):  # next to each other
        return tuple(kept[: advanced[0]] + list(gathered) + kept[advanced[-1] + 1 :] + rest)
    return tuple(list(gathered) + basic + rest)


def _index_vjp(em, node, k, g):
    args = [g] + ([em.fwd(1)] if len(node.inputs) > 1 else [])
    return em.op("index_add", *args, items=node.attr("items"), shape=em.in_type(0).shape)


define(
    "index",
    "index",
    None,
    _index_infer,
    _index_kernel,
    vjp=_index_vjp,
    grad_inputs=(0,),
    attrs=_ITEMS,
    doc="attrs: items, each ('int', e) | ('slice', start, length) | ('full',) | ('gather',)",
)
define(
    "index_add",
    "index",
    None,
    lambda attrs, ts: ts[0].with_shape(tuple(attrs["shape"])),
    _index_add_kernel,
    attrs={**_ITEMS, "shape": "shape"},
    doc="zeros(attrs.shape) with the input added at attrs.items",
)


def _take_infer(attrs, ts):
    x, idx = ts
    static(x, "take")
    if idx.dtype not in ("i32", "i64"):
        raise TypeRuleError(f"take needs integer indices, got {idx}")
    axis = attrs.get("axis")
    if axis is None:
        return x.with_shape(idx.shape)
    return x.with_shape(x.shape[:axis] + idx.shape + x.shape[axis + 1 :])


def _take_vjp(em, node, k, g):
    shape = em.in_type(0).shape
    axis = node.attr("axis")
    if axis is None:
        n = 1
        for s in shape:
            n *= s
        flat = em.op("index_add", g, em.fwd(1), items=(("gather",),), shape=(n,))
        return em.op("reshape", flat, shape=shape)
    items = (("full",),) * axis + (("gather",),)
    return em.op("index_add", g, em.fwd(1), items=items, shape=shape)


define(
    "take",
    "index",
    2,
    _take_infer,
    _take_kernel,
    vjp=_take_vjp,
    grad_inputs=(0,),
    attrs={"axis": "int?"},
    doc="np.take; attrs: axis (None: flattened)",
)


def _take_along_infer(attrs, ts):
    x, idx = ts
    static(x, "take_along")
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


def _take_along_vjp(em, node, k, g):
    return em.op("take_along_add", g, em.fwd(1), axis=node.attr("axis"), shape=em.in_type(0).shape)


define(
    "take_along",
    "index",
    2,
    _take_along_infer,
    _take_along_kernel,
    vjp=_take_along_vjp,
    grad_inputs=(0,),
    attrs={"axis": "int"},
    doc="np.take_along_axis; attrs: axis",
)
define(
    "take_along_add",
    "index",
    2,
    lambda attrs, ts: ts[0].with_shape(tuple(attrs["shape"])),
    _take_along_add_kernel,
    attrs={"axis": "int", "shape": "shape"},
    doc="zeros(attrs.shape) + g put along attrs.axis at idx (adding)",
)
