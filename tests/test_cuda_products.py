"""Our own kernels for skinny products (``timerlc/cuda/products.py``): each form computes
NumPy's product on the emulated device, at odd shapes, strides and offsets, with the
block's threads as the GPU has them and fewer; NVRTC compiles them; the plan carries them
as data; the runtime picks them or the BLAS as its policy says."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import cli, refuses_changed_plans, src
from test_cuda_runtime import REDUCTIONS, _gemm_json, _key, graph_of, same_outputs

from timerlc import runner
from timerlc.codegen import kir
from timerlc.codegen.generate import _with_launches, generate, listing
from timerlc.compiler import compile_plan, run_passes
from timerlc.cuda import nvrtc, products, render, shapes
from timerlc.cuda.emu import compiler
from timerlc.plan import items
from timerlc.runtime import cuda
from timerlc.runtime.cpu import CpuRuntime
from timerlc.runtime.cuda import DeviceRuntime, DeviceUnavailable, EmuDevice

ROOT = Path(__file__).resolve().parent.parent
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler")

# (m, n, k, ta, tb, lda pad, ldb pad, ldc pad): the rows form's, then the gram form's
SHAPES = [
    (100, 64, 64, False, False, 0, 0, 0),  # x @ W, 64 x 64 (blocks of 64 rows, the last short)
    (70, 64, 64, False, True, 3, 1, 2),  # dy @ W^T, rows apart more than their columns
    (37, 2, 4, False, False, 0, 0, 0),
    (16, 1, 3, False, True, 0, 0, 0),  # tiles of one column, rows of 3
    (53, 6, 5, False, False, 1, 0, 0),  # columns of 2-wide tiles, 5 terms
    (40, 8, 16, False, True, 0, 0, 0),  # W^T's rows 16 bytes apart: loads of 16 where aligned
    (64, 64, 700, True, False, 0, 0, 0),  # x^T @ dy over 700 rows (2 copies, a short stage)
    (4, 64, 1000, False, False, 5, 0, 0),  # the first layer's: x stored transposed
    (64, 2, 513, True, False, 0, 0, 3),  # 16 tiles: groups of the block's threads
    (3, 5, 16, True, True, 0, 2, 0),  # both read transposed, odd sides, one copy
    (64, 1, 300, True, False, 1, 0, 0),
    (8, 16, 1030, False, False, 2, 0, 0),  # A's rows along the sum's: a last load of 2
    (12, 8, 1030, False, True, 2, 2, 0),  # both: their memory past the last row not read
]


def _gemm(m, n, k, ta, tb, pa, pb, pc) -> kir.Gemm:
    lda = (m if ta else k) + pa
    ldb = (k if tb else n) + pb
    return kir.Gemm("f32", ta, tb, m, n, k, "a", 0, lda, "b", 0, ldb, "c", 0, n + pc)


OFFSETS = (3, 1, 2)  # (A, B and C from these elements of their memory: not 16 bytes aligned)


# TF32 functions' shapes (``products.tf32_form``): SHAPES's, and more grams (A not
# transposed; both transposed; one copy of 48 rows: a warp past C's rows) and rows (k of 8)
TF32_SHAPES = [x for x in SHAPES if products.tf32_form(*x[:5])] + [
    (16, 8, 1030, False, False, 2, 0, 0),
    (32, 16, 777, True, True, 0, 2, 0),
    (48, 24, 100, True, False, 0, 0, 0),
    (33, 24, 8, False, False, 1, 0, 3),
    (130, 16, 8, False, True, 0, 0, 0),
]


def _module(gemms, offsets=OFFSETS, tf32: bool = False) -> str:
    """A module of each gemm's functions of ours (``products.standalone``: its operands at
    the table's entries 0, 1, 2 from elements ``offsets``; a gram's copies at the scratch
    memory; ``tf32``: the TF32 functions), named ``t{i}``; a gram's with B's column sums too
    (``t{i}x``, at entry 3)."""
    parts = [render.head()]
    for i, s in enumerate(gemms):
        fns = products.standalone(s, f"t{i}", offsets, tf32=tf32)
        if products.form(s.dtype, s.m, s.n, s.k, s.ta, s.tb) == "gram":
            fns += products.standalone(s, f"t{i}x", offsets, sums=True, tf32=tf32)
        parts += [text for _, text in fns]
    return "\n".join(parts)


def _check_shapes(shapes, offsets=OFFSETS, tf32: bool = False, outputs=None) -> float:
    """Each shape's functions run on the emulated device against NumPy (float64), A, B and
    C from elements ``offsets`` of their memory (a gram's also with B's column sums,
    ``_gram_sums``): the largest difference relative to the product's largest value. With
    ``tf32``, the TF32 functions against NumPy's product of the operands rounded to TF32
    (``outputs``: a list that gets each C and sums made)."""
    gemms = [_gemm(*x) for x in shapes]
    device = EmuDevice()
    module = device.load(_module(gemms, offsets, tf32))
    oa, ob, oc = offsets
    rng = np.random.default_rng(7)
    worst = 0.0
    for i, (s, shape) in enumerate(zip(gemms, shapes)):
        m, n, k, ta, tb = shape[:5]
        a = rng.standard_normal(oa + (k if ta else m) * s.lda).astype(np.float32)
        b = rng.standard_normal(ob + (n if tb else k) * s.ldb).astype(np.float32)
        c = np.full(oc + m * s.ldc, np.nan, np.float32)

        def matrix(x, at, rows, cols, ld):
            return np.lib.stride_tricks.as_strided(x[at:], (rows, cols), (ld * 4, 4))

        am = matrix(a, oa, *((k, m) if ta else (m, k)), s.lda).astype(np.float64)
        bm = matrix(b, ob, *((n, k) if tb else (k, n)), s.ldb).astype(np.float64)
        round_ = (lambda x: cuda.tf32(x, away=True).astype(np.float64)) if tf32 else (lambda x: x)
        want = (round_(am).T if ta else round_(am)) @ (round_(bm).T if tb else round_(bm))
        sums = np.full(n, np.nan)
        ptrs = [device.alloc(x.nbytes) for x in (a, b, c, sums)]
        table = device.alloc(8 * 4)
        device.upload(table, np.array(ptrs, np.uint64))
        scratch = device.alloc(max(8, products.scratch_bytes(m, n, k, ta, tb, sums=True)))
        values = np.zeros(1, np.int64)
        kinds = [x[0] for x in products.launches(m, n, k, ta, tb)]
        for with_sums in [False] + [True] * (kinds != ["r"]):
            for p, x in zip(ptrs, (a, b, c, sums)):
                device.upload(p, x)
            for suffix in kinds:
                fn = device.function(module, f"t{i}{'x' if with_sums else ''}{suffix}")
                device.launch(fn, table, values, scratch, EmuDevice.MAX_BLOCKS)
            got_c = np.empty_like(c)
            device.download(ptrs[2], got_c)
            got = matrix(got_c, oc, m, n, s.ldc)
            assert not np.isnan(got).any(), shape
            pad = np.delete(got_c[oc:], [r * s.ldc + j for r in range(m) for j in range(n)])
            assert np.isnan(pad).all(), f"{shape}: wrote between C's rows"
            err = float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))
            assert err < 1e-5, (shape, err)
            worst = max(worst, err)
            if outputs is not None:
                outputs.append(got.copy())
            if with_sums:  # (float64 sums of the float32 B: NumPy's up to their order)
                got_sums = np.empty_like(sums)
                device.download(ptrs[3], got_sums)
                want_sums = (bm.T if tb else bm).sum(0)
                np.testing.assert_allclose(got_sums, want_sums, rtol=1e-12, atol=1e-12)
                if outputs is not None:
                    outputs.append(got_sums)
    return worst


def test_the_forms_of_our_products():
    assert [products.form("f32", *x[:5]) for x in SHAPES] == ["rows"] * 6 + ["gram"] * 7
    assert products.form("f64", 100, 64, 64, False, False) is None  # (float32 only)
    assert products.form("f32", 100, 65, 64, False, False) is None  # (a side past 64)
    assert products.form("f32", 100, 64, 64, True, False) is None  # (100 columns of A)
    assert products.form("f32", 8, 64, 8, False, False) is None  # (too few rows either way)
    # PPO's gradients over 65,536 rows: 256 copies, 8 lanes an element of a 64 x 64; a
    # 64 x 1's 32 lanes; 100 rows: one copy
    assert (products.parts(65536), products.lanes(64, 64, 65536)) == (256, 8)
    assert products.lanes(64, 1, 65536) == 32
    assert products.parts(100) == products.lanes(3, 5, 100) == 1
    assert products.scratch_bytes(64, 64, 65536, True, False) == 256 * 64 * 64 * 4
    assert (
        products.scratch_bytes(64, 64, 65536, True, False, sums=True)
        == 256 * 64 * 65 * 4 + 256 * 64 * 4
    )


@needs_cxx
def test_our_products_compute_numpy_s_on_the_emulated_device():
    """Every form at the shapes of ``SHAPES`` (strided, offset operands; three blocks of
    the emulation's threads, each striding over the grid; nothing written between C's
    rows)."""
    assert _check_shapes(SHAPES) < 1e-5
    assert _check_shapes(SHAPES, (0, 0, 0)) < 1e-5


@needs_cxx
@pytest.mark.parametrize("threads", [24, 128])
def test_our_products_with_the_block_s_threads_as_the_gpu_s(threads):
    """The same with blocks of 128 threads (as the GPU's: a gram's tiles then take every
    G-th row, the groups added in order; its copies added by lanes; each thread's loads 8
    at a time, 16 bytes each where the operands are aligned, ``products._copy``) and of 24
    (3 groups of a 4 x 64's 8 tiles; lanes that do not divide the block: one a thread)."""
    code = "print(max(t._check_shapes(t.SHAPES), t._check_shapes(t.SHAPES, (0, 0, 0))))"
    assert float(_with_threads(threads, code).split()[-1]) < 1e-5


def _with_threads(threads: int, code: str) -> str:
    """The output of Python ``code`` run in a process of its own (this module as ``t``)
    whose emulated blocks have ``threads`` threads (``TIMERLC_EMU_THREADS`` is read once a
    process)."""
    env = dict(os.environ, TIMERLC_EMU_THREADS=str(threads), PYTHONPATH=str(ROOT))
    head = "import sys; sys.path.insert(0, 'tests'); import test_cuda_products as t; "
    r = subprocess.run(
        [sys.executable, "-c", head + code],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout


def test_the_tf32_forms_of_our_products():
    """TF32 functions (the tensor cores' mma.sync, 16 x 8 x 8) for a rows product whose k
    and n are multiples of 8 and a gram whose m is of 16 and n of 8: PPO's 64 x 64 layers
    and their gradients, not its heads nor its first layer's gradient."""
    assert products.tf32_form(65536, 64, 64, False, False)
    assert products.tf32_form(64, 64, 65536, True, False)
    assert not products.tf32_form(65536, 2, 64, False, False)  # (a head)
    assert not products.tf32_form(4, 64, 65536, True, False)  # (4 rows of C)
    assert not products.tf32_form(100, 64, 20, False, False)  # (k of 20)
    ties = np.array([1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11)], np.float32)
    assert cuda.tf32(ties, away=True).tolist() == [
        1 + 2**-10,
        1 + 2**-9,
        -(1 + 2**-10),
    ]  # (ties away from zero)
    assert cuda.tf32(ties).tolist() == [1.0, 1 + 2**-9, -1.0]  # (the emulated BLAS's: to even)


def _same_bits_at_128_and_4(tmp_path, worst: str) -> list:
    """The Python expression ``worst`` (this module as ``t``; it appends every output to
    ``out`` and is the largest error) in a process of its own with 128 threads a block and
    in another with 4 (``TIMERLC_EMU_THREADS`` is read once a process): each largest error
    under 1e-5, the outputs of both (through .npz files) the same bits; the outputs."""
    got = []
    for threads in (128, 4):
        path = tmp_path / f"{threads}.npz"
        code = f"out = []; w = {worst}; t.np.savez({str(path)!r}, t.np.array(w), *out)"
        _with_threads(threads, code)
        with np.load(path) as arrays:
            got.append([arrays[f"arr_{i}"] for i in range(len(arrays.files))])
        assert float(got[-1][0]) < 1e-5
    mma, loops = got[0][1:], got[1][1:]
    assert len(mma) == len(loops) > 0
    for x, y in zip(mma, loops):
        np.testing.assert_array_equal(x, y)
    return mma


@needs_cxx
def test_our_tf32_products_compute_numpy_s_on_the_emulated_device(tmp_path):
    """The TF32 functions at ``TF32_SHAPES`` (strided, offset operands) against NumPy's
    product of the operands rounded to TF32: with 128 threads a block, the tensor cores'
    path (each warp's ``mma.sync``, emu.h's by the PTX fragments' layout), and with 4 (each
    element summed by one thread): the same bits, their sums in the same order."""
    _same_bits_at_128_and_4(
        tmp_path,
        "max(t._check_shapes(t.TF32_SHAPES, tf32=True, outputs=out), "
        "t._check_shapes(t.TF32_SHAPES, (0, 0, 0), tf32=True, outputs=out))",
    )


# joint functions' shapes (``products.joint_form``): (rows N, B's columns k, the rows
# product's n, the gram's m, W stored transposed, A stored N x m, pads of B's, W's, A's,
# the rows' C's and the gram's C's rows)
JOINT_SHAPES = [
    (520, 64, 64, 64, True, True, 0, 0, 0, 0, 0),  # PPO's dz @ W^T, h^T @ dz: 2 copies, short
    (100, 16, 32, 16, False, True, 3, 1, 2, 1, 3),  # one copy: the gram's C itself
    (1030, 24, 16, 48, True, False, 1, 2, 5, 0, 2),  # A stored m x N; 3 warps of C's rows
]
# (A's, B's, W's, the rows' C's and the gram's C's first elements: not 16 bytes aligned;
# zeros: aligned where the rows are, each stage's loads of 16 bytes issued a stage ahead)
JOINT_OFFSETS = ((3, 1, 2, 5, 4), (0, 0, 0, 0, 0))
JOINT_EPILOGUE = "tl_v * 0.5f + (float)tl_col"


def _joint_gemms(shape) -> tuple:
    """The rows product and the gram of a ``JOINT_SHAPES`` shape (their B the same)."""
    big, k, n, m, tw, ta, pb, pw, pa, pc, pg = shape
    rows = kir.Gemm(
        "f32", False, tw, big, n, k, "b", 0, k + pb, "w", 0, (k if tw else n) + pw, "c", 0, n + pc
    )
    lda = (m if ta else big) + pa
    gram = kir.Gemm("f32", ta, False, m, k, big, "a", 0, lda, "b", 0, k + pb, "g", 0, k + pg)
    return rows, gram


def _check_joints(outputs: list) -> float:
    """Each ``JOINT_SHAPES`` shape's joint function (with and without B's column sums and
    an epilogue) on the emulated device against NumPy's products of the operands rounded
    to TF32 (float64) and against the rows product's and the gram's own TF32 functions
    (``outputs`` gets each C and sums of both): the largest difference relative to a
    product's largest value; the operands from each of ``JOINT_OFFSETS``' elements."""
    device = EmuDevice()
    texts = [render.head()]
    cases = [
        (f"{i}{v}{int(sums)}", shape, offsets, sums)
        for i, shape in enumerate(JOINT_SHAPES)
        for v, offsets in enumerate(JOINT_OFFSETS)
        for sums in (False, True)
    ]
    for tag, shape, offsets, sums in cases:
        r, g = _joint_gemms(shape)
        assert products.joint_form(r, g), shape
        epi = JOINT_EPILOGUE if sums else None
        fns = products.joint_standalone(r, g, f"j{tag}", offsets, sums, epi)
        fns += products.standalone(r, f"r{tag}", offsets[1:4], epilogue=epi, tf32=True)
        fns += products.standalone(g, f"g{tag}", (0, 0, 0), sums=sums, tf32=True)
        texts += [text for _, text in fns]
    module = device.load("\n".join(texts))
    rng = np.random.default_rng(11)
    worst = 0.0
    values = np.zeros(1, np.int64)

    def run(name: str, arrays: list, scratch_bytes: int):
        ptrs = [device.alloc(x.nbytes) for x in arrays]
        for p, x in zip(ptrs, arrays):
            device.upload(p, x)
        table = device.alloc(8 * len(ptrs))
        device.upload(table, np.array(ptrs, np.uint64))
        scratch = device.alloc(max(8, scratch_bytes))
        for suffix in name.split(","):
            device.launch(device.function(module, suffix), table, values, scratch, 3)
        for p, x in zip(ptrs, arrays):
            device.download(p, x)

    def matrix(x, at, rows, cols, ld):
        return np.lib.stride_tricks.as_strided(x[at:], (rows, cols), (ld * 4, 4))

    for tag, shape, offsets, sums in cases:
        r, g = _joint_gemms(shape)
        big, k, n, m, tw, ta = shape[:6]
        oa, ob, ow, oc, og = offsets
        a = rng.standard_normal(oa + (big if ta else m) * g.lda).astype(np.float32)
        b = rng.standard_normal(ob + big * r.lda).astype(np.float32)
        w = rng.standard_normal(ow + (n if tw else k) * r.ldb).astype(np.float32)
        t = lambda x: cuda.tf32(x, away=True).astype(np.float64)
        am, bm = (
            t(matrix(a, oa, *((big, m) if ta else (m, big)), g.lda)),
            t(matrix(b, ob, big, k, r.lda)),
        )
        wm = t(matrix(w, ow, *((n, k) if tw else (k, n)), r.ldb))
        want_r, want_g = bm @ (wm.T if tw else wm), (am.T if ta else am) @ bm
        scratch = products.scratch_bytes(m, k, big, ta, False, sums=True)
        want = want_r * 0.5 + np.arange(n) if sums else want_r
        c = np.full(oc + big * r.ldc, np.nan, np.float32)
        gc = np.full(og + m * g.ldc, np.nan, np.float32)
        s = np.full(k, np.nan)
        joint = [a, b, w, c, gc] + [s] * sums
        run(f"j{tag}j" + (f",j{tag}s" if products.parts(big) > 1 else ""), joint, scratch)
        rows_c = np.full_like(c, np.nan)
        run(f"r{tag}r", [b, w, rows_c], 0)
        gram = [a[oa:].copy(), b[ob:].copy(), np.full(m * g.ldc, np.nan, np.float32)]
        gram += [np.full(k, np.nan)] * sums
        kinds = products.launches(m, k, big, ta, False)
        run(",".join(f"g{tag}{x[0]}" for x in kinds), gram, scratch)
        for got, own, ld, at, rows, cols, exp in (
            (c, rows_c, r.ldc, oc, big, n, want),
            (gc, np.concatenate([np.zeros(og, np.float32), gram[2]]), g.ldc, og, m, k, want_g),
        ):
            mat = matrix(got, at, rows, cols, ld)
            np.testing.assert_array_equal(mat, matrix(own, at, rows, cols, ld), str(shape))
            assert np.isnan(
                np.delete(got[at:], [q * ld + j for q in range(rows) for j in range(cols)])
            ).all()
            err = float(np.max(np.abs(mat - exp)) / max(1.0, float(np.max(np.abs(exp)))))
            assert err < 1e-5, (shape, sums, err)
            worst = max(worst, err)
            outputs.append(mat.copy())
        if sums:
            np.testing.assert_array_equal(s, gram[3])
            np.testing.assert_allclose(
                s,
                matrix(b, ob, big, k, r.lda).astype(np.float64).sum(0),  # (B's own)
                rtol=1e-12,
                atol=1e-12,
            )
            outputs.append(s.copy())
    return worst


@needs_cxx
def test_a_joint_function_makes_a_rows_product_and_its_gram_in_one_pass(tmp_path):
    """``products.joint_tf32_lines`` (a layer's ``dz @ W^T`` with its epilogue and the
    weight's gradient ``h^T @ dz`` with dz's column sums, one pass over the rows): at
    ``JOINT_SHAPES`` (strided, offset operands; a gram of one copy, of several; warps past
    the gram's rows) the same bits as the two products' own TF32 functions and NumPy's
    products of the rounded operands within 1e-5, nothing written between C's rows; with
    128 threads a block (the tensor cores' path) and with 4 (each element summed by one
    thread), the same bits."""
    mma = _same_bits_at_128_and_4(tmp_path, "t._check_joints(out)")
    # (each shape, offsets and sums: both C's, and the sums where asked)
    assert len(mma) == len(JOINT_SHAPES) * len(JOINT_OFFSETS) * 5
    # (not for a gram whose B is stored transposed, nor a rows product of n not of 16)
    r, g = _joint_gemms(JOINT_SHAPES[0])
    assert not products.joint_form(r, dataclasses.replace(g, tb=True))
    r24, g24 = _joint_gemms((100, 16, 24, 16, False, True, 0, 0, 0, 0, 0))
    assert not products.joint_form(r24, g24)


def test_nvrtc_compiles_our_products_for_the_h100():
    lib = nvrtc.library()
    if lib is None:
        if os.environ.get("TIMERLC_REQUIRE_NVCC") == "1":
            pytest.fail("no libnvrtc (the test extra's nvidia-cuda-nvrtc)")
        pytest.skip("no libnvrtc")
    ptx, log = nvrtc.compile_ptx(_module([_gemm(*x) for x in SHAPES]), "compute_90", lib)
    assert "ld.v4.f32" in ptx  # (the loads of 16 bytes)
    assert log.strip() == "", log[-3000:]
    launches = [products.launches(*x[:5]) for x in SHAPES]
    assert ptx.count(".entry") == sum(len(x) * (1 if x == ("rows",) else 2) for x in launches)
    # (the TF32 functions: the tensor cores' mma.sync, the operands rounded by cvt.rna)
    tf32 = _module([_gemm(*x) for x in TF32_SHAPES], tf32=True)
    ptx, log = nvrtc.compile_ptx(tf32, "compute_90", lib)
    assert log.strip() == "", log[-3000:]
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx
    assert "cvt.rna.tf32.f32" in ptx


def _emu_and_cpu(gen, text: str) -> tuple:
    """``gen`` (the cuda build of program ``text``) run on the emulated device, and the
    program run by the cpu backend: ``(device runtime, cpu runtime, the plan)``."""
    rt = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice())
    rt.run()
    plan = compile_plan(run_passes(graph_of(text)))
    cg = generate(plan, "cpu")
    ref = CpuRuntime(cg.plan, native=cg.text)
    ref.run()
    return rt, ref, plan


