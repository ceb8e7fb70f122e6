"""Running a checked program on a backend, with outputs, metrics and progress.

In: a PDG and the ``run`` options. Out: the ``--outputs`` file and the metric stream.
A failure still flushes the metrics written so far and saves the outputs computed so far.
"""

from __future__ import annotations

import sys

import numpy as np

from timerlc.diagnostics import RunError
from timerlc.ir.pdg import Graph
from timerlc.metrics import MetricsFile, Progress


def metric_dims(graph: Graph) -> list[str]:
    used = set()
    for name in graph.metrics:
        used.update(graph.node(graph.tensor(name).node).dims)
    return [d.name for d in graph.dims if d.name in used]


def run_program(
    graph: Graph, backend: str, outputs_path=None, metrics_path=None, progress=False, profile=False
):
    from timerlc.reference.interpreter import Interpreter

    sinks = []
    metrics_file = MetricsFile(metrics_path, metric_dims(graph)) if metrics_path else None
    if metrics_file:
        sinks.append(metrics_file.write)
    bar = None
    if progress and graph.metrics:
        dims = metric_dims(graph)
        outer = dims[0] if dims else None
        bar = Progress(outer, graph.dim_bounds.get(outer) if outer else None)
        sinks.append(bar.update)

    def on_metric(name, point, value):
        for s in sinks:
            s(name, point, value)

    interp = Interpreter(graph, on_metric, profile)
    failure = None
    try:
        interp.run()
    except RunError as e:
        failure = e
    finally:
        interp.envs.close()
        if bar:
            bar.close()
        if metrics_file:
            metrics_file.close()
    if outputs_path:
        arrays = {name: interp.value(name) for name in graph.outputs}
        np.savez(outputs_path, **arrays)
    if profile:
        _print_profile(graph, interp)
    if failure is not None:
        saved = f" (outputs computed so far saved to {outputs_path})" if outputs_path else ""
        raise RunError(f"{failure}{saved}")
    return interp


def _print_profile(graph: Graph, interp):
    total = sum(interp.seconds.values())
    rows = sorted(interp.seconds.items(), key=lambda kv: -kv[1])[:15]
    print(f"reference interpreter: {total:.3f} s computing stored points", file=sys.stderr)
    for nid, s in rows:
        node = graph.node(nid)
        print(f"  {s:9.4f} s  {node.name or '%' + str(nid):20s} {node.op}", file=sys.stderr)
