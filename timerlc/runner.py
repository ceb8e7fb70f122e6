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

from timerlc.diagnostics import RunError, TimerlcError
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
    """The warning for a plan whose memory budget swapping cannot meet, else None: the
    smallest budget it can meet, and the buffers on the device then that no swap moves."""
    if plan.memory_budget is None or plan.memory_budget_met is not False:
        return None
    budget, peak = plan.memory_budget, plan.memory_peak
    head = (
        f"timerlc: warning: the memory budget of {format_bytes(budget)} cannot be met; the "
        f"smallest this plan can meet is {format_bytes(peak)}"
    )
    if peak < plan.memory_peak_unswapped:
        head += (
            f" (swapping blocks to host memory brings the peak down to it from "
            f"{format_bytes(plan.memory_peak_unswapped)})"
        )
    if plan.memory_floor_item is None:
        return head
    from timerlc.plan.items import Loop

    item = plan.tree[plan.memory_floor_item]
    if isinstance(item, Loop):
        dim = _loop_dim(plan, item)
        where = f"the loop over {dim}" if dim else "a loop"
        note = " (a loop keeps the buffers of all its iterations)"
    else:
        where, note = f"the call of {_buffer_name(plan, item.statement)}", ""
    kept = {sid for _, sid, _ in plan.outputs + plan.metrics}
    rows = []
    for sid in plan.memory_floor[:8]:
        buf = plan.buffer(sid)
        if sid in kept:
            why = "an output or metric, kept to the end"
        elif buf.window is not None:
            why = f"a ring buffer along {' and '.join(w.dim for w in buf.windows)}"
        else:
            why = "used there"
        rows.append(f"  {_buffer_name(plan, sid)}: {format_bytes(buf.nbytes)}, {why}")
    more = len(plan.memory_floor) - len(rows)
    if more > 0:
        rows.append(f"  and {more} smaller buffer{'s' if more > 1 else ''}")
    return f"{head}; during {where} these must be on the device{note}:\n" + "\n".join(rows)


def _loop_dim(plan: Plan, loop) -> str | None:
    """The dim a top-level loop of the plan runs over: the first loop dim of the statements
    it calls."""
    from timerlc.plan.items import Call, If, Loop

    todo = list(loop.body)
    while todo:
        it = todo.pop(0)
        if isinstance(it, Call):
            loops = plan.statement(it.statement).loops
            return loops[0] if loops else None
        if isinstance(it, Loop):
            todo[:0] = list(it.body)
        elif isinstance(it, If):
            todo[:0] = list(it.then) + list(it.orelse)
    return None


def _buffer_name(plan: Plan, sid: int) -> str:
    """A buffer's tensor, or for an unnamed one the tensor it is part of and its line."""
    name = plan.buffer(sid).name
    if name:
        return name
    part, line = plan.statement(sid).node.where
    return f"%{sid} (part of {part}{f', line {line}' if line else ''})"


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit} ({n} bytes)"
    return "1 byte" if n == 1 else f"{n} bytes"


def run_reference(
    graph: Graph,
    outputs_path=None,
    metrics_path=None,
    progress=False,
    profile=False,
    allow_nonfinite=False,
):
    """Run a checked PDG (as written: after the lowering passes only) on the reference
    interpreter; ``allow_nonfinite``: accept NaN or infinite values from environments."""
    from timerlc.reference.interpreter import Interpreter, needed_bytes

    def make(on_metric):
        return Interpreter(graph, on_metric, profile, allow_nonfinite=allow_nonfinite)

    interp = _execute(
        make,
        metric_dims(graph),
        graph.dim_bounds,
        bool(graph.metrics),
        graph.outputs,
        outputs_path,
        metrics_path,
        progress,
        needed_bytes(graph),
    )
    if profile:
        _print_profile(graph, interp)
    return interp


