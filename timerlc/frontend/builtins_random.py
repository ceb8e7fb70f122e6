"""Random built-ins (LANGUAGE.md section 7): uniform, normal, categorical, bernoulli,
permutation and glorot, and the random initializers of params fields.

Every call is a *site* with a stable identity: the tensor its equation defines, the
equation's ordinal, the call's ordinal inside the equation, and the path of defs it was
inlined through. The site, the seed and the node's dims make the draw's attributes;
``timerlc.rng`` turns them and the point into values. Registered into ``BUILTINS``.

``uniform`` and ``normal`` also draw at a point given as data, ``at=[k]`` or ``at=[k, c]``
(a timerlc extension, docs/language.md "Draws at an explicit point"): point index
``P = k`` or ``P = k * 2**32 + c`` in i64, ops ``random_uniform_at``/``random_normal_at``.
While the elaborator's ``draw_key`` is set (an environment's function being inlined), every
draw takes its seed and site from it and must say ``at=``.
"""

from __future__ import annotations

from timerlc import rng
from timerlc.diagnostics import ProgramError
from timerlc.frontend import ast
from timerlc.frontend.builtins import Args, builtin
from timerlc.frontend.builtins_array import _static_shape
from timerlc.frontend.values import RecordVal, TupleVal, Val
from timerlc.types import is_float

NEEDS_AT = (
    "a draw in an environment's function needs at=[...]: its point is the environment's "
    "data, not the program's (docs/envs.md)"
)


def site_attrs(el, env, what: str, span=None, at: bool = False) -> dict:
    """The attributes that identify a draw: seed, site, and (unless it draws ``at`` a point
    given as data) the point's dims and bounds. While ``el.draw_key`` is set, the seed and
    site are its two ints, and a draw without ``at`` is an error at ``span``."""
    key = getattr(el, "draw_key", None)
    if key is not None and not at:
        raise ProgramError(NEEDS_AT, span)
    path = "/".join(env.calls)
    text = f"{el.site}#{el.draws}#{what}#{path}"
    el.draws += 1
    if key is not None:
        seed, site = key
        return {"seed": int(seed), "site": int(site)}
    seed, site = int(el.info.configs["seed"].value), rng.site_id(text)
    if at:
        return {"seed": seed, "site": site}
    space = tuple((d, el.info.dims[d].bound) for d in el.domain.dims)
    return {"seed": seed, "site": site, "space": space}


def _float_dtype(a: Args) -> str:
    dtype = a.dtype("dtype", "f32")
    if not is_float(dtype):
        raise ProgramError(
            f"{a.name} draws floats; dtype {dtype} is not one", a.expr("dtype").span
        )
    return dtype


def _at_index(a: Args) -> Val:
    """The point index of ``at=[k]`` (``k``) or ``at=[k, c]`` (``k * 2**32 + c``), an i64
    scalar; ``k`` and ``c`` are i32 or i64 scalars."""
    el, e = a.el, a.expr("at")
    if not isinstance(e, ast.ListLit) or len(e.items) not in (1, 2):
        n = f"a list of {len(e.items)}" if isinstance(e, ast.ListLit) else "not a list"
        raise ProgramError(
            f"'at' of {a.name} is a list [k] or [k, c] of integer scalars "
            f"(the point index k or k * 2**32 + c), {n}",
            e.span,
        )
    parts = []
    for item in e.items:
        v = el.value(item, a.env)
        if isinstance(v, (RecordVal, TupleVal)):
            got = "a record" if isinstance(v, RecordVal) else "a tuple"
        elif v.dtype not in ("i32", "i64") or v.shape != () or not v.type.is_static:
            got = str(v.type)
        else:
            parts.append(el.cast(v, "i64"))
            continue
        raise ProgramError(
            f"an entry of 'at' of {a.name} must be an integer scalar (i32 or i64), got {got}",
            item.span,
        )
    if len(parts) == 1:
        return parts[0]
    k, c = parts
    hi = el.binary("*", k, el.const(2**32, "i64", span=e.span), e.span)
    return el.binary("+", hi, c, e.span)


def _draw(a: Args, op: str, what: str, dtype: str) -> Val:
    """A draw of ``op`` (``random_uniform``/``random_normal``), or of its ``_at`` form."""
    el = a.el
    shape = _static_shape(a, "shape")
    if not a.given("at"):
        attrs = site_attrs(el, a.env, what, a.span)
        return el.apply(op, [], a.span, shape=shape, dtype=dtype, **attrs)
    p = _at_index(a)
    attrs = site_attrs(el, a.env, what, a.span, at=True)
    return el.apply(op + "_at", [p], a.span, shape=shape, dtype=dtype, **attrs)


@builtin("uniform", "shape", ("lo", None), ("hi", None), ("dtype", None), ("at", None))
def _uniform(a: Args):
    el = a.el
    dtype = _float_dtype(a)
    u = _draw(a, "random_uniform", "uniform", dtype)
    if not a.given("lo") and not a.given("hi"):
        return u
    lo = el.cast(a.const_float("lo", 0.0), dtype) if a.given("lo") else el.const(0.0, dtype)
    hi = el.cast(a.const_float("hi", 1.0), dtype) if a.given("hi") else el.const(1.0, dtype)
    # lo + (hi - lo) * u, the order timerlc.rng.uniform uses
    return el.binary("+", lo, el.binary("*", el.binary("-", hi, lo, a.span), u, a.span), a.span)


@builtin("normal", "shape", ("dtype", None), ("at", None))
def _normal(a: Args):
    return _draw(a, "random_normal", "normal", _float_dtype(a))


@builtin("categorical", "logits")
def _categorical(a: Args):
    el = a.el
    logits = el.to_float(a.value("logits"))
    if logits.type.rank == 0:
        raise ProgramError(
            f"categorical needs logits with a category axis, got {logits.type}",
            a.expr("logits").span,
        )
    return el.apply(
        "random_categorical", [logits], a.span, **site_attrs(el, a.env, "categorical", a.span)
    )


@builtin("bernoulli", "p")
def _bernoulli(a: Args):
    el = a.el
    p = el.cast(el.to_float(a.value("p")), "f64")
    return el.apply(
        "random_bernoulli",
        [el.materialize(p)],
        a.span,
        **site_attrs(el, a.env, "bernoulli", a.span),
    )


@builtin("permutation", "n")
def _permutation(a: Args):
    el = a.el
    n = a.const_int("n")
    if n < 0:
        raise ProgramError(f"permutation needs n >= 0, got {n}", a.expr("n").span)
    return el.apply(
        "random_permutation", [], a.span, n=n, **site_attrs(el, a.env, "permutation", a.span)
    )


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
        **site_attrs(el, a.env, "glorot", a.span),
    )