def _plan_with_products():
    gen = generate(compile_plan(run_passes(graph_of(REDUCTIONS))), "cuda")
    calls = [
        f
        for _, phases in gen.plan.kernels.launches
        for f in phases
        if isinstance(f, items.GemmCall) and f.own
    ]
    return gen, calls


def test_a_plan_s_product_carries_our_functions_as_data():
    """The renderer gives a product of a form ours its functions (``own``), which the
    module defines; the plan's JSON keeps them, and a bad entry is a clear error."""
    gen, calls = _plan_with_products()
    assert calls, "no product of REDUCTIONS has functions of ours"
    for call in calls:
        for fname, threads in call.own:
            assert f"void {fname}(void **table" in gen.text
            assert threads >= 1
    call = calls[0]
    names = " then ".join(f for f, _ in call.own)
    assert f"or ours ({names})" in _with_launches("k", (call,))  # (--dump-ir's listing)
    data = items.to_json(gen.plan)
    assert items.from_json(json.loads(json.dumps(data)), "p") == gen.plan
    cases = [
        (lambda g: g.__setitem__("own", "f1"), "expected 1 to"),
        (lambda g: g.__setitem__("own", [["f1"]]), "expected \\[function, threads\\]"),
        (lambda g: g.__setitem__("own", [["f1", 0]]), "out of range"),
        (lambda g: g.__setitem__("own", [["f 1", 4]]), "f 1"),
        (lambda g: g.__setitem__("then", [["f1", -1]]), "out of range"),
        (lambda g: (g.pop("own"), g.__setitem__("then", [["f1", 4]])), "none of ours"),
        (lambda g: (g.pop("own"), g.__setitem__("tf32", [["f1", 4]])), "none of ours"),
        (lambda g: g.__setitem__("tf32", [["f1", 4]] * 3), "3 TF32 functions for"),
        (lambda g: g.__setitem__("tf32", [["f(1)", 4]]), "f\\(1\\)"),
    ]
    refuses_changed_plans(data, cases, _gemm_json)