def run_plan(
    plan: Plan,
    outputs_path=None,
    metrics_path=None,
    progress=False,
    profile=False,
    allow_nonfinite=False,
    native: str | None = None,
    cache=None,
    device=None,
):
    """Run a plan on the cpu runtime, or with ``device`` on the device runtime
    (``runtime.cuda``; this path never imports the compiler); with ``profile``, print where
    the time went; ``allow_nonfinite``: accept NaN or infinite values from environments;
    ``native``: the text of the plan's kernel file (its statements without a kernel, or all
    without it, are interpreted); ``cache``: the folder of its compiled machine code (a
    build's ``kernels/``)."""
    from timerlc.runtime.cpu import CpuRuntime, needed_bytes

    def make(on_metric):
        if device is not None:
            from timerlc.runtime.cuda import DeviceRuntime

            return DeviceRuntime(
                plan,
                on_metric,
                text=native,
                device=device,
                profile=profile,
                allow_nonfinite=allow_nonfinite,
                cache=cache,
            )
        return CpuRuntime(
            plan,
            on_metric,
            profile=profile,
            allow_nonfinite=allow_nonfinite,
            native=native,
            cache=cache,
        )

    started = time.perf_counter()
    engine = _execute(
        make,
        plan_metric_dims(plan),
        plan.bounds,
        bool(plan.metrics),
        [name for name, _, _ in plan.outputs],
        outputs_path,
        metrics_path,
        progress,
        needed_bytes(plan),
    )
    if profile:
        _print_plan_profile(plan, engine, time.perf_counter() - started)
    elif device is not None:
        _print_device_summary(engine, time.perf_counter() - started)
    return engine


def _print_device_summary(rt, wall: float):
    """A device run's one line (``--profile`` says more): its launches, how many of them a
    CUDA graph replayed, and the device's peak memory."""
    arena = f" of which an arena of {format_bytes(rt.layout.size)}" if rt.layout else ""
    # (the emulation's module, kept from an earlier run)
    kept = "; the kernels' module loaded, not compiled" if rt.module_cached else ""
    print(
        f"device runtime: {wall:.3f} s run on {rt.device.describe()}: {rt.launches} launches "
        f"and {rt.blas_calls} BLAS products ({rt.graph_launches} of them replayed from "
        f"{rt.graphs_made} CUDA graphs), device peak {format_bytes(rt.device_peak_bytes)}"
        f"{arena}{kept}",
        file=sys.stderr,
    )
    _print_products(rt)


def _print_products(rt):
    """Which products with kernels of ours ran as ours and which as the BLAS's, by shape
    (``DeviceRuntime.product_choices``), with the times where they were timed."""
    _print_joints(rt)
    _print_chains(rt)
    choices = getattr(rt, "product_choices", None)
    if not choices:
        return
    ours = sum(1 for *_, o in choices.values() if o)
    timed = any(b is not None for b, _, _ in choices.values())
    how = ": each timed at its first call" if timed else f" ({rt.device.products})"
    print(
        f"  products of {len(choices)} shapes with kernels of ours: {ours} ran as ours, "
        f"{len(choices) - ours} as the BLAS's{how}",
        file=sys.stderr,
    )
    for key, (blas, own, mine) in sorted(choices.items()):
        if blas is None:
            continue
        dtype, m, n, k, _, ta, _, tb, _, *fused = key
        shape = f"{m}x{n}x{k}{' A^T' if ta else ''}{' B^T' if tb else ''} {dtype}"
        if fused:  # (ours with an epilogue or column sums: the BLAS's timed with the
            # function after it)
            shape += f" with what follows it ({' then '.join(fused)})"
        far = getattr(rt, "product_disagreements", {}).get(key)
        wrong = "" if far is None else f" (ours faster, but its C {far:.1e} from the BLAS's)"
        print(
            f"    {shape}: ours {1e6 * own:.1f} us, the BLAS's {1e6 * blas:.1f} us -> "
            f"{'ours' if mine else 'the BLAS'}{wrong}",
            file=sys.stderr,
        )


def _print_chains(rt):
    """Which chains (steps over the same rows as one function: ``DeviceRuntime.
    chain_choices``) ran, and which ran as the launches they stand for, with the times
    where they were timed."""

    def row(key, apart, chain, mine):
        return (
            f"{' '.join(key[1:])}: the chain {1e6 * chain:.1f} us, the launches "
            f"{1e6 * apart:.1f} us -> {'the chain' if mine else 'the launches'}"
        )

    _print_choices(
        getattr(rt, "chain_choices", None),
        lambda ran, apart: (
            f"chains: {ran} of {ran + apart} ran as one function, {apart} as "
            "the launches they stand for"
        ),
        row,
    )


