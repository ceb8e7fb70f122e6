"""Linear algebra and shape ops: matmul (NumPy's, batched over leading axes), reshape,
transpose, broadcast_to, expand_dims, squeeze, concat. The shape ops but concat are cheap
(views of their input)."""

from __future__ import annotations

import numpy as np

from timerlc.ops.core import TypeRuleError, broadcast_shapes, define, no_bool, same_dtype, static
from timerlc.ops.grads import like, unbroadcast
from timerlc.ops.kernel import batch_axes, batch_axis, bshape, spatial, to_rank
from timerlc.types import TensorType, format_shape


# ----------------------------------------------------------------------------- matmul
def _matmul_infer(attrs, ts):
    a, b = ts
    same_dtype(ts, "@")
    no_bool(a)
    static(a, "@")
    static(b, "@")
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


def _matmul(ctx, attrs, args):
    nb = ctx.nb
    a, b = args
    ra, rb = a.ndim - nb, b.ndim - nb
    if ra == 0 or rb == 0:
        raise ValueError("matmul needs arrays")
    if ra == 1:
        a = a.reshape(bshape(a, nb) + (1,) + spatial(a, nb))
    if rb == 1:
        b = b.reshape(bshape(b, nb) + spatial(b, nb) + (1,))
    sa, sb = spatial(a, nb), spatial(b, nb)
    stack = max(len(sa), len(sb)) - 2  # NumPy's stacked matmul axes, within one point
    a = a.reshape(bshape(a, nb) + (1,) * (stack + 2 - len(sa)) + sa)
    b = b.reshape(bshape(b, nb) + (1,) * (stack + 2 - len(sb)) + sb)
    r = np.matmul(a, b)
    if ra == 1:
        r = r[..., 0, :]
    if rb == 1:
        r = r[..., 0]
    return r


def _swap(em, x: int) -> int:
    r = len(em.shape(x))
    return em.op("transpose", x, perm=tuple(range(r - 2)) + (r - 1, r - 2))


def _matmul_vjp(em, node, k, g):
    a_t, b_t = em.in_type(0), em.in_type(1)
    a, b = em.fwd(0), em.fwd(1)
    if a_t.rank == 1 and b_t.rank == 1:  # a dot product: g is a scalar
        return em.op("mul", g, b if k == 0 else a)
    if a_t.rank == 1:
        a = em.op("expand_dims", a, axis=0)
        g = em.op("expand_dims", g, axis=len(em.shape(g)) - 1)
    if b_t.rank == 1:
        b = em.op("expand_dims", b, axis=1)
        g = em.op("expand_dims", g, axis=len(em.shape(g)))
    if k == 0:
        d = em.op("matmul", g, _swap(em, b))
        d = unbroadcast(em, d, em.shape(a))
        return em.op("reshape", d, shape=a_t.shape) if a_t.rank == 1 else d
    d = em.op("matmul", _swap(em, a), g)
    d = unbroadcast(em, d, em.shape(b))
    return em.op("reshape", d, shape=b_t.shape) if b_t.rank == 1 else d


define(
    "matmul",
    "other",
    2,
    _matmul_infer,
    _matmul,
    vjp=_matmul_vjp,
    doc="NumPy matmul: batched over leading axes",
)


# ----------------------------------------------------------------------------- reshape
def _reshape_infer(attrs, ts):
    (t,) = ts
    static(t, "reshape")
    shape = tuple(attrs["shape"])
    if int(np.prod(shape)) != int(np.prod(t.shape)):
        raise TypeRuleError(f"cannot reshape {t} into {format_shape(shape)}")
    return t.with_shape(shape)


def _reshape(ctx, attrs, args):
    x = args[0]
    return x.reshape(bshape(x, ctx.nb) + tuple(attrs["shape"]))


def _to_input_shape(em, node, k, g):
    return em.op("reshape", g, shape=em.in_type(0).shape)


define(
    "reshape",
    "shape",
    1,
    _reshape_infer,
    _reshape,
    vjp=_to_input_shape,
    attrs={"shape": "shape"},
    cheap=True,
    doc="attrs: shape (resolved, no -1)",
)


# ----------------------------------------------------------------------------- transpose
def _transpose_infer(attrs, ts):
    (t,) = ts
    static(t, "transpose")
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(t.rank)):
        raise TypeRuleError(f"transpose permutation {list(perm)} does not fit {t}")
    return t.with_shape(tuple(t.shape[p] for p in perm))


