"""Chains (``cuda/render.py``, ``_Kernel._chains``): a product's rows and the loops over them
as one function, each block a few rows through every step in turn; on cuda-emu against
NumPy, and where rows meet, no chain."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from timerlc.codegen import kir
from timerlc.codegen.kir import Bin, For, Gemm, Kernel, Load, Ref, Slot, Store, Un
from timerlc.cuda import products, render
from timerlc.cuda.emu import compiler
from timerlc.plan import items

ROOT = Path(__file__).resolve().parent.parent
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler")

M, K, N = 300, 64, 64  # (rows not a multiple of CHAIN_ROWS: a block's last rows fewer)


def _layer(shift: int = 0, n: int = N) -> Kernel:
    """``y = tanh(x @ w + b)`` (a rows product and its epilogue) and ``z[r] = y[r', 0] +
    y[r', n-1]``, ``r' = r + shift`` (within the rows: at its own row where ``shift`` is 0)."""
    r, c = Ref("r"), Ref("c")
    zero = kir.i64(0)
    gemm = Gemm("f32", False, False, M, n, K, "x", zero, K, "w", zero, n, "y", zero, n)
    at = kir.add(kir.mul(r, n), c)
    y = Load("y", at, "f32")
    epilogue = For(
        "r",
        kir.i64(0),
        kir.i64(M),
        (
            For(
                "c",
                kir.i64(0),
                kir.i64(n),
                (Store("y", at, Un("tanh", Bin("add", y, Load("b", c, "f32"), "f32"), "f32")),),
            ),
        ),
        True,
    )
    row = kir.mul(r, n)
    if shift:
        row = kir.mul(Bin("mod", kir.add(r, kir.i64(shift)), kir.i64(M), "i64"), n)
    first = Load("y", row, "f32")
    last = Load("y", kir.add(row, kir.i64(n - 1)), "f32")
    tail = For("r", kir.i64(0), kir.i64(M), (Store("z", r, Bin("add", first, last, "f32")),), True)
    return Kernel(
        "layer", 0, ("j",), _slots("x", "w", "b", "y", "z", written=3), (), (gemm, epilogue, tail)
    )


def _slots(*names: str, written: int) -> tuple:
    """Float32 slots ``names`` at table entries 0, 1, ...: the first ``written`` read only,
    the others written."""
    return tuple(Slot(x, "f32", k, k, 0, k >= written) for k, x in enumerate(names))


def _emulated(dev, text: str, inputs: tuple, outputs: tuple, scratch: int = 8):
    """A runner of functions of the module ``text`` on the emulated device ``dev``: its
    table the ``inputs`` (arrays, uploaded) then float32 arrays of the shapes ``outputs``,
    ``scratch`` bytes of scratch memory; ``run(name, ...)`` launches each function over two
    blocks (the loop value 0) in turn and gives the outputs as they are then."""
    module = dev.load(render.head() + "\n" + text)
    ptrs = [dev.alloc(a.nbytes) for a in inputs]
    ptrs += [dev.alloc(4 * int(np.prod(shape))) for shape in outputs]
    for p, a in zip(ptrs, inputs):
        dev.upload(p, a)
    table = dev.alloc(8 * len(ptrs))
    dev.upload(table, np.array(ptrs, np.uint64))

    def run(*names: str) -> list:
        for name in names:
            args = np.zeros(1, np.int64)
            dev.launch(dev.function(module, name), table, args, dev.alloc(scratch), 2)
        got = [np.empty(shape, np.float32) for shape in outputs]
        for p, a in zip(ptrs[len(inputs) :], got):
            dev.download(p, a)
        return got

    return run


def test_a_layer_and_a_loop_over_its_rows_are_one_function():
    """A rows product of ours, its epilogue and a loop reading its C at each row alone: one
    function, a block ``CHAIN_ROWS`` rows at a time (``items.ChainCall``), or the launches
    it stands for after it (the product, the BLAS's or ours, then the loop), as the
    runtime chooses; a loop that reads another row's C is no chain's."""
    r = render._Kernel(_layer())
    text = r.render()
    chain, gemm, loop = r.phases
    threads = -(-M // render.CHAIN_ROWS) * render.THREADS
    assert chain == items.ChainCall((("layer_0c", threads),), 2, (("layer_0ct", threads),))
    assert isinstance(gemm, items.GemmCall) and loop == ("layer", M)  # (the first, its name)
    assert "for (long long r0 = tl_rb; r0 < tl_re; r0 += 64) {" in text
    apart = render._Kernel(_layer(shift=1))
    apart.render()
    assert not any(isinstance(p, items.ChainCall) for p in apart.phases)
    old = render.CHAINS
    try:
        render.CHAINS = False
        off = render._Kernel(_layer())
        off.render()
        assert off.phases == [gemm, ("layer", M)]
    finally:
        render.CHAINS = old


def test_a_chain_s_shared_memory_holds_its_products_weights_and_largest_tile():
    """``_chain_floats``: each product's op(B) and the largest tile of A; a run whose floats
    pass ``products.SMEM_FLOATS`` is cut before the product that would pass them."""
    g = _layer().body[0]
    step = render._Step("blas", None, form=g)
    bm, tile = products.rows_tile(g)
    assert (bm, tile) == (64, 64 * 68)
    assert render._chain_floats([step]) == tile + K * N
    assert render._chain_floats([step, step]) == tile + 2 * K * N > products.SMEM_FLOATS


@needs_cxx
@pytest.mark.parametrize("n", [N, 2])
def test_a_chain_computes_the_layer_and_the_loop_on_cuda_emu(n):
    """The chain's function on cuda-emu (blocks of its threads, each ``CHAIN_ROWS`` rows of
    the 300, the last block's fewer) makes NumPy's ``tanh(x @ w + b)`` and the loop's sums
    over it (a 64-wide layer, and a head of 2 columns: a tile of 128 rows)."""
    from timerlc.runtime.cuda import EmuDevice

    k = _layer(n=n)
    r = render._Kernel(k)
    text = r.render()
    assert isinstance(r.phases[0], items.ChainCall)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((K, n)) * 0.2).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    y, z = _emulated(EmuDevice(), text, (x, w, b), ((M, n), (M,)))("layer_0c")
    want = np.tanh(x.astype(np.float64) @ w + b)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, y[:, 0] + y[:, n - 1], rtol=1e-6, atol=1e-6)


def _two_layers() -> Kernel:
    """``h = x / 2``, ``y = tanh(h @ w1 + b)``, ``z = y @ w2``, ``out[r] = z[r, 0] + z[r,
    N-1]``: two 64-wide layers, whose copies of op(B) and tile pass a function's static
    shared memory."""
    r, c = Ref("r"), Ref("c")
    zero = kir.i64(0)
    xa = kir.add(kir.mul(r, K), c)
    half = Bin("mul", Load("x", xa, "f32"), kir.Const("f32", 0.5), "f32")
    pre = For("r", zero, kir.i64(M), (For("c", zero, kir.i64(K), (Store("h", xa, half),)),), True)
    g1 = Gemm("f32", False, False, M, N, K, "h", zero, K, "w1", zero, N, "y", zero, N)
    at = kir.add(kir.mul(r, N), c)
    inner = For(
        "c",
        zero,
        kir.i64(N),
        (
            Store(
                "y",
                at,
                Un("tanh", Bin("add", Load("y", at, "f32"), Load("b", c, "f32"), "f32"), "f32"),
            ),
        ),
    )
    epilogue = For("r", zero, kir.i64(M), (inner,), True)
    g2 = Gemm("f32", False, False, M, N, N, "y", zero, N, "w2", zero, N, "z", zero, N)
    row = kir.mul(r, N)
    both = Bin("add", Load("z", row, "f32"), Load("z", kir.add(row, kir.i64(N - 1)), "f32"), "f32")
    tail = For("r", zero, kir.i64(M), (Store("out", r, both),), True)
    slots = _slots("x", "w1", "b", "w2", "h", "y", "z", "out", written=4)
    return Kernel("two", 0, ("j",), slots, (), (pre, g1, epilogue, g2, tail))


@needs_cxx
def test_a_chain_of_chains_in_the_launch_s_dynamic_shared_memory_on_cuda_emu():
    """Two layers' products each fit a function's static shared memory as a chain of their
    own, both together only with the launch's dynamic shared memory: a chain of each, and
    around them a chain of both (``ChainCall.shared``: the bytes of ``TL_DYNAMIC_SHARED``'s
    array, the pool, then each op(B)), standing for the two chains and their launches
    (``covers`` all). On cuda-emu the outer chain, and the inner two one after the other,
    make NumPy's values, the same bits either way."""
    import re

    from timerlc.runtime.cuda import EmuDevice

    r = render._Kernel(_two_layers())
    text = r.render()
    outer, first, *_ = r.phases
    second = next(p for p in r.phases[2:] if isinstance(p, items.ChainCall))
    assert isinstance(outer, items.ChainCall) and outer.covers == len(r.phases) - 1
    assert outer.functions[0][0] == "two_0o" and first.functions[0][0] == "two_0c"
    assert first.shared == second.shared == 0
    count = int(re.search(r"TL_DYNAMIC_SHARED\(tl_dyn, (\d+)\)", text).group(1))
    assert outer.shared == 16 * count > 4 * products.SMEM_FLOATS
    tile = products.rows_tile(_two_layers().body[1])[1]
    assert outer.shared == 16 * (tile // 4 + 2 * K * N // 4)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w1, w2 = ((rng.standard_normal((K, N)) * 0.2).astype(np.float32) for _ in range(2))
    b = rng.standard_normal(N).astype(np.float32)
    run = _emulated(EmuDevice(), text, (x, w1, b, w2), ((M, K), (M, N), (M, N), (M,)))
    got = [run("two_0o")[1:], run(first.functions[0][0], second.functions[0][0])[1:]]
    want_y = np.tanh((x * np.float32(0.5)).astype(np.float64) @ w1 + b)
    np.testing.assert_allclose(got[0][0], want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[0][1], got[0][0].astype(np.float64) @ w2, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[0][2], got[0][1][:, 0] + got[0][1][:, N - 1])
    for a, b2 in zip(*got):
        np.testing.assert_array_equal(a, b2)


@needs_cxx
def test_a_chain_s_tf32_function_computes_the_layer_on_cuda_emu():
    """A chain whose product has TF32 functions (``products.tf32_form``) has a TF32
    function too (``ChainCall.tf32``, ``render.chain_tf32``): the product made as
    ``products.rows_tf32_lines`` makes it (its operands rounded to TF32, ties away from
    zero, float32 sums), on cuda-emu ``tanh(x @ w + b)`` of the rounded operands within
    float32's bound, beyond it from the float32 function's values; the loop over its rows
    as in the float32 function. A head of 2 columns has none (no TF32 form)."""
    from timerlc.runtime import cuda
    from timerlc.runtime.cuda import EmuDevice

    r = render._Kernel(_layer())
    text = r.render()
    threads = -(-M // render.CHAIN_ROWS) * render.THREADS
    assert r.phases[0].tf32 == (("layer_0ct", threads),)
    narrow = render._Kernel(_layer(n=2))
    narrow.render()
    assert isinstance(narrow.phases[0], items.ChainCall) and not narrow.phases[0].tf32
    rng = np.random.default_rng(5)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((K, N)) * 0.2).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    run = _emulated(EmuDevice("tensorfloat32"), text, (x, w, b), ((M, N), (M,)))
    got = {}
    for name in ("layer_0c", "layer_0ct"):
        y, z = run(name)
        np.testing.assert_array_equal(z, y[:, 0] + y[:, N - 1])
        got[name] = y.astype(np.float64)
    t = lambda a: cuda.tf32(a, away=True).astype(np.float64)
    bound = K * 2.0**-23 * (abs(t(x)) @ abs(t(w)) + abs(b)) + 2.0**-23  # (and tanh's)
    assert (abs(got["layer_0ct"] - np.tanh(t(x) @ t(w) + b)) <= bound).all()
    exact = np.tanh(x.astype(np.float64) @ w + b)
    assert (abs(got["layer_0c"] - exact) <= bound).all()
    assert (abs(got["layer_0ct"] - exact) > bound).any()  # (the operands were TF32)


@needs_cxx
def test_a_chain_on_blocks_of_a_gpu_s_128_threads():
    """The chain's functions on cuda-emu with blocks of 128 threads, a GPU's (the products'
    and copies' ways for them: ``blockDim.x == 128``): the test above in a process of its
    own (``TIMERLC_EMU_THREADS`` is read once a process)."""
    if os.environ.get("TIMERLC_EMU_THREADS") == "128":
        pytest.skip("this process's blocks have 128 threads already: the test above ran so")
    env = dict(os.environ, TIMERLC_EMU_THREADS="128", PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "emu"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "12 passed" in r.stdout


@needs_cxx
@pytest.mark.parametrize("policy", ["ours", "blas"])
def test_weights_and_biases_gradients_in_a_chain_on_cuda_emu(policy, monkeypatch):
    """Two grams of ours over the same 600 rows (``x^T @ dy``, ``x^T @ dz``, 8 x 16), each
    with its B's column sums (the biases' gradients, float64): one chain, each block a
    chunk of the rows (a copy of each gram's, ``products.parts``: two), its tiles added
    into the copies (stored at a chunk's first: ``tl_first``), the copies added by the
    last block of the tickets (``products.chain_sums_lines``), which then casts the sums
    (the steps after them); the plan's ``ChainCall`` stands for the two products' launches
    after it, which run instead where the runtime chooses (``blas``: the launches, the
    products the BLAS's; ``ours``: the chain). The values within float32's bound of the
    exact ones either way, as the cpu's."""
    from test_cuda import (
        BIAS_GRADIENTS,
        _assert_within_bounds,
        cuda_gen,
        generated,
        run_both,
    )

    monkeypatch.setenv("TIMERLC_PRODUCTS", policy)
    text = BIAS_GRADIENTS.replace("W = 80", "W = 16")
    _, gen = generated("p.rtl", text)
    cu = cuda_gen(gen)
    covered = []  # (the launches a chain stands for)
    for _, phases in cu.plan.kernels.launches:
        for q, f in enumerate(phases):
            if isinstance(f, items.ChainCall):
                covered += phases[q + 1 : q + 1 + f.covers]
    grams = [f for f in covered if isinstance(f, items.GemmCall) and f.k == 600 and f.a.t]
    assert len(grams) == 2
    assert "tl_first ? v : tl_pp[" in cu.text and "tl_pp0" in cu.text and "tl_pd1" in cu.text
    ref, rt, _, _, _ = run_both(gen)
    (choice,) = rt.chain_choices.values()
    assert choice == (None, None, policy == "ours")
    assert (rt.blas_calls > 0) == (policy == "blas")
    _assert_within_bounds(rt, ref)


@needs_cxx
def test_a_chain_s_chunk_past_its_rows_adds_zero_copies_on_cuda_emu(monkeypatch):
    """Whole tiles a chunk can leave a gram chain's last chunk without rows: 1,600 rows in
    6 copies (``products.parts``) of 320 rows (``render._chunk``, whole tiles of 64). No
    tile of that chunk stores its copies, so the chain stores zeros into them
    (``chain_body``); the copies' bytes were the scratch memory's before (PPO at 1,600
    rows a minibatch trained on them: NaN losses). The scratch memory poisoned with
    1000s, the gradients within float32's bound of the exact ones."""
    from test_cuda import BIAS_GRADIENTS, _assert_within_bounds, cuda_gen, generated

    from timerlc.runtime.cpu import CpuRuntime
    from timerlc.runtime.cuda import DeviceRuntime, EmuDevice

    monkeypatch.setenv("TIMERLC_PRODUCTS", "ours")
    n = 1600
    assert (products.parts(n) - 1) * render._chunk(n) >= n  # (the last chunk: no rows)
    text = BIAS_GRADIENTS.replace("N = 600", f"N = {n}").replace("W = 80", "W = 16")
    _, gen = generated("p.rtl", text)
    cu = cuda_gen(gen)
    assert "if (tl_lo >= tl_hi) {  // (no rows: its copies zeros)" in cu.text
    rt = DeviceRuntime(cu.plan, text=cu.text, device=EmuDevice())
    rt.device.upload(rt._scratch, np.full(rt._scratch_bytes // 4, 1000.0, np.float32))
    rt.run()
    assert rt.chain_choices and all(c[2] for c in rt.chain_choices.values())
    ref = CpuRuntime(gen.plan, native=gen.text)
    ref.run()
    _assert_within_bounds(rt, ref)


def test_plans_chains_are_checked():
    """A plan's chain (``{"chain": {"functions": [...], "covers": n}}`` among a call's
    launches) is read back as written (a chain inside another's too), and refused where it
    stands for more launches than follow it, for none, past the end of a chain's it is
    inside of, where its function is named twice, where it parts a pair of products with
    joint functions, or with a field of its own; its TF32 functions as many as its
    functions, named once; its dynamic shared memory in range, none for TF32 functions it
    has none of."""
    import json

    from rtl_helpers import refuses_changed_plans
    from test_cuda import PROGRAMS, cuda_gen, generated

    # (at 64 x 64 a chain stands for a layer's gradient and its weight's: joint functions)
    _, gen = generated(PROGRAMS / "ppo.rtl", B=64, T=64, total_steps=8192)
    plan = cuda_gen(gen).plan
    data = items.to_json(plan)
    assert items.from_json(json.loads(json.dumps(data)), "p") == plan
    rows = data["kernels"]["fused_launches"]
    at = [
        (r, q)
        for r, (_, phases) in enumerate(rows)
        for q, f in enumerate(phases)
        if isinstance(f, dict) and "chain" in f
    ]
    assert at
    r, q = next((r, q) for r, q in at if "tf32" in rows[r][1][q]["chain"])
    assert any(  # (a chain of chains among them, its dynamic shared memory)
        rows[r2][1][q2]["chain"].get("shared")
        and any(
            (r2, q3) in at for q3 in range(q2 + 1, q2 + 1 + rows[r2][1][q2]["chain"]["covers"])
        )
        for r2, q2 in at
    )
    joint = [  # (a chain whose launches hold a pair with joint functions)
        (r2, q2, q3)
        for r2, q2 in at
        for q3, f in enumerate(rows[r2][1])
        if isinstance(f, dict)
        and "joint" in f.get("gemm", {})
        and q2 < q3 <= q2 + rows[r2][1][q2]["chain"]["covers"]
        and not any((r2, q) in at for q in range(q2 + 1, q3))  # (the innermost chain's)
    ]

    def chain(k, r=r, q=q):
        return k["fused_launches"][r][1][q]["chain"]

    def more(k):
        chain(k)["covers"] = len(k["fused_launches"][r][1]) - q

    def overlapping(k):  # (a chain inside another's, past its end)
        phases = k["fused_launches"][r][1]
        covers = chain(k)["covers"]
        phases.insert(q + 1, {"chain": {"functions": [["zz_c", 128]], "covers": covers}})

    cases = [
        (more, "a chain stands for"),
        (lambda k: chain(k).__setitem__("covers", 0), "out of range"),
        (lambda k: chain(k).__setitem__("functions", []), "expected 1 to"),
        (lambda k: chain(k).__setitem__("then", []), "unknown field"),
        (overlapping, "past the end of a chain's it is inside of"),
        (lambda k: chain(k)["functions"][0].__setitem__(0, k["statements"][0][1]), "twice"),
        (lambda k: chain(k)["tf32"].append(["zz_ct", 128]), "2 TF32 functions for 1"),
        (lambda k: chain(k)["tf32"][0].__setitem__(0, chain(k)["functions"][0][0]), "twice"),
        (lambda k: chain(k)["tf32"][0].__setitem__(1, 0), "out of range"),
        (lambda k: chain(k).__setitem__("shared", -1), "out of range"),
        (lambda k: chain(k).__setitem__("shared", 1 << 20), "out of range"),
        (lambda k: (chain(k).pop("tf32"), chain(k).__setitem__("tf32_shared", 64)), "none of"),
    ]
    assert joint
    r2, q2, q3 = joint[0]
    part = (lambda k: chain(k, r2, q2).__setitem__("covers", q3 - q2), "a chain's launches part")
    refuses_changed_plans(data, [*cases, part])


def test_kernels_one_after_another_join_where_a_chain_then_crosses_them():
    """The fusion search joins two kernels one after the other (``fuse.seq``) where their
    chains then save more launches than each one's apart (``render.chain_saved``,
    ``codegen.tree._Tree.chained``): PPO's weights' gradients, a kernel each, are fused
    kernels whose chains cross their statements' kernels; with ``CHAINS`` off, none."""
    from test_cuda import PROGRAMS, cuda_gen, generated

    _, gen = generated(PROGRAMS / "ppo.rtl", B=64, T=64, total_steps=8192)

    def crossing() -> list:
        cu = cuda_gen(gen)
        own = {k.sid: k for k in cu.kernels}
        return [
            k.parts
            for k in cu.fused
            if render.chain_saved(k) > sum(render.chain_saved(own[s]) for s in k.parts)
        ]

    assert len(crossing()) >= 2
    old = render.CHAINS
    try:
        render.CHAINS = False
        assert crossing() == []
    finally:
        render.CHAINS = old


S, T2 = 3, 64  # (a nest's rows: 3 of b from j * 3, 64 of t each: 192 rows, tiles of 128)


def _nested(shift: int = 0) -> Kernel:
    """``h[b, t] = tanh(x[b, t])`` (over ``b`` from ``j * S`` and ``t``, 4 columns), ``y =
    h @ w`` over the nest's ``S * T2`` rows, ``z[b, t] = y[row + shift, 0]``: a chain whose
    loops' rows are two levels of their nest (``render._row_levels``)."""
    j, b, t, e = Ref("j"), Ref("b"), Ref("t"), Ref("e")
    lo = kir.mul(j, S)
    row = kir.add(kir.mul(Bin("sub", b, lo, "i64"), T2), t)
    k, n = 4, 8

    def nest(body):
        inner = For("t", kir.i64(0), kir.i64(T2), body, True)
        return For("b", lo, kir.add(lo, kir.i64(S)), (inner,), True)

    xs = Load("x", kir.add(kir.mul(kir.add(kir.mul(b, T2), t), k), e), "f32")
    h = nest(
        (
            For(
                "e",
                kir.i64(0),
                kir.i64(k),
                (Store("h", kir.add(kir.mul(row, k), e), Un("tanh", xs, "f32")),),
            ),
        )
    )
    zero = kir.i64(0)
    gemm = Gemm("f32", False, False, S * T2, n, k, "h", zero, k, "w", zero, n, "y", zero, n)
    z = nest(
        (
            Store(
                "z",
                kir.add(kir.mul(b, T2), t),
                Load("y", kir.mul(kir.add(row, kir.i64(shift)), n), "f32"),
            ),
        )
    )
    return Kernel(
        "nested", 0, ("j",), _slots("x", "w", "h", "y", "z", written=2), (), (h, gemm, z)
    )


@needs_cxx
def test_a_chain_s_loops_may_be_nests_whose_first_levels_are_its_rows_on_cuda_emu():
    """A nest of ``b`` (from ``j * 3``) and ``t`` (64) whose points are a product's 192
    rows, row-major: one chain, its loops over a tile's rows as over whole ``b``'s (a
    tile of 128 rows two of them, the last one), on cuda-emu NumPy's values; a loop
    reading another row's product is no chain's."""
    from timerlc.runtime.cuda import EmuDevice

    assert render._row_levels(_nested().body[0], S * T2) == [
        ("b", kir.mul(Ref("j"), S), S),
        ("t", kir.i64(0), T2),
    ]
    r = render._Kernel(_nested())
    text = r.render()
    assert isinstance(r.phases[0], items.ChainCall)
    apart = render._Kernel(_nested(shift=1))
    apart.render()
    assert not any(isinstance(p, items.ChainCall) for p in apart.phases)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2 * S * T2, 4)).astype(np.float32)
    w = rng.standard_normal((4, 8)).astype(np.float32)
    dev = EmuDevice()
    module = dev.load(render.head() + "\n" + text)
    ptrs = [dev.alloc(a.nbytes) for a in (x, w)]
    ptrs += [dev.alloc(S * T2 * 4 * 4), dev.alloc(S * T2 * 8 * 4), dev.alloc(2 * S * T2 * 4)]
    for p, a in zip(ptrs, (x, w)):
        dev.upload(p, a)
    dev.upload(ptrs[4], np.zeros(2 * S * T2, np.float32))
    table = dev.alloc(8 * len(ptrs))
    dev.upload(table, np.array(ptrs, np.uint64))
    chain = dev.function(module, f"{r.k.name}_0c")
    dev.launch(chain, table, np.array([1], np.int64), dev.alloc(8), 2)  # (j = 1)
    z = np.empty(2 * S * T2, np.float32)
    dev.download(ptrs[4], z)
    h = np.tanh(x[S * T2 :].astype(np.float64))
    want = (h @ w)[:, 0]
    np.testing.assert_allclose(z[S * T2 :], want, rtol=1e-5, atol=1e-5)
    assert not z[: S * T2].any()  # (b of j = 0: not this call's)


@needs_cxx
def test_a_chain_of_nests_keeps_its_own_buffers_a_tile_at_a_time_on_cuda_emu():
    """The nests' chain with a gram after it (``gw = h^T @ y`` over the 192 rows: one copy,
    one chunk of three tiles, each a ``b``): ``h`` and ``y`` a tile at a time in the
    chunk's first tile's rows (``_chain_remap``: the nest's row ``(b - j * 3) * 64 + t``,
    its stride the row's 4 and 8 elements) make the same ``z`` and ``gw`` bits as whole."""
    from timerlc.runtime.cuda import EmuDevice

    k = _nested()
    gram = Gemm(
        "f32",
        True,
        False,
        4,
        8,
        S * T2,
        "h",
        kir.i64(0),
        4,
        "y",
        kir.i64(0),
        8,
        "gw",
        kir.i64(0),
        8,
    )
    slots = (*k.slots, Slot("gw", "f32", len(k.slots), len(k.slots), 0, True))
    k = dataclasses.replace(k, slots=slots, body=(*k.body, gram))
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2 * S * T2, 4)).astype(np.float32)
    w = rng.standard_normal((4, 8)).astype(np.float32)
    got = []
    for confined in (frozenset(), frozenset({"h", "y"})):
        r = render._Kernel(k, confined=confined)
        text = r.render()
        assert isinstance(r.phases[0], items.ChainCall)
        assert ("(in the first tile's rows: m_h, m_y; _chain_remap)" in text) == bool(confined)
        shapes = ((S * T2, 4), (S * T2, 8), (2 * S * T2,), (4, 8))
        run = _emulated(EmuDevice(), text, (x, w), shapes, max(r.scratch, 8))
        got.append(run(r.phases[0].functions[0][0]))
    (h0, y0, z0, gw0), (h, _, z, gw) = got
    np.testing.assert_allclose(gw0, h0.T.astype(np.float64) @ y0, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(z, z0)
    np.testing.assert_array_equal(gw, gw0)
    np.testing.assert_array_equal(h[:T2], h0[2 * T2 :])  # (the last tile's, in the first's)


def test_a_reduction_moves_ahead_of_the_loops_it_touches_nothing_of():
    """``render._reductions_ahead``: a sum (its accumulator's first value, the loop, the
    statement after it) moves ahead of the loop before it that it touches nothing of, so
    that loop and the loop after may be one; not ahead of a loop that writes what it
    reads."""
    r, e = Ref("r"), Ref("e")

    def rows(buf: str, value) -> For:
        return For("r", kir.i64(0), kir.i64(M), (Store(buf, r, value),), True)

    gather = rows("g", Load("x", r, "f32"))
    acc = kir.Let("acc", "f64", kir.Const("f64", 0.0))
    total = kir.Cast(Load("u", e, "f32"), "f64")
    red = For(
        "e",
        kir.i64(0),
        kir.i64(M),
        (kir.Let("acc", "f64", Bin("add", Ref("acc", "f64"), total, "f64")),),
        False,
        (("acc", "add"),),
    )
    mean = Store("m", kir.i64(0), kir.Cast(Ref("acc", "f64"), "f32"))
    after = rows("h", Bin("mul", Load("g", r, "f32"), Load("m", kir.i64(0), "f32"), "f32"))
    k = Kernel(
        "k",
        0,
        ("j",),
        _slots("x", "u", "g", "m", "h", written=2),
        (),
        (gather, acc, red, mean, after),
    )
    assert render._reductions_ahead(k.body, k) == (acc, red, mean, gather, after)
    reads = dataclasses.replace(
        red,
        body=(
            kir.Let(
                "acc",
                "f64",
                Bin("add", Ref("acc", "f64"), kir.Cast(Load("g", e, "f32"), "f64"), "f64"),
            ),
        ),
    )
    k2 = dataclasses.replace(k, body=(gather, acc, reads, mean, after))
    assert render._reductions_ahead(k2.body, k2) == k2.body


TF32_GRADIENTS = """
config I = 2, N = 600
dim i < I
s[0] = 1.0
s[i+1] = s[i] * 0.5 + sum(g[i]) * 0.0001
x[i] = sin(reshape(f32(arange(N * 16)) * 0.37, [N, 16])) * s[i]
dy[i] = cos(reshape(f32(arange(N * 16)) * 0.23, [N, 16])) * s[i]
dz[i] = sin(reshape(f32(arange(N * 16)) * 0.11, [N, 16])) + s[i]
g[i] = concat([reshape(x[i].T @ dy[i], [256]), sum(dy[i], 0),
               reshape(x[i].T @ dz[i], [256]), sum(dz[i], 0)], 0)
out g, s, x, dy, dz
"""


@needs_cxx
@pytest.mark.parametrize("precision", ["float32", "tensorfloat32"])
def test_grams_tf32_function_in_a_chain_on_cuda_emu(precision, monkeypatch):
    """Two grams of ours over the same 600 rows with TF32 functions (16 x 16, B's column
    sums in float64) as one chain: its TF32 function runs where TF32 products are asked
    for (each tile's rows ``CHAIN_STAGE`` at a time through the tensor cores' path,
    ``products.gram_part_tf32_lines(..., chain=True)``, added into the chunk's copy), its
    float32 one else, each run compiling only the one it runs. The gradients within float32's bound of the exact ones of the
    operands as the products round them (TF32, ties away from zero, or not at all), and
    with TF32 nearer those than the rounding moved them."""
    from test_cuda import cuda_gen, generated

    from timerlc.runtime import cuda
    from timerlc.runtime.cuda import DeviceRuntime, EmuDevice

    monkeypatch.setenv("TIMERLC_PRODUCTS", "ours")
    _, gen = generated("p.rtl", TF32_GRADIENTS)
    cu = cuda_gen(gen)
    rt = DeviceRuntime(cu.plan, text=cu.text, device=EmuDevice(precision))
    rt.run()
    (key,) = rt.chain_choices  # (the fused kernel's chain: the one that ran)
    (chain,) = [
        f
        for _, phases in cu.plan.kernels.fused_launches
        for f in phases
        if isinstance(f, items.ChainCall)
    ]
    assert chain.tf32 == ((chain.functions[0][0] + "t", 256),)
    assert key[1:] == (chain.tf32 if precision != "float32" else chain.functions)[0][:1]
    assert rt.chain_choices[key][2]  # (the chain ran)
    tf32 = precision == "tensorfloat32"
    # (each run compiles the one it runs: TL_NO_TF32, TL_TF32_ONLY)
    assert hasattr(rt._module.lib, chain.functions[0][0]) != tf32
    assert hasattr(rt._module.lib, chain.tf32[0][0]) == tf32
    rounded = (lambda a: cuda.tf32(a, away=True)) if tf32 else (lambda a: a)
    u = 2.0**-24
    for i in range(2):
        x, dy, dz = (rt.value(n)[i] for n in ("x", "dy", "dz"))
        g = rt.value("g")[i].astype(np.float64)
        for q, d in enumerate((dy, dz)):
            got = g[q * 272 : q * 272 + 256].reshape(16, 16)
            xr, dr = (rounded(a).astype(np.float64) for a in (x, d))
            want = xr.T @ dr
            assert (abs(got - want) <= 2 * 600 * u * (abs(xr).T @ abs(dr))).all()
            if tf32:  # (nearer the rounded operands' than the rounding moved it)
                moved = abs(want - x.astype(np.float64).T @ d).max()
                assert abs(got - want).max() < moved / 10
            sums = g[q * 272 + 256 : q * 272 + 272]
            np.testing.assert_allclose(sums, d.astype(np.float64).sum(0), rtol=1e-6, atol=1e-6)


@needs_cxx
@pytest.mark.parametrize("room", [True, False])
def test_a_chain_of_chains_or_its_chains_as_the_device_s_blocks_hold(room, monkeypatch):
    """PPO (small) with its chains run (``ours``): where the device's blocks hold a chain's
    dynamic shared memory (``dynamic_shared``), the chains of chains run; where they do
    not, the launches they stand for, among them their chains, which do; the values the
    cpu's either way."""
    import math

    from test_cuda import PROGRAMS, SMALL, cuda_gen, generated

    from timerlc.runtime.cpu import CpuRuntime
    from timerlc.runtime.cuda import DeviceRuntime, EmuDevice

    monkeypatch.setenv("TIMERLC_PRODUCTS", "ours")
    _, gen = generated(PROGRAMS / "ppo.rtl", **SMALL["ppo"])
    cu = cuda_gen(gen)
    chains = [
        f
        for _, phases in cu.plan.kernels.launches + cu.plan.kernels.fused_launches
        for f in phases
        if isinstance(f, items.ChainCall)
    ]
    outer = {("chain", f.functions[0][0]) for f in chains if f.shared}
    assert outer

    class Device(EmuDevice):
        def dynamic_shared(self, fn, nbytes):
            return room

    got, want = [], []
    rt = DeviceRuntime(cu.plan, lambda *m: got.append(m), text=cu.text, device=Device())
    rt.run()
    CpuRuntime(gen.plan, lambda *m: want.append(m), native=gen.text).run()
    ran = {key: c[2] for key, c in rt.chain_choices.items()}
    assert all(ran[key] == room for key in outer if key in ran)
    assert outer & ran.keys()
    inner = {key for key in ran if key not in outer}
    assert all(ran[key] for key in inner) and (room or inner)
    for (n, _, a), (_, _, b) in zip(got, want, strict=True):
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5), n


R2 = 1024  # (a gram over them: four copies, each a chunk of four tiles of a chain's)


def _layer_and_gradient() -> Kernel:
    """``u = x / 2``, ``h = tanh(u @ w + b)``, ``dz = h * d``, ``gw = h^T @ dz``, ``z[r] =
    u[r, 0] + dz[r, N-1]`` over ``R2`` rows: a chain of a loop, a rows product, its
    epilogue, a loop, a gram and a loop, ``u``, ``h`` and ``dz`` its own, the first step
    writing ``u`` and the last reading it (no barrier between a tile's last and the next's
    first but ``_chain_remap``'s)."""
    r, c = Ref("r"), Ref("c")
    zero = kir.i64(0)
    at, xa = kir.add(kir.mul(r, N), c), kir.add(kir.mul(r, K), c)
    half = Bin("mul", Load("x", xa, "f32"), kir.Const("f32", 0.5), "f32")
    pre = For("r", zero, kir.i64(R2), (For("c", zero, kir.i64(K), (Store("u", xa, half),)),), True)
    g1 = Gemm("f32", False, False, R2, N, K, "u", zero, K, "w", zero, N, "h", zero, N)
    act = Un("tanh", Bin("add", Load("h", at, "f32"), Load("b", c, "f32"), "f32"), "f32")
    epilogue = For("r", zero, kir.i64(R2), (For("c", zero, kir.i64(N), (Store("h", at, act),)),))
    epilogue = dataclasses.replace(epilogue, parallel=True)
    dz = Bin("mul", Load("h", at, "f32"), Load("d", at, "f32"), "f32")
    loop = For("r", zero, kir.i64(R2), (For("c", zero, kir.i64(N), (Store("dz", at, dz),)),), True)
    g2 = Gemm("f32", True, False, N, N, R2, "h", zero, N, "dz", zero, N, "gw", zero, N)
    first = Load("u", kir.mul(r, K), "f32")
    last = Load("dz", kir.add(kir.mul(r, N), kir.i64(N - 1)), "f32")
    tail = For("r", zero, kir.i64(R2), (Store("z", r, Bin("add", first, last, "f32")),), True)
    slots = _slots("x", "w", "b", "d", "u", "h", "dz", "gw", "z", written=4)
    return Kernel("grad", 0, ("j",), slots, (), (pre, g1, epilogue, loop, g2, tail))


@needs_cxx
def test_a_chain_keeps_its_own_buffers_a_tile_at_a_time_on_cuda_emu():
    """Buffers only a chain touches, written afresh at each call (``confined``: the plan's,
    ``codegen.generate._confined``), go a tile at a time into the chunk's first tile's rows
    (``_chain_remap``: each tile read only by its own later steps; the tile's threads meet
    before the next tile's first step writes them): on cuda-emu the gram makes NumPy's
    ``h^T @ (h * d)`` and the last loop its sums, the same bits as with whole buffers, and
    of ``u``, ``h`` and ``dz`` only each chunk's first tile's rows are written, with its
    last tile's values. A buffer the kernel touches outside the chain, or not
    ``confined``, stays whole."""
    from timerlc.runtime.cuda import EmuDevice

    k = _layer_and_gradient()
    whole = render._Kernel(k)
    text = whole.render()
    mine = render._Kernel(k, confined=frozenset({"u", "h", "dz", "x"}))
    remapped = mine.render()
    assert isinstance(mine.phases[0], items.ChainCall) and whole.phases == mine.phases
    assert "_chain_remap" not in text
    assert "__syncthreads();  // (in the first tile's rows: m_dz, m_h, m_u; _chain_remap)" in (
        remapped
    )
    assert "(float *)table[5] + 64LL * (tl_lo - tl_rb)" in remapped  # (h)
    assert "(float *)table[0] + 64LL" not in remapped  # (x: read only)
    chunk, tile = render._chunk(R2), render.CHAIN_GRAM_ROWS
    assert chunk == 4 * tile
    rng = np.random.default_rng(6)
    x = rng.standard_normal((R2, K)).astype(np.float32)
    w = (rng.standard_normal((K, N)) * 0.2).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    d = rng.standard_normal((R2, N)).astype(np.float32)
    shapes = ((R2, K), (R2, N), (R2, N), (N, N), (R2,))
    name = mine.phases[0].functions[0][0]
    assert whole.scratch == mine.scratch >= 4 * N * N * 4  # (the gram's four copies)
    u0, h0, dz0, gw0, z0 = _emulated(EmuDevice(), text, (x, w, b, d), shapes, whole.scratch)(name)
    u, h, dz, gw, z = _emulated(EmuDevice(), remapped, (x, w, b, d), shapes, mine.scratch)(name)
    want_h = np.tanh((x * np.float32(0.5)).astype(np.float64) @ w + b)
    np.testing.assert_allclose(h0, want_h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw0, h0.T.astype(np.float64) @ (h0 * d), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(z0, u0[:, 0] + dz0[:, N - 1])
    np.testing.assert_array_equal(gw, gw0)
    np.testing.assert_array_equal(z, z0)
    poison = np.full(4, EmuDevice.POISON, np.uint8).view(np.uint32)[0]
    for a, a0 in ((u, u0), (h, h0), (dz, dz0)):
        for p in range(0, R2, chunk):
            np.testing.assert_array_equal(a[p : p + tile], a0[p + chunk - tile : p + chunk])
            assert (a[p + tile : p + chunk].view(np.uint32) == poison).all()
    # (dz read after the chain, by a loop of one thread the last loop then joins: h alone)
    r = Ref("r")
    after = For("r", kir.i64(0), kir.i64(R2), (Store("e", r, Load("dz", kir.mul(r, N), "f32")),))
    slots = (*k.slots, Slot("e", "f32", len(k.slots), len(k.slots), 0, True))
    late = dataclasses.replace(k, slots=slots, body=(*k.body, after))
    outside = render._Kernel(late, confined=frozenset({"u", "h", "dz"}))
    got = outside.render()
    assert isinstance(outside.phases[0], items.ChainCall)
    assert "(in the first tile's rows: m_h; _chain_remap)" in got
