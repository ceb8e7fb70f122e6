"""Row loops on the cpu backend (``timerlc/codegen/rows.py``): a loop of the tree whose rows
never meet runs a chunk of rows at a time on the threads, each chunk the whole loop; and
the checks the stores' ranges decide taken out first (``timerlc/codegen/checks.py``).

What is checked: which loops run by rows and which stay on one thread (rows that meet, a
check at a row), that a row loop computes what the loop on one thread computes (the same
bits: each row's elements by the same code) on any number of threads, that a failure of
every chunk is the loop's (the same message), and that a check goes only where the values
it checks cannot leave their range."""

from __future__ import annotations

import re

import numpy as np
import pytest
from rtl_helpers import NATIVE, TEST_BACKEND, src

from timerlc.codegen import rows
from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.runtime import pool
from timerlc.runtime.cpu import CpuRuntime
from timerlc.runtime.native import cblas

pytestmark = pytest.mark.skipif(
    TEST_BACKEND != "cpu" or not NATIVE, reason="the backend under test runs no LLVM code"
)

# s runs over t inside i, a row per b: each row reads only its own row of s (and c, which
# the loop does not write); the take fails at t = 24 in every row where FAR > 0 (a check
# on the loop values alone, the same in every chunk)
OWN = """
config I = 2, T = 48, B = 1024, FAR = 0
dim i < I
dim t < T
dim b < B
c[0, b] = f32(b) * 0.5
c[i, b] = last[i-1, b] * 0.5
s[i, 0, b] = c[i, b]
s[i, t, b] = s[i, t-1, b] * 0.5 + take(c[i, 0:B], (t // 24) * FAR)
last[i, b] = s[i, T-1, b] + 0.0
out last
"""

# each row reads the next row's value of the step before: the rows meet
MEET = """
config I = 2, T = 48, B = 1024
dim i < I
dim t < T
dim b < B
c[0, b] = f32(b) * 0.5
c[i, b] = last[i-1, b] * 0.5
s[i, 0, b] = c[i, b]
s[i, t, b] = take(s[i, t-1, 0:B], (b + 1) % B) * 0.5 + 1.0
last[i, b] = s[i, T-1, b] + 0.0
out last
"""


def gen_of(text: str, by_rows: bool = True, **sets):
    graph = check_source(
        Source("p.rtl", src(text)), overrides={k: str(v) for k, v in sets.items()}
    )
    plan = compile_plan(run_passes(graph))
    if by_rows:
        return generate_code(plan)
    keep = rows.row_loops
    rows.row_loops = lambda plan, kernels, recorded: {}
    try:
        return generate_code(plan)
    finally:
        rows.row_loops = keep


def run(gen, workers: int | None = None, monkeypatch=None):
    """A run of ``gen`` (on a pool of ``workers`` workers, where given): the runtime, and
    its metrics."""
    if workers is not None:
        p = pool.Pool(workers, cblas())
        _KEPT.append(p)
        monkeypatch.setattr(pool, "_POOLS", [p])
    got: list = []
    rt = CpuRuntime(gen.plan, lambda *m: got.append(m), native=gen.text)
    try:
        rt.run()
    finally:
        rt.envs.close()
        if workers is not None:
            p.stop()
    return rt, got


_KEPT: list = []  # (pools whose code must outlive their workers)


def test_a_loop_whose_rows_keep_to_themselves_runs_by_chunks_of_rows():
    gen = gen_of(OWN)
    assert [k.name for k in gen.rows] == [f"s{k.sid}_rows" for k in gen.rows] != []
    text = "\n".join(map(str, gen.trees))
    assert "Rows(" in text
    assert re.search(r"define i32 @tree\d+\.rows0\(", gen.text)
    assert re.search(r"call i32 @tl_par_run\(ptr @tree\d+\.rows0,", gen.text)


def test_a_loop_whose_rows_meet_stays_on_one_thread():
    gen = gen_of(MEET)
    assert gen.rows == ()
    assert not re.search(r"define i32 @tree\d+\.rows\d", gen.text)


def test_a_check_at_a_row_keeps_the_loop_on_one_thread():
    """The take's index depends on the row: a chunk could fail at its rows while another
    ran on, so the loop runs as before; its failure named as before."""
    gen = gen_of(OWN.replace("(t // 24) * FAR", "b + (t // 24) * FAR"), FAR=5000)
    assert gen.rows == ()
    with pytest.raises(RunError, match=r"at i=0, t=24, b=0 .*index 5000 is out of range"):
        run(gen)


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_a_row_loop_computes_what_the_loop_on_one_thread_computes(workers, monkeypatch):
    want, _ = run(gen_of(OWN, by_rows=False), workers, monkeypatch)
    got, _ = run(gen_of(OWN), workers, monkeypatch)
    np.testing.assert_array_equal(got.value("last"), want.value("last"))


