"""The vector-environment protocol every plugin implements, and its metadata helpers.

In: nothing (imported by the built-ins, the registry and plugins). Out: ``VectorEnv`` (the
base class a plugin's factory returns), ``EnvError``, ``EnvSpec`` and the attribute helpers
``obs_shape`` / ``obs_dim`` / ``num_actions`` / ``act_dim`` that give RTL's compile-time
``E.obs_shape``, ``E.obs_dim``, ``E.num_actions`` and ``E.act_dim`` (LANGUAGE.md section 10),
the per-instance random streams the built-ins draw their initial states from, and
``EpisodeStats``, which turns ``(reward, done)`` into the returns of finished episodes.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from timerlc import rng
from timerlc.diagnostics import TimerlcError


class EnvError(TimerlcError):
    """A plugin that cannot be found, built or used as asked (a bad ``--env``, bad options,
    an attribute its spaces do not have, actions of the wrong shape)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class VectorEnv:
    """``num_envs`` instances of one environment, stepped together on batched arrays.

    It follows gymnasium's vector-environment conventions, with two differences that
    suit the RTL ``E.reset()`` / ``E.step(a)`` calls: ``step`` returns ``(obs, reward,
    done)`` with ``done = terminated | truncated``, and the reset of a finished instance
    happens inside the same ``step`` (gymnasium's ``AutoresetMode.SAME_STEP``).

    Attributes a plugin sets:
      ``num_envs``: the number of instances (the extent of the RTL ``batch`` dim).
      ``single_observation_space``: a ``gymnasium.spaces.Box`` (float32 observations).
      ``single_action_space``: a ``gymnasium.spaces.Discrete`` (starting at 0) or ``Box``.
      ``array_module``: the module of the arrays ``reset``/``step`` take and return
        (``numpy``; ``cupy`` for a plugin that keeps its state on the GPU).

    Methods:
      ``reset(*, seed=None) -> obs``: starts a new episode in every instance. ``obs`` is
        float32 ``[num_envs, *obs_shape]``. With a seed the plugin's randomness restarts
        from it; without one it goes on from where it was (fresh entropy the first time).
      ``step(actions) -> (obs, reward, done)``: ``actions`` is ``[num_envs]`` integers for
        discrete actions, ``[num_envs, *act_shape]`` floats for continuous ones; ``reward``
        is float32 ``[num_envs]`` and ``done`` bool ``[num_envs]``. An instance whose
        episode ended in this step (terminated or truncated) has already been reset, and
        its row of ``obs`` is the first observation of its next episode.
      ``close()``: releases what the plugin holds; the object is not used afterwards.

    The arrays returned belong to the caller: the plugin never writes to them later.
    After each ``step`` a plugin may also leave, in ``info``, the bool arrays
    ``"terminated"`` and ``"truncated"`` and the float32 array ``"final_obs"`` (each row the
    observation the step reached before any reset), as gymnasium does.
    """

    num_envs: int
    single_observation_space: spaces.Space
    single_action_space: spaces.Space
    array_module: Any = np
    name: str = ""
    info: dict[str, Any]

    def reset(self, *, seed: int | None = None):
        raise NotImplementedError

    def step(self, actions):
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def spec(self) -> EnvSpec:
        return EnvSpec(self.name, self.single_observation_space, self.single_action_space)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name or '?'} num_envs={self.num_envs}>"

    # Helpers for subclasses.

    def check_actions(self, actions) -> np.ndarray:
        """``actions`` as an array of the action space's dtype and batched shape, checked."""
        return check_actions(actions, self.single_action_space, self.num_envs, self.name)


# ---------------------------------------------------------------------------------------
# Compile-time attributes.


def _what(name: str) -> str:
    return f"environment '{name}'" if name else "the environment"


def obs_shape(space: spaces.Space, name: str = "") -> tuple[int, ...]:
    """The shape of one observation (``E.obs_shape``)."""
    if not isinstance(space, spaces.Box):
        raise EnvError(
            f"{_what(name)} has a {type(space).__name__} observation space; "
            "timerlc needs a Box (flatten it, e.g. with gymnasium.wrappers.FlattenObservation)"
        )
    return tuple(int(n) for n in space.shape)


