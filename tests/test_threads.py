"""The cpu backend's threads (``runtime.pool``, ``llvm.render``'s outlined loops): which
loops go to the threads, the pool's chunks, failures and products, and every example program
run with its loops and products cut into chunks against the reference.

The thresholds are lowered here so that small programs take those paths, and the pool is
one of the test's own with two workers (on any machine: on one CPU they take turns)."""

from __future__ import annotations

import dataclasses
import gc
import re
import weakref

import numpy as np
import pytest
import test_cpu_backend as cpu_tests
from rtl_helpers import NATIVE, TEST_BACKEND

from timerlc.codegen import kir
from timerlc.codegen.generate import generate
from timerlc.codegen.kir import Bin, Const, Fail, For, If, Let, Load, Ref, Store, Un
from timerlc.compiler import compile_plan, run_passes
from timerlc.diagnostics import Source
from timerlc.frontend.check import check_source
from timerlc.llvm import render
from timerlc.runtime import pool
from timerlc.runtime.native import _llvm, _optimized, cblas, target_machine

_KEPT: list = []  # the tests' pools: modules compiled against one call into it later too


@pytest.fixture
def threads(monkeypatch):
    """A pool of two workers that cuts products of 64 multiply-adds or more, and loops of
    16 stores or more handed to it in chunks of 4."""
    monkeypatch.setattr(render, "PAR_WORK", 16)
    monkeypatch.setattr(render, "PAR_CHUNK", 4)
    monkeypatch.setattr(pool, "GEMM_SPLIT_MACS", 64)
    monkeypatch.setattr(pool, "GEMM_GRAIN", 2)
    p = pool.Pool(2, cblas())
    _KEPT.append(p)
    monkeypatch.setattr(pool, "_POOLS", [p])
    yield p
    p.stop()


# ------------------------------------------------------------------ which loops go


def _i(n):
    return Const("i64", n)


def _loop(body, n=64, parallel=True):
    return For("e", _i(0), _i(n), tuple(body), parallel)


def _row(buf="y", width=4, off=0):
    """``buf[e * width + j + off] = 1`` for ``j < width``."""
    idx = Bin(
        "add", Bin("add", Bin("mul", Ref("e"), _i(width), "i64"), Ref("j"), "i64"), _i(off), "i64"
    )
    return For("j", _i(0), _i(width), (Store(buf, idx, Const("f32", 1.0)),))


def test_a_parallel_loop_with_enough_work_goes_to_the_threads(monkeypatch):
    monkeypatch.setattr(render, "PAR_WORK", 256)
    monkeypatch.setattr(render, "PAR_CHUNK", 64)
    assert render.threaded(_loop([_row()])) == 16  # 4 stores an iteration: 16 a chunk
    assert render.threaded(_loop([_row()], n=63)) == 0  # 252 stores: too few
    assert render.threaded(_loop([_row()], parallel=False)) == 0


def test_a_loop_of_math_library_calls_goes_to_the_threads_with_fewer_iterations():
    """A call counts as several stores (``render._work``): an f32 tanh or a random draw
    ``COSTLY_WORK``, a call of the C library or a draw under a condition ``LIBRARY_WORK``:
    8,192 stores of a tanh are enough work, 8,192 plain ones not."""
    x = Load("x", Ref("e"), "f32")
    plain = Store("y", Ref("e"), x)
    costly = Store("y", Ref("e"), Un("tanh", x, "f32"))
    n = render.PAR_WORK // 4
    assert render.threaded(_loop([costly], n=n))
    assert not render.threaded(_loop([plain], n=n))
    assert render._work([costly]) == 1 + render.COSTLY_WORK
    # a call of the C library (f64), and a random draw under a condition (not vectorized)
    f64 = Store("y", Ref("e"), Un("cos", Load("x", Ref("e"), "f64"), "f64"))
    assert render._work([f64]) == 1 + render.LIBRARY_WORK
    draw = kir.Fn("tl_rng_uniform_f32", (Const("i32", 0), Const("i32", 1), Ref("e"), _i(0)), "f32")
    drawn = Store("y", Ref("e"), draw)
    assert render._work([drawn]) == 1 + render.COSTLY_WORK
    cond = If(Bin("lt", Ref("e"), _i(3), "bool"), (drawn,), ())
    assert render._work([cond]) == 2 + render.LIBRARY_WORK


