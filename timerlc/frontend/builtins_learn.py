"""Built-ins for learning: ``grad``, ``stop_grad``'s partner, and the optimizers
(LANGUAGE.md sections 8 and 9). Registered into ``builtins.BUILTINS``.

``grad(y, x)`` becomes one ``grad`` node per field of x, reading y and x; the autodiff
pass (``timerlc.passes.autodiff``) replaces each by the derivative. ``adam`` reaches here
as ``adam@step`` (see ``timerlc.frontend.optimizers``), with the state record beside the
parameters; it computes what ``torch.optim.Adam`` computes, in the same order.
"""

from __future__ import annotations

from timerlc.diagnostics import ProgramError
from timerlc.frontend import ast
from timerlc.frontend.builtins import Args, _maximum, builtin
from timerlc.frontend.optimizers import ADAM_STEP
from timerlc.frontend.values import RecordVal, TupleVal, Val
from timerlc.types import is_float


def _is_point_read(el, e: ast.Expr, env) -> bool:
    """A tensor or params record read at a point: ``net``, ``net[i]``, ``h[i, 0]``."""
    head = e.value if isinstance(e, ast.Subscript) else e
    if not isinstance(head, ast.Name) or head.id in env.values or head.id not in el.info.tensors:
        return False
    return not isinstance(e, ast.Subscript) or not any(isinstance(i, ast.Slice) for i in e.items)


@builtin("grad", "y", "x")
def _grad(a: Args):
    el = a.el
    y = a.value("y")
    if y.shape != ():
        raise ProgramError(f"grad needs a scalar to differentiate, got {y.type}", a.expr("y").span)
    if not is_float(y.dtype):
        raise ProgramError(f"grad needs a float to differentiate, got {y.type}", a.expr("y").span)
    if not _is_point_read(el, a.expr("x"), a.env):
        raise ProgramError(
            "grad differentiates with respect to a tensor or params record read at a point, "
            "like net[i]",
            a.expr("x").span,
        )
    y = el.node_of(y)

    def one(x: Val) -> Val:
        if not is_float(x.dtype):
            raise ProgramError(f"grad with respect to a non-float {x.type}", a.expr("x").span)
        return el.apply("grad", [y, x], a.span)

    return el.map_fields(one, [a.raw("x")], a.span)


def _record(a: Args, key: str) -> RecordVal:
    v = a.raw(key)
    if not isinstance(v, RecordVal):
        raise ProgramError(f"{a.name} needs a params record here", a.expr(key).span)
    return v


def _same_fields(a: Args, p: RecordVal, g, key: str):
    if isinstance(g, RecordVal) and g.names != p.names:
        raise ProgramError(
            f"the gradient has fields ({', '.join(g.names)}) but the parameters have "
            f"({', '.join(p.names)})",
            a.expr(key).span,
        )
    if isinstance(g, TupleVal):
        raise ProgramError("a gradient cannot be a tuple", a.expr(key).span)


@builtin("sgd", "p", "g", "lr")
def _sgd(a: Args):
    el = a.el
    p, g = _record(a, "p"), a.raw("g")
    _same_fields(a, p, g, "g")
    lr = a.value("lr")
    # torch.optim.SGD: param.add_(grad, alpha=-lr)
    return el.map_fields(
        lambda pf, gf: el.binary(
            "+", pf, el.binary("*", el.unary("-", lr, a.span), gf, a.span), a.span
        ),
        [p, g],
        a.span,
    )


@builtin(ADAM_STEP, "p", "state", "g", "lr", ("beta1", None), ("beta2", None), ("eps", None))
def _adam(a: Args):
    """torch.optim.Adam (no weight decay, no amsgrad), one step, in its order of operations."""
    el = a.el
    p, s, g = _record(a, "p"), _record(a, "state"), a.raw("g")
    _same_fields(a, p, g, "g")
    lr = el.cast(a.value("lr"), "f64")
    b1 = el.cast(a.const_float("beta1", 0.9), "f64")
    b2 = el.cast(a.const_float("beta2", 0.999), "f64")
    eps = a.const_float("eps", 1e-8)
    span = a.span
    step = el.binary("+", s.field("step"), el.const(1.0), span)  # f64 scalar
    bc1 = el.binary("-", el.const(1.0), el.binary("**", b1, step, span), span)
    bc2 = el.binary("-", el.const(1.0), el.binary("**", b2, step, span), span)
    step_size = el.binary("/", lr, bc1, span)
    bc2_sqrt = el.apply("sqrt", [el.materialize(bc2)], span)
    new_p, new_m, new_v = [], [], []
    for name, pf in p.fields:
        gf = g.field(name) if isinstance(g, RecordVal) else g
        dt = pf.dtype
        m, v = s.field("m_" + name), s.field("v_" + name)
        gf = el.cast(gf, dt)
        # exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
        w1 = el.cast(el.binary("-", el.const(1.0), b1, span), dt)
        m2 = el.binary("+", m, el.binary("*", w1, el.binary("-", gf, m, span), span), span)
        w2 = el.cast(el.binary("-", el.const(1.0), b2, span), dt)
        v2 = el.binary(
            "+",
            el.binary("*", v, el.cast(b2, dt), span),
            el.binary("*", el.binary("*", gf, gf, span), w2, span),
            span,
        )
        # denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        denom = el.binary(
            "+",
            el.binary("/", el.apply("sqrt", [v2], span), el.cast(bc2_sqrt, dt), span),
            el.cast(eps, dt),
            span,
        )
        # param.addcdiv_(exp_avg, denom, value=-step_size)
        upd = el.binary(
            "*", el.binary("/", m2, denom, span), el.cast(el.unary("-", step_size, span), dt), span
        )
        new_p.append((name, el.binary("+", pf, upd, span)))
        new_m.append(("m_" + name, m2))
        new_v.append(("v_" + name, v2))
    state = RecordVal(tuple(new_m + new_v + [("step", step)]), span)
    return TupleVal((RecordVal(tuple(new_p), span), state), span)


@builtin("clip_norm", "g", "max_norm")
def _clip_norm(a: Args):
    """torch.nn.utils.clip_grad_norm_: scale by min(1, max_norm / (total_norm + 1e-6))."""
    el = a.el
    g = a.raw("g")
    fields = g.fields if isinstance(g, RecordVal) else (("", g),)
    span = a.span
    total = None
    for _, gf in fields:
        if isinstance(gf, TupleVal):
            raise ProgramError("clip_norm takes a record or a tensor", a.expr("g").span)
        gf = el.to_float(gf)
        sq = el.apply("sum", [el.binary("*", gf, gf, span)], span, axes=tuple(range(gf.type.rank)))
        total = sq if total is None else el.binary("+", total, sq, span)
    norm = el.apply("sqrt", [total], span)
    coef = el.binary("/", a.value("max_norm"), el.binary("+", norm, el.const(1e-6), span), span)
    coef = _maximum(el, coef, el.const(1.0), span, "minimum")
    return el.map_fields(lambda gf: el.binary("*", gf, coef, span), [g], span)
