"""The reference interpreter on its own: evaluation order, failures, partial results."""

import numpy as np
import pytest
import sympy

from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.ir import index as ix
from timerlc.ir.pdg import Dim, Domain, Edge, Graph, Node, Point, Tensor
from timerlc.types import TensorType
from timerlc.reference.interpreter import Interpreter, outputs, run_graph
from timerlc.runner import run_reference


def graph_of(text, **overrides):
    return check_source(Source("t.rtl", text), {k: str(v) for k, v in overrides.items()})


def test_cycle_is_detected_at_run_time_too():
    # x[t] = x[t] + 1 built by hand: the checker would refuse it, the interpreter must too
    t = ix.sym("t")
    dom = Domain(("t",), sympy.And(t >= 0, t < 3))
    f32 = TensorType("f32", ())
    nodes = (
        Node(0, "merge", dom, (Edge(1, (Point(t),), cond=dom.cond),), (f32,), name="x"),
        Node(1, "copy", dom, (Edge(0, (Point(t),)),), (f32,)),
    )
    g = Graph((Dim("t", 3),), nodes, (Tensor("x", 0),))
    with pytest.raises(RunError, match="cyclic"):
        run_graph(g)


def test_long_recurrence_needs_no_deep_python_recursion():
    g = graph_of("config T = 20000\ndim t < T\nc[0] = 1\nc[t] = c[t-1] + 1\nout c\n")
    interp = Interpreter(g)
    interp.ensure(g.tensor("c").node, (19999,))  # demand the last point first
    assert interp.value("c")[19999] == 20000


def test_metrics_stream_in_order_of_the_outer_dim():
    seen = []
    g = graph_of(
        "dim i < 3\ndim t < 4\nx[i, t] = f32(i * t)\ns[i] = sum(x[i, 0:4])\n"
        "m[i] = s[i] * 2.0\nmetric s, m\n"
    )
    run_graph(g, on_metric=lambda name, point, value: seen.append((point["i"], name)))
    assert seen == [(0, "s"), (0, "m"), (1, "s"), (1, "m"), (2, "s"), (2, "m")]


def test_failure_keeps_metrics_and_partial_outputs(tmp_path):
    # the gather index goes out of range at i = 3
    g = graph_of(
        "dim i < 4\nv = arange(3)\nk[i] = i\ny[i] = v[k[i]]\nm[i] = f32(y[i])\nout y\nmetric m\n"
    )
    metrics = tmp_path / "m.csv"
    out = tmp_path / "o.npz"
    with pytest.raises(RunError, match="out of range"):
        run_reference(g, str(out), str(metrics))
    assert metrics.read_text().splitlines() == ["name,i,value", "m,0,0.0", "m,1,1.0", "m,2,2.0"]
    np.testing.assert_array_equal(np.load(out)["y"], [0, 1, 2, 0])


def test_points_outside_the_domain_are_zero():
    g = graph_of("dim t < 6\nx[t] = f32(t) + 1.0 when t % 2 == 0\nout x\n")
    np.testing.assert_array_equal(outputs(run_graph(g))["x"], [1, 0, 3, 0, 5])