def _kernel(body, temps=(("t", 2),)):
    return kir.Kernel(
        "k", 0, (), (), tuple(kir.Temp(n, "f32", 0, size) for n, size in temps), tuple(body)
    )


def test_a_temporary_each_iteration_sets_first_is_a_chunk_s_own(monkeypatch):
    """A small temporary that each iteration of a parallel loop sets in full before it
    reads it, and that nothing else in the kernel touches, gets a copy a chunk
    (``render._private``: REINFORCE's one-hot of a point's action); one whose values flow
    from an iteration to the next, or out of the loop, or that is set under a condition,
    does not, and the loop stays on one thread."""
    monkeypatch.setattr(render, "PAR_WORK", 16)
    clear = For("j", _i(0), _i(2), (Store("t", Ref("j"), Const("f32", 0.0)),), True)
    bump = Store("t", _i(1), Bin("add", Load("t", _i(1), "f32"), Const("f32", 1.0), "f32"))
    use = Store("y", Ref("e"), Load("t", _i(1), "f32"))
    own = _loop([clear, bump, use])
    assert render._private(own, _kernel([own])) == {"t"}
    assert render.threaded(own, render._private(own, _kernel([own])))
    assert not render.threaded(own)  # (shared, every iteration stores into it)
    # read before it is set: the last iteration's values
    late = _loop([use, clear, bump])
    assert render._private(late, _kernel([late])) == frozenset()
    # read after the loop
    after = Store("z", _i(0), Load("t", _i(0), "f32"))
    assert render._private(own, _kernel([own, after])) == frozenset()
    # set under a condition
    maybe = _loop([If(Bin("lt", Ref("e"), _i(3), "bool"), (clear,), ()), bump, use])
    assert render._private(maybe, _kernel([maybe])) == frozenset()
    # too large
    big = _kernel([own], (("t", render.PRIVATE_BYTES),))
    assert render._private(own, big) == frozenset()


def test_only_loops_whose_iterations_store_apart_go_to_the_threads(monkeypatch):
    monkeypatch.setattr(render, "PAR_WORK", 1)
    assert render.threaded(_loop([_row(), _row("z", 4, 0)]))
    # two stores into one buffer, rows of 4 apart: each iteration's 0..3 and 2..5 overlap
    # the next iteration's row
    assert not render.threaded(_loop([_row(), _row("y", 4, 2)]))
    assert render.threaded(_loop([_row("y", 2), _row("y", 2, 2)], n=8)) == 0  # rows of 2
    # one element every iteration writes (a temporary of the loop's, shared)
    assert not render.threaded(_loop([Store("t", _i(0), Const("f32", 0.0))]))
    # an index through a local the body sets
    let = Let("k", "i64", Bin("mul", Ref("e"), _i(4), "i64"))
    assert not render.threaded(_loop([let, Store("y", Ref("k"), Const("f32", 0.0))]))
    # an index no sum of multiples of locals
    idx = Load("perm", Ref("e"), "i64")
    assert not render.threaded(_loop([Store("y", idx, Const("f32", 0.0))]))
    # (a failure may be inside: a chunk stops at its first, test_a_failure_on_the_threads...)
    assert render.threaded(_loop([_row(), Fail(3)]))
    # a local set outside (the same in every iteration) may move the rows
    moved = Bin("add", Bin("mul", Ref("e"), _i(1), "i64"), Ref("base"), "i64")
    assert render.threaded(_loop([Store("y", moved, Const("f32", 0.0))]))


