"""Small environment factories for tests/test_envs.py, found as ``env_plugins:NAME``.

Each is a ``factory(num_envs, **options)``; some are deliberately broken, to test the
errors the registry gives.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from timerlc.envs import VectorEnv


class Counter(VectorEnv):
    """Observes ``scale * t``; reward ``a``; done every ``every`` steps."""

    def __init__(self, num_envs: int, scale: float, every: int):
        self.num_envs = num_envs
        self.scale, self.every = scale, every
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.single_action_space = spaces.Discrete(3)
        self.t = np.zeros(num_envs, dtype=np.int64)

    def _obs(self):
        return (self.scale * self.t).astype(np.float32)[:, None]

    def reset(self, *, seed=None):
        self.t[:] = 0
        return self._obs()

    def step(self, actions):
        a = self.check_actions(actions)
        self.t += 1
        done = self.t >= self.every
        self.t[done] = 0
        return self._obs(), a.astype(np.float32), done


def make_counter(num_envs, scale=1.0, every=3):
    return Counter(num_envs, scale, every)


def make_counter_kwargs(num_envs, **options):
    """Takes any options (so only the plugin itself can refuse them)."""
    return Counter(num_envs, options.get("scale", 1.0), options.get("every", 3))


def make_gym_vector(num_envs):
    """A gymnasium vector environment in same-step mode: the registry wraps it."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    return gym.make_vec(
        "CartPole-v1",
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
    )


def make_next_step(num_envs):
    """A gymnasium vector environment that resets one step late: refused."""
    import gymnasium as gym

    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")


def make_not_an_env(num_envs):
    return object()


def make_wrong_count(num_envs):
    return Counter(num_envs + 1, 1.0, 3)


def make_raises(num_envs):
    raise RuntimeError("the simulator is not installed")


def make_dict_obs(num_envs):
    env = Counter(num_envs, 1.0, 3)
    env.single_observation_space = spaces.Dict({"x": spaces.Discrete(2)})
    return env


not_callable = 42


LOG: list = []  # the calls of Recorder environments, in order


class Recorder(Counter):
    """A Counter that logs every call to ``LOG``, and raises at step ``fail_at`` if given."""

    def __init__(self, num_envs: int, fail_at: int | None):
        super().__init__(num_envs, 1.0, 1000)
        self.fail_at, self.steps = fail_at, 0

    def reset(self, *, seed=None):
        LOG.append(("reset",))
        return super().reset(seed=seed)

    def step(self, actions):
        self.steps += 1
        if self.fail_at is not None and self.steps >= self.fail_at:
            raise RuntimeError(f"the recorder fails at step {self.steps}")
        LOG.append(("step", tuple(int(a) for a in actions)))
        return super().step(actions)


def make_recorder(num_envs, fail_at=None):
    return Recorder(num_envs, fail_at)


class _WrongObs(Counter):
    """Observes one value too many per instance (its space says 1)."""

    def _obs(self):
        return np.zeros((self.num_envs, 2), np.float32)


def make_wrong_obs_shape(num_envs):
    return _WrongObs(num_envs, 1.0, 3)


class _BadValues(Counter):
    """A Counter whose ``field`` (obs, reward or done) turns bad at step ``at``: ``value``
    is ``nan``, ``inf`` or ``float`` (a done of floats)."""

    def __init__(self, num_envs: int, field: str, value: str, at: int):
        super().__init__(num_envs, 1.0, 1000)
        self.field, self.value, self.at, self.steps = field, value, at, 0

    def step(self, actions):
        obs, reward, done = super().step(actions)
        self.steps += 1
        if self.steps >= self.at:
            if self.field == "done":
                done = done.astype(np.float32) + 0.5
            else:
                bad = np.float32(self.value)
                if self.field == "obs":
                    obs = obs.copy()
                    obs[-1, 0] = bad
                else:
                    reward = reward.copy()
                    reward[-1] = bad
        return obs, reward, done


def make_bad_values(num_envs, field="reward", value="nan", at=2):
    return _BadValues(num_envs, field, value, at)


class _CloseRaises(Counter):
    def close(self):
        raise OSError("the simulator's socket is already gone")


def make_close_raises(num_envs):
    return _CloseRaises(num_envs, 1.0, 1000)


class _Interrupts(Counter):
    """Raises KeyboardInterrupt at step ``at`` (as a Ctrl-C arriving during that step);
    sleeps ``delay`` seconds per step."""

    def __init__(self, num_envs: int, at: int, delay: float):
        super().__init__(num_envs, 1.0, 1000)
        self.at, self.delay, self.steps = at, delay, 0

    def step(self, actions):
        import time

        self.steps += 1
        if self.at and self.steps >= self.at:
            raise KeyboardInterrupt
        time.sleep(self.delay)
        return super().step(actions)


def make_interrupts(num_envs, at=0, delay=0.0):
    return _Interrupts(num_envs, at, delay)
