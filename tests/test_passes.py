"""The optimization passes, one by one: what each removes or rewrites, and that the
program's outputs stay those of the program as written (the reference interpreter)."""

from __future__ import annotations

import numpy as np
from rtl_helpers import src

from timerlc.compiler import run_passes
from timerlc.diagnostics import Source
from timerlc.frontend.check import check_source
from timerlc.passes.narrow import narrow
from timerlc.passes.pipeline import PASSES
from timerlc.passes.simplify import simplify
from timerlc.poly import isl as pisl
from timerlc.reference.interpreter import outputs, run_graph


def checked(text: str):
    return run_passes(check_source(Source("p.rtl", src(text))), optimize=False)


def ops(graph) -> list[str]:
    return sorted(n.op for n in graph.nodes)


def same_outputs(before, after):
    want, got = outputs(run_graph(before)), outputs(run_graph(after))
    assert want.keys() == got.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_pipeline_names_are_the_dump_file_names():
    assert [name for name, _ in PASSES] == [
        "autodiff",
        "forward",
        "incremental",
        "noise",
        "simplify",
        "narrow",
    ]


def test_simplify_reads_through_copies_with_the_composed_access():
    g = checked(
        """
        config T = 6
        dim t < T
        x[t] = sin(f32(t))
        y[t] = x[t]
        z[t] = y[T-1-t] * 2.0
        out z
        """
    )
    s = simplify(g)
    assert "copy" not in ops(s) and len(s.nodes) < len(g.nodes)
    (z,) = [n for n in s.nodes if n.name == "z"]
    mul = s.node(z.inputs[0].src)
    reads = {s.node(e.src).op: e.access for e in mul.inputs}
    assert "sin" in reads  # y's merge and copy are gone: z reads x's value at T-1-t
    same_outputs(g, s)


def test_simplify_shares_common_subexpressions():
    g = checked(
        """
        config T = 4
        dim t < T
        a[t] = exp(f32(t)) + 1.0
        b[t] = exp(f32(t)) + 1.0
        out a, b
        """
    )
    s = simplify(g)
    assert ops(s).count("exp") == 1 and ops(s).count("add") == 1
    same_outputs(g, s)


def test_a_normalization_sums_its_values_once():
    """``(x - mean(x)) / std(x)`` (PPO's advantages): ``std`` over every axis takes the
    scalar ``mean(x)``, so that the deviations and their mean are the numerator's (one mean,
    one subtraction); over some axes it keeps its own (keepdims, broadcast back)."""
    g = checked(
        """
        config T = 4
        dim t < T
        x[t] = f32(arange(6)) * f32(t) + 1.0
        y[t] = (x[t] - mean(x[t])) / (std(x[t], ddof=1) + 1e-8)
        m = reshape(f32(arange(6)), [2, 3])
        z = (m - mean(m, axis=1, keepdims=true)) / std(m, axis=1, keepdims=true)
        out y, z
        """
    )
    s = simplify(g)
    assert ops(s).count("mean") == 2 and ops(s).count("sub") == 2
    same_outputs(g, s)


def test_simplify_drops_what_no_output_metric_or_environment_needs():
    g = checked(
        """
        config T = 4
        dim t < T
        unused[t] = tanh(f32(t))
        y[t] = f32(t) * 3.0
        out y
        """
    )
    s = simplify(g)
    assert "tanh" not in ops(s)
    assert [t.name for t in s.tensors if t.name == "unused"] == []
    same_outputs(g, s)


def test_simplify_computes_only_the_branch_a_config_flag_picks():
    """``where(flag, a, b)`` over a constant flag reads the branch it picks (PPO's
    ``where(clip_vloss, ...)``: the unclipped value loss was computed at every step); a
    branch that is broadcast to the where's shape is kept as a where."""
    g = checked(
        """
        config T = 4, on = true, off = false
        dim t < T
        a[t] = where(on, tanh(f32(t)), exp(f32(t)))
        b[t] = where(off, sin(f32(t)), cos(f32(t)) * 2.0)
        c[t] = where(on, 2.0, ones([3]) * f32(t))
        out a, b, c
        """
    )
    s = simplify(g)
    assert "exp" not in ops(s) and "sin" not in ops(s)
    assert "tanh" in ops(s) and "cos" in ops(s)
    assert ops(s).count("where") == 1  # c's: its picked branch is a scalar, c[t] a vector
    same_outputs(g, s)


