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
    def __init__(self, plan: dict):
        self.seed = plan.get("seed", 0)
        self.specs = {e["name"]: e for e in plan.get("envs", [])}
        self.instances: dict[str, object] = {}
        self.seeded: set[str] = set()

    def _instance(self, name: str):
        from timerlc.envs import EnvError, make

        if name not in self.instances:
            env = self.specs[name]
            try:
                self.instances[name] = make(env["spec"], env["num_envs"])
            except EnvError as e:
                raise RunError(
                    f"environment '{name}' ({env['spec']}) could not be made: {e.message}"
                ) from None
        return self.instances[name]

    def call(self, node: dict, action) -> tuple:
        name = node["_attrs"]["env"]
        inst = self._instance(name)
        try:
            if node["op"] == "env_reset":
                if name in self.seeded:
                    obs = inst.reset()
                else:
                    self.seeded.add(name)
                    obs = inst.reset(
                        seed=rng.seed32(self.seed) * 2**32 + rng.site_id(f"env:{name}")
                    )
                return (np.asarray(obs, np.float32),)
            obs, reward, done = inst.step(action)
        except RunError:
            raise
        except Exception as e:  # an environment is user code: any failure stops the run
            raise RunError(f"environment '{name}' raised {type(e).__name__}: {e}") from None
        return (np.asarray(obs, np.float32), np.asarray(reward, np.float32), np.asarray(done, bool))

    def close(self):
        for inst in self.instances.values():
            try:
                inst.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
