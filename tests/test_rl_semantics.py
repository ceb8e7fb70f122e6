"""RL semantics in programs (LANGUAGE.md sections 7 and 10): the order of environment
calls, failures inside environments, bad --env, and where random draws come from."""

from pathlib import Path

import env_plugins
import numpy as np
import pytest
from click.testing import CliRunner

from timerlc import rng
from timerlc.cli import cli
from timerlc.compiler import run_passes
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.reference.interpreter import outputs, run_graph
from timerlc.runner import run_reference

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def plugins_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    env_plugins.LOG.clear()


def graph_of(text, **sets):
    return run_passes(check_source(Source("p.rtl", text), {k: str(v) for k, v in sets.items()}))


RECORDED = """
config I = 2, B = 2, T = 3
dim i < I
dim b < B
dim t < T
env E = "env_plugins:make_recorder" batch b
# g is declared first and read backward in t: it asks for the last step before the first
g[i, b, T-1] = r[i, b, T-1]
g[i, b, t] = r + g[i, b, t+1]
o[i, b, 0] = E.reset()
o[i, b, t+1], r[i, b, t], d[i, b, t] = E.step((t + b) % 3)
s[i] = sum(g[i, 0:B, 0])
out g
metric s
"""


def test_environment_calls_happen_in_the_order_of_their_first_output():
    out = outputs(run_graph(graph_of(RECORDED)))
    steps = [("step", (t % 3, (t + 1) % 3)) for t in range(3)]
    assert env_plugins.LOG == [("reset",)] + steps + [("reset",)] + steps
    # reward = action: g[b, 0] = sum over t of (t + b) % 3
    np.testing.assert_array_equal(out["g"][:, :, 0], [[3, 3], [3, 3]])


def test_an_environment_that_raises_stops_the_run_and_keeps_the_metrics(tmp_path):
    graph = graph_of(RECORDED.replace("make_recorder", "make_recorder?fail_at=5"))
    metrics = tmp_path / "m.csv"
    with pytest.raises(RunError, match="recorder fails at step 5"):
        run_reference(graph, None, str(metrics))
    assert metrics.read_text().splitlines() == ["name,i,value", "s,0,6.0"]


def test_cli_reports_an_environment_failure_with_exit_3(tmp_path):
    p = tmp_path / "p.rtl"
    p.write_text(RECORDED.replace("make_recorder", "make_recorder?fail_at=2"))
    r = CliRunner().invoke(cli, ["run", str(p), "--no-progress"])
    assert r.exit_code == 3, r.output
    assert "environment 'E' raised RuntimeError" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["--env", "E=nope"], ["'E'", "nope"]),
        (["--env", "E=cartpole?bogus=1"], ["bogus"]),
        (["--env", "F=cartpole"], ["no env 'F'"]),
    ],
)
def test_bad_env_is_a_program_error_at_the_env(tmp_path, args, words):
    p = tmp_path / "p.rtl"
    p.write_text(RECORDED)
    r = CliRunner().invoke(cli, ["check", str(p), *args])
    assert r.exit_code == 1, r.output
    first = r.stderr.splitlines()[0]
    assert first.startswith(f"{p}:6:5: error: "), first
    for w in words:
        assert w in first, first


def test_a_discrete_environment_refuses_float_actions(tmp_path):
    text = RECORDED.replace("E.step((t + b) % 3)", "E.step(0.5)")
    p = tmp_path / "p.rtl"
    p.write_text(text)
    r = CliRunner().invoke(cli, ["check", str(p)])
    assert r.exit_code == 1 and "discrete actions" in r.stderr, r.stderr


def test_environment_attributes_are_compile_time_ints():
    g = graph_of(
        """
        config B = 2
        dim b < B
        env E = "trivial?obs=3x4&actions=5" batch b
        o[b] = zeros([E.obs_shape])
        n = E.obs_dim + E.num_actions
        out o, n
        """
    )
    out = outputs(run_graph(g))
    assert out["o"].shape == (2, 3, 4) and int(out["n"]) == 12 + 5


