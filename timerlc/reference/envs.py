"""Environment calls for the reference interpreter: instances, call order, seeding.

Calls of one environment happen in the order of their keys (the point of their first
output without the batch dim, LANGUAGE.md section 10). The interpreter asks ``before``
for the call that must run first; a call runs only after it. The first ``reset`` of an
environment seeds it from the program's seed and the environment's name; later resets
continue its random streams.
"""

from __future__ import annotations


from timerlc import ops
from timerlc.diagnostics import RunError
from timerlc.ir import index as ix
from timerlc.ir.pdg import Graph
from timerlc.runtime.envs import EnvRunner


class EnvCalls:
    def __init__(self, graph: Graph, points_of, allow_nonfinite: bool = False):
        """``points_of(nid)`` gives the points (int array [n, ndims]) of a call node."""
        self.graph = graph
        self.bound = graph.dim_bounds
        self.runner = EnvRunner(
            dict(graph.configs).get("seed", 0),
            {e.name: (e.spec, self.bound[e.batch]) for e in graph.envs},
            allow_nonfinite,
        )
        self.pred: dict[tuple[int, tuple], tuple[int, tuple] | None] = {}
        calls: dict[str, list] = {}
        for n in graph.nodes:
            if ops.is_env(n.op):
                calls.setdefault(n.attr("env"), []).append(n)
        for env, nodes in calls.items():
            self._order(env, nodes, points_of)

    def _order(self, env: str, nodes, points_of):
        key_dims = {n.attr("key_dims") for n in nodes}
        if len(key_dims) > 1:
            raise RunError(
                f"the calls of environment '{env}' define tensors over different dims "
                f"({' and '.join(', '.join(k) for k in sorted(key_dims))}); their order is unclear"
            )
        entries = []
        for n in nodes:
            pts = points_of(n.id)
            fns = [ix.compile_expr(k, n.dims) for k in n.attr("key")]
            for p in pts:
                p = tuple(int(v) for v in p)
                key = tuple(int(f(*p)) for f in fns)
                entries.append((key, n.id, p))
        entries.sort()
        prev = None
        for key, nid, p in entries:
            if prev is not None and prev[0] == key:
                raise RunError(
                    f"two calls of environment '{env}' define the same point {list(key)} of their "
                    "first output"
                )
            self.pred[(nid, p)] = None if prev is None else (prev[1], prev[2])
            prev = (key, nid, p)

    def before(self, nid: int, point: tuple) -> tuple[int, tuple] | None:
        return self.pred[(nid, point)]

    def call(self, node, action) -> tuple:
        return self.runner.call(node.attr("env"), node.op, action)

    def close(self) -> list[str]:
        return self.runner.close()