def test_a_loop_over_a_block_s_rows_goes_to_the_threads(monkeypatch):
    monkeypatch.setattr(render, "PAR_WORK", 1)
    lo = Bin("mul", Ref("blk"), _i(8), "i64")
    s = For("e", lo, Bin("add", lo, _i(8), "i64"), (_row(),), True)
    assert render.threaded(s)
    wide = For("e", lo, Bin("mul", Ref("blk"), _i(9), "i64"), (_row(),), True)
    assert not render.threaded(wide)  # (its iterations vary)


def _sum_rows(n=64, width=4, extra=()):
    """``t[j] += x[e * width + j]`` over ``e < n``: a column sum into a temporary."""
    idx = Bin("add", Bin("mul", Ref("e"), _i(width), "i64"), Ref("j"), "i64")
    upd = Store(
        "t", Ref("j"), Bin("add", Load("t", Ref("j"), "f64"), Load("x", idx, "f64"), "f64")
    )
    inner = For("j", _i(0), _i(width), (upd, *extra), True)
    return For("e", _i(0), _i(n), (inner,), False, (("t", "add"),))


def test_a_reduction_with_enough_work_goes_to_the_threads_in_chunks_of_its_own(monkeypatch):
    monkeypatch.setattr(render, "PAR_WORK", 256)
    monkeypatch.setattr(render, "PAR_CHUNK", 32)
    assert render.reduced(_sum_rows()) == 8  # 256 updates, chunks of 32: 8 (not by threads)
    assert render.reduced(_sum_rows(n=63)) == 0  # 252: too few
    monkeypatch.setattr(render, "PAR_CHUNK", 1)
    assert render.reduced(_sum_rows()) == render.PAR_REDUCE_CHUNKS  # (at most)
    # a store of anything but the accumulators: the loop stays whole
    other = Store("y", Ref("j"), Const("f64", 0.0))
    assert render.reduced(_sum_rows(extra=(other,))) == 0
    assert render.reduced(dataclasses.replace(_sum_rows(), reduce=())) == 0
    # a local an iteration sets before it reads it, in its block (a gram chain's value at
    # its point): each chunk's own; read before it is set, or set twice: the loop stays whole
    kept = Store("t", Ref("j"), Bin("add", Load("t", Ref("j"), "f64"), Ref("k", "f64"), "f64"))
    let = Let("k", "f64", Load("x", Ref("j"), "f64"))
    assert render.reduced(_sum_rows(extra=(let, kept))) == render.PAR_REDUCE_CHUNKS
    assert render.reduced(_sum_rows(extra=(kept, let))) == 0
    assert render.reduced(_sum_rows(extra=(let, kept, let))) == 0


# ------------------------------------------------------------------ the pool

_BODY = """
define i32 @body(ptr %frame, i64 %lo, i64 %hi) {
entry:
  %out = load ptr, ptr %frame
  %fp = getelementptr i64, ptr %frame, i64 1
  %fail = load i64, ptr %fp
  br label %head
head:
  %i = phi i64 [ %lo, %entry ], [ %i1, %next ]
  %more = icmp slt i64 %i, %hi
  br i1 %more, label %body, label %done
body:
  %p = getelementptr i64, ptr %out, i64 %i
  %v = mul i64 %i, 3
  store i64 %v, ptr %p
  %r = urem i64 %i, %fail
  %bad = icmp eq i64 %r, 7
  %i1 = add i64 %i, 1
  br i1 %bad, label %failed, label %next
next:
  br label %head
failed:
  %code = trunc i64 %i to i32
  ret i32 %code
done:
  ret i32 0
}
"""


def _body():
    llvm = _llvm()
    tm = target_machine()
    engine = llvm.create_mcjit_compiler(_optimized(_BODY, tm), tm)
    engine.finalize_object()
    _KEPT.append(engine)
    return engine.get_function_address("body")


