"""Environment plugins (timerlc/envs): built-ins against gymnasium, auto-reset, seeding,
plugin lookup in every spec form, error messages, spaces, and the example of docs/envs.md."""

from __future__ import annotations

import importlib.metadata
import re
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from timerlc import envs
from timerlc.envs import EnvError, EnvSpec, EpisodeStats, VectorEnv

DOCS = Path(__file__).resolve().parent.parent / "docs" / "envs.md"


# ---------------------------------------------------------------------------------------
# The built-ins step for step against gymnasium.


def balance(obs, rng, n):
    """Half the instances balance the pole (episodes run to truncation), half act at
    random (episodes terminate)."""
    ctrl = (obs[:, 2] + 0.3 * obs[:, 3] + 0.01 * obs[:, 0] + 0.1 * obs[:, 1] > 0).astype(int)
    return np.where(np.arange(n) < n // 2, ctrl, rng.integers(0, 2, n))


def torque(obs, rng, n):
    return rng.uniform(-3.0, 3.0, (n, 1)).astype(np.float32)  # beyond [-2, 2]: clipped


def compare_with_gymnasium(spec, gym_id, gym_kwargs, policy, steps, n=8, seed=3):
    """Step ``spec`` and one gymnasium env per instance in lockstep, the gymnasium envs
    put in the same state after every reset; everything must be bit-equal."""
    env = envs.make(spec, n)
    obs = env.reset(seed=seed)
    refs = [gym.make(gym_id, **gym_kwargs) for _ in range(n)]
    for i, ref in enumerate(refs):
        ref.reset(seed=0)
        ref.unwrapped.state = env.state[i].copy()
    rng = np.random.default_rng(0)
    terminations = truncations = 0
    for t in range(steps):
        actions = policy(obs, rng, n)
        obs, reward, done = env.step(actions)
        assert obs.dtype == np.float32 and reward.dtype == np.float32 and done.dtype == bool
        for i, ref in enumerate(refs):
            r_obs, r_reward, r_term, r_trunc, _ = ref.step(actions[i])
            where = f"step {t}, instance {i}"
            np.testing.assert_array_equal(env.info["final_obs"][i], r_obs, err_msg=where)
            assert reward[i] == np.float32(r_reward), where
            assert env.info["terminated"][i] == r_term, where
            assert env.info["truncated"][i] == r_trunc, where
            assert done[i] == (r_term or r_trunc), where
            if done[i]:
                terminations += r_term
                truncations += r_trunc
                # Same-step auto-reset: the returned row is the next episode's first obs.
                np.testing.assert_array_equal(obs[i], first_obs(env, i), err_msg=where)
                ref.reset()
                ref.unwrapped.state = env.state[i].copy()
            else:
                np.testing.assert_array_equal(obs[i], r_obs, err_msg=where)
    env.close()
    return terminations, truncations


def first_obs(env, i):
    """The observation of instance ``i``'s current state (just after a reset)."""
    if env.name == "cartpole":
        return env.state[i].astype(np.float32)
    th, thdot = env.state[i]
    return np.array([np.cos(th), np.sin(th), thdot], dtype=np.float32)


def test_cartpole_matches_gymnasium():
    term, trunc = compare_with_gymnasium("cartpole", "CartPole-v1", {}, balance, 1200)
    assert term > 20 and trunc >= 4  # both kinds of episode end were exercised


def test_cartpole_options_match_gymnasium():
    term, trunc = compare_with_gymnasium(
        "cartpole?max_episode_steps=60&sutton_barto_reward=true", "CartPole-v1",
        {"max_episode_steps": 60, "sutton_barto_reward": True}, balance, 300)
    assert term > 10 and trunc > 10


def test_pendulum_matches_gymnasium():
    term, trunc = compare_with_gymnasium("pendulum", "Pendulum-v1", {}, torque, 650, n=5)
    assert term == 0 and trunc == 15  # truncated at steps 200, 400, 600


def test_pendulum_gravity_option():
    compare_with_gymnasium("pendulum?g=9.81&max_episode_steps=30", "Pendulum-v1",
                           {"g": 9.81, "max_episode_steps": 30}, torque, 100, n=3)


def test_cartpole_initial_states_and_spaces():
    env = envs.make("cartpole", 64)
    obs = env.reset(seed=0)
    assert obs.shape == (64, 4) and obs.dtype == np.float32
    assert np.all(np.abs(obs) < 0.05)
    assert env.single_action_space == spaces.Discrete(2)
    assert env.single_observation_space == gym.make("CartPole-v1").observation_space
    assert env.array_module is np


def test_pendulum_spaces():
    env = envs.make("pendulum", 2)
    ref = gym.make("Pendulum-v1")
    assert env.single_action_space == ref.action_space
    assert env.single_observation_space == ref.observation_space
    obs = env.reset(seed=1)
    assert np.all(np.abs(obs[:, :2]) <= 1) and np.all(np.abs(obs[:, 2]) <= 1)
    # a [num_envs] batch of torques is taken as [num_envs, 1]
    obs2, _, _ = env.step(np.zeros(2, np.float32))
    assert obs2.shape == (2, 3)


# ---------------------------------------------------------------------------------------
# Auto-reset, seeding, episode bookkeeping.


def rollout(env, seed, steps, actions_seed=7):
    rng = np.random.default_rng(actions_seed)
    out = [env.reset(seed=seed)]
    rewards, dones = [], []
    for _ in range(steps):
        if isinstance(env.single_action_space, spaces.Discrete):
            a = rng.integers(0, env.single_action_space.n, env.num_envs)
        else:
            a = rng.uniform(-2, 2, (env.num_envs, 1)).astype(np.float32)
        obs, r, d = env.step(a)
        out.append(obs)
        rewards.append(r)
        dones.append(d)
    return np.stack(out), np.stack(rewards), np.stack(dones)


@pytest.mark.parametrize("spec", ["cartpole", "pendulum?max_episode_steps=20"])
def test_seeding_is_deterministic(spec):
    a = rollout(envs.make(spec, 6), 11, 120)
    b = rollout(envs.make(spec, 6), 11, 120)
    c = rollout(envs.make(spec, 6), 12, 120)
    assert a[2].any()  # some episodes ended, so auto-reset draws were compared too
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])


