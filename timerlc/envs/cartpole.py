"""The built-in ``cartpole`` environment: gymnasium's CartPole-v1, vectorized with NumPy.

In: ``make(num_envs, max_episode_steps=500, sutton_barto_reward=False)``. Out: a
``VectorEnv`` whose dynamics, reward, termination and truncation are those of
``gymnasium.envs.classic_control.cartpole.CartPoleEnv`` under CartPole-v1's 500-step
``TimeLimit``: the same constants and explicit Euler integrator on a float64 state, float32
observations ``[x, x_dot, theta, theta_dot]``, reward 1.0 on every step including the one
that terminates, termination when ``|x| > 2.4`` or ``|theta| > 12 degrees``, truncation at
step 500. Initial states are uniform in ``[-0.05, 0.05)`` and drawn from each instance's
own random stream (``base.ResetStreams``). Finished instances reset in the same step
(LANGUAGE.md section 10). ``timerlc.codegen.envs`` has the same environment as generated
code, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces

from timerlc.envs.base import EnvError, ResetStreams, VectorEnv, positive_int

GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5  # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02  # seconds between state updates
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
RESET_LOW, RESET_HIGH = -0.05, 0.05


class CartPole(VectorEnv):
    """``num_envs`` cart-poles; the state is float64 ``[num_envs, 4]``."""

    name = "cartpole"

    def __init__(
        self, num_envs: int, max_episode_steps: int = 500, sutton_barto_reward: bool = False
    ):
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        self.sutton_barto_reward = sutton_barto_reward
        high = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], dtype=np.float32)
        self.single_observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.single_action_space = spaces.Discrete(2)
        self.state = np.zeros((num_envs, 4), dtype=np.float64)
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self._streams: ResetStreams | None = None
        self.info = {}

    def reset(self, *, seed: int | None = None) -> np.ndarray:
        if seed is not None or self._streams is None:
            self._streams = ResetStreams(seed, self.num_envs)
        self.state = self._streams.uniform(range(self.num_envs), RESET_LOW, RESET_HIGH, 4)
        self.steps[:] = 0
        self.info = {}
        return self.state.astype(np.float32)

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._streams is None:
            raise EnvError("environment 'cartpole': step before reset")
        a = self.check_actions(actions)
        x, x_dot, theta, theta_dot = self.state.T
        # The operations and their order are CartPoleEnv.step's, so results are bit-equal.
        force = np.where(a == 1, FORCE_MAG, -FORCE_MAG)
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + POLEMASS_LENGTH * np.square(theta_dot) * sintheta) / TOTAL_MASS
        thetaacc = (GRAVITY * sintheta - costheta * temp) / (
            LENGTH * (4.0 / 3.0 - MASSPOLE * np.square(costheta) / TOTAL_MASS)
        )
        xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
        x = x + TAU * x_dot
        x_dot = x_dot + TAU * xacc
        theta = theta + TAU * theta_dot
        theta_dot = theta_dot + TAU * thetaacc
        self.state = np.stack((x, x_dot, theta, theta_dot), axis=1)

        terminated = (
            (x < -X_THRESHOLD)
            | (x > X_THRESHOLD)
            | (theta < -THETA_THRESHOLD)
            | (theta > THETA_THRESHOLD)
        )
        self.steps += 1
        truncated = self.steps >= self.max_episode_steps
        if self.sutton_barto_reward:
            reward = np.where(terminated, -1.0, 0.0).astype(np.float32)
        else:
            reward = np.ones(self.num_envs, dtype=np.float32)
        done = terminated | truncated

        final_obs = self.state.astype(np.float32)
        obs = final_obs
        rows = np.flatnonzero(done)
        if rows.size:
            self.state[rows] = self._streams.uniform(rows, RESET_LOW, RESET_HIGH, 4)
            self.steps[rows] = 0
            obs = final_obs.copy()
            obs[rows] = self.state[rows].astype(np.float32)
        self.info = {"terminated": terminated, "truncated": truncated, "final_obs": final_obs}
        return obs, reward, done


def make(
    num_envs: int, max_episode_steps: int = 500, sutton_barto_reward: bool = False
) -> CartPole:
    """CartPole-v1; ``max_episode_steps`` is the truncation length."""
    max_episode_steps = positive_int(max_episode_steps, "environment 'cartpole': max_episode_steps")
    if not isinstance(sutton_barto_reward, bool):
        raise EnvError(
            f"environment 'cartpole': sutton_barto_reward must be true or false, "
            f"got {sutton_barto_reward!r}"
        )
    return CartPole(num_envs, max_episode_steps, sutton_barto_reward)
