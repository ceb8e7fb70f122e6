"""The ``gym:ENV_ID`` plugin form: any registered gymnasium environment as a ``VectorEnv``.

In: ``make(env_id, num_envs, vectorization_mode="sync", **kwargs)``; ``kwargs`` go to the
environment's constructor as in ``gymnasium.make`` (e.g. ``gym:CartPole-v1?
sutton_barto_reward=true``, ``max_episode_steps=100``). Out: a ``GymVectorEnv`` wrapping
``gymnasium.make_vec(..., vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})``
(or any gymnasium vector environment in that mode that a plugin's factory returns):
observations cast to float32, rewards to float32, ``done = terminated | truncated``, and the
terminal observations of finished instances in ``info["final_obs"]``. ``reset(seed=s)``
seeds instance ``i`` with ``s + i``, gymnasium's convention. Only Box observation spaces and
Discrete (from 0) or Box action spaces are accepted.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from timerlc.envs.base import EnvError, VectorEnv, check_spaces

MODES = ("sync", "async")


def _float32_box(space: spaces.Space) -> spaces.Space:
    if not isinstance(space, spaces.Box) or space.dtype == np.float32:
        return space
    return spaces.Box(
        np.asarray(space.low, dtype=np.float32),
        np.asarray(space.high, dtype=np.float32),
        dtype=np.float32,
    )


def _unknown_id(env_id: str) -> EnvError:
    import difflib

    import gymnasium as gym

    ids = sorted(gym.registry.keys())
    close = [i for i in ids if i.lower() == env_id.lower()]
    close = close or difflib.get_close_matches(env_id, ids, n=1)
    hint = f"; did you mean 'gym:{close[0]}'?" if close else ""
    return EnvError(f"gym:{env_id}: gymnasium has no environment with that id{hint}")


class GymVectorEnv(VectorEnv):
    """A gymnasium vector environment in same-step auto-reset mode, behind the timerlc
    protocol. ``GymVectorEnv(env, name)`` wraps one already made (a plugin's factory may
    return one: the registry wraps it)."""

    def __init__(self, env, name: str):
        from gymnasium.vector import AutoresetMode

        self._env = env
        self.name = name
        self.num_envs = int(env.num_envs)
        try:
            if env.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
                raise EnvError(
                    f"environment '{name}' does not auto-reset in the same step "
                    "(make it with autoreset_mode=AutoresetMode.SAME_STEP)"
                )
            self.single_observation_space = _float32_box(env.single_observation_space)
            self.single_action_space = env.single_action_space
            check_spaces(self)
        except EnvError:
            env.close()
            raise
        self.info = {}

    @property
    def gym_env(self):
        """The wrapped ``gymnasium.vector.VectorEnv``."""
        return self._env

    def reset(self, *, seed: int | None = None) -> np.ndarray:
        obs, _ = self._env.reset(seed=seed)
        self.info = {}
        return np.array(obs, dtype=np.float32)

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a = self.check_actions(actions)
        obs, reward, terminated, truncated, info = self._env.step(a)
        obs = np.array(obs, dtype=np.float32)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        done = terminated | truncated
        final_obs = obs
        if done.any() and "final_obs" in info:
            final_obs = obs.copy()
            for i in np.flatnonzero(info.get("_final_obs", done)):
                final_obs[i] = np.asarray(info["final_obs"][i], dtype=np.float32)
        self.info = {"terminated": terminated, "truncated": truncated, "final_obs": final_obs}
        return obs, np.asarray(reward, dtype=np.float32), done

    def close(self) -> None:
        self._env.close()


def make(env_id: str, num_envs: int, vectorization_mode: str = "sync", **kwargs) -> GymVectorEnv:
    """``gymnasium.make_vec(env_id, num_envs, ...)`` with same-step auto-reset, wrapped."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    if vectorization_mode not in MODES:
        raise EnvError(
            f"gym:{env_id}: vectorization_mode must be one of "
            f"{', '.join(MODES)}, got {vectorization_mode!r}"
        )
    try:
        env = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode=vectorization_mode,
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            **kwargs,
        )
    except gym.error.UnregisteredEnv:
        raise _unknown_id(env_id) from None
    except (gym.error.Error, TypeError, ValueError, ImportError) as e:
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no options"
        raise EnvError(f"gym:{env_id}: cannot make it ({shown}): {e}") from None
    return GymVectorEnv(env, f"gym:{env_id}")
