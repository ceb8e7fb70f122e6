"""Environment calls at run time: instances, seeding and failures (LANGUAGE.md section 10).

The plan's loop tree already runs each environment's calls in their order; this module
makes the instances, seeds an environment at its first reset from the program's seed and
the environment's name (as the reference interpreter does, so both see the same episodes),
and turns any exception of an environment, which is user code, into a ``RunError``.
"""

from __future__ import annotations

import numpy as np

from timerlc import rng
from timerlc.diagnostics import RunError


class EnvRunner:
    def __init__(self, seed: int, envs: dict[str, tuple[str, int]], allow_nonfinite=False):
        """``envs``: each environment's name -> (plugin spec, number of instances);
        ``allow_nonfinite``: accept NaN or infinite observations and rewards (by default
        they stop the run: a NaN reward would only show up later as a NaN loss)."""
        self.seed = seed
        self.specs = envs
        self.allow_nonfinite = allow_nonfinite
        self.instances: dict[str, object] = {}
        self.seeded: set[str] = set()

    @classmethod
    def of_plan(cls, plan, allow_nonfinite: bool = False) -> "EnvRunner":
        """The environments of a plan (``timerlc.plan.items.Plan``)."""
        return cls(plan.seed, {e.name: (e.spec, e.num_envs) for e in plan.envs}, allow_nonfinite)

    def _instance(self, name: str):
        from timerlc.envs import EnvError, make

        if name not in self.instances:
            spec, num = self.specs[name]
            try:
                self.instances[name] = make(spec, num)
            except EnvError as e:
                raise RunError(
                    f"environment '{name}' ({spec}) could not be made: {e.message}"
                ) from None
        return self.instances[name]

    def call(self, name: str, op: str, action) -> tuple:
        """Run ``op`` (``env_reset`` or ``env_step``) of environment ``name``."""
        inst = self._instance(name)
        try:
            if op == "env_reset":
                if name in self.seeded:
                    obs = inst.reset()
                else:
                    self.seeded.add(name)
                    obs = inst.reset(
                        seed=rng.seed32(self.seed) * 2**32 + rng.site_id(f"env:{name}")
                    )
                return (self._checked(name, "reset", "obs", obs, np.float32, inst),)
            obs, reward, done = inst.step(action)
        except RunError:
            raise
        except Exception as e:  # an environment is user code: any failure stops the run
            raise RunError(f"environment '{name}' raised {type(e).__name__}: {e}") from e
        return (
            self._checked(name, "step", "obs", obs, np.float32, inst),
            self._checked(name, "step", "reward", reward, np.float32, inst),
            self._checked(name, "step", "done", done, bool, inst),
        )

    def explain(self, name: str, op: str, action, started: bool):
        """The error of a built-in's generated code that failed a call: what its NumPy form
        raises for the same call (a step before any reset, an action outside the space)."""
        from timerlc.envs import EnvError

        inst = self._instance(name)
        try:
            if op == "env_step" and not started:
                raise EnvError(f"environment '{inst.name}': step before reset")
            if op == "env_step":
                inst.check_actions(action)
        except EnvError as e:
            raise RunError(f"environment '{name}' raised EnvError: {e}") from e
        raise RunError(f"internal error: environment '{name}' failed in generated code")

    def _checked(self, name: str, op: str, what: str, value, dtype, inst) -> np.ndarray:
        """A returned array of the shape the program was compiled for (section 10), with
        finite values (unless allowed) and a ``done`` of bools (or of 0/1 integers)."""
        spec = self.specs[name][0]
        if dtype is bool:
            raw = np.asarray(value)
            if raw.dtype != np.bool_ and not (
                raw.dtype.kind in "iu" and np.isin(raw, (0, 1)).all()
            ):
                raise RunError(
                    f"environment '{name}' ({spec}) {op} returned a done of {raw.dtype} "
                    f"values{_example(raw)}; done must be bool (True where an episode ended)"
                )
        try:
            v = np.asarray(value, dtype)
        except (TypeError, ValueError) as e:
            raise RunError(f"environment '{name}' {op} returned a bad {what}: {e}") from None
        if dtype is not bool and not self.allow_nonfinite and not np.isfinite(v).all():
            bad = np.argwhere(~np.isfinite(v))[0]
            raise RunError(
                f"environment '{name}' ({spec}) {op} returned a non-finite {what} "
                f"({v[tuple(bad)]}) for instance {bad[0] if bad.size else 0}; pass "
                "--allow-nonfinite to accept NaN and infinite values from environments"
            )
        n = self.specs[name][1]
        space = getattr(inst, "single_observation_space", None)
        want = (n,) + tuple(space.shape) if what == "obs" and space is not None else (n,)
        if v.shape != want:
            raise RunError(
                f"environment '{name}' {op} returned {what} of shape {list(v.shape)}, but "
                f"{list(want)} was expected ({n} instances)"
            )
        return v

    def close(self) -> list[str]:
        """Close every instance; a warning for each that raised (the run's results stand)."""
        warnings = []
        for name, inst in self.instances.items():
            try:
                inst.close()
            except Exception as e:  # noqa: BLE001 - a plugin is user code
                warnings.append(
                    f"environment '{name}' ({self.specs[name][0]}) raised in close(): "
                    f"{type(e).__name__}: {e}"
                )
        return warnings


def _example(a: np.ndarray) -> str:
    """`` (e.g. 0.5)``: one value of ``a``, for a message."""
    return f" (e.g. {a.flat[0]})" if a.size else ""
