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


# the compiled backends the differential suite runs, the first of them where a test runs
# only one: cpu, and cuda-emu (the CUDA kernels on the device runtime, emulated on the CPU:
# docs/cuda.md) where there is a host C++ compiler; TIMERLC_TEST_BACKEND chooses among cpu,
# cuda-emu and, on a GPU, cuda (comma-separated)
def _test_backends() -> tuple[str, ...]:
    from timerlc.cuda.emu import compiler

    given = os.environ.get("TIMERLC_TEST_BACKEND")
    if given is None:
        return ("cpu", "cuda-emu") if compiler() is not None else ("cpu",)
    names = tuple(given.split(","))
    if not names or not set(names) <= {"cpu", "cuda-emu", "cuda"}:
        raise ValueError(f"TIMERLC_TEST_BACKEND={given}: expected cpu, cuda-emu or cuda")
    return names


TEST_BACKENDS = _test_backends()
TEST_BACKEND = TEST_BACKENDS[0]


def compiled_run(graph, on_metric=None, backend: str | None = None, memory_budget=None):
    """(the runtime after a run of the optimized program on ``backend``, default the one
    under test; the generated code)."""
    from timerlc.compiler import compile_plan, run_passes

    plan = compile_plan(run_passes(graph), memory_budget=memory_budget)
    return plan_run(plan, on_metric, backend)


def plan_run(plan, on_metric=None, backend: str | None = None):
    """(the runtime after a run of ``plan`` with its kernels for ``backend``, default the
    one under test; the generated code)."""
    from timerlc.compiler import generate_code
    from timerlc.runtime.cpu import CpuRuntime

    backend = backend or TEST_BACKEND
    if backend in ("cuda-emu", "cuda"):
        from timerlc.runtime.cuda import DeviceRuntime, device_for

        gen = generate_code(plan, target="cuda")
        runtime = DeviceRuntime(gen.plan, on_metric, text=gen.text, device=device_for(backend))
        runtime.run()
        # (every run of calls went through the fused kernel the trees made of it: the
        # kernels the run's compile left out, kernels.covered, were never needed)
        assert not runtime.whole_module_loaded, "a covered statement's kernel was launched"
        return runtime, gen
    gen = generate_code(plan)
    runtime = CpuRuntime(gen.plan, on_metric, native=gen.text if NATIVE else None)
    runtime.run()
    return runtime, gen


def compare_cpu(graph, want: dict):
    """Each compiled backend under test (``TEST_BACKENDS``) gives ``want``."""
    for backend in TEST_BACKENDS:
        runtime, _ = compiled_run(graph, backend=backend)
        _same(backend, {name: runtime.value(name) for name in want}, want)
        runtime.envs.close()


def _same(what: str, got: dict, want: dict):
    for name, expected in want.items():
        value = got[name]
        assert value.dtype == expected.dtype, (
            f"{what}: {name} is {value.dtype}, not {expected.dtype}"
        )
        assert value.shape == expected.shape, f"{what}: {name} has shape {value.shape}"
        if expected.dtype.kind in "biu":
            np.testing.assert_array_equal(value, expected, err_msg=f"{what}: {name}")
        else:
            np.testing.assert_allclose(
                value, expected, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=f"{what}: {name}"
            )


def reference_and_native(graph):
    """(reference outputs, the compiled backend's outputs from generated code, the generated
    code) of a checked program: the reference runs it with the lowering passes only (as
    ``--backend reference`` does), the compiled backend (the first of ``TEST_BACKENDS``)
    optimized; the other backends under test must give that backend's outputs."""
    want = outputs(run_graph(run_passes_unoptimized(graph)))
    runtime, gen = compiled_run(graph)
    got = {k: runtime.value(k) for k in want}
    runtime.envs.close()
    for backend in TEST_BACKENDS[1:]:
        other, _ = compiled_run(graph, backend=backend)
        _same(f"{backend} (against {TEST_BACKEND})", {k: other.value(k) for k in want}, got)
        other.envs.close()
    return want, got, gen


def run_passes_unoptimized(graph):
    from timerlc.compiler import run_passes

    return run_passes(graph, optimize=False)


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
    """``name[k]``: the values, one per point of dim k (data the compiler cannot fold),
    taken from a tensor of no dim (``name_all``, which the reference interpreter makes
    once, where the stack inside ``name[k]`` was made again at every point)."""
    items = ", ".join(f"{dtype}({lit(v)})" for v in values)
    return f"{name}_all = stack([{items}])\n{name}[k] = take({name}_all, k)\n"


def lit(v) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "0.0 / 0.0"
    if isinstance(v, float) and math.isinf(v):
        return ("1.0" if v > 0 else "-1.0") + " / 0.0"
    if isinstance(v, float) and v == 0 and math.copysign(1, v) < 0:
        return "-0.0"
    return repr(v)


def refuses_changed_plans(data: dict, cases, part=lambda d: d["kernels"]):
    """Each ``(change, words)`` of ``cases`` applied to a copy of the plan JSON ``data``
    (to ``part`` of it): the plan reader refuses it with a message matching ``words``."""
    import json

    from timerlc.plan import items

    for change, words in cases:
        bad = json.loads(json.dumps(data))
        change(part(bad))
        with pytest.raises(items.PlanError, match=words):
            items.from_json(bad, "p")
