"""Conformance tests of defs, params records, outputs and metrics files, `timerlc check`,
and the clean refusal of what this version does not run yet (LANGUAGE.md sections 3,
5, 6 and 12).
"""

import csv
import json

import numpy as np
import pytest
from rtl_helpers import cli, close, run, write

# ============================================================================ def


def test_def_with_local_bindings():
    out = run(
        """
        config T = 3
        dim t < T
        def f(x, y) {
          a = x * 2.0
          b = a + y
          b * b
        }
        z[t] = f(f32(t), 1.0)
        out z
        """
    )
    t = np.arange(3, dtype=np.float32)
    close(out["z"], (t * 2 + 1) ** 2)


def test_def_calling_defs_and_keyword_arguments():
    out = run(
        """
        def sq(x) { x * x }
        def lin(x, w, b) { x * w + b }
        def f(x) {
          h = sq(lin(x, 2.0, 1.0))
          lin(h, b=0.5, w=-1.0)
        }
        a = f(3.0)
        b = lin(b=1.0, x=2.0, w=3.0)
        c = lin(2.0, 3.0, b=1.0)
        out a, b, c
        """
    )
    close(out["a"], np.float32(-(7.0**2) + 0.5))
    close(out["b"], np.float32(7.0))
    close(out["c"], np.float32(7.0))


def test_def_returning_a_tuple_unpacked_by_a_tuple_equation():
    out = run(
        """
        def stats(v) {
          m = mean(v)
          s = std(v)
          m, s
        }
        mu, sd = stats(f32(arange(5)))
        out mu, sd
        """
    )
    close(out["mu"], np.float32(2.0))
    close(out["sd"], np.float32(np.std(np.arange(5.0))))


def test_def_tuple_result_bound_inside_another_def():
    out = run(
        """
        def two(x) { (x + 1.0, x - 1.0) }
        def f(x) {
          a, b = two(x)
          a * b
        }
        y = f(3.0)
        out y
        """
    )
    close(out["y"], np.float32(8.0))


def test_def_is_inlined_with_tensor_arguments_and_dims():
    out = run(
        """
        config T = 4
        dim t < T
        def policy(x, w) { tanh(x @ w) }
        w = reshape(f32(arange(6)) * 0.1, [3, 2])
        x[t] = f32(arange(3)) + f32(t)
        y[t] = policy(x[t], w)
        z[t] = policy(x, w)
        out y, z
        """
    )
    w = (np.arange(6, dtype=np.float32) * np.float32(0.1)).reshape(3, 2)
    x = np.arange(3, dtype=np.float32)[None] + np.arange(4, dtype=np.float32)[:, None]
    close(out["y"], np.tanh(x @ w), rtol=1e-5)
    close(out["z"], np.tanh(x @ w), rtol=1e-5)


def test_def_parameter_shadows_a_global_name():
    out = run(
        """
        config T = 2, k = 10.0
        dim t < T
        x[t] = f32(t)
        def f(x, k) { x * k }
        y[t] = f(5.0, 2.0) + x
        out y
        """
    )
    close(out["y"], 10.0 + np.arange(2, dtype=np.float32))


def test_def_reads_configs():
    out = run(
        """
        config gamma = 0.5
        def disc(x) { x * gamma }
        y = disc(4.0)
        out y
        """
    )
    close(out["y"], np.float32(2.0))


def test_def_with_no_parameters_and_generic_over_dtype():
    out = run(
        """
        def one() { 1 }
        def double(x) { x + x }
        a = double(one())
        b = double(1.5)
        c = double(arange(3))
        out a, b, c
        """
    )
    close(out["a"], np.int32(2), np.int32)
    close(out["b"], np.float32(3.0), np.float32)
    close(out["c"], np.arange(3) * 2, np.int32)


def test_policy_def_over_a_params_record():
    out = run(
        """
        config B = 2
        dim b < B
        params net {
          w1 : f32[3, 4] = 0.1
          b1 : f32[4]    = zeros
          w2 : f32[4, 2] = ones
          b2 : f32[2]    = 0.5
        }
        def policy(p, x) {
          h = tanh(x @ p.w1 + p.b1)
          h @ p.w2 + p.b2
        }
        x[b] = f32(arange(3)) * f32(b + 1)
        logits[b] = policy(net, x[b])
        out logits
        """
    )
    x = np.arange(3, dtype=np.float32)[None] * np.array([[1], [2]], np.float32)
    h = np.tanh(x @ np.full((3, 4), 0.1, np.float32))
    close(out["logits"], h @ np.ones((4, 2), np.float32) + 0.5, rtol=1e-5)


