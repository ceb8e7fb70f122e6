"""Reductions: sum, prod, max, min, mean, logsumexp over axes; argmax/argmin;
discounted_sum along axis 0; cumsum."""

from __future__ import annotations

import math
import warnings

import numpy as np

from timerlc.diagnostics import ProgramError
from timerlc.ops.core import (
    NO_GRAD,
    TypeRuleError,
    axis_of,
    define,
    need,
    no_bool,
    normalize_axes,
    same_dtype,
    static,
)
from timerlc.ops.grads import Window, dynamic, expand_reduced
from timerlc.ops.kernel import batch_axes, batch_axis, bshape, spatial
from timerlc.types import TensorType, format_shape, is_float

_REDUCTION_ATTRS = {"axes": "axes?", "keepdims": "bool?"}


# ----------------------------------------------------------------------------- type rules
def _reduce(dtype_check=None):
    def infer(attrs, ts):
        (t,) = ts
        if dtype_check is not None:
            dtype_check(t)
        axes = normalize_axes(attrs.get("axes"), t.rank, "reduction")
        for k, s in enumerate(t.shape):
            if k not in axes and not isinstance(s, int):
                raise TypeRuleError(
                    f"a reduction must reduce the dynamic axis {k} of its argument "
                    f"{format_shape(t.shape)}"
                )
        if attrs.get("keepdims"):
            shape = tuple(1 if k in axes else s for k, s in enumerate(t.shape))
        else:
            shape = tuple(s for k, s in enumerate(t.shape) if k not in axes)
        return TensorType(t.dtype, shape)

    return infer


def _floats(what):
    return lambda t: need(is_float, t, what, "floats")


# ----------------------------------------------------------------------------- kernels
def _reduction(fn, empty_error: str | None = None, quiet: bool = False):
    def kernel(ctx, attrs, args):
        x = args[0]
        axes = batch_axes(attrs.get("axes"), x, ctx.nb)
        if empty_error and any(x.shape[a] == 0 for a in axes):
            raise ValueError(f"{empty_error} of an empty slice")
        keep = bool(attrs.get("keepdims"))
        if quiet:  # the mean of an empty slice is nan, as at one point
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                return fn(x, axis=axes, keepdims=keep)
        return fn(x, axis=axes, keepdims=keep)

    return kernel


def _logsumexp(ctx, attrs, args):
    x = args[0]
    axes = batch_axes(attrs.get("axes"), x, ctx.nb)
    keep = bool(attrs.get("keepdims"))
    if math.prod(spatial(x, ctx.nb)) == 0:
        shape = tuple(1 if k in axes else s for k, s in enumerate(x.shape))
        r = np.full(shape, -np.inf, x.dtype)
        return r if keep else np.squeeze(r, axes)
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    r = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return r if keep else np.squeeze(r, axes)


# ----------------------------------------------------------------------------- gradients
def _sum(em, node, k, g):
    shape = em.in_type(k).shape
    if dynamic(em, k):
        # the weight each element of the window gets: g with the other reduced axes back
        w = em.op("squeeze", expand_reduced(em, node, g), axes=(0,))
        w = em.op("broadcast_to", w, shape=shape[1:])
        if node.op == "mean":
            others = 1
            for a in node.attr("axes"):
                others *= shape[a] if a else 1
            n = em.op("cast", em.window_length(), dtype=node.type.dtype)
            if others != 1:
                n = em.op("mul", n, em.const(float(others), node.type.dtype))
            w = em.op("div", w, n)
        return Window(w, "sum")
    ge = em.op("broadcast_to", expand_reduced(em, node, g), shape=shape)
    if node.op == "mean":
        n = 1
        for a in node.attr("axes"):
            n *= shape[a]
        ge = em.op("div", ge, em.const(float(n), node.type.dtype))
    return ge


