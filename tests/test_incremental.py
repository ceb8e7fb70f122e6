"""The incrementalization pass (timerlc/passes/incremental.py): which window reductions
become recurrences, which stay, and that the outputs stay those of the program as written
(the reference interpreter on the unoptimized program) on the reference and the cpu backend.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sympy
from rtl_helpers import src

from timerlc.compiler import compile_plan, run_passes
from timerlc.diagnostics import Source
from timerlc.frontend.check import check_source
from timerlc.ir import index as ix
from timerlc.ir.pdg import Range
from timerlc.ir.serialize import from_text, to_text
from timerlc.passes.forward import forward_merge_reads
from timerlc.passes.incremental import incrementalize
from timerlc.poly import isl as pisl
from timerlc.poly.checks import check_all
from timerlc.reference.interpreter import outputs, run_graph
from timerlc.runtime.cpu import CpuRuntime
from timerlc.schedule.build import build_schedule

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"


def checked(text: str, **sets):
    overrides = {k: str(v) for k, v in sets.items()}
    return check_source(Source("p.rtl", src(text)), overrides=overrides)


def windowed(graph) -> list[str]:
    """The ops of the nodes that read a slice whose length depends on a dim."""
    return sorted(
        n.op
        for n in graph.nodes
        if any(isinstance(a, Range) and not a.is_static for e in n.inputs for a in e.access)
    )


def optimized(graph):
    """The whole pipeline, checked after this pass and at the end; its IR text round-trips."""

    def on_stage(name, g):
        if name == "incremental":
            check_all(g)

    opt = run_passes(graph, on_stage)
    check_all(opt)
    assert to_text(from_text(to_text(opt))) == to_text(opt)
    return opt


def assert_same(got: dict, want: dict, what: str):
    assert got.keys() == want.keys()
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype and g.shape == w.shape, (what, k)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=f"{what}: {k}")
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{what}: {k}")


def cpu_outputs(graph) -> dict[str, np.ndarray]:
    rt = CpuRuntime(compile_plan(graph))
    rt.run()
    return {name: rt.value(name) for name in graph.outputs}


def same_as_reference(graph, opt):
    """The optimized graph on the reference and on the cpu backend gives the outputs of the
    program as written."""
    want = outputs(run_graph(run_passes(graph, optimize=False)))
    assert_same(outputs(run_graph(opt)), want, "reference, optimized")
    assert_same(cpu_outputs(opt), want, "cpu")
    return want


H = """
config I = 3, T = 20, gamma = 0.9
dim i < I
dim t < T
x[i, t] = sin(0.9 * f32(t) + f32(i)) + 0.2 * f32(t % 4)
"""

# equations of y whose window reduction becomes a recurrence along t
REWRITTEN = {
    "discounted suffix": "y[i, t] = discounted_sum(x[i, t:T], gamma)",
    "sum suffix": "y[i, t] = sum(x[i, t:T])",
    "sum prefix": "y[i, t] = sum(x[i, 0:t+1])",
    "sum prefix from i": "y[i, t] = sum(x[i, i:t+1]) when t >= i",
    "sum suffix from t+1": "y[i, t] = sum(x[i, t+1:T]) when t < T - 1",
    "mean suffix": "y[i, t] = mean(x[i, t:T])",
    "mean prefix": "y[i, t] = mean(x[i, 0:t+1])",
    "max prefix": "y[i, t] = max(x[i, 0:t+1])",
    "min prefix": "y[i, t] = min(x[i, 0:t+1])",
    "max suffix": "y[i, t] = max(x[i, t:T])",
    "int sum prefix": "k[i, t] = (t * 7 + i) % 5 - 2\ny[i, t] = sum(k[i, 0:t+1])",
    "segmented sum": "y[i, t] = sum(x[i, (t // 4) * 4:t+1])",
    "discounted suffix, piece": "y[i, t] = discounted_sum(x[i, t:T], gamma) when t >= 5\n"
    "y[i, t] = 0.0",
}


@pytest.mark.parametrize("eq", REWRITTEN.values(), ids=REWRITTEN.keys())
def test_window_reductions_become_recurrences(eq):
    graph = checked(H + eq + "\nout y\n")
    assert windowed(run_passes(graph, optimize=False))
    opt = optimized(graph)
    assert windowed(opt) == []
    assert any(_reads_a_neighbour(opt, n) for n in opt.nodes)
    same_as_reference(graph, opt)


def _reads_a_neighbour(graph, n) -> bool:
    """n reads a merge at t + 1 or t - 1 (a recurrence along t)."""
    for e in n.inputs:
        src = graph.node(e.src)
        if src.op == "merge" and "t" in src.dims and len(e.access) == len(src.dims):
            a = e.access[src.dims.index("t")]
            if not isinstance(a, Range) and str(a.expr) in ("t + 1", "t - 1"):
                return True
    return False


def test_the_pass_keeps_ids_names_and_consumers():
    graph = forward_merge_reads(
        run_passes(
            checked(
                H
                + "y[i, t] = sum(x[i, t:T])\n"
                + "z[i, t] = 2.0 * sum(x[i, 0:t+1]) + y[i, t]\n"
                + "out y, z\n"
            ),
            optimize=False,
        )
    )
    after = incrementalize(graph)
    assert [n.id for n in after.nodes] == list(range(len(after.nodes)))
    assert after.nodes[: len(graph.nodes)] != graph.nodes
    assert after.tensors == graph.tensors and after.outputs == graph.outputs
    for n in graph.nodes:
        if n.op == "sum":
            # R's id now holds the value (an f32 cast of the f64 running sum)
            new = after.node(n.id)
            assert new.op == "cast" and new.types == n.types and new.domain == n.domain
            (acc,) = new.inputs
            y = after.node(acc.src)
            assert y.op == "merge" and y.types[0].dtype == "f64" and len(y.inputs) == 2
    check_all(after)
    assert_same(outputs(run_graph(after)), outputs(run_graph(graph)), "reference")


def test_a_one_equation_tensor_becomes_the_recurrence_itself():
    graph = forward_merge_reads(
        run_passes(
            checked(H + "y[i, t] = discounted_sum(x[i, t:T], gamma)\nout y\n"), optimize=False
        )
    )
    after = incrementalize(graph)
    y = after.node(after.tensor("y").node)
    assert y.op == "merge" and len(y.inputs) == 2
    base, rec = y.inputs
    assert str(base.cond) == "Eq(t, 19)" and base.src == graph.tensor("x").node
    step = after.node(rec.src)
    assert step.op == "add"
    (scaled,) = [after.node(e.src) for e in step.inputs if after.node(e.src).op == "mul"]
    assert any(e.src == y.id and str(e.access[1].expr) == "t + 1" for e in scaled.inputs)
    check_all(after)


def test_a_recurrence_that_reads_its_own_window():
    # z[t] reads z[0:t]: the running sum reads z[t-1], which reads the running sum
    graph = checked(
        """
        config T = 20
        dim t < T
        z[0] = 1.0
        z[t] = 0.5 * sum(z[0:t]) + 0.25 * f32(t % 3)
        out z
        """
    )
    opt = optimized(graph)
    assert windowed(opt) == []
    same_as_reference(graph, opt)


def test_a_window_that_starts_longer_than_one_point_keeps_one_reduction_at_the_start():
    graph = checked(H + "y[i, t] = sum(x[i, 0:t+1]) when t >= 3\nout y\n")
    opt = optimized(graph)
    assert windowed(opt) == ["sum"]
    (start,) = [n for n in opt.nodes if n.op == "sum"]
    # the window x[i, 0:4], once per i
    assert pisl.domain_set(start.domain).is_equal(
        pisl.cond_set(("i", "t"), ix.box([("i", 3)]) & sympy.Eq(ix.sym("t"), 3))
    )
    same_as_reference(graph, opt)


def test_vector_points_summed_along_the_window_only():
    graph = checked(
        """
        config T = 15
        dim t < T
        v[t] = stack([sin(f32(t)), cos(f32(t)), f32(t % 5)])
        w[t] = sum(v[0:t+1], 0)
        a[t] = sum(v[0:t+1])
        out w, a
        """
    )
    opt = optimized(graph)
    assert windowed(opt) == ["sum"]  # `a` reduces every axis: left alone
    same_as_reference(graph, opt)


def test_the_gradient_of_a_discounted_sum_is_a_forward_recurrence():
    graph = checked(
        """
        config T = 16, gamma = 0.9
        dim t < T
        params p { w : f32[] = 0.5 }
        x[t] = sin(p.w * f32(t))
        y[t] = discounted_sum(x[t:T], gamma)
        loss = sum(y[0:T] * f32(arange(T)))
        g = grad(loss, p)
        out g, loss
        """
    )
    lowered = run_passes(graph, optimize=False)
    assert "discounted_sum" in windowed(lowered)
    assert any(n.op == "discounted_sum" and n.attr("reverse") for n in lowered.nodes)
    opt = optimized(graph)
    assert windowed(opt) == []
    same_as_reference(graph, opt)


LEFT_ALONE = {
    "sliding discounted": ("y[i, t] = discounted_sum(x[i, t:min(t+3, T)], gamma)", "discounted"),
    "growing then sliding": ("y[i, t] = mean(x[i, max(0, t-4):t+1])", "mean"),
    "discounted prefix": ("y[i, t] = discounted_sum(x[i, 0:t+1], gamma)", "discounted"),
    "logsumexp": ("y[i, t] = logsumexp(x[i, 0:t+1])", "logsumexp"),
    "window on the same dim twice": ("y[i, t] = sum(x[i, t:T]) + sum(x[t % 3, t:T])", None),
}


@pytest.mark.parametrize("eq, op", LEFT_ALONE.values(), ids=LEFT_ALONE.keys())
def test_windows_that_are_left_alone(eq, op):
    graph = checked(H + eq + "\nout y\n")
    before = windowed(run_passes(graph, optimize=False))
    opt = optimized(graph)
    if op is None:  # the first window is rewritten; x[t % 3, t:T] is not (t is read twice)
        assert windowed(opt) == ["sum"] and len(before) == 2
    else:
        assert windowed(opt) == before
        assert all(o.startswith(op) for o in windowed(opt))
    same_as_reference(graph, opt)


@pytest.mark.parametrize(
    "eq",
    [
        "y[b, t] = discounted_sum(r[b, t:T], gamma)",
        "y[b, t] = sum(r[b, 0:t+1])",
        "y[b, t] = mean(r[b, t:T])",
    ],
)
def test_f32_over_a_long_horizon(eq):
    graph = checked(
        f"""
        config B = 4, T = 500, gamma = 0.99
        dim b < B
        dim t < T
        r[b, t] = sin(0.37 * f32(t * (b + 1))) + 0.01 * f32(b) - 0.005
        {eq}
        out y
        """
    )
    opt = optimized(graph)
    assert windowed(opt) == []
    want = outputs(run_graph(run_passes(graph, optimize=False)))["y"]
    np.testing.assert_allclose(cpu_outputs(opt)["y"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outputs(run_graph(opt))["y"], want, rtol=1e-5, atol=1e-6)


def test_returns_program_discounted_sum_is_a_backward_loop_over_t():
    text = (PROGRAMS / "returns.rtl").read_text()
    graph = check_source(Source("returns.rtl", text))
    opt = optimized(graph)
    nid = opt.tensor("g_ds").node
    sched = build_schedule(opt)
    st = sched.statements[nid]
    assert st.loops == ("t",) and st.vector == ("i", "b")
    assert "discounted_sum" not in [opt.node(k).op for k in st.body]
    # the loop over t counts down: its time coordinate is -t
    assert any("-1 * d_t" in c for c in sched.times[nid])
    want = same_as_reference(graph, opt)
    np.testing.assert_allclose(want["g_ds"], want["g_nd"], rtol=1e-5, atol=1e-5)