def test_draws_depend_only_on_seed_site_and_point():
    text = """
    config T = 4, seed = 11
    dim t < T
    y[T-1] = sum(x[T-1])
    y[t] = sum(x[t]) + y[t+1]
    x[t] = normal([2])
    out x
    """
    x = outputs(run_graph(graph_of(text)))["x"]
    site = rng.site_id("x#0#0#normal#")
    for t in range(4):
        np.testing.assert_array_equal(x[t], rng.normal(11, site, (t,), (4,), (2,)))
    # the same draws whatever else the program computes, and in whatever order
    alone = "config T = 4, seed = 11\ndim t < T\nx[t] = normal([2])\nout x"
    again = outputs(run_graph(graph_of(alone)))
    np.testing.assert_array_equal(again["x"], x)
    other = outputs(run_graph(graph_of(text, seed=12)))["x"]
    assert not np.array_equal(other, x)


def test_each_call_site_draws_its_own_stream():
    out = outputs(
        run_graph(
            graph_of(
                """
                config T = 3
                dim t < T
                def noise() { uniform([2]) }
                a[t] = noise()
                b[t] = noise() + 0.0 * uniform([2])
                c[t] = noise()
                c2[t] = noise() + noise() * 0.0
                out a, b, c, c2
                """
            )
        )
    )
    assert not np.array_equal(out["a"], out["b"]) and not np.array_equal(out["a"], out["c"])
    np.testing.assert_array_equal(out["a"], out["a"])
    assert np.all((out["a"] >= 0) & (out["a"] < 1))


def test_random_initializers_draw_one_site_per_field():
    out = outputs(
        run_graph(
            graph_of(
                """
                params p {
                  w : f32[4, 3] = glorot
                  v : f32[4, 3] = glorot
                  q : f32[3, 3] = orthogonal(2.0)
                  n : f32[1000] = normal(0.1)
                  u : f32[1000] = uniform(-2.0, -1.0)
                }
                out p
                """
            )
        )
    )
    limit = np.sqrt(6 / 7)
    assert np.all(np.abs(out["p.w"]) <= limit) and not np.array_equal(out["p.w"], out["p.v"])
    np.testing.assert_allclose(out["p.q"].T @ out["p.q"], 4 * np.eye(3), atol=1e-5)
    assert abs(out["p.n"].std() - 0.1) < 0.01
    assert out["p.u"].min() >= -2 and out["p.u"].max() < -1


def _check(tmp_path, text):
    p = tmp_path / "p.rtl"
    p.write_text(text)
    return CliRunner().invoke(cli, ["check", str(p)])


ORDERED = """
config B = 2, T = 5
dim b < B
dim t < T
env E = "cartpole" batch b
o[b, 0] = E.reset()
o[b, t+1], r[b, t], d[b, t] = E.step(a[b, t])
"""


def test_a_cycle_through_the_order_of_environment_calls_is_an_error(tmp_path):
    # the action of step t reads what step t+1 returns, and step t+1 comes after step t
    r = _check(
        tmp_path,
        ORDERED + "a[b, t] = i32(sum(o[b, t + 2]) > 0.0) when t < T - 1\na[b, T-1] = 0\nout r\n",
    )
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith(f"{tmp_path / 'p.rtl'}:7:31: error: cyclic definition")
    assert "E.step()" in r.stderr


def test_two_calls_at_the_same_point_of_their_first_output_are_an_error(tmp_path):
    r = _check(tmp_path, ORDERED + "a[b, t] = 0\nq[b, t] = E.reset()\nout r, q\n")
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith(f"{tmp_path / 'p.rtl'}:9:11: error: two calls of environment 'E'")


def test_envs_command_lists_the_plugins():
    r = CliRunner().invoke(cli, ["envs"])
    assert r.exit_code == 0
    names = [line.split()[0] for line in r.output.splitlines()]
    assert {"cartpole", "pendulum", "trivial", "gym:ENV_ID"} <= set(names)


def test_progress_prints_one_line_per_outer_iteration():
    import io

    from timerlc.metrics import Progress

    out = io.StringIO()
    bar = Progress("i", 3, out)
    for i in range(3):
        bar.update("ret", {"i": i}, np.float32(1.5 * i))
        bar.update("loss", {"i": i}, np.float32(0.25))
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split("  (")[0] for line in lines] == [
        "i 1/3  ret=0  loss=0.25",
        "i 2/3  ret=1.5  loss=0.25",
        "i 3/3  ret=3  loss=0.25",
    ]