# ============================================================================ params


def test_params_record_constant_initializers_and_out_fields():
    out = run(
        """
        config H = 3, c = 0.25
        params p {
          w : f32[2, H] = zeros
          b : f32[H]    = ones
          s : f32[]     = 1.5
          k : f32[2]    = c
          n : i32[2]    = -2
          d : f64[2]    = 0.1
        }
        out p
        """
    )
    assert set(out) >= {"p.w", "p.b", "p.s", "p.k", "p.n", "p.d"}
    close(out["p.w"], np.zeros((2, 3)), np.float32)
    close(out["p.b"], np.ones(3), np.float32)
    close(out["p.s"], np.float32(1.5), np.float32)
    close(out["p.k"], np.full(2, 0.25), np.float32)
    close(out["p.n"], np.full(2, -2), np.int32)
    close(out["p.d"], np.full(2, 0.1), np.float64, rtol=1e-15, atol=0)


def test_params_recurrence_over_a_dim():
    # net[0] comes from the initializers; net[i+1] copies (then shifts a field of) the record
    out = run(
        """
        config I = 3
        dim i < I
        params net[i] {
          w : f32[2] = 1.0
          b : f32[]  = zeros
        }
        net[i+1] = net[i]
        wsum[i] = sum(net[i].w) + net[i].b
        out net, wsum
        """
    )
    close(out["net.w"], np.ones((4, 2)), np.float32)
    close(out["net.b"], np.zeros(4), np.float32)
    close(out["wsum"], np.full(3, 2.0), np.float32)


def test_params_field_read_with_basis_shorthand():
    out = run(
        """
        config I = 2
        dim i < I
        params net[i] { w : f32[3] = 2.0 }
        net[i+1] = net[i]
        y[i] = net.w * f32(i)
        out y
        """
    )
    close(out["y"], np.arange(2, dtype=np.float32)[:, None] * np.full((1, 3), 2.0))


def test_params_record_two_dims_ppo_style_copy():
    out = run(
        """
        config I = 2, K = 2
        dim i < I
        dim k < K
        params net[i, k] { w : f32[] = 3.0 }
        net[i, k+1] = net[i, k]
        net[i+1, 0] = net[i, K]
        y[i, k] = net[i, k].w
        out y, net
        """
    )
    close(out["y"], np.full((2, 2), 3.0))
    w = np.zeros((3, 3), np.float32)
    w[:2, :] = 3.0
    w[2, 0] = 3.0
    close(out["net.w"], w)


# ============================================================================ outputs via the CLI


def test_cli_run_writes_outputs_npz(tmp_path):
    p = write(
        tmp_path,
        """
        config T = 3
        dim t < T
        params net { w : f32[2] = 0.5 }
        x[t+1] = f32(t)
        s = 4.0
        out x, s, net
        """,
    )
    o = tmp_path / "o.npz"
    r = cli("run", p, "--backend", "reference", "--outputs", o, "--no-progress")
    assert r.exit_code == 0, r.stderr
    with np.load(o) as z:
        assert set(z.files) == {"x", "s", "net.w"}
        close(z["x"], np.array([0, 0, 1, 2], np.float32), np.float32)
        close(z["s"], np.float32(4.0))
        assert z["s"].shape == ()
        close(z["net.w"], np.full(2, 0.5, np.float32))


def test_cli_run_default_backend_and_set(tmp_path):
    p = write(tmp_path, "config T = 3\ndim t < T\ny[t] = f32(t)\nout y\n")
    o = tmp_path / "o.npz"
    r = cli("run", p, "--set", "T=5", "--outputs", o, "--no-progress")
    assert r.exit_code == 0, r.stderr
    with np.load(o) as z:
        close(z["y"], np.arange(5, dtype=np.float32))


def test_cli_seed_option_sets_the_seed_config(tmp_path):
    p = write(tmp_path, "y = seed\nout y\n")
    o = tmp_path / "o.npz"
    r = cli("run", p, "--seed", "11", "--outputs", o, "--no-progress")
    assert r.exit_code == 0, r.stderr
    with np.load(o) as z:
        assert int(z["y"]) == 11