def test_the_products_policy_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("TIMERLC_PRODUCTS", raising=False)
    assert cuda.products_policy("fastest") == "fastest"
    monkeypatch.setenv("TIMERLC_PRODUCTS", "blas")
    assert cuda.products_policy("fastest") == "blas"
    monkeypatch.setenv("TIMERLC_PRODUCTS", "quickest")
    with pytest.raises(DeviceUnavailable, match="'quickest' is not one of fastest, ours, blas"):
        cuda.products_policy("fastest")


@needs_cxx
def test_a_bad_products_policy_is_one_line_and_exit_2(monkeypatch, tmp_path):
    monkeypatch.setenv("TIMERLC_PRODUCTS", "bogus")
    (tmp_path / "p.rtl").write_text(src(REDUCTIONS))
    r = cli("run", tmp_path / "p.rtl", "--backend", "cuda-emu", "--no-progress")
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        "timerlc: error: the cuda-emu backend cannot run here: TIMERLC_PRODUCTS='bogus' is "
        "not one of fastest, ours, blas"
    )


@needs_cxx
@pytest.mark.parametrize("policy", ["ours", "blas", "fastest"])
def test_a_run_s_products_are_ours_or_the_blas_s_as_the_policy_says(policy, monkeypatch):
    """The same values either way; ``ours`` launches our functions for every product of a
    form ours, ``blas`` none, ``fastest`` times both at each shape's first call and keeps
    the faster (its times recorded)."""
    monkeypatch.setenv("TIMERLC_PRODUCTS", policy)
    gen, calls = _plan_with_products()
    rt, ref, plan = _emu_and_cpu(gen, REDUCTIONS)
    same_outputs(rt, ref, [o for o, _, _ in plan.outputs])
    choices = rt.product_choices
    assert choices and len(choices) == len({_key(c) for c in calls})
    if policy == "fastest":
        assert all(b is not None and o is not None for b, o, _ in choices.values())
        assert all(ours == (o < b) for b, o, ours in choices.values())
    else:
        assert all(b is None and ours == (policy == "ours") for b, _, ours in choices.values())
    if policy == "blas":
        assert rt.blas_calls > 0


