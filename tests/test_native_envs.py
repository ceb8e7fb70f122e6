"""The built-in environments as generated code (timerlc/codegen/envs.py) against their NumPy
forms (timerlc/envs): every observation, reward and done bit for bit, over episodes that
terminate, truncate and auto-reset; and the errors of a call the NumPy form refuses."""

from __future__ import annotations

import numpy as np
import pytest
from rtl_helpers import reference_and_native, src

from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.runtime.cpu import CpuRuntime

ROLLOUT = """
config I = 2, B = 6, T = 160
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

# half the instances balance the pole (long episodes), half act at random (short ones)
BALANCE = "where(b < 3, i32(o[i, b, t][2] + 0.3 * o[i, b, t][3] > 0.0), categorical(o[i, b, t][0:2] * 0.0))"


def both(text: str):
    """(reference outputs, cpu outputs with generated code, the generated code)."""
    return reference_and_native(check_source(Source("p.rtl", src(text)), overrides={}))


def same(text: str):
    want, got, gen = both(text)
    envs = [s.id for s in gen.plan.statements if s.node.op.startswith("env_")]
    assert envs and not set(envs) & set(gen.interpreted), "the env calls are not generated code"
    for name in ("o", "r", "d"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    return want


@pytest.mark.parametrize(
    "spec",
    ["cartpole", "cartpole?max_episode_steps=40&sutton_barto_reward=true"],
)
def test_cartpole_is_its_numpy_form(spec):
    want = same(ROLLOUT.replace("SPEC", spec).replace("ACTION", BALANCE))
    assert want["d"].sum() > 10  # episodes ended (and the instances reset themselves)


@pytest.mark.parametrize("spec", ["pendulum", "pendulum?g=9.81&max_episode_steps=30"])
def test_pendulum_is_its_numpy_form(spec):
    # torques beyond [-2, 2] are clipped; the angle wraps around many times
    action = "f32((t * 7 + b * 3 + i) % 13) * 0.5 - 3.0"
    want = same(ROLLOUT.replace("SPEC", spec).replace("ACTION", action))
    assert want["d"].sum() >= 6


def test_trivial_is_its_numpy_form():
    spec = "trivial?obs=2x3&actions=3&length=7"
    want = same(ROLLOUT.replace("SPEC", spec).replace("ACTION", "(t * b + i) % 3"))
    assert want["o"].shape == (3, 6, 161, 2, 3) and want["r"].sum() > 0


def test_the_seed_changes_the_episodes_alike():
    text = ROLLOUT.replace("SPEC", "cartpole").replace("ACTION", BALANCE)
    a = same("config seed = 5\n" + text)
    b = same(text)
    assert not np.array_equal(a["o"], b["o"])


def run_cpu(text: str):
    graph = check_source(Source("p.rtl", src(text)), overrides={})
    gen = generate_code(compile_plan(run_passes(graph)))
    CpuRuntime(gen.plan, native=gen.text).run()


def test_an_action_outside_the_space_says_what_numpy_says():
    text = ROLLOUT.replace("SPEC", "cartpole").replace("ACTION", "where(t == 5, 2, 0)")
    with pytest.raises(RunError, match=r"got action 2; its actions are 0\.\.1"):
        run_cpu(text)


def test_a_step_before_any_reset_says_what_numpy_says():
    text = """
    config B = 3, T = 4
    dim b < B
    dim t < T
    env E = "trivial" batch b
    a[b, t] = 0
    o[b, t], r[b, t], d[b, t] = E.step(a[b, t])
    out r
    """
    with pytest.raises(RunError, match="'trivial': step before reset"):
        run_cpu(text)
