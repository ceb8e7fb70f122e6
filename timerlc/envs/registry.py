"""Finding environment plugins by name: the ``PLUGIN`` of ``env E = "PLUGIN"`` / ``--env E=...``.

In: a spec string ``NAME`` or ``NAME?key=value&key=value``. Out: ``resolve(spec)`` gives a
``Plugin`` (a factory with its options bound: ``plugin(num_envs) -> VectorEnv``);
``make(spec, num_envs)`` builds the environment; ``describe(spec)`` gives its ``EnvSpec``
(the compile-time attributes); ``available()`` lists what ``timerlc envs`` shows.

NAME is looked up in this order (LANGUAGE.md section 10):
  1. a built-in: ``cartpole``, ``pendulum``, ``trivial``;
  2. an entry point named NAME in the group ``timerlc.envs`` of an installed distribution;
  3. ``package.module:factory`` (the current directory is also searched for ``package``);
  4. ``gym:ENV_ID``, any registered gymnasium environment.
(``gym:`` is recognised before the ``module:factory`` form, so a module named ``gym``
cannot be used that way.) Option values are parsed as int, float, bool (``true``/``false``)
or else kept as strings; a plugin parses richer values itself (``trivial?obs=3x64x64``).
A factory is ``factory(num_envs, **options) -> VectorEnv``. Every failure is an ``EnvError``
whose message says what was wrong and, where it can, what was meant.
"""

from __future__ import annotations

import contextlib

import difflib
import functools
import importlib
import importlib.metadata
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from timerlc.envs.base import EnvError, EnvSpec, VectorEnv, check_spaces, positive_int

ENTRY_POINT_GROUP = "timerlc.envs"
GYM_PREFIX = "gym:"

BUILTINS: dict[str, tuple[str, str]] = {
    "cartpole": (
        "timerlc.envs.cartpole:make",
        "gymnasium's CartPole-v1 in NumPy: 2 discrete actions, obs 4, 500-step episodes "
        "(options: max_episode_steps, sutton_barto_reward)",
    ),
    "pendulum": (
        "timerlc.envs.pendulum:make",
        "gymnasium's Pendulum-v1 in NumPy: 1 continuous action in [-2, 2], obs 3, "
        "200-step episodes (options: g, max_episode_steps)",
    ),
    "trivial": (
        "timerlc.envs.trivial:make",
        "cheap deterministic counter for memory and scale tests "
        "(options: obs=4 or e.g. 3x64x64, actions=2, length=10)",
    ),
}

FORMS: tuple[tuple[str, str], ...] = (
    (
        "FILE.rtl",
        "an environment written in RTL (docs/envs.md), a path relative to the program's folder "
        "or the current one (options set its configs)",
    ),
    (
        "gym:ENV_ID",
        "any registered gymnasium environment, e.g. gym:CartPole-v1 "
        "(options go to its constructor)",
    ),
    (
        "package.module:factory",
        "a function factory(num_envs, **options) returning a timerlc.envs.VectorEnv",
    ),
)


@dataclass(frozen=True)
class Plugin:
    """A resolved spec: ``plugin(num_envs)`` builds the environment."""

    spec: str
    name: str
    factory: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)
    origin: str = ""

    def __call__(self, num_envs: int) -> VectorEnv:
        num_envs = positive_int(num_envs, f"environment '{self.name}': num_envs")
        try:
            env = self.factory(num_envs, **self.options)
        except EnvError:
            raise
        except Exception as e:
            raise EnvError(
                f"environment '{self.spec}' failed to start: {type(e).__name__}: {e}"
            ) from e
        env = _as_vector_env(env, self.name)
        if env.num_envs != num_envs:
            with contextlib.suppress(Exception):  # the error below is the one to report
                env.close()
            raise EnvError(
                f"environment '{self.name}' made {env.num_envs} instances, "
                f"not the {num_envs} asked for"
            )
        return env

    def describe(self) -> EnvSpec:
        """The spaces of the environment (one instance is made, then closed)."""
        env = self(1)
        spec = EnvSpec(self.name, env.single_observation_space, env.single_action_space)
        try:
            env.close()
        except Exception as e:  # noqa: BLE001 - a plugin is user code
            raise EnvError(
                f"environment '{self.spec}' raised in close(): {type(e).__name__}: {e}"
            ) from e
        return spec


def _as_vector_env(env, name: str) -> VectorEnv:
    """Check what a factory returned; wrap a gymnasium vector environment."""
    if not isinstance(env, VectorEnv):
        try:
            import gymnasium
        except ImportError:  # pragma: no cover - gymnasium is a dependency
            gymnasium = None
        if gymnasium is not None and isinstance(env, gymnasium.vector.VectorEnv):
            from timerlc.envs.gymnasium_adapter import GymVectorEnv

            return GymVectorEnv(env, name)
        needed = ("num_envs", "single_observation_space", "single_action_space", "reset", "step")
        missing = [a for a in needed if not hasattr(env, a)]
        if missing:
            raise EnvError(
                f"the factory of environment '{name}' returned "
                f"{type(env).__name__}, which is not a VectorEnv "
                f"(it lacks {', '.join(missing)})"
            )
    if not getattr(env, "name", ""):
        try:
            env.name = name
        except AttributeError:
            pass
    check_spaces(env)
    return env


# ---------------------------------------------------------------------------------------
# Specs.