def _column_sum_nest(rows, stride_of, k=64, n=2):
    """A reduction ``t[e] += f64(b[index])`` over the row loops ``rows`` ((var, extent),
    outer first) and e < n, ``index`` = sum of each row var times ``stride_of[var]``, + e;
    and the gram ``a^T @ b`` (64 x n over k rows) it may ride on."""
    e = kir.Ref("e")
    index = e
    for var, _ in rows:
        index = kir.add(kir.mul(kir.Ref(var), stride_of[var]), index)
    term = kir.Cast(kir.Load("b", index, "f32"), "f64")
    store = kir.Store("t", e, kir.Bin("add", kir.Load("t", e, "f64"), term, "f64"))
    body = kir.For("e", kir.i64(0), kir.i64(n), (store,), True)
    for j, (var, extent) in enumerate(reversed(rows)):
        last = j == len(rows) - 1
        body = kir.For(
            var, kir.i64(0), kir.i64(extent), (body,), reduce=(("t", "add"),) if last else ()
        )
    zero = kir.i64(0)
    return body, kir.Gemm("f32", True, False, 64, n, k, "a", zero, 64, "b", zero, n, "c", zero, n)


def test_a_bias_gradient_rides_on_its_gram_where_its_rows_are_the_gram_s():
    """``shapes._column_sum``: the column sums of a gram's B over its rows, one loop of them
    or a nest (REINFORCE's environments and steps: r = b * 16 + t), in B's row-major
    order; not over other rows, strides or a B of another shape."""
    red, gemm = _column_sum_nest([("r", 64)], {"r": 2})
    assert shapes._column_sum(red, gemm) == "t"
    red, gemm = _column_sum_nest([("b", 4), ("t", 16)], {"b": 32, "t": 2})
    assert shapes._column_sum(red, gemm) == "t"
    red, gemm = _column_sum_nest([("b", 4), ("t", 16)], {"b": 2, "t": 8})  # (t's outer)
    assert shapes._column_sum(red, gemm) is None
    red, gemm = _column_sum_nest([("b", 4), ("t", 16)], {"b": 32, "t": 2}, k=128)
    assert shapes._column_sum(red, gemm) is None
    red, gemm = _column_sum_nest([("r", 64)], {"r": 3})  # (rows 3 apart: not B's)
    assert shapes._column_sum(red, gemm) is None


def _epilogue_nest(rows, n=16, value=None, index=None, c="c"):
    """A nest over C's rows ``rows`` ((var, extent), outer first) and n columns storing
    ``value`` (default: ``tanh(C + bias[col])``) at ``index`` (default C's element); and
    the rows product ``a @ w`` (8 wide) whose C it may follow."""
    e = kir.Ref("e")
    row = None
    for var, extent in rows:
        row = kir.Ref(var) if row is None else kir.add(kir.mul(row, extent), kir.Ref(var))
    at = kir.add(kir.mul(row, n), e)
    here = kir.Load(c, at, "f32")
    if value is None:
        value = kir.Un("tanh", kir.Bin("add", here, kir.Load("bias", e, "f32"), "f32"), "f32")
    body = kir.For(
        "e", kir.i64(0), kir.i64(n), (kir.Store(c, at if index is None else index, value),)
    )
    for var, extent in reversed(rows):
        body = kir.For(var, kir.i64(0), kir.i64(extent), (body,), True)
    m = 1
    for _, extent in rows:
        m *= extent
    zero = kir.i64(0)
    gemm = kir.Gemm("f32", False, False, m, n, 8, "a", zero, 8, "w", zero, n, "c", zero, n)
    return body, gemm, here


