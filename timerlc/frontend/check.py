"""The front end's entry point: source text -> a checked PDG.

parse -> configs -> declarations and domains -> typing and lowering -> polyhedral checks.
"""

from __future__ import annotations

from pathlib import Path

from timerlc.diagnostics import Source
from timerlc.frontend.configs import evaluate_configs
from timerlc.frontend.declarations import collect
from timerlc.frontend.defs import check_defs
from timerlc.frontend.envrtl import desugar
from timerlc.frontend.lower import lower
from timerlc.frontend.optimizers import expand_optimizers
from timerlc.frontend.parser import parse
from timerlc.ir.pdg import Graph
from timerlc.poly.checks import check_all


def check_source(
    source: Source, overrides: dict[str, str] | None = None, envs: dict[str, str] | None = None
) -> Graph:
    """Check a program; raises ``ProgramError`` on the first error found."""
    program = expand_optimizers(parse(source.text))
    configs = evaluate_configs(program, overrides or {})
    base = Path(source.name).parent
    info = collect(program, configs, envs, base)
    rewritten = desugar(program, info)
    if rewritten is not program:  # environments written in RTL became equations
        info = collect(rewritten, configs, envs, base)
    check_defs(info)
    graph = lower(info)
    check_all(graph)
    return graph