def _print_joints(rt):
    """Which pairs of products with joint functions (a layer's ``dz @ W^T`` and its
    weight's gradient in one pass, TF32: ``DeviceRuntime.joint_choices``) ran joint, with
    the times where they were timed."""

    def row(key, apart, together, mine):
        far = getattr(rt, "product_disagreements", {}).get(key)
        wrong = "" if far is None else f" (joint faster, but a C {far:.1e} from the other's)"
        return (
            f"{' then '.join(key[1:])}: joint {1e6 * together:.1f} us, apart "
            f"{1e6 * apart:.1f} us -> {'joint' if mine else 'apart'}{wrong}"
        )

    _print_choices(
        getattr(rt, "joint_choices", None),
        lambda joint, apart: (
            f"pairs of products in one pass (TF32): {joint} ran so, {apart} apart"
        ),
        row,
    )


def _print_choices(choices, count, row):
    """A line of how many of ``choices`` (key -> ``(the other way's seconds or None, this
    way's, whether this way ran)``) ran this way and how many the other (``count``), then
    a line for each that was timed (``row``)."""
    if not choices:
        return
    mine = sum(1 for *_, c in choices.values() if c)
    print(f"  {count(mine, len(choices) - mine)}", file=sys.stderr)
    for key, (other, this, chosen) in sorted(choices.items()):
        if other is not None:
            print(f"    {row(key, other, this, chosen)}", file=sys.stderr)


def _print_plan_profile(plan: Plan, rt, wall: float):
    """The statements that took the most time, with their loops and vectorized dims."""
    total = sum(rt.seconds.values())
    native = ""
    if hasattr(rt, "device"):
        arena = f" of which an arena of {format_bytes(rt.layout.size)}" if rt.layout else ""
        native = (
            f" on {rt.device.describe()} ({rt.launches} launches, {rt.blas_calls} BLAS "
            f"products, device peak {format_bytes(rt.device_peak_bytes)}{arena}, "
            f"{format_bytes(rt.uploaded)} copied up, {format_bytes(rt.downloaded)} down; "
            "each statement's calls launched alone: no CUDA graphs, no fused kernels)"
        )
    elif rt.module is not None:
        how = "loaded, not compiled," if rt.module.cached else "compiled for this CPU"
        pool = rt.module.pool
        from timerlc.runtime.native import blas_core

        threads = 1 + (pool.workers if pool is not None else 0)
        core = blas_core()  # (None where no BLAS was found)
        native = (
            f" (the kernels {how} in {rt.native_seconds:.3f} s; "
            f"{threads} thread{'s' if threads > 1 else ''}"
            f"{f'; OpenBLAS {core}' if core else ''})"
        )
    print(
        f"{'device' if hasattr(rt, 'device') else 'cpu'} runtime: {wall:.3f} s run{native}, "
        f"{total:.3f} s in {sum(rt.calls.values())} "
        f"statement calls; peak buffers {format_bytes(rt.peak_bytes)}, kernels' scratch "
        f"reserved {format_bytes(rt.scratch_bytes)}",
        file=sys.stderr,
    )
    _print_products(rt)
    # the device runtime: the device's seconds too (between marks around each call's
    # launches), and the statements sorted by the larger of the two
    device = getattr(rt, "device_seconds", None) or {}
    if device:
        print(
            f"  device: {sum(device.values()):.3f} s in the statements' launches "
            "(each call's, from its first launch to its last's end)",
            file=sys.stderr,
        )
    print(
        f"  seconds{'  device s' if device else ''}    calls   us/call  statement", file=sys.stderr
    )
    # a fused kernel's time is counted at its first statement (codegen.fuse), a row loop's
    # (codegen.rows) too: a call is then the whole loop
    fused = {f[0]: f[1:] for f in plan.kernels.fused} if plan.kernels else {}
    by_rows = {f[0]: f[1:] for f in plan.kernels.row_loops} if plan.kernels else {}
    order = sorted(rt.seconds.items(), key=lambda kv: -max(kv[1], device.get(kv[0], 0.0)))
    for sid, sec in order[:15]:
        st = plan.statement(sid)
        name = plan.buffer(sid).name or f"%{sid}"
        for group, what in ((by_rows, "its loop by rows"), (fused, "fused")):
            if sid in group:
                rest = " ".join(f"%{s}" for s in group[sid][:6])
                more = " ..." if len(group[sid]) > 6 else ""
                others = f" with {len(group[sid])}: {rest}{more}" if group[sid] else ""
                name += f" ({what}{others})"
                break
        ops = " ".join(n.op for n in st.nodes[-4:])
        calls = rt.calls[sid]
        dev = f" {device.get(sid, 0.0):9.3f}" if device else ""
        print(
            f"  {sec:7.3f}{dev} {calls:8d} {1e6 * sec / max(calls, 1):9.1f}  {name} "
            f"loops [{', '.join(st.loops)}] vector [{', '.join(st.vector)}]: {ops}",
            file=sys.stderr,
        )