def obs_dim(space: spaces.Space, name: str = "") -> int:
    """The number of numbers in one observation (``E.obs_dim``)."""
    return math.prod(obs_shape(space, name))


def num_actions(space: spaces.Space, name: str = "") -> int:
    """The number of discrete actions (``E.num_actions``); an error for continuous ones."""
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    raise EnvError(
        f"{_what(name)} has continuous actions ({_describe_space(space)}), so it has no "
        "num_actions; use act_dim"
    )


def act_dim(space: spaces.Space, name: str = "") -> int:
    """The number of numbers in one continuous action (``E.act_dim``); an error for
    discrete ones."""
    if isinstance(space, spaces.Box):
        return math.prod(int(n) for n in space.shape)
    raise EnvError(
        f"{_what(name)} has discrete actions ({_describe_space(space)}), so it has no "
        "act_dim; use num_actions"
    )


def _describe_space(space: spaces.Space) -> str:
    if isinstance(space, spaces.Discrete):
        return f"Discrete({int(space.n)})"
    if isinstance(space, spaces.Box):
        return f"Box(shape={tuple(space.shape)}, dtype={np.dtype(space.dtype).name})"
    return type(space).__name__


def check_spaces(env: VectorEnv) -> None:
    """Raise ``EnvError`` when a plugin's spaces are not ones timerlc can use."""
    obs_shape(env.single_observation_space, env.name)
    space = env.single_action_space
    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise EnvError(
                f"{_what(env.name)} has discrete actions starting at "
                f"{int(space.start)}; timerlc needs them to start at 0"
            )
    elif not isinstance(space, spaces.Box):
        raise EnvError(
            f"{_what(env.name)} has a {type(space).__name__} action space; "
            "timerlc needs Discrete or Box"
        )


def check_actions(actions, space: spaces.Space, num_envs: int, name: str = "") -> np.ndarray:
    """Validate a batch of actions against ``space``; return it as a NumPy array."""
    a = np.asarray(actions)
    if isinstance(space, spaces.Discrete):
        if a.shape != (num_envs,):
            raise EnvError(f"{_what(name)} expects actions of shape ({num_envs},), got {a.shape}")
        if a.dtype.kind not in "iub":
            if a.dtype.kind != "f" or not np.all(a == np.floor(a)):
                raise EnvError(f"{_what(name)} expects integer actions, got {a.dtype}")
        a = a.astype(np.int64, copy=False)
        n = int(space.n)
        if a.size and (a.min() < 0 or a.max() >= n):
            bad = a[(a < 0) | (a >= n)][0]
            raise EnvError(f"{_what(name)} got action {bad}; its actions are 0..{n - 1}")
        return a
    shape = (num_envs, *space.shape)
    if a.shape != shape:
        if a.size != math.prod(shape):
            raise EnvError(f"{_what(name)} expects actions of shape {shape}, got {a.shape}")
        a = a.reshape(shape)
    return a.astype(space.dtype, copy=False)


