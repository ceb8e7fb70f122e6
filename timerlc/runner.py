"""Running a compiled program, with outputs, metrics and progress: a plan on the cpu
runtime (this path never imports the compiler), or a checked PDG on the reference
interpreter.

In: a plan or a PDG, and the ``run`` options. Out: the ``--outputs`` file and the metric
stream.
A failure still flushes the metrics written so far and saves the outputs computed so far.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import numpy as np

from timerlc.diagnostics import RunError
from timerlc.metrics import MetricsFile, Progress

if TYPE_CHECKING:  # the plan path below must not import the compiler
    from timerlc.ir.pdg import Graph
    from timerlc.plan.items import Plan


def metric_dims(graph: Graph) -> list[str]:
    used = set()
    for name in graph.metrics:
        used.update(graph.node(graph.tensor(name).node).dims)
    return [d.name for d in graph.dims if d.name in used]


def plan_metric_dims(plan: Plan) -> list[str]:
    used = set()
    for _, sid, _ in plan.metrics:
        used.update(plan.buffer(sid).dims)
    return [d for d, _ in plan.dims if d in used]


def budget_warning(plan: Plan) -> str | None:
    """The one-line warning for a plan whose memory budget swapping cannot meet, else None."""
    if plan.memory_budget is None or plan.memory_budget_met is not False:
        return None
    budget, peak = plan.memory_budget, plan.memory_peak
    unswapped = plan.memory_peak_unswapped
    head = f"timerlc: warning: the memory budget of {format_bytes(budget)} cannot be met: "
    if peak < unswapped:
        return (
            head + f"swapping blocks to host memory lowers the buffers' peak from "
            f"{format_bytes(unswapped)} to {format_bytes(peak)} at best"
        )
    return (
        head + f"the buffers' peak is {format_bytes(peak)} and no swap at the top level of the "
        "loop tree lowers it (an item keeps every buffer it uses on the device: a loop, those of "
        "all its iterations)"
    )


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit} ({n} bytes)"
    return "1 byte" if n == 1 else f"{n} bytes"


def run_reference(
    graph: Graph, outputs_path=None, metrics_path=None, progress=False, profile=False
):
    """Run a checked PDG (as written: after the lowering passes only) on the reference
    interpreter."""
    from timerlc.reference.interpreter import Interpreter

    def make(on_metric):
        return Interpreter(graph, on_metric, profile)

    interp = _execute(
        make,
        metric_dims(graph),
        graph.dim_bounds,
        bool(graph.metrics),
        graph.outputs,
        outputs_path,
        metrics_path,
        progress,
    )
    if profile:
        _print_profile(graph, interp)
    return interp


def run_plan(plan: Plan, outputs_path=None, metrics_path=None, progress=False, profile=False):
    """Run a plan on the cpu runtime (this path never imports the compiler); with
    ``profile``, print where the time went."""
    from timerlc.runtime.cpu import CpuRuntime

    started = time.perf_counter()
    engine = _execute(
        lambda on_metric: CpuRuntime(plan, on_metric, profile=profile),
        plan_metric_dims(plan),
        plan.bounds,
        bool(plan.metrics),
        [name for name, _, _ in plan.outputs],
        outputs_path,
        metrics_path,
        progress,
    )
    if profile:
        _print_plan_profile(plan, engine, time.perf_counter() - started)
    return engine


def _print_plan_profile(plan: Plan, rt, wall: float):
    """The statements that took the most time, with their loops and vectorized dims."""
    total = sum(rt.seconds.values())
    print(
        f"cpu runtime: {wall:.3f} s run, {total:.3f} s in {sum(rt.calls.values())} statement "
        f"calls; peak buffers {format_bytes(rt.peak_bytes)}",
        file=sys.stderr,
    )
    print("  seconds    calls   us/call  statement", file=sys.stderr)
    for sid, sec in sorted(rt.seconds.items(), key=lambda kv: -kv[1])[:15]:
        st = plan.statement(sid)
        name = plan.buffer(sid).name or f"%{sid}"
        ops = " ".join(n.op for n in st.nodes[-4:])
        calls = rt.calls[sid]
        print(
            f"  {sec:7.3f} {calls:8d} {1e6 * sec / max(calls, 1):9.1f}  {name} "
            f"loops [{', '.join(st.loops)}] vector [{', '.join(st.vector)}]: {ops}",
            file=sys.stderr,
        )


def _execute(make, mdims, bounds, has_metrics, outputs, outputs_path, metrics_path, progress):
    sinks = []
    metrics_file = MetricsFile(metrics_path, mdims) if metrics_path else None
    if metrics_file:
        sinks.append(metrics_file.write)
    bar = None
    if progress and has_metrics:
        outer = mdims[0] if mdims else None
        bar = Progress(outer, bounds.get(outer) if outer else None)
        sinks.append(bar.update)

    def on_metric(name, point, value):
        for s in sinks:
            s(name, point, value)

    engine = None
    failure = None
    interrupted = None
    try:
        engine = make(on_metric)
        engine.run()
    except RunError as e:
        failure = e
    except MemoryError as e:  # NumPy's allocation failures are MemoryErrors too
        failure = RunError(f"out of memory: {e}")
        failure.__cause__ = e
    except KeyboardInterrupt as e:  # Ctrl-C: save what was computed, then stop
        interrupted = e
    finally:
        if engine is not None:
            engine.envs.close()
        if bar:
            bar.close()
        if metrics_file:
            metrics_file.close()
    if outputs_path and engine is not None:
        arrays = {name: engine.value(name) for name in outputs}
        try:
            np.savez(outputs_path, **arrays)
        except OSError as e:
            raise RunError(f"cannot write the outputs to {outputs_path}: {e.strerror}") from e
    if interrupted is not None:
        raise interrupted
    if failure is not None:
        saved = f" (outputs computed so far saved to {outputs_path})" if outputs_path else ""
        raise RunError(f"{failure}{saved}") from failure
    return engine


def _print_profile(graph: Graph, interp):
    total = sum(interp.seconds.values())
    rows = sorted(interp.seconds.items(), key=lambda kv: -kv[1])[:15]
    print(f"reference interpreter: {total:.3f} s computing stored points", file=sys.stderr)
    for nid, s in rows:
        node = graph.node(nid)
        print(f"  {s:9.4f} s  {node.name or '%' + str(nid):20s} {node.op}", file=sys.stderr)