def test_simplify_keeps_environment_calls_nobody_reads():
    g = checked(
        """
        config B = 2, T = 3
        dim b < B
        dim t < T
        env E = "trivial" batch b
        o[b, 0] = E.reset()
        o[b, t+1], r[b, t], d[b, t] = E.step(0)
        y = 1.0
        out y
        """
    )
    s = simplify(g)
    assert ops(s).count("env_reset") == 1 and ops(s).count("env_step") == 1


def test_simplify_keeps_outputs_and_metrics_named():
    g = checked(
        """
        config I = 3
        dim i < I
        l[i] = f32(i) * 0.5
        m[i] = l[i]
        metric m
        out l
        """
    )
    s = simplify(g)
    names = {t.name for t in s.tensors}
    assert {"l", "m"} <= names
    same_outputs(g, s)


def test_simplify_reads_a_reshape_s_input_where_it_is_read_at_other_points():
    """A reshape read at other points (PPO's ``take(flat_o[j // K], ...)``, where ``flat_o[i]``
    reshapes the rollout's observations) becomes a reshape of its input at the composed
    points, computed with the reader: the reshaped copy is not a tensor of its own (at
    3x256x256 observations, 1.5 GiB of PPO's); a reshape of a reshape is one reshape."""
    g = checked(
        """
        config I = 2, K = 3, B = 3, T = 4
        dim i < I
        dim j < I * K
        dim b < B
        dim t < T
        o[i, b, t] = sin(f32(arange(6)) + f32(i * 100 + b * 10 + t))
        grid[i, b, t] = reshape(o, [2, 3])
        flat[i] = reshape(grid[i, 0:B, 0:T], [B * T, 6])
        idx[j] = (arange(3) * 5 + j) % (B * T)
        rows[j] = take(flat[j // K], idx[j], 0) * 2.0
        out rows
        """
    )
    s = simplify(g)
    reshapes = [n for n in s.nodes if n.op == "reshape"]
    assert len(reshapes) == 1 and reshapes[0].dims == ("j",)
    (read,) = reshapes[0].inputs
    assert s.node(read.src).op == "sin"  # o's values, at [j // K, 0:B, 0:T]
    assert not any(n.name == "flat" for n in s.nodes)
    same_outputs(g, s)


def test_simplify_sums_per_point_weight_gradients_as_one_product():
    """A layer applied at every point has, after autodiff, a weight gradient per point (an
    outer product) summed over the points: simplify makes it one product of the points'
    values stacked as rows, and no per-point gradient is left."""
    g = checked(
        """
        config I = 2, B = 3, T = 5
        dim i < I
        dim b < B
        dim t < T
        params net[i] {
          w : f32[4, 3] = glorot
        }
        x[b, t] = sin(f32(arange(4)) + f32(b * 7 + t))
        y[i, b, t] = tanh(x[b, t] @ net[i].w)
        loss[i] = mean(y[i, 0:B, 0:T] * y[i, 0:B, 0:T])
        net[i+1] = adam(net[i], grad(loss[i], net[i]), 0.1)
        out loss
        """
    )
    s = simplify(g)
    per_point = [n for n in g.nodes if n.op == "matmul" and n.type.shape == (4, 3)]
    assert per_point and set(per_point[0].dims) == {"i", "b", "t"}
    (product,) = [n for n in s.nodes if n.op == "matmul" and n.type.shape == (4, 3)]
    assert product.dims == ("i",)  # one per iteration, over the stacked rows
    a, b = (s.node(e.src) for e in product.inputs)
    assert a.op == "transpose" and a.type.shape == (4, 15) and b.type.shape == (15, 3)
    want, got = outputs(run_graph(g)), outputs(run_graph(s))
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)


def test_noise_splits_categorical_into_noise_and_argmax_drawing_the_same_samples():
    text = """
        config B = 3, T = 5
        dim b < B
        dim t < T
        logits[b, t] = stack([f32(b) * 0.3, f32(t) * 0.2, 0.1])
        a[b, t] = categorical(logits[b, t])
        out a
        """
    g = checked(text)
    s = run_passes(check_source(Source("p.rtl", src(text))))
    assert "random_categorical" in ops(g) and "random_categorical" not in ops(s)
    assert "random_gumbel" in ops(s) and "argmax" in ops(s)
    same_outputs(g, s)