def test_the_elementwise_epilogues_a_rows_product_makes_as_it_stores_c():
    """``shapes._epilogue``: a loop (or a nest of loops over the rows in order) around one
    over C's columns, storing C's element from C's element (read at that element alone),
    other buffers and the loop values; not one that reads C elsewhere, stores elsewhere,
    reads a local, or spans other rows."""
    nest, gemm, here = _epilogue_nest([("r", 64)])
    assert shapes._epilogue(nest, gemm, ()) == ([("r", 64)], "e")
    nest, gemm, _ = _epilogue_nest([("b", 4), ("t", 16)])  # (REINFORCE's [b, t])
    assert shapes._epilogue(nest, gemm, ("j",)) == ([("b", 4), ("t", 16)], "e")
    nest, gemm, _ = _epilogue_nest([("t", 16), ("b", 4)])
    bad = gemm.__class__(**{**{f: getattr(gemm, f) for f in gemm.__slots__}, "m": 128})
    assert shapes._epilogue(nest, bad, ()) is None  # (not C's rows)
    moved = kir.Load("c", kir.add(here.index, kir.i64(1)), "f32")  # (C's next element)
    nest, gemm, _ = _epilogue_nest([("r", 64)], value=kir.Bin("add", here, moved, "f32"))
    assert shapes._epilogue(nest, gemm, ()) is None
    nest, gemm, _ = _epilogue_nest([("r", 64)], index=kir.mul(kir.Ref("e"), 64))
    assert shapes._epilogue(nest, gemm, ()) is None  # (stores another element)
    local = kir.Bin("add", here, kir.Ref("x", "f32"), "f32")
    nest, gemm, _ = _epilogue_nest([("r", 64)], value=local)
    assert shapes._epilogue(nest, gemm, ()) is None
    assert shapes._epilogue(nest, gemm, ("x",)) is not None  # (a loop value of the call)
    # merged with another loop over the rows (``_row_merged``), even in one column loop:
    # the epilogue's store apart, the rest as it was; not where the rest reads C
    nest, gemm, here = _epilogue_nest([("r", 64)])
    (col,) = nest.body
    other = kir.Store("g", col.body[0].index, kir.Load("h", col.body[0].index, "f32"))
    merged = kir.For(
        "r", nest.lo, nest.hi, (kir.For("e", col.lo, col.hi, (other, *col.body)),), True
    )
    mine, rest = shapes._epilogue_apart(merged, gemm, ())
    assert mine == nest and rest.body[0].body == (other,)
    reads_c = kir.Store("g", col.body[0].index, here)
    merged = kir.For(
        "r", nest.lo, nest.hi, (kir.For("e", col.lo, col.hi, (reads_c, *col.body)),), True
    )
    assert shapes._epilogue_apart(merged, gemm, ()) == (None, None)
    writes_bias = kir.Store("bias", kir.Ref("e"), kir.Load("h", col.body[0].index, "f32"))
    merged = kir.For(
        "r", nest.lo, nest.hi, (kir.For("e", col.lo, col.hi, (writes_bias, *col.body)),), True
    )
    assert shapes._epilogue_apart(merged, gemm, ()) == (None, None)


EPILOGUES = """
config I = 3, N = 40
dim i < I
s[0] = 1.0
s[i+1] = s[i] * 0.5 + sum(h[i]) * 0.001 + sum(d[i]) * 0.001
x[i] = reshape(f32(arange(N * 8)) * 0.01 - 1.0, [N, 8]) * s[i]
w = reshape(f32(arange(8 * 16)) * 0.01 - 0.6, [8, 16])
v = reshape(f32(arange(16 * 16)) * 0.002 - 0.2, [16, 16])
h[i] = tanh(x[i] @ w + f32(arange(16)) * 0.1)
d[i] = (h[i] @ v.T) * (1.0 - h[i] * h[i])
out h, d, s
"""


@needs_cxx
@pytest.mark.parametrize("policy", ["ours", "blas", "fastest"])
def test_a_layer_s_bias_and_tanh_are_made_by_its_rows_product(policy, monkeypatch):
    """A layer's ``tanh(x @ W + b)`` and a gradient's ``(dz @ W) * (1 - h^2)``: the
    elementwise loop after each rows product has a function of ours that makes the product
    and the loop as it stores C (``render._Kernel._rows_epilogues``), and a function of
    its own that runs after the BLAS's product (``GemmCall.then``); the runtime chooses as
    its policy says, timing the BLAS's with the loop after it; the values are the cpu's
    either way. (Not chains: ``render.CHAINS`` off, test_cuda_chains.py.)"""
    monkeypatch.setenv("TIMERLC_PRODUCTS", policy)
    monkeypatch.setattr(render, "CHAINS", False)
    gen = generate(compile_plan(run_passes(graph_of(EPILOGUES))), "cuda")
    assert gen.text.count("const float tl_v = tl_c[i][j];") == 2
    calls = [
        f
        for _, phases in gen.plan.kernels.launches
        for f in phases
        if isinstance(f, items.GemmCall)
    ]
    assert len(calls) == 2 and all(len(c.own) == 1 and len(c.then) == 1 for c in calls)
    data = items.to_json(gen.plan)
    assert items.from_json(json.loads(json.dumps(data)), "p") == gen.plan
    rt, ref, _ = _emu_and_cpu(gen, EPILOGUES)
    same_outputs(rt, ref, ["h", "d", "s"], rtol=2e-6)
    choices = rt.product_choices
    assert set(choices) == {_key(c) for c in calls}
    assert all(len(key) == 10 for key in choices)  # (ours with an epilogue: a choice apart)
    if policy == "fastest":
        assert all(b is not None for b, _, _ in choices.values())
    else:
        assert all(ours == (policy == "ours") for _, _, ours in choices.values())
    assert (rt.blas_calls > 0) == (policy != "ours")  # (fastest: its timing's calls)


def test_how_far_one_product_is_from_another():
    """``cuda.disagreement``: the largest difference relative to the BLAS's largest
    magnitude; NaNs where the BLAS's has them agree, elsewhere they are infinitely far."""
    want = np.array([1.0, -4.0, 2.0], np.float32)
    assert cuda.disagreement(want.copy(), want) == 0.0
    assert cuda.disagreement(want + np.float32(0.02), want) == pytest.approx(0.005)
    nan = np.array([1.0, np.nan, 2.0], np.float32)
    assert cuda.disagreement(nan.copy(), nan) == 0.0
    assert cuda.disagreement(want, nan) == np.inf and cuda.disagreement(nan, want) == np.inf
    zeros = np.zeros(3, np.float32)
    assert cuda.disagreement(zeros, zeros) == 0.0 and cuda.disagreement(want, zeros) == np.inf


@needs_cxx
def test_a_product_of_ours_that_computes_another_c_is_not_chosen(monkeypatch):
    """Where the policy times ours against the BLAS's (``fastest``) and ours is faster, ours
    runs only where its C is the BLAS's (``DeviceRuntime._product_choice``): a rows function
    made wrong (its C doubled) loses to the BLAS's, its distance recorded and printed; the
    grams, right, are ours; the run's values are the cpu's."""
    monkeypatch.setenv("TIMERLC_PRODUCTS", "fastest")
    rows_lines = products.rows_lines

    def doubled(*args, **kwargs):
        lines = rows_lines(*args, **kwargs)
        return [x.replace("] = tl_c[i][j];", "] = 2.0f * tl_c[i][j];") for x in lines]

    monkeypatch.setattr(products, "rows_lines", doubled)
    # (ours timed faster: a span with a BLAS product in it takes 1 s, one without 0.5 s)
    gemms = [0]
    gemm = EmuDevice.gemm

    def counted(self, *args):
        gemms[0] += 1
        return gemm(self, *args)

    monkeypatch.setattr(EmuDevice, "gemm", counted)
    monkeypatch.setattr(EmuDevice, "mark", lambda self: gemms[0])
    monkeypatch.setattr(EmuDevice, "elapsed", lambda self, a, b: 1.0 if b > a else 0.5)
    gen, calls = _plan_with_products()
    assert "2.0f * tl_c[i][j]" in gen.text
    rt, ref, plan = _emu_and_cpu(gen, REDUCTIONS)
    same_outputs(rt, ref, [o for o, _, _ in plan.outputs])
    rows = {
        _key(c) for c in calls if products.form(c.dtype, c.m, c.n, c.k, c.a.t, c.b.t) == "rows"
    }
    assert rows and set(rt.product_disagreements) == rows
    assert all(far == pytest.approx(1.0) for far in rt.product_disagreements.values())
    assert all(ours == (key not in rows) for key, (_, _, ours) in rt.product_choices.items())
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    runner._print_products(rt)
    assert "-> the BLAS (ours faster, but its C 1.0e+00 from the BLAS's)" in err.getvalue()


