"""Ops the runtimes run themselves: ``merge`` (a tensor defined piecewise: the first input
whose condition holds), ``grad`` (replaced by the autodiff pass before anything runs) and
the environment calls ``env_reset`` and ``env_step``, which have state and run in the
order of their ``key`` (the point of their first output without the batch dim, LANGUAGE.md
section 10). Environments pass no gradient (section 8)."""

from __future__ import annotations

from timerlc.diagnostics import ProgramError
from timerlc.ops.core import NO_GRAD, TypeRuleError, define
from timerlc.ops.grads import identity
from timerlc.types import is_float


def _merge_infer(attrs, ts):
    first = ts[0]
    for t in ts[1:]:
        if t != first:
            raise TypeRuleError(f"merge branches differ: {first} and {t}")
    return first


define(
    "merge",
    "control",
    None,
    _merge_infer,
    vjp=identity,
    doc="the first input whose edge condition holds",
)


def _grad_infer(attrs, ts):
    y, x = ts
    if y.shape != () or not is_float(y.dtype) or not is_float(x.dtype):
        raise TypeRuleError(f"grad of {y} with respect to {x}")
    return x


def _grad_of_grad(em, node, k, g):
    raise ProgramError("a gradient of a gradient is not supported", node.span)


define(
    "grad",
    "control",
    2,
    _grad_infer,
    vjp=_grad_of_grad,
    doc="d y / d x at this point: inputs (y, x); replaced by the autodiff pass",
)


def _typed_by_the_front_end(attrs, ts):
    raise TypeRuleError("environment calls are typed by the front end")


_ENV = {"env": "env", "key": "key", "key_dims": "names"}
define(
    "env_reset",
    "env",
    0,
    _typed_by_the_front_end,
    vjp=NO_GRAD,
    attrs=_ENV,
    doc="E.reset(): obs [B, *obs_shape]; attrs env, key_dims, key",
)
define(
    "env_step",
    "env",
    1,
    _typed_by_the_front_end,
    vjp=NO_GRAD,
    attrs=_ENV,
    outputs=3,
    doc="E.step(a): (obs, reward, done) over the batch; attrs env, key_dims, key",
)
