"""Environment plugins: the ``env E = "PLUGIN" batch b`` handles of RTL (LANGUAGE.md section 10).

In: a plugin spec (``cartpole``, ``trivial?obs=3x64x64``, ``gym:CartPole-v1``,
``mypkg.envs:make``, or a name registered under the ``timerlc.envs`` entry point group) and
a number of instances. Out: a ``VectorEnv`` — ``reset(seed=...) -> obs`` and
``step(actions) -> (obs, reward, done)`` on batched NumPy arrays, with same-step
auto-reset — and the compile-time attributes ``obs_shape``, ``obs_dim``, ``num_actions``,
``act_dim`` read from its gymnasium spaces.

Modules: ``base`` (the protocol, ``EnvError``, ``EnvSpec``, attribute helpers, seeding),
``registry`` (spec parsing and lookup), the built-ins ``cartpole``, ``pendulum``,
``trivial``, and ``gymnasium_adapter`` (the ``gym:ENV_ID`` form). docs/envs.md shows how to
write and register a plugin.
"""

from timerlc.envs.base import (
    ATTRIBUTES,
    EnvError,
    EnvSpec,
    EpisodeStats,
    ResetStreams,
    VectorEnv,
    act_dim,
    num_actions,
    obs_dim,
    obs_shape,
)
from timerlc.envs.registry import (
    BUILTINS,
    ENTRY_POINT_GROUP,
    Plugin,
    available,
    describe,
    make,
    parse_spec,
    resolve,
)

__all__ = [
    "ATTRIBUTES",
    "BUILTINS",
    "ENTRY_POINT_GROUP",
    "EnvError",
    "EnvSpec",
    "EpisodeStats",
    "Plugin",
    "ResetStreams",
    "VectorEnv",
    "act_dim",
    "available",
    "describe",
    "make",
    "num_actions",
    "obs_dim",
    "obs_shape",
    "parse_spec",
    "resolve",
]