METRIC_PROGRAM = """
config I = 4
dim i < I
dim t < 3
loss[i] = f32(i) * 0.5
ret[i] = sum(f32(arange(3))) + f32(i)
total = 7.0
metric loss, ret
"""


def test_metrics_csv_has_one_row_per_point(tmp_path):
    p = write(tmp_path, METRIC_PROGRAM)
    m = tmp_path / "m.csv"
    r = cli("run", p, "--metrics", m, "--no-progress")
    assert r.exit_code == 0, r.stderr
    rows = list(csv.reader(m.open()))
    header, body = rows[0], rows[1:]
    assert header[0] == "name" and "i" in header and header[-1] == "value"
    k = header.index("i")
    got = sorted((row[0], int(row[k]), float(row[-1])) for row in body)
    want = sorted(
        [("loss", i, i * 0.5) for i in range(4)] + [("ret", i, 3.0 + i) for i in range(4)]
    )
    assert got == want


def test_metrics_jsonl_has_one_object_per_point(tmp_path):
    p = write(tmp_path, METRIC_PROGRAM)
    m = tmp_path / "m.jsonl"
    r = cli("run", p, "--metrics", m, "--no-progress")
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(line) for line in m.read_text().splitlines() if line.strip()]
    got = sorted((row["name"], row["i"], row["value"]) for row in rows)
    want = sorted(
        [("loss", i, i * 0.5) for i in range(4)] + [("ret", i, 3.0 + i) for i in range(4)]
    )
    assert got == want


def test_metrics_stream_in_the_order_of_the_dims(tmp_path):
    p = write(tmp_path, METRIC_PROGRAM)
    m = tmp_path / "m.jsonl"
    assert cli("run", p, "--metrics", m, "--no-progress").exit_code == 0
    idx = [json.loads(line)["i"] for line in m.read_text().splitlines()]
    assert idx == sorted(idx)


def test_metric_scalar_tensor_without_dims(tmp_path):
    p = write(tmp_path, "loss = 2.5\nmetric loss\n")
    m = tmp_path / "m.jsonl"
    r = cli("run", p, "--metrics", m, "--no-progress")
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(line) for line in m.read_text().splitlines() if line.strip()]
    assert len(rows) == 1 and rows[0]["name"] == "loss" and rows[0]["value"] == 2.5


def test_metric_that_is_also_an_output(tmp_path):
    p = write(tmp_path, "config I = 2\ndim i < I\nl[i] = f32(i)\nmetric l\nout l\n")
    m, o = tmp_path / "m.csv", tmp_path / "o.npz"
    r = cli("run", p, "--metrics", m, "--outputs", o, "--no-progress")
    assert r.exit_code == 0, r.stderr
    assert len(list(csv.reader(m.open()))) == 3
    with np.load(o) as z:
        close(z["l"], np.arange(2, dtype=np.float32))


# ============================================================================ timerlc check


def test_check_prints_nothing_and_exits_zero(tmp_path):
    p = write(
        tmp_path,
        """
        config I = 3, B = 2, T = 4, gamma = 0.9
        dim i < I
        dim b < B
        dim t < T
        r[i, b, t] = f32(t) * 0.1
        g[i, b, T-1] = r[i, b, T-1]
        g[i, b, t] = r + gamma * g[i, b, t+1]
        ret[i] = mean(sum(r[i, 0:B, 0:T], 1))
        metric ret
        out g
        """,
    )
    r = cli("check", p)
    assert r.exit_code == 0
    assert r.stdout == "" and r.stderr == ""


def test_check_accepts_set(tmp_path):
    p = write(tmp_path, "config T = 3\ndim t < T\ny[t] = f32(t)\nout y\n")
    r = cli("check", p, "--set", "T=7")
    assert r.exit_code == 0 and r.stdout == "" and r.stderr == ""


# ============================================================================ not supported yet


