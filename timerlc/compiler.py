"""The compiler driver: source text -> checked PDG -> passes -> schedule -> plan -> kernels.

The one place the stages are called in order; the CLI, the runner, the scripts and the
tests go through it. Each stage's result can be seen with ``on_stage(name, value)``:
``frontend`` and each pass of ``passes.pipeline`` (a ``Graph``), then ``schedule`` (a
``Schedule``), ``plan`` (a ``Plan``) and ``kernels`` (``codegen.generate.Generated``).

Ordering restriction: the plan is made from the optimized graph (the reference backend runs
the graph as written, after the lowering passes only, and has no plan).

Under ``verify`` (the tests turn it on with ``TIMERLC_VERIFY=1``) the driver checks every
graph a pass returns (``ir.verify``) and that the plan reads back, through the runtime's
own checks, to the same plan (``plan.items``, ``runtime.plan.check_runnable``).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from timerlc.diagnostics import Source
from timerlc.ir.pdg import Graph
from timerlc.plan.items import Plan

OnStage = Callable[[str, Any], None]


def verifying() -> bool:
    """Whether the driver verifies between stages (``TIMERLC_VERIFY=1``)."""
    return os.environ.get("TIMERLC_VERIFY", "") == "1"


def check_program(
    source: Source, overrides: dict[str, str] | None = None, envs: dict[str, str] | None = None
) -> Graph:
    """The front end: a checked PDG, or a ``ProgramError`` with a span."""
    from timerlc.frontend.check import check_source

    return check_source(source, overrides, envs)


def run_passes(
    graph: Graph, on_stage: OnStage | None = None, optimize: bool = True, verify=None
) -> Graph:
    """The pass pipeline (only the lowering passes unless ``optimize``); ``on_stage`` sees
    the graph before the passes (``frontend``) and after each."""
    from timerlc.ir.verify import verify as verify_graph
    from timerlc.passes.pipeline import run_pipeline

    verify = verifying() if verify is None else verify

    def stage(name: str, g: Graph):
        if verify:
            verify_graph(g, lowered=name != "frontend")
        if on_stage is not None:
            on_stage(name, g)

    return run_pipeline(graph, stage, optimize)


def compile_plan(
    graph: Graph,
    source: str = "",
    on_stage: OnStage | None = None,
    memory_budget: int | None = None,
    verify=None,
) -> Plan:
    """Schedule an optimized PDG and make its plan; ``memory_budget``: the bytes of device
    memory its buffers may hold at once (None: no limit)."""
    from timerlc.plan.build import build_plan, check_limits
    from timerlc.schedule.build import build_schedule

    schedule = build_schedule(graph)
    if on_stage is not None:
        on_stage("schedule", schedule)
    plan = build_plan(graph, schedule, source, memory_budget)
    check_limits(graph, plan)
    if verifying() if verify is None else verify:
        _verify_plan(plan)
    if on_stage is not None:
        on_stage("plan", plan)
    return plan


def _verify_plan(plan: Plan):
    from timerlc.plan import items
    from timerlc.runtime.plan import check_runnable

    text = items.dumps(plan)
    again = items.loads(text, "the plan just compiled")
    check_runnable(again, "the plan just compiled")
    if items.dumps(again) != text:
        raise AssertionError("the plan does not read back to itself")


def generate_code(plan: Plan, on_stage: OnStage | None = None, target: str = "cpu"):
    """The plan's kernels for ``target`` (``cpu`` or ``cuda``; ``codegen.generate.Generated``:
    the plan with its ``kernels`` field, and the text of its kernel file, LLVM IR or CUDA
    C); ``on_stage`` sees it as ``kernels``."""
    from timerlc.codegen.generate import generate

    gen = generate(plan, target)
    if on_stage is not None:
        on_stage("kernels", gen)
    return gen


def compile_source(
    source: Source,
    overrides: dict[str, str] | None = None,
    envs: dict[str, str] | None = None,
    *,
    backend: str = "cpu",
    memory_budget: int | None = None,
    on_stage: OnStage | None = None,
    source_path: str | None = None,
) -> tuple[Graph, Plan | None, str | None]:
    """Every stage for ``backend``: the graph it runs (optimized for compiled backends)
    and, for them, its plan (with its ``kernels``) and the text of its kernel file (None,
    None for the reference backend); ``source_path``: the program's file as the plan
    records it (default: the source's name)."""
    compiled = backend != "reference"
    graph = run_passes(check_program(source, overrides, envs), on_stage, optimize=compiled)
    if not compiled:
        return graph, None, None
    plan = compile_plan(graph, source_path or source.name, on_stage, memory_budget)
    gen = generate_code(plan, on_stage, "cuda" if backend in ("cuda", "cuda-emu") else "cpu")
    return graph, gen.plan, gen.text