def _prod(em, node, k, g):
    """The product of the other elements, also where some are zero."""
    shape = em.in_type(k).shape
    dt = node.type.dtype
    axes = node.attr("axes")
    x = em.fwd(0)
    zero, one = em.const(0.0, dt), em.const(1.0, dt)
    is0 = em.op("eq", x, zero)
    zeros = em.op("sum", em.op("cast", is0, dtype=dt), axes=axes, keepdims=True)
    nonzero = em.op("prod", em.op("where", is0, one, x), axes=axes, keepdims=True)
    nonzero = em.op("broadcast_to", nonzero, shape=shape)
    zeros = em.op("broadcast_to", zeros, shape=shape)
    # no zero: prod / x; one zero: the others' product at it, 0 elsewhere; more: 0
    d = em.op(
        "where",
        em.op("eq", zeros, zero),
        em.op("div", nonzero, em.op("where", is0, one, x)),
        em.op("where", em.op("logical_and", is0, em.op("eq", zeros, one)), nonzero, zero),
    )
    ge = em.op("broadcast_to", expand_reduced(em, node, g), shape=shape)
    return em.op("mul", ge, d)


def _max(em, node, k, g):
    if dynamic(em, k):
        raise ProgramError(
            f"the gradient of {node.op} over a dynamic slice is not supported yet", node.span
        )
    shape = em.in_type(k).shape
    dt = node.type.dtype
    hit = em.op("cast", em.op("eq", em.fwd(0), expand_reduced(em, node, em.out())), dtype=dt)
    count = em.op("sum", hit, axes=node.attr("axes"), keepdims=True)
    ge = em.op("broadcast_to", expand_reduced(em, node, g), shape=shape)
    return em.op("div", em.op("mul", ge, hit), count)


def _logsumexp_vjp(em, node, k, g):
    if dynamic(em, k):
        raise ProgramError(
            "the gradient of logsumexp over a dynamic slice is not supported yet", node.span
        )
    shape = em.in_type(k).shape
    p = em.op("exp", em.op("sub", em.fwd(0), expand_reduced(em, node, em.out())))
    return em.op("mul", em.op("broadcast_to", expand_reduced(em, node, g), shape=shape), p)


# ----------------------------------------------------------------------------- the ops
define("sum", "reduce", 1, _reduce(no_bool), _reduction(np.sum), vjp=_sum, attrs=_REDUCTION_ATTRS)
define(
    "prod", "reduce", 1, _reduce(no_bool), _reduction(np.prod), vjp=_prod, attrs=_REDUCTION_ATTRS
)
define("max", "reduce", 1, _reduce(), _reduction(np.max, "max"), vjp=_max, attrs=_REDUCTION_ATTRS)
define("min", "reduce", 1, _reduce(), _reduction(np.min, "min"), vjp=_max, attrs=_REDUCTION_ATTRS)
define(
    "mean",
    "reduce",
    1,
    _reduce(_floats("mean")),
    _reduction(np.mean, quiet=True),
    vjp=_sum,
    attrs=_REDUCTION_ATTRS,
)
define(
    "logsumexp",
    "reduce",
    1,
    _reduce(_floats("logsumexp")),
    _logsumexp,
    vjp=_logsumexp_vjp,
    attrs=_REDUCTION_ATTRS,
)


def _arg_infer(attrs, ts):
    (t,) = ts
    static(t, "argmax/argmin")
    axis = attrs.get("axis")
    if axis is None:
        return TensorType("i32", ())
    axis = axis_of(axis, t.rank, "argmax/argmin")
    return TensorType("i32", tuple(s for k, s in enumerate(t.shape) if k != axis))


def _arg_reduction(fn):
    def kernel(ctx, attrs, args):
        x = args[0]
        if math.prod(spatial(x, ctx.nb)) == 0:
            raise ValueError("argmax/argmin of an empty array")
        axis = attrs.get("axis")
        if axis is None:  # the flat index over the spatial axes
            return fn(x.reshape(bshape(x, ctx.nb) + (-1,)), axis=-1)
        return fn(x, axis=batch_axis(axis, x, ctx.nb))

    return kernel


for _name, _fn in [("argmax", np.argmax), ("argmin", np.argmin)]:
    define(
        _name,
        "reduce",
        1,
        _arg_infer,
        _arg_reduction(_fn),
        vjp=NO_GRAD,
        attrs={"axis": "int?"},
        doc="attrs: axis (None: flat index)",
    )