RL_FEATURES = {  # environments, random draws, gradients, optimizers (LANGUAGE.md §7-10)
    "env": """
        config B = 2, T = 3
        dim b < B
        dim t < T
        env E = "cartpole" batch b
        o[b, 0] = E.reset()
        o[b, t+1], r[b, t], d[b, t] = E.step(b % 2)
        out o, r, d
        """,
    "env_attr": """
        config B = 2
        dim b < B
        env E = "cartpole" batch b
        params net { w : f32[E.obs_dim, 2] = zeros }
        out net
        """,
    "uniform": "y = uniform([3])\nout y\n",
    "normal": "y = normal([3])\nout y\n",
    "categorical": "y = categorical(zeros([3]))\nout y\n",
    "bernoulli": "y = bernoulli(0.5)\nout y\n",
    "permutation": "y = permutation(4)\nout y\n",
    "glorot_fn": "y = glorot([2, 3])\nout y\n",
    "glorot_init": "params p { w : f32[2, 3] = glorot }\nout p\n",
    "orthogonal_init": "params p { w : f32[2, 2] = orthogonal(1.0) }\nout p\n",
    "normal_init": "params p { w : f32[2] = normal(0.1) }\nout p\n",
    "uniform_init": "params p { w : f32[2] = uniform(-1.0, 1.0) }\nout p\n",
    "grad": """
        config I = 2
        dim i < I
        params net[i] { w : f32[2] = 1.0 }
        loss[i] = sum(net[i].w * net[i].w)
        g[i] = grad(loss[i], net[i])
        net[i+1] = net[i]
        out g
        """,
    "sgd": """
        config I = 2
        dim i < I
        params net[i] { w : f32[2] = 1.0 }
        loss[i] = sum(net[i].w * net[i].w)
        net[i+1] = sgd(net[i], grad(loss[i], net[i]), 0.1)
        out net
        """,
    "adam": """
        config I = 2
        dim i < I
        params net[i] { w : f32[2] = 1.0 }
        loss[i] = sum(net[i].w * net[i].w)
        net[i+1] = adam(net[i], grad(loss[i], net[i]), 0.1)
        out net
        """,
}


@pytest.mark.parametrize("name", list(RL_FEATURES))
def test_rl_features_check_and_run(tmp_path, name):
    p = write(tmp_path, RL_FEATURES[name])
    r = cli("check", p)
    assert r.exit_code == 0 and r.stderr == "", (r.exit_code, r.stderr)
    r = cli("run", p, "--no-progress", "--outputs", str(tmp_path / "o.npz"))
    assert r.exit_code == 0, (r.exit_code, r.stderr)


# ============================================================================ more of the CLI (§12)


def test_set_bool_negative_and_exponent_values(tmp_path):
    p = write(
        tmp_path,
        """
        config flag = true, n = 3, lr = 0.1
        a = flag
        b = n
        c = lr
        out a, b, c
        """,
    )
    o = tmp_path / "o.npz"
    r = cli(
        "run",
        p,
        "--set",
        "flag=false",
        "--set",
        "n=-4",
        "--set",
        "lr=2.5e-4",
        "--outputs",
        o,
        "--no-progress",
    )
    assert r.exit_code == 0, r.stderr
    with np.load(o) as z:
        assert bool(z["a"]) is False
        assert int(z["b"]) == -4
        close(z["c"], np.float32(2.5e-4), np.float32, rtol=1e-7)


def test_compile_to_a_build_folder_then_run_it(tmp_path):
    p = write(tmp_path, "config T = 3\ndim t < T\ny[t] = f32(t) * 2.0\nout y\n")
    build = tmp_path / "build"
    r = cli("compile", p, "-o", build, "--set", "T=4")
    assert r.exit_code == 0, r.stderr
    o = tmp_path / "o.npz"
    r = cli("run", build, "--outputs", o, "--no-progress")
    assert r.exit_code == 0, r.stderr
    with np.load(o) as z:
        close(z["y"], np.arange(4, dtype=np.float32) * 2)


def test_run_with_profile_succeeds(tmp_path):
    p = write(tmp_path, "config T = 3\ndim t < T\ny[t] = f32(t)\nout y\n")
    r = cli("run", p, "--profile", "--no-progress")
    assert r.exit_code == 0, r.stderr