def test_reset_with_the_same_seed_restarts_and_without_one_goes_on():
    env = envs.make("cartpole", 4)
    first = env.reset(seed=5)
    np.testing.assert_array_equal(env.reset(seed=5), first)
    assert not np.array_equal(env.reset(), first)
    # the instances' streams differ from one another
    assert len({tuple(row) for row in first}) == 4


def test_instance_streams_do_not_depend_on_num_envs():
    small, big = envs.make("cartpole", 3), envs.make("cartpole", 5)
    o_small, o_big = small.reset(seed=9), big.reset(seed=9)
    np.testing.assert_array_equal(o_small, o_big[:3])
    rng = np.random.default_rng(1)
    for _ in range(200):
        a = rng.integers(0, 2, 5)
        o_small, _, d_small = small.step(a[:3])
        o_big, _, d_big = big.step(a)
        np.testing.assert_array_equal(o_small, o_big[:3])
        np.testing.assert_array_equal(d_small, d_big[:3])


def test_bad_seed_is_refused():
    with pytest.raises(EnvError, match="seed"):
        envs.make("cartpole", 2).reset(seed=-1)


def test_auto_reset_and_episode_returns():
    env = envs.make("cartpole", 16)
    env.reset(seed=0)
    stats = EpisodeStats(16)
    lengths = np.zeros(16, dtype=int)
    rng = np.random.default_rng(0)
    for _ in range(300):
        obs, r, done = env.step(rng.integers(0, 2, 16))
        lengths += 1
        stats.update(r, done)
        # a finished instance's row is a fresh initial state
        assert np.all(np.abs(obs[done]) < 0.05)
        assert np.all(env.info["final_obs"][done] != obs[done])
        lengths[done] = 0
    assert len(stats.returns) > 50
    assert stats.returns == [float(n) for n in stats.lengths]  # reward 1 per step


def test_trivial_dynamics():
    env = envs.make("trivial?obs=2x3&actions=3&length=4", 2)
    assert env.single_observation_space.shape == (2, 3)
    assert env.single_action_space == spaces.Discrete(3)
    ramp = (np.arange(6) / 6).astype(np.float32).reshape(2, 3)
    obs = env.reset(seed=123)
    np.testing.assert_array_equal(obs, np.stack([ramp, ramp]))
    stats = EpisodeStats(2)
    for t in range(12):
        best = t % 4 % 3
        a = np.array([best, (best + 1) % 3])  # instance 0 plays the best action
        obs, r, done = env.step(a)
        stats.update(r, done)
        np.testing.assert_array_equal(r, [1.0, 0.0])
        assert done.tolist() == [t % 4 == 3] * 2
        if t % 4 == 3:
            np.testing.assert_array_equal(obs[0], ramp)
        else:
            value = np.float32((t % 4) + 1 + a[1] / 3)
            np.testing.assert_array_equal(obs[1], value + ramp)
    assert stats.returns == [4.0, 0.0] * 3


