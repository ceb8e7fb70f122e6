"""Random draws: counter-based, so a draw's value depends only on its attributes
(``seed``, ``site``: the stable id of the call site, ``space``: the node's dims with their
bounds) and the point it is evaluated at (LANGUAGE.md section 7); ``timerlc.rng`` is the
reference of every draw. The ``*_at`` draws take the point index as data instead (their one
input, docs/language.md "Draws at an explicit point"). Sampling passes no gradient
(section 8)."""

from __future__ import annotations

import math

import numpy as np

from timerlc import rng
from timerlc.ops.core import NO_GRAD, TypeRuleError, define, static
from timerlc.ops.kernel import Ctx, bshape, dim_at, lift, numpy_dtype, spatial
from timerlc.types import TensorType, is_float

_DRAW = {"seed": "int", "site": "int", "space": "space"}


# ----------------------------------------------------------------------------- kernels
def _draw_points(ctx: Ctx, attrs: dict, params=()):
    """The draw's points and bounds: a tuple of ints when no dim of ``attrs.space`` varies
    over the batch (and no parameter has batch extents), else an int64 array
    ``bshape + [ndims]`` with ``bshape`` the broadcast of the varying dims' and the
    parameters' batch shapes; then the bshape (None for a single point)."""
    space = attrs["space"]
    values = [dim_at(ctx.point, d) for d, _ in space]
    bounds = tuple(b for _, b in space)
    shapes = [v.shape for v in values if isinstance(v, np.ndarray)]
    shapes += [bshape(p, ctx.nb) for p in params if any(s != 1 for s in bshape(p, ctx.nb))]
    if not shapes:
        return tuple(values), bounds, None
    batch = np.broadcast_shapes(*shapes)
    pts = np.empty(batch + (len(values),), np.int64)
    for k, v in enumerate(values):
        pts[..., k] = v
    return pts, bounds, batch


def _draw(ctx: Ctx, result: np.ndarray, bshape) -> np.ndarray:
    return lift(result, ctx.nb) if bshape is None else result


def _random(fn):
    def kernel(ctx, attrs, args):
        pts, bounds, bshape = _draw_points(ctx, attrs)
        shape, dt = tuple(attrs["shape"]), numpy_dtype(attrs["dtype"])
        return _draw(ctx, fn(attrs["seed"], attrs["site"], pts, bounds, shape, dt), bshape)

    return kernel


def _param_draw(fn):
    """Categorical and bernoulli: the parameter's batch axes must be the points' batch."""

    def kernel(ctx, attrs, args):
        (param,) = args
        pts, bounds, bshape = _draw_points(ctx, attrs, [param])
        if bshape is None:
            param = param.reshape(spatial(param, ctx.nb))
        else:
            param = np.broadcast_to(param, bshape + spatial(param, ctx.nb))
        return _draw(ctx, fn(attrs["seed"], attrs["site"], pts, bounds, param), bshape)

    return kernel


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


def _at(fn):
    """A draw at an explicit point: the one input is the point index ``P`` (an ``i64``
    scalar per point, its bits read as an unsigned 64-bit word), the value at a point is
    ``fn(seed, site, (P,), (None,), shape, dtype)``; a batch of ``P`` values adds its batch
    axes in front (axes of extent 1 stay 1)."""

    def kernel(ctx, attrs, args):
        (p,) = args
        seed, site = attrs["seed"], attrs["site"]
        shape, dt = tuple(attrs["shape"]), numpy_dtype(attrs["dtype"])
        words = np.asarray(p, np.int64).view(np.uint64)  # two's complement, as native code
        batch = bshape(words, ctx.nb)
        if all(s == 1 for s in batch):
            point = (int(words.reshape(-1)[0]),)
            return lift(fn(seed, site, point, (None,), shape, dt), ctx.nb)
        return fn(seed, site, words.reshape(batch + (1,)), (None,), shape, dt)

    return kernel


# ----------------------------------------------------------------------------- the ops
def _drawn(attrs, ts):
    return TensorType(attrs["dtype"], tuple(attrs["shape"]))


for _name, _fn, _doc in [
    ("random_uniform", rng.uniform, "uniform in [0, 1); attrs seed, site, space, shape, dtype"),
    ("random_normal", rng.normal, "standard normal; attrs seed, site, space, shape, dtype"),
    ("random_gumbel", rng.gumbel, "categorical's Gumbel noise (f64); attrs as random_uniform"),
]:
    define(
        _name,
        "source",
        0,
        _drawn,
        _random(_fn),
        vjp=NO_GRAD,
        attrs={**_DRAW, "shape": "shape", "dtype": "dtype"},
        doc=_doc,
    )


def _drawn_at(attrs, ts):
    (t,) = ts
    if t.dtype != "i64" or t.shape != ():
        raise TypeRuleError(f"a draw at a point takes its point index as an i64 scalar, got {t}")
    if not is_float(attrs["dtype"]):
        raise TypeRuleError(f"random floats are f32 or f64, not {attrs['dtype']}")
    return TensorType(attrs["dtype"], tuple(attrs["shape"]))


for _name, _fn, _doc in [
    ("random_uniform_at", rng.uniform, "uniform in [0, 1) at the point index of its input"),
    ("random_normal_at", rng.normal, "standard normal at the point index of its input"),
]:
    define(
        _name,
        "other",
        1,
        _drawn_at,
        _at(_fn),
        vjp=NO_GRAD,
        attrs={"seed": "int", "site": "int", "shape": "shape", "dtype": "dtype"},
        doc=_doc + " (an i64 scalar P: rng at point (P,), bounds (None,)); attrs seed, site, "
        "shape, dtype",
    )


def _categorical_infer(attrs, ts):
    (t,) = ts
    static(t, "categorical")
    if not is_float(t.dtype) or t.rank == 0:
        raise TypeRuleError(f"categorical needs float logits with a category axis, got {t}")
    return TensorType("i32", t.shape[:-1])


def _bernoulli_infer(attrs, ts):
    (t,) = ts
    static(t, "bernoulli")
    if not is_float(t.dtype):
        raise TypeRuleError(f"bernoulli needs float probabilities, got {t}")
    return t.with_dtype("bool")


define(
    "random_categorical",
    "other",
    1,
    _categorical_infer,
    _param_draw(rng.categorical),
    vjp=NO_GRAD,
    attrs=_DRAW,
    doc="one sample along the last axis of the logits",
)
define(
    "random_bernoulli",
    "other",
    1,
    _bernoulli_infer,
    _param_draw(rng.bernoulli),
    vjp=NO_GRAD,
    attrs=_DRAW,
    doc="True with probability p, elementwise",
)
define(
    "random_permutation",
    "source",
    0,
    lambda attrs, ts: TensorType("i32", (attrs["n"],)),
    _random_permutation,
    vjp=NO_GRAD,
    attrs={**_DRAW, "n": "int"},
    doc="a permutation of range(attrs.n)",
)

INITS = ("glorot", "orthogonal", "normal", "uniform")


def _init_infer(attrs, ts):
    if attrs["kind"] not in INITS:
        raise TypeRuleError(f"unknown initializer {attrs['kind']}")
    return TensorType(attrs["dtype"], tuple(attrs["shape"]))


define(
    "random_init",
    "source",
    0,
    _init_infer,
    _random_init,
    vjp=NO_GRAD,
    attrs={
        **_DRAW,
        "shape": "shape",
        "dtype": "dtype",
        "kind": "init",
        "gain": "float?",
        "std": "float?",
        "lo": "float?",
        "hi": "float?",
    },
    doc="a random initializer; attrs kind (glorot|orthogonal|normal|uniform)",
)
