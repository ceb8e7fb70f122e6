"""Environments written in RTL (LANGUAGE.md section 10, docs/envs.md): the built-ins' RTL
forms (``rtl:cartpole``, ``rtl:pendulum``, ``rtl:trivial``) against their Python forms, bit
for bit, on the reference interpreter and as generated code; an environment a user writes;
and one test per diagnostic."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import cli, compiled_run, reference_and_native, src, timerlc_cmd

from timerlc.diagnostics import ProgramError, Source
from timerlc.frontend.check import check_source
from timerlc.reference.interpreter import outputs, run_graph

# PPO-style: one reset, the rollouts continue across iterations
CONTINUING = """
config I = 2, B = 4, T = 90
dim i < I
dim b < B
dim t < T
env E = "SPEC" batch b
o[0, b, 0] = E.reset()
o[i+1, b, 0] = o[i, b, T]
a[i, b, t] = ACTION
o[i, b, t+1], r[i, b, t], d[i, b, t] = E.step(a[i, b, t])
out o, r, d
"""

# REINFORCE-style: every iteration resets every instance
RESETTING = """
config I = 3, B = 5, T = 40
dim i < I
dim b < B
dim t < T
env E = "SPEC" batch b
o[i, b, 0] = E.reset()
a[i, b, t] = ACTION
o[i, b, t+1], r[i, b, t], d[i, b, t] = E.step(a[i, b, t])
out o, r, d
"""

# resets every other iteration: the call order has pieces in i % 2 (isl's divs -> `//`)
ALTERNATING = """
config I = 4, B = 4, T = 24
dim i < I
dim b < B
dim t < T
env E = "SPEC" batch b
o[i, b, 0] = E.reset() when i % 2 == 0
o[i, b, 0] = o[i-1, b, T]
a[i, b, t] = ACTION
o[i, b, t+1], r[i, b, t], d[i, b, t] = E.step(a[i, b, t])
out o, r, d
"""

BALANCE = (
    "where(b < 3, i32(o[i, b, t][2] + 0.3 * o[i, b, t][3] > 0.0), "
    "categorical(o[i, b, t][0:2] * 0.0))"
)
TORQUE = "f32((t * 7 + b * 3 + i) % 13) * 0.5 - 3.0"


def graph_of(text: str):
    return check_source(Source("p.rtl", src(text)), overrides={})


def run_both(text: str):
    """(reference outputs, cpu outputs from generated code, the generated code)."""
    return reference_and_native(graph_of(text))


def compiled_outputs(graph, backend: str | None = None) -> tuple[dict, object]:
    """``o``, ``r`` and ``d`` of a run of ``graph`` as generated code (``compiled_run``), and
    the generated code."""
    runtime, gen = compiled_run(graph, backend=backend)
    got = {k: runtime.value(k) for k in ("o", "r", "d")}
    runtime.envs.close()
    return got, gen


def python_form(text: str) -> dict:
    """The outputs of a program whose environment is a Python plugin, as generated code on
    the cpu backend (which the differential tests hold to the reference interpreter's: the
    interpreter took half of such a test's time, point by point)."""
    return compiled_outputs(graph_of(text), "cpu")[0]


def equal_forms(program: str, spec: str, action: str, reference: bool = True):
    """The RTL form of ``spec`` equals its Python form (``python_form``) as generated code,
    and on the reference interpreter too unless ``reference`` is False (the interpreter
    takes most of such a test's time, point by point: 8 of 12 s for a run of 720 steps; a
    test whose RTL form another test already runs there leaves it out), bit for bit."""
    text = program.replace("ACTION", action)
    python = python_form(text.replace("SPEC", spec))
    rtl = graph_of(text.replace("SPEC", "rtl:" + spec))
    if reference:
        ref, cpu, gen = reference_and_native(rtl)
    else:
        (cpu, gen), ref = compiled_outputs(rtl), {}
    assert not gen.plan.envs, "the RTL form is equations, not a plugin"
    assert not gen.interpreted, "every statement is generated code"
    for name in ("o", "r", "d"):
        if reference:
            np.testing.assert_array_equal(ref[name], python[name], err_msg=f"reference {name}")
        np.testing.assert_array_equal(cpu[name], python[name], err_msg=f"cpu {name}")
    return python


@pytest.mark.parametrize(
    "program",
    [CONTINUING, RESETTING, ALTERNATING],
    ids=["continuing", "resetting", "alternating"],
)
@pytest.mark.parametrize(
    "spec", ["cartpole", "cartpole?max_episode_steps=25&sutton_barto_reward=true"]
)
def test_cartpole_in_rtl_is_its_python_form(program, spec):
    # (the RTL form on the reference interpreter only where the program alternates: its
    # iterations both reset and continue)
    reference = program is ALTERNATING
    want = equal_forms(program, spec, BALANCE, reference)
    assert want["d"].sum() > 2  # episodes ended and the instances reset themselves


@pytest.mark.parametrize("program", [CONTINUING, RESETTING], ids=["continuing", "resetting"])
@pytest.mark.parametrize("spec", ["pendulum", "pendulum?g=9.81&max_episode_steps=17"])
def test_pendulum_in_rtl_is_its_python_form(program, spec):
    # torques beyond [-2, 2] are clipped; the angle wraps around
    want = equal_forms(program, spec, TORQUE)
    assert "max" not in spec or want["d"].sum() > 5


@pytest.mark.parametrize("program", [CONTINUING, RESETTING], ids=["continuing", "resetting"])
def test_trivial_in_rtl_is_its_python_form(program):
    want = equal_forms(program, "trivial?obs=5&actions=3&length=7", "(t * b + i) % 3")
    assert want["o"].shape[-1] == 5 and want["r"].sum() > 0 and want["d"].sum() > 0


# a reset shadowed at i == 1 by an earlier equation: the episodes go on there
SHADOWED = """
config I = 3, B = 3, T = 20
dim i < I
dim b < B
dim t < T
env E = "SPEC" batch b
o[1, b, 0] = o[0, b, T]
o[i, b, 0] = E.reset()
a[i, b, t] = ACTION
o[i, b, t+1], r[i, b, t], d[i, b, t] = E.step(a[i, b, t])
out o, r, d
"""


def test_a_call_shadowed_by_an_earlier_equation():
    want = equal_forms(SHADOWED, "cartpole", BALANCE)
    # the same calls written out without shadowing
    explicit = SHADOWED.replace(
        "o[i, b, 0] = E.reset()", "o[0, b, 0] = E.reset()\no[2, b, 0] = E.reset()"
    )
    # (as generated code: the shadowed form ran on the reference interpreter above)
    runtime, _ = compiled_run(
        graph_of(explicit.replace("ACTION", BALANCE).replace("SPEC", "rtl:cartpole"))
    )
    for name in ("o", "r", "d"):
        np.testing.assert_array_equal(runtime.value(name), want[name], err_msg=f"cpu {name}")
    runtime.envs.close()
    assert not np.array_equal(want["o"][1, :, 0], want["o"][2, :, 0])


def test_the_seed_changes_the_rtl_episodes_as_the_python_ones():
    text = "config seed = 7\n" + CONTINUING
    a = equal_forms(text, "cartpole", BALANCE, reference=False)  # (continuing's test has it)
    b = outputs(
        run_graph(graph_of(CONTINUING.replace("ACTION", BALANCE).replace("SPEC", "cartpole")))
    )
    assert not np.array_equal(a["o"], b["o"])


def test_the_programs_train_alike_on_either_form(tmp_path):
    """REINFORCE on the command line: the RTL cartpole gives the Python one's metrics."""
    rows = {}
    for spec in ("cartpole", "rtl:cartpole"):
        path = tmp_path / f"{spec.replace(':', '_')}.jsonl"
        cmd = timerlc_cmd() + ["run", "programs/reinforce.rtl", "--env", f"E={spec}"]
        cmd += ["--set", "I=3", "--set", "B=4", "--set", "T=60", "--no-progress"]
        subprocess.run(cmd + ["--metrics", str(path)], check=True, capture_output=True)
        rows[spec] = sorted(path.read_text().splitlines())
    assert rows["cartpole"] == rows["rtl:cartpole"] and len(rows["cartpole"]) >= 3


def test_environment_outputs_pass_no_gradient():
    text = """
    config B = 2, T = 6
    dim b < B
    dim t < T
    env E = "rtl:pendulum" batch b
    params p { w : f32[1] = ones }
    o[b, 0] = E.reset()
    a[b, t] = p.w * 0.5 + o[b, t][0:1]
    o[b, t+1], r[b, t], d[b, t] = E.step(a[b, t])
    loss = -sum(r[0:B, 0:T])
    gw = grad(loss, p).w
    out gw
    """
    ref, cpu, _ = run_both(text)
    assert np.array_equal(ref["gw"], np.zeros(1, np.float32)) and np.array_equal(
        cpu["gw"], ref["gw"]
    )


# ----------------------------------------------------------------------------- user files
DOCS = Path(__file__).resolve().parent.parent / "docs" / "envs.md"
# the example of docs/envs.md: a random walk that ends at |x| >= limit or after `length` steps
_section = DOCS.read_text().split("### The file", 1)[1]
COUNTER = re.search(r"```rtl\n(.*?)```", _section, re.DOTALL).group(1)

USER = """
config B = 4, T = 30
dim b < B
dim t < T
env E = "walk.rtl" batch b
o[b, 0] = E.reset()
a[b, t] = (t + b) % 3
o[b, t+1], r[b, t], d[b, t] = E.step(a[b, t])
out o, r, d
"""


def write(tmp_path, text: str, name: str = "walk.rtl"):
    path = tmp_path / name
    path.write_text(src(text))
    return path


def user_graph(tmp_path, env_text: str, program: str = USER):
    write(tmp_path, env_text)
    prog = tmp_path / "p.rtl"
    prog.write_text(src(program))
    return check_source(Source(str(prog), prog.read_text()), overrides={})


def test_an_environment_never_called(tmp_path):
    program = """
    config B = 2
    dim b < B
    env E = "walk.rtl" batch b
    y[b] = f32(b) * f32(E.obs_dim)
    out y
    """
    want = outputs(run_graph(user_graph(tmp_path, COUNTER, program)))
    np.testing.assert_array_equal(want["y"], np.array([0.0, 2.0], np.float32))


SPRING = """
env state {
  x : f64[2]
}
env observation f32[2, 2]
env actions f32[2]
def reset(s, k) {
  (uniform([2], lo=-1.0, hi=1.0, dtype=f64, at=[k, 0]),)
}
def observe(s) {
  f32(stack([s.x, -s.x]))
}
def step(s, a, k) {
  x = 0.5 * s.x + f64(a)
  ((x,), f32(-sum(x * x)), false, false)
}
"""


def test_tensor_observations_and_actions(tmp_path):
    program = """
    config B = 3, T = 5
    dim b < B
    dim t < T
    env E = "walk.rtl" batch b
    o[b, 0] = E.reset()
    o[b, t+1], r[b, t], d[b, t] = E.step(o[b, t][0] * 0.25)
    out o, r
    """
    want, got, _ = reference_and_native(user_graph(tmp_path, SPRING, program))
    assert want["o"].shape == (3, 6, 2, 2)
    x = want["o"][:, 0, 0].astype(np.float64)
    for t in range(5):  # x' = 0.5 x + f64(f32(0.25 * f32(x)))
        x = 0.5 * x + (np.float32(0.25) * want["o"][:, t, 0]).astype(np.float64)
        np.testing.assert_array_equal(want["o"][:, t + 1, 0], x.astype(np.float32))
        np.testing.assert_array_equal(want["o"][:, t + 1, 1], (-x).astype(np.float32))
    for name in ("o", "r"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_user_environment_runs_alike_on_both_backends(tmp_path):
    want, got, _ = reference_and_native(user_graph(tmp_path, COUNTER))
    for name in ("o", "r", "d"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # by hand: instance b's walk, its noise drawn at (b, number of steps so far)
    from timerlc import rng

    key = (rng.site_id("env:E"), 0)
    x, n, draws, b = 0.0, 0, 0, 1
    for t in range(30):
        a = (t + b) % 3
        z = rng.normal(key[0], key[1], np.array([[b * 2**32 + draws]]), (None,), (), np.float32)
        x = np.float32(np.float32(x) + np.float32(a - 1) + np.float32(0.1) * z[0])
        n, draws = n + 1, draws + 1
        assert want["r"][b, t] == np.float32(-abs(x)), t
        if abs(x) >= 3.0 or n >= 12:
            assert want["d"][b, t]
            x, n = 0.0, 0
        else:
            assert not want["d"][b, t]
    assert want["d"].sum() > 2


def test_the_command_line_runs_a_user_environment(tmp_path):
    write(tmp_path, COUNTER)
    prog = tmp_path / "p.rtl"
    prog.write_text(src(USER).replace("out o, r, d", "ret = mean(r[0:B, 0:T])\nmetric ret"))
    metrics = tmp_path / "m.jsonl"
    # run from elsewhere: "walk.rtl" is found beside the program
    cmd = timerlc_cmd() + ["run", str(prog), "--no-progress", "--metrics", str(metrics)]
    subprocess.run(cmd, check=True, capture_output=True, cwd="/")
    (row,) = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert row["name"] == "ret" and row["value"] < 0
    listed = subprocess.run(timerlc_cmd() + ["envs"], check=True, capture_output=True, text=True)
    assert "rtl:cartpole" in listed.stdout and "FILE.rtl" in listed.stdout


# ----------------------------------------------------------------------------- diagnostics
def env_error(tmp_path, env_text: str, program: str = USER) -> ProgramError:
    with pytest.raises(ProgramError) as info:
        user_graph(tmp_path, env_text, program)
    return info.value


def rendered(tmp_path, env_text: str, program: str = USER) -> str:
    """What the command line prints (stderr), after checking it exits 1."""
    write(tmp_path, env_text)
    prog = tmp_path / "p.rtl"
    prog.write_text(src(program))
    done = subprocess.run(
        timerlc_cmd() + ["check", str(prog)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1, done.stderr
    return done.stderr


def test_an_error_in_an_environment_file_points_into_that_file(tmp_path):
    err = rendered(tmp_path, COUNTER.replace("(0.0, 0, s.draws)", "(0.0, s.draws)"))
    first = err.splitlines()[0]
    line = src(COUNTER).splitlines().index("  (0.0, 0, s.draws)") + 1
    assert first.startswith(f"{tmp_path / 'walk.rtl'}:{line}:")
    assert "'reset' must give the state: a tuple (x, n, draws)" in first
    assert err.splitlines()[1].strip() == "(0.0, s.draws)"


def test_a_state_field_of_the_wrong_type(tmp_path):
    e = env_error(tmp_path, COUNTER.replace("(0.0, 0, s.draws)", "(0.0, 0.5 * f32(s.n), s.draws)"))
    assert "state field 'n' is i32[], 'reset' gives f32[]" in e.message


def test_a_float_constant_is_no_int_field(tmp_path):
    e = env_error(tmp_path, COUNTER.replace("(0.0, 0, s.draws)", "(0.0, 0.5, s.draws)"))
    assert "state field 'n' is i32[], 'reset' gives f32[]" in e.message


def test_check_an_environment_file_on_its_own(tmp_path):
    path = write(tmp_path, COUNTER)
    ok = subprocess.run(
        timerlc_cmd() + ["check", str(path), "--set", "length=5"], capture_output=True, check=False
    )
    assert ok.returncode == 0 and not ok.stdout and not ok.stderr
    # an error inside a function is found by inlining it into a probe program
    write(tmp_path, COUNTER.replace("x = s.x + f32(a - 1)", "x = s.x[0] + f32(a - 1)"))
    bad = subprocess.run(
        timerlc_cmd() + ["check", str(path)], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 1
    assert bad.stderr.startswith(f"{path}:") and "too many indices" in bad.stderr
    usage = subprocess.run(
        timerlc_cmd() + ["check", str(path), "--env", "E=cartpole"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert usage.returncode == 2 and "--env applies to programs" in usage.stderr


def test_a_missing_declaration(tmp_path):
    e = env_error(tmp_path, re.sub(r"env observation .*\n", "", COUNTER))
    assert "declares no 'env observation'" in e.message


def test_a_missing_function_and_a_wrong_arity(tmp_path):
    e = env_error(tmp_path, COUNTER.replace("def observe(s)", "def look(s)"))
    assert "has no 'def observe(s)'" in e.message
    e = env_error(tmp_path, COUNTER.replace("def step(s, a, k)", "def step(s, a)"))
    assert "'step' takes 3 parameters (s, a, k), got 2" in e.message


def test_observations_are_f32(tmp_path):
    e = env_error(tmp_path, COUNTER.replace("env observation f32[2]", "env observation f64[2]"))
    assert "observations are f32" in e.message


def test_observe_must_give_the_declared_observation(tmp_path):
    e = env_error(tmp_path, COUNTER.replace("stack([s.x, f32(s.n)])", "stack([s.x, s.x, s.x])"))
    assert "'observe' must give the declared observation f32[2], got f32[3]" in e.message


def test_program_statements_do_not_belong_in_an_environment_file(tmp_path):
    e = env_error(tmp_path, COUNTER + "\ndim q < 3\n")
    assert "an environment file has configs, defs and env declarations only" in e.message


def test_environment_declarations_do_not_belong_in_a_program(tmp_path):
    e = env_error(tmp_path, COUNTER, USER + "env actions 2\n")
    assert "belongs in an environment file" in e.message


def test_a_draw_in_an_environment_needs_its_point(tmp_path):
    e = env_error(tmp_path, COUNTER.replace("normal([], at=[k, s.draws])", "normal([])"))
    assert "needs at=[...]" in e.message


def test_an_unknown_builtin_form_file_or_option(tmp_path):
    e = env_error(tmp_path, COUNTER, USER.replace("walk.rtl", "rtl:cartpol"))
    assert "no built-in environment in RTL named 'cartpol'" in e.message
    assert "did you mean 'cartpole'" in e.message
    e = env_error(tmp_path, COUNTER, USER.replace("walk.rtl", "nowhere.rtl"))
    assert "environment file 'nowhere.rtl' not found" in e.message
    e = env_error(tmp_path, COUNTER, USER.replace("walk.rtl", "walk.rtl?lenght=3"))
    assert "the program has no config 'lenght'" in e.message and "length" in e.message
    e = env_error(tmp_path, COUNTER, USER.replace("walk.rtl", "rtl:trivial?obs=2x3"))
    assert "'2x3' is not a number" in e.message


def test_a_step_before_the_first_reset(tmp_path):
    program = USER.replace("o[b, 0] = E.reset()\n", "o[b, 0] = zeros([2])\n")
    e = env_error(tmp_path, COUNTER, program)
    assert "is stepped before its first reset (at b=0, t=0)" in e.message


def test_a_call_must_be_a_whole_right_side(tmp_path):
    program = USER.replace("o[b, 0] = E.reset()", "o[b, 0] = 2.0 * E.reset()")
    e = env_error(tmp_path, COUNTER, program)
    assert "must be the whole right side of its equation" in e.message
    program = USER.replace("o[b, 0] = E.reset()", "def f() { E.reset() }\no[b, 0] = f()")
    e = env_error(tmp_path, COUNTER, program)
    assert "not inside a def" in e.message


def test_two_calls_at_one_point(tmp_path):
    program = USER.replace("o[b, 0] = E.reset()", "o[b, 0] = E.reset()\no2[b] = E.reset()")
    e = env_error(tmp_path, COUNTER, program)
    assert "the calls of environment 'E' written in RTL must define tensors over the same" in (
        e.message
    )
    program = USER.replace("o[b, 0] = E.reset()", "o[b, 0] = E.reset()\no[b, 1] = E.reset()")
    e = env_error(tmp_path, COUNTER, program)
    assert "would define the same point of their first output (at t=1)" in e.message


def test_a_plugin_call_must_hold_for_every_instance():
    text = """
    config B = 3, T = 4
    dim b < B
    dim t < T
    env E = "cartpole" batch b
    o[b, 0] = E.reset() when b < 2
    o[b, t] = zeros([4])
    out o
    """
    with pytest.raises(ProgramError, match="steps every instance at once: its equation must hold"):
        graph_of(text)


def test_dumps_with_an_rtl_environment_read_back(tmp_path):
    """The hidden tensors' names (E.x, E.before.x) survive every dump and `timerlc inspect`."""
    prog = tmp_path / "p.rtl"
    prog.write_text(src(RESETTING.replace("ACTION", "i32(t % 2)").replace("SPEC", "rtl:cartpole")))
    build = tmp_path / "build"
    cmd = timerlc_cmd() + ["compile", str(prog), "-o", str(build), "--dump-ir"]
    subprocess.run(cmd, check=True, capture_output=True)
    dumps = sorted((build / "ir").iterdir())
    assert any("E.before.x" in d.read_text() for d in dumps)
    for d in [*dumps, build / "plan.json"]:
        for fmt in ("text", "json") if d.suffix != ".txt" else ("text",):
            done = cli("inspect", str(d), "--format", fmt)  # (in this process: 40 of them)
            assert done.exit_code == 0, (d.name, fmt, done.stderr)
    run = timerlc_cmd() + [
        "run",
        str(build),
        "--no-progress",
        "--outputs",
        str(tmp_path / "o.npz"),
    ]
    subprocess.run(run, check=True, capture_output=True)
    assert np.load(tmp_path / "o.npz")["d"].shape == (3, 5, 40)