def _execute(
    make,
    mdims,
    bounds,
    has_metrics,
    outputs,
    outputs_path,
    metrics_path,
    progress,
    needed_bytes: int | None = None,
):
    """Run the engine ``make(on_metric)`` gives, streaming metrics, then save the outputs.

    Before anything is opened: ``needed_bytes`` must fit in the memory available (else a
    ``RunError``, exit 3). Whatever stops the run (a failure, Ctrl-C, SIGTERM, a bug of
    timerlc's), the metrics written so far are flushed and the outputs computed so far are
    saved, with a ``NAME.__valid__`` mask per array (docs/interruptions.md); a second
    interruption during the save abandons it and leaves an earlier file as it was.
    """
    from timerlc import files

    if needed_bytes is not None:
        avail = files.memory_available()
        if avail is not None and needed_bytes > avail:
            raise RunError(
                f"the run needs {format_bytes(needed_bytes)} of memory (its buffers and their temporaries) and the "
                f"machine has {format_bytes(avail)} available; lower the program's sizes"
            )
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
    stopped = None
    complete = False
    try:
        engine = make(on_metric)
        engine.run()
        complete = True
    except RunError as e:
        failure = e
    except MemoryError as e:  # NumPy's allocation failures are MemoryErrors too
        failure = RunError(f"out of memory: {e}")
        failure.__cause__ = e
    except TimerlcError:
        raise  # (a program's or a usage error found on the way: nothing ran)
    except (KeyboardInterrupt, Exception) as e:  # noqa: BLE001 - save what was computed, then
        stopped = e  # stop: Ctrl-C, SIGTERM, or a bug of timerlc's (cli: an internal error)
    finally:
        if bar:
            bar.close()
        if metrics_file:
            metrics_file.close()
        if engine is not None:
            for warning in engine.envs.close():
                print(f"timerlc: warning: {warning}", file=sys.stderr)
    note = ""
    if outputs_path and engine is not None:
        try:
            note = _save_outputs(engine, outputs, outputs_path, complete)
        except Exception:  # (after a bug of timerlc's the state may not hold together)
            if not isinstance(stopped, Exception):
                raise
            note = f"the outputs could not be saved to {outputs_path}"
    elif outputs_path:
        note = f"nothing was computed; {outputs_path} was not written"
    if stopped is not None:
        if note:
            print(f"timerlc: {note}", file=sys.stderr)
        raise stopped
    if failure is not None:
        raise RunError(f"{failure}{f' ({note})' if note else ''}") from failure
    return engine


def _save_outputs(engine, outputs, outputs_path: str, complete: bool) -> str:
    """Save the outputs (with their ``__valid__`` masks unless ``complete``); the note for a
    stopped run's message ("" after a complete run saved); a failed save of a complete run
    is a ``RunError``."""
    from timerlc import files

    arrays = {name: engine.value(name) for name in outputs}
    if not complete:
        for name in outputs:
            arrays[name + files.VALID_SUFFIX] = engine.computed(name)
    try:
        files.save_npz(outputs_path, arrays)
    except OSError as e:
        if complete:
            raise RunError(f"cannot write the outputs to {outputs_path}: {e.strerror}") from e
        return f"the outputs could not be saved to {outputs_path}: {e.strerror}"
    except KeyboardInterrupt as e:
        print(
            f"timerlc: interrupted again while saving the outputs: {outputs_path} was not "
            "written (an earlier file there is unchanged)",
            file=sys.stderr,
        )
        raise e from None
    if complete:
        return ""
    example = f" (e.g. {outputs[0]}{files.VALID_SUFFIX})" if outputs else ""
    return (
        f"the outputs computed so far are saved to {outputs_path}, with a mask "
        f"NAME{files.VALID_SUFFIX} of the points computed for each array NAME{example}"
    )


def _print_profile(graph: Graph, interp):
    total = sum(interp.seconds.values())
    rows = sorted(interp.seconds.items(), key=lambda kv: -kv[1])[:15]
    print(f"reference interpreter: {total:.3f} s computing stored points", file=sys.stderr)
    for nid, s in rows:
        node = graph.node(nid)
        print(f"  {s:9.4f} s  {node.name or '%' + str(nid):20s} {node.op}", file=sys.stderr)