def test_failure_while_running_exits_3_and_keeps_the_metrics_so_far(tmp_path):
    # the gather v[i32(m[i])] is out of range only at i = 3, found while running
    p = write(
        tmp_path,
        """
        config I = 4
        dim i < I
        m[i] = f32(i)
        v = f32(arange(3))
        y[i] = v[i32(m[i])]
        metric m
        out y
        """,
    )
    mfile = tmp_path / "m.jsonl"
    r = cli("run", p, "--metrics", mfile, "--no-progress")
    assert r.exit_code == 3
    assert "Traceback" not in r.stderr and r.stderr.strip()
    rows = [json.loads(line) for line in mfile.read_text().splitlines() if line.strip()]
    assert [(row["i"], row["value"]) for row in rows][:3] == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_metrics_with_two_dims(tmp_path):
    p = write(
        tmp_path,
        """
        config I = 2, T = 3
        dim i < I
        dim t < T
        step[i, t] = f32(10 * i + t)
        avg[i] = mean(step[i, 0:T])
        metric step, avg
        """,
    )
    m = tmp_path / "m.jsonl"
    r = cli("run", p, "--metrics", m, "--no-progress")
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(line) for line in m.read_text().splitlines() if line.strip()]
    steps = sorted((row["i"], row["t"], row["value"]) for row in rows if row["name"] == "step")
    assert steps == [(i, t, float(10 * i + t)) for i in range(2) for t in range(3)]
    avgs = sorted((row["i"], row["value"]) for row in rows if row["name"] == "avg")
    assert avgs == [(0, 1.0), (1, 11.0)]
    m2 = tmp_path / "m.csv"
    assert cli("run", p, "--metrics", m2, "--no-progress").exit_code == 0
    table = list(csv.reader(m2.open()))
    header = table[0]
    assert header[0] == "name" and header[-1] == "value" and "i" in header and "t" in header
    assert len(table) == 1 + 6 + 2


def test_params_field_then_spatial_index():
    out = run(
        """
        config I = 2
        dim i < I
        params net[i] { w : f32[3] = 2.0 }
        net[i+1] = net[i]
        y[i] = net[i].w[1] + net[i].w[-1]
        out y
        """
    )
    close(out["y"], np.full(2, 4.0))


def test_def_uses_the_dims_of_the_calling_equation():
    out = run(
        """
        config T = 3
        dim t < T
        x[t] = f32(t)
        def f() { f32(t) * 2.0 + x }
        def g(x) { x[0] }
        y[t] = f()
        z[t] = g(arange(5) + t)
        out y, z
        """
    )
    close(out["y"], np.arange(3) * 3.0)
    close(out["z"], np.arange(3), np.int32)


def test_compile_dump_ir_and_inspect_every_format(tmp_path):
    p = write(tmp_path, "config T = 3\ndim t < T\nx[t] = f32(t)\ny[t] = sum(x[t:T])\nout y\n")
    build = tmp_path / "build"
    r = cli("compile", p, "-o", build, "--dump-ir")
    assert r.exit_code == 0, r.stderr
    dumps = sorted((build / "ir").iterdir())
    assert dumps
    for fmt in ("text", "json", "dot"):
        r = cli("inspect", dumps[0], "--format", fmt)
        assert r.exit_code == 0 and r.stdout.strip(), (fmt, r.stderr)
        if fmt == "json":
            json.loads(r.stdout)


def test_the_complete_program_of_section_1_runs(tmp_path):
    import re
    from pathlib import Path

    spec = Path(__file__).resolve().parents[1].parent / "shared" / "LANGUAGE.md"
    if not spec.exists():
        pytest.skip("LANGUAGE.md is not next to the repository")
    program = re.search(r"```rtl\n(.*?)```", spec.read_text(), re.DOTALL).group(1)
    p = tmp_path / "reinforce.rtl"
    p.write_text(program)
    assert cli("check", p).exit_code == 0
    metrics = tmp_path / "m.csv"
    r = cli("run", p, "--set", "I=2", "--set", "B=3", "--set", "T=8", "--metrics", str(metrics))
    assert r.exit_code == 0, r.stderr
    rows = metrics.read_text().splitlines()
    assert rows[0] == "name,i,value" and len(rows) == 1 + 2 * 2


def test_envs_command_exists():
    r = cli("envs")
    assert "No such command" not in r.stderr
    assert r.exit_code in (0, 1) and "Traceback" not in r.stderr


def test_params_read_through_temporal_slices_and_copied_into_tensors():
    out = run(
        """
        config I = 3
        dim i < I
        params net[i] { w : f32[2] = 1.0; b : f32[] = 0.5 }
        net[i+1] = net[i]
        y = net[0:I+1].w
        z[i] = sum(net[0:i+1].b)
        c[i] = net[i]
        out y, z, c
        """
    )
    close(out["y"], np.ones((4, 2)))
    close(out["z"], 0.5 * (np.arange(3) + 1))
    close(out["c.w"], np.ones((3, 2)))
    close(out["c.b"], np.full(3, 0.5))