def test_schedule_draws_the_acting_noise_once_per_iteration():
    from pathlib import Path

    from timerlc.schedule.build import build_schedule

    path = Path(__file__).resolve().parent.parent / "programs" / "reinforce.rtl"
    sets = {"I": "3", "B": "2", "T": "5"}
    graph = run_passes(check_source(Source(str(path), path.read_text()), sets))
    sched = build_schedule(graph)
    (noise,) = [s for nid, s in sched.statements.items() if graph.node(nid).op == "random_gumbel"]
    assert noise.loops == ("i",) and noise.vector == ("b", "t")


def _domain_size(node) -> int:
    return pisl.domain_set(node.domain).count_val().to_python()


def _node(graph, op: str):
    (n,) = [n for n in graph.nodes if n.op == op]
    return n


def test_narrow_computes_a_tensor_only_at_the_points_read():
    """PPO's diagnostics: a per-step value read only at each iteration's last step (a
    stride of K along ``j``) is computed there only, and so are its inputs that nothing
    else reads; an output keeps its domain."""
    g = checked(
        """
        config I = 5, K = 4
        dim i < I
        dim j < I * K
        x[j] = sin(f32(j)) * 2.0
        y[j] = exp(x[j])
        z[j] = cos(f32(j))
        last[i] = y[i * K + K - 1] + z[i * K]
        out last, z
        """
    )
    s = narrow(simplify(g))
    assert _domain_size(_node(s, "exp")) == 5 and "% 4" in str(_node(s, "exp").domain)
    assert _domain_size(_node(s, "sin")) == 5  # (read by y only)
    assert _domain_size(_node(s, "cos")) == 20  # (an output)
    same_outputs(g, s)


def test_narrow_keeps_the_points_a_recurrence_needs():
    """A recurrence read at its last point keeps every point (each reads the one before);
    a tensor read at every other point is computed there."""
    g = checked(
        """
        config T = 6, K = 3
        dim t < T
        dim k < K
        x[0] = 1.0
        x[t] = x[t-1] * 0.5 + f32(t)
        h[t] = cos(f32(t))
        s[k] = h[2 * k + 1] * 2.0
        last = x[T-1] + s[0] + s[2]
        out last
        """
    )
    s = narrow(simplify(g))
    assert _domain_size(_node(s, "cos")) == 3  # (t odd)
    (step,) = [n for n in s.nodes if n.op == "mul" and n.dims == ("t",)]
    assert _domain_size(step) == 5  # (x[t] for t >= 1: all of them)
    same_outputs(g, s)


def test_narrow_leaves_out_the_last_points_no_one_reads_and_the_merge_they_made():
    """The last update's gradient: a tensor read at all its points but its last (bounds
    alone) is computed there only; its merge, left one equation over all its points, passes
    it on and is bypassed (``simplify`` after the narrowing): no zeros at the last point,
    no copy of the others."""
    g = checked(
        """
        config N = 5
        dim j < N
        g[N-1] = 0.0
        g[j] = cos(f32(j))
        w[0] = 1.0
        w[j] = w[j-1] - 0.1 * g[j-1]
        out w
        """
    )
    before = simplify(g)
    s = narrow(before)
    assert _domain_size(_node(before, "cos")) == 4 and _domain_size(_node(s, "cos")) == 4

    def merges(graph):  # (the merges over j: g's and w's)
        return [n for n in graph.nodes if n.op == "merge" and n.dims == ("j",)]

    assert len(merges(before)) == 2 and len(merges(s)) == 1  # (w's only)
    same_outputs(g, s)


def test_narrow_drops_a_merge_branch_that_holds_at_no_point_left():
    """``x[0]``'s equation holds at no point that is read (only ``x[2]`` and ``x[4]``): the
    merge loses that branch, and what only it read is dead."""
    g = checked(
        """
        config T = 6, K = 2
        dim t < T
        dim k < K
        x[0] = exp(3.0)
        x[t] = sin(f32(t))
        s[k] = x[2 * k + 2] * 2.0
        out s
        """
    )
    s = narrow(simplify(g))
    assert "exp" in ops(simplify(g)) and "exp" not in ops(s)
    assert _domain_size(_node(s, "sin")) == 2
    same_outputs(g, s)