@needs_cxx
def test_where_tf32_is_asked_for_ours_run_their_tf32_functions(monkeypatch):
    """A product with TF32 functions carries them (``GemmCall.tf32``, read as data like
    ``own``); where the device computes float32 products in TF32 and ours run, those run
    (with their epilogues), and the values are the cpu's within TF32's rounding. (Not
    chains, whose products are float32's: ``render.CHAINS`` off.)"""
    monkeypatch.setenv("TIMERLC_PRODUCTS", "ours")
    monkeypatch.setattr(render, "CHAINS", False)
    gen = generate(compile_plan(run_passes(graph_of(EPILOGUES))), "cuda")
    calls = [
        f
        for _, phases in gen.plan.kernels.launches
        for f in phases
        if isinstance(f, items.GemmCall)
    ]
    assert len(calls) == 2 and all(len(c.tf32) == 1 for c in calls)
    assert all(c.tf32[0][0] == c.own[0][0] + "t" for c in calls)
    data = items.to_json(gen.plan)
    assert items.from_json(json.loads(json.dumps(data)), "p") == gen.plan
    loaded = []
    function = EmuDevice.function
    monkeypatch.setattr(
        EmuDevice, "function", lambda self, m, name: loaded.append(name) or function(self, m, name)
    )
    rt = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice("tensorfloat32"))
    rt.run()
    assert {c.tf32[0][0] for c in calls} <= set(loaded)
    assert not {c.own[0][0] for c in calls} & set(loaded)
    plan = compile_plan(run_passes(graph_of(EPILOGUES)))
    cg = generate(plan, "cpu")
    ref = CpuRuntime(cg.plan, native=cg.text)
    ref.run()
    same_outputs(rt, ref, ["h", "d", "s"], rtol=1e-2, atol=1e-3)


JOINT = """
config I = 3, N = 80
dim i < I
s[0] = 1.0
s[i+1] = s[i] * 0.5 + sum(g[i]) * 0.0001 + sum(d[i]) * 0.001
h[i] = tanh(reshape(f32(arange(N * 16)) * 0.001 - 0.5, [N, 16]) * s[i])
z[i] = reshape(f32(arange(N * 16)) * 0.002 - 1.0, [N, 16]) * s[i]
v = reshape(f32(arange(16 * 16)) * 0.002 - 0.2, [16, 16])
d[i] = (z[i] @ v.T) * (1.0 - h[i] * h[i])
g[i] = h[i].T @ z[i]
out d, g, s
"""


def _joint_json(data) -> list:
    """The launches of ``data``'s (a plan's JSON) first fused kernel with a joint product."""
    return next(
        ph
        for _, ph in data["kernels"]["fused_launches"]
        if any(isinstance(f, dict) and "joint" in f["gemm"] for f in ph)
    )


@needs_cxx
@pytest.mark.parametrize("wrong", [False, True])
def test_a_layer_s_gradient_and_its_weight_s_run_in_one_pass_where_tf32_is_asked_for(
    wrong, monkeypatch
):
    """A rows product ``dz @ W^T`` (with its epilogue) and the gram ``h^T @ dz`` in one
    kernel carry a joint function (``GemmCall.joint`` on the first, read as data); where
    TF32 is asked for, the runtime times the two as each is chosen against the joint and
    keeps the faster, only where each C agrees with the other way's (a joint made wrong,
    its rows' C doubled, runs apart, its distance recorded and printed); the values are the
    cpu's within TF32's rounding either way. Without TF32 the joint does not run."""
    monkeypatch.setenv("TIMERLC_PRODUCTS", "fastest")
    joint_lines = products.joint_tf32_lines

    def doubled(*args, **kwargs):
        lines = joint_lines(*args, **kwargs)
        return [x.replace("] = tl_o[u];", "] = 2.0f * tl_o[u];") for x in lines]

    if wrong:
        monkeypatch.setattr(products, "joint_tf32_lines", doubled)
    gen = generate(compile_plan(run_passes(graph_of(JOINT))), "cuda")
    phases = next(
        ph for _, ph in gen.plan.kernels.fused_launches if any(getattr(f, "joint", ()) for f in ph)
    )
    first, second = (f for f in phases if isinstance(f, items.GemmCall))
    assert first.joint == ((first.own[0][0][:-1] + "j", products.parts(80) * 128),)
    assert f"void {first.joint[0][0]}(void **table" in gen.text
    assert "TF32 with the next product: " + first.joint[0][0] in _with_launches("k", phases)
    assert second.tf32 and not second.joint
    data = items.to_json(gen.plan)
    assert items.from_json(json.loads(json.dumps(data)), "p") == gen.plan
    # (ours timed faster: a launch counts 1 us, a BLAS product 2)
    spent = [0]
    for method, cost in (("launch", 1), ("gemm", 2)):
        original = getattr(EmuDevice, method)

        def counted(self, *args, _original=original, _cost=cost, **kwargs):
            spent[0] += _cost
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(EmuDevice, method, counted)
    monkeypatch.setattr(EmuDevice, "mark", lambda self: spent[0])
    monkeypatch.setattr(EmuDevice, "elapsed", lambda self, a, b: 1e-6 * (b - a))
    loaded = []
    function = EmuDevice.function
    monkeypatch.setattr(
        EmuDevice, "function", lambda self, m, name: loaded.append(name) or function(self, m, name)
    )
    rt = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice("tensorfloat32"))
    rt.run()
    assert first.joint[0][0] in loaded
    key = ("joint", first.joint[0][0])
    apart, joint, chosen = rt.joint_choices[key]  # (apart: two of ours; joint: one launch)
    assert (apart, joint, chosen) == (pytest.approx(2e-6), pytest.approx(1e-6), not wrong)
    assert (key in rt.product_disagreements) == wrong
    plan = compile_plan(run_passes(graph_of(JOINT)))
    cg = generate(plan, "cpu")
    ref = CpuRuntime(cg.plan, native=cg.text)
    ref.run()
    same_outputs(rt, ref, ["d", "g", "s"], rtol=1e-2, atol=1e-3)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    runner._print_products(rt)
    words = "-> apart (joint faster, but a C 1.0e+00 from the other's)" if wrong else "-> joint"
    assert f"{first.joint[0][0]}: joint 1.0 us, apart 2.0 us {words}" in err.getvalue()
    loaded.clear()
    rt = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice())  # (float32: no joint)
    rt.run()
    assert first.joint[0][0] not in loaded and not rt.joint_choices
    same_outputs(rt, ref, ["d", "g", "s"])