def test_trivial_large_observations_are_fresh_and_fast():
    env = envs.make("trivial?obs=3x64x64&actions=6&length=5", 256)
    obs0 = env.reset()
    start = time.perf_counter()
    seen = [obs0]
    for t in range(10):
        obs, _, _ = env.step(np.full(256, t % 6))
        seen.append(obs)
    elapsed = time.perf_counter() - start
    assert obs.shape == (256, 3, 64, 64) and obs.dtype == np.float32
    # returned arrays are the caller's: later steps do not overwrite them
    assert all(not np.shares_memory(x, y) for x, y in zip(seen, seen[1:], strict=False))
    assert seen[1][0, 0, 0, 0] == np.float32(1.0)
    assert elapsed < 5.0


# ---------------------------------------------------------------------------------------
# Spaces and compile-time attributes.


def test_attributes():
    cart, pend = envs.describe("cartpole"), envs.describe("pendulum")
    big = envs.describe("trivial?obs=3x64x64&actions=6")
    assert (cart.obs_shape, cart.obs_dim, cart.num_actions) == ((4,), 4, 2)
    assert (pend.obs_shape, pend.obs_dim, pend.act_dim, pend.act_shape) == ((3,), 3, 1, (1,))
    assert (big.obs_shape, big.obs_dim, big.num_actions) == ((3, 64, 64), 12288, 6)
    assert cart.attribute("obs_dim") == 4
    with pytest.raises(EnvError, match="'pendulum' has continuous actions.*use act_dim"):
        _ = pend.num_actions
    with pytest.raises(EnvError, match="'cartpole' has discrete actions.*use num_actions"):
        _ = cart.act_dim
    with pytest.raises(EnvError, match="no attribute 'obs_size'"):
        cart.attribute("obs_size")
    assert pend.as_dict() == {"name": "pendulum", "obs_shape": [3], "actions": {
        "kind": "box", "shape": [1], "low": [-2.0], "high": [2.0]}}
    assert cart.as_dict()["actions"] == {"kind": "discrete", "n": 2}


def test_attribute_helpers_on_spaces():
    box = spaces.Box(0, 1, (2, 3), np.float32)
    assert envs.obs_shape(box) == (2, 3) and envs.obs_dim(box) == 6 and envs.act_dim(box) == 6
    assert envs.num_actions(spaces.Discrete(5)) == 5
    with pytest.raises(EnvError, match="Box"):
        envs.obs_shape(spaces.Discrete(3), "x")
    env = envs.make("cartpole", 2)
    assert env.spec == EnvSpec("cartpole", env.single_observation_space,
                               env.single_action_space)


def test_actions_are_checked():
    env = envs.make("cartpole", 3)
    with pytest.raises(EnvError, match="before reset"):
        env.step([0, 1, 0])
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"expects actions of shape \(3,\), got \(2,\)"):
        env.step([0, 1])
    with pytest.raises(EnvError, match="got action 2; its actions are 0..1"):
        env.step([0, 2, 1])
    with pytest.raises(EnvError, match="integer actions"):
        env.step([0.5, 1.0, 0.0])
    env.step(np.array([0, 1, 1], dtype=np.int32))
    pend = envs.make("pendulum", 2)
    pend.reset(seed=0)
    with pytest.raises(EnvError, match=r"expects actions of shape \(2, 1\)"):
        pend.step(np.zeros((2, 2)))


# ---------------------------------------------------------------------------------------
# Finding plugins.


def test_parse_spec():
    assert envs.parse_spec("cartpole") == ("cartpole", {})
    name, opts = envs.parse_spec(" trivial?obs=3x64x64&actions=6&x=0.5&on=true&s=hi ")
    assert name == "trivial"
    assert opts == {"obs": "3x64x64", "actions": 6, "x": 0.5, "on": True, "s": "hi"}
    assert type(opts["actions"]) is int and type(opts["on"]) is bool
    assert envs.parse_spec("gym:CartPole-v1?max_episode_steps=9") == (
        "gym:CartPole-v1", {"max_episode_steps": 9})


@pytest.mark.parametrize("spec, message", [
    ("", "empty"),
    ("?a=1", "no plugin name"),
    ("cartpole?a", "option 'a' is not key=value"),
    ("cartpole?a=1&a=2", "option 'a' is given twice"),
    ("cartpole?1a=2", "not an identifier"),
])
def test_malformed_specs(spec, message):
    with pytest.raises(EnvError, match=re.escape(message)):
        envs.resolve(spec)