@dataclass(frozen=True)
class EnvSpec:
    """What the compiler needs to know about a plugin: its name and its two spaces."""

    name: str
    observation_space: spaces.Space
    action_space: spaces.Space

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return obs_shape(self.observation_space, self.name)

    @property
    def obs_dim(self) -> int:
        return obs_dim(self.observation_space, self.name)

    @property
    def discrete(self) -> bool:
        return isinstance(self.action_space, spaces.Discrete)

    @property
    def num_actions(self) -> int:
        return num_actions(self.action_space, self.name)

    @property
    def act_dim(self) -> int:
        return act_dim(self.action_space, self.name)

    @property
    def act_shape(self) -> tuple[int, ...]:
        """The shape of one action: ``()`` for discrete actions."""
        return () if self.discrete else tuple(int(n) for n in self.action_space.shape)

    def attribute(self, attr: str):
        """The value of ``E.<attr>`` (``obs_shape``, ``obs_dim``, ``num_actions``,
        ``act_dim``), or ``EnvError`` when the spaces have no such attribute."""
        if attr not in ATTRIBUTES:
            raise EnvError(
                f"environments have no attribute '{attr}' (they have {', '.join(ATTRIBUTES)})"
            )
        return getattr(self, attr)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able summary (for build manifests and ``timerlc envs``)."""
        out: dict[str, Any] = {"name": self.name, "obs_shape": list(self.obs_shape)}
        if self.discrete:
            out["actions"] = {"kind": "discrete", "n": self.num_actions}
        else:
            space = self.action_space
            out["actions"] = {
                "kind": "box",
                "shape": list(self.act_shape),
                "low": np.asarray(space.low, dtype=np.float64).ravel().tolist(),
                "high": np.asarray(space.high, dtype=np.float64).ravel().tolist(),
            }
        return out


ATTRIBUTES = ("obs_shape", "obs_dim", "num_actions", "act_dim")


# ---------------------------------------------------------------------------------------
# Randomness and bookkeeping shared by the built-ins.


def positive_int(value, what: str) -> int:
    """``value`` as an int, or an ``EnvError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise EnvError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


RESET_SITE_BITS = 32  # a reset's point index: instance * 2**32 + the instance's reset count


class ResetStreams:
    """The random streams the built-ins draw their initial states from: counter-based
    Philox draws (``timerlc.rng``), so that the code generator's forms of the built-ins
    (``timerlc.codegen.envs``) draw the same numbers.

    A seed ``s`` (a non-negative int; ``None`` takes 64 fresh bits from the operating
    system) gives the Philox key ``(s mod 2**32, (s >> 32) mod 2**32)``. The ``c``-th reset
    of instance ``k`` since the seed draws element ``e`` of its initial state at point index
    ``k * 2**32 + c``, element index ``e``: an instance's episodes do not depend on how many
    instances run beside it, and a seeded reset starts every count again at 0.
    """

    def __init__(self, seed: int | None, num_envs: int):
        if seed is None:
            seed = secrets.randbits(64)
        elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise EnvError(f"an environment seed must be a non-negative integer, got {seed!r}")
        seed = int(seed)
        self.key = (seed % 2**32, (seed >> 32) % 2**32)
        self.counts = np.zeros(num_envs, dtype=np.int64)

    def uniform(self, rows, low, high, size: int) -> np.ndarray:
        """float64 ``[len(rows), size]``: ``low + (high - low) * u`` per element (``low``,
        ``high`` scalars or ``[size]`` arrays), the next reset of each instance of ``rows``."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        points = np.stack((rows, self.counts[rows]), axis=1)
        out = rng.uniform(
            self.key[0],
            self.key[1],
            points,
            (None, 2**RESET_SITE_BITS),
            (size,),
            np.float64,
            np.asarray(low, np.float64),
            np.asarray(high, np.float64),
        )
        self.counts[rows] += 1
        return out


class EpisodeStats:
    """Returns and lengths of finished episodes, from the ``(reward, done)`` of each step.

    The same recurrence an RTL program can write itself:
    ``acc[t+1] = (1 - f32(done[t])) * (acc[t] + r[t])``, with ``acc[t] + r[t]`` the return
    of an episode that finishes at step ``t``.
    """

    def __init__(self, num_envs: int):
        self.running_return = np.zeros(num_envs, dtype=np.float64)
        self.running_length = np.zeros(num_envs, dtype=np.int64)
        self.returns: list[float] = []
        self.lengths: list[int] = []

    def update(self, reward, done) -> np.ndarray:
        """Account one step; returns the returns of the episodes that finished in it."""
        reward = np.asarray(reward, dtype=np.float64)
        done = np.asarray(done, dtype=bool)
        self.running_return += reward
        self.running_length += 1
        finished = self.running_return[done].copy()
        self.returns.extend(finished.tolist())
        self.lengths.extend(self.running_length[done].tolist())
        self.running_return[done] = 0.0
        self.running_length[done] = 0
        return finished
