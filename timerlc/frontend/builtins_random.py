"""Random built-ins (LANGUAGE.md section 7): uniform, normal, categorical, bernoulli,
permutation and glorot, and the random initializers of params fields.

Every call is a *site* with a stable identity: the tensor its equation defines, the
equation's ordinal, the call's ordinal inside the equation, and the path of defs it was
inlined through. The site, the seed and the node's dims make the draw's attributes;
``timerlc.rng`` turns them and the point into values. Registered into ``BUILTINS``.
"""

from __future__ import annotations

from timerlc import rng
from timerlc.diagnostics import ProgramError
from timerlc.frontend.builtins import Args, builtin
from timerlc.frontend.builtins_array import _static_shape
from timerlc.types import is_float


def site_attrs(el, env, what: str) -> dict:
    """The attributes that identify a draw: seed, site, and the point's dims and bounds."""
    path = "/".join(env.calls)
    text = f"{el.site}#{el.draws}#{what}#{path}"
    el.draws += 1
    seed = el.info.configs["seed"].value
    space = tuple((d, el.info.dims[d].bound) for d in el.domain.dims)
    return {"seed": int(seed), "site": rng.site_id(text), "space": space}


def _float_dtype(a: Args) -> str:
    dtype = a.dtype("dtype", "f32")
    if not is_float(dtype):
        raise ProgramError(f"{a.name} draws floats; dtype {dtype} is not one", a.expr("dtype").span)
    return dtype


@builtin("uniform", "shape", ("lo", None), ("hi", None), ("dtype", None))
def _uniform(a: Args):
    el = a.el
    dtype = _float_dtype(a)
    u = el.apply(
        "random_uniform",
        [],
        a.span,
        shape=_static_shape(a, "shape"),
        dtype=dtype,
        **site_attrs(el, a.env, "uniform"),
    )
    if not a.given("lo") and not a.given("hi"):
        return u
    lo = el.cast(a.const_float("lo", 0.0), dtype) if a.given("lo") else el.const(0.0, dtype)
    hi = el.cast(a.const_float("hi", 1.0), dtype) if a.given("hi") else el.const(1.0, dtype)
    # lo + (hi - lo) * u, the order timerlc.rng.uniform uses
    return el.binary("+", lo, el.binary("*", el.binary("-", hi, lo, a.span), u, a.span), a.span)


@builtin("normal", "shape", ("dtype", None))
def _normal(a: Args):
    el = a.el
    return el.apply(
        "random_normal",
        [],
        a.span,
        shape=_static_shape(a, "shape"),
        dtype=_float_dtype(a),
        **site_attrs(el, a.env, "normal"),
    )


@builtin("categorical", "logits")
def _categorical(a: Args):
    el = a.el
    logits = el.to_float(a.value("logits"))
    if logits.type.rank == 0:
        raise ProgramError(
            f"categorical needs logits with a category axis, got {logits.type}",
            a.expr("logits").span,
        )
    return el.apply("random_categorical", [logits], a.span, **site_attrs(el, a.env, "categorical"))


@builtin("bernoulli", "p")
def _bernoulli(a: Args):
    el = a.el
    p = el.cast(el.to_float(a.value("p")), "f64")
    return el.apply(
        "random_bernoulli", [el.materialize(p)], a.span, **site_attrs(el, a.env, "bernoulli")
    )


@builtin("permutation", "n")
def _permutation(a: Args):
    el = a.el
    n = a.const_int("n")
    if n < 0:
        raise ProgramError(f"permutation needs n >= 0, got {n}", a.expr("n").span)
    return el.apply("random_permutation", [], a.span, n=n, **site_attrs(el, a.env, "permutation"))


@builtin("glorot", "shape", ("dtype", None))
def _glorot(a: Args):
    el = a.el
    return el.apply(
        "random_init",
        [],
        a.span,
        kind="glorot",
        shape=_static_shape(a, "shape"),
        dtype=_float_dtype(a),
        **site_attrs(el, a.env, "glorot"),
    )
