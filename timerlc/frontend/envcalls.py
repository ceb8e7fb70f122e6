"""Environment calls in equations: ``E.reset()`` and ``E.step(a)`` (LANGUAGE.md section 10).

In: a call inside an equation that iterates E's batch dim b. Out: an ``env_reset`` or
``env_step`` node over the equation's other dims, batched over b (its action input reads
the action at every b), and the per-instance values ``out[b]`` the equation uses. Each
call node records its ``key``: the point of the equation's first left side without b, the
order in which calls of one env happen.
"""

from __future__ import annotations

import sympy

from timerlc.diagnostics import ProgramError
from timerlc.frontend import ast
from timerlc.frontend.values import TupleVal, Val
from timerlc.ir import index as ix
from timerlc.ir.pdg import Domain, Edge, Point, Range, identity_access, make_attrs
from timerlc.types import TensorType
from timerlc.poly import isl as pisl


def check_call(env, method: str, call: ast.Call, iterated):
    """A call ``E.method(...)`` in an equation that iterates ``iterated``: a method of the
    environment, its number of arguments, and the batch dim iterated (plugins and
    environments written in RTL alike)."""
    name, b = env.name, env.batch
    if method not in ("reset", "step"):
        raise ProgramError(
            f"environment '{name}' has no method '{method}' (it has reset, step)", call.func.span
        )
    want = 0 if method == "reset" else 1
    if call.kwargs or len(call.args) != want:
        raise ProgramError(
            f"{name}.{method} takes {want} argument{'s' if want != 1 else ''}, got "
            f"{len(call.args) + len(call.kwargs)}",
            call.func.span,
        )
    if b not in iterated:
        raise ProgramError(
            f"{name}.{method}() must be called in an equation that iterates {name}'s batch dim "
            f"'{b}'",
            call.func.span,
        )


def env_call(el, env, method: str, call: ast.Call, locals_):
    name, b = env.name, env.batch
    check_call(env, method, call, el.iterated)
    if name in el.env_calls:
        raise ProgramError(
            f"'{name}' is called twice in one equation; the order would be unclear", call.func.span
        )
    el.env_calls.add(name)
    domain = _without_batch(el.domain, b, el.info.dims[b].bound, call.func.span)
    key_dims, key = _key(el, b, call.func.span)
    attrs = make_attrs(env=name, key_dims=key_dims, key=key)
    n = el.info.dims[b].bound
    obs = TensorType("f32", (n,) + env.attrs.obs_shape)
    if method == "reset":
        nid = el.builder.add("env_reset", domain, (), obs, attrs, span=call.func.span)
        return _per_instance(el, nid, 0, obs, b, call.span)
    action = _action(el, env, el.value(call.args[0], locals_), call.args[0].span)
    access = tuple(
        Range(sympy.Integer(0), sympy.Integer(n)) if d == b else Point(ix.sym(d))
        for d in el.domain.dims
    )
    types = (obs, TensorType("f32", (n,)), TensorType("bool", (n,)))
    nid = len(el.builder.nodes)
    from timerlc.ir.pdg import Node

    el.builder.nodes.append(
        Node(
            nid,
            "env_step",
            domain,
            (Edge(action.node, access, span=action.span),),
            types,
            attrs,
            None,
            call.func.span,
        )
    )
    return TupleVal(
        tuple(_per_instance(el, nid, k, types[k], b, call.span) for k in range(3)), call.span
    )


def _without_batch(domain: Domain, b: str, n: int, span) -> Domain:
    """The equation's domain without b; the equation must hold at every b."""
    dims = tuple(d for d in domain.dims if d != b)
    # the domain lies in b's box, so b's bounds may be dropped anywhere inside its condition
    # (a shadowed equation's domain has ~(i = 1 & 0 <= b < B)); the check below still compares
    # the result with the domain itself
    inbox = {atom: sympy.true for atom in ix.box([(b, n)]).args}
    cond = domain.cond.xreplace(inbox)
    parts = cond.args if isinstance(cond, sympy.And) else (cond,)
    rest = sympy.And(*[c for c in parts if ix.sym(b) not in c.free_symbols])
    full = sympy.And(rest, ix.box([(b, n)]))
    same = pisl.is_empty(domain.dims, sympy.And(full, sympy.Not(domain.cond))) and pisl.is_empty(
        domain.dims, sympy.And(domain.cond, sympy.Not(full))
    )
    if not same:
        raise ProgramError(
            "an environment call steps every instance at once: its equation must hold for every "
            f"'{b}'",
            span,
        )
    return Domain(dims, pisl.simplify(dims, rest))


def _key(el, b: str, span):
    lhs, tensor_dims = el.first_lhs
    return call_key(lhs, tensor_dims, b, span)


def call_key(lhs, tensor_dims, b: str, span):
    """(the dims of the key, the key): the point of a call's first output ``lhs`` (over
    ``tensor_dims``) without the batch dim ``b``, the order of the environment's calls."""
    key_dims, key = [], []
    for d, e in zip(tensor_dims, lhs.entries):
        if d == b:
            if e.dim != b or e.offset != 0:
                raise ProgramError(
                    f"the first output of an environment call must be indexed by '{b}' itself",
                    span,
                )
            continue
        key_dims.append(d)
        key.append(ix.sym(e.dim) + e.offset if e.dim is not None else sympy.Integer(e.offset))
    if b not in tensor_dims:
        raise ProgramError(
            f"the first output of an environment call must have the batch dim '{b}'", span
        )
    return tuple(key_dims), tuple(key)


def _action(el, env, a, span) -> Val:
    if not isinstance(a, Val):
        raise ProgramError("an action must be a tensor", span)
    attrs = env.attrs
    if attrs.discrete:
        if a.shape != () or not (a.dtype.startswith("i") or a.dtype == "bool"):
            raise ProgramError(
                f"'{env.name}' has {attrs.num_actions} discrete actions: an action is an integer "
                f"scalar, got {a.type}",
                span,
            )
        a = el.cast(a, "i32")
    else:
        if a.shape not in ((), attrs.act_shape):
            raise ProgramError(
                f"'{env.name}' takes actions of shape {list(attrs.act_shape)}, got {a.type}", span
            )
        a = el.to_float(a)
        a = el.cast(a, "f32")
        if a.shape != attrs.act_shape:
            a = el.apply("broadcast_to", [el.materialize(a)], span, shape=attrs.act_shape)
    return el.apply("copy", [a], span)  # a node over the whole equation, read at every b


def _per_instance(el, nid: int, out: int, t: TensorType, b: str, span) -> Val:
    dims = el.builder.nodes[nid].dims
    v = Val(t, edge=Edge(nid, identity_access(dims), out=out, span=span), span=span)
    return el.apply("index", [v], span, items=(("int", ix.sym(b)),))
