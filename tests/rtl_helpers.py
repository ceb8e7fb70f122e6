"""Helpers for the language conformance tests (tests/test_language_*.py).

The tests are written from LANGUAGE.md alone: each runs a small RTL program on the
reference backend and compares its outputs with an answer computed by NumPy.
"""

from __future__ import annotations

import math
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from timerlc.diagnostics import ProgramError, Source
from timerlc.frontend.check import check_source
from timerlc.reference.interpreter import outputs, run_graph


def timerlc_cmd() -> list[str]:
    """The command that runs the installed ``timerlc`` (or the module, if no script)."""
    script = Path(sys.executable).with_name("timerlc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "timerlc.cli"]


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def run(text: str, **sets) -> dict[str, np.ndarray]:
    """Run a program (dedented) and return its `out` tensors (LANGUAGE.md section 12 layout)."""
    overrides = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in sets.items()}
    graph = check_source(Source("p.rtl", src(text)), overrides=overrides)
    want = outputs(run_graph(graph))
    if BACKENDS_COMPARED:
        compare_cpu(graph, want)
    return want


# Every conformance program also runs on the cpu backend, whose outputs must equal the
# reference's (set TIMERLC_TEST_CPU=0 to skip, e.g. while debugging the front end).
BACKENDS_COMPARED = os.environ.get("TIMERLC_TEST_CPU", "1") != "0"
# ... with its generated code; TIMERLC_TEST_NATIVE=0 runs the NumPy plan interpreter
# instead (docs/codegen.md: it must keep passing the whole differential suite)
NATIVE = os.environ.get("TIMERLC_TEST_NATIVE", "1") != "0"


def compare_cpu(graph, want: dict):
    from timerlc.compiler import compile_plan, generate_code, run_passes
    from timerlc.runtime.cpu import CpuRuntime

    gen = generate_code(compile_plan(run_passes(graph)))
    runtime = CpuRuntime(gen.plan, native=gen.text if NATIVE else None)
    runtime.run()
    for name, expected in want.items():
        got = runtime.value(name)
        assert got.dtype == expected.dtype, f"cpu: {name} is {got.dtype}, not {expected.dtype}"
        assert got.shape == expected.shape, f"cpu: {name} has shape {got.shape}"
        if expected.dtype.kind in "biu":
            np.testing.assert_array_equal(got, expected, err_msg=f"cpu: {name}")
        else:
            np.testing.assert_allclose(
                got, expected, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=f"cpu: {name}"
            )


def reference_and_native(graph):
    """(reference outputs, cpu outputs from generated code, the generated code) of a checked
    program: the reference runs it with the lowering passes only (as ``--backend
    reference`` does), the cpu backend optimized."""
    from timerlc.compiler import compile_plan, generate_code, run_passes
    from timerlc.runtime.cpu import CpuRuntime

    want = outputs(run_graph(run_passes(graph, optimize=False)))
    gen = generate_code(compile_plan(run_passes(graph)))
    runtime = CpuRuntime(gen.plan, native=gen.text)
    runtime.run()
    return want, {k: runtime.value(k) for k in want}, gen


def run1(text: str, name: str = "y", **sets) -> np.ndarray:
    return run(text, **sets)[name]


def check(text: str, **sets):
    overrides = {k: str(v) for k, v in sets.items()}
    return check_source(Source("p.rtl", src(text)), overrides=overrides)


def error(text: str, **sets) -> ProgramError:
    """The ProgramError a program gives (fails the test when it checks fine)."""
    with pytest.raises(ProgramError) as info:
        check(text, **sets)
    return info.value


def close(actual, expected, dtype=None, rtol=1e-6, atol=1e-6):
    """Values match (NaN-aware) and, when given, the dtype is exactly ``dtype``."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != expected {expected.shape}"
    if dtype is not None:
        assert actual.dtype == np.dtype(dtype), (
            f"dtype {actual.dtype} != expected {np.dtype(dtype)}"
        )
    if expected.dtype.kind in "biu" and actual.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_allclose(
            actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol
        )


def write(tmp_path: Path, text: str, name: str = "p.rtl") -> Path:
    p = tmp_path / name
    p.write_text(src(text))
    return p


def cli(*args):
    """Invoke the timerlc CLI in-process; returns click's Result (stdout, stderr, exit_code)."""
    from click.testing import CliRunner

    from timerlc.cli import cli as timerlc_cli

    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 always keeps stderr apart
        runner = CliRunner()
    return runner.invoke(timerlc_cli, [str(a) for a in args], catch_exceptions=False)


def table(name: str, values, dtype: str) -> str:
    """``name[k]``: the values, one per point of dim k (data the compiler cannot fold)."""
    items = ", ".join(f"{dtype}({lit(v)})" for v in values)
    return f"{name}[k] = take(stack([{items}]), k)\n"


def lit(v) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "0.0 / 0.0"
    if isinstance(v, float) and math.isinf(v):
        return ("1.0" if v > 0 else "-1.0") + " / 0.0"
    if isinstance(v, float) and v == 0 and math.copysign(1, v) < 0:
        return "-0.0"
    return repr(v)