def _transpose(ctx, attrs, args):
    nb = ctx.nb
    return np.transpose(args[0], tuple(range(nb)) + tuple(nb + p for p in attrs["perm"]))


def _transpose_vjp(em, node, k, g):
    perm = node.attr("perm")
    inverse = tuple(sorted(range(len(perm)), key=lambda j: perm[j]))
    return em.op("transpose", g, perm=inverse)


define(
    "transpose",
    "shape",
    1,
    _transpose_infer,
    _transpose,
    vjp=_transpose_vjp,
    attrs={"perm": "ints"},
    cheap=True,
    doc="attrs: perm",
)


# ----------------------------------------------------------------------------- broadcast_to
def _broadcast_infer(attrs, ts):
    (t,) = ts
    static(t, "broadcast")
    shape = tuple(attrs["shape"])
    if len(shape) < t.rank or broadcast_shapes(t.shape, shape) != shape:
        raise TypeRuleError(f"cannot broadcast {t} to {format_shape(shape)}")
    return t.with_shape(shape)


def _broadcast_to(ctx, attrs, args):
    nb = ctx.nb
    shape = tuple(attrs["shape"])
    x = to_rank(args[0], nb, len(shape))
    return np.broadcast_to(x, bshape(x, nb) + shape)


define(
    "broadcast_to",
    "shape",
    1,
    _broadcast_infer,
    _broadcast_to,
    vjp=lambda em, node, k, g: like(em, g, 0),
    attrs={"shape": "shape"},
    cheap=True,
    doc="attrs: shape",
)


# ----------------------------------------------------------------------------- expand, squeeze
def _expand_infer(attrs, ts):
    (t,) = ts
    static(t, "expand")
    axis = attrs["axis"]
    if not 0 <= axis <= t.rank:
        raise TypeRuleError(f"expand: axis {axis} is out of range for {t}")
    return t.with_shape(t.shape[:axis] + (1,) + t.shape[axis:])


def _expand_dims(ctx, attrs, args):
    x = args[0]
    axis = attrs["axis"]
    rank = x.ndim - ctx.nb + 1
    if not -rank <= axis < rank:
        raise ValueError(f"expand_dims: axis {axis} is out of range for rank {rank}")
    return np.expand_dims(x, axis % rank + ctx.nb)


define(
    "expand_dims",
    "shape",
    1,
    _expand_infer,
    _expand_dims,
    vjp=lambda em, node, k, g: em.op("squeeze", g, axes=(node.attr("axis"),)),
    attrs={"axis": "int"},
    cheap=True,
    doc="attrs: axis (normalized)",
)


def _squeeze_infer(attrs, ts):
    (t,) = ts
    static(t, "squeeze")
    axes = tuple(attrs["axes"])
    for a in axes:
        if t.shape[a] != 1:
            raise TypeRuleError(f"squeeze: axis {a} of {t} has length {t.shape[a]}, not 1")
    return t.with_shape(tuple(s for k, s in enumerate(t.shape) if k not in axes))


def _squeeze(ctx, attrs, args):
    x = args[0]
    return np.squeeze(x, batch_axes(tuple(attrs["axes"]), x, ctx.nb))


define(
    "squeeze",
    "shape",
    1,
    _squeeze_infer,
    _squeeze,
    vjp=_to_input_shape,
    attrs={"axes": "ints"},
    cheap=True,
    doc="attrs: axes (normalized)",
)


# ----------------------------------------------------------------------------- concat
def _concat_infer(attrs, ts):
    if not ts:
        raise TypeRuleError("concat needs at least one array")
    dtype = same_dtype(ts, "concat")
    axis = attrs["axis"]
    first = ts[0]
    for t in ts:
        static(t, "concat")
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


def _concat(ctx, attrs, args):
    nb = ctx.nb
    batch = np.broadcast_shapes(*(bshape(a, nb) for a in args))
    parts = [np.broadcast_to(a, batch + spatial(a, nb)) for a in args]
    return np.concatenate(parts, axis=batch_axis(attrs["axis"], args[0], nb))


def _concat_vjp(em, node, k, g):
    from sympy import Integer  # the PDG's index attributes are sympy values

    axis = node.attr("axis")
    start = sum(em.in_type(j).shape[axis] for j in range(k))
    n = em.in_type(k).shape[axis]
    items = (("full",),) * axis + (("slice", Integer(start), n),)
    return em.op("index", g, items=items)


define(
    "concat",
    "shape",
    None,
    _concat_infer,
    _concat,
    vjp=_concat_vjp,
    attrs={"axis": "int"},
    doc="attrs: axis (normalized)",
)
