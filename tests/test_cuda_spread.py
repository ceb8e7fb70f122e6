"""A small reduction that every block makes whole, then the loops after it over the grid:
one function where they were two (``cuda.render._Kernel._spread``, ``spread_phase``), and
the cases where the blocks could compute other values, which stay two."""

from __future__ import annotations

import numpy as np
import pytest

from timerlc.codegen import kir
from timerlc.codegen.kir import Bin, Cast, For, Let, Load, Ref, Slot, Store, Temp, Un
from timerlc.cuda import render
from timerlc.cuda.emu import compiler
from timerlc.runtime.cuda import EmuDevice

needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler")

N = 6000  # (more points than a reduction's last block takes, TAIL_THREADS)
F32, F64 = "f32", "f64"


def _kernel(
    loops_write_x=False, run_reads_first=False, loops_read_local=False, local_after=False, n=N
):
    """``acc = sum(x * x)`` (float64), then on one thread ``t[0] = f32(acc)`` (or, with
    ``run_reads_first``, ``c[0] = c[0] + f32(acc)``: the run reads what it writes before
    writing it), then ``y[k] = x[k] / sqrt(t[0])`` for ``N`` points (with ``loops_write_x``
    into ``x`` itself; with ``loops_read_local``, times a local of the run's; with
    ``local_after``, that local plus ``y[0]`` stored into ``c`` after the loops); ``n``
    terms and points (``N``)."""
    e, k = Ref("e"), Ref("k")
    x = Load("x", e, F32)
    term = Cast(Bin("mul", x, x, F32), F64)
    red = For(
        "e", kir.i64(0), kir.i64(n), (Let("acc", F64, Bin("add", Ref("acc", F64), term, F64)),)
    )
    red = For(red.var, red.lo, red.hi, red.body, reduce=(("acc", "add"),))
    total = Cast(Ref("acc", F64), F32)
    if run_reads_first:
        run = [Store("c", kir.i64(0), Bin("add", Load("c", kir.i64(0), F32), total, F32))]
        norm = Load("c", kir.i64(0), F32)
    else:
        run = [Store("t", kir.i64(0), total)]
        norm = Load("t", kir.i64(0), F32)
    value = Bin("div", Load("x", k, F32), Un("sqrt", norm, F32), F32)
    if loops_read_local or local_after:
        run.append(Let("s", F32, Bin("mul", total, total, F32)))
    if loops_read_local:
        value = Bin("mul", value, Ref("s", F32), F32)
    out = "x" if loops_write_x else "y"
    loop = For("k", kir.i64(0), kir.i64(n), (Store(out, k, value),), True)
    later = Bin("add", Ref("s", F32), Load("y", kir.i64(0), F32), F32)  # (after the loops)
    after = (Store("c", kir.i64(0), later),) if local_after else ()
    body = (Let("acc", F64, kir.Const(F64, 0.0)), red, *run, loop, *after)
    slots = (Slot("x", F32, 0, 0, 0, loops_write_x), Slot("y", F32, 1, 1, 0, True))
    slots += (Slot("c", F32, 2, 2, 0, True),)
    return kir.Kernel("s0", 0, (), slots, (Temp("t", F32, 0, 1),), body)