@pytest.mark.parametrize("workers", [0, 3])
def test_a_failure_of_every_chunk_is_the_loop_s_failure(workers, monkeypatch):
    """The take's index depends on t alone (a check on one thread, before the loop over the
    rows): every chunk fails at t = 24, the first to fail fills the failure record, and the
    runtime names the point as after the loop on one thread."""
    serial, by_rows = gen_of(OWN, by_rows=False, FAR=5000), gen_of(OWN, FAR=5000)
    assert by_rows.rows and not serial.rows
    with pytest.raises(RunError) as want:
        run(serial)
    with pytest.raises(RunError) as got:
        run(by_rows, workers, monkeypatch)
    assert str(got.value) == str(want.value)
    assert "at i=0, t=24, b=0" in str(got.value)


@pytest.mark.parametrize("workers", [0, 3])
def test_reinforce_s_rollout_runs_by_rows_as_on_one_thread(workers, monkeypatch):
    """The rollout (observation, policy, draw, CartPole's step) and the returns' recurrence
    run by rows; the metrics are the loops' on one thread, bit for bit (the policy's second
    layer, a product, by the BLAS on a chunk's rows)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "programs" / "reinforce.rtl").read_text()
    sets = {"I": 3, "B": 64, "T": 40}
    by_rows = gen_of(text, **sets)
    assert {"s15_rows", "s33_rows", "s35_rows", "s36_rows", "s37_rows"} <= {
        k.name for k in by_rows.rows
    }
    _, want = run(gen_of(text, by_rows=False, **sets), workers, monkeypatch)
    _, got = run(by_rows, workers, monkeypatch)
    assert got == want and len(got) > 3


def test_a_recurrent_policy_s_loops_run_by_rows_as_on_one_thread(monkeypatch):
    """RNN REINFORCE: the rollout carries each environment's hidden state from step to step,
    and backpropagation through time runs backwards along the steps; both by rows, the
    metrics as on one thread to rounding (its recurrent products by the BLAS on a chunk's
    rows: OpenBLAS rounds a block of rows alone in other ways than in the whole product,
    as the pool's cut products, docs/codegen.md)."""
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "programs" / "rnn_reinforce.rtl"
    sets = {"I": 2, "B": 64, "T": 24}
    by_rows = gen_of(path.read_text(), **sets)
    assert len(by_rows.plan.kernels.row_loops) >= 2
    _, want = run(gen_of(path.read_text(), by_rows=False, **sets), 3, monkeypatch)
    _, got = run(by_rows, 3, monkeypatch)
    assert [m[:2] for m in got] == [m[:2] for m in want] and len(got) > 3
    np.testing.assert_allclose([m[2] for m in got], [m[2] for m in want], rtol=1e-5, atol=1e-6)


def test_a_profile_counts_a_row_loop_at_its_first_statement(monkeypatch):
    """A profiled run runs the loop by rows too; the whole loop is one call of its first
    statement (its chunks' calls count nothing), and the plan names the loop's statements
    for the profile's line (``kernels.row_loops``)."""
    gen = gen_of(OWN)
    (group,) = gen.plan.kernels.row_loops
    got: list = []
    rt = CpuRuntime(gen.plan, lambda *m: got.append(m), native=gen.text, profile=True)
    rt.run()
    assert rt.calls[group[0]] == 2  # (the loop runs once an iteration, I = 2)
    assert not set(group[1:]) & set(rt.calls)


def test_a_check_the_stores_decide_is_taken_out():
    """An action drawn by categorical is the argmax of two values: 0 or 1, as the stores
    into its buffer say; CartPole's step checks it no more (nor does log_softmax's gather
    at it). An action that may be 2 is checked, and the check fails."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "programs" / "reinforce.rtl").read_text()
    gen = gen_of(text, I=2, B=4, T=8)
    assert "fail" not in _text(_step(gen)).split("for k in", 1)[1]
    checked = """
    config B = 3, T = 8
    dim b < B
    dim t < T
    env E = "cartpole" batch b
    o[b, 0] = E.reset()
    a[b, t] = where(t == 5, 2, 0)
    o[b, t+1], r[b, t], d[b, t] = E.step(a[b, t])
    out r
    """
    gen = gen_of(checked)
    assert "fail 1" in _text(_step(gen)).split("for k in", 1)[1]
    with pytest.raises(RunError, match=r"got action 2; its actions are 0\.\.1"):
        run(gen)


def _text(k) -> str:
    from timerlc.codegen import kir

    return kir.text(k)


def _step(gen):
    """CartPole's step: the kernel of the statement that moves the cart."""
    (k,) = [k for k in gen.kernels if "E_state" in _text(k) and "cos(" in _text(k)]
    return k
