"""``timerlc.ir.verify``: the invariants every pass keeps, and that breaking one is caught
with the node and the IR around it (the driver runs it between passes under
``TIMERLC_VERIFY=1``, which the test suite sets)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rtl_helpers import src

from timerlc import compiler
from timerlc.diagnostics import Source
from timerlc.ir.pdg import Point
from timerlc.types import TensorType
from timerlc.ir.verify import VerifyError, verify

TEXT = """
    config T = 5
    dim t < T
    r[t] = f32(t) * 0.5
    g[T-1] = r[T-1]
    g[t] = r + 0.9 * g[t+1]
    out g
"""


def graph():
    return compiler.check_program(Source("p.rtl", src(TEXT)))


def broken(g, nid: int, **changes):
    nodes = list(g.nodes)
    nodes[nid] = replace(nodes[nid], **changes)
    return g.replace(nodes=tuple(nodes))


def first(g, op: str):
    return next(n for n in g.nodes if n.op == op)


def test_every_stage_of_every_program_verifies():
    stages = []
    compiler.compile_source(
        Source("p.rtl", src(TEXT)), on_stage=lambda name, x: stages.append(name)
    )
    assert stages[:2] == ["frontend", "autodiff"] and stages[-3:] == ["schedule", "plan", "kernels"]


def test_a_node_typed_against_its_op_is_caught():
    g = graph()
    n = first(g, "mul")
    with pytest.raises(VerifyError, match=rf"%{n.id} \(mul\): typed f64\[\], its op gives f32"):
        verify(broken(g, n.id, types=(TensorType("f64", ()),)))


def test_a_read_of_a_missing_output_is_caught():
    g = graph()
    n = first(g, "mul")
    e = replace(n.inputs[0], out=3)
    with pytest.raises(VerifyError, match="reads output 3"):
        verify(broken(g, n.id, inputs=(e,) + n.inputs[1:]))


def test_an_access_over_a_dim_the_reader_lacks_is_caught():
    g = graph()
    n = next(n for n in g.nodes if n.op == "mul" and n.dims)
    from timerlc.ir import index as ix

    e = replace(n.inputs[0], access=(Point(ix.sym("q")),) * len(g.node(n.inputs[0].src).dims))
    with pytest.raises(VerifyError, match=r"uses \['q'\]"):
        verify(broken(g, n.id, inputs=(e,) + n.inputs[1:]))


def test_the_failure_shows_the_ir_around_the_node():
    g = graph()
    n = first(g, "mul")
    with pytest.raises(VerifyError) as info:
        verify(broken(g, n.id, types=(TensorType("f64", ()),)))
    assert f"%{n.id} = mul(" in str(info.value)


def test_a_grad_after_autodiff_is_caught():
    text = TEXT + "    x = 1.0\n    y = grad(x * x, x)\n    out y\n"
    g = compiler.check_program(Source("p.rtl", src(text)))
    verify(g)
    with pytest.raises(VerifyError, match="a grad after the autodiff pass"):
        verify(g, lowered=True)
