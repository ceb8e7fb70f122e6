"""The built-in ``trivial`` environment: cheap deterministic dynamics for memory and scale tests.

In: ``make(num_envs, obs=4, actions=2, length=10)``; ``obs`` is an observation shape, an
int or a string like ``"3x64x64"`` (``--env E='trivial?obs=3x64x64&actions=6'``). Out: a
``VectorEnv`` with ``Discrete(actions)`` actions and float32 observations of that shape.

Every instance counts the steps ``t`` of its episode (0 after a reset). A step with action
``a`` earns reward 1.0 when ``a == t % actions`` (else 0.0), then ``t`` becomes ``t + 1``;
the episode ends (terminated) when ``t == length``, so the best return is ``length``. The
observation is ``t + a / actions`` plus a ramp over the observation's elements,
``ramp[k] = k / obs_dim`` in row-major order (so a transposed or shifted observation is
noticed); a fresh episode observes ``ramp`` alone. The seed is ignored. A step costs about
one pass over the ``[num_envs, *obs]`` observation it returns.
"""

from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces

from timerlc.envs.base import EnvError, VectorEnv, positive_int


def parse_shape(value) -> tuple[int, ...]:
    """``4``, ``"4"``, ``"3x64x64"`` or ``(3, 64, 64)`` as a shape tuple."""
    bad = EnvError(
        f"environment 'trivial': obs must be a shape of positive sizes like 4 or "
        f"3x64x64, got {value!r}"
    )
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        parts = [value]
    elif isinstance(value, str):
        parts = value.lower().split("x")
    elif isinstance(value, (tuple, list)):
        parts = list(value)
    else:
        raise bad
    try:
        dims = [int(p) for p in parts]
    except (TypeError, ValueError):
        raise bad from None
    if not dims or any(d < 1 for d in dims):
        raise bad
    return tuple(dims)


class Trivial(VectorEnv):
    """``num_envs`` step counters with observations of any shape."""

    name = "trivial"

    def __init__(self, num_envs: int, obs_shape: tuple[int, ...], actions: int, length: int):
        self.num_envs = num_envs
        self.actions = actions
        self.length = length
        self.single_observation_space = spaces.Box(
            -np.inf, np.inf, shape=obs_shape, dtype=np.float32
        )
        self.single_action_space = spaces.Discrete(actions)
        size = math.prod(obs_shape)
        self._ramp = (np.arange(size, dtype=np.float64) / size).astype(np.float32)
        self.t = np.zeros(num_envs, dtype=np.int64)
        self._started = False
        self.info = {}

    def _observe(self, value: np.ndarray) -> np.ndarray:
        obs = np.empty((self.num_envs, self._ramp.size), dtype=np.float32)
        np.add(value[:, None], self._ramp[None, :], out=obs)
        return obs.reshape((self.num_envs, *self.single_observation_space.shape))

    def reset(self, *, seed: int | None = None) -> np.ndarray:
        self._started = True
        self.t[:] = 0
        self.info = {}
        return self._observe(np.zeros(self.num_envs, dtype=np.float32))

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self._started:
            raise EnvError("environment 'trivial': step before reset")
        a = self.check_actions(actions)
        reward = (a == self.t % self.actions).astype(np.float32)
        self.t += 1
        done = self.t >= self.length
        value = (self.t + a / self.actions).astype(np.float32)
        value[done] = 0.0
        self.t[done] = 0
        self.info = {"terminated": done.copy(), "truncated": np.zeros_like(done)}
        return self._observe(value), reward, done


def make(num_envs: int, obs=4, actions: int = 2, length: int = 10) -> Trivial:
    """A trivial environment: observation shape ``obs``, ``actions`` discrete actions,
    episodes of ``length`` steps."""
    shape = parse_shape(obs)
    actions = positive_int(actions, "environment 'trivial': actions")
    length = positive_int(length, "environment 'trivial': length")
    return Trivial(num_envs, shape, actions, length)
