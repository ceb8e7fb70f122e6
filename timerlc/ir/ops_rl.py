"""Ops of the registry for RL programs: counter-based random draws and environment calls.

Registered into ``timerlc.ir.ops.REGISTRY`` when ``timerlc.ir.ops`` is imported.

A random op's value depends only on its attributes (``seed``, ``site``: the stable id of
the call site, ``space``: the node's dims with their bounds) and the point it is evaluated
at (LANGUAGE.md section 7); ``timerlc.rng`` is the reference of every draw. Environment
calls (``env_reset``, ``env_step``) have state; the interpreter runs them itself, in the
order of their ``key`` (the point of their first output without the batch dim, section 10).
"""

from __future__ import annotations

from timerlc import rng
from timerlc.ir.ops import TypeRuleError, _static, op
from timerlc.ir.types import TensorType, is_float, numpy_dtype


def _draw_point(attrs, point):
    space = attrs["space"]
    return tuple(point[d] for d, _ in space), tuple(b for _, b in space)


def _random(fn_name):
    def infer(attrs, ts):
        return TensorType(attrs["dtype"], tuple(attrs["shape"]))

    def impl(attrs, args, point):
        p, bounds = _draw_point(attrs, point)
        fn = getattr(rng, fn_name)
        return fn(
            attrs["seed"],
            attrs["site"],
            p,
            bounds,
            tuple(attrs["shape"]),
            numpy_dtype(attrs["dtype"]),
        )

    return infer, impl


op("random_uniform", "source", 0, "uniform in [0, 1); attrs seed, site, space, shape, dtype")(
    _random("uniform")
)
op("random_normal", "source", 0, "standard normal; attrs seed, site, space, shape, dtype")(
    _random("normal")
)
op("random_gumbel", "source", 0, "categorical's Gumbel noise (f64); attrs as random_uniform")(
    _random("gumbel")
)


@op("random_categorical", "other", 1, "one sample along the last axis of the logits")
def _():
    def infer(attrs, ts):
        (t,) = ts
        _static(t, "categorical")
        if not is_float(t.dtype) or t.rank == 0:
            raise TypeRuleError(f"categorical needs float logits with a category axis, got {t}")
        return TensorType("i32", t.shape[:-1])

    def impl(attrs, args, point):
        p, bounds = _draw_point(attrs, point)
        return rng.categorical(attrs["seed"], attrs["site"], p, bounds, args[0])

    return infer, impl


@op("random_bernoulli", "other", 1, "True with probability p, elementwise")
def _():
    def infer(attrs, ts):
        (t,) = ts
        _static(t, "bernoulli")
        if not is_float(t.dtype):
            raise TypeRuleError(f"bernoulli needs float probabilities, got {t}")
        return t.with_dtype("bool")

    def impl(attrs, args, point):
        p, bounds = _draw_point(attrs, point)
        return rng.bernoulli(attrs["seed"], attrs["site"], p, bounds, args[0])

    return infer, impl


@op("random_permutation", "source", 0, "a permutation of range(attrs.n)")
def _():
    def infer(attrs, ts):
        return TensorType("i32", (attrs["n"],))

    def impl(attrs, args, point):
        p, bounds = _draw_point(attrs, point)
        return rng.permutation(attrs["seed"], attrs["site"], p, bounds, attrs["n"])

    return infer, impl


_INITS = {
    "glorot": lambda a, s, p, b, shape, dt: rng.glorot_uniform(s, a["site"], p, b, shape, dt),
    "orthogonal": lambda a, s, p, b, shape, dt: rng.orthogonal(
        s, a["site"], p, b, shape, a["gain"], dt
    ),
    "normal": lambda a, s, p, b, shape, dt: rng.normal_init(
        s, a["site"], p, b, shape, a["std"], 0.0, dt
    ),
    "uniform": lambda a, s, p, b, shape, dt: rng.uniform_init(
        s, a["site"], p, b, shape, a["lo"], a["hi"], dt
    ),
}


@op(
    "random_init",
    "source",
    0,
    "a random initializer; attrs kind (glorot|orthogonal|normal|uniform)",
)
def _():
    def infer(attrs, ts):
        if attrs["kind"] not in _INITS:
            raise TypeRuleError(f"unknown initializer {attrs['kind']}")
        return TensorType(attrs["dtype"], tuple(attrs["shape"]))

    def impl(attrs, args, point):
        p, bounds = _draw_point(attrs, point)
        fn = _INITS[attrs["kind"]]
        return fn(
            attrs, attrs["seed"], p, bounds, tuple(attrs["shape"]), numpy_dtype(attrs["dtype"])
        )

    return infer, impl


def _env(attrs, ts):
    raise TypeRuleError("environment calls are typed by the front end")


def _run_by_interpreter(attrs, args, point):
    raise RuntimeError("environment calls are run by the interpreter, not as a NumPy function")


op("env_reset", "env", 0, "E.reset(): obs [B, *obs_shape]; attrs env, key_dims, key")(
    (_env, _run_by_interpreter)
)
op("env_step", "env", 1, "E.step(a): (obs, reward, done) over the batch; attrs env, key_dims, key")(
    (_env, _run_by_interpreter)
)