def test_the_pool_runs_every_chunk_once_and_gives_the_first_failure(threads):
    body, run = _body(), pool.RUN(threads.run)
    out = np.zeros(1000, np.int64)
    frame = np.array([out.ctypes.data, 5], np.int64)  # (i % 5 is never 7: no failure)
    for _ in range(50):
        out[:] = -1
        assert run(body, frame.ctypes.data, 0, 1000, 10, 4) == 0
        np.testing.assert_array_equal(out, np.arange(1000) * 3)
    # a range of its own, in chunks at most 64
    out[:] = -1
    assert run(body, frame.ctypes.data, 100, 900, 1, 4) == 0
    np.testing.assert_array_equal(out[100:900], np.arange(100, 900) * 3)
    assert (out[:100] == -1).all() and (out[900:] == -1).all()
    # iterations 7, 307, 607, 907 fail (their index is their code): the chunks of 100 fail
    # at their first, and the call gives the lowest chunk's
    frame[1] = 300
    for _ in range(20):
        assert run(body, frame.ctypes.data, 0, 1000, 100, 4) == 7
    # a range of fewer than two chunks' iterations runs on the caller alone
    frame[1] = 5
    assert run(body, frame.ctypes.data, 0, 10, 6, 4) == 0


_MEET = """
; chunk 0 (the caller's first) waits for another chunk (a worker's) to set frame[0]
define i32 @meet(ptr %frame, i64 %lo, i64 %hi) {
entry:
  %first = icmp eq i64 %lo, 0
  br i1 %first, label %wait, label %set
wait:
  %n = phi i64 [ 0, %entry ], [ %n1, %again ]
  %v = load atomic i64, ptr %frame acquire, align 8
  %seen = icmp ne i64 %v, 0
  br i1 %seen, label %ok, label %again
again:
  %n1 = add i64 %n, 1
  %late = icmp sgt i64 %n1, 20000000000
  br i1 %late, label %timeout, label %wait
timeout:
  ret i32 99
set:
  store atomic i64 1, ptr %frame release, align 8
  br label %ok
ok:
  ret i32 0
}
"""


def test_the_pool_s_workers_run_chunks_beside_the_caller(threads):
    llvm = _llvm()
    tm = target_machine()
    engine = llvm.create_mcjit_compiler(_optimized(_MEET, tm), tm)
    engine.finalize_object()
    _KEPT.append(engine)
    meet, run = engine.get_function_address("meet"), pool.RUN(threads.run)
    for _ in range(5):
        flag = np.zeros(1, np.int64)
        taken = threads.taken
        # two chunks: the caller takes the first, which ends only once a worker ran the other
        assert run(meet, flag.ctypes.data, 0, 2, 1, 1) == 0
        assert threads.taken == taken + 1


def test_a_pool_without_workers_runs_the_calls_alone(threads):
    threads.after_fork()  # (as in a forked child, where no worker runs)
    body, run = _body(), pool.RUN(threads.run)
    taken = threads.taken
    out = np.zeros(500, np.int64)
    frame = np.array([out.ctypes.data, 5], np.int64)
    assert run(body, frame.ctypes.data, 0, 500, 5, 4) == 0
    np.testing.assert_array_equal(out, np.arange(500) * 3)
    assert threads.taken == taken


def test_one_thread_keeps_the_blas_on_one_thread_too(monkeypatch):
    """``TIMERLC_THREADS=1`` (or one CPU): no pool, and the BLAS is told to run on one
    thread, whose own threads would otherwise take every core and spin there (two runs at
    once of REINFORCE-TD: 1.53 s of kernels each, 0.26 s alone; with this, 0.28 each). With
    more threads the pool starts, and with it the BLAS on one thread (its products cut)."""
    from timerlc.runtime import native

    told = []
    monkeypatch.setattr(native, "blas_threads", told.append)
    monkeypatch.setattr(pool, "_POOLS", [])
    monkeypatch.setenv("TIMERLC_THREADS", "1")
    assert pool.get() is None and told == [1]
    monkeypatch.setattr(pool, "_POOLS", [])
    monkeypatch.setenv("TIMERLC_THREADS", "2")
    p = pool.get()
    try:
        assert p is not None and p.workers == 1 and told == [1, 1]
    finally:
        p.stop()


