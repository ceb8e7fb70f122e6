"""The built-in ``pendulum`` environment: gymnasium's Pendulum-v1, vectorized with NumPy.

In: ``make(num_envs, g=10.0, max_episode_steps=200)``. Out: a ``VectorEnv`` with the
dynamics and reward of ``gymnasium.envs.classic_control.pendulum.PendulumEnv`` under
Pendulum-v1's 200-step ``TimeLimit``: continuous torque actions ``Box(-2, 2, (1,))``
(clipped to that range), float32 observations ``[cos(theta), sin(theta), theta_dot]``,
reward ``-(angle_normalize(theta)^2 + 0.1 theta_dot^2 + 0.001 u^2)``, never terminated,
truncated at step 200. Initial states are uniform in ``[-pi, pi) x [-1, 1)``, drawn from each
instance's own random stream (``base.ResetStreams``). Finished instances reset in the same step.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from timerlc.envs.base import EnvError, ResetStreams, VectorEnv, positive_int

MAX_SPEED = 8
MAX_TORQUE = 2.0
DT = 0.05
M = 1.0
L = 1.0
RESET_HIGH = np.array([np.pi, 1.0])


def angle_normalize(x):
    return ((x + np.pi) % (2 * np.pi)) - np.pi


class Pendulum(VectorEnv):
    """``num_envs`` pendulums; the state is float64 ``[num_envs, 2]`` (theta, theta_dot)."""

    name = "pendulum"

    def __init__(self, num_envs: int, g: float = 10.0, max_episode_steps: int = 200):
        self.num_envs = num_envs
        self.g = g
        self.max_episode_steps = max_episode_steps
        high = np.array([1.0, 1.0, MAX_SPEED], dtype=np.float32)
        self.single_observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.single_action_space = spaces.Box(-MAX_TORQUE, MAX_TORQUE, shape=(1,), dtype=np.float32)
        self.state = np.zeros((num_envs, 2), dtype=np.float64)
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self._streams: ResetStreams | None = None
        self.info = {}

    def _draw(self, rows) -> np.ndarray:
        return self._streams.uniform(rows, -RESET_HIGH, RESET_HIGH, 2)

    @staticmethod
    def _obs(state: np.ndarray) -> np.ndarray:
        theta, thetadot = state[:, 0], state[:, 1]
        return np.stack((np.cos(theta), np.sin(theta), thetadot), axis=1).astype(np.float32)

    def reset(self, *, seed: int | None = None) -> np.ndarray:
        if seed is not None or self._streams is None:
            self._streams = ResetStreams(seed, self.num_envs)
        self.state = self._draw(range(self.num_envs))
        self.steps[:] = 0
        self.info = {}
        return self._obs(self.state)

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._streams is None:
            raise EnvError("environment 'pendulum': step before reset")
        a = self.check_actions(actions)  # float32 [num_envs, 1], as gymnasium's Box gives
        th, thdot = self.state[:, 0], self.state[:, 1]
        g, m, ell, dt = self.g, M, L, DT
        # The operations, their order and their dtypes (float32 torque, float64 state)
        # are PendulumEnv.step's, so results are bit-equal.
        u = np.clip(a[:, 0], -MAX_TORQUE, MAX_TORQUE)
        costs = angle_normalize(th) ** 2 + 0.1 * thdot**2 + 0.001 * (u**2)
        newthdot = thdot + (3 * g / (2 * ell) * np.sin(th) + 3.0 / (m * ell**2) * u) * dt
        newthdot = np.clip(newthdot, -MAX_SPEED, MAX_SPEED)
        newth = th + newthdot * dt
        self.state = np.stack((newth, newthdot), axis=1)

        reward = (-costs).astype(np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        self.steps += 1
        truncated = self.steps >= self.max_episode_steps
        done = truncated

        final_obs = self._obs(self.state)
        obs = final_obs
        rows = np.flatnonzero(done)
        if rows.size:
            self.state[rows] = self._draw(rows)
            self.steps[rows] = 0
            obs = final_obs.copy()
            obs[rows] = self._obs(self.state[rows])
        self.info = {"terminated": terminated, "truncated": truncated, "final_obs": final_obs}
        return obs, reward, done.copy()


def make(num_envs: int, g: float = 10.0, max_episode_steps: int = 200) -> Pendulum:
    """Pendulum-v1; ``g`` is the gravity, ``max_episode_steps`` the truncation length."""
    if isinstance(g, bool) or not isinstance(g, (int, float)):
        raise EnvError(f"environment 'pendulum': g must be a number, got {g!r}")
    max_episode_steps = positive_int(max_episode_steps, "environment 'pendulum': max_episode_steps")
    return Pendulum(num_envs, float(g), max_episode_steps)
