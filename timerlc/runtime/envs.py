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
    def __init__(self, seed: int, envs: dict[str, tuple[str, int]]):
        """``envs``: each environment's name -> (plugin spec, number of instances)."""
        self.seed = seed
        self.specs = envs
        self.instances: dict[str, object] = {}
        self.seeded: set[str] = set()

    @classmethod
    def of_plan(cls, plan) -> "EnvRunner":
        """The environments of a plan (``timerlc.plan.items.Plan``)."""
        return cls(plan.seed, {e.name: (e.spec, e.num_envs) for e in plan.envs})

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

    def _checked(self, name: str, op: str, what: str, value, dtype, inst) -> np.ndarray:
        """A returned array of the shape the program was compiled for (section 10)."""
        try:
            v = np.asarray(value, dtype)
        except (TypeError, ValueError) as e:
            raise RunError(f"environment '{name}' {op} returned a bad {what}: {e}") from None
        n = self.specs[name][1]
        space = getattr(inst, "single_observation_space", None)
        want = (n,) + tuple(space.shape) if what == "obs" and space is not None else (n,)
        if v.shape != want:
            raise RunError(
                f"environment '{name}' {op} returned {what} of shape {list(v.shape)}, but "
                f"{list(want)} was expected ({n} instances)"
            )
        return v

    def close(self):
        for inst in self.instances.values():
            try:
                inst.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