def test_a_pool_s_code_outlives_its_workers():
    # (a worker runs the pool's machine code: the pool is kept until it is stopped)
    ref = weakref.ref(pool.Pool(1, None))
    gc.collect()
    assert ref() is not None and ref().taken == 0
    ref().stop()
    gc.collect()
    assert ref() is None


GEMM = {"s": (np.float32, 1e-5), "d": (np.float64, 1e-12)}


@pytest.mark.skipif(cblas() is None, reason="no BLAS of NumPy's found")
@pytest.mark.parametrize("which", ["s", "d"])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("m,n,k", [(37, 5, 6), (3, 41, 7), (16, 16, 3), (5, 3, 40), (6, 4, 100)])
def test_a_product_cut_along_c_s_longer_side_is_the_blas_s(threads, which, ta, tb, m, n, k):
    dt, tol = GEMM[which]
    fn = pool.gemm_type(which)(threads.gemm[which])
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dt)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dt)
    c = np.full((m, n + 3), 99.0, dt)  # (rows of C 3 wider than C: its ldc)
    for _ in range(20):
        fn(101, 112 if ta else 111, 112 if tb else 111, m, n, k, 1.0, a.ctypes.data,
           a.shape[1], b.ctypes.data, b.shape[1], 0.0, c.ctypes.data, n + 3)  # fmt: skip
    want = (a.T if ta else a) @ (b.T if tb else b)
    np.testing.assert_allclose(c[:, :n], want, rtol=tol, atol=tol)
    assert (c[:, n:] == 99.0).all()


@pytest.mark.skipif(cblas() is None, reason="no BLAS of NumPy's found")
@pytest.mark.parametrize(
    "m,n,k",
    [(4, 64, 3000), (64, 2, 3001), (64, 1, 2000), (2, 48, 999), (3, 16, 500), (17, 2, 800)],
)
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_a_skinny_gram_cut_along_k_is_ours_where_it_can_be(threads, m, n, k, beta):
    """A weight's gradient C = A^T B of one side at most 4 and the other a multiple of 16 up
    to 64 (``pool.GRAM_SMALL``, ``GRAM_VECTORS``) is summed by the pool's own grams (an
    outer product of a row of each a step, ``pool._gram``), each chunk of the cut along
    ``k``; any other shape, or a C that adds to itself (beta 1), by the BLAS. The same
    product either way, to float32's rounding of sums of thousands of terms."""
    fn = pool.gemm_type("s")(threads.gemm["s"])
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((k, m)).astype(np.float32)  # (A stored k x m: transposed)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n + 3)).astype(np.float32)
    c = c0.copy()  # (rows of C 3 wider than C: its ldc)
    fn(101, 112, 111, m, n, k, 1.0, a.ctypes.data, m, b.ctypes.data, n, beta, c.ctypes.data, n + 3)
    want = a.T.astype(np.float64) @ b.astype(np.float64) + beta * c0[:, :n]
    np.testing.assert_allclose(c[:, :n], want, rtol=2e-5, atol=2e-4)
    np.testing.assert_array_equal(c[:, n:], c0[:, n:])