# ----------------------------------------------------------------------------- discounted sum
def _discounted_infer(attrs, ts):
    x, g = ts
    need(is_float, x, "discounted_sum", "floats")
    same_dtype([x, g], "discounted_sum")
    if x.rank == 0:
        raise TypeRuleError(f"discounted_sum needs an array, got {x}")
    if g.shape != ():
        raise TypeRuleError(f"discounted_sum needs a scalar discount, got {g}")
    for s in x.shape[1:]:
        if not isinstance(s, int):
            raise TypeRuleError("discounted_sum reduces only axis 0")
    return TensorType(x.dtype, x.shape[1:])


def _discounted_sum(ctx, attrs, args):
    nb = ctx.nb
    x, g = args
    if x.ndim == nb:
        raise ValueError("discounted_sum needs an array")
    if attrs.get("reverse"):
        x = np.flip(x, axis=nb)
    rest = x.shape[nb + 1 :]
    g = g.reshape(bshape(g, nb) + (1,) * len(rest))
    acc = np.zeros(np.broadcast_shapes(bshape(x, nb), bshape(g, nb)) + rest, x.dtype)
    lead = (slice(None),) * nb
    for k in range(x.shape[nb] - 1, -1, -1):  # Horner: x0 + g (x1 + g (x2 + ...))
        acc = x[lead + (k,)] + g * acc
    return acc


def _discounted_vjp(em, node, k, g):
    if k == 1:
        raise ProgramError(
            "the gradient with respect to the discount of discounted_sum is not supported",
            node.span,
        )
    if dynamic(em, k):
        if node.attr("reverse"):
            raise ProgramError(
                "the gradient of a reversed discounted_sum is not supported", node.span
            )
        return Window(g, "discounted")
    shape = em.in_type(0).shape
    dt = node.type.dtype
    n = shape[0]
    rev = bool(node.attr("reverse"))
    exps = em.op(
        "arange",
        start=n - 1 if rev else 0,
        stop=-1 if rev else n,
        step=-1 if rev else 1,
        dtype="i32",
    )
    powers = em.op("pow", em.fwd(1), em.op("cast", exps, dtype=dt))
    powers = em.op("reshape", powers, shape=(n,) + (1,) * (len(shape) - 1))
    return em.op(
        "mul", em.op("broadcast_to", em.op("expand_dims", g, axis=0), shape=shape), powers
    )


define(
    "discounted_sum",
    "reduce",
    2,
    _discounted_infer,
    _discounted_sum,
    vjp=_discounted_vjp,
    attrs={"reverse": "bool?"},
    doc="sum_k gamma**k x[k] along axis 0 (reverse: gamma**(n-1-k))",
)


# ----------------------------------------------------------------------------- cumsum
def _cumsum_infer(attrs, ts):
    (t,) = ts
    no_bool(t)
    static(t, "cumsum")
    axis = attrs.get("axis")
    if axis is None:
        n = 1
        for s in t.shape:
            n *= s
        return TensorType(t.dtype, (n,))
    axis_of(axis, t.rank, "cumsum")
    return t


def _cumsum(ctx, attrs, args):
    x = args[0]
    axis = attrs.get("axis")
    if axis is None:  # over the flattened spatial axes
        return np.cumsum(x.reshape(bshape(x, ctx.nb) + (-1,)), axis=-1)
    return np.cumsum(x, axis=batch_axis(axis, x, ctx.nb))


def _cumsum_vjp(em, node, k, g):
    shape = em.in_type(0).shape
    axis = node.attr("axis")
    if axis is None:
        total = em.op("broadcast_to", em.op("sum", g, axes=(0,), keepdims=True), shape=em.shape(g))
        d = em.op("add", em.op("sub", total, em.op("cumsum", g, axis=0)), g)
        return em.op("reshape", d, shape=shape)
    total = em.op("broadcast_to", em.op("sum", g, axes=(axis,), keepdims=True), shape=shape)
    return em.op("add", em.op("sub", total, em.op("cumsum", g, axis=axis)), g)


define(
    "cumsum",
    "reduce",
    1,
    _cumsum_infer,
    _cumsum,
    vjp=_cumsum_vjp,
    attrs={"axis": "int?"},
    doc="attrs: axis (None: flattened)",
)
