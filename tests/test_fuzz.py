"""The fuzzer (scripts/fuzz.py) in CI: a fixed seed, 150 mutants (some 35 s) of
programs/*.rtl, every one answered with exit 0, 1, 2 or 3, without a traceback or a hang.

The long run is ``scripts/fuzz.py --n 10000`` (docs/compiler.md, "Fuzzing").
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fuzz.py"


def _fuzz():
    spec = importlib.util.spec_from_file_location("timerlc_fuzz", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_mutant_gets_an_exit_status_and_no_traceback(tmp_path):
    fuzz = _fuzz()
    outcomes = fuzz.fuzz(150, seed=1, timeout=60.0, out=tmp_path / "failures")
    failed = [o for o in outcomes if o.failure]
    assert not failed, fuzz.summary(outcomes, 0.0) + "\n\n" + failed[0].failure
    commands = {o.case.command for o in outcomes}
    assert commands == {"check", "compile", "run"}
    # the mutants are not all refused: some still compile and run
    assert sum(o.status == 0 for o in outcomes) >= 10


def test_the_mutants_are_the_same_for_a_seed():
    fuzz = _fuzz()
    a = [(c.kind, c.text) for c in fuzz.cases(30, seed=7)]
    b = [(c.kind, c.text) for c in fuzz.cases(30, seed=7)]
    assert a == b and len({t for _, t in a}) > 20


def test_a_traceback_or_an_internal_error_is_a_failure(tmp_path, monkeypatch):
    fuzz = _fuzz()
    from timerlc import compiler

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(compiler, "check_program", broken)
    case = fuzz.Case(0, "none", "dim t < 2\nx[t] = 1.0\nout x\n", "check")
    outcome = fuzz.run_case(case, tmp_path, 30.0)
    assert outcome.failure and "ZeroDivisionError" in outcome.failure