def test_the_threads_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("TIMERLC_THREADS", "3")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert pool.threads() == 3
    monkeypatch.setenv("TIMERLC_THREADS", "many")  # (not a number: ignored)
    assert pool.threads() == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "0")
    monkeypatch.setenv("TIMERLC_THREADS", "100000")
    assert pool.threads() == pool.MAX_THREADS
    # else the CPUs the process may use: its affinity, and its control group's quota
    monkeypatch.delenv("TIMERLC_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(pool.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    monkeypatch.setattr(pool, "_quota", lambda: 3)
    assert pool.threads() == 3
    monkeypatch.setattr(pool, "_quota", lambda: pool.MAX_THREADS)
    assert pool.threads() == 6


# ------------------------------------------------------------------ programs


def test_loops_and_reductions_give_the_same_values_on_any_number_of_threads(monkeypatch):
    # (the products whole: a product cut in rows rounds as the BLAS rounds its rows)
    if TEST_BACKEND != "cpu" or not NATIVE:
        pytest.skip("the backend under test runs no LLVM code")
    monkeypatch.setattr(render, "PAR_WORK", 16)
    monkeypatch.setattr(render, "PAR_CHUNK", 4)
    monkeypatch.setattr(pool, "GEMM_SPLIT_MACS", 1 << 60)
    runs = []
    for workers in (0, 1, 3):
        p = pool.Pool(workers, cblas())
        _KEPT.append(p)
        monkeypatch.setattr(pool, "_POOLS", [p])
        rt, metrics = cpu_tests.compiled("ppo")
        assert "%part0 = alloca" in rt.module.text  # (reductions in chunks)
        runs.append(metrics)  # (its losses, KL and clip fraction: every update's values)
        p.stop()
    assert runs[0] and all(other == runs[0] for other in runs[1:])


@pytest.mark.parametrize("name", sorted(cpu_tests.SMALL))
def test_program_with_threads_equals_reference(threads, name):
    if TEST_BACKEND != "cpu" or not NATIVE:
        pytest.skip("the backend under test runs no LLVM code")
    graph = cpu_tests.graph_of(name, cpu_tests.SMALL[name])
    ref, ref_m, rt, cpu_m = cpu_tests.both(name)
    assert ".par0(" in rt.module.text  # (loops went to the threads)
    if name == "reinforce":  # (a chunk's own one-hot of its points' actions, _private)
        pars = [f for f in rt.module.text.split("\ndefine ") if re.match(r"i32 @\w+\.par\d+\(", f)]
        assert any("= alloca [8 x i8], align 64" in f.split("\n}\n")[0] for f in pars)
    for out in graph.outputs:
        want, got = ref.value(out), rt.value(out)
        assert got.dtype == want.dtype and got.shape == want.shape, out
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=out)
    assert len(cpu_m) == len(ref_m) > 0
    for (n1, p1, v1), (n2, p2, v2) in zip(sorted(ref_m), sorted(cpu_m)):
        assert (n1, p1) == (n2, p2)
        assert np.isclose(v1, v2, rtol=1e-5, atol=1e-6, equal_nan=True), (n1, p1, v1, v2)


def test_a_failure_on_the_threads_names_the_first_failing_point(threads, tmp_path):
    """A threaded loop whose iterations fail from t = 45 on (an index out of range): the
    chunks from there fail, the others run on; the kernel fails with the first chunk's
    code, and the run says what the reference says, the first failing point."""
    if TEST_BACKEND != "cpu" or not NATIVE:
        pytest.skip("the backend under test runs no LLVM code")
    from rtl_helpers import cli

    text = (
        "config T = 64\ndim t < T\nv[t] = zeros([3])\n"
        "k[t] = i32(floor(f32(t) / 15.0))\nx[t] = v[t][k[t]]\nout x\n"
    )
    graph = check_source(Source("p.rtl", text))
    gen = generate(compile_plan(run_passes(graph)))
    assert ".par0(" in gen.text and "ret i32 1" in gen.text  # (a failure in a loop cut)
    p = tmp_path / "p.rtl"
    p.write_text(text)
    said = []
    for backend in ("reference", "cpu"):
        r = cli("run", p, "--backend", backend, "--no-progress")
        assert r.exit_code == 3, r.stderr
        said.append(r.stderr)
    assert "while computing x at t=45 (line 5)" in said[0] and "out of range" in said[0]
    assert said[1] == said[0]