def test_resolve_builtin():
    plugin = envs.resolve("trivial?obs=8&length=3")
    assert plugin.name == "trivial" and plugin.origin == "built-in"
    assert plugin.options == {"obs": 8, "length": 3}
    env = plugin(5)
    assert isinstance(env, VectorEnv) and env.num_envs == 5 and env.length == 3
    assert env.reset().shape == (5, 8)


def test_resolve_module_factory():
    plugin = envs.resolve("env_plugins:make_counter?scale=2.5&every=2")
    assert plugin.origin == "module env_plugins:make_counter"
    env = plugin(3)
    assert env.name == "env_plugins:make_counter"  # a plugin without a name gets its spec's
    np.testing.assert_array_equal(env.reset(), np.zeros((3, 1), np.float32))
    obs, r, d = env.step([0, 1, 2])
    np.testing.assert_array_equal(obs[:, 0], [2.5] * 3)
    np.testing.assert_array_equal(r, [0.0, 1.0, 2.0])
    obs, r, d = env.step([0, 0, 0])
    assert d.all() and not obs.any()


def test_resolve_gym():
    plugin = envs.resolve("gym:CartPole-v1")
    assert plugin.origin == "gymnasium"
    env = plugin(4)
    obs = env.reset(seed=5)
    for i in range(4):  # gymnasium's seeding: instance i gets seed + i
        ref, _ = gym.make("CartPole-v1").reset(seed=5 + i)
        np.testing.assert_array_equal(obs[i], ref)
    ended = 0
    rng = np.random.default_rng(0)
    for _ in range(100):
        obs, r, done = env.step(rng.integers(0, 2, 4))
        assert obs.dtype == np.float32 and r.dtype == np.float32 and done.dtype == bool
        ended += done.sum()
        # same-step auto-reset: the returned rows are fresh, the terminal ones in info
        assert np.all(np.abs(obs[done]) < 0.05)
        assert np.all(np.abs(env.info["final_obs"][done]).max(axis=1) > 0.2)
    assert ended > 5
    env.close()


def test_gym_options_and_discrete_observations_refused():
    env = envs.make("gym:CartPole-v1?max_episode_steps=5", 2)
    env.reset(seed=0)
    dones = [env.step([0, 1])[2] for _ in range(5)]
    assert dones[-1].all()
    with pytest.raises(EnvError, match="Discrete observation space.*Box"):
        envs.make("gym:FrozenLake-v1", 2)


def test_factory_returning_a_gymnasium_vector_env_is_wrapped():
    env = envs.make("env_plugins:make_gym_vector", 3)
    assert env.reset(seed=1).shape == (3, 4)
    with pytest.raises(EnvError, match="does not auto-reset in the same step"):
        envs.make("env_plugins:make_next_step", 2)


def fake_entry_points(monkeypatch, **names):
    eps = importlib.metadata.EntryPoints(
        importlib.metadata.EntryPoint(name=name, value=value, group=envs.ENTRY_POINT_GROUP)
        for name, value in names.items())
    real = importlib.metadata.entry_points

    def entry_points(**params):
        if params.get("group") == envs.ENTRY_POINT_GROUP:
            return eps
        return real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_resolve_entry_point(monkeypatch):
    fake_entry_points(monkeypatch, counter="env_plugins:make_counter",
                      cartpole="env_plugins:make_counter", broken="no_such_mod_x:make")
    plugin = envs.resolve("counter?every=5")
    assert plugin.origin == "entry point env_plugins:make_counter"
    assert plugin(2).every == 5
    assert envs.resolve("cartpole").origin == "built-in"  # built-ins come first
    with pytest.raises(EnvError, match=r"'broken' \(entry point no_such_mod_x:make\) failed"):
        envs.resolve("broken")
    with pytest.raises(EnvError, match="did you mean 'counter'"):
        envs.resolve("countr")
    names = [name for name, _ in envs.available()]
    assert names == ["cartpole", "pendulum", "trivial", "broken", "counter",
                     "rtl:cartpole", "rtl:pendulum", "rtl:trivial",
                     "FILE.rtl", "gym:ENV_ID", "package.module:factory"]


def test_available_without_plugins(monkeypatch):
    fake_entry_points(monkeypatch)
    rows = envs.available()
    assert [name for name, _ in rows][:3] == ["cartpole", "pendulum", "trivial"]
    assert all(isinstance(text, str) and text for _, text in rows)
    assert any(name == "gym:ENV_ID" for name, _ in rows)


