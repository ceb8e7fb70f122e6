"""The golden dumps of ``programs/*.rtl`` (``tests/goldens/``): the IR after every pass and
the plan must be exactly what ``scripts/goldens.py`` wrote. A change that means to change a
decision of the compiler regenerates them with that script; the diff is part of its commit.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _goldens():
    spec = importlib.util.spec_from_file_location("goldens", ROOT / "scripts" / "goldens.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


goldens = _goldens()


@pytest.mark.parametrize(
    "folder, program, overrides, budget",
    [(p.stem, f"programs/{p.name}", {}, None) for p in sorted(goldens.PROGRAMS.glob("*.rtl"))]
    + goldens.VARIANTS,
)
def test_dumps_equal_the_goldens(folder, program, overrides, budget):
    found = {folder: goldens.dumps(program, overrides, budget)}
    diff = goldens.differences(found, only=[folder])
    assert not diff, (
        "the compiler's decisions changed; if that is meant, run `python scripts/goldens.py` "
        "and review the diff:\n" + "\n".join(diff[:80])
    )
