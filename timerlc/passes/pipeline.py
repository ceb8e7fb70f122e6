"""The ordered pipeline of passes. Each entry is ``(name, function)``; the names are the
``--dump-ir`` file names (``ir/01-autodiff.pdg``), after the front end's ``00-frontend``.

Ordering restriction: autodiff comes first, on the PDG as the front end built it, so
that every later pass (and every backend) sees only ordinary ops.
"""

from __future__ import annotations

from typing import Callable

from timerlc.ir.pdg import Graph
from timerlc.passes.autodiff import differentiate
from timerlc.passes.forward import forward_merge_reads
from timerlc.passes.incremental import incrementalize
from timerlc.passes.narrow import narrow
from timerlc.passes.noise import split_categorical
from timerlc.passes.simplify import simplify

PASSES: list[tuple[str, Callable[[Graph], Graph]]] = [
    ("autodiff", differentiate),
    ("forward", forward_merge_reads),
    ("incremental", incrementalize),
    ("noise", split_categorical),
    ("simplify", simplify),
    ("narrow", narrow),
]
LOWERING = ("autodiff",)  # what every backend needs; the rest optimizes for compiled ones


def run_pipeline(
    graph: Graph, on_stage: Callable[[str, Graph], None] | None = None, optimize: bool = True
) -> Graph:
    """Run every pass (only the lowering ones unless ``optimize``: the reference backend
    interprets the program as written); ``on_stage(name, graph)`` sees the graph after each
    (and before all, as ``frontend``)."""
    if on_stage is not None:
        on_stage("frontend", graph)
    for name, fn in PASSES:
        if not optimize and name not in LOWERING:
            continue
        graph = fn(graph)
        if on_stage is not None:
            on_stage(name, graph)
    return graph
