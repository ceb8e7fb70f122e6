"""The cpu backend: schedule, plan and runtime, against the reference interpreter.

Every conformance program also runs on cpu (``rtl_helpers.run`` compares them); here: every
example program at small sizes (outputs and metrics), the build folder and its plan, the
plan's errors, that the runtime never imports the compiler, and what the schedule does.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import cli, plan_run, src

from timerlc.compiler import compile_plan, run_passes
from timerlc.diagnostics import Source
from timerlc.frontend.check import check_source
from timerlc.plan.items import Call, Loop, walk
from timerlc.reference.interpreter import outputs, run_graph
from timerlc.runtime.cpu import CpuRuntime
from timerlc.runtime.plan import PlanError, load_plan
from timerlc.schedule.build import build_schedule

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
SMALL = {
    "returns": {},
    "cumsum": {},
    "window_mean": {},
    "rnn": {},
    "attention": {},
    "reinforce": {"I": 3, "B": 4, "T": 20},
    "reinforce_td": {"I": 3, "B": 4, "T": 20},
    "rnn_reinforce": {"I": 2, "B": 2, "T": 10},
    "ppo": {"total_steps": 64, "B": 2, "T": 16},
}


def graph_of(name: str, sets: dict, optimize: bool = True):
    path = PROGRAMS / f"{name}.rtl"
    overrides = {k: str(v) for k, v in sets.items()}
    return run_passes(check_source(Source(str(path), path.read_text()), overrides), None, optimize)


def both(name: str):
    """The reference on the program as written, the compiled backend under test (the cpu's,
    or ``TIMERLC_TEST_BACKEND``) on the optimized program."""
    written = graph_of(name, SMALL[name], optimize=False)
    ref_m = []
    ref = run_graph(written, lambda n, p, v: ref_m.append((n, tuple(sorted(p.items())), float(v))))
    return (ref, ref_m, *compiled(name))


def compiled(name: str):
    """The compiled backend under test on the optimized program: (its runtime, its
    metrics)."""
    cpu_m = []
    rt, _ = plan_run(
        compile_plan(graph_of(name, SMALL[name])),
        lambda n, p, v: cpu_m.append((n, tuple(sorted(p.items())), float(v))),
    )
    rt.envs.close()
    return rt, cpu_m


def test_every_program_is_covered():
    assert sorted(p.stem for p in PROGRAMS.glob("*.rtl")) == sorted(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_program_on_cpu_equals_reference(name):
    graph = graph_of(name, SMALL[name])
    ref, ref_m, rt, cpu_m = both(name)
    for out in graph.outputs:
        want, got = ref.value(out), rt.value(out)
        assert got.dtype == want.dtype and got.shape == want.shape, out
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=out)
    assert graph.metrics and len(cpu_m) == len(ref_m) > 0
    for (n1, p1, v1), (n2, p2, v2) in zip(sorted(ref_m), sorted(cpu_m)):
        assert (n1, p1) == (n2, p2)
        assert np.isclose(v1, v2, rtol=1e-5, atol=1e-6, equal_nan=True), (n1, p1, v1, v2)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_program_metrics_stream_in_the_order_of_their_first_dim(name):
    # a metric is reported as its points are computed: the iteration loop runs them, not a
    # batched op after the whole run
    _, cpu_m = compiled(name)  # (the reference's are the other test's)
    for dim in {p[0][0] for _, p, _ in cpu_m if p}:
        firsts = [p[0][1] for _, p, _ in cpu_m if p and p[0][0] == dim]
        assert firsts == sorted(firsts), [(n, p) for n, p, _ in cpu_m]


def schedule_of(text: str):
    graph = run_passes(check_source(Source("p.rtl", src(text))))
    s = build_schedule(graph)
    by_name = {graph.node(nid).name: st for nid, st in s.statements.items()}
    return graph, s, by_name


def test_schedule_vectorizes_what_no_recurrence_needs():
    _, _, st = schedule_of(
        """
        config I = 3, B = 4, T = 8
        dim i < I
        dim b < B
        dim t < T
        r[i, b, t] = f32(t + b + i)
        g[i, b, T-1] = r[i, b, T-1]
        g[i, b, t] = r + 0.9 * g[i, b, t+1]
        m[i] = mean(g[i, 0:B, 0:T])
        out r, g, m
        """
    )
    assert st["r"].vector == ("i", "b", "t") and st["r"].loops == ()
    assert st["g"].loops == ("t",) and st["g"].vector == ("i", "b")
    assert st["m"].vector == ("i",)


def test_schedule_runs_a_backward_recurrence_with_a_backward_loop():
    graph, s, st = schedule_of(
        """
        config T = 6
        dim t < T
        r[t] = f32(t)
        g[T-1] = r[T-1]
        g[t] = r + 0.5 * g[t+1]
        out g
        """
    )
    gid = next(nid for nid, x in s.statements.items() if graph.node(nid).name == "g")
    loops = [it for it in s.tree if isinstance(it, Loop) and _calls(it, gid)]
    assert len(loops) == 1 and loops[0].init < 0  # the loop counts -(T-1) .. 0


def test_schedule_falls_back_to_isl_for_a_wavefront_only_a_skewed_loop_orders():
    # x[i, j] reads x[i-1, j+1] and x[i+1, j-2]: no loop along one dim (either way) orders
    # both, but a loop along i + j does; isl's scheduler finds it
    text = """
        config N = 7
        dim i < N
        dim j < N
        x[0, j] = f32(j)
        x[i, N-1] = f32(i)
        x[i, j] = x[i-1, j+1] + 0.5 * x[i+1, j-2] when i + 1 < N and j >= 2
        x[i, j] = x[i-1, j+1] + 1.0
        out x
        """
    graph, s, st = schedule_of(text)
    assert st["x"].loops == ("i", "j")
    xid = next(nid for nid in s.statements if graph.node(nid).name == "x")
    assert any(not isinstance(a, str) for a in _call_args(s.tree, xid))  # i, j from the skew
    want = run_graph(check_source(Source("p.rtl", src(text)))).value("x")
    rt = CpuRuntime(compile_plan(graph))
    rt.run()
    np.testing.assert_allclose(rt.value("x"), want, rtol=1e-6)


@pytest.mark.parametrize(
    "text",
    [
        # outward from a seed in the middle: backward on the left, forward on the right
        """
        config I = 3, B = 2, T = 6
        dim i < I
        dim b < B
        dim t < T
        x[i, b, T // 2] = f32(i + b)
        x[i, b, t] = x[i, b, t+1] * 2.0 + f32(b) when t < T // 2
        x[i, b, t] = x[i, b, t-1] * 3.0 - f32(i)
        y[i] = sum(x[i, 0:B, 0:T])
        out x, y
        """,
        # odd points of c read d backward, d reads c two steps back
        """
        config T = 6
        dim t < T
        c[t] = 1.0 + f32(t) when t % 2 == 0
        c[t] = d[T-1-t]
        d[t] = c[max(0, t-2)] * 0.5
        out c, d
        """,
    ],
)
def test_schedule_runs_point_by_point_what_no_loop_orders(text):
    graph, s, st = schedule_of(text)
    assert st["x" if "x" in st else "c"].vector == ()
    want = outputs(run_graph(check_source(Source("p.rtl", src(text)))))
    rt = CpuRuntime(compile_plan(graph))
    rt.run()
    for name, value in want.items():
        np.testing.assert_allclose(rt.value(name), value, rtol=1e-6, err_msg=name)


def _call_args(items, sid) -> tuple:
    for it in walk(items):
        if isinstance(it, Call) and it.statement == sid:
            return it.args
    return ()


def _calls(item, sid) -> bool:
    return any(isinstance(it, Call) and it.statement == sid for it in walk([item]))


def test_schedule_puts_the_rollout_and_the_update_in_one_iteration_loop():
    graph = graph_of("reinforce", SMALL["reinforce"])
    s = build_schedule(graph)
    st = {graph.node(nid).name: x for nid, x in s.statements.items() if graph.node(nid).name}
    assert st["o"].loops == ("i", "t") and st["o"].vector == ("b",)  # acting: one step at a time
    # after the rollout, inside the iteration: one batched op over every env and step
    # (the log-softmax's logsumexp, computed in the kernel of the statement that reads it)
    batched = [
        graph.node(k).op for x in s.statements.values() if x.vector == ("b", "t") for k in x.body
    ]
    assert "logsumexp" in batched and all(
        x.loops == ("i",) for x in s.statements.values() if x.vector == ("b", "t")
    )


def test_compile_writes_a_plan_that_runs_without_recompiling(tmp_path):
    prog = PROGRAMS / "returns.rtl"
    build = tmp_path / "build"
    r = cli("compile", prog, "--backend", "cpu", "-o", build)
    assert r.exit_code == 0, r.output
    plan = json.loads((build / "plan.json").read_text())
    assert plan["format_version"] == 3 and plan["tree"] and plan["statements"]
    r1 = cli("run", build, "--outputs", tmp_path / "a.npz", "--no-progress")
    r2 = cli("run", prog, "--backend", "reference", "--outputs", tmp_path / "b.npz")
    assert r1.exit_code == 0 and r2.exit_code == 0, r1.output + r2.output
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert set(a.files) == set(b.files)
    for k in a.files:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_runtime_never_imports_the_compiler(tmp_path):
    build = tmp_path / "build"
    assert (
        cli(
            "compile",
            PROGRAMS / "reinforce.rtl",
            "--backend",
            "cpu",
            "-o",
            build,
            "--set",
            "I=2",
            "--set",
            "B=2",
            "--set",
            "T=8",
        ).exit_code
        == 0
    )
    code = (
        "import sys\n"
        "from timerlc.runtime.plan import load_plan\n"
        "from timerlc.runner import run_plan\n"
        f"run_plan(load_plan({str(build)!r}))\n"
        "shared = ('timerlc.plan', 'timerlc.plan.items', 'timerlc.plan.expr')\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('islpy', 'lark', 'sympy') or\n"
        "       m.startswith(('timerlc.frontend', 'timerlc.passes', 'timerlc.poly',\n"
        "                     'timerlc.schedule', 'timerlc.plan', 'timerlc.reference',\n"
        "                     'timerlc.ir')) and m not in shared]\n"
        "print(bad)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "content, words",
    [
        ('{"format_version": 99}', ["format 99", "compile the program again"]),
        ("not json at all", ["not a valid plan"]),
        ('{"format_version": 3, "dims": {}}', ["missing"]),
        ('{"format_version": 2, "dims": {}}', ["format 2", "compile the program again"]),
        ("[1, 2]", ["not a timerlc plan"]),
    ],
)
def test_a_bad_plan_is_a_clear_error(tmp_path, content, words):
    build = tmp_path / "build"
    assert cli("compile", PROGRAMS / "cumsum.rtl", "--backend", "cpu", "-o", build).exit_code == 0
    (build / "plan.json").write_text(content)
    r = cli("run", build, "--no-progress")
    assert r.exit_code == 2
    assert r.stderr.startswith("timerlc: error:")
    for w in words:
        assert w in r.stderr, r.stderr


def test_load_plan_of_a_missing_folder(tmp_path):
    with pytest.raises(PlanError, match="timerlc compile"):
        load_plan(tmp_path)


def test_run_time_failure_names_the_first_failing_point_of_a_batched_op(tmp_path):
    # x runs as one op over every t; t = 2 .. 5 index out of range, and t = 2 is reported
    p = tmp_path / "p.rtl"
    p.write_text(
        "config T = 6\ndim t < T\nv[t] = zeros([3])\n"
        "k[t] = i32(floor(exp(f32(t))))\nx[t] = v[t][k[t]]\nout x\n"
    )
    r = cli("run", p, "--backend", "cpu", "--no-progress")
    assert r.exit_code == 3
    assert "while computing x at t=2 (line 5)" in r.stderr and "out of range" in r.stderr


def test_profile_prints_where_the_cpu_runtime_spent_its_time(tmp_path):
    r = cli("run", PROGRAMS / "returns.rtl", "--profile", "--no-progress")
    assert r.exit_code == 0, r.stderr
    assert "cpu runtime:" in r.stderr and "statement calls" in r.stderr
    assert "g_ds loops [t] vector [i, b]" in r.stderr  # the incrementalized discounted sum
    # (and the kernels' scratch memory, which the buffers' peak leaves out: a statement's
    # kernel's own, at least 8 bytes each)
    assert re.search(r"peak buffers [^,]+, kernels' scratch reserved \d", r.stderr), r.stderr
    # (and the threads its kernels ran on: one, where no loop is large enough for the
    # pool's, runtime.pool; and the OpenBLAS kernels its products would run on)
    from timerlc.runtime.native import blas_core

    blas = f"; OpenBLAS {blas_core()}" if blas_core() else ""
    assert f"; 1 thread{blas})" in r.stderr, r.stderr


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(flag in line.split() for line in f if line.startswith("flags"))
    except OSError:
        return False


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not _cpu_has("avx2"),
    reason="OpenBLAS's Haswell kernels need an x86-64 CPU with AVX2",
)
def test_the_profile_names_the_openblas_kernels_that_OPENBLAS_CORETYPE_picks():
    """``native.blas_core`` reads the kernels from the library itself: a process started with
    ``OPENBLAS_CORETYPE=Haswell`` runs those (bench.py's header and ``run --profile`` name
    them: on an AVX-512 CPU they take 1.8x the time of its own)."""
    from timerlc.runtime.native import cblas

    if not cblas():
        pytest.skip("no OpenBLAS with 64-bit integers in this numpy")
    code = "from timerlc.runtime.native import blas_core; print(blas_core())"
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Haswell"