def test_a_plan_s_joint_functions_are_data(monkeypatch):
    """``GemmCall.joint`` is read as data: its functions' names and threads as ``own``'s,
    only on a product with TF32 functions, the launch after it a product with TF32
    functions and none joint of its own. (Not chains: test_cuda_chains.py's.)"""
    monkeypatch.setattr(render, "CHAINS", False)
    gen = generate(compile_plan(run_passes(graph_of(JOINT))), "cuda")
    data = items.to_json(gen.plan)
    # (--dump-ir's listing: a fused kernel's launches too)
    (phases,) = [
        p for _, p in gen.plan.kernels.fused_launches if any(getattr(f, "joint", 0) for f in p)
    ]
    assert _with_launches("", phases) + "\n" in listing(gen)

    def first(ph):
        return next(f["gemm"] for f in ph if isinstance(f, dict))

    def last(ph):
        return [f["gemm"] for f in ph if isinstance(f, dict)][-1]

    cases = [
        (lambda ph: first(ph).__setitem__("joint", [["f j", 4]]), "f j"),
        (lambda ph: first(ph).__setitem__("joint", [["fj", 0]]), "out of range"),
        (lambda ph: first(ph).pop("tf32"), "no TF32 functions of ours"),
        (lambda ph: last(ph).pop("tf32"), "not a product with TF32 functions"),
        (lambda ph: last(ph).__setitem__("joint", [["fj", 4]]), "joint functions make the next"),
        (lambda ph: ph.reverse(), "joint functions make the next"),
    ]
    refuses_changed_plans(data, cases, _joint_json)


@pytest.mark.parametrize("steps", [524288, 1572864])
def test_ppo_s_two_layer_gradients_and_their_weights_have_joint_functions(steps, monkeypatch):
    """PPO 2048's minibatch step: each of the two networks' second layers' ``dz @ W^T``
    has a joint function with its weight's gradient ``h^T @ dz`` (the gram whose B is its
    A), also where the kernel made the weights' gradients in another order (moved next to
    each other, ``_partners_next``; the gram may come first: the first carries it). (Not
    chains: a chain's products are float32 functions of ours, ``render._Kernel._chains``.)"""
    monkeypatch.setattr(render, "CHAINS", False)
    path = ROOT / "programs" / "ppo.rtl"
    sets = {"B": "2048", "T": "128", "total_steps": str(steps)}
    gen = generate(compile_plan(run_passes(graph_of(path.read_text(), **sets))), "cuda")
    pairs = 0
    for _, phases in gen.plan.kernels.fused_launches:
        calls = [f for f in phases if isinstance(f, items.GemmCall)]
        for r in calls:
            if not r.tf32 or products.form("f32", r.m, r.n, r.k, r.a.t, r.b.t) != "rows":
                continue
            partners = [
                g for g in calls if g.k == r.m and (g.b.at, g.b.offset) == (r.a.at, r.a.offset)
            ]
            assert len(partners) <= 1
            if partners:  # (the first of the two carries the joint, the other next)
                pairs += 1
                first, second = sorted((r, partners[0]), key=phases.index)
                at = phases.index(first)
                assert first.joint and phases[at + 1] is second, (r, phases)
    assert pairs == 2


@needs_cxx
@pytest.mark.parametrize("policy", ["ours", "blas"])
def test_a_bias_gradient_s_cast_runs_in_its_gram_s_last_block(policy, monkeypatch):
    """REINFORCE at 16 x 500 (I = 3: at I = 2 only the first iteration has a gradient, its
    products no fused kernel), the first layer's bias gradient rides on its weight's gram
    (``_gram_sums``), and the float32 cast and copy of its float64 sums run in the last
    block of the gram's sum of copies (ours) or of the reduction after the BLAS's product
    (its ``then``), not as a step of the kernel's (``_sums_tail``; ``render.GRAM_TAILS``
    off: as before); the values are the cpu's either way. (Its gram of 4 x 64 adds its
    copies in its part function, ``products.merged``: the cast runs there.)"""
    monkeypatch.setenv("TIMERLC_PRODUCTS", policy)
    path = ROOT / "programs" / "reinforce.rtl"
    plan = compile_plan(run_passes(graph_of(path.read_text(), I=3, B=16, T=500)))

    def run():
        gen = generate(plan, "cuda")
        rt = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice(), graphs=False)
        rt.run()
        return gen, rt

    gen, rt = run()
    tails = [
        f.own[-1][0]
        for _, phases in gen.plan.kernels.fused_launches
        for f in phases
        if isinstance(f, items.GemmCall) and f.then and f.own[-1][0][-1] in "sp"
    ]
    assert len(tails) == 1
    (gram,) = [
        f
        for _, phases in gen.plan.kernels.fused_launches
        for f in phases
        if isinstance(f, items.GemmCall) and f.own[-1][0] == tails[0]
    ]
    text = gen.text.split(f"void {tails[0]}(void")[1].split('extern "C" __global__')[0]
    assert "tl_last = atomicAdd(tl_count(err)" in text
    assert "tl_failed(err, tl_fail" in text  # (the cast's loop, as every step's, reports)
    gs = (gram.m, gram.n, gram.k)
    assert products.merged(*gs) and tails[0].endswith("p") and len(gram.own) == 1
    cg = generate(plan, "cpu")
    ref = CpuRuntime(cg.plan, native=cg.text)
    ref.run()
    same_outputs(rt, ref, [o for o, _, _ in plan.outputs] + [m for m, _, _ in plan.metrics])
    monkeypatch.setattr(render, "GRAM_TAILS", False)  # (the cast a step of the kernel's)
    off = generate(plan, "cuda")
    phases = [f for _, ph in off.plan.kernels.fused_launches for f in ph]
    phases += [f for _, ph in off.plan.kernels.launches for f in ph]
    names = {  # (the same gram's sum of copies: the kernels' names may differ)
        f.own[-1][0]
        for f in phases
        if isinstance(f, items.GemmCall)
        and f.own[-1][0][-1] in "sp"
        and (f.m, f.n, f.k) == (gram.m, gram.n, gram.k)
    }
    assert names
    for name in names:
        apart = off.text.split(f"void {name}(void")[1]
        assert "tl_fail" not in apart.split('extern "C" __global__')[0]


@needs_cxx
def test_a_rows_product_reads_its_shared_memory_16_bytes_at_a_time_to_the_same_bits(
    monkeypatch,
):
    """Rows products whose threads take 8 columns and k a multiple of 4 read A's tile and
    op(B) 16 bytes at a time (``products._rows_vec_lines``: A's rows side by side, op(B)'s
    columns placed in runs of 4), each element summed over k in order as the 4-byte form
    sums it: the same C, bit for bit, at every shape of ``SHAPES`` (those of 8 columns a
    thread in the vector form, the rest as they were)."""
    vec = []
    for _, n, k, *_ in SHAPES[:6]:
        _, tn, _, bm, _ = products._rows_tiling(n, k)
        vec.append(products._rows_vec(tn, bm, n, k))
    assert vec == [True, True, False, False, False, True]
    assert products._vec_stride(64) == 68 and products._vec_stride(4) == 12
    got = []
    for on in (True, False):
        monkeypatch.setattr(products, "VEC_ROWS", on)
        monkeypatch.setattr(products, "VEC_GRAMS", on)  # (and the grams' 16-byte loads)
        out: list = []
        assert _check_shapes(SHAPES, outputs=out) < 1e-5
        got.append(out)
        text = "\n".join(products.rows_lines(_gemm(*SHAPES[0]), "A", "B", "C"))
        assert ("tl_as4" in text) == on
    for x, y in zip(*got):
        np.testing.assert_array_equal(x, y)