def parse_value(text: str) -> int | float | bool | str:
    """An option value: int, float, ``true``/``false``, else the string itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"NAME?k=v&k2=v2"`` -> ``("NAME", {"k": v, "k2": v2})``."""
    if not isinstance(spec, str) or not spec.strip():
        raise EnvError("an environment plugin name is empty")
    name, _, query = spec.strip().partition("?")
    name = name.strip()
    if not name:
        raise EnvError(f"'{spec}' has options but no plugin name")
    options: dict[str, Any] = {}
    for item in filter(None, query.split("&")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise EnvError(f"environment '{name}': option '{item}' is not key=value")
        if not key.isidentifier():
            raise EnvError(f"environment '{name}': option name '{key}' is not an identifier")
        if key in options:
            raise EnvError(f"environment '{name}': option '{key}' is given twice")
        options[key] = parse_value(value.strip())
    return name, options


# ---------------------------------------------------------------------------------------
# Lookup.


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def _import_module(module_name: str, target: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        top = module_name.split(".")[0]
        cwd = os.getcwd()
        if e.name == top and "" not in sys.path and cwd not in sys.path:
            # `timerlc` runs as a console script, whose sys.path lacks the current directory
            # that `python -m` would have; look there too for the user's own module.
            sys.path.insert(0, cwd)
            return _import_module(module_name, target)
        raise EnvError(
            f"environment '{target}': cannot import module '{module_name}' ({e})"
        ) from None
    except Exception as e:
        raise EnvError(
            f"environment '{target}': importing module '{module_name}' failed: "
            f"{type(e).__name__}: {e}"
        ) from e


def load_object(target: str) -> Callable[..., Any]:
    """``"package.module:attr.attr"`` -> that callable."""
    module_name, _, attrs = target.partition(":")
    if not module_name or not attrs:
        raise EnvError(f"environment '{target}': expected package.module:factory")
    obj = _import_module(module_name, target)
    where = module_name
    for attr in attrs.split("."):
        if not hasattr(obj, attr):
            names = [
                n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))
            ]
            close = difflib.get_close_matches(attr, names, n=1)
            hint = f"; did you mean '{where}:{close[0]}'?" if close else ""
            raise EnvError(f"environment '{target}': '{where}' has no '{attr}'{hint}")
        obj = getattr(obj, attr)
        where = f"{where}.{attr}" if where != module_name else f"{module_name}:{attr}"
    if not callable(obj):
        raise EnvError(f"environment '{target}': '{attrs}' is not a function")
    return obj


def _known_names() -> list[str]:
    return sorted(set(BUILTINS) | set(_entry_points()))


def _unknown(name: str) -> EnvError:
    known = _known_names()
    lowered = {k.lower(): k for k in known}
    close = [lowered[name.lower()]] if name.lower() in lowered else []
    if not close:
        import gymnasium

        ids = {i.lower(): i for i in gymnasium.registry.keys()}
        if name.lower() in ids:
            close = [GYM_PREFIX + ids[name.lower()]]
    close = close or difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return EnvError(
        f"unknown environment '{name}'{hint} (known: {', '.join(known)}; "
        "or gym:ENV_ID, package.module:factory)"
    )


def _check_options(name: str, factory: Callable[..., Any], options: dict[str, Any]) -> None:
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(1, **options)
    except TypeError:
        params = [
            p.name
            for p in list(sig.parameters.values())[1:]
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        bad = [k for k in options if k not in params]
        if not bad:
            raise EnvError(
                f"environment '{name}': its factory cannot take the options {', '.join(options)}"
            ) from None
        close = difflib.get_close_matches(bad[0], params, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        has = f"its options are {', '.join(params)}" if params else "it takes no options"
        raise EnvError(f"environment '{name}' has no option '{bad[0]}'{hint} ({has})") from None


def resolve(spec: str) -> Plugin:
    """Find the plugin a spec names; check its options against its factory's signature."""
    name, options = parse_spec(spec)
    if name in BUILTINS:
        factory, origin = load_object(BUILTINS[name][0]), "built-in"
    elif name in (eps := _entry_points()):
        ep = eps[name]
        try:
            factory = ep.load()
        except Exception as e:
            raise EnvError(
                f"environment '{name}' (entry point {ep.value}) failed to load: "
                f"{type(e).__name__}: {e}"
            ) from e
        if not callable(factory):
            raise EnvError(f"environment '{name}': entry point {ep.value} is not a function")
        origin = f"entry point {ep.value}"
    elif name.startswith(GYM_PREFIX):
        env_id = name[len(GYM_PREFIX) :].strip()
        if not env_id:
            raise EnvError("environment 'gym:' names no gymnasium environment (gym:ENV_ID)")
        from timerlc.envs import gymnasium_adapter

        factory = functools.partial(gymnasium_adapter.make, env_id)
        origin = "gymnasium"
    elif ":" in name:
        factory, origin = load_object(name), f"module {name}"
    else:
        raise _unknown(name)
    _check_options(name, factory, options)
    return Plugin(spec=spec.strip(), name=name, factory=factory, options=options, origin=origin)


def make(spec: str, num_envs: int) -> VectorEnv:
    """Build ``num_envs`` instances of the environment a spec names."""
    return resolve(spec)(num_envs)


def describe(spec: str) -> EnvSpec:
    """The spaces and compile-time attributes of the environment a spec names."""
    return resolve(spec).describe()


def available() -> list[tuple[str, str]]:
    """``(name, description)`` of every plugin that can be found, for ``timerlc envs``."""
    rows = [(name, text) for name, (_, text) in BUILTINS.items()]
    for name, ep in sorted(_entry_points().items()):
        if name in BUILTINS:
            continue
        dist = getattr(ep, "dist", None)
        source = f" from {dist.name}" if dist is not None and dist.name else ""
        rows.append((name, f"entry point {ep.value}{source}"))
    from timerlc.frontend import envrtl

    for name in envrtl.builtin_names():
        rows.append((f"rtl:{name}", f"the built-in {name} written in RTL (timerlc/envs/rtl)"))
    rows.extend(FORMS)
    return rows
