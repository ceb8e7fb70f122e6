"""A gradient-check harness for the autodiff pass (LANGUAGE.md section 8).

``gradcheck(body, params)`` builds the program

    <header>
    params p { <field> : f64[<shape>] = <exact value> ... }
    <body>                     # defines a scalar `loss` from p's fields
    g = grad(loss, p)
    out g, loss

runs it through the whole pipeline (front end, autodiff, domain checks, reference
interpreter), and compares every field of ``g`` with central finite differences of ``loss``
in f64. The finite differences reuse one forward-only graph: each perturbation replaces
the initializer of the field by a constant node and reruns the interpreter.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from rtl_helpers import BACKENDS_COMPARED, compare_cpu

from timerlc.compiler import run_passes
from timerlc.diagnostics import ProgramError, Source
from timerlc.frontend.check import check_source
from timerlc.ir.pdg import SCALAR_DOMAIN, Edge, Node, make_attrs
from timerlc.types import TensorType
from timerlc.poly.checks import check_all
from timerlc.reference.interpreter import outputs, run_graph

EPS = 1e-6
RTOL = 1e-6
ATOL = 1e-8


def src(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


def compile_program(text: str, **sets):
    """The graph after the lowering passes (autodiff), checked by the domain checks."""
    overrides = {k: str(v) for k, v in sets.items()}
    graph = check_source(Source("p.rtl", src(text)), overrides=overrides)
    graph = run_passes(graph, optimize=False)
    check_all(graph)  # the differentiated graph must still pass the domain checks
    return graph


def run(text: str, **sets) -> dict[str, np.ndarray]:
    """The reference's outputs; the cpu backend (the optimized program) must agree."""
    graph = compile_program(text, **sets)
    want = outputs(run_graph(graph))
    if BACKENDS_COMPARED:
        compare_cpu(graph, want)
    return want


def error(text: str, **sets) -> ProgramError:
    """The ProgramError a program gives (anywhere up to running it); never another error."""
    with pytest.raises(ProgramError) as info:
        run(text, **sets)
    assert info.value.span is not None, f"no position for: {info.value.message}"
    return info.value


def error_at(text: str, line: int, col: int, *words: str) -> ProgramError:
    e = error(text)
    where = (e.span.line, e.span.col)
    assert where == (line, col), f"error at {where}, expected {(line, col)}: {e.message}"
    for w in words:
        assert w in e.message, f"{w!r} not in {e.message!r}"
    return e


# ----------------------------------------------------------------------------- literals
def f64_literal(v: np.ndarray) -> str:
    """An RTL expression of exactly the f64 array ``v``."""
    v = np.asarray(v, np.float64)
    if v.ndim == 0:
        return f"f64({float(v)!r})"
    flat = ", ".join(f"f64({float(x)!r})" for x in v.ravel())
    e = f"stack([{flat}])"
    if v.ndim > 1:
        e = f"reshape({e}, [{', '.join(str(s) for s in v.shape)}])"
    return e


def params_decl(params: dict, name: str = "p", dims: str = "", dtype: str = "f64") -> str:
    lines = [f"params {name}{dims} {{"]
    for field, value in params.items():
        value = np.asarray(value, np.float64)
        shape = ", ".join(str(s) for s in value.shape)
        lines.append(f"  {field} : {dtype}[{shape}] = {f64_literal(value)}")
    lines.append("}")
    return "\n".join(lines)


def grad_program(body: str, params: dict, header: str = "", with_grad: bool = True) -> str:
    parts = [src(header) if header.strip() else "", params_decl(params) + "\n", src(body)]
    parts.append("g = grad(loss, p)\nout g, loss\n" if with_grad else "out loss\n")
    return "".join(parts)


# ----------------------------------------------------------------------------- the check
def _with_field_value(graph, field: str, value: np.ndarray):
    """``graph`` with the initializer of ``p.<field>`` replaced by the constant ``value``."""
    t = graph.tensor(f"p.{field}")
    merge = graph.node(t.node)
    assert merge.op == "merge" and len(merge.inputs) == 1, "p has no dims: one initializer"
    ftype = merge.type
    nid = len(graph.nodes)
    attrs = make_attrs(value=_nested(value), dtype=ftype.dtype, shape=ftype.shape)
    const = Node(nid, "const", SCALAR_DOMAIN, (), (TensorType(ftype.dtype, ftype.shape),), attrs)
    old = merge.inputs[0]
    new_merge = Node(
        merge.id,
        merge.op,
        merge.domain,
        (Edge(nid, (), cond=old.cond, span=old.span),),
        merge.types,
        merge.attrs,
        merge.name,
        merge.span,
    )
    nodes = list(graph.nodes) + [const]
    nodes[merge.id] = new_merge
    return graph.replace(nodes=tuple(nodes))


def _nested(v: np.ndarray):
    v = np.asarray(v, np.float64)
    return float(v) if v.ndim == 0 else tuple(_nested(x) for x in v)


def numeric_grad(forward_graph, params: dict, eps: float = EPS) -> dict[str, np.ndarray]:
    """Central differences of ``loss`` with respect to every element of every field."""
    out = {}
    for field, value in params.items():
        value = np.asarray(value, np.float64)
        g = np.zeros_like(value)
        for k in np.ndindex(*value.shape):
            vals = []
            for sign in (1.0, -1.0):
                v = value.copy()
                v[k] += sign * eps
                res = outputs(run_graph(_with_field_value(forward_graph, field, v)))
                vals.append(float(res["loss"]))
            g[k] = (vals[0] - vals[1]) / (2 * eps)
        out[field] = g
    return out


def gradcheck(
    body: str,
    params: dict,
    header: str = "",
    expected: dict | None = None,
    rtol: float = RTOL,
    atol: float = ATOL,
    **sets,
) -> dict[str, np.ndarray]:
    """Check ``grad(loss, p)`` against finite differences (or against ``expected``)."""
    out = run(grad_program(body, params, header), **sets)
    assert np.asarray(out["loss"]).shape == ()
    if expected is None:
        fwd = compile_program(grad_program(body, params, header, with_grad=False), **sets)
        base = float(outputs(run_graph(fwd))["loss"])
        assert np.isclose(base, float(out["loss"]), rtol=1e-12, atol=1e-12)
        expected = numeric_grad(fwd, params)
    for field, value in params.items():
        got = out[f"g.{field}"]
        assert got.shape == np.shape(value), f"g.{field}: shape {got.shape}"
        assert got.dtype == np.float64, f"g.{field}: dtype {got.dtype}"
        np.testing.assert_allclose(
            got, expected[field], rtol=rtol, atol=atol, err_msg=f"gradient of field {field}"
        )
    return out


def gradcheck_or_refused(body: str, params: dict, header: str = "", line: int | None = None, **kw):
    """A construct the pass may not support yet: either a ProgramError with a position (at
    ``line`` of the body, counted from 1), or the right gradient. Never a crash."""
    text = grad_program(body, params, header)
    try:
        compile_program(text)
    except ProgramError as e:
        assert e.span is not None, f"no position for: {e.message}"
        if line is not None:
            first = len(src(header).splitlines()) if header.strip() else 0
            first += len(params_decl(params).splitlines())
            assert e.span.line == first + line, f"error at line {e.span.line}: {e.message}"
        return e
    gradcheck(body, params, header, **kw)
    return None