def _run(k: kir.Kernel, c0: float = 1.0) -> tuple:
    """The kernel rendered, its functions run in turn on the emulated device over the
    blocks each asks for, three at most (``EmuDevice.MAX_BLOCKS``: one after another, so a
    block sees what the blocks before it wrote); the renderer, its text and ``(x, y, c)``
    after the run (``x`` the sines, ``c`` starting at ``c0``). The scratch memory starts
    as float32 1000s (a value read before it was written shows)."""
    r = render._Kernel(k)
    text = r.render()
    dev = EmuDevice()
    module = dev.load(render.head() + "\n" + text)
    arrays = [X.copy(), np.zeros(N, np.float32), np.full(1, c0, np.float32)]
    ptrs = [dev.alloc(a.nbytes) for a in arrays]
    for ptr, a in zip(ptrs, arrays):
        dev.upload(ptr, a)
    table = dev.alloc(8 * len(ptrs))
    dev.upload(table, np.array(ptrs, np.uint64))
    scratch = dev.alloc(max(r.scratch, 8))
    dev.upload(scratch, np.full(max(r.scratch, 8) // 4, 1000.0, np.float32))
    for fn, threads in r.phases:  # (the blocks it asks for, three at most)
        blocks = min(-(-threads // render.THREADS), 3)
        dev.launch(dev.function(module, fn), table, np.zeros(1, np.int64), scratch, blocks)
    for ptr, a in zip(ptrs, arrays):
        dev.download(ptr, a)
    return r, text, arrays


X = (np.sin(np.arange(N) * 0.01) + 0.5).astype(np.float32)
NORM = np.float32(np.sum(X.astype(np.float64) ** 2))


@needs_cxx
def test_a_small_norm_and_the_loops_after_it_are_one_function():
    """Every block sums the 6,000 squares itself (its threads every ``blockDim.x``-th,
    a tree), its thread 0 stores the norm, then the block takes its points of the loop:
    one function over the loop's points, no ticket; the values NumPy's. Off
    (``SPREAD``), the reduction's last block runs the run, and the loops are a launch
    after it."""
    r, text, (x, y, _) = _run(_kernel())
    assert r.phases == [("s0", N)]
    assert "tl_count(err)" not in text and "m_tl_nparts0[0] = 1;" in text
    assert "__shared__ double m_tl_part0_0[1];" in text
    np.testing.assert_allclose(y, X / np.sqrt(NORM), rtol=1e-6)
    np.testing.assert_array_equal(x, X)
    assert render.functions(_kernel()) == 1
    old = render.SPREAD
    try:
        render.SPREAD = False
        apart, _, (_, y_apart, _) = _run(_kernel())
        assert render.functions(_kernel()) == 2
    finally:
        render.SPREAD = old
    assert apart.phases == [("s0", N), ("s0_3", N)]
    np.testing.assert_allclose(y_apart, y, rtol=1e-6)


def test_a_reduction_the_blocks_would_load_too_often_stays_apart(monkeypatch):
    """The loops' 6,000 points are 47 blocks, each of which would load the 6,000 terms:
    282,000 loads in all; past ``SPREAD_LOADS`` the loops stay a launch of their own."""
    blocks = -(-N // render.THREADS)
    monkeypatch.setattr(render, "SPREAD_LOADS", blocks * N)
    assert render.functions(_kernel()) == 1
    monkeypatch.setattr(render, "SPREAD_LOADS", blocks * N - 1)
    assert render.functions(_kernel()) == 2


@needs_cxx
@pytest.mark.parametrize(
    "case", ["loops_write_x", "run_reads_first", "loops_read_local", "local_after"]
)
def test_a_reduction_whose_blocks_could_differ_stays_apart(case):
    """Where a block could read what another block's run or loops already changed, the
    loops stay a launch after the reduction's: the loops write what the reduction reads
    (x normalized in place: a later block would sum the normalized values); the run reads
    what it writes before writing it (``c += norm``: each block would add again); the
    loops read a local of the run's (thread 0's alone); a function after the loops reads
    a local of the run's (which the run would not pass on). The values NumPy's."""
    r, _, (x, y, c) = _run(_kernel(**{case: True}))
    assert len(r.phases) == 2 + (case == "local_after"), r.phases
    if case == "loops_write_x":
        np.testing.assert_allclose(x, X / np.sqrt(NORM), rtol=1e-6)
    elif case == "run_reads_first":
        np.testing.assert_allclose(c, [1 + NORM], rtol=1e-6)
        np.testing.assert_allclose(y, X / np.sqrt(1 + NORM), rtol=1e-6)
    elif case == "loops_read_local":
        np.testing.assert_allclose(y, X / np.sqrt(NORM) * NORM * NORM, rtol=1e-5)
    else:
        np.testing.assert_allclose(y, X / np.sqrt(NORM), rtol=1e-6)
        np.testing.assert_allclose(c, [NORM * NORM + y[0]], rtol=1e-6)


def _mean_var_kernel(n: int, m: int) -> kir.Kernel:
    """``t = mean(x[:n])``, then ``u = sum((x[:n] - t) ** 2)`` (float64 sums), then
    ``y[k] = (x[k] - t) / sqrt(u)`` for ``m`` points (none: ``y[0], y[1] = t, u``): two
    small sums one after the other, the second reading the first (the advantages'
    normalization in PPO's minibatch step)."""
    e, k = Ref("e"), Ref("k")
    t, u = Load("t", kir.i64(0), F32), Load("u", kir.i64(0), F32)
    term1 = Cast(Load("x", e, F32), F64)
    d = Bin("sub", Load("x", e, F32), t, F32)
    term2 = Cast(Bin("mul", d, d, F32), F64)
    body = []
    for acc, term, out, value in (
        ("a1", term1, "t", lambda a: Bin("div", a, kir.Const(F64, float(n)), F64)),
        ("a2", term2, "u", lambda a: a),
    ):
        update = Let(acc, F64, Bin("add", Ref(acc, F64), term, F64))
        red = For("e", kir.i64(0), kir.i64(n), (update,), reduce=((acc, "add"),))
        body += [Let(acc, F64, kir.Const(F64, 0.0)), red]
        body.append(Store(out, kir.i64(0), Cast(value(Ref(acc, F64)), F32)))
    y = Bin("div", Bin("sub", Load("x", k, F32), t, F32), Un("sqrt", u, F32), F32)
    if m:
        body.append(For("k", kir.i64(0), kir.i64(m), (Store("y", k, y),), True))
    else:  # (the two sums' results alone)
        body += [Store("y", kir.i64(0), t), Store("y", kir.i64(1), u)]
    slots = (Slot("x", F32, 0, 0, 0, False), Slot("y", F32, 1, 1, 0, True))
    slots += (Slot("c", F32, 2, 2, 0, True),)
    temps = (Temp("t", F32, 0, 1), Temp("u", F32, 8, 1))
    return kir.Kernel("s0", 0, (), slots, temps, tuple(body))


@needs_cxx
@pytest.mark.parametrize("m", [0, 512, N])
def test_two_small_sums_one_after_the_other_are_one_function(m):
    """A mean of 512 terms, then the sum of squares about it: every block makes both, then
    its points of the loop after them, over the grid (512 or 6,000 points); with no loop,
    the sums and the stores of their results are one launch of one block. Where they were
    two launches of the grid, each with its tickets, and the loop a third of 6,000 points.
    The values NumPy's."""
    k = _mean_var_kernel(512, m)
    r, text, (x, y, _) = _run(k)
    assert r.phases == [("s0", m or render.THREADS)]
    assert "tl_count(err)" not in text
    x64 = X[:512].astype(np.float64)
    mean = np.float32(x64.mean())
    var = np.float32(np.sum(((X[:512] - mean) * (X[:512] - mean)).astype(np.float64)))
    if m:
        np.testing.assert_allclose(y[:m], (X[:m] - mean) / np.sqrt(var), rtol=1e-5)
    else:
        np.testing.assert_allclose(y[:2], [mean, var], rtol=1e-6)
    np.testing.assert_array_equal(x, X)
    old = render.SPREAD
    try:
        render.SPREAD = False
        assert render.functions(_mean_var_kernel(512, m)) == 2 + (m == N)
    finally:
        render.SPREAD = old


def _sums_into_temps_kernel(n: int) -> kir.Kernel:
    """``a1[0] = 0; a1[0] += x[e]`` over ``n`` terms, ``t[0] = f32(a1[0])``, then
    ``a2[0] = 0; a2[0] += x[e] * x[e]``, ``u[0] = f32(a2[0])``, and ``y[0], y[1] = t, u``:
    two sums into temporaries of one element (float64), the second's first value set by
    the run after the first (REINFORCE-TD's two bias gradients of its value head)."""
    e = Ref("e")
    x = Load("x", e, F32)
    body: list = []
    for acc, term, out in (
        ("a1", Cast(x, F64), "t"),
        ("a2", Cast(Bin("mul", x, x, F32), F64), "u"),
    ):
        at = kir.i64(0)
        update = Store(acc, at, Bin("add", Load(acc, at, F64), term, F64))
        body += [
            Store(acc, at, kir.Const(F64, 0.0)),
            For("e", kir.i64(0), kir.i64(n), (update,), reduce=((acc, "add"),)),
            Store(out, at, Cast(Load(acc, at, F64), F32)),
        ]
    body += [
        Store("y", kir.i64(0), Load("t", kir.i64(0), F32)),
        Store("y", kir.i64(1), Load("u", kir.i64(0), F32)),
    ]
    slots = (Slot("x", F32, 0, 0, 0, False), Slot("y", F32, 1, 1, 0, True))
    slots += (Slot("c", F32, 2, 2, 0, True),)
    temps = (Temp("a1", F64, 0, 1), Temp("t", F32, 8, 1), Temp("a2", F64, 16, 1))
    temps += (Temp("u", F32, 24, 1),)
    return kir.Kernel("s0", 0, (), slots, temps, tuple(body))


@needs_cxx
def test_two_sums_into_temporaries_in_one_block():
    """Two small sums into temporaries of one element, the second's first value set
    between them: one function of one block, each sum's scope the thread's copy of its
    accumulator and the temporary itself declared once after the first sum (the store of
    the second's first value came before any declaration of it: the host compiler, nvcc
    and NVRTC refused the module of REINFORCE-TD at 1,000 environments and 80 units). The
    values NumPy's."""
    r, text, (x, y, _) = _run(_sums_into_temps_kernel(512))
    assert r.phases == [("s0", render.THREADS)] and "tl_count(err)" not in text
    x64 = X[:512].astype(np.float64)
    np.testing.assert_allclose(y[:2], [x64.sum(), (x64 * x64).sum()], rtol=1e-6)
    np.testing.assert_array_equal(x, X)


def test_sums_join_while_their_terms_together_are_few(monkeypatch):
    """Two sums of 512 terms join one function while ``SPREAD_TERMS`` holds both (a
    block makes them all); past it each is a launch over the grid again, the loop after
    them a third."""
    monkeypatch.setattr(render, "SPREAD_TERMS", 1024)
    assert render.functions(_mean_var_kernel(512, N)) == 1
    monkeypatch.setattr(render, "SPREAD_TERMS", 1023)
    assert render.functions(_mean_var_kernel(512, N)) == 3


def _mean_local_kernel() -> kir.Kernel:
    """``mv = f32(mean(x[:512]))`` a local of the run after the first sum, then
    ``sum((x[:512] - mv) ** 2)`` reading it, both stored into ``y[0]``, ``y[1]``."""
    e, n = Ref("e"), 512
    x = Load("x", e, F32)
    first = Let("a1", F64, Bin("add", Ref("a1", F64), Cast(x, F64), F64))
    r1 = For("e", kir.i64(0), kir.i64(n), (first,), reduce=(("a1", "add"),))
    mean = Let("mv", F32, Cast(Bin("div", Ref("a1", F64), kir.Const(F64, float(n)), F64), F32))
    d = Bin("sub", x, Ref("mv", F32), F32)
    second = Let("a2", F64, Bin("add", Ref("a2", F64), Cast(Bin("mul", d, d, F32), F64), F64))
    r2 = For("e", kir.i64(0), kir.i64(n), (second,), reduce=(("a2", "add"),))
    body = (Let("a1", F64, kir.Const(F64, 0.0)), r1, mean, Let("a2", F64, kir.Const(F64, 0.0)))
    body += (r2, Store("y", kir.i64(0), Cast(Ref("a2", F64), F32)))
    body += (Store("y", kir.i64(1), Ref("mv", F32)),)
    slots = (Slot("x", F32, 0, 0, 0, False), Slot("y", F32, 1, 1, 0, True))
    slots += (Slot("c", F32, 2, 2, 0, True),)
    return kir.Kernel("s0", 0, (), slots, (), body)


@needs_cxx
def test_a_sum_that_reads_a_local_of_the_runs_before_it_stays_apart():
    """A further sum whose terms read a local of a run before it (the mean as a local, not
    in memory) is a launch of its own: in one function the block's other threads would
    read the value the function loaded at its start (thread 0 alone assigns it). The
    values NumPy's."""
    r, _, (_, y, _) = _run(_mean_local_kernel())
    assert len(r.phases) == 2, r.phases
    mean = np.float32(X[:512].astype(np.float64).mean())
    var = np.float32(np.sum(((X[:512] - mean) * (X[:512] - mean)).astype(np.float64)))
    np.testing.assert_allclose(y[:2], [var, mean], rtol=1e-6)


@needs_cxx
@pytest.mark.parametrize("spread", [True, False])
def test_a_small_loop_that_reads_a_local_of_the_run_is_not_the_last_block_s(spread, monkeypatch):
    """A loop of 1,000 points after a sum (few enough for the sum's last block) that reads
    a local of the run combining it is a launch of its own: in the last block, the block's
    other threads would read the value the function loaded at its start (thread 0 alone
    assigns it). The values NumPy's, with ``SPREAD`` on and off."""
    monkeypatch.setattr(render, "SPREAD", spread)
    n = 1000
    r, _, (_, y, _) = _run(_kernel(loops_read_local=True, n=n))
    assert len(r.phases) == 2, r.phases
    norm = np.float32(np.sum(X[:n].astype(np.float64) ** 2))
    np.testing.assert_allclose(y[:n], X[:n] / np.sqrt(norm) * norm * norm, rtol=1e-5)