@pytest.mark.parametrize("spec, message", [
    ("cartpol", "unknown environment 'cartpol'; did you mean 'cartpole'? "
                "(known: cartpole, pendulum, trivial; or gym:ENV_ID, package.module:factory)"),
    ("CartPole", "did you mean 'cartpole'?"),
    ("Pendulum-v1", "did you mean 'gym:Pendulum-v1'?"),
    ("zzz", "unknown environment 'zzz' (known: cartpole"),
    ("cartpole?max_episod_steps=3", "environment 'cartpole' has no option 'max_episod_steps'; "
     "did you mean 'max_episode_steps'? (its options are max_episode_steps, "
     "sutton_barto_reward)"),
    ("trivial?obs=3xa", "environment 'trivial': obs must be a shape of positive sizes"),
    ("trivial?length=0", "environment 'trivial': length must be a positive integer, got 0"),
    ("trivial?actions=true", "actions must be a positive integer, got True"),
    ("cartpole?sutton_barto_reward=2", "sutton_barto_reward must be true or false"),
    ("pendulum?g=heavy", "environment 'pendulum': g must be a number"),
    ("gym:CartPol-v1", "gym:CartPol-v1: gymnasium has no environment with that id; "
                       "did you mean 'gym:CartPole-v1'?"),
    ("gym:CartPole-v1?foo=1", "gym:CartPole-v1: cannot make it (foo=1)"),
    ("gym:CartPole-v1?vectorization_mode=fast", "vectorization_mode must be one of sync"),
    ("gym:", "names no gymnasium environment"),
    ("no_such_module_x:make", "cannot import module 'no_such_module_x'"),
    ("env_plugins:make_countr", "'env_plugins' has no 'make_countr'; "
                                "did you mean 'env_plugins:make_counter'?"),
    ("env_plugins:not_callable", "'not_callable' is not a function"),
    ("env_plugins:make_not_an_env", "returned object, which is not a VectorEnv"),
    ("env_plugins:make_wrong_count", "made 3 instances, not the 2 asked for"),
    ("env_plugins:make_raises", "failed to start: RuntimeError: the simulator is not"),
    ("env_plugins:make_dict_obs", "has a Dict observation space"),
    ("env_plugins:make_counter?colour=red", "has no option 'colour'"),
])
def test_errors(spec, message, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # a failed import may add the cwd
    with pytest.raises(EnvError) as info:
        envs.make(spec, 2)
    assert message in str(info.value)
    assert info.value.message == str(info.value)


def test_module_factory_in_the_current_directory(tmp_path, monkeypatch):
    # a console script's sys.path lacks the current directory; it is searched anyway
    (tmp_path / "cwd_plugin_x.py").write_text(
        "from env_plugins import make_counter as make\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_plugin_x", raising=False)
    assert envs.make("cwd_plugin_x:make", 2).reset().shape == (2, 1)
    assert sys.path[0] == str(tmp_path)
    sys.modules.pop("cwd_plugin_x", None)


def test_num_envs_is_checked():
    with pytest.raises(EnvError, match="num_envs must be a positive integer"):
        envs.make("cartpole", 0)


# ---------------------------------------------------------------------------------------
# The example plugin of docs/envs.md.


@pytest.fixture
def corridor_module(tmp_path, monkeypatch):
    text = DOCS.read_text()
    section = text[text.index("## Writing a plugin"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "mycorridor.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mycorridor", raising=False)
    yield "mycorridor"
    sys.modules.pop("mycorridor", None)


def test_docs_example_plugin(corridor_module, monkeypatch):
    env = envs.make("mycorridor:make?length=5", 4)
    assert envs.describe("mycorridor:make?length=5").obs_shape == (5,)
    obs = env.reset(seed=0)
    assert obs.shape == (4, 5) and (obs.sum(axis=1) == 1).all()
    stats = EpisodeStats(4)
    for _ in range(40):
        obs, r, done = env.step(np.ones(4, dtype=int))  # always walk right
        stats.update(r, done)
        assert (obs.sum(axis=1) == 1).all()
    assert stats.returns and set(stats.returns) == {1.0}
    assert a_rollout(env, 3) == a_rollout(env, 3)
    with pytest.raises(EnvError, match="length must be an integer >= 2"):
        envs.make("mycorridor:make?length=1", 2)
    # registered under a short name through the entry point group, as the doc shows
    fake_entry_points(monkeypatch, corridor="mycorridor:make")
    assert "corridor" in dict(envs.available())
    assert envs.make("corridor?length=16", 2).reset().shape == (2, 16)


def a_rollout(env, seed):
    obs = [env.reset(seed=seed).tolist()]
    rng = np.random.default_rng(0)
    for _ in range(30):
        obs.append(env.step(rng.integers(0, 2, env.num_envs))[0].tolist())
    return obs