def test_a_gram_reads_its_operands_16_bytes_at_a_time_where_they_are_runs_of_4():
    """A gram thread's rows of op(A)^T and columns of op(B) out of the stage by 16-byte
    loads where its tile's runs and the stage's rows are multiples of 4 floats
    (``products._gram_operands``: PPO's 4 x 64 and 64 x 64 gradients), else 4 bytes at a
    time (a 64 x 2's columns); the sums' order unchanged (the products' tests above, bit
    for bit as before, at 4 and 128 threads a block)."""
    wide = "\n".join(products._gram_operands(4, 64, products.STAGE_ROWS, 4, 8))
    assert "tl_sm4[(r * 4 + ty * 4) / 4 + i]" in wide and "tl_sm[" not in wide
    narrow = "\n".join(products._gram_operands(64, 2, products.STAGE_ROWS, 4, 2))
    assert "tl_sm4" not in narrow and "tl_b[j] = tl_sm[4096 + r * 2 + tx * 2 + j]" in narrow


@needs_cxx
def test_a_small_gram_adds_its_copies_in_its_part_function_whatever_the_grid(monkeypatch):
    """A gram of at most ``MERGED_SUMS`` elements with more than one copy is one function
    (``products.merged``: no sum launch): the last copy of each group of copies adds the
    group's, the last group's the groups' into C and B's column sums (tickets it sets back
    to 0: a second call is right too). 64 copies in 8 groups, on grids of 1, 3 and 8 blocks
    (each block several copies): NumPy's C, the same bits on each grid; a 64 x 64 keeps its
    sum launch, as does every gram with ``MERGED_SUMS`` 0."""
    m, n, k = 4, 64, 64 * products.PART_ROWS
    assert products.launches(m, n, k, True, False) == ("part",)
    assert products.copy_groups(k) == (8, 8) and products.copy_groups(3 * 256) == (2, 2)
    assert products.launches(64, 64, k, True, False) == ("part", "sum")
    assert products.launches(m, n, 300, True, False) == ("part",)  # (one copy: C itself)
    s = _gemm(m, n, k, True, False, 0, 0, 0)
    ((name, text),) = products.standalone(s, "g", sums=True)
    device = EmuDevice()
    module = device.load(render.head() + "\n" + text)
    rng = np.random.default_rng(3)
    a = rng.standard_normal(k * m).astype(np.float32)
    b = rng.standard_normal(k * n).astype(np.float32)
    want = a.reshape(k, m).astype(np.float64).T @ b.reshape(k, n).astype(np.float64)
    bufs = [a, b, np.zeros(m * n, np.float32), np.zeros(n)]
    ptrs = [device.alloc(x.nbytes) for x in bufs]
    table = device.alloc(8 * 4)
    device.upload(table, np.array(ptrs, np.uint64))
    scratch = device.alloc(products.scratch_bytes(m, n, k, True, False, sums=True))
    got = []
    for blocks in (1, 3, 8, 3):
        for p, x in zip(ptrs, bufs):
            device.upload(p, x)
        device.launch(device.function(module, name), table, np.zeros(1, np.int64), scratch, blocks)
        c, sums = np.empty(m * n, np.float32), np.empty(n)
        device.download(ptrs[2], c)
        device.download(ptrs[3], sums)
        np.testing.assert_allclose(c.reshape(m, n), want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(sums, b.reshape(k, n).astype(np.float64).sum(0), rtol=1e-12)
        got.append((c, sums))
    for c, sums in got[1:]:
        np.testing.assert_array_equal(c, got[0][0])
        np.testing.assert_array_equal(sums, got[0][1])
    monkeypatch.setattr(products, "MERGED_SUMS", 0)
    assert products.launches(m, n, k, True, False) == ("part", "sum")
    assert "tl_last" not in products.standalone(s, "g")[0][1]


BESIDE_PROGRAM = """
config I = 3, N = 600
dim i < I
s[0] = 1.0
x[i] = reshape(f32(arange(N * 16)) * 0.001, [N, 16]) * s[i]
dy[i] = (reshape(f32(arange(N * 8)) * 0.0005, [N, 8]) - 1.0) * s[i]
u[i] = reshape(f32(arange(N * 8)) * 0.01, [N, 8]) * s[i]
g[i] = x[i].T @ dy[i]
h[i] = tanh(u[i]) * (1.0 - u[i] * u[i])
s[i+1] = s[i] * 0.5 + sum(g[i]) * 0.0001 + sum(h[i]) * 0.0001 + max(h[i]) * 0.0001
out x, dy, u, s
"""


@needs_cxx
@pytest.mark.parametrize(
    ("policy", "blocks", "matmul"),
    [("ours", 3, "float32"), ("ours", 1, "float32"), ("blas", 3, "float32"), ("ours", 3, "tf32")],
)
def test_a_loop_that_touches_nothing_of_a_product_runs_in_its_launch(
    policy, blocks, matmul, monkeypatch
):
    """A weight gradient's gram (16 x 8 over 600 rows, its two copies added in its
    function) and the step of loops next to it that touches nothing of it (``h``'s
    elementwise loop: ``render._Kernel._beside``): one function of ours (and its TF32 one),
    its first blocks the product's and the others the loop's (``tl_beside_split``; on one
    block both, one after the other), where the BLAS's way runs the loop as a function
    after it (``GemmCall.then``, ``..b``); ``BESIDE`` off, the loop a launch of its own.
    The values are the cpu's either way, on grids of 3 blocks and of 1 (TF32: within its
    rounding). (Not a chain: ``render.CHAINS`` off, test_cuda_chains.py.)"""
    monkeypatch.setenv("TIMERLC_PRODUCTS", policy)
    monkeypatch.setattr(render, "CHAINS", False)
    monkeypatch.setattr(EmuDevice, "MAX_BLOCKS", blocks)
    plan = compile_plan(run_passes(graph_of(BESIDE_PROGRAM)))
    gen = generate(plan, "cuda")

    def steps(g):
        return [f for key in ("launches", "fused_launches") for _, p in getattr(g, key) for f in p]

    calls = [
        f
        for f in steps(gen.plan.kernels)
        if isinstance(f, items.GemmCall) and f.then and f.then[-1][0].endswith("b")
    ]
    assert len(calls) == 1 and len(calls[0].own) == len(calls[0].tf32) == 1
    (_, threads), (after, loop) = calls[0].own[0], calls[0].then[-1]
    for fn, _ in (calls[0].own[0], calls[0].tf32[0]):
        text = gen.text.split(f"void {fn}(void")[1].split('extern "C" __global__')[0]
        assert "tl_beside_split(gridDim.x" in text and threads > loop
    loaded = []
    function = EmuDevice.function
    monkeypatch.setattr(
        EmuDevice, "function", lambda self, m, name: loaded.append(name) or function(self, m, name)
    )
    device = EmuDevice("tensorfloat32" if matmul == "tf32" else "float32")
    rt = DeviceRuntime(gen.plan, text=gen.text, device=device, graphs=False)
    rt.run()
    ran = {"blas": after, "ours": calls[0].own[0][0], "tf32": calls[0].tf32[0][0]}
    assert ran["tf32" if matmul == "tf32" else policy] in loaded
    cg = generate(plan, "cpu")
    ref = CpuRuntime(cg.plan, native=cg.text)
    ref.run()
    close = {"rtol": 1e-2, "atol": 1e-3} if matmul == "tf32" else {}
    same_outputs(rt, ref, [o for o, _, _ in plan.outputs], **close)
    assert (rt.blas_calls > 0) == (policy == "blas")
    monkeypatch.setattr(render, "BESIDE", False)
    off = generate(plan, "cuda")
    assert f"void {after}(" not in off.text and "tl_beside_split(gridDim" not in off.text
    assert len(steps(off.plan.kernels)) == len(steps(gen.plan.kernels)) + 1
