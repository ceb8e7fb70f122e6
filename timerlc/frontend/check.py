"""The front end's entry point: source text -> a checked PDG.

parse -> configs -> declarations and domains -> typing and lowering -> polyhedral checks.
"""

from __future__ import annotations

from timerlc.diagnostics import Source
from timerlc.frontend.configs import evaluate_configs
from timerlc.frontend.declarations import collect
from timerlc.frontend.defs import check_defs
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
    info = collect(program, configs, envs)
    check_defs(info)
    graph = lower(info)
    check_all(graph)
    return graph
