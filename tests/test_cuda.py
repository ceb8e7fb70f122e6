"""The CUDA renderer (``timerlc/cuda/render.py``), tested without a GPU: every program's
kernels rendered as CUDA C compile with ``nvcc`` for sm_80 and with NVRTC for compute_90
(the build ``timerlc compile`` writes: nvcc for sm_90), and the same text,
compiled for the host through ``timerlc/cuda/emu.h`` (one block of threads meeting at a
barrier), runs the programs with the values the LLVM kernels give."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import src, table

from timerlc.codegen import kir
from timerlc.codegen.kir import For, Gemm, Store
from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.cuda import facts, nvrtc, products, render, shapes
from timerlc.cuda.emu import compiler
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.plan import items
from timerlc.reference.interpreter import run_graph
from timerlc.runtime import cuda as cuda_runtime
from timerlc.runtime.cpu import CpuRuntime
from timerlc.runtime.cuda import DeviceRuntime, EmuDevice, function_names

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "programs"
SMALL = {  # a quick run of each program
    "ppo": {"B": 4, "T": 16, "total_steps": 128},
    "reinforce": {"I": 3, "B": 4, "T": 16},
    "reinforce_td": {"I": 3, "B": 4, "T": 16},
    "rnn_reinforce": {"I": 3, "B": 4, "T": 16},
}
NAMES = sorted(p.stem for p in PROGRAMS.glob("*.rtl"))
# what the renderer leaves to the other kernels in this slice (docs/cuda.md): nothing of
# the statements' kernels
NOT_YET: tuple[str, ...] = ()


def generated(path: Path | str, text: str | None = None, **sets):
    overrides = {k: str(v) for k, v in sets.items()}
    source = Source(str(path), text if text is not None else Path(path).read_text())
    graph = check_source(source, overrides=overrides)
    return graph, generate_code(compile_plan(run_passes(graph)))


def cuda_gen(gen):
    """The plan of ``gen`` (the cpu backend's) with the cuda backend's kernels."""
    return generate_code(dataclasses.replace(gen.plan, kernels=None), target="cuda")


def cuda_text(gen) -> tuple[str, dict]:
    """The module of a build for the cuda backend, and the statements it has no kernel for
    that the cpu backend has (statement -> why)."""
    cu = cuda_gen(gen)
    skipped = {sid: why for sid, why in cu.interpreted.items() if sid not in gen.interpreted}
    for why in skipped.values():
        assert any(s in why for s in NOT_YET), why
    return cu.text, skipped


def run_both(gen):
    """The plan run with its LLVM kernels and with its CUDA C kernels on the device
    runtime over the emulated device: (LLVM runtime, device runtime, their metrics,
    kernels not rendered)."""
    cu = cuda_gen(gen)
    skipped = {
        k.name: why
        for k in gen.kernels
        if k.sid in cu.interpreted
        for why in [cu.interpreted[k.sid]]
    }
    assert cu.kernels
    got, want = [], []
    rt = DeviceRuntime(cu.plan, lambda *m: got.append(m), text=cu.text, device=EmuDevice())
    rt.run()
    ref = CpuRuntime(gen.plan, lambda *m: want.append(m), native=gen.text)
    ref.run()
    return ref, rt, want, got, skipped


def _launch(emu, name: str, table, args, scratch, err, blocks: int):
    """Function ``name`` of the emulated module ``emu`` over ``blocks`` blocks, its table,
    loop values, scratch and failure record the host's arrays (no shift)."""
    fn = emu.function(name)
    fn(
        table.ctypes.data,
        args.ctypes.data,
        len(args),
        scratch.ctypes.data,
        err.ctypes.data,
        blocks,
        None,
    )


# ----------------------------------------------------------------------------- nvcc
def _nvcc() -> str | None:
    nvcc = shutil.which("nvcc")
    if nvcc is None and os.environ.get("TIMERLC_REQUIRE_NVCC") == "1":
        pytest.fail("nvcc is not on PATH and TIMERLC_REQUIRE_NVCC=1")
    return nvcc


@pytest.mark.parametrize("name", NAMES)
def test_every_program_s_cuda_source_compiles_with_nvcc(name, tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (TIMERLC_REQUIRE_NVCC=1 makes this a failure)")
    _, gen = generated(PROGRAMS / f"{name}.rtl", **SMALL.get(name, {}))
    text, skipped = cuda_text(gen)
    assert not skipped, skipped
    cu = tmp_path / f"{name}.cu"
    cu.write_text(text)
    # (the device's code only: ``-cubin``, no host object, whose compile checks nothing of
    # the kernels and took a tenth of the time)
    cmd = [nvcc, "-cubin", "-x", "cu", str(cu), "-o", str(tmp_path / f"{name}.cubin")]
    cmd += ["--fmad=false"]  # every operation rounds once (docs/cuda.md)
    # (one architecture a test, each compile a pass of ptxas: sm_80 here, sm_90 for the
    # build ``timerlc compile`` writes, compute_90 through NVRTC; a second doubled the
    # minutes these tests take of CI's 15)
    cmd += ["-gencode", "arch=compute_80,code=sm_80"]
    # (nvcc's fastest compile, ``--Ofast-compile max``: the whole text through the front
    # end, cicc and ptxas, each instruction checked, 2.9x faster for PPO: 53.8 -> 18.8 s;
    # the optimizing compile is NVRTC's, below)
    cmd += ["-Ofc", "max"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning" not in r.stderr, r.stderr[-3000:]


# ----------------------------------------------------------------------------- NVRTC
@pytest.mark.parametrize("name", NAMES)
def test_every_program_s_build_compiles_with_nvrtc(name):
    """The module of a build for the cuda backend, compiled by NVRTC with the device
    runtime's options, as CuPy's RawModule compiles it on a GPU for a run that is not
    profiled, its products float32 (no system header: the module's includes are for the
    other compilers; the TF32 functions and the covered statements' kernels left out), for
    compute_90 (the H100's; nvcc compiles each program's whole module for sm_80), without
    a word."""
    lib = nvrtc.library()
    if lib is None:
        if os.environ.get("TIMERLC_REQUIRE_NVCC") == "1":
            pytest.fail(
                "no libnvrtc (the test extra's nvidia-cuda-nvrtc) and TIMERLC_REQUIRE_NVCC=1"
            )
        pytest.skip("no libnvrtc here (TIMERLC_REQUIRE_NVCC=1 makes this a failure)")
    _, gen = generated(PROGRAMS / f"{name}.rtl", **SMALL.get(name, {}))
    cu = cuda_gen(gen)
    assert not cu.interpreted.keys() - gen.interpreted.keys()
    for arch in ("compute_90",):
        lean = (nvrtc.NO_TF32, nvrtc.FUSED_ONLY)
        ptx, log = nvrtc.compile_ptx(cu.text, arch, lib, lean)
        assert log.strip() == "", log[-3000:]
        phases = [f for _, p in cu.plan.kernels.launches for f in p]
        phases += [f for _, p in cu.plan.kernels.fused_launches for f in p]
        functions = [f for f in phases if isinstance(f, tuple)]
        # (a product is the BLAS's, and its kernels of ours where its shape has them:
        # cuda/products.py, an epilogue after the BLAS's, and TF32 ones, a gram's second
        # its float32 one's, and the joint ones of two products; a loop kernel's function
        # is one; and tl_set_shift, the graphs' shifts)
        functions += [
            f
            for g in phases
            if isinstance(g, items.GemmCall)
            for f in g.own + g.then + g.tf32 + g.joint
        ]
        # (and a chain's functions: render._Kernel._chains)
        functions += [f for g in phases if isinstance(g, items.ChainCall) for f in g.functions]
        names = {name for name, _ in functions}
        calls = [g for g in phases if isinstance(g, items.GemmCall)]
        # (a gram's TF32 copies' sum is its float32 one's: compiled)
        left_out = {f for g in calls for f, _ in g.tf32 + g.joint} - {
            f for g in calls for f, _ in g.own
        }
        launches = dict(cu.plan.kernels.launches)
        left_out |= {f for sid in cu.plan.kernels.covered for f in function_names(launches[sid])}
        entries = ptx.count(".entry")
        assert entries == len(names - left_out) + len(cu.plan.kernels.loops) + 1


def _script(name: str):
    """The module of ``scripts/NAME.py`` (a script, not a package's module)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_runs_timerlc_in_each_precision_against_the_same_baselines():
    """``scripts/bench.py --matmul-precision float32,tensorfloat32``: timerlc twice (the
    second as ``timerlc-tf32``), each with its ratios to each baseline; a list of other
    than one or both precisions refused."""
    bench = _script("bench")
    args = bench.parse_args(["--matmul-precision", "float32,tensorfloat32"])
    assert bench.timerlc_systems(args) == {
        "timerlc": "float32",
        "timerlc-tf32": "tensorfloat32",
    }
    assert bench.timerlc_systems(bench.parse_args([])) == {"timerlc": "float32"}
    for bad in ("float64", "float32,float32", ""):
        with pytest.raises(SystemExit, match="is not one or both of"):
            bench.precisions(bad)

    def ran(s: float) -> dict:
        return {"ok": True, "seconds_per_iter": s, "peak_rss_mb": 100.0, "diffs": [s]}

    result = {"algo": "ppo", "B": 2048, "T": 128}
    result["systems"] = {"timerlc": ran(0.01), "timerlc-tf32": ran(0.005), "jax": ran(0.0025)}
    main, check = bench.tables([result], ["jax"], ["timerlc", "timerlc-tf32"])
    head, _, row = main.splitlines()
    cells = dict(zip(head.strip("| ").split(" | "), row.strip("| ").split(" | ")))
    assert cells["timerlc/jax"] == "4.00" and cells["timerlc-tf32/jax"] == "2.00"
    assert "timerlc-tf32/jax per repeat" in check


def test_the_bench_differences_two_runs_a_system_and_keeps_each_as_it_comes(tmp_path, capsys):
    """``scripts/bench.py``'s measurement: a system's N run, then one of N + M iterations (M
    = N, or enough that M iterations take --min-diff-seconds by the N run's in-run
    estimate), s/iter the difference of their windows over M; every run's line printed and
    the JSON rewritten as each run ends (the GPU's bench, stopped at its stage's limit
    before its tables, kept nothing; stand-in runs here, each iteration 12 ms or 1 s)."""
    bench = _script("bench")
    per_iter = {"fast": 0.012, "slow": 1.0}
    ran = []

    def run_system(system, algo, B, T, iters, args):
        ran.append((system, iters))
        window = 0.3 + per_iter[system] * (iters - 1)
        return {
            "ok": True,
            "wall_s": 20 + window,
            "timed_s": window,
            "in_run_seconds_per_iter": per_iter[system],
            "peak_rss_mb": 100.0,
        }

    bench.run_system = run_system
    out = tmp_path / "bench.json"
    args = bench.parse_args(["--iters", "10", "--repeats", "1", "--min-diff-seconds", "0.5"])
    args.n, args.json_path = 10, str(out)
    seen = []
    got = bench.measure(
        "ppo", 2048, 128, ["fast", "slow"], {}, args, lambda runs, n_long: seen.append(n_long)
    )
    assert ran == [("fast", 10), ("slow", 10), ("fast", 52), ("slow", 20)]
    assert (got["fast"]["n_long"], got["slow"]["n_long"]) == (52, 20)
    assert got["fast"]["seconds_per_iter"] == pytest.approx(0.012)
    assert got["slow"]["seconds_per_iter"] == pytest.approx(1.0)
    assert got["slow"]["wall_seconds_per_iter"] == pytest.approx(1.0)
    assert len(seen) == 4  # (after every run)
    fast = {"ok": True, "in_run_seconds_per_iter": 1e-7}
    assert bench.long_n(fast, 10, 0.5) == 10 + 500  # (at most 50 N more)
    err = capsys.readouterr().err
    assert "#   fast N=10: window 0.408 s, wall 20.4 s, in-run 12.00 ms/iter" in err
    assert "#   fast: 12.000 ms/iter so far ((N=52) - (N=10))" in err
    # main's JSON: at the long run, the N run is in it as a point under way's
    partial = []

    def run_timerlc(system, algo, B, T, iters, args):
        if iters > 10:
            partial.append(json.loads(out.read_text())["partial"])
        return run_system("fast", algo, B, T, iters, args)

    bench.run_system = run_timerlc
    argv = ["--algos", "ppo", "--configs", "4x8", "--baselines", "none", "--repeats", "1"]
    bench.main(argv + ["--min-diff-seconds", "0.5", "--json", str(out)])
    assert [len(p["runs"]["timerlc"]) for p in partial] == [1]
    final = json.loads(out.read_text())
    assert "partial" not in final
    assert final["results"][0]["systems"]["timerlc"]["seconds_per_iter"] == pytest.approx(0.012)


def test_the_skinny_products_benchmark_s_kernels_compile_and_compute_the_products():
    """``scripts/cuda_skinny.py`` (PPO's skinny products, cuBLAS against ours,
    ``cuda/products.py``, on a GPU): its module compiles with NVRTC for compute_90 without a
    word, and on cuda-emu each of its products of 130 rows (blocks of 64 rows, the last
    short; a gram's two copies) is NumPy's, a gram's with and without B's column sums, a
    rows product's with and without a bias and ``tanh`` as its epilogue; and the TF32
    functions' the product of the operands rounded to TF32; so is the joint function's
    pair (``products.joint_tf32_lines``)."""
    from timerlc.cuda import products

    skinny = _script("cuda_skinny")
    lib = nvrtc.library()
    if lib is not None:
        ptx, log = nvrtc.compile_ptx(skinny.module_text(130), "compute_90", lib)
        assert log.strip() == "", log[-3000:]
        shapes = [(s.m, s.n, s.k, s.ta, s.tb) for s in skinny.gemms(130)]
        # (each: plain, x; TF32's where the shape has them, plain and x too)
        per = [len(products.launches(*x)) * (4 if products.tf32_form(*x) else 2) for x in shapes]
        # (and the joint function of dz @ W^T and h^T @ dz, with the two it stands for)
        joint = 3 + 2 * (products.parts(130) > 1)
        assert ptx.count(".entry") == sum(per) + joint
        assert "mma.sync.aligned.m16n8k8" in ptx
    elif os.environ.get("TIMERLC_REQUIRE_NVCC") == "1":
        pytest.fail("no libnvrtc (the test extra's nvidia-cuda-nvrtc) and TIMERLC_REQUIRE_NVCC=1")
    if compiler() is None:
        pytest.skip("no host C++ compiler for cuda-emu")
    script = ROOT / "scripts" / "cuda_skinny.py"
    r = subprocess.run(
        [sys.executable, str(script), "--emu", "--rows", "130"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("| - | - | - | - |") == len(skinny.SHAPES)
    assert "| joint: dz @ W^T with (1 - h^2), h^T @ dz with sums | - | - | - |" in r.stdout
    # --tilings: each rows product with each thread's tile forced where it fits (8 x 8 does
    # not for a 64 x 64 weight: its own tiling), NumPy's values
    r = subprocess.run(
        [sys.executable, str(script), "--emu", "--rows", "130", "--tilings", "2x4,8x8"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| x @ W (64 x 64) | 2 x 4 | - | - |" in r.stdout
    assert "| x @ W (64 x 64) | its own: 4 x 8 | - | - |" in r.stdout
    assert "| x @ W (4 x 64) | 8 x 8 | - | - |" in r.stdout


def test_the_chain_probe_s_kernel_compiles_and_makes_the_six_gradients():
    """``scripts/cuda_chain.py`` (a row-tile chain's probe: one MLP's backward over a tile of
    rows at a time in one kernel, timed on a GPU against cuBLAS): its module compiles with
    NVRTC for compute_90 without a word, and on cuda-emu its six gradients of 1,024 rows
    in 4 and 8 chunks, heads of 2 and 1 columns, are NumPy's; a chunk of part of a tile is
    refused."""
    chain = _script("cuda_chain")
    lib = nvrtc.library()
    if lib is not None:
        ptx, log = nvrtc.compile_ptx(chain.module_text(1024, 8, 2), "compute_90", lib)
        assert log.strip() == "", log[-3000:]
        assert ptx.count(".entry") == 2
    elif os.environ.get("TIMERLC_REQUIRE_NVCC") == "1":
        pytest.fail("no libnvrtc (the test extra's nvidia-cuda-nvrtc) and TIMERLC_REQUIRE_NVCC=1")
    with pytest.raises(AssertionError, match="whole tiles"):
        chain.module_text(1024, 64, 2)  # (16 rows a chunk: half a tile)
    if compiler() is None:
        pytest.skip("no host C++ compiler for cuda-emu")
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cuda_chain.py"), "--emu", "--rows", "1024"]
        + ["--parts", "4,8"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [x for x in r.stdout.splitlines() if x.startswith("| 1024 |")]
    assert [x.split("|")[2:4] for x in rows] == [
        [" 2 ", " 4 "],
        [" 2 ", " 8 "],
        [" 1 ", " 4 "],
        [" 1 ", " 8 "],
    ]
    assert all(float(x.split("|")[6]) < 1e-5 for x in rows)


def test_the_resources_script_reads_ptxas_and_counts_an_sm_s_blocks():
    """``scripts/cuda_resources.py``: each function's registers, shared memory and spills
    from ptxas's report (no smem on the line where there is none), and the blocks of 128
    threads an H100 multiprocessor holds (32 registers: 16, by its threads; 40: 12; 56: 9;
    128: 4; 60,000 bytes of shared memory: 3); the module of ``returns`` through nvcc."""
    path = ROOT / "scripts" / "cuda_resources.py"
    res = _script("cuda_resources")
    assert res.blocks_per_sm(32, 0) == (16, "threads")
    assert [res.blocks_per_sm(r, 0)[0] for r in (40, 56, 64, 128)] == [12, 9, 8, 4]
    assert res.blocks_per_sm(32, 60000) == (3, "shared")
    text = """ptxas info    : Compiling entry function 'f1' for 'sm_90'
ptxas info    : Function properties for f1
    0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 56 registers, used 1 barriers, 6152 bytes smem, 624 bytes cmem[0]
ptxas info    : Compiling entry function 's2' for 'sm_90'
ptxas info    : Function properties for s2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 1 barriers, 624 bytes cmem[0]
"""
    rows = {r["name"]: r for r in res.report(text)}
    assert (rows["f1"]["registers"], rows["f1"]["smem"], rows["f1"]["spill"]) == (56, 6152, 16)
    assert (rows["s2"]["smem"], rows["s2"]["blocks"]) == (0, 16)
    if _nvcc() is None:
        pytest.skip("nvcc is not on PATH (TIMERLC_REQUIRE_NVCC=1 makes this a failure)")
    r = subprocess.run(
        [sys.executable, str(path), "returns", "--all"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^\| tl_loop_\w+ \| \d+ \|", r.stdout, re.MULTILINE), r.stdout


# ----------------------------------------------------------------------------- emulation
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler")


@needs_cxx
@pytest.mark.parametrize("name", NAMES)
def test_every_program_runs_on_the_emulated_cuda_kernels(name):
    _, gen = generated(PROGRAMS / f"{name}.rtl", **SMALL.get(name, {}))
    ref, rt, want, got, _ = run_both(gen)
    assert [m[:2] for m in got] == [m[:2] for m in want]
    for (n, _, a), (_, _, b) in zip(got, want):
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5) or (
            math.isnan(a) and math.isnan(b)
        ), n
    for out, _, _ in gen.plan.outputs:
        x, y = rt.value(out), ref.value(out)
        assert x.dtype == y.dtype and x.shape == y.shape, out
        if x.dtype.kind == "f":
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=out)
        else:
            np.testing.assert_array_equal(x, y, err_msg=out)


INTS = [0, 1, -1, 7, -7, 2, -2, 3, -(2**31), 2**31 - 1, 100, -100]
FLOATS = [0.0, -0.0, 1.5, -1.5, 2.5, -2.5, 7.0, -7.0, 0.5, 1e30, -1e-30, math.inf, -math.inf]


@needs_cxx
@pytest.mark.parametrize(
    "dtype, values, ops",
    [
        ("i32", INTS, ["+", "-", "*", "//", "%", "**", "min", "max", "<", "==", "cast"]),
        ("i64", INTS, ["+", "-", "*", "//", "%", "min", "max"]),
        ("f32", FLOATS, ["+", "-", "*", "/", "//", "%", "min", "max", "<", "!=", "cast"]),
        ("f64", FLOATS, ["+", "*", "/", "//", "%", "min", "max", "cast"]),
    ],
)
def test_scalar_ops_on_the_emulation_equal_the_llvm_kernels(dtype, values, ops):
    """Bit for bit: NumPy's semantics of each op at its subtle values (integer division
    by 0 and -1, the smallest int, float % with the divisor's sign, nan and infinities in
    min and max, casts of out-of-range floats), as the LLVM renderer computes them."""
    a = [x for x in values for _ in values]
    b = [y for _ in values for y in values]
    if dtype.startswith("f"):
        a, b = a + [math.nan, 1.0], b + [1.0, math.nan]
    text = f"config K = {len(a)}\ndim k < K\n" + table("a", a, dtype) + table("b", b, dtype)
    outs = []
    for n, op in enumerate(ops):
        if op in ("min", "max"):
            expr = f"{'minimum' if op == 'min' else 'maximum'}(a, b)"
        elif op == "cast":
            expr = "i32(a)" if dtype.startswith("f") else "f32(a) + f32(b)"
        elif op == "**":
            expr = "a ** (b % 5 - 1)"
        else:
            expr = f"a {op} b"
        text += f"y{n}[k] = {expr}\n"
        outs.append(f"y{n}")
    text += "out " + ", ".join(outs) + "\n"
    _, gen = generated("p.rtl", src(text))
    ref, rt, _, _, skipped = run_both(gen)
    assert not skipped
    for name in outs:
        x, y = rt.value(name), ref.value(name)
        same = (x == y) | (np.isnan(x) & np.isnan(y)) if x.dtype.kind == "f" else (x == y)
        if x.dtype.kind == "f":
            same &= np.signbit(x) == np.signbit(y)
        assert same.all(), (name, x[~same][:5], y[~same][:5])


@needs_cxx
def test_a_failing_emulated_kernel_names_the_point(tmp_path):
    # the take's index is out of range at k = 2: the kernel returns its code and the
    # runtime computes the call again with the interpreter, which names the point
    text = "config K = 5\ndim k < K\nx[k] = f32(k)\ny[k] = take(x[0:K], 3 * k)\nout y\n"
    graph, gen = generated("p.rtl", src(text))
    cu = cuda_gen(gen)
    assert not cu.interpreted and "tl_fail = 1" in cu.text
    rt = DeviceRuntime(cu.plan, text=cu.text, device=EmuDevice(), cache=tmp_path)
    with pytest.raises(RunError) as got:
        rt.run()
    with pytest.raises(RunError) as want:
        run_graph(graph)
    assert "k=2" in str(got.value) and "out of range" in str(got.value)
    assert "k=2" in str(want.value)


def test_a_statement_s_vector_loop_is_parallel_and_its_temporaries_its_own():
    """The kernel IR marks a statement's loop over its vector dims parallel; the renderer
    deals its iterations to the block's threads, each with its own per-point temporaries
    (an argmax's, here) and its own locals."""
    text = """
    config B = 6, A = 3
    dim b < B
    q[b] = f32(arange(A)) * f32(b % 3 - 1)
    best[b] = argmax(q[b] + 0.5)
    out best
    """
    _, gen = generated("p.rtl", src(text))
    listing = "\n".join(kir.text(k) for k in gen.kernels)
    assert "(parallel):" in listing
    cu, _ = cuda_text(gen)
    assert "blockIdx.x * blockDim.x + threadIdx.x; v_b <" in cu
    assert "v_b += (long long)gridDim.x * blockDim.x" in cu


@needs_cxx
def test_a_row_s_independent_elements_get_a_thread_each():
    """A statement over rows whose row loop only stores, each iteration its own element
    (a layer's ``tanh(x @ w + b)`` over [n, 64]), runs a thread per element, not per row
    (``shapes._spread``: 24x the threads here, a warp's stores side by side); a row loop
    whose iterations meet (a softmax's sums) does not. Same values as the cpu."""
    text = """
    config N = 300, H = 24
    dim k < 2
    m[k] = f32(k) + reshape(f32(arange(N * H)), [N, H]) * 0.001
    y[k] = tanh(m[k] * 2.0 + 0.5)
    s[k] = softmax(m[k])
    out y, s
    """
    _, gen = generated("p.rtl", src(text))
    cu = cuda_gen(gen)
    (y,) = [sid for sid, _, _ in cu.plan.kernels.statements if cu.plan.buffer(sid).name == "y"]
    assert dict(cu.plan.kernels.launches)[y] == ((f"s{y}", 2 * 300 * 24),)
    assert "tl_r % 24LL" in cu.text
    (s,) = [sid for sid, _, _ in cu.plan.kernels.statements if cu.plan.buffer(sid).name == "s"]
    assert dict(cu.plan.kernels.launches)[s][0][1] < 2 * 300  # (its rows' sums: per row)
    ref, rt, _, _, _ = run_both(gen)
    for k in ("y", "s"):
        np.testing.assert_allclose(rt.value(k), ref.value(k), rtol=1e-6, atol=1e-6)


@needs_cxx
def test_random_draws_in_emulated_kernels_are_bit_identical():
    """Philox in C (``prelude._philox_c``): uniform, normal (f32 and f64), Gumbel noise (a
    categorical's), the glorot initializer, a ranged uniform, a permutation and bernoulli
    give the LLVM kernels' values, bit for bit (which are ``timerlc/rng.py``'s)."""
    text = """
    config I = 3, B = 5, seed = 11
    dim i < I
    dim b < B
    u[i, b] = uniform([3])
    n[i, b] = normal([2])
    d[i, b] = normal([2], dtype=f64)
    g[i, b] = categorical(f32(b) * stack([0.5, -1.0, 2.0, 0.0]))
    w[i] = glorot([3, 4])
    z[i] = uniform([2], lo=-2.0, hi=3.0)
    p[i] = permutation(37)
    c[i, b] = bernoulli(f32(b) * stack([0.1, 0.2, 0.25]))
    out u, n, d, g, w, z, p, c
    """
    _, gen = generated("p.rtl", src(text))
    ref, rt, _, _, skipped = run_both(gen)
    assert not skipped
    for name in ("u", "n", "d", "g", "w", "z", "p", "c"):
        x, y = rt.value(name), ref.value(name)
        assert x.dtype == y.dtype and (x == y).all(), (name, x, y)


@needs_cxx
def test_a_serial_step_passes_its_locals_to_the_steps_after_it(tmp_path):
    """A kernel built by hand: two locals computed on one thread (one of them the bound of
    the parallel loop), the loop over the grid reading them, then a serial step that
    assigns one again: three functions, the locals going through the scratch memory."""
    from timerlc.codegen.kir import (
        Bin,
        Cast,
        Const,
        Kernel,
        Let,
        Load,
        Ref,
        Slot,
        Store,
    )
    from timerlc.cuda.emu import EmuModule
    from timerlc.cuda.render import render_module

    m, v = Ref("m", "f32"), Ref("v")
    body = (
        Let("m", "f32", Load("src", Ref("j"), "f32")),
        Let("n", "i64", kir.add(Ref("j"), kir.i64(300))),
        For(
            "v",
            kir.i64(0),
            Ref("n"),
            (Store("out", v, Bin("mul", Cast(v, "f32"), m, "f32")),),
            True,
        ),
        Let("m", "f32", Bin("add", m, Const("f32", 1.0), "f32")),
        Store("out", kir.i64(999), m),
    )
    slots = (Slot("out", "f32", 0, 0, 0, True), Slot("src", "f32", 1, 1, 0, False))
    k = Kernel("hand", 0, ("j",), slots, (), body)
    text, skipped, launches = render_module([k])
    assert not skipped
    phases = launches["hand"].phases
    assert [f for f, _ in phases] == ["hand", "hand_1", "hand_2"] and launches[
        "hand"
    ].scratch == 16
    emu = EmuModule(text, tmp_path)
    out = np.full(1000, -1.0, np.float32)
    src = np.arange(10, dtype=np.float32) * 0.5
    table = np.array([out.ctypes.data, src.ctypes.data], np.uint64)
    args = np.array([7], np.int64)
    scratch = np.zeros(16, np.uint8)
    err = np.zeros(1, np.int32)
    for f, _ in phases:
        _launch(emu, f, table, args, scratch, err, 3)
    assert err[0] == 0
    want = np.full(1000, -1.0, np.float32)
    want[:307] = np.arange(307, dtype=np.float32) * np.float32(3.5)
    want[999] = 4.5
    np.testing.assert_array_equal(out, want)


@needs_cxx
@pytest.mark.parametrize("by_ranges", [True, False], ids=["by-ranges", "skewed"])
def test_loops_that_touch_nothing_of_each_other_s_run_side_by_side(
    tmp_path, monkeypatch, by_ranges
):
    """A kernel built by hand, as a fused kernel's statements over rows of one length that
    touch nothing of each other's (Adam's moments of a bias and a weight over 64 rows), then
    a store on one thread (a one-element bias's): a loop per statement
    (``render._fissioned``), each over the grid (the weight's a thread per element), all in
    one launch, each thread taking a point of one of them (``_packed``, ``tl_skew``), the
    store a loop of one point in it (``_joins``): where there were a row loop of 64 threads,
    each storing its row of each in turn, and a launch for the store. The same values on a
    grid smaller than the points and on one larger. One barrier after the last loop, none
    between two (each waited for nothing). Each thread's points are dispatched to their
    loop by ranges (a jump: ``render.either_by_ranges``, where the step has
    ``DISPATCH_GROUPS`` groups of loops of constant bounds), or, with fewer, each thread
    walks every loop skewed to its place."""
    from timerlc.codegen.kir import Bin, Const, Kernel, Load, Ref, Slot
    from timerlc.cuda import render
    from timerlc.cuda.emu import EmuModule

    r, e = Ref("r"), Ref("e")
    at = kir.add(kir.mul(r, 64), e)
    one = Const("f32", 1.0)
    row = (
        Store("a", r, Bin("mul", Load("x", r, "f32"), Const("f32", 2.0), "f32")),
        For(
            "e",
            kir.i64(0),
            kir.i64(64),
            (Store("b", at, Bin("add", Load("y", at, "f32"), one, "f32")),),
        ),
        Store("c", r, Bin("sub", Load("x", r, "f32"), one, "f32")),
    )
    body = (
        For("r", kir.i64(0), kir.i64(64), row, True),
        Store("d", kir.i64(0), Bin("mul", Load("x", kir.i64(3), "f32"), Const("f32", 5.0), "f32")),
    )
    names = ("a", "b", "c", "d", "x", "y")
    slots = tuple(Slot(n, "f32", q, q, 0, n in "abcd") for q, n in enumerate(names))
    k = Kernel("hand", 0, ("j",), slots, (), body)
    monkeypatch.setattr(render, "DISPATCH_GROUPS", 4 if by_ranges else 5)
    (step,) = render.steps(k)
    assert step[0] == "either" and len(step[1]) == 4
    text, skipped, launches = render.render_module([k])
    assert not skipped and launches["hand"].phases == (("hand", 64 + 4096 + 64 + 1),)
    # (one barrier and one look at the failures after the four loops, none between two)
    fn = text[text.index("void hand(") :]
    fn = fn[: fn.index("\n}\n")]
    if by_ranges:  # (one loop over the points, a jump to each one's loop)
        assert fn.count("switch (tl_k)") == 1 and fn.count("case ") == 4
        assert "tl_skew(" not in fn and fn.count("tl_failed(err, tl_fail") == 1
        assert fn.rindex("__syncthreads();") > fn.rindex("case 3:")
    else:  # (three loops skewed, the weight's nest two ways: its column's and its point's)
        assert fn.count("tl_skew(") == 4 and fn.count("tl_failed(err, tl_fail") == 1
        assert fn.rindex("__syncthreads();") > fn.rindex("tl_skew(")
    # (and the first, after the block's code is set: whether an earlier step failed)
    assert fn.count("__syncthreads();") == 1 and fn.count("__syncthreads_or(tl_stop)") == 1
    emu = EmuModule(text, tmp_path)
    x = np.arange(64, dtype=np.float32) * 0.25
    y = np.arange(4096, dtype=np.float32) * 0.5
    for blocks in (3, 40):  # (384 threads for 4,225 points; then 5,120)
        outs = [np.full(n, -7.0, np.float32) for n in (64, 4096, 64, 1)]
        table = np.array([a.ctypes.data for a in (*outs, x, y)], np.uint64)
        args = np.array([0], np.int64)
        err = np.zeros(11, np.int64)
        scratch = np.zeros(8, np.uint8)
        _launch(emu, "hand", table, args, scratch, err, blocks)
        assert not err.any()
        np.testing.assert_array_equal(outs[0], x * 2)
        np.testing.assert_array_equal(outs[1], y + 1)
        np.testing.assert_array_equal(outs[2], x - 1)
        np.testing.assert_array_equal(outs[3], [x[3] * 5])


@needs_cxx
def test_a_thread_whose_column_is_fixed_reads_the_column_s_values_once(tmp_path):
    """A nest of two parallel loops over the grid (rows, 8 columns): where the grid's
    stride is a whole number of rows, each thread's column is the same at each of its
    points, so the weight and the bias it reads by the column alone are read once before
    the loop (``_Kernel.column_loop``), the thread stepping through the rows; not ``z``,
    which the loop writes, nor a load under an ``if``. The same values on a grid of 8
    threads (2 blocks of the emulation's 4: the column's way) and of 12 (the point's)."""
    from timerlc.codegen.kir import Bin, Const, If, Kernel, Load, Ref, Slot, Un
    from timerlc.cuda import render
    from timerlc.cuda.emu import EmuModule

    r, c = Ref("r"), Ref("c")
    at = kir.add(kir.mul(r, 8), c)
    f32 = "f32"
    xw = Bin("mul", Load("x", r, f32), Load("w", c, f32), f32)
    cond = Bin("gt", Load("x", r, f32), Const(f32, 5.0), "bool")
    col = (
        Store("y", at, Un("tanh", Bin("add", xw, Load("b", c, f32), f32), f32)),
        Store("z", at, Bin("mul", Load("z", at, f32), Load("w", c, f32), f32)),
        If(cond, (Store("z", at, Bin("add", Load("z", at, f32), Load("u", c, f32), f32)),)),
    )
    body = (
        For("r", kir.i64(0), kir.i64(50), (For("c", kir.i64(0), kir.i64(8), col, True),), True),
    )
    names = ("y", "z", "x", "w", "b", "u")
    slots = tuple(Slot(n, f32, q, q, 0, n in "yz") for q, n in enumerate(names))
    text, skipped, _ = render.render_module([Kernel("cols", 0, (), slots, (), body)])
    assert not skipped
    fn = text[text.index("void cols(") :]
    fn = fn[: fn.index("\n}\n")]
    assert "% 8LL == 0) {" in fn and "} else {" in fn
    # (before the rows' loop; in it, a point reads x before its first statement: point)
    column = fn[fn.index("% 8LL == 0) {") :]
    column = column[: column.index("for (")]
    hoisted = re.findall(r"const float (tl_h\d+) = (m_\w+)\[", column)
    assert sorted(b for _, b in hoisted) == ["m_b", "m_w"], hoisted
    emu = EmuModule(text, tmp_path)
    x = np.linspace(0.0, 10.0, 50, dtype=np.float32)
    w, b, u = (np.arange(8, dtype=np.float32) * k for k in (0.5, 0.1, 3.0))
    for blocks in (2, 3):
        y = np.full(400, -7.0, np.float32)
        z = np.arange(400, dtype=np.float32)
        table = np.array([a.ctypes.data for a in (y, z, x, w, b, u)], np.uint64)
        err = np.zeros(cuda_runtime.ERR_WORDS, np.int64)
        args, scratch = np.zeros(1, np.int64), np.zeros(8, np.uint8)
        _launch(emu, "cols", table, args, scratch, err, blocks)
        assert not err.any()
        want_z = np.arange(400, dtype=np.float32).reshape(50, 8) * w
        want_z = np.where((x > 5)[:, None], want_z + u, want_z)
        np.testing.assert_allclose(y.reshape(50, 8), np.tanh(x[:, None] * w + b), rtol=1e-6)
        np.testing.assert_array_equal(z.reshape(50, 8), want_z)


@needs_cxx
def test_a_thread_s_points_of_stores_alone_load_before_they_store(tmp_path):
    """A grid loop whose points are stores alone takes ``IN_FLIGHT`` of a thread's points a
    pass, every store's values at each of them before its stores (``_Kernel.batched``):
    by the column's way (a nest of 50 rows x 8 columns, one store in place) and the point's
    (a loop over 50 rows), the pass's points past the end skipped. Not where a point has an
    ``if``, more than ``IN_FLIGHT_STORES`` stores or a buffer that is another's memory (a
    donation's). The same values on grids of 8, 12 and 16 threads (the emulation's blocks
    of 4): a pass whole, cut short, and the column's way's other branch."""
    from timerlc.codegen.kir import Bin, Const, If, Kernel, Load, Ref, Slot, Un
    from timerlc.cuda.emu import EmuModule

    r, c = Ref("r"), Ref("c")
    at = kir.add(kir.mul(r, 8), c)
    f32 = "f32"
    cols = (
        Store("y", at, Un("tanh", Bin("mul", Load("x", r, f32), Load("w", c, f32), f32), f32)),
        Store("z", at, Bin("add", Load("z", at, f32), Load("y", at, f32), f32)),
    )
    nest = For("r", kir.i64(0), kir.i64(50), (For("c", kir.i64(0), kir.i64(8), cols, True),), True)
    flat = For("r", kir.i64(0), kir.i64(50), (Store("v", r, kir.mul(Load("x", r, f32), 2)),), True)
    names = ("y", "z", "x", "w", "v")
    slots = tuple(Slot(n, f32, q, q, 0, n in "yzv") for q, n in enumerate(names))
    kernels = [Kernel("both", 0, (), slots, (), (nest, flat))]
    three = cols + (Store("v", r, Load("x", r, f32)),)
    guarded = (If(Bin("gt", Load("x", r, f32), Const(f32, 5.0), "bool"), cols),)
    for name, body, shared in (
        ("three", three, ()),
        ("guarded", guarded, ()),
        ("shared", cols, ("y", "z")),
    ):
        loop = For(
            "r", kir.i64(0), kir.i64(50), (For("c", kir.i64(0), kir.i64(8), body, True),), True
        )
        kernels.append(Kernel(name, 0, (), slots, (), (loop,), shared=shared))
    text, skipped, _ = render.render_module(kernels)
    assert not skipped

    def function(name):
        fn = text[text.index(f"void {name}(") :]
        return fn[: fn.index("\n}\n")]

    fn = function("both")
    assert fn.count("tl_b += 4LL * tl_rs") == 2, fn
    # each store's values at the pass's points before the first of its stores
    first_store = fn.index("m_y[")
    assert all(fn.index(f"tl_x0_{u} = ") < first_store for u in range(render.IN_FLIGHT))
    for name in ("three", "guarded", "shared"):
        assert "tl_b" not in function(name), name
    emu = EmuModule(text, tmp_path)
    x = np.linspace(0.0, 10.0, 50, dtype=np.float32)
    w = np.arange(8, dtype=np.float32) * 0.1
    for blocks in (2, 3, 4):
        y, v = np.full(400, -7.0, np.float32), np.full(50, -7.0, np.float32)
        z = np.arange(400, dtype=np.float32)
        table = np.array([a.ctypes.data for a in (y, z, x, w, v)], np.uint64)
        err = np.zeros(cuda_runtime.ERR_WORDS, np.int64)
        args, scratch = np.zeros(1, np.int64), np.zeros(8, np.uint8)
        _launch(emu, "both", table, args, scratch, err, blocks)
        assert not err.any()
        want_y = np.tanh(x[:, None] * w)
        np.testing.assert_allclose(y.reshape(50, 8), want_y, rtol=1e-6)
        np.testing.assert_array_equal(z, np.arange(400, dtype=np.float32) + y)
        np.testing.assert_array_equal(v, x * 2)


@needs_cxx
def test_a_value_a_thread_stores_it_reads_back_from_a_local(tmp_path):
    """A point's value stored and read back at the same index is read from a local
    (``_Kernel.forwarded``), but not after a loop that stores the buffer (nor inside it,
    before its store: the iteration before stored it), nor after a store to a buffer that
    may be its memory (``Kernel.shared``, here the same array: the load sees the other
    store's value), nor where the index's local changed."""
    from timerlc.codegen.kir import Bin, Const, Kernel, Let, Load, Ref, Slot
    from timerlc.cuda.emu import EmuModule

    r, f32 = Ref("r"), "f32"
    one = Const(f32, 1.0)

    def add(a, b):
        return Bin("add", a, b, f32)

    def mul(a, b):
        return Bin("mul", a, Const(f32, float(b)) if isinstance(b, int) else b, f32)

    body = (
        Store("y", r, mul(Load("x", r, f32), 2)),  # y = 2x
        Store("z", r, add(Load("y", r, f32), one)),  # z = 2x + 1 (y forwarded)
        Store("w", r, mul(Load("y", r, f32), Load("z", r, f32))),  # (y, z forwarded)
        For("k", kir.i64(0), kir.i64(3), (Store("y", r, add(Load("y", r, f32), one)),)),
        Store("v", r, Load("y", r, f32)),  # 2x + 3: after the loop, from the memory
        Store("y", r, mul(Load("x", r, f32), 3)),
        Store("u", r, Const(f32, 5.0)),  # u is y's memory (shared)
        Store("s", r, Load("y", r, f32)),  # 5
        Store("p", kir.add(kir.mul(r, 2), kir.i64(1)), Const(f32, 8.0)),
        Let("q", "i64", kir.mul(r, 2)),
        Store("p", Ref("q"), mul(Load("x", r, f32), 4)),
        Let("q", "i64", kir.add(Ref("q"), kir.i64(1))),
        Store("t", r, Load("p", Ref("q"), f32)),  # p[2r + 1]: 8, from the memory
    )
    loop = For("r", kir.i64(0), kir.i64(50), body, True)
    names = ("y", "z", "w", "v", "u", "s", "t", "p", "x")
    slots = tuple(Slot(n, f32, q, q, 0, n != "x") for q, n in enumerate(names))
    kernel = Kernel("fw", 0, (), slots, (), (loop,), shared=("y", "u"))
    text, skipped, _ = render.render_module([kernel])
    assert not skipped
    fn = text[text.index("void fw(") :]
    fn = fn[: fn.index("\n}\n")]
    stored = {}  # each buffer's first store's local
    for b, local in re.findall(r"(m_\w+)\[[^\]]*\] = (tl_f\d+);", fn):
        stored.setdefault(b, local)
    assert f"= ({stored['m_y']} + " in fn and f"({stored['m_y']} * {stored['m_z']})" in fn, fn
    # y's loads from the memory: in the loop, after it, and after u's store
    assert len(re.findall(r"m_y\[v_r\](?! = )", fn)) == 3, fn
    assert re.search(r"m_t\[v_r\] = tl_f\d+;", fn) and "= m_p[v_q]" in fn, fn
    emu = EmuModule(text, tmp_path)
    x = np.linspace(-3.0, 3.0, 50, dtype=np.float32)
    for blocks in (1, 3):
        arrays = {n: np.full(100 if n == "p" else 50, -7.0, np.float32) for n in names}
        arrays["u"], arrays["x"] = arrays["y"], x  # one memory
        table = np.array([arrays[n].ctypes.data for n in names], np.uint64)
        err = np.zeros(cuda_runtime.ERR_WORDS, np.int64)
        args, scratch = np.zeros(1, np.int64), np.zeros(8, np.uint8)
        _launch(emu, "fw", table, args, scratch, err, blocks)
        assert not err.any()
        np.testing.assert_array_equal(arrays["z"], 2 * x + 1)
        np.testing.assert_array_equal(arrays["w"], (2 * x) * (2 * x + 1))
        np.testing.assert_array_equal(arrays["v"], 2 * x + 3)
        np.testing.assert_array_equal(arrays["s"], np.full(50, 5.0, np.float32))
        np.testing.assert_array_equal(arrays["t"], np.full(50, 8.0, np.float32))
        np.testing.assert_array_equal(arrays["p"][::2], x * 4)


@needs_cxx
def test_a_point_reads_what_it_does_not_write_before_its_first_statement(tmp_path):
    """A point of several statements reads the buffers it does not write, at indices of
    its variables, before its first statement (``_Kernel.point``): not a buffer it writes,
    nor one that may be its memory, nor a load that may not run (a selection's branch),
    nor one at an index a local of the point computes. The same values on the emulation."""
    from timerlc.codegen.kir import Bin, Const, Kernel, Let, Load, Ref, Sel, Slot
    from timerlc.cuda.emu import EmuModule

    r, f32 = Ref("r"), "f32"

    def add(a, b):
        return Bin("add", a, b, f32)

    pos = Bin("gt", Load("a", r, f32), Const(f32, 0.0), "bool")
    body = (
        Store("y", r, add(Load("a", r, f32), Const(f32, 1.0))),
        Store("z", r, add(Load("y", r, f32), Load("b", r, f32))),  # b: before y's store
        Store("w", r, Sel(pos, Load("c", r, f32), Const(f32, 0.0), f32)),  # c: under a branch
        Let("q", "i64", kir.add(r, kir.i64(0))),
        Store("v", r, add(Load("d", Ref("q"), f32), Load("u", r, f32))),  # d: q's; u: shared
    )
    loop = For("r", kir.i64(0), kir.i64(30), body, True)
    names = ("y", "z", "w", "v", "a", "b", "c", "d", "u")
    slots = tuple(Slot(n, f32, q, q, 0, n in "yzwv") for q, n in enumerate(names))
    kernel = Kernel("pt", 0, (), slots, (), (loop,), shared=("u", "y"))
    text, skipped, _ = render.render_module([kernel])
    assert not skipped
    fn = text[text.index("void pt(") :]
    fn = fn[: fn.index("\n}\n")]
    first_store = fn.index("m_y[v_r] = ")
    hoisted = re.findall(r"const float tl_h\d+ = (m_\w+)\[", fn[:first_store])
    assert sorted(hoisted) == ["m_a", "m_b"], fn
    emu = EmuModule(text, tmp_path)
    rng = np.random.default_rng(0)
    ins = {n: rng.standard_normal(30).astype(np.float32) for n in "abcd"}
    for blocks in (1, 2):
        arrays = {n: np.full(30, -7.0, np.float32) for n in "yzwv"} | ins
        arrays["u"] = arrays["y"]  # one memory
        table = np.array([arrays[n].ctypes.data for n in names], np.uint64)
        err = np.zeros(cuda_runtime.ERR_WORDS, np.int64)
        args, scratch = np.zeros(1, np.int64), np.zeros(8, np.uint8)
        _launch(emu, "pt", table, args, scratch, err, blocks)
        assert not err.any()
        y = ins["a"] + np.float32(1)
        np.testing.assert_array_equal(arrays["y"], y)
        np.testing.assert_array_equal(arrays["z"], y + ins["b"])
        np.testing.assert_array_equal(arrays["w"], np.where(ins["a"] > 0, ins["c"], 0))
        np.testing.assert_array_equal(arrays["v"], ins["d"] + y)


@needs_cxx
def test_ppo_on_blocks_of_a_gpu_s_128_threads_matches_the_cpu():
    """PPO on cuda-emu with blocks of 128 threads (``TIMERLC_EMU_THREADS``), a GPU's: its
    64-wide rows' loops take the column's way (the grid's stride a whole number of rows,
    ``column_loop``), its bias gradients' lanes are two, as on a GPU (the emulation's 4
    threads take neither); the cpu backend's metrics and outputs
    (``scripts/cuda_gpu_check.py``, a process of its own: the emulation's threads are
    made once)."""
    env = dict(os.environ, TIMERLC_EMU_THREADS="128")
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cuda_gpu_check.py"), "--emu", "ppo"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "largest relative difference over all" in r.stdout


def test_temporaries_a_function_uses_at_once_get_bytes_of_their_own():
    """Lowering packs a kernel's temporaries by the order of its statements (two whose uses
    do not overlap share bytes), but the renderer runs loops at once: rows merged
    (``render._row_merged``), each thread at its own row's loops. The temporaries are placed
    anew by the functions that use them (``_Kernel._repack``): where PPO's gradient of the
    logits wrote ``t13`` into the bytes of ``t7``, which a thread at another row still read
    (the emulation's threads raced: a metric's value changed from run to run)."""
    from timerlc.codegen.kir import Bin, Const, Kernel, Load, Ref, Slot, Temp
    from timerlc.cuda import render

    r, e = Ref("r"), Ref("e")
    two = kir.add(kir.mul(r, 2), e)

    def rows(body):
        return For("r", kir.i64(0), kir.i64(32), body, True)

    def pair(buf, value):
        return (For("e", kir.i64(0), kir.i64(2), (Store(buf, two, value),)),)

    x2 = Load("x", two, "f32")
    t7 = Load("t7", two, "f32")
    both = Bin(
        "add",
        Load("t7", kir.mul(r, 2), "f32"),
        Load("t7", kir.add(kir.mul(r, 2), kir.i64(1)), "f32"),
        "f32",
    )
    body = (
        rows(pair("t7", Bin("mul", x2, Const("f32", 3.0), "f32"))),
        rows(pair("t10", Bin("add", t7, Const("f32", 1.0), "f32"))),
        rows((Store("t13", r, both),)),
        rows(pair("y", Bin("add", Load("t10", two, "f32"), Load("t13", r, "f32"), "f32"))),
    )
    # (as lowering packed them: t13 in t7's bytes, their uses apart in the statements' order)
    temps = (Temp("t7", "f32", 512, 64), Temp("t10", "f32", 256, 64), Temp("t13", "f32", 512, 32))
    slots = (Slot("y", "f32", 0, 0, 0, True), Slot("x", "f32", 1, 1, 0, False))
    k = Kernel("hand", 0, ("j",), slots, temps, body)
    r = render._Kernel(k)
    r.render()
    assert len(r.phases) == 1  # (one loop over the rows)
    place = {t.name: (t.offset, t.offset + 4 * t.size) for t in r.k.temps}
    spans = sorted(place.values())
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), place


def test_loops_under_exclusive_guards_share_the_grid_s_threads():
    """An ``either`` step's loops side by side (``render._packed``): two under the
    branches of one ``if`` (only one does work at a call) take the same threads, a third
    the threads after the longer of them."""
    from timerlc.cuda import render

    def loop(n):
        return For(
            "v", kir.i64(0), kir.i64(n), (Store("o", kir.Ref("v"), kir.Const("f32", 0.0)),), True
        )

    c = kir.Bin("lt", kir.Ref("j"), kir.i64(3), "bool")
    form = (frozenset({(c, True)}), frozenset({(c, False)}), frozenset())
    assert render._packed([loop(10), loop(20), loop(5)], form) == [0, 0, 20]
    assert render._packed([loop(10), loop(20), loop(5)], (frozenset(),) * 3) == [0, 10, 30]


def test_a_fused_kernel_s_element_loops_merge_into_one_thread_each():
    """A fused kernel's statements at a row (two element loops over one range, the second
    reading the first's element as stored): one loop, a thread per element
    (``shapes._merged_elements``); a read of the first's value at another element keeps
    them apart."""

    x = kir.Load("x", kir.Ref("e"), "f32")
    a = For(
        "e", kir.i64(0), kir.i64(64), (kir.Store("y", kir.Ref("e"), kir.Un("tanh", x, "f32")),)
    )
    same = kir.Store("z", kir.Ref("f"), kir.Un("exp", kir.Load("y", kir.Ref("f"), "f32"), "f32"))
    b = For("f", kir.i64(0), kir.i64(64), (same,))
    merged = shapes._merged_elements((a, b))
    assert merged is not None and [s.buf for s in merged.body] == ["y", "z"]
    assert merged.body[1].index == kir.Ref("e")  # (the second loop's variable renamed)
    other = kir.Load("y", kir.add(kir.Ref("f"), kir.i64(1)), "f32")
    c = For("f", kir.i64(0), kir.i64(64), (kir.Store("z", kir.Ref("f"), other),))
    assert shapes._merged_elements((a, c)) is None
    d = For("f", kir.i64(0), kir.i64(32), (same,))
    assert shapes._merged_elements((a, d)) is None  # (another range)


def test_the_cuda_build_orders_a_step_s_calls_so_that_they_join():
    """Inside the loops, calls go in an order that joins more of them
    (``codegen.tree.by_level``): PPO's 24 Adam moments and 12 updates, and the gradient
    norm's clip before them, are in three kernels (with other calls of the step where
    those join), where the schedule's order (a tensor's moments, then its update) made them
    twelve pairs (the build for the cpu keeps the schedule's order)."""
    path = Path(__file__).resolve().parent.parent / "programs" / "ppo.rtl"
    _, gen = generated(path, B=8, T=16, total_steps=256)
    cu = cuda_gen(gen)

    def adam(p) -> int:  # (its calls of Adam's: the moments', the updates', the clip's)
        return sum(cu.plan.statement(s).node.op in ("add", "minimum") for s in p)

    kernels = [p for p in cu.plan.kernels.fused if adam(p) >= 5]
    assert sum(adam(p) for p in kernels) >= 37 and len(kernels) <= 3, kernels
    assert cu.plan.tree != gen.plan.tree  # (reordered for the cuda build only)

    def calls(plan):
        return sorted(
            (c.statement, repr(c.args)) for c in items.walk(plan.tree) if isinstance(c, items.Call)
        )

    # (the same calls; some in both branches of an if, where two ifs became one)
    assert set(calls(cu.plan)) == set(calls(gen.plan))  # (the same calls)


def test_the_cuda_build_joins_ifs_of_one_condition_and_moves_calls_across_ifs():
    """The schedule parts a minibatch step into several ``if c1 <= 30`` blocks: the cuda
    build makes them one (``codegen.tree.by_level``), and a call moves across an ``if`` it
    touches nothing of where that joins launches: statements called in different blocks of
    the plan before (PPO's bias correction under the ``if``, the parameters' merges after
    it) are one kernel, one function. The calls are the same (the calls between two such
    ifs in both branches); the values are the cpu's (the differential tests run the
    reordered plans)."""
    path = Path(__file__).resolve().parent.parent / "programs" / "ppo.rtl"
    _, gen = generated(path, B=8, T=16, total_steps=256)
    cu = cuda_gen(gen)

    def bodies(tree):
        yield tree
        for it in tree:
            if isinstance(it, items.Loop):
                yield from bodies(it.body)
            elif isinstance(it, items.If):
                yield from bodies(it.then)
                yield from bodies(it.orelse)

    for body in bodies(cu.plan.tree):
        conds = [it.cond if isinstance(it, items.If) else None for it in body]
        assert all(a is None or a != b for a, b in itertools.pairwise(conds)), conds

    def places(tree, path=(), out=None):  # statement -> the ifs and loops around its calls
        out = {} if out is None else out
        for it in tree:
            if isinstance(it, items.Loop):
                places(it.body, (*path, ("for", repr(it.cond))), out)
            elif isinstance(it, items.If):
                places(it.then, (*path, ("then", repr(it.cond))), out)
                places(it.orelse, (*path, ("else", repr(it.cond))), out)
            elif isinstance(it, items.Call):
                out.setdefault(it.statement, set()).add(path)
        return out

    before = places(gen.plan.tree)
    launches = dict(
        zip([k.parts for k in cu.fused], [p for _, p in cu.plan.kernels.fused_launches])
    )
    joined = [  # (fused kernels of statements the plan called in different blocks)
        k.parts
        for k in cu.fused
        if len({frozenset(before[p]) for p in k.parts}) > 1 and len(launches[k.parts]) == 1
    ]
    assert joined, [k.parts for k in cu.fused]

    def calls(plan):
        return sorted(
            (c.statement, repr(c.args)) for c in items.walk(plan.tree) if isinstance(c, items.Call)
        )

    # (the same calls; some in both branches of an if, where two ifs became one)
    assert set(calls(cu.plan)) == set(calls(gen.plan))


def test_calls_between_two_ifs_of_a_metric_run_before_them():
    """Two ``if``s of one condition with calls between them become one (``by_level``'s
    ``merged``); where they hold a metric's call (which the host records: no device graph
    holds its branch), calls that touch nothing of theirs run once before them rather
    than in both branches: PPO's minibatch clip fraction, between its statistics' ``if``
    and ``last_clipfrac``'s, is called at every step of the loop outside any ``if``, in a
    graph with the step's other launches. Where the ifs record nothing the calls go into
    both branches, as before (the parameters' merges beside the minibatch step's)."""
    path = Path(__file__).resolve().parent.parent / "programs" / "ppo.rtl"
    _, gen = generated(path, B=8, T=16, total_steps=256)
    cu = cuda_gen(gen)
    last = {name: sid for name, sid, _ in gen.plan.metrics}["last_clipfrac"]
    (frac,) = {r.src for n in gen.plan.statement(last).nodes for r in n.inputs if r.stored}

    def paths(tree, sid, path=()):  # (the ifs' branches around each call of ``sid``)
        for it in tree:
            if isinstance(it, items.Loop):
                yield from paths(it.body, sid, path)
            elif isinstance(it, items.If):
                yield from paths(it.then, sid, (*path, "then"))
                yield from paths(it.orelse, sid, (*path, "else"))
            elif isinstance(it, items.Call) and it.statement == sid:
                yield path

    def every_branch_once(found) -> bool:  # (one call on every way through the ifs)
        if found == [()]:
            return True
        if () in found:
            return False
        then = [p[1:] for p in found if p[0] == "then"]
        orelse = [p[1:] for p in found if p[0] == "else"]
        return every_branch_once(then) and every_branch_once(orelse)

    assert list(paths(cu.plan.tree, frac)) == [()]
    # (a bias's merge: its zeros at the first step, its updates in its memory; a weight's
    # merge is called no more: its initial value is in its memory too)
    merge = next(b.id for b in gen.plan.buffers if b.name == "net.pi_b1")
    assert list(paths(gen.plan.tree, merge)) == [()]
    inside = sorted(paths(cu.plan.tree, merge))
    assert ("else",) in inside and every_branch_once(inside), inside


def test_loops_over_one_range_that_meet_only_at_their_row_are_one_step():
    """A statement's ops over the rows of its value, each into a temporary (PPO's gradient
    of the logits: six loops over 65,536 rows, five launches), are one loop, a thread per
    row (``render._row_merged``), where of what one writes the others touch only their own
    row's elements; a read of another row's keeps them apart, and the merged temporaries
    stay global."""
    from timerlc.cuda import render

    r, e = kir.Ref("r"), kir.Ref("e")
    row = kir.add(kir.mul(r, 2), e)
    a = For(
        "r",
        kir.i64(0),
        kir.i64(100),
        (For("e", kir.i64(0), kir.i64(2), (Store("t1", row, kir.Load("x", row, "f32")),)),),
        True,
    )
    q = kir.Ref("q")
    two = [
        kir.Load("t1", kir.mul(q, 2), "f32"),
        kir.Load("t1", kir.add(kir.mul(q, 2), kir.i64(1)), "f32"),
    ]
    b = For("q", kir.i64(0), kir.i64(100), (Store("y", q, kir.Bin("add", *two, "f32")),), True)
    body, shared = render._row_merged((a, b))
    assert len(body) == 1 and shared == {"t1", "y"}
    merged = body[0].body[1]
    assert merged.buf == "y" and merged.index == r  # (the second loop's variable renamed)
    far = kir.Load("t1", kir.add(kir.mul(q, 2), kir.i64(2)), "f32")
    c = For("q", kir.i64(0), kir.i64(100), (Store("y", q, far),), True)
    assert len(render._row_merged((a, c))[0]) == 2  # (row q + 1's element)
    d = dataclasses.replace(b, hi=kir.i64(50))
    assert len(render._row_merged((a, d))[0]) == 2  # (another range)


def test_loops_whose_accesses_start_at_one_offset_of_the_call_s_values_merge():
    """Loops over one range whose accesses to a buffer start at one offset that is not a
    constant but is the call's values' alone (a ring buffer's slot, ``mod(j, 2) * 128``:
    Adam's moments of a weight, then its update) meet only at their row too
    (``shapes._rows_local``): one loop; not where the offsets differ, nor where the offset
    reads a local of the loops (each row its own) or the memory."""
    from timerlc.cuda import render

    r, e, j = kir.Ref("r"), kir.Ref("e"), kir.Ref("j")
    slot = kir.mul(kir.Bin("mod", j, kir.i64(2), "i64"), 128)
    at = kir.add(slot, kir.add(kir.mul(r, 2), e))

    def writer(index):
        inner = For("e", kir.i64(0), kir.i64(2), (Store("m", index, kir.Load("g", e, "f32")),))
        return For("r", kir.i64(0), kir.i64(64), (inner,), True)

    def reader(index, lets=()):
        inner = For("e", kir.i64(0), kir.i64(2), (Store("p", e, kir.Load("m", index, "f32")),))
        return For("r", kir.i64(0), kir.i64(64), (*lets, inner), True)

    body, _ = render._row_merged((writer(at), reader(at)))
    assert len(body) == 1
    other = kir.add(kir.mul(kir.Bin("mod", j, kir.i64(3), "i64"), 128), kir.add(kir.mul(r, 2), e))
    assert len(render._row_merged((writer(at), reader(other)))[0]) == 2
    q = kir.Ref("q")
    mine = kir.add(kir.mul(q, 128), kir.add(kir.mul(r, 2), e))
    let = (kir.Let("q", "i64", kir.Load("k", r, "i64")),)
    assert len(render._row_merged((writer(mine), reader(mine, let)))[0]) == 2
    gathered = kir.add(kir.Load("k", kir.i64(0), "i64"), kir.add(kir.mul(r, 2), e))
    assert len(render._row_merged((writer(gathered), reader(gathered)))[0]) == 2


def test_a_wide_loop_over_many_rows_stays_out_of_the_merged_rows():
    """Of loops over one range that meet only at their row (``render._row_merged``), one
    over at least ``WIDE_ROWS`` rows whose elements a thread each can take, ``WIDE`` or
    more a row (a layer's tanh after a minibatch's gathered observations), stays a loop of
    its own (``render._wide``): merged, each thread would store down a row, a warp's stores
    a row apart; fewer rows, or narrower rows, merge as before; but rows of ``LONG_ROW``
    elements or more stay apart over any rows (each thread's run down a row of them is a
    round trip to memory a point: PPO's returns' bootstrap, 2,048 rows of 129)."""
    from timerlc.cuda import render

    def loops(rows: int, width: int):
        r, e, q, c = (kir.Ref(v) for v in "reqc")
        four = kir.add(kir.mul(r, 4), e)
        a = For(
            "r",
            kir.i64(0),
            kir.i64(rows),
            (For("e", kir.i64(0), kir.i64(4), (Store("t1", four, kir.Load("x", four, "f32")),)),),
            True,
        )
        at = kir.add(kir.mul(q, width), c)
        value = kir.Bin(
            "mul", kir.Load("t1", kir.mul(q, 4), "f32"), kir.Load("w", c, "f32"), "f32"
        )
        b = For(
            "q",
            kir.i64(0),
            kir.i64(rows),
            (For("c", kir.i64(0), kir.i64(width), (Store("y", at, value),)),),
            True,
        )
        return a, b

    rows, wide = render.WIDE_ROWS, render.WIDE
    body, _ = render._row_merged(loops(rows, wide))
    assert len(body) == 2
    (spread,) = shapes._spread(body[1:])
    assert facts._nest(spread)[1].parallel  # (a thread per element)
    assert len(render._row_merged(loops(rows - 1, wide))[0]) == 1
    assert len(render._row_merged(loops(rows, wide - 1))[0]) == 1
    long = render.LONG_ROW
    assert (wide, long) == (32, 128)
    assert len(render._row_merged(loops(2, long))[0]) == 2
    assert len(render._row_merged(loops(rows - 1, long - 1))[0]) == 1


@needs_cxx
def test_a_wide_layer_after_a_gather_over_many_rows_runs_a_thread_per_element():
    """A minibatch's gathered rows, then a layer's tanh over them, ``WIDE_ROWS`` rows of
    ``WIDE`` (PPO's first layers at 2048 environments, smaller): the layer is a loop of a
    thread per element (``render._wide``), not each thread down a row after its gather;
    the same values as the cpu."""
    text = """
    config N = 8192, H = 32, J = 3
    dim j < J
    obs = reshape(sin(f32(arange(N * 4)) * 0.01), [N, 4])
    perm[j] = permutation(N)
    w[0] = reshape(f32(arange(4 * H)) * 0.01 - 0.5, [4, H])
    w[j+1] = w[j] * 0.5 + expand(sum(h[j], 0)[0:4], 1) * 0.0001
    xb[j] = take(obs, perm[j], 0)
    h[j] = tanh(xb[j] @ w[j] + 0.1)
    out h
    """
    from timerlc.cuda import render

    assert (render.WIDE_ROWS, render.WIDE) == (8192, 32)
    _, gen = generated("p.rtl", src(text))
    cu = cuda_gen(gen)
    assert "tl_g < (((8192LL)) - ((0LL))) * 32LL" in cu.text
    ref, rt, _, _, _ = run_both(gen)
    np.testing.assert_allclose(rt.value("h"), ref.value("h"), rtol=1e-6, atol=1e-6)


def test_a_wide_element_loop_of_a_fused_row_is_cut_out_of_it():
    """A fused kernel's row loop (over ``WIDE_ROWS`` rows) that stores a value per row and
    then a row of ``WIDE`` elements from it (the value head's gradient over h2 after the
    value loss's per row) is two loops (``render._wide_pieces``): the row's value passes
    through its buffer; where it passes through a local, or a temporary, one loop."""
    from timerlc.cuda import render

    r, c = kir.Ref("r"), kir.Ref("c")
    rows, wide = render.WIDE_ROWS, render.WIDE
    per_row = Store("g", r, kir.Bin("mul", kir.Load("x", r, "f32"), kir.Const("f32", 2.0), "f32"))
    at = kir.add(kir.mul(r, wide), c)
    elements = For(
        "c",
        kir.i64(0),
        kir.i64(wide),
        (Store("y", at, kir.Bin("mul", kir.Load("g", r, "f32"), kir.Load("w", c, "f32"), "f32")),),
    )
    loop = For("r", kir.i64(0), kir.i64(rows), (per_row, elements), True)
    pieces = render._fissioned((loop,))
    assert [len(p.body) for p in pieces] == [1, 1]
    assert render._fissioned((loop,), frozenset({"g"})) == (loop,)  # (g a temporary)
    local = kir.Let("v", "f32", kir.Load("x", r, "f32"))
    use = dataclasses.replace(
        elements,
        body=(Store("y", at, kir.Bin("mul", kir.Ref("v"), kir.Load("w", c, "f32"), "f32")),),
    )
    through = For("r", kir.i64(0), kir.i64(rows), (local, use), True)
    assert render._fissioned((through,)) == (through,)
    few = dataclasses.replace(loop, hi=kir.i64(rows - 1))
    assert render._fissioned((few,)) == (few,)
    # beside a statement that touches nothing of theirs (its own group, PPO's exp of the
    # log-std in the value loss's row loop): cut all the same, three loops (it was one,
    # each thread storing its row of 64 down a row: PPO's f172_64, 100 us on the H200)
    other = Store("z", r, kir.Load("x", r, "f32"))
    beside = dataclasses.replace(loop, body=(per_row, other, elements))
    assert [[type(x) for x in p.body] for p in render._fissioned((beside,))] == [
        [Store],
        [For],
        [Store],
    ]


def test_a_sum_s_nest_is_one_loop_over_its_points():
    """A sum into locals over a nest of loops of constant bounds (a 64 x 64 weight's
    squares; the joined sums of two weights' rows, ``_reductions_joined``) is one loop over
    the nest's points (``render._flat_sum``: the grid deals points, not rows); not where an
    inner iteration passes a local on to the next (``facts._carried``)."""
    from timerlc.cuda import render

    r, c, acc = kir.Ref("r"), kir.Ref("c"), kir.Ref("acc")
    at = kir.add(kir.mul(r, 64), c)
    term = kir.Load("w", at, "f32")
    add = kir.Let("acc", "f32", kir.Bin("add", acc, term, "f32"))
    inner = For("c", kir.i64(0), kir.i64(64), (add,))
    other = For(
        "d",
        kir.i64(0),
        kir.i64(64),
        (
            kir.Let(
                "acc2",
                "f32",
                kir.Bin(
                    "add",
                    kir.Ref("acc2"),
                    kir.Load("u", kir.add(kir.mul(r, 64), kir.Ref("d")), "f32"),
                    "f32",
                ),
            ),
        ),
    )
    loop = For(
        "r", kir.i64(0), kir.i64(64), (inner, other), False, (("acc", "add"), ("acc2", "add"))
    )
    flat = render._flat_sum(loop)
    assert flat.var == "r.flat" and flat.hi == kir.i64(4096) and flat.reduce == loop.reduce
    assert [x.name for x in flat.body] == ["r", "c", "acc", "acc2"]  # (d renamed to c)
    carry = kir.Let("t", "f32", kir.Bin("add", kir.Ref("t"), term, "f32"))
    passes = For(
        "c",
        kir.i64(0),
        kir.i64(64),
        (carry, dataclasses.replace(add, value=kir.Bin("add", acc, kir.Ref("t"), "f32"))),
    )
    assert facts._carried(passes.body, {"acc": "add"})
    kept = dataclasses.replace(loop, body=(passes,), reduce=(("acc", "add"),))
    assert render._flat_sum(kept) is kept


def test_the_reductions_unroll_is_the_module_s_head(monkeypatch):
    """``TL_UNROLL`` (a reduction's loop over its terms) unrolls ``render.UNROLL`` times on
    the GPU's compilers (``scripts/cuda_sweep.py`` sets it), not at all in the emulation."""
    from timerlc.cuda import render

    assert '#define TL_UNROLL _Pragma("unroll 8")' in render.head()
    monkeypatch.setattr(render, "UNROLL", 3)
    text = render.head()
    assert '#define TL_UNROLL _Pragma("unroll 3")' in text and "@UNROLL@" not in text
    assert "#ifdef TL_EMU\n#define TL_UNROLL\n" in text


@needs_cxx
def test_the_head_s_skew_and_group_size_on_the_host(tmp_path):
    """``tl_skew`` (a thread's first point of a loop side by side over the grid: the
    smallest ``f - off + k * step >= 0``, one step on without a division where the grid
    spans the offset) and ``tl_group_size`` (about the square root of a reduction's blocks,
    1 where one group would hold them all), compiled by the host's C++ compiler with the
    emulation's header, against their definitions here."""
    import math
    import subprocess

    from timerlc.cuda import emu, render

    cases = [
        (f, off, step)
        for f in range(0, 40, 3)
        for off in range(0, 90, 7)
        for step in (1, 5, 13, 64)
    ]
    blocks = list(range(1, 300)) + [1188, 2048, 2112, 65535]
    main = ["int main() {"]
    main += [f'  printf("%lld\\n", tl_skew({f}LL, {o}LL, {s}LL));' for f, o, s in cases]
    main += [f'  printf("%u\\n", tl_group_size({n}u));' for n in blocks]
    main += ["  return 0;", "}"]
    src = tmp_path / "head.cc"
    src.write_text(render.head() + "\n#include <stdio.h>\n" + "\n".join(main) + "\n")
    exe = tmp_path / "head"
    include = Path(emu.__file__).with_name("emu.h")
    cmd = [compiler(), *emu.FLAGS, "-include", str(include), "-x", "c++", str(src), "-x", "none"]
    # (the module's entry, ``tl_emu_launch``, calls the emulation's threads)
    cmd += [str(emu.runtime_library(compiler())), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True)
    got = [
        int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True).stdout.split()
    ]

    def skew(f, off, step):
        k = 0
        while f - off + k * step < 0:
            k += 1
        return f - off + k * step

    def group(n):
        g = math.isqrt(n)
        g += g * g < n
        return g if g < n else 1

    assert got == [skew(*c) for c in cases] + [group(n) for n in blocks]
    assert [group(n) for n in (1, 2, 3, 4, 10, 17, 1188)] == [1, 1, 2, 2, 4, 5, 35]


def test_an_array_sum_s_rows_over_a_nest_are_one_loop_over_its_points():
    """An array reduction whose rows are a nest of loops of constant bounds (a bias's
    gradient over environments x steps) is one loop over the nest's points, the loops'
    variables from the point at the top of the row's loop (``render._flat_rows``: the
    blocks deal points, and the sums go to registers); not where the row's bounds read
    the nest's variables."""
    from timerlc.cuda import render

    b, t, h = kir.Ref("b"), kir.Ref("t"), kir.Ref("h")
    at = kir.add(kir.add(kir.mul(b, 8 * 16), kir.mul(t, 16)), h)
    update = Store(
        "g", h, kir.Bin("add", kir.Load("g", h, "f32"), kir.Load("x", at, "f32"), "f32")
    )
    row = For("h", kir.i64(0), kir.i64(16), (update,), True)
    steps = For("t", kir.i64(0), kir.i64(8), (row,), False, (("g", "add"),))
    loop = For("b", kir.i64(0), kir.i64(300), (steps,), False, (("g", "add"),))
    flat, form = render._flat_rows(loop, ("array", ("g",), row))
    assert flat.var == "b.flat" and flat.hi == kir.i64(2400) and flat.reduce == loop.reduce
    (inner,) = flat.body
    assert form == ("array", ("g",), inner) and inner.var == "h" and inner.parallel
    assert [x.name for x in inner.body[:2]] == ["b", "t"] and inner.body[2] == update
    ragged = dataclasses.replace(row, hi=kir.add(t, 1))
    steps = dataclasses.replace(steps, body=(ragged,))
    kept = dataclasses.replace(loop, body=(steps,))
    assert render._flat_rows(kept, ("array", ("g",), ragged)) == (
        kept,
        ("array", ("g",), ragged),
    )


@needs_cxx
def test_an_array_sum_over_two_dims_sums_in_registers():
    """``sum(x, [0, 1])`` of a [300, 8, 16] value: one loop over the 2,400 rows, each
    thread an element's sum in a register (``_flat_rows``, ``array_in_registers``); the
    cpu's values."""
    text = """
    config I = 3
    dim i < I
    s[0] = 1.0
    s[i+1] = s[i] * 0.5 + sum(g[i]) * 0.0001
    x[i] = reshape(sin(f32(arange(300 * 8 * 16)) * 0.01), [300, 8, 16]) * s[i]
    g[i] = sum(x[i], [0, 1])
    out g, s
    """
    _, gen = generated("p.rtl", src(text))
    cu = cuda_gen(gen)
    assert re.search(
        r"_flat < \(2400LL\); v_\w+_flat \+= \(long long\)gridDim.x \* tl_lanes", cu.text
    )
    ref, rt, _, _, _ = run_both(gen)
    for name in ("g", "s"):
        np.testing.assert_allclose(rt.value(name), ref.value(name), rtol=1e-5, atol=1e-5)


@needs_cxx
def test_a_check_of_the_loop_values_is_made_before_the_loop_reads(tmp_path):
    """A kernel built by hand: ``if 4 * j > 8: fail 1``, then a copy of ``src[4 * j + v]``.
    The check reads only the call's loop values: each iteration of the loop makes it
    first, one launch (it was a step of its own, launched after the loop, whose reads it
    was there to allow); at j = 3 nothing is read or written and the code is 1."""
    from timerlc.codegen.kir import Bin, Fail, If, Kernel, Load, Ref, Slot
    from timerlc.cuda.emu import EmuModule
    from timerlc.cuda.render import render_module

    start = kir.mul(Ref("j"), 4)
    check = If(Bin("gt", start, kir.i64(8), "bool"), (Fail(1),))
    v = Ref("v")
    copy = For(
        "v",
        kir.i64(0),
        kir.i64(4),
        (Store("out", v, Load("src", kir.add(start, v), "f32")),),
        True,
    )
    slots = (Slot("out", "f32", 0, 0, 0, True), Slot("src", "f32", 1, 1, 0, False))
    k = Kernel("hand", 0, ("j",), slots, (), (check, copy))
    text, skipped, launches = render_module([k])
    assert not skipped and [f for f, _ in launches["hand"].phases] == ["hand"]
    emu = EmuModule(text, tmp_path)
    src = np.arange(12, dtype=np.float32)
    for j, code in ((2, 0), (3, 1)):
        out = np.full(4, -1.0, np.float32)
        table = np.array([out.ctypes.data, src.ctypes.data], np.uint64)
        args = np.array([j], np.int64)
        scratch = np.zeros(16, np.uint8)
        err = np.zeros(11, np.int64)  # (the failure record and the tickets' counter)
        _launch(emu, "hand", table, args, scratch, err, 3)
        assert err.view(np.int32)[0] == code and err[2] == (j if code else 0)
        want = src[8:12] if code == 0 else np.full(4, -1.0, np.float32)
        np.testing.assert_array_equal(out, want)


def test_a_fused_kernel_takes_no_more_scratch_than_a_statement_s():
    """The cuda target's scratch is one block, the largest any kernel needs: a fused kernel,
    its parts' temporaries side by side, may not grow it (``codegen.tree``: PPO's second
    layers' two products, each [B * T / 4, 64], fused were twice the largest statement's,
    at 2048 x 128 16 MiB more device memory than JAX's peak)."""
    path = Path(__file__).resolve().parent.parent / "programs" / "ppo.rtl"
    _, gen = generated(path, B=2048, T=128, total_steps=2048 * 128 * 2)
    cu = cuda_gen(gen)
    largest = max(scratch for _, _, scratch in cu.plan.kernels.statements)
    fused = [scratch for scratch, _ in cu.plan.kernels.fused_launches]
    assert fused and max(fused) <= largest


BIAS_GRADIENTS = """
config I = 3, N = 600, W = 80
dim i < I
s[0] = 1.0
s[i+1] = s[i] * 0.5 + sum(g[i]) * 0.0001
x[i] = reshape(f32(arange(N * 8)) * 0.001, [N, 8]) * s[i]
dy[i] = (reshape(f32(arange(N * W)) * 0.0005, [N, W]) - 1.0) * s[i]
dz[i] = reshape(f32(arange(N * W)) * 0.0002, [N, W]) + s[i]
g[i] = concat([reshape(x[i].T @ dy[i], [8 * W]), sum(dy[i], 0),
               reshape(x[i].T @ dz[i], [8 * W]), sum(dz[i], 0)], 0)
w = reshape(f32(arange(8 * 16)) * 0.01 - 0.6, [8, 16])
h[i] = tanh(x[i] @ w + f32(arange(16)) * 0.1)
dn[i] = reshape(f32(arange(N * 2)) * 0.001, [N, 2]) - s[i]
gn[i] = sum(dn[i], 0) * 2.0
out g, h, s, x, dy, dz, gn, dn
"""


@needs_cxx
@pytest.mark.parametrize("n", [300, 1000, 5000])
def test_a_sum_into_one_element_of_more_terms_than_the_grid_has_threads(n):
    """The sum over the rows of an [N, 1] array is a reduction into a temporary of one
    element (``t[0] = t[0] + x``, a thread's own register). Over the grid (300 terms run on
    one thread), past its threads (cuda-emu's 3 blocks) a thread adds several terms; the
    loads-in-flight form of a grid loop (``_Kernel.batched``: a pass of points, their values
    first, then their stores) is for parallel loops alone, where it kept one term of each
    pass of a sum (PPO's value head's bias gradient, 75 % off at 1,000 rows). The cpu's
    values, and the kernel's sum not in that form."""
    text = f"""
config I = 3, N = {n}
dim i < I
s[0] = 1.0
s[i+1] = s[i] * 0.5 + g[i][0] * 0.001
y[i] = reshape(sin(f32(arange(N)) * 0.37) + 0.5, [N, 1]) * s[i]
g[i] = sum(y[i], 0)
out g, s
"""
    _, gen = generated("p.rtl", text)
    ref, rt, _, _, skipped = run_both(gen)
    assert not skipped
    for name in ("g", "s"):
        np.testing.assert_allclose(rt.value(name), ref.value(name), rtol=1e-6)
    assert "tl_x0_1 = (m_t1[(0LL)] +" not in cuda_gen(gen).text


def _bias_gradients_exact(rt):
    """BIAS_GRADIENTS' ``g`` and ``h`` made in float64 from the run's own ``x``, ``dy``,
    ``dz`` (outputs), and the bound a float32 evaluation in any order of its terms keeps
    to (each term's magnitude times the terms' count times float32's unit roundoff, twice
    over for the operands' rounding): (name -> (exact, bound))."""
    u = 2.0**-24
    x, dy, dz = (rt.value(n).astype(np.float64) for n in ("x", "dy", "dz"))
    g, gb = [], []
    for i in range(x.shape[0]):
        parts = [x[i].T @ dy[i], dy[i].sum(0), x[i].T @ dz[i], dz[i].sum(0)]
        mags = [abs(x[i]).T @ abs(dy[i]), abs(dy[i]).sum(0), abs(x[i]).T @ abs(dz[i])]
        mags.append(abs(dz[i]).sum(0))
        g.append(np.concatenate([p.ravel() for p in parts]))
        gb.append(np.concatenate([m.ravel() for m in mags]) * (x.shape[1] + 2) * u * 2)
    w = np.arange(8 * 16, dtype=np.float32) * np.float32(0.01) - np.float32(0.6)
    w = w.astype(np.float64).reshape(8, 16)
    b = (np.arange(16, dtype=np.float32) * np.float32(0.1)).astype(np.float64)
    # (tanh's slope is at most 1; and tanh itself rounds once)
    h = np.tanh(x @ w + b)
    hb = ((abs(x) @ abs(w) + abs(b)) * (8 + 2) * u * 2) + 4 * u
    return {"g": (np.stack(g), np.stack(gb)), "h": (h, hb)}


def _assert_within_bounds(rt, ref, rtol: float = 4e-6):
    """Both runs' ``g`` and ``h`` within float32's bound of the float64 values (a BLAS's
    order of terms is its own: NumPy's OpenBLAS changed it between releases, and ``h``'s
    8 terms cancel to a hundredth of their size), their ``s`` and ``gn`` the cpu's within
    ``rtol``."""
    for run in (rt, ref):
        for name, (exact, bound) in _bias_gradients_exact(run).items():
            err = abs(run.value(name).astype(np.float64) - exact)
            assert (err <= bound).all(), (name, float((err - bound).max()))
    for name in ("s", "gn"):
        np.testing.assert_allclose(rt.value(name), ref.value(name), rtol=rtol, atol=1e-6)


@needs_cxx
def test_bias_gradients_after_their_products_are_one_step():
    """A weight's gradient (a product of the device's BLAS: 80 columns, too wide for ours,
    ``cuda/products.py``) and its bias's (a sum over the rows into a temporary), twice: the
    second product moves ahead of the first sum (it touches nothing of it:
    ``render._Kernel._products_early``), and the two sums over the same rows are one loop,
    each block adding to its copy of both (``_arrays_joined``): one function after the two
    products, where there were two. Each block sums its rows of an element in a register,
    the block's threads as lanes of the rows where a row is narrow
    (``render._Kernel.array_in_registers``: a 2-wide sum), and the last block combines the
    blocks' copies likewise (``copies_by_lanes``: both sums' copies in one loop). A
    layer's bias and ``tanh`` are made by its product's function of ours as it stores C, or
    by a function after the BLAS's product (``render._Kernel._rows_epilogues``: its rows a
    nest, ``i`` and ``n``). The values are the cpu's."""
    _, gen = generated("p.rtl", src(BIAS_GRADIENTS))
    cu = cuda_gen(gen)
    launches = dict(cu.plan.kernels.launches)
    (g,) = [f for f in launches.values() if sum(isinstance(x, items.GemmCall) for x in f) == 2]
    assert [isinstance(f, items.GemmCall) for f in g] == [True, True, False], g
    (layer,) = [k for k in cu.kernels if any(isinstance(x, Gemm) and x.k == 8 for x in k.body)]
    (call,) = launches[layer.sid]  # (ours with the epilogue, or the BLAS's and then it)
    assert isinstance(call, items.GemmCall) and call.own and call.then
    assert "v_i = (r / 600LL), v_e1 = r % 600LL;" in cu.text
    # (each sum in a register of its thread; a 2-wide row's, the block's threads in lanes;
    # the blocks' copies combined by the last block's threads in lanes too)
    assert "tl_lanes" in cu.text and "tl_acc" in cu.text and "tl_cl" in cu.text
    # (the two sums' copies in one loop, an accumulator each: their loads go out together)
    assert re.search(r"tl_c \+= tl_cl\) \{\n.*\n\s*tl_v0 = .*\n\s*tl_v1 = ", cu.text)
    ref, rt, _, _, _ = run_both(gen)
    # (the products' terms summed in another order than the cpu's BLAS: our kernels' on
    # the emulation, cuda/products.py; float32 sums of 600 terms near 1e7)
    _assert_within_bounds(rt, ref)


@needs_cxx
@pytest.mark.parametrize("policy", ["ours", "blas"])
@pytest.mark.parametrize("w", [16, 1])
def test_bias_gradients_ride_on_their_weight_gradients_products(policy, w, monkeypatch):
    """Where the weight's gradient is a gram of ours (16 columns: ``x^T @ dy`` over 600
    rows, two copies, added in its part function), its bias's gradient (``sum(dy, 0)``:
    float64 sums into a temporary,
    its zeros before it) is made by the same pass (``render._Kernel._gram_sums``): the
    threads of the first row of tiles add the dy they read, in float64. The product keeps
    its BLAS call, the zeros and the sum one function after it (``GemmCall.then``: the
    sum's reduce step, whose last block makes the zeros first and combines the copies),
    chosen at run time (``ours``: no BLAS call; ``blas``: no function of ours); the sums'
    cast to float32 after them runs in the last block of either way's last function
    (``_sums_tail``). The values are the cpu's either way. Of one column too (a value
    head's: ``sum(dy, 0)`` a scalar's zeros, reduction and cast, without the loop over the
    one column, ``shapes._one_column`` gives them; ``s`` then within 3e-5: the sum of ``g``,
    whose float32 products each way sum in their own order, ``gn`` ``s`` times 1,200)."""
    monkeypatch.setenv("TIMERLC_PRODUCTS", policy)
    monkeypatch.setattr(render, "CHAINS", False)  # (a chain's grams: test_cuda_chains.py)
    text = src(BIAS_GRADIENTS).replace("W = 80", f"W = {w}")
    _, gen = generated("p.rtl", text)
    cu = cuda_gen(gen)
    # (each gram with its column sums a blas step of its own; the sum it stands for, its
    # reduce step, among the kernel's no more: in the steps after the BLAS's)
    grams = []
    for k in cu.kernels:
        steps = render._Kernel(k)._steps()
        got = [st for st in steps if st.kind == "blas" and st.own and st.own.acc]
        for st in got:
            assert [x.kind for x in st.after[:3]] == ["parallel", "reduce", "parallel"], k.name
            # (and the cast of its sums after them: the sum function's last block's too)
            assert st.own.tail and st.after[3:] == st.own.tail, k.name
            grams.append(st.own.acc)
        if got:
            assert [st.kind for st in steps if st.kind == "reduce"] == [], k.name
    assert len(grams) == 2, grams  # (dy's and dz's)
    calls = [
        f
        for _, phases in cu.plan.kernels.launches
        for f in phases
        if isinstance(f, items.GemmCall)
        and f.then
        and products.form(f.dtype, f.m, f.n, f.k, f.a.t, f.b.t) == "gram"
    ]
    assert len(calls) == 2 and all(len(c.then) == 1 for c in calls)  # (one function after)
    # (two copies, added in the part function: products.merged, its tickets' last block)
    for c in calls:
        assert products.merged(c.m, c.n, c.k) and [f[-1] for f, _ in c.own] == ["p"]
    assert "tl_s[j] += (double)tl_b[j];" in cu.text and "tl_pd" in cu.text
    ref, rt, _, _, _ = run_both(gen)
    assert (rt.blas_calls > 0) == (policy == "blas")
    _assert_within_bounds(rt, ref, 4e-6 if w > 1 else 3e-5)


def test_sums_over_one_range_that_need_nothing_between_are_one_step():
    """Two reductions into locals over a grid's worth of terms, over one range, the second
    needing nothing computed between them (a gradient norm's sums of squares of two
    weights): one loop, each thread adding to both accumulators, one launch
    (``render._reductions_joined``); the blocks' sums combined by every thread of the last
    block, a tree in shared memory (``_Kernel.combined_by_block``); the same values as the
    cpu."""
    text = """
    config I = 3, N = 64
    dim i < I
    w[0] = reshape(f32(arange(N * N)) * 0.001, [N, N])
    w[i+1] = w[i] * 0.5 + 0.001 * s[i]
    u[0] = reshape(f32(arange(N * N)) * 0.002 - 1.0, [N, N])
    u[i+1] = u[i] * 0.25 + 0.01 * s[i]
    s[i] = sqrt(sum(w[i] * w[i]) + f32(i) * 0.5 + sum(u[i] * u[i]))
    r[0] = 0.0
    r[i] = r[i-1] * 0.5 + sum(u[i] * 2.0)
    out s, r
    """
    _, gen = generated("p.rtl", src(text))
    cu = cuda_gen(gen)
    sums = [
        k for k in cu.kernels if sum(1 for x in k.body if isinstance(x, For) and x.reduce) == 2
    ]
    assert len(sums) == 1 and len(dict(cu.plan.kernels.launches)[sums[0].sid]) == 1
    # (the blocks' results combined by the last block's threads, a tree; one under the
    # guard of a merge's branch, r's sum: its shared memory outside the guard)
    assert "tl_cmb" in cu.text
    assert re.search(r"if \(.*\) \{\n\s+const long long tl_nb", cu.text)
    ref, rt, _, _, _ = run_both(gen)
    np.testing.assert_allclose(rt.value("s"), ref.value("s"), rtol=1e-6)
    # (a sum in a branch of a merge: its combination under the branch's guard)
    np.testing.assert_allclose(rt.value("r"), ref.value("r"), rtol=1e-6)


def test_sums_of_a_run_on_one_thread_are_its_block_s():
    """Sums of fewer terms than a grid's worth (``render.GRID_TERMS``) in a run on one
    thread, of at least ``render.BLOCK_TERMS`` terms over loops of constant bounds (a
    gradient norm's sums of squares of small weights): the block's threads take the terms,
    a tree in shared memory combines them, thread 0 goes on (``_Kernel.block_sums``); one
    of 8 terms stays thread 0's. The same values as the cpu."""
    text = """
    config I = 3, N = 10
    dim i < I
    w[0] = reshape(f32(arange(N * N)) * 0.01, [N, N])
    w[i+1] = w[i] * 0.5 + 0.001 * s[i]
    u[0] = f32(arange(80)) * 0.02 - 0.7
    u[i+1] = u[i] * 0.25 + 0.01 * s[i]
    v[0] = f32(arange(8)) * 0.1
    v[i+1] = v[i] * 0.5
    s[i] = sqrt(sum(w[i] * w[i]) + sum(u[i] * u[i]) + sum(v[i] * v[i]))
    out s
    """
    _, gen = generated("p.rtl", src(text))
    cu = cuda_gen(gen)
    assert render.BLOCK_TERMS <= 80 < render.GRID_TERMS
    assert "tl_bs0_0" in cu.text and "tl_bs1_0" in cu.text and "tl_bs2_0" not in cu.text
    assert re.search(r"tl_g < 100LL; tl_g \+= blockDim\.x", cu.text)  # (w's nest: one loop)
    ref, rt, _, _, _ = run_both(gen)
    np.testing.assert_allclose(rt.value("s"), ref.value("s"), rtol=1e-6)


def test_a_kernel_s_count_of_functions_is_kept_by_the_kernel_and_the_settings(monkeypatch):
    """``render.functions`` (the fusion search's cost: a kernel rendered but for its text)
    is worked out once a kernel and renderer's settings (``_COUNTS``): asked again, the
    same count from the table; with a setting changed (``TAIL_THREADS`` 0: the small steps
    after a reduction no longer its last block's, functions of their own) the count worked
    out again, as ``_functions`` makes it."""
    _, gen = generated(PROGRAMS / "ppo.rtl", **SMALL["ppo"])
    cu = cuda_gen(gen)
    kernels = list(cu.kernels) + list(cu.fused)
    monkeypatch.setattr(render, "_COUNTS", {})
    counts = [render.functions(k) for k in kernels]
    kept = len(render._COUNTS)
    assert 0 < kept <= len(kernels)
    assert [render.functions(k) for k in kernels] == counts and len(render._COUNTS) == kept
    monkeypatch.setattr(render, "TAIL_THREADS", 0)
    apart = [render.functions(k) for k in kernels]
    assert len(render._COUNTS) == 2 * kept
    assert apart == [render._functions(k, True) for k in kernels]
    assert any(a > c for a, c in zip(apart, counts)) and all(a >= c for a, c in zip(apart, counts))
