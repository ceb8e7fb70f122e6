"""Swapping under a device memory budget (``--memory-budget``, ``docs/plan.md`` "Swaps"):
the memory plan moves blocks that sit unused across the items where the buffers would hold
more than the budget to host memory and back before their next use; the cpu runtime obeys,
keeps its ``peak_bytes`` within the budget, and still gives the outputs of the run without
a budget and of the reference.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import src
from test_diagnostics import invoke

from timerlc.cli import parse_size
from timerlc.compiler import compile_plan, run_passes
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.plan import items
from timerlc.plan.items import Call, Free, If, Loop, Plan, SwapIn, SwapOut, walk
from timerlc.reference.interpreter import run_graph
from timerlc.runner import budget_warning
from timerlc.runtime.cpu import CpuRuntime
from timerlc.runtime.plan import load_plan

MIB = 1 << 20

# Four blocks of K x f32[64] = 1 MiB each (a, b, c, d), made one after another at the top
# level (each needs the mean of the one before it) and read again, late, in the same order:
# without swaps all four are on the device when d is made (4 MiB).
BIG = (Path(__file__).parent / "programs" / "swaps.rtl").read_text()


def graph_of(text: str, optimize: bool = True):
    return run_passes(check_source(Source("big.rtl", src(text)), {}), None, optimize)


@pytest.fixture(scope="module")
def big():
    return graph_of(BIG)


@pytest.fixture(scope="module")
def reference():
    ref = run_graph(graph_of(BIG, optimize=False))
    return {name: ref.value(name) for name in ("fin", "la", "lb", "lc")}


def run(plan: Plan) -> CpuRuntime:
    rt = CpuRuntime(items.loads(items.dumps(plan)))  # as a build folder would give it
    rt.run()
    rt.envs.close()
    return rt


def listed(plan: Plan, kind: type) -> list[int]:
    """The buffers of the top-level items of type ``kind`` (``SwapOut``, ``Free``, ...)."""
    return [s for it in plan.tree if isinstance(it, kind) for s in it.buffers]


def uses(plan: Plan, item) -> set[int]:
    """The buffers a top-level item writes or reads."""
    out: set[int] = set()
    for kid in walk([item]):
        if isinstance(kid, Call):
            out.add(kid.statement)
            for n in plan.statement(kid.statement).nodes:
                out |= {r.src for r in n.inputs if r.stored}
    return out


def check_swaps(plan: Plan):
    """Every swap_out is of a block (not an output or a metric) right after an item that
    uses it, and is followed, before any other use, by a swap_in right before an item that
    uses it; the buffer is not used in between."""
    kept = {sid for _, sid, _ in plan.outputs + plan.metrics}
    tree = plan.tree
    out: dict[int, int] = {}  # buffer -> position of its swap_out
    for k, it in enumerate(tree):
        if isinstance(it, SwapOut):
            j = k - 1
            while isinstance(tree[j], Free):
                j -= 1
            for s in it.buffers:
                assert plan.buffer(s).window is None and s not in kept
                assert s not in out
                assert s in uses(plan, tree[j]), (s, tree[j])
                out[s] = k
        elif isinstance(it, SwapIn):
            nxt = tree[k + 1]
            assert isinstance(nxt, (Call, Loop, If))
            for s in it.buffers:
                assert s in out and s in uses(plan, nxt)
                del out[s]
        elif not isinstance(it, Free):
            assert not uses(plan, it) & set(out), "a use of a swapped-out buffer"
    assert not out, "swapped out and never back"


def assert_outputs(rt: CpuRuntime, want: dict):
    for name, expected in want.items():
        got = rt.value(name)
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)


def blocks(plan: Plan) -> list[int]:
    """a, b, c, d (the passes rename them): the buffers over k, in the order they are made."""
    calls = [it.statement for it in plan.tree if isinstance(it, Call)]
    return [c for c in calls if plan.buffer(c).dims == ("k",)]


# ----------------------------------------------------------------------------- the plan
def test_without_a_budget_there_are_no_swaps(big, reference):
    plan = compile_plan(big)
    assert plan.memory_budget is None and plan.memory_budget_met is None
    assert not listed(plan, SwapOut) and not listed(plan, SwapIn)
    assert plan.memory_peak == plan.memory_peak_unswapped
    assert 4 * MIB <= plan.memory_peak < 4 * MIB + 1024  # a, b, c, d (and scalars)
    rt = run(plan)
    assert rt.peak_bytes == plan.memory_peak and rt.swapped == 0
    assert_outputs(rt, reference)


def test_a_budget_below_the_peak_swaps_the_blocks_used_farthest_away(big, reference):
    budget = int(2.5 * MIB)
    plan = compile_plan(big, memory_budget=budget)
    check_swaps(plan)
    assert plan.memory_budget == budget and plan.memory_budget_met is True
    assert plan.memory_peak <= budget < plan.memory_peak_unswapped
    a, b, c, d = blocks(plan)
    # when c is made, a, b and c would be on the device (3 MiB): of a and b, b is read again
    # later (Belady: it goes); when d is made, of a and c, c is read again later
    assert sorted(listed(plan, SwapOut)) == sorted(listed(plan, SwapIn)) == [b, c]
    rt = run(plan)
    assert rt.peak_bytes <= budget
    assert rt.peak_bytes <= plan.memory_peak
    assert rt.swapped == 2 and rt.swapped_bytes == 2 * MIB
    assert rt.host_peak_bytes == 2 * MIB and rt.host_bytes == 0 and not rt.host
    assert_outputs(rt, reference)
    assert_outputs(rt, {n: run(compile_plan(big)).value(n) for n in reference})


@pytest.mark.parametrize("mib", [3.5, 3, 2, 1.5, 1.01])
def test_every_reachable_budget_is_kept(big, reference, mib):
    budget = int(mib * MIB)
    plan = compile_plan(big, memory_budget=budget)
    check_swaps(plan)
    assert plan.memory_budget_met is True
    rt = run(plan)
    assert rt.peak_bytes <= plan.memory_peak <= budget
    assert rt.swapped == len(listed(plan, SwapOut)) > 0
    assert_outputs(rt, reference)


def test_an_impossible_budget_swaps_what_helps_and_says_so(big, reference):
    plan = compile_plan(big, memory_budget=1)
    check_swaps(plan)
    assert plan.memory_budget == 1 and plan.memory_budget_met is False
    # one block must be on the device while it is made or read: 1 MiB is the best
    assert MIB <= plan.memory_peak < MIB + 1024
    a, b, c, d = blocks(plan)
    assert {a, b, c} <= set(listed(plan, SwapOut))  # d is not read again
    rt = run(plan)
    assert rt.peak_bytes <= plan.memory_peak
    assert_outputs(rt, reference)


def test_a_peak_inside_the_training_loop_cannot_be_swapped():
    # REINFORCE's peak is its training loop, whose buffers that loop uses at every
    # iteration: no top-level swap helps, so none is made and the budget is not met
    path = Path(__file__).resolve().parent.parent / "programs" / "reinforce.rtl"
    graph = run_passes(
        check_source(Source(str(path), path.read_text()), {"I": "3", "B": "2", "T": "8"}),
        None,
        True,
    )
    free = compile_plan(graph)
    plan = compile_plan(graph, memory_budget=free.memory_peak // 2)
    assert plan.memory_budget_met is False and not listed(plan, SwapOut)
    assert plan.memory_peak == free.memory_peak
    assert plan.tree == free.tree
    text = budget_warning(plan)
    assert "during the loop over i these must be on the device" in text, text
    assert "a ring buffer along i" in text and "swapping" not in text


# ----------------------------------------------------------------------------- the runtime
def test_a_read_of_a_swapped_out_buffer_is_an_internal_error(big):
    plan = compile_plan(big, memory_budget=int(2.5 * MIB))
    bad = replace(plan, tree=tuple(it for it in plan.tree if not isinstance(it, SwapIn)))
    with pytest.raises(RunError, match="internal error: buffer .* swapped out to host memory"):
        CpuRuntime(bad).run()


def test_swaps_of_the_runtime(big):
    rt = CpuRuntime(compile_plan(big))
    a = blocks(rt.plan)[0]
    rt.swap_out(a)  # not used yet: nothing to copy, its first use allocates it
    assert rt.host == {a: None} and rt.live_bytes == 0
    rt.swap_in(a)
    assert not rt.host
    rt.read(a)[0][1] = 7.0
    assert rt.live_bytes == MIB
    rt.swap_out(a)
    assert rt.live_bytes == 0 and rt.host_bytes == MIB and rt.buffers[a] is None
    with pytest.raises(RunError, match="already swapped out"):
        rt.swap_out(a)
    with pytest.raises(RunError, match="written while it is swapped out"):
        rt.written(a)
    rt.swap_in(a)
    assert rt.live_bytes == rt.peak_bytes == MIB and rt.host_bytes == 0
    assert np.all(rt.read(a)[0][1] == 7.0) and np.all(rt.read(a)[0][0] == 0.0)
    with pytest.raises(RunError, match="not swapped out"):
        rt.swap_in(a)


# ----------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize(
    "text, size",
    [("4096", 4096), ("64M", 64 * MIB), ("64m", 64 * MIB), ("2K", 2048), ("1.5G", 3 << 29)]
    + [("64MiB", 64 * MIB), ("64MB", 64 * MIB), ("0", 0), (" 8 K ", 8192)],
)
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "", "-1", "1.5", "64X", "M", "1e6"])
def test_bad_sizes(text):
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


def write(tmp_path: Path) -> Path:
    path = tmp_path / "big.rtl"
    path.write_text(src(BIG))
    return path


def test_cli_compile_records_the_budget(tmp_path):
    path = write(tmp_path)
    status, _, err = invoke("compile", path, "-o", tmp_path / "b", "--memory-budget", "64M")
    assert status == 0, err
    assert err == ""
    plan = load_plan(tmp_path / "b")
    assert plan.memory_budget == 64 * MIB and plan.memory_budget_met is True
    assert not listed(plan, SwapOut)  # the 4 MiB fit
    status, _, err = invoke("compile", path, "-o", tmp_path / "c", "--memory-budget", "2.5M")
    assert status == 0 and err == ""
    plan = load_plan(tmp_path / "c")
    assert len(listed(plan, SwapOut)) == 2
    status, _, err = invoke("run", tmp_path / "c", "--outputs", tmp_path / "o.npz")
    assert status == 0, err
    ref = run_graph(graph_of(BIG, optimize=False))
    with np.load(tmp_path / "o.npz") as got:
        for name in ("fin", "la", "lb", "lc"):
            np.testing.assert_allclose(got[name], ref.value(name), rtol=1e-5, atol=1e-6)


def test_cli_an_impossible_budget_warns_and_runs(tmp_path):
    path = write(tmp_path)
    status, _, err = invoke("compile", path, "-o", tmp_path / "b", "--memory-budget", "1")
    assert status == 0
    line, *rows = err.splitlines()
    assert line.startswith("timerlc: warning: the memory budget of 1 byte cannot be met")
    assert "can meet is 1.0 MiB (1048" in line and "down to it from 4.0 MiB (4194" in line
    assert rows and all(r.startswith("  ") for r in rows), err
    plan = load_plan(tmp_path / "b")
    assert plan.memory_budget_met is False
    status, _, err = invoke("run", path, "--memory-budget", "1", "--outputs", tmp_path / "o.npz")
    assert status == 0 and "cannot be met" in err
    ref = run_graph(graph_of(BIG, optimize=False))
    with np.load(tmp_path / "o.npz") as got:
        np.testing.assert_allclose(got["fin"], ref.value("fin"), rtol=1e-5, atol=1e-6)


def test_cli_usage_errors(tmp_path):
    path = write(tmp_path)
    for cmd in ("compile", "run"):
        status, _, err = invoke(cmd, path, "--memory-budget", "lots")
        assert status == 2
        assert "--memory-budget" in err and "'lots' is not a size" in err and "64M" in err
        assert "Traceback" not in err
    status, _, err = invoke("run", path, "--backend", "reference", "--memory-budget", "1M")
    assert status == 2 and "--memory-budget" in err and "reference" in err
    assert invoke("compile", path, "-o", tmp_path / "b")[0] == 0
    status, _, err = invoke("run", tmp_path / "b", "--memory-budget", "1M")
    assert status == 2 and "compile the program with it" in err
    status, out, _ = invoke("compile", "--help")
    assert status == 0 and "--memory-budget SIZE" in out
    status, out, _ = invoke("run", "--help")
    assert status == 0 and "--memory-budget SIZE" in out
