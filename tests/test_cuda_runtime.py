"""The cuda backend without a GPU: ``timerlc compile --backend cuda`` writes the CUDA C of a
build (which nvcc compiles), ``--backend cuda`` says in one line why it cannot run here, and
the device runtime (``timerlc/runtime/cuda.py``) runs plans on the emulated device
(``cuda-emu``), whose memory is its own: a value the runtime forgets to copy between the
host and the device, a buffer it forgets to zero or a table entry it forgets to update gives
wrong values here, as it would on a GPU."""

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
from rtl_helpers import cli, compiled_run, refuses_changed_plans, src, timerlc_cmd
from test_cuda import _nvcc

from timerlc.codegen import kir
from timerlc.codegen.generate import generate, listing
from timerlc.compiler import compile_plan, run_passes
from timerlc.cuda import nvrtc, prelude, render
from timerlc.cuda.emu import compiler
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.plan import arena, items
from timerlc.reference.interpreter import outputs, run_graph
from timerlc.runtime import cuda
from timerlc.runtime.cpu import CpuRuntime
from timerlc.runtime.cuda import DeviceRuntime, DeviceUnavailable, EmuDevice

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "programs"
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler")
SMALL_REINFORCE = ("--set", "I=3", "--set", "B=4", "--set", "T=16")


def graph_of(text: str, **sets):
    return check_source(Source("p.rtl", src(text)), overrides={k: str(v) for k, v in sets.items()})


def same_outputs(a, b, names, rtol=1e-5, atol=1e-6):
    for name in names:
        x, y = a.value(name), b.value(name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        if x.dtype.kind == "f":
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, equal_nan=True, err_msg=name)
        else:
            np.testing.assert_array_equal(x, y, err_msg=name)


def gpu_here() -> bool:
    try:
        cuda.CupyDevice()
        return True
    except DeviceUnavailable:
        return False


# ----------------------------------------------------------------------------- the command line
def test_compile_for_cuda_writes_the_cuda_kernels_of_the_build(tmp_path):
    out = tmp_path / "build"
    r = cli("compile", PROGRAMS / "ppo.rtl", "--backend", "cuda", "-o", out)
    assert r.exit_code == 0, r.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert plan["kernels"]["file"] == "kernels/cuda.cu"
    assert plan["kernels"]["trees"] == []
    assert len(plan["kernels"]["statements"]) > 100
    text = (out / "kernels" / "cuda.cu").read_text()
    assert text.startswith(items.CUDA_KERNELS_HEADER)
    launches = plan["kernels"]["launches"]
    assert [r[0] for r in launches] == [r[0] for r in plan["kernels"]["statements"]]
    functions = [f for _, phases in launches for f in phases if isinstance(f, list)]
    # (and a product's kernels of ours, cuda/products.py, what runs after the BLAS's, the
    # TF32 ones, a gram's second its float32 one's, and the joint ones of two products)

    def ours(g: dict) -> list:  # (and a chain's functions: render._Kernel._chains)
        if "chain" in g:
            return g["chain"]["functions"] + g["chain"].get("tf32", [])
        return [f for key in ("own", "then", "tf32", "joint") for f in g["gemm"].get(key, [])]

    functions += [f for _, ph in launches for g in ph if isinstance(g, dict) for f in ours(g)]
    # fused kernels (codegen.fuse: calls one after another at the same loop values)
    fused = plan["kernels"]["fused"]
    assert len(fused) >= 10 and len(plan["kernels"]["fused_launches"]) == len(fused)
    for _, phases in plan["kernels"]["fused_launches"]:
        functions += [f for f in phases if isinstance(f, list)]
        functions += [f for g in phases if isinstance(g, dict) for f in ours(g)]
    # loop kernels (cuda/loops.py): the rollout's loop, GAE's and the returns' each one
    loops = plan["kernels"]["loops"]
    assert len(loops) == 3 and [75, 76, 77] == [s for s in loops[0][0] if s in (75, 76, 77)]
    assert text.count("__global__ void tl_loop_") == len(loops)
    names = {f[0] for f in functions}
    assert text.count("__global__ void") == len(names) + len(loops) + 1  # (and tl_set_shift)
    calls = [f["gemm"] for _, ph in launches for f in ph if isinstance(f, dict) and "gemm" in f]
    # the products: the BLAS's, every one with kernels of ours too (all skinny)
    assert calls and all(c["dtype"] == "f32" and c["own"] for c in calls)
    # no machine code: the device's compiler makes it where the build runs
    assert sorted(p.name for p in (out / "kernels").iterdir()) == ["cuda.cu"]
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (TIMERLC_REQUIRE_NVCC=1 makes this a failure)")
    cu = str(out / "kernels" / "cuda.cu")
    cmd = [nvcc, "-cubin", "-x", "cu", cu, "-o", str(tmp_path / "k.cubin")]
    # (sm_90, the text an H100's run with TF32 products and no profile compiles: each
    # program's whole module compiles for sm_80 in tests/test_cuda.py, the covered
    # statements' kernels among them, half of PPO's text; at nvcc's fastest compile, as
    # there: every instruction still checked, the optimizing compile is the GPU driver's
    # of NVRTC's PTX)
    cmd += ["--fmad=false", "-gencode", "arch=compute_90,code=sm_90", f"-D{nvrtc.FUSED_ONLY}"]
    cmd += ["-Ofc", "max"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning" not in r.stderr, r.stderr[-3000:]


def test_run_on_cuda_where_it_cannot_run_is_one_line_and_exit_2(tmp_path, monkeypatch):
    def no_gpu(self, matmul="float32"):
        raise DeviceUnavailable("no CUDA device (cudaErrorNoDevice)")

    monkeypatch.setattr(cuda.CupyDevice, "__init__", no_gpu)
    r = cli("run", PROGRAMS / "reinforce.rtl", "--backend", "cuda")
    assert r.exit_code == 2
    assert r.stderr == (
        "timerlc: error: the cuda backend cannot run here: no CUDA device (cudaErrorNoDevice)\n"
    )
    out = tmp_path / "build"
    assert (
        cli("compile", PROGRAMS / "reinforce.rtl", "--backend", "cuda", "-o", out).exit_code == 0
    )
    r = cli("run", out)  # a build for cuda runs on cuda
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "cuda backend cannot run" in r.stderr


def test_a_plan_just_compiled_that_the_runtime_refuses_is_an_internal_error(monkeypatch):
    """``timerlc run FILE.rtl``: a plan the compiler just made that the runtime refuses is
    the compiler's error, not the user's: a failure while running (exit 3, one line, no
    traceback: LANGUAGE.md's exit statuses), where it was a traceback (a product's operand
    refused, attention at B=1 on cuda-emu)."""
    from timerlc import runner

    def refuse(*args, **kwargs):
        raise items.PlanError("the plan is not valid: refused here")

    monkeypatch.setattr(runner, "run_plan", refuse)
    r = cli("run", PROGRAMS / "returns.rtl", "--no-progress")
    assert r.exit_code == 3
    assert r.stderr == "timerlc: run failed: internal error: the plan is not valid: refused here\n"


@pytest.mark.skipif(gpu_here(), reason="a GPU is here")
def test_run_on_cuda_on_this_machine_without_a_gpu_says_why(tmp_path):
    r = subprocess.run(
        timerlc_cmd() + ["run", str(PROGRAMS / "reinforce.rtl"), "--backend", "cuda"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("timerlc: error: the cuda backend cannot run here: ")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_a_build_runs_only_on_the_backend_it_was_compiled_for(tmp_path):
    for backend, other in (("cpu", "cuda-emu"), ("cuda", "cpu")):
        out = tmp_path / backend
        r = cli("compile", PROGRAMS / "returns.rtl", "--backend", backend, "-o", out)
        assert r.exit_code == 0, r.stderr
        r = cli("run", out, "--backend", other)
        assert r.exit_code == 2
        assert f"was compiled for the {backend} backend" in r.stderr, r.stderr
        assert f"compile the program again with --backend {other}" in r.stderr


@needs_cxx
def test_cuda_emu_runs_a_build_as_the_cpu_backend_does(tmp_path):
    out = tmp_path / "build"
    r = cli(
        "compile", PROGRAMS / "reinforce.rtl", "--backend", "cuda", *SMALL_REINFORCE, "-o", out
    )
    assert r.exit_code == 0, r.stderr
    r = cli("run", out, "--backend", "cuda-emu", "--metrics", tmp_path / "emu.csv")
    assert r.exit_code == 0, r.stderr
    assert "device runtime:" in r.stderr and "launches" in r.stderr
    # (the emulation's module kept in the build, as the cpu's machine code: the next run
    # loads it)
    (kept,) = (out / "kernels").glob("emu-*.so")
    stamp = kept.stat().st_mtime_ns
    # one line, with the calls replayed from CUDA graphs; then which products ran as our
    # kernels (the emulation's policy: all of them)
    r = cli("run", out, "--backend", "cuda-emu", "--no-progress")
    assert r.exit_code == 0, r.stderr
    # (and which chains ran as one function, and which products outside them ran as
    # ours: the emulation's policy, all of them; REINFORCE's products all in chains)
    line, chains, *products = r.stderr.splitlines()
    assert re.fullmatch(r"  chains: (\d+) of \1 ran as one function, 0 as the launches .*", chains)
    for got in products:
        assert re.fullmatch(
            r"  products of (\d+) shapes with kernels of ours: \1 ran as ours, 0 as the "
            r"BLAS's \(ours\)",
            got,
        )
    assert re.search(r"device runtime: .* launches .* \(\d+ of them replayed from \d+ CUDA", line)
    assert re.search(r"device peak .* \(\d+ bytes\)", line)  # (what bench.py reads)
    assert line.endswith("; the kernels' module loaded, not compiled")
    assert kept.stat().st_mtime_ns == stamp
    # --profile: the device's seconds per statement (the emulation's: its launches' own
    # time), from the whole module (each statement's kernel: a compile of its own, kept)
    r = cli("run", out, "--backend", "cuda-emu", "--profile")
    assert r.exit_code == 0, r.stderr
    assert "s in the statements' launches" in r.stderr and "  device s " in r.stderr
    assert "kernels' scratch" in r.stderr
    assert len(list((out / "kernels").glob("emu-*.so"))) == 2
    r = cli("run", PROGRAMS / "reinforce.rtl", *SMALL_REINFORCE, "--metrics", tmp_path / "cpu.csv")
    assert r.exit_code == 0, r.stderr
    emu = (tmp_path / "emu.csv").read_text().splitlines()
    cpu = (tmp_path / "cpu.csv").read_text().splitlines()
    assert len(emu) == len(cpu) > 3
    for a, b in zip(emu[1:], cpu[1:]):
        *ka, va = a.split(",")
        *kb, vb = b.split(",")
        assert ka == kb and math.isclose(float(va), float(vb), rel_tol=1e-4, abs_tol=1e-5), (a, b)


SMALL_PROGRAM = "dim k < 4\ny[k] = f32(k) * 2.0\nout y\n"


@needs_cxx
def test_an_emulated_module_that_cannot_be_kept_is_compiled_in_a_temporary_folder(tmp_path):
    """A folder the emulation cannot write (here a file, as a read-only build's kernels/
    would be to another user): the module is compiled in a temporary folder and runs; where
    it can write, a second load of the same text finds the library."""
    from timerlc.cuda.emu import EmuModule

    text = generate(compile_plan(run_passes(graph_of(SMALL_PROGRAM))), "cuda").text
    blocked = tmp_path / "file"
    blocked.write_text("")
    module = EmuModule(text, blocked)
    assert not module.cached and module.function("tl_set_shift")
    assert EmuModule(text, tmp_path / "kept").cached is False
    assert EmuModule(text, tmp_path / "kept").cached is True


# ----------------------------------------------------------------------------- the device runtime
PLUGIN = """
config B = 3, T = 8
dim b < B
dim t < T
env E = "env_plugins:make_counter?scale=0.5&every=4" batch b
o[b, 0] = E.reset()
h[b, t] = tanh(o[b, t] * 2.0) + 0.1 * f32(t)
a[b, t] = i32(sum(h[b, t]) * 3.0) % 3
o[b, t+1], r[b, t], d[b, t] = E.step(a[b, t])
g[b, t] = r[b, t] * 2.0 + sum(h[b, t])
out o, r, d, h, a, g
"""


@needs_cxx
def test_values_cross_between_the_host_and_the_device_where_a_plugin_runs():
    """The plugin's steps run on the host between the kernels: its observations and rewards
    are copied up before the kernels that read them (only the step's point of each buffer:
    the batch's values at that step), the actions down before it reads them; every value
    is the cpu backend's and the reference's."""
    graph = graph_of(PLUGIN)
    rt, gen = compiled_run(graph, backend="cuda-emu")
    plan = gen.plan
    env_calls = [s for s in plan.statements if s.node.op.startswith("env_")]
    kernels = {sid for sid, _, _ in plan.kernels.statements}
    assert env_calls and not {s.id for s in env_calls} & kernels and len(kernels) >= 3
    points = 0  # the bytes of the points the plugin's calls write
    for s in env_calls:
        buf = plan.buffer(s.id)
        calls = math.prod(buf.box[s.dims.index(d)] for d in s.loops)
        itemsize = {"f32": 4, "f64": 8, "i32": 4, "i64": 8, "bool": 1}
        points += calls * sum(math.prod(o.shape) * itemsize[o.dtype] for o in buf.outputs)
    assert rt.uploaded == points and rt.downloaded > 0
    cpu, _ = compiled_run(graph, backend="cpu")
    names = ("o", "r", "d", "h", "a", "g")
    same_outputs(rt, cpu, names)
    want = outputs(run_graph(graph))
    for name in names:
        np.testing.assert_allclose(rt.value(name), want[name], rtol=1e-5, atol=1e-6)
    rt.envs.close()
    cpu.envs.close()


@needs_cxx
def test_swaps_under_a_memory_budget_take_buffers_off_the_device_and_back():
    graph = check_source(Source("swaps.rtl", (ROOT / "tests/programs/swaps.rtl").read_text()), {})
    budget = int(2.5 * (1 << 20))
    rt, gen = compiled_run(graph, backend="cuda-emu", memory_budget=budget)
    assert any(isinstance(it, items.SwapOut) for it in gen.plan.tree)
    assert rt.swapped == 2 and rt.host_bytes == 0
    assert rt.layout is None  # (swaps: a buffer's memory per allocation, not the arena)
    # the swapped blocks came back through the host: their device memory was released
    assert rt.uploaded >= 2 << 20
    cpu, _ = compiled_run(graph, backend="cpu")
    same_outputs(rt, cpu, ("fin", "la", "lb", "lc"))


DONATE = """
config N = 7
dim n < N
x[n] = f32(n) * 2.0 + 1.0
y[n] = x[N - 1 - n] * 3.0
z[n] = y[(n + 1) % N] - 1.0
out z
"""


@needs_cxx
def test_a_donation_hands_the_donor_s_device_memory_to_the_statement():
    graph = graph_of(DONATE)
    rt, gen = compiled_run(graph, backend="cuda-emu")
    assert any(b.donor is not None for b in gen.plan.buffers) and rt.donated
    cpu, _ = compiled_run(graph, backend="cpu")
    same_outputs(rt, cpu, ("z",))
    np.testing.assert_allclose(rt.value("z"), outputs(run_graph(graph))["z"])


DONATE_PRODUCT = """
config R = 6, C = 65
w = reshape(sin(f32(arange(C * C)) * 0.3), [C, C])
x = reshape(cos(f32(arange(R * C)) * 0.7), [R, C])
y = x @ w
out y
"""


@needs_cxx
def test_a_product_reads_its_statement_s_donor():
    """A statement whose product (the device's BLAS: 65 columns) reads the buffer that
    donates its memory to the statement: the donor's values are there until the statement
    writes its own, its table entry the same address. The product's operand is looked up
    through the donation (it was refused as a table entry that holds no buffer: attention
    at B=1). The cpu backend's values."""
    graph = graph_of(DONATE_PRODUCT)
    rt, gen = compiled_run(graph, backend="cuda-emu")
    x = next(b.id for b in gen.plan.buffers if b.name == "x")
    donee = next(b for b in gen.plan.buffers if b.donor == x)
    kernels = dict(gen.plan.kernels.launches)
    assert any(isinstance(f, items.GemmCall) for f in kernels[donee.id])
    assert rt.donated.get(donee.id) == x
    cpu, _ = compiled_run(graph, backend="cpu")
    same_outputs(rt, cpu, ("y",))


@needs_cxx
def test_a_planned_donation_that_does_not_happen_is_refused_in_the_arena():
    """The arena gives a donee its donor's bytes: a donee allocated while its donor still
    holds them (read before its statement's call, so without the donation) would have the
    donor's values overwrite its own, and the donor's free poison them. Refused instead."""
    graph = graph_of(DONATE)
    gen = generate(compile_plan(run_passes(graph)), "cuda")
    donee = next(b for b in gen.plan.buffers if b.donor is not None)
    rt = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice())
    assert rt.layout is not None
    rt.written(donee.donor)
    with pytest.raises(RunError, match="was to take the memory of buffer"):
        rt.read(donee.id)


@needs_cxx
def test_the_device_s_memory_is_zeroed_where_no_statement_writes():
    """A GPU's fresh memory holds garbage (the emulated device's is poisoned): points
    outside an output's domain still read 0."""
    text = "config K = 6\ndim k < K\nx[k] = f32(k) + 1.0\ny[k] = x[k] * 2.0 when k >= 3\nout y\n"
    rt, _ = compiled_run(graph_of(text), backend="cuda-emu")
    np.testing.assert_array_equal(rt.value("y"), [0, 0, 0, 8.0, 10.0, 12.0])
    dev = EmuDevice()
    ptr = dev.alloc(16)
    host = np.ones(16, np.uint8)
    dev.download(ptr, host)
    assert (host == EmuDevice.POISON).all()


@needs_cxx
def test_a_kernel_that_fails_on_the_device_is_explained_by_the_interpreter():
    text = "config K = 5\ndim k < K\nx[k] = f32(k)\ny[k] = take(x[0:K], 3 * k)\nout y\n"
    graph = graph_of(text)
    with pytest.raises(RunError) as got:
        compiled_run(graph, backend="cuda-emu")
    with pytest.raises(RunError) as want:
        compiled_run(graph, backend="cpu")
    assert str(got.value) == str(want.value) and "k=2" in str(got.value)


@needs_cxx
def test_a_plan_with_llvm_kernels_is_refused_by_the_device_runtime():
    graph = graph_of("config K = 3\ndim k < K\ny[k] = f32(k)\nout y\n")
    _, gen = compiled_run(graph, backend="cpu")
    with pytest.raises(items.PlanError, match="not CUDA C"):
        DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice())


@needs_cxx
def test_the_device_runtime_releases_its_memory_as_the_plan_frees():
    rt, _ = compiled_run(graph_of(DONATE), backend="cuda-emu")
    held = sum(len(p) for p in rt.dev.values())
    assert held == sum(1 for b in rt.buffers.values() if b is not None)
    before = rt.device_bytes
    rt.close()
    assert rt.device_bytes == 0 < before and not rt.dev


@pytest.mark.parametrize("name", sorted(p.stem for p in PROGRAMS.glob("*.rtl")))
def test_the_arena_gives_buffers_that_live_at_once_bytes_of_their_own(name):
    """``plan.arena.layout``: every buffer's outputs aligned, inside the arena, and apart
    from every other buffer's that lives at the same time (a donee shares its donor's; a
    buffer whose values live within an iteration of a top-level loop lives there, and two
    such of one loop may share bytes: their order within the iteration is the layout's,
    checked by the runs on the emulation); the arena no larger than the peak of the live
    buffers here (they pack without holes), below the plan's where buffers share a loop."""
    from timerlc.compiler import compile_source

    path = PROGRAMS / f"{name}.rtl"
    _, plan, _ = compile_source(Source(str(path), path.read_text()), {}, backend="cuda-emu")
    lay = arena.layout(plan)
    assert lay is not None and lay.size == lay.peak
    assert lay.peak >= plan.memory_peak or lay.local
    first, last, loop_of = {}, {}, {}
    for j, it in enumerate(plan.tree):
        if isinstance(it, items.Free):
            for sid in it.buffers:
                last[sid] = j
        for c in items.walk([it]):
            if isinstance(c, items.Call):
                for sid in {c.statement} | {
                    r.src for n in plan.statement(c.statement).nodes for r in n.inputs if r.stored
                }:
                    first.setdefault(sid, j)
                    loop_of.setdefault(sid, j)
    for sid in lay.local:  # (within its loop's item)
        first[sid], last[sid] = loop_of[sid], loop_of[sid] + 1
    spans = []
    for b in plan.buffers:
        for off, n in zip(lay.offsets[b.id], arena.output_bytes(plan, b.id)):
            assert off % arena.ALIGN == 0 and off + n <= lay.size
            spans.append((b.id, off, off + n, first.get(b.id, len(plan.tree)), last.get(b.id)))
    donors = {(b.id, b.donor) for b in plan.buffers if b.donor is not None}
    # (and buffers in one's memory: the same bytes, by design)
    donors |= {
        (a.id, b.id)
        for a in plan.buffers
        for b in plan.buffers
        if a.id != b.id and plan.storage_of(a.id) == plan.storage_of(b.id)
    }
    for a, lo, hi, s, t in spans:
        for b, lo2, hi2, s2, t2 in spans:
            if a >= b or (a, b) in donors or (b, a) in donors:
                continue
            if a in lay.local and b in lay.local and loop_of[a] == loop_of[b]:
                continue
            live = (t is None or s2 < t) and (t2 is None or s < t2)
            assert not (live and lo < hi2 and lo2 < hi), (a, b)


def test_a_buffer_lives_apart_in_each_branch_of_an_if():
    """An iteration takes one branch of an ``if``: a buffer that both branches use (a
    weight's gradient, zeros at the last step, once the cuda build puts the calls between
    two ``if``s of one condition in both) lives in each from its uses there
    (``arena._path_lives``), its bytes another's in between (``first_fit`` with several
    spans); on a way that never writes it, its reads are not made and it does not live."""
    w1, r1, x, w2, r2, r3 = (items.Call(s, ("i",)) for s in (1, 2, 5, 1, 3, 4))
    # if c: [w1 (writes 1), r1 (reads 1), x (another)] else: [w2 (writes 1), r2 (reads 1)];
    # then if d: [] else: [r3 (reads 1)]
    body = [
        items.If(("lt", "i", 3), (w1, r1, x), (w2, r2)),
        items.If(("lt", "i", 5), (), (r3,)),
    ]
    at = {id(c): (k, k, k + 1) for k, c in enumerate((w1, r1, x, w2, r2, r3))}
    ids = {id(c) for c in (w1, r1, w2, r2)}
    lives = arena._path_lives(body, ids, {id(w1), id(w2)}, at)
    assert {(f, t) for f, t, wrote in lives if wrote} == {(0, 2), (3, 5)}
    # read at r3 too: the ways through the second if (its else reads it) stretch both
    lives = arena._path_lives(body, ids | {id(r3)}, {id(w1), id(w2)}, at)
    assert {(f, t) for f, t, wrote in lives if wrote} == {(0, 2), (3, 5), (0, 6), (3, 6)}
    # a way that reads but never writes it: no life there
    lives = arena._path_lives([items.If(("lt", "i", 3), (w1, r1), (r2,))], ids, {id(w1)}, at)
    assert {(f, t) for f, t, wrote in lives if wrote} == {(0, 2)}
    # two spans and one between them: the same bytes; one that meets a span: its own
    assert arena.first_fit([(256, ((0, 2), (3, 5))), (256, 2, 3)], 256) == [0, 0]
    assert arena.first_fit([(256, ((0, 2), (3, 5))), (256, 1, 4)], 256) == [0, 256]


@needs_cxx
def test_buffers_whose_values_live_within_an_iteration_share_bytes():
    """PPO's minibatch activations and their gradients are written and read within one
    step of the loop over the minibatches (``arena.iteration_local``): they share bytes
    where their uses in an iteration do not overlap, unzeroed (the emulation's arena starts
    as garbage: a read before a write would show), and the run is the cpu backend's."""
    from timerlc.compiler import compile_plan, generate_code

    sets = {"B": "8", "T": "16", "total_steps": "384"}
    path = PROGRAMS / "ppo.rtl"
    graph = check_source(Source(str(path), path.read_text()), overrides=sets)
    plan = compile_plan(run_passes(graph))
    lay = arena.layout(plan)
    assert len(lay.local) >= 8 and lay.size < plan.memory_peak
    offsets = [lay.offsets[sid][0] for sid in lay.local]
    assert len(set(offsets)) < len(offsets)  # (some share)
    # not local: a value read in a later iteration (the parameters, read by the next step
    # and the next rollout; the rollout's observations and advantages, by the minibatches)
    names = {b.id: b.name for b in plan.buffers}
    assert not {names[sid] for sid in lay.local} & {"net.pi_w1", "net.v_b3", "o", "adv"}
    got, want = [], []
    gen = generate_code(plan, target="cuda")
    rt = DeviceRuntime(gen.plan, lambda *m: got.append(m), text=gen.text, device=EmuDevice())
    rt.run()
    cpu = generate_code(plan)
    CpuRuntime(cpu.plan, lambda *m: want.append(m), native=cpu.text).run()
    assert [m[:2] for m in got] == [m[:2] for m in want]
    np.testing.assert_allclose([m[2] for m in got], [m[2] for m in want], rtol=1e-5, atol=1e-6)


def test_the_buffers_a_fused_kernel_touches_never_share_bytes():
    """A fused kernel computes its statements point by point (a point of the last is
    written before a later point of the first is read): the arena counts every call of the
    run as spanning the run, so no buffer its statements write shares bytes with one they
    read. (At B=16, T=16 a minibatch's index and the first layer's activations shared bytes,
    and the emulation crashed on the gathered index.)"""
    from timerlc.compiler import compile_plan, generate_code

    sets = {"B": "16", "T": "16", "total_steps": "768"}
    path = PROGRAMS / "ppo.rtl"
    graph = check_source(Source(str(path), path.read_text()), overrides=sets)
    gen = generate_code(compile_plan(run_passes(graph)), target="cuda")
    plan = gen.plan
    lay = arena.layout(plan)
    assert plan.kernels.fused and lay.local

    def extent(sid):
        return lay.offsets[sid][0], lay.offsets[sid][0] + sum(arena.output_bytes(plan, sid))

    def runs(body, called):
        """Each run of calls in ``body`` (a loop's, an if's branch) with the statements an
        iteration that makes it may call: the branch an if on its way does not take is
        left out (the cuda build puts the calls between two ifs of one condition in both;
        an iteration-local buffer that a way never writes does not live on it)."""
        for k, it in enumerate(body):
            if isinstance(it, items.Call):
                yield body[k:], called
            elif isinstance(it, items.If):
                for mine, other in ((it.then, it.orelse), (it.orelse, it.then)):
                    skip = {
                        c.statement for c in items.walk(list(other)) if isinstance(c, items.Call)
                    }
                    keep = {
                        c.statement for c in items.walk(list(mine)) if isinstance(c, items.Call)
                    }
                    yield from runs(mine, called - (skip - keep))
            elif isinstance(it, items.Loop):
                yield from runs(it.body, called)

    loops = [it for it in plan.tree if isinstance(it, items.Loop)]
    found = [
        found
        for loop in loops
        for found in runs(
            loop.body, {c.statement for c in items.walk([loop]) if isinstance(c, items.Call)}
        )
    ]
    checked = 0
    for parts in plan.kernels.fused:
        for tail, called in found:
            if [getattr(c, "statement", None) for c in tail[: len(parts)]] != list(parts):
                continue
            touched = set(parts)
            for sid in parts:
                touched |= {r.src for n in plan.statement(sid).nodes for r in n.inputs if r.stored}
            touched = {plan.storage_of(t) for t in touched}  # (one memory: one buffer)
            touched = sorted(
                t for t in touched if t in lay.offsets and (t not in lay.local or t in called)
            )
            for a in touched:
                for b in touched:
                    if a < b and plan.buffer(a).donor != b and plan.buffer(b).donor != a:
                        (a0, a1), (b0, b1) = extent(a), extent(b)
                        assert a1 <= b0 or b1 <= a0, (parts, a, b)
                        checked += 1
    assert checked > 20


@needs_cxx
def test_buffers_are_carved_from_one_arena_and_poisoned_when_freed(monkeypatch):
    """The device runtime allocates the arena once and carves each buffer out at its
    offset (``layout``); a freed buffer's bytes are poisoned, so a layout that put two live
    buffers in the same bytes gives wrong values (or a kernel fails on them): broken on
    purpose, it does."""
    graph = graph_of(REDUCTIONS)
    rt, _ = compiled_run(graph, backend="cuda-emu")
    assert rt.layout is not None and rt._carved
    assert rt.device_peak_bytes >= rt.layout.size >= rt.layout.peak
    cpu, _ = compiled_run(graph, backend="cpu")
    same_outputs(rt, cpu, ("c", "s", "m", "q"))
    real = arena.layout

    def overlapping(plan):
        lay = real(plan)
        return dataclasses.replace(lay, offsets={s: (0,) * len(o) for s, o in lay.offsets.items()})

    monkeypatch.setattr(arena, "layout", overlapping)
    with pytest.raises((AssertionError, RunError, items.PlanError)):  # wrong values, or a
        bad, _ = compiled_run(graph, backend="cuda-emu")  # kernel that fails on them
        same_outputs(bad, cpu, ("c", "s", "m", "q"))


@needs_cxx
def test_the_emulation_s_syncthreads_or_tells_every_thread_whether_any_said_so():
    """``__syncthreads_or`` on cuda-emu (a launch's first barrier: whether an earlier step
    failed, the block's threads agreeing): each round, every thread of each block gets 1
    where one thread passed a value not 0, else 0; rounds one after another (the
    emulation's slots by turns)."""
    text = (
        render.head()
        + """
extern "C" __global__ void k(void **table, const tl_args args_in, char *scratch, int *err,
                             const long long *shift) {
  int *out = (int *)table[0];
  for (int round = 0; round < 12; round++) {
    const long long who = (args_in.v[0] + round) % (blockDim.x + 2);
    const int any = __syncthreads_or(threadIdx.x == (unsigned)who);
    out[(blockIdx.x * 12 + round) * blockDim.x + threadIdx.x] = any;
  }
}
"""
    )
    dev = EmuDevice()
    fn = dev.function(dev.load(text), "k")
    threads = int(os.environ.get("TIMERLC_EMU_THREADS", "4"))
    out = dev.alloc(4 * 3 * 12 * threads)
    table = dev.alloc(8)
    dev.upload(table, np.array([out], np.uint64))
    first = max(threads - 3, 0)  # (rounds on both sides of the block's last thread)
    dev.launch(fn, table, np.array([first], np.int64), 0, 3)
    got = np.empty((3, 12, threads), np.int32)
    dev.download(out, got)
    want = [1 if (first + r) % (threads + 2) < threads else 0 for r in range(12)]
    assert (got == np.array(want, np.int32)[None, :, None]).all(), got[:, :, 0]
    assert 0 in want and 1 in want


@needs_cxx
def test_the_emulation_s_barriers_order_a_block_s_threads_and_show_a_missing_one():
    """cuda-emu's threads are fibers that run in turns between the block's barriers (first
    to last, then last to first): a read of another thread's write after a barrier sees it;
    without the barrier, the read runs before the write in one of the two directions, on
    every run alike (here: each thread reads its neighbour's value on both sides); a thread
    that returned counts as arrived at the barriers of the threads still running."""
    text = (
        render.head()
        + """
extern "C" __global__ void k(void **table, const tl_args args_in, char *scratch, int *err,
                             const long long *shift) {
  __shared__ int s[128];
  int *out = (int *)table[0];
  const unsigned t = threadIdx.x, n = blockDim.x;
  const int synced = args_in.v[0];
  s[t] = 0;
  __syncthreads();
  if (synced == 2 && t % 2 == 1) return;  // (odd threads leave; the rest meet twice more)
  s[t] = 1000 * (blockIdx.x + 1) + t;
  if (synced) __syncthreads();
  const int left = s[(t + n - 1) % n], right = s[(t + 1) % n];
  if (synced) __syncthreads();
  out[(blockIdx.x * n + t) * 2] = left;
  out[(blockIdx.x * n + t) * 2 + 1] = right;
}
"""
    )
    dev = EmuDevice()
    fn = dev.function(dev.load(text), "k")
    n = int(os.environ.get("TIMERLC_EMU_THREADS", "4"))
    if n < 2:
        pytest.skip("one thread a block: no other thread to order")
    out, table = dev.alloc(4 * 2 * 2 * n), dev.alloc(8)
    dev.upload(table, np.array([out], np.uint64))
    t = np.arange(n)
    value = lambda b, u: 1000 * (b + 1) + u
    want = np.stack(
        [np.stack([value(b, (t - 1) % n), value(b, (t + 1) % n)], -1) for b in range(2)]
    )
    got = np.zeros((2, n, 2), np.int32)
    for synced in (1, 0, 2):
        dev.upload(out, np.full((2, n, 2), -1, np.int32))
        dev.launch(fn, table, np.array([synced], np.int64), 0, 2)
        dev.download(out, got)
        if synced == 1:
            np.testing.assert_array_equal(got, want)
        elif synced == 0:
            # (each thread but the one that ran last ran before one of its neighbours
            # wrote, and read that one's 0)
            assert ((got[:, 1:, 0] == 0) | (got[:, 1:, 1] == 0)).all()
            again = np.zeros_like(got)
            dev.launch(fn, table, np.array([synced], np.int64), 0, 2)
            dev.download(out, again)
            np.testing.assert_array_equal(again, got)  # (the same on every run)
        else:  # (the even threads still meet and see every even thread's value)
            even = t % 2 == 0
            assert (got[:, ~even] == -1).all()
            left_even, right_even = ((t - 1) % n) % 2 == 0, ((t + 1) % n) % 2 == 0
            ok = got[:, even]
            np.testing.assert_array_equal(
                ok[:, left_even[even], 0], want[:, even][:, left_even[even], 0]
            )
            np.testing.assert_array_equal(
                ok[:, right_even[even], 1], want[:, even][:, right_even[even], 1]
            )


@needs_cxx
def test_the_emulation_runs_every_other_grid_s_blocks_last_to_first():
    """cuda-emu runs a grid's blocks one after another, and every other grid of the process
    last to first: a block that reads what another block of the same launch writes (a race
    on a GPU) sees the write in one launch and not in the next."""
    text = (
        render.head()
        + """
extern "C" __global__ void k(void **table, const tl_args args_in, char *scratch, int *err,
                             const long long *shift) {
  int *out = (int *)table[0], *seen = (int *)table[1];
  if (threadIdx.x == 0) {
    out[blockIdx.x] = 1;
    seen[blockIdx.x] = out[(blockIdx.x + 1) % gridDim.x];  // the next block's, raced
  }
}
"""
    )
    dev = EmuDevice()
    fn = dev.function(dev.load(text), "k")
    n = 5
    out, seen, table = dev.alloc(4 * n), dev.alloc(4 * n), dev.alloc(16)
    dev.upload(table, np.array([out, seen], np.uint64))
    forward = np.array([0, 0, 0, 0, 1], np.int32)  # (each block before the next one wrote)
    runs = []
    for _ in range(4):
        dev.upload(out, np.zeros(n, np.int32))
        dev.launch(fn, table, np.zeros(1, np.int64), 0, n)
        got = np.empty(n, np.int32)
        dev.download(seen, got)
        runs.append(got)
    orders = [(r == forward).all() or (r == 1 - forward).all() for r in runs]
    assert all(orders), runs
    for a, b in itertools.pairwise(runs):  # (one launch forward, the next backward)
        assert (a == 1 - b).all(), runs


# a grid of 3 blocks of 8 threads on the emulation's runtime alone: each thread's value,
# its right neighbour's after a barrier, and whether thread 5 said so
_FIBERS = r"""
#include <cstdio>
struct tl_dim3 { unsigned x, y, z; };
extern __thread tl_dim3 threadIdx, blockIdx;
extern "C" void tl_emu_sync();
extern "C" int tl_emu_sync_or(int);
extern "C" void tl_emu_run(unsigned, unsigned, void (*)(void *), void *);
static int s[8], out[3][8];
static void k(void *) {
  const unsigned t = threadIdx.x;
  s[t] = 100 * (blockIdx.x + 1) + t;
  tl_emu_sync();
  const int any = tl_emu_sync_or(t == 5 && blockIdx.x != 1);
  out[blockIdx.x][t] = s[(t + 1) % 8] + 10000 * any;
  tl_emu_sync();
}
int main() {
  tl_emu_run(3, 8, k, nullptr);
  for (int b = 0; b < 3; b++)
    for (int t = 0; t < 8; t++) std::printf("%d ", out[b][t]);
}
"""


@needs_cxx
@pytest.mark.parametrize("switch", ["own", "ucontext"])
def test_the_emulation_s_fibers_switch_alike_by_either_means(tmp_path, switch):
    """The emulation's runtime (``emu_rt.cc``) switches between a block's fibers by a few
    instructions of its own on x86-64 and by ucontext elsewhere (``TL_EMU_UCONTEXT`` makes
    an x86-64 build take ucontext's way, here): both run a grid's barriers alike."""
    from timerlc.cuda import emu

    main = tmp_path / "main.cc"
    main.write_text(_FIBERS)
    flags = ["-DTL_EMU_UCONTEXT"] if switch == "ucontext" else []
    exe = tmp_path / "fibers"
    subprocess.run(
        [compiler(), "-std=c++20", "-O1", "-pthread", *flags, str(main), str(emu.RUNTIME)]
        + ["-o", str(exe)],
        check=True,
        capture_output=True,
    )
    ran = subprocess.run([exe], capture_output=True, text=True, check=True)
    got = [int(x) for x in ran.stdout.split()]
    want = [
        100 * (b + 1) + (t + 1) % 8 + (10000 if b != 1 else 0) for b in range(3) for t in range(8)
    ]
    assert got == want


# thread 3 of each block meets its block's other threads at a barrier of its own
_DIVERGENT = r"""
struct tl_dim3 { unsigned x, y, z; };
extern __thread tl_dim3 threadIdx;
extern "C" void tl_emu_sync();
extern "C" void tl_emu_run(unsigned, unsigned, void (*)(void *), void *);
static int s[2];
static void k(void *) {
  if (threadIdx.x == 3) {
    s[0] = 1;
    tl_emu_sync();
  } else {
    tl_emu_sync();
    s[1] = 2;
  }
}
int main() { tl_emu_run(2, 8, k, nullptr); }
"""


@needs_cxx
def test_the_emulation_stops_where_a_block_s_threads_meet_at_different_barriers(tmp_path):
    """A block's threads that wait at barriers called from different places (a barrier in
    code that not every thread of the block runs: a GPU hangs or goes on as it likes)
    stop the emulation with a line that says so, where std::threads at one std::barrier
    went on as if they had met."""
    from timerlc.cuda import emu

    main = tmp_path / "main.cc"
    main.write_text(_DIVERGENT)
    exe = tmp_path / "divergent"
    subprocess.run(
        [compiler(), "-std=c++20", "-O0", "-pthread", str(main), str(emu.RUNTIME), "-o", str(exe)],
        check=True,
        capture_output=True,
    )
    ran = subprocess.run([exe], capture_output=True, text=True, check=False)
    assert ran.returncode != 0
    assert "the threads of block 0 of a launch of 2 blocks met at different barriers" in (
        ran.stderr
    )


def test_no_host_compiler_makes_cuda_emu_unavailable(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(DeviceUnavailable, match="no host C\\+\\+ compiler"):
        EmuDevice()


# ----------------------------------------------------------------------------- steps and grids
STEPS = """
config K = 1000
dim k < K
x[k] = sin(f32(k) * 0.01)
y[k] = x[k] - max(x[0:K]) + mean(x[0:K])
out y
"""


@needs_cxx
def test_a_kernel_s_steps_run_over_grids_of_several_blocks():
    """``y`` takes ``x``'s memory: its kernel computes the max and the mean once, each a
    reduction over the grid (1000 threads, each block's terms combined by a tree; the
    last block to finish computes the first term and combines the blocks' results, in the
    same launch), then every point into a temporary, then copies it into the buffer (1000
    threads each, over several blocks, the emulation's three, striding over the points):
    those two small steps, which cannot fail, run in the mean's last block too
    (``render.TAIL_THREADS``)."""
    graph = graph_of(STEPS)
    rt, gen = compiled_run(graph, backend="cuda-emu")
    (sid,) = [s.id for s in gen.plan.statements if gen.plan.buffer(s.id).name == "y"]
    assert gen.plan.buffer(sid).donor is not None
    phases = dict(gen.plan.kernels.launches)[sid]
    threads = (1000, 1000)
    assert tuple(n for _, n in phases) == threads and phases[0][0] == f"s{sid}"
    assert "(long long)gridDim.x * blockDim.x" in gen.text
    assert gen.text.count("tl_last = atomicAdd(tl_count(err), 1u)") >= 2
    cpu, _ = compiled_run(graph, backend="cpu")
    same_outputs(rt, cpu, ("y",))
    # (the last block set the tickets back to 0)
    record = np.zeros(cuda.ERR_WORDS, np.int64)
    rt.device.download(rt.device._err, record)
    assert not record[cuda.RECORD :].any()
    want = outputs(run_graph(graph))["y"]
    np.testing.assert_allclose(rt.value("y"), want, rtol=1e-5, atol=1e-6)


REDUCTIONS = """
config I = 4, N = 300, H = 5
dim i < I
dim n < N
x[n] = sin(f32(n) * 0.37 + f32(arange(H)))
m[0] = ones([H, H]) * 0.1
c[i] = sum(x[0:N] @ m[i], 0)
s[i] = sum(x[0:N] * x[0:N])
k[i] = max(i32(x[0:N] * 100.0))
lo[i] = min(x[0:N] * f32(i + 1))
pr[i] = prod(1.0 + x[0:N] * 0.001)
m[i+1] = m[i] + expand(c[i], 0) * 0.001 - x[0:N].T @ x[0:N] * 0.0001
q[0] = zeros([H, H])
q[i] = q[i-1] * 0.5 + x[0:N].T @ (x[0:N] * c[i-1]) * 0.001
out c, s, k, lo, pr, m, q
"""


def _phases(gen, name: str) -> tuple:
    """The threads of each step of the kernel that computes ``name`` (the longest of those
    of the statements with its name: an ``out`` tensor's copy has one too)."""
    launches = dict(gen.plan.kernels.launches)
    sids = [s.id for s in gen.plan.statements if gen.plan.buffer(s.id).name == name]
    return max((_threads(launches[sid]) for sid in sids), key=len)


def _threads(phases) -> tuple:
    """Each step's threads, ``"blas"`` for a product the device's BLAS computes."""
    return tuple("blas" if isinstance(f, items.GemmCall) else f[1] for f in phases)


@needs_cxx
def test_reductions_and_the_work_under_a_merge_s_conditions_run_on_the_grid():
    """A sum over all terms: its first value on one thread, the terms over the grid (a tree
    per block), the blocks' results added on one thread. A column sum (``sum(.., 0)``)
    into a temporary: the rows dealt to the blocks (a block a row, up to ``ARRAY_PARTS``),
    the columns to a block's threads, each block into a copy of its own, then the copies
    added per column (in groups of blocks first: the emulation's three, two groups).
    The gemm and the loops of a merge's branch (``q[i]`` at ``i >= 1``) are steps of their
    own under the branch's condition, not a serial run. Integer max, float min, prod: each
    with its identity. Same values as the cpu and the reference."""
    graph = graph_of(REDUCTIONS)
    rt, gen = compiled_run(graph, backend="cuda-emu")
    parts = 300 * render.THREADS
    # (the first value, the blocks' results and the small step after them: by the last
    # block; a thread per point of the nest, 300 x 5: render._flat_sum)
    assert _phases(gen, "s") == (1500,)
    assert _phases(gen, "k") == (1500,)
    # c: x @ m | the rows of terms, then, by the last block, its zeros (render._first_values),
    # the copies added, f32 and into c's buffer
    every = {_threads(phases) for _, phases in gen.plan.kernels.launches}
    assert ("blas", parts) in every
    # q: zeros at i = 0, else x * c (one launch: the loops of an if's two branches), then
    # x.T @ (..) and the update
    assert _phases(gen, "q") == (1500, "blas", 5)  # (x * c: a thread per element)
    (call,) = [f for _, ph in gen.plan.kernels.launches for f in ph if _guarded_call(f)]
    # (its kernels of ours ran: the emulation's policy)
    assert call.c.space == "scratch" and call.own and rt.product_choices[_key(call)][2]
    assert gen.text.count("tl_red_") and "% (2 * tl_s) == 0" in gen.text
    cpu, _ = compiled_run(graph, backend="cpu")
    names = ("c", "s", "k", "lo", "pr", "m", "q")
    same_outputs(rt, cpu, names)
    want = outputs(run_graph(graph))
    for name in names:
        np.testing.assert_allclose(rt.value(name), want[name], rtol=1e-5, atol=1e-6)


COLUMNS = """
config I = 3, N = 5000, H = 70
dim i < I
dim n < N
x[n] = sin(f32(n) * 0.37 + f32(arange(H)) * 0.11)
y[n] = cos(f32(n) * 0.21 + f32(arange(2)))
c[0] = ones([H])
c[i] = sum(sin(x[0:N] * c[i-1]), 0) * 0.001
d[0] = ones([2])
d[i] = sum(y[0:N] * d[i-1], 0) * 0.001 + sum(y[0:N] * y[0:N] * d[i-1], 0) * 0.002
out c, d
"""


@needs_cxx
@pytest.mark.parametrize("blocks", [1, 2, 3, 4, 10, 17])
def test_an_array_reduction_s_copies_are_combined_in_groups_of_blocks(monkeypatch, blocks):
    """A column sum's blocks (a copy of the sums each) in groups of about the square root
    of their number (``tl_group_size``: 3 blocks in groups of 2 and 1, 4 of 2 and 2, 10 of
    4, 4 and 2, 17 of 5, 5, 5 and 2; 1 and 2 blocks in none):
    the last block of each group to finish adds its group's copies into the group's
    first, and the last of those adds the groups' (``copies_by_lanes``). A
    70-wide row (wider than the emulation's blocks: a thread more than one column) and a
    2-wide one (lanes of the copies), two joined sums. The values of the cpu backend, the
    counters back at 0."""
    monkeypatch.setattr(EmuDevice, "MAX_BLOCKS", blocks)
    graph = graph_of(COLUMNS)
    rt, gen = compiled_run(graph, backend="cuda-emu")
    assert gen.text.count("tl_groups(err)") >= 2 * 2
    # (the 2-wide sums on ARRAY_PARTS blocks; the 70-wide on as many as PART_BYTES holds)
    every = {_threads(phases) for _, phases in gen.plan.kernels.launches}
    assert (4, render.ARRAY_PARTS * render.THREADS) in every  # (2 joined: 2 x 2)
    assert (70, render.PART_BYTES // (8 * 70) * render.THREADS) in every
    cpu, _ = compiled_run(graph, backend="cpu")
    same_outputs(rt, cpu, ("c", "d"))
    record = np.zeros(cuda.ERR_WORDS, np.int64)
    rt.device.download(rt.device._err, record)
    assert not record[cuda.RECORD :].any()
    want = outputs(run_graph(graph))
    for name in ("c", "d"):
        np.testing.assert_allclose(rt.value(name), want[name], rtol=1e-5, atol=1e-5)


@needs_cxx
def test_ppo_s_bias_gradients_on_groups_of_many_blocks_match_the_cpu(monkeypatch):
    """PPO (a quick run) on cuda-emu grids of 17 blocks: its array reductions (the bias
    gradients, joined in pairs) combined in groups of 5, 5, 5 and 2 blocks, then the groups'
    (``group_combine``), where the emulation's 3 blocks make groups of 2 and 1: the cpu
    backend's metrics, and the counters back at 0."""
    monkeypatch.setattr(EmuDevice, "MAX_BLOCKS", 17)
    path = Path(__file__).resolve().parent.parent / "programs" / "ppo.rtl"
    sets = {"B": "4", "T": "16", "total_steps": "128"}
    graph = check_source(Source(str(path), path.read_text()), overrides=sets)
    got, want = [], []
    rt, gen = compiled_run(graph, lambda *m: got.append(m), backend="cuda-emu")
    assert "tl_groups(err) + blockIdx.x / tl_gs" in gen.text
    compiled_run(graph, lambda *m: want.append(m), backend="cpu")
    assert [m[:2] for m in got] == [m[:2] for m in want]
    np.testing.assert_allclose([m[2] for m in got], [m[2] for m in want], rtol=1e-5, atol=1e-6)
    record = np.zeros(cuda.ERR_WORDS, np.int64)
    rt.device.download(rt.device._err, record)
    assert not record[cuda.RECORD :].any()


PERMUTATIONS = """
config I = 3, N = 1000
dim i < I
p[i] = permutation(N)
q[i] = permutation(3)
c[0] = 0
c[i] = c[i-1] + sum(permutation(N)[0:7])
d[0] = 0
d[i] = d[i-1] + sum(permutation(5000)[0:9])
out p, q, c, d
"""


@needs_cxx
def test_a_permutation_sorts_its_draws_on_the_grid(monkeypatch):
    """The merge sort (where a permutation would have more than ``PERM_BUCKETS`` buckets:
    none here): ``permutation(1000)`` in a kernel of its own (not one per point): its keys
    and the 10 passes of a merge sort by rank in one step (a block a tile of 2048 keys, its
    threads meeting between two passes), then the indices, then their copy into the
    buffer, steps over 1000 threads. ``permutation(5000)``: 3 tiles, 11 passes within them,
    then the 2 passes over the whole, each a step of its own. The same permutations as the
    cpu's and the reference's, bit for bit."""
    monkeypatch.setattr(render, "PERM_BUCKETS", 0)
    graph = graph_of(PERMUTATIONS)
    rt, gen = compiled_run(graph, backend="cuda-emu")
    every = {_threads(phases) for _, phases in gen.plan.kernels.launches}
    tile = render.THREADS
    assert (tile, 1000, 1000) in every
    assert (3 * tile, 5000, 5000, 5000, 5000) in every
    cpu, _ = compiled_run(graph, backend="cpu")
    same_outputs(rt, cpu, ("p", "q", "c", "d"))
    want = outputs(run_graph(graph))
    for name in ("p", "q", "c", "d"):
        np.testing.assert_array_equal(rt.value(name), want[name])


PERMUTATIONS_WIDER = (
    PERMUTATIONS.replace("out p, q, c, d", "")
    + """
e[0] = 0
e[i] = e[i-1] + sum(permutation(20000)[0:5])
out p, q, c, d, e
"""
)


@needs_cxx
@pytest.mark.parametrize("cap", [4096, 256])
def test_a_permutation_sorts_its_draws_by_buckets(monkeypatch, cap):
    """A permutation's keys by their draws' top bits into buckets of about ``PERM_BUCKET``
    (``render._Kernel.perm_buckets``), four steps: each chunk of ``PERM_CHUNK`` keys
    counted a bucket (a block a chunk), the places (one block), the keys scattered (a block
    a chunk), each bucket sorted in shared memory (a block a bucket) and the indices out.
    ``permutation(1000)``: one bucket, one chunk; ``permutation(5000)``: 8 buckets, 2
    chunks; ``permutation(20000)``: 32 buckets, 5 chunks. With ``PERM_CAP`` 256 every
    bucket holds more than shared memory would: each key ranked in the device's memory.
    The same permutations as the cpu's and the reference's, bit for bit, whatever order
    the scatter's atomics leave a bucket in."""
    monkeypatch.setattr(render, "PERM_CAP", cap)
    assert (render.PERM_BUCKET, render.PERM_CHUNK) == (1024, 4096)
    assert [render._perm_digits(n) for n in (1000, 5000, 20000)] == [0, 3, 5]
    assert render._perm_digits(1 << 21) == 11 and render._perm_digits((1 << 21) + 1) is None
    graph = graph_of(PERMUTATIONS_WIDER)
    rt, gen = compiled_run(graph, backend="cuda-emu")
    every = {_threads(phases) for _, phases in gen.plan.kernels.launches}
    tile = render.THREADS
    assert (tile, tile, tile, tile, 1000) in every
    assert (2 * tile, tile, 2 * tile, 8 * tile, 5000) in every
    assert (5 * tile, tile, 5 * tile, 32 * tile, 20000) in every
    cpu, _ = compiled_run(graph, backend="cpu")
    same_outputs(rt, cpu, ("p", "q", "c", "d", "e"))
    want = outputs(run_graph(graph))
    for name in ("p", "q", "c", "d", "e"):
        np.testing.assert_array_equal(rt.value(name), want[name])


def _key(c: items.GemmCall) -> tuple:
    """A product's shape as ``DeviceRuntime.product_choices`` keys it."""
    return cuda.product_key(c)


def _guarded_call(f) -> bool:
    return isinstance(f, items.GemmCall) and f.when is not True


@needs_cxx
def test_a_product_is_the_blas_s_or_ours_as_the_renderer_is_told():
    """Without the BLAS (``render_module(.., blas=False)``) each product is a step of
    ours, one thread per element of the product (the kernel of ``q`` asks for 25)."""
    graph = graph_of(REDUCTIONS)
    plan = compile_plan(run_passes(graph))
    (k,) = [
        k
        for k in generate(plan, "cuda").kernels
        if "gemm.f32 5x300x5" in kir.text(k) and "if" in kir.text(k)
    ]
    assert [kind for kind, _ in render.steps(k)] == ["either", "blas", "parallel"]
    assert [kind for kind, _ in render.steps(k, blas=False)][1] == "gemm"
    _, _, launches = render.render_module([k], blas=False)
    assert [n for _, n in launches[k.name].phases] == [1500, 25, 5]


def test_a_condition_that_reads_what_its_loop_writes_keeps_the_loop_under_it():
    """``if y[0] > 0: for e (parallel): y[e] = ..`` cannot run as ``for e: if y[0] > 0:``
    over the grid (a thread would see another's write of ``y[0]``): it stays one serial
    step; a condition on other memory still lets the loop go to the grid."""
    f64 = "f64"
    slots = (kir.Slot("x", f64, 0, 0, 0, False), kir.Slot("y", f64, 1, 1, 0, True))
    e = kir.Ref("e")

    def kernel(cond_buf: str):
        cond = kir.Bin("gt", kir.Load(cond_buf, kir.i64(0), f64), kir.Const(f64, 0.0), "bool")
        store = kir.Store("y", e, kir.Bin("add", kir.Load("x", e, f64), kir.Const(f64, 1.0), f64))
        loop = kir.For("e", kir.i64(0), kir.i64(1000), (store,), True)
        return kir.Kernel("s0", 0, (), slots, (), (kir.If(cond, (loop,)),))

    _, _, launches = render.render_module([kernel("y")])
    assert [n for _, n in launches["s0"].phases] == [1]
    _, _, launches = render.render_module([kernel("x")])
    assert [n for _, n in launches["s0"].phases] == [1000]


def test_a_run_s_sums_whose_terms_read_nothing_it_writes_between_them_share_one_tree():
    """A run on one thread with three sums the block takes (``_Kernel.block_sums``): the
    second's terms read ``x`` (nothing the run writes between the sums): one pass and one
    tree for both; the third's read ``y``, which the run writes after the second: a tree of
    its own after that write."""
    f64 = "f64"
    slots = (kir.Slot("x", f64, 0, 0, 0, False), kir.Slot("y", f64, 1, 1, 0, True))
    zero = kir.i64(0)

    def total(acc: str, buf: str):
        term = kir.Bin("mul", kir.Load(buf, kir.Ref("e"), f64), kir.Const(f64, 2.0), f64)
        let = kir.Let(acc, f64, kir.Bin("add", kir.Ref(acc, f64), term, f64))
        return kir.For("e", zero, kir.i64(100), (let,), False, (((acc, "add"),)))

    body = []
    for acc, buf, at in (("a", "x", 1), ("b", "x", 2), ("c", "y", 3)):
        body += [kir.Let(acc, f64, kir.Const(f64, 0.0)), total(acc, buf)]
        body.append(kir.Store("y", kir.i64(at), kir.Ref(acc, f64)))
    text, _, launches = render.render_module([kir.Kernel("s0", 0, (), slots, (), tuple(body))])
    assert [n for _, n in launches["s0"].phases] == [1]
    assert text.count("before the sums' terms") == 2
    assert "tl_bs0_0" in text and "tl_bs1_0" in text and "tl_bs2_0" in text
    first, second = text.split("before the sums' terms")[1:]
    assert "tl_bs1_0[threadIdx.x] = v_b" in first and "tl_bs2_0[threadIdx.x] = v_c" in second
    # (y[2] = b, thread 0's, before the third sum's pass reads y)
    assert "m_y[(2LL)] = v_b" in first and "m_y[(2LL)]" not in second


def test_a_gpu_kernel_s_temporaries_share_bytes_where_their_uses_do_not_overlap():
    """``lower._packed_temps`` (the cuda target's kernels, whose temporaries hold every
    point's values): t1 is read for the last time where t2 is written, t3 written after:
    t3 takes t1's bytes, t2 keeps its own; the scratch shrinks by t1's size."""
    from timerlc.codegen.lower import _packed_temps

    f32 = "f32"
    temps = tuple(kir.Temp(f"t{j}", f32, 4000 * (j - 1), 1000) for j in (1, 2, 3))
    e = kir.Ref("e")

    def loop(dst, src):
        value = kir.Load(src, e, f32) if src else kir.Const(f32, 1.0)
        return kir.For("e", kir.i64(0), kir.i64(1000), (kir.Store(dst, e, value),), True)

    body = (loop("t1", None), loop("t2", "t1"), loop("t3", "t2"), loop("y", "t3"))
    slots = (kir.Slot("y", f32, 0, 0, 0, True),)
    k = _packed_temps(kir.Kernel("s0", 0, (), slots, temps, body))
    at = {t.name: t.offset for t in k.temps}
    assert at["t3"] == at["t1"] != at["t2"] and k.scratch_bytes == 8000


def test_each_reduction_step_declares_only_its_own_scratch():
    """Twelve sums in one kernel: the step of sum 1 names tl_nparts1, not tl_nparts10 or
    11 (an unused pointer is a warning of nvcc, which the builds must compile without)."""
    f64 = "f64"
    body = []
    for j in range(12):
        acc = f"acc{j}"
        term = kir.Bin("add", kir.Ref(acc, f64), kir.Load("x", kir.Ref("e"), f64), f64)
        loop = kir.For("e", kir.i64(0), kir.i64(1000), (kir.Let(acc, f64, term),))
        loop = dataclasses.replace(loop, reduce=((acc, "add"),))
        body += [kir.Let(acc, f64, kir.Const(f64, 0.0)), loop]
        body.append(kir.Store("y", kir.i64(j), kir.Ref(acc, f64)))
    slots = (kir.Slot("x", f64, 0, 0, 0, False), kir.Slot("y", f64, 1, 1, 0, True))
    text, _, _ = render.render_module([kir.Kernel("s0", 0, (), slots, (), tuple(body))])
    for fn in text.split('extern "C" __global__')[1:]:
        for name in set(re.findall(r"m_tl_nparts\d+", fn)):
            assert fn.count(name) >= 2, (name, fn[:200])


def test_a_loop_marked_as_a_reduction_that_is_not_one_runs_on_one_thread():
    """The renderer checks a ``For.reduce`` mark before it deals the loop to the grid: an
    accumulator read outside its update, or a store in a local's reduction, leaves the
    loop on the serial step's thread."""
    f64 = "f64"
    acc = kir.Ref("acc", f64)
    term = kir.Load("x", kir.Ref("e"), f64)
    good = kir.Let("acc", f64, kir.Bin("add", acc, term, f64))
    leak = kir.Store("y", kir.i64(0), acc)
    bad_read = kir.Let("acc", f64, kir.Bin("add", acc, kir.Bin("mul", acc, term, f64), f64))
    slots = (kir.Slot("x", "f64", 0, 0, 0, False), kir.Slot("y", "f64", 1, 1, 0, True))

    def kernel(body):
        loop = kir.For("e", kir.i64(0), kir.i64(1000), tuple(body), reduce=(("acc", "add"),))
        stmts = (kir.Let("acc", f64, kir.Const(f64, 0.0)), loop, kir.Store("y", kir.i64(0), acc))
        return kir.Kernel("s0", 0, (), slots, (), stmts)

    _, _, ok = render.render_module([kernel([good])])
    # (the first value and the combination: by the last block)
    assert [n for _, n in ok["s0"].phases] == [1000]
    for body in ([good, leak], [bad_read]):
        _, _, launches = render.render_module([kernel(body)])
        assert [n for _, n in launches["s0"].phases] == [1]


def _reinforce_small():
    path = PROGRAMS / "reinforce.rtl"
    sets = dict(a.split("=") for a in SMALL_REINFORCE[1::2])
    return check_source(Source(str(path), path.read_text()), overrides=sets)


def test_plans_covered_statements_are_checked():
    """``kernels.covered`` (the statements only fused kernels compute, unprofiled) names
    distinct statements of the plan's fused kernels, in a CUDA kernel file's plan only."""
    plan = compile_plan(run_passes(_reinforce_small()))
    gen = generate(plan, "cuda")
    covered = gen.plan.kernels.covered
    assert covered and set(covered) <= {s for f in gen.plan.kernels.fused for s in f}
    # (--dump-ir's listing says which)
    assert listing(gen).count("(only under --profile: fused kernels make its calls)") == len(
        covered
    )
    data = items.to_json(gen.plan)
    assert items.from_json(json.loads(json.dumps(data)), "p") == gen.plan
    alone = next(sid for sid, _, _ in gen.plan.kernels.statements if sid not in covered)
    cases = [
        (lambda k: k["covered"].append(k["covered"][0]), "not distinct statements of fused"),
        (lambda k: k["covered"].append(alone), "not distinct statements of fused kernels"),
        (lambda k: k.__setitem__("covered", 3), "expected a list"),
    ]
    refuses_changed_plans(data, cases)
    cpu = items.to_json(generate(plan, "cpu").plan)
    cpu["kernels"]["covered"] = list(covered)
    with pytest.raises(items.PlanError, match="only a CUDA kernel file's plan has covered"):
        items.from_json(cpu, "p")


@needs_cxx
def test_a_run_compiles_only_what_it_launches_and_the_rest_where_a_call_needs_it():
    """A run that is not profiled compiles the module without the covered statements'
    kernels (``FUSED_ONLY``) nor the TF32 functions (``NO_TF32``, float32 products; with
    TF32 products, ``TF32_ONLY``: nor the float32 functions of chains with TF32 ones); a call
    of a covered statement's own kernel (here: no fused kernel matched, as in a crafted
    plan's run) loads the whole module then, and computes the same values."""
    plan = compile_plan(run_passes(_reinforce_small()))
    gen = generate(plan, "cuda")
    names = cuda.function_names(dict(gen.plan.kernels.launches)[gen.plan.kernels.covered[0]])
    got = {True: [], False: []}
    for fused in (True, False):
        keep = got[fused].append
        kernels = gen.plan.kernels
        if not fused:  # (every call its statement's own kernel: no fused kernel, no loop's)
            kernels = dataclasses.replace(kernels, fused=(), fused_launches=(), loops=())
        plan = dataclasses.replace(gen.plan, kernels=kernels)
        rt = DeviceRuntime(plan, lambda *m, k=keep: k(m), text=gen.text, device=EmuDevice())
        assert rt.defines == ("TL_NO_TF32", "TL_FUSED_ONLY")
        assert not any(hasattr(rt._module.lib, n) for n in names)  # (left out of its compile)
        rt.run()
        assert rt.whole_module_loaded is not fused
        rt.envs.close()
    a, b = got[True], got[False]
    assert len(a) > 3 and [m[:2] for m in a] == [m[:2] for m in b]
    np.testing.assert_allclose([m[2] for m in a], [m[2] for m in b], rtol=1e-5, atol=1e-6)
    profiled = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice(), profile=True)
    assert profiled.defines == ("TL_NO_TF32",)
    assert all(hasattr(profiled._module.lib, n) for n in names)
    tf32 = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice("tensorfloat32"))
    assert tf32.defines == ("TL_TF32_ONLY", "TL_FUSED_ONLY")


@needs_cxx
def test_a_crafted_plan_s_calls_of_left_out_or_missing_functions(tmp_path):
    """A plan.json whose ``covered`` and fused kernels were changed together (the text's
    hash still matches: the plan's digest leaves the kernels field out) runs, its calls of
    left-out kernels from the whole module; one naming a function the file does not define
    exits 2 with one line."""
    out = tmp_path / "build"
    r = cli(
        "compile", PROGRAMS / "reinforce.rtl", "--backend", "cuda", *SMALL_REINFORCE, "-o", out
    )
    assert r.exit_code == 0, r.stderr
    good = json.loads((out / "plan.json").read_text())
    plan = json.loads(json.dumps(good))
    k = plan["kernels"]
    gone = k["covered"][0]  # (its fused kernels dropped: its calls are its own kernel's)
    keep = [j for j, f in enumerate(k["fused"]) if gone not in f]
    k["fused"] = [k["fused"][j] for j in keep]
    k["fused_launches"] = [k["fused_launches"][j] for j in keep]
    k["covered"] = [s for s in k["covered"] if any(s in f for f in k["fused"])]
    (out / "plan.json").write_text(json.dumps(plan))
    r = cli("run", out, "--backend", "cuda-emu", "--no-progress")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(json.dumps(good))
    renamed = 0
    every = plan["kernels"]["launches"] + plan["kernels"]["fused_launches"]
    for _, phases, *_ in every:  # (a product's own function: called by a fused kernel)
        for f in phases:
            if isinstance(f, dict) and f.get("gemm", {}).get("own"):
                f["gemm"]["own"][0][0] = "zz_nowhere"
                renamed += 1
    assert renamed
    (out / "plan.json").write_text(json.dumps(plan))
    r = cli("run", out, "--backend", "cuda-emu", "--no-progress")
    assert r.exit_code == 2, r.stderr
    assert "the plan's kernel file has no function zz_nowhere" in r.stderr
    assert "Traceback" not in r.stderr


FAILS_AT_700 = """
config K = 1000
dim k < K
x[k] = f32(k)
y[k] = take(x[0:K], k + k // 700 * 5000)
out y
"""


@needs_cxx
def test_a_point_that_fails_in_a_later_block_is_reported():
    """The take's index leaves the source at k = 700, which the third block of the grid
    computes: the block's code reaches the runtime, and the interpreter names the point."""
    graph = graph_of(FAILS_AT_700)
    with pytest.raises(RunError) as got:
        compiled_run(graph, backend="cuda-emu")
    with pytest.raises(RunError) as want:
        compiled_run(graph, backend="cpu")
    assert str(got.value) == str(want.value) and "k=700" in str(got.value)


def test_plans_launches_are_checked():
    graph = graph_of(STEPS)
    from timerlc.compiler import compile_plan, generate_code, run_passes

    gen = generate_code(compile_plan(run_passes(graph)), target="cuda")
    data = items.to_json(gen.plan)
    assert items.from_json(json.loads(json.dumps(data)), "p") == gen.plan
    cases = [
        (lambda k: k.pop("launches"), "no 'launches'"),
        (lambda k: k["launches"].pop(), "one entry per statement"),
        (lambda k: k["launches"][0][1].__setitem__(0, ["zz", 1]), "first function launched"),
        (lambda k: k["launches"][0][1].append([k["launches"][0][1][0][0], 1]), "named twice"),
        (lambda k: k["launches"][0][1][0].__setitem__(1, 0), "out of range"),
        (lambda k: k["launches"][0].__setitem__(1, []), "1 to 64 launches"),
        (lambda k: k["unfailing"].append(k["unfailing"][0]), "not distinct statements"),
        (lambda k: k["unfailing"].append(10**6), "not distinct statements with a kernel"),
        (lambda k: k["launches"][0].append(1), r"launches\[0\]\[2\].*out of range \(2 to"),
        (lambda k: k["launches"][0].append("8"), r"launches\[0\]\[2\].*expected an integer"),
        (lambda k: k["launches"][0].extend([2, 2]), "and the times a call runs them"),
    ]
    refuses_changed_plans(data, cases)


@needs_cxx
def test_only_a_kernel_that_can_fail_has_its_failure_code_read():
    """The plan lists the kernels without a ``Fail`` (``kernels.unfailing``): the runtime
    reads no failure code after them (on a GPU, no wait for the device). A crafted plan
    that lists a kernel that fails is refused at the end of the run at the latest."""
    gen = generate(compile_plan(run_passes(graph_of(FAILS_AT_700))), "cuda")
    kernels = {k.sid: k for k in gen.kernels}
    fails = {sid for sid, k in kernels.items() if "fail" in kir.text(k)}
    assert fails and set(gen.plan.kernels.unfailing) == set(kernels) - fails
    reads = []
    device = EmuDevice()
    failure = device.failure
    device.failure = lambda: reads.append(1) or failure()
    with pytest.raises(RunError, match="k=700"):
        DeviceRuntime(gen.plan, text=gen.text, device=device).run()
    assert 0 < len(reads) <= 2  # before the output comes down (or at the run's end)
    lying = dataclasses.replace(
        gen.plan,
        kernels=dataclasses.replace(gen.plan.kernels, unfailing=tuple(kernels)),
    )
    with pytest.raises(items.PlanError, match="says cannot fail"):
        DeviceRuntime(lying, text=gen.text, device=EmuDevice()).run()


# y fails at t = 7 with an index that depends on s[7]; the calls after it (t = 8, 9, ...)
# would write s[9] over s[7] (s keeps two steps)
FAILS_IN_A_LOOP = """
config T = 12, K = 4
dim t < T
dim k < K
s[0, k] = f32(k)
s[t, k] = s[t-1, k] + 1.0 + y[t-1, k] * 0.0
y[t, k] = take(s[t, 0:K], i32(s[t, k]) - t + t // 7 * (i32(s[t, k]) + 90))
out y
"""


@needs_cxx
def test_a_failure_is_read_late_and_explained_with_the_values_it_saw():
    """A kernel that can fail is not waited for: its failure is read when the host next
    waits (here at the run's end, after the loop's last call), and every launch after it
    returns at once, so the values the failing call read are intact when the interpreter
    computes it again: the index it names is s[7]'s (97), not s[9]'s (105, what the calls
    after it would have left). (The calls as launches; replayed from a CUDA graph, the same:
    ``test_cuda_graphs``.)"""
    gen = generate(compile_plan(run_passes(graph_of(FAILS_IN_A_LOOP))), "cuda")
    (take,) = [k for k in gen.kernels if "fail" in kir.text(k) and k.params == ("t",)]
    for graphs in (False, True):
        reads, calls = [], []
        device = EmuDevice()
        failure, launch = device.failure, device.launch
        device.failure = lambda r=reads, f=failure: r.append(1) or f()
        device.launch = lambda fn, *a, c=calls, go=launch: c.append(a[1][0]) or go(fn, *a)
        rt = DeviceRuntime(gen.plan, text=gen.text, device=device, graphs=graphs)
        with pytest.raises(RunError, match=r"t=7, k=0 .*index 97 is out of range"):
            rt.run()
        assert len(reads) == 1  # one read, at the end
        # the loop ran on: its launches to t = 11 (replayed from a graph captured at t = 1)
        assert max(calls) == (1 if graphs else 11)
        assert rt.launches >= 12 and (rt.graph_replays >= 9 if graphs else not rt.graph_replays)
    assert take.sid in {sid for sid, _, _ in gen.plan.kernels.statements}


@needs_cxx
# (rnn_reinforce's layers compute in place since lower._epilogue_product: no scratch over
# its points is left to run block after block)
@pytest.mark.parametrize("program", ["ppo", "reinforce_td"])
def test_a_kernel_over_many_points_runs_block_after_block(program, monkeypatch):
    """Where a statement's layers over points would need more scratch than GPU_SCRATCH,
    its kernel runs its launches once per block of the points (``repeats`` in the plan,
    the block's number after the loop values): the scratch is a block's, and the values
    are the unblocked run's (the cpu backend's)."""
    from timerlc.codegen import lower

    path = Path(__file__).resolve().parent.parent / "programs" / f"{program}.rtl"
    sets = {"B": "8", "T": "16"} | ({"total_steps": "256"} if program == "ppo" else {"I": "2"})
    graph = check_source(Source(str(path), path.read_text()), overrides=sets)
    plan = compile_plan(run_passes(graph))
    whole = generate(plan, "cuda")
    monkeypatch.setattr(lower, "GPU_SCRATCH", 256)
    gen = generate(plan, "cuda")
    repeats = dict(gen.plan.kernels.repeats)
    assert repeats and all(n > 1 for n in repeats.values())
    scratch = {sid: n for sid, _, n in gen.plan.kernels.statements}
    before = {sid: n for sid, _, n in whole.plan.kernels.statements}
    assert all(scratch[sid] < before[sid] for sid in repeats)
    data = items.to_json(gen.plan)  # (the repeats go through the plan's JSON)
    assert items.from_json(json.loads(json.dumps(data)), "p") == gen.plan
    got, want = [], []
    rt = DeviceRuntime(gen.plan, lambda *m: got.append(m), text=gen.text, device=EmuDevice())
    rt.run()
    cpu = generate(plan)
    ref = CpuRuntime(cpu.plan, lambda *m: want.append(m), native=cpu.text)
    ref.run()
    assert [m[:2] for m in got] == [m[:2] for m in want]
    np.testing.assert_allclose([m[2] for m in got], [m[2] for m in want], rtol=1e-5, atol=1e-6)
    rt.envs.close()
    ref.envs.close()


def _gemm_json(data) -> dict:
    """The first product of ``data``'s launches (a plan's JSON)."""
    return next(
        f["gemm"] for _, ph in data["kernels"]["launches"] for f in ph if isinstance(f, dict)
    )


def test_plans_products_are_checked():
    """A product's fields (``items.GemmCall``) are read as data: its dtype, sizes, memory,
    leading dimensions and expressions each checked, and a bad one is a clear error."""
    gen = generate(compile_plan(run_passes(graph_of(REDUCTIONS))), "cuda")
    data = items.to_json(gen.plan)
    assert items.from_json(json.loads(json.dumps(data)), "p") == gen.plan
    cases = [
        (lambda g: g.__setitem__("dtype", "i32"), "is not f32 or f64"),
        (lambda g: g.__setitem__("m", 0), "out of range"),
        (lambda g: g["a"].__setitem__("in", "heap"), "is not 'table' or 'scratch'"),
        (lambda g: g["b"].__setitem__("ld", 1), "elements apart hold"),
        (lambda g: g["c"].__setitem__("t", True), "not stored transposed"),
        (lambda g: g["a"].__setitem__("offset", ["add", "zz", 1]), "unknown name 'zz'"),
        (lambda g: g.__setitem__("when", 3), "condition"),
        (lambda g: g.__setitem__("alpha", 2.0), "unknown field"),
        (lambda g: g.pop("k"), "missing k"),
    ]
    refuses_changed_plans(data, cases, _gemm_json)


@needs_cxx
def test_a_product_outside_its_memory_is_refused_before_it_runs():
    """An offset that a valid plan's checks pass but that puts a product's matrix past its
    memory (a crafted plan) is a plan error at the call, before the BLAS touches memory."""
    gen = generate(compile_plan(run_passes(graph_of(REDUCTIONS))), "cuda")
    data = items.to_json(gen.plan)
    fused = [p for _, p in data["kernels"]["fused_launches"]]  # (a fused kernel's too)
    for phases in [p for _, p in data["kernels"]["launches"]] + fused:
        for f in phases:
            if isinstance(f, dict):
                f["gemm"]["c"]["offset"] = 1 << 20
    plan = items.from_json(json.loads(json.dumps(data)), "p")
    rt = DeviceRuntime(plan, text=gen.text, device=EmuDevice())
    with pytest.raises(items.PlanError, match="outside its memory"):
        rt.run()


def test_the_listing_shows_what_a_call_launches(tmp_path):
    out = tmp_path / "build"
    (tmp_path / "steps.rtl").write_text(src(STEPS))
    r = cli("compile", tmp_path / "steps.rtl", "--backend", "cuda", "-o", out, "--dump-ir")
    assert r.exit_code == 0, r.stderr
    (listing,) = (out / "ir").glob("*-kernels.txt")
    plan = json.loads((out / "plan.json").read_text())
    text = listing.read_text()
    for sid, phases in plan["kernels"]["launches"]:
        shown = ", ".join(f"{f} ({n} thread{'s' if n != 1 else ''})" for f, n in phases)
        assert f"  launched as: {shown}\n" in text, text
    assert "(1000 threads), " in text and "(1000 threads)\n" in text


def _colmajor(ptr: int, dt, rows: int, cols: int, ld: int) -> np.ndarray:
    """The column-major ``rows`` x ``cols`` matrix at host address ``ptr`` (columns ``ld``
    elements apart), as cuBLAS reads one: a view."""
    import ctypes

    assert ld >= max(1, rows), "cuBLAS refuses a leading dimension below the rows"
    nbytes = ((cols - 1) * ld + rows) * dt.itemsize
    flat = np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dt)
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (dt.itemsize, ld * dt.itemsize))


class _FakeCublas:
    """cuBLAS's gemm as its documentation defines it (column-major, ``op`` N = 0, T = 1,
    alpha and beta read from host addresses in pointer mode 0), over host memory: what
    ``CupyDevice.gemm`` hands it is checked against that contract, not against itself."""

    def __init__(self):
        self.calls, self.mode, self.stream = [], None, None

    def setStream(self, handle, stream):
        self.stream = (handle, stream)

    def setPointerMode(self, handle, mode):
        self.mode = (handle, mode)

    def setMathMode(self, handle, math):
        self.math = (handle, math)

    def _gemm(self, dt, handle, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        import ctypes

        assert self.mode == (handle, 0) and self.stream == (handle, 0)
        a = _colmajor(A, dt, k, m, lda).T if ta else _colmajor(A, dt, m, k, lda)
        b = _colmajor(B, dt, n, k, ldb).T if tb else _colmajor(B, dt, k, n, ldb)
        al = np.frombuffer((ctypes.c_char * dt.itemsize).from_address(alpha), dt)[0]
        be = np.frombuffer((ctypes.c_char * dt.itemsize).from_address(beta), dt)[0]
        assert (al, be) == (1, 0)
        _colmajor(C, dt, m, n, ldc)[...] = al * (a @ b)  # (beta 0: C is not read)
        self.calls.append(dt)

    def sgemm(self, *args):
        self._gemm(np.dtype(np.float32), *args)

    def dgemm(self, *args):
        self._gemm(np.dtype(np.float64), *args)


@pytest.mark.parametrize(
    "ta, tb, ldc_extra, dtype",
    [
        (False, False, 0, "f32"),
        (True, False, 3, "f32"),
        (True, True, 0, "f64"),
        (False, True, 1, "f64"),
    ],
)
def test_cupy_device_s_product_is_cublas_s_gemm_on_the_plan_s_matrices(
    ta, tb, ldc_extra, dtype, monkeypatch
):
    import types

    blas = _FakeCublas()
    fake = types.ModuleType("cupy.cuda")
    fake.cublas = blas
    fake.device = types.SimpleNamespace(get_cublas_handle=lambda: 77)
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    monkeypatch.setitem(sys.modules, "cupy.cuda", fake)
    monkeypatch.setattr(cuda, "_cublas_library", lambda cp: None)  # CuPy's wrappers
    _check_gemm(blas, ta, tb, ldc_extra, dtype)


class _FakeLibcublas:
    """libcublas's C functions (a ``ctypes.CDLL``'s attributes: plain functions, which take
    ``argtypes``) over ``_FakeCublas``: a handle made by ``cublasCreate_v2`` (written where
    its argument points), statuses 0."""

    def __init__(self):
        import ctypes

        blas = self.blas = _FakeCublas()
        self.created, self.sets = 0, []

        def create(at):
            self.created += 1
            ctypes.c_void_p.from_address(at).value = 4096 + self.created
            return 0

        def set_stream(handle, stream):
            self.sets.append(stream)
            blas.setStream(handle, stream)
            return 0

        self.cublasCreate_v2 = create
        self.cublasSetStream_v2 = set_stream
        self.cublasSetPointerMode_v2 = lambda handle, mode: blas.setPointerMode(handle, mode) or 0
        self.cublasSetMathMode = lambda handle, math: blas.setMathMode(handle, math) or 0
        self.cublasSgemm_v2 = lambda *args: blas.sgemm(*args) or 0
        self.cublasDgemm_v2 = lambda *args: blas.dgemm(*args) or 0


@pytest.mark.parametrize(
    "ta, tb, ldc_extra, dtype", [(False, True, 2, "f32"), (True, False, 0, "f64")]
)
def test_cupy_device_s_product_through_libcublas_is_the_same_gemm(
    ta, tb, ldc_extra, dtype, monkeypatch
):
    """Where the process has libcublas, the products go through a handle of our own
    (``Cublas``: CuPy's wrappers refuse a captured stream): one handle, pointer mode host,
    the stream set when it changes."""
    import types

    lib = _FakeLibcublas()
    monkeypatch.setattr(cuda, "_cublas_library", lambda cp: lib)
    dev = _check_gemm(lib.blas, ta, tb, ldc_extra, dtype, cp=types.SimpleNamespace())
    assert lib.created == 1 and lib.blas.mode == (4097, 0) and lib.blas.math == (4097, 0)
    _check_gemm(lib.blas, tb, ta, 0, dtype, dev=dev)
    assert lib.created == 1 and lib.sets == [0]  # (the same stream: not set again)


def test_cupy_device_s_tensorfloat32_products_are_cublas_s_tf32_math_mode(monkeypatch):
    import types

    lib = _FakeLibcublas()
    monkeypatch.setattr(cuda, "_cublas_library", lambda cp: lib)
    _check_gemm(
        lib.blas, False, False, 0, "f32", cp=types.SimpleNamespace(), matmul="tensorfloat32"
    )
    assert lib.blas.math == (4097, 3)  # CUBLAS_TF32_TENSOR_OP_MATH


def test_cublas_refuses_a_failed_status_with_its_name():
    lib = _FakeLibcublas()
    lib.cublasSgemm_v2 = lambda *args: 13  # CUBLAS_STATUS_EXECUTION_FAILED
    blas = cuda.Cublas(lib)
    with pytest.raises(RunError, match=r"cuBLAS's cublasSgemm failed \(status 13\)"):
        blas.sgemm(blas.create(), *([0] * 13))


def test_a_gpu_s_grids_are_the_blocks_it_holds_at_once():
    """A launch's grid is at most the blocks the GPU runs at once (each thread strides over
    the rest of its points): 16 blocks of 128 threads a multiprocessor of 2048."""
    assert cuda.resident_blocks(132, 2048) == 132 * 16  # an H100
    assert cuda.resident_blocks(80, 1024) == 80 * 8
    assert cuda.resident_blocks(1, 64) == 1  # (a multiprocessor of fewer threads: one block)
    assert cuda.resident_blocks(10**5, 2048) == 65535


def _stand_in_cupy_device(monkeypatch, attrs: dict, driver, codes=None):
    """A ``CupyDevice`` over a stand-in for CuPy: one GPU of device attributes ``attrs``
    (and ``codes``, the runtime's by number: ``deviceGetAttribute``), its streams and
    memory placeholders, ``driver`` as ``cupy.cuda.driver``."""
    import types

    class Stream:
        ptr = 5

        def __init__(self, non_blocking=False):
            pass

        def use(self):
            pass

    fake = types.ModuleType("cupy")
    fake.int64 = np.int64
    fake.zeros = lambda n, dt: types.SimpleNamespace(data=types.SimpleNamespace(ptr=64))
    fake.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(
            getDeviceCount=lambda: 1, deviceGetAttribute=lambda code, dev: (codes or {})[code]
        ),
        Device=lambda: types.SimpleNamespace(attributes=attrs, id=0),
        Stream=Stream,
    )
    fake_cuda = types.ModuleType("cupy.cuda")
    fake_cuda.driver = driver
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupy.cuda", fake_cuda)
    return cuda.CupyDevice()


def test_cupy_device_takes_its_grid_limit_from_the_gpu_s_multiprocessors(monkeypatch):
    """``CupyDevice`` reads the GPU's multiprocessors and threads each (a stand-in for
    CuPy here) and launches grids of at most ``resident_blocks`` of them; a function's
    launches at most as many as its occupancy lets each multiprocessor hold (12 blocks of
    a function of 40 registers a thread), never more than ``resident_blocks``."""
    import types

    launched = []
    occupancy = {1: 12, 2: 16, 3: 40, 4: 0}  # (blocks of 128 threads an SM, each function)
    driver = types.SimpleNamespace(
        launchKernel=lambda fn, gx, *rest: launched.append(gx),
        occupancyMaxActiveBlocksPerMultiprocessor=lambda fn, threads, smem: (
            occupancy[fn] if (threads, smem) == (cuda.THREADS, 0) else -1
        ),
    )
    attrs = {"MultiProcessorCount": 114, "MaxThreadsPerMultiProcessor": 2048}
    dev = _stand_in_cupy_device(monkeypatch, attrs, driver)
    assert dev.MAX_BLOCKS == 114 * 16
    dev.set_shift(1, 0, 0, 10**7, np.zeros(1, np.int64))  # (10 M shifts: capped)
    assert launched == [114 * 16]
    assert [dev.grid_limit(fn) for fn in (1, 2, 3, 4)] == [114 * 12, 114 * 16, 114 * 16, 1]


def test_cupy_device_gives_a_chain_s_function_its_dynamic_shared_memory(monkeypatch):
    """A chain's function past 48 KB of shared memory (``ChainCall.shared``: its array the
    launch's dynamic shared memory, ``render._Kernel.chain_body``): ``CupyDevice.
    dynamic_shared`` sets the function's most (``cuFuncSetAttribute``, a stand-in for CuPy
    here) where its static and dynamic bytes fit a block of the GPU (its opt-in most, from
    CuPy's device attributes or the runtime's; 48 KB where neither has it), and then
    launches it with them and counts them in its occupancy; where they do not
    fit, it says so (the runtime then runs the launches the chain stands for) and leaves
    the function as it was."""
    import types

    launched, set_to = [], []
    static = {1: 1024, 2: 200000}  # (each function's static shared memory)
    driver = types.SimpleNamespace(
        launchKernel=lambda fn, gx, gy, gz, bx, by, bz, shared, *rest: launched.append(
            (fn, shared)
        ),
        occupancyMaxActiveBlocksPerMultiprocessor=lambda fn, threads, smem: (
            228 * 1024 // (smem + static[fn] + 1024)
        ),
        funcGetAttribute=lambda attribute, fn: (
            static[fn] if attribute == cuda.FUNC_SHARED_SIZE_BYTES else -1
        ),
        funcSetAttribute=lambda fn, attribute, value: set_to.append((fn, attribute, value)),
    )
    attrs = {"MultiProcessorCount": 132, "MaxThreadsPerMultiProcessor": 2048}
    assert _stand_in_cupy_device(monkeypatch, attrs, driver)._optin == 48 * 1024
    codes = {cuda.DEV_MAX_SHARED_PER_BLOCK_OPTIN: 232448}  # (not in CuPy's dictionary)
    assert _stand_in_cupy_device(monkeypatch, attrs, driver, codes)._optin == 232448
    attrs["MaxSharedMemoryPerBlockOptin"] = 232448
    dev = _stand_in_cupy_device(monkeypatch, attrs, driver)
    assert dev.grid_limit(1) == dev.MAX_BLOCKS == 132 * 16  # (2 KB a block: 114 an SM)
    assert dev.dynamic_shared(1, 96 * 1024)
    assert set_to == [(1, cuda.FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, 96 * 1024)]
    assert dev.grid_limit(1) == 132 * 2
    dev.launch(1, 0, np.zeros(1, np.int64), 0, 4)
    assert launched == [(1, 96 * 1024)]
    assert not dev.dynamic_shared(2, 48 * 1024)  # (200,000 + 49,152 bytes: too many)
    assert len(set_to) == 1
    dev.launch(2, 0, np.zeros(1, np.int64), 0, 4)
    assert launched[-1] == (2, 0)


def _check_gemm(blas, ta, tb, ldc_extra, dtype, cp=None, dev=None, matmul="float32"):
    """``CupyDevice.gemm`` of random matrices (rows further apart than they are long)
    through ``blas`` (a ``_FakeCublas``) equals numpy's product; the device used."""
    dt = np.float32 if dtype == "f32" else np.float64
    m, n, k = 3, 4, 5
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dt)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dt)
    lda, ldb = a.shape[1] + 2, b.shape[1] + 1  # rows further apart than they are long
    A = np.zeros((a.shape[0], lda), dt)
    B = np.zeros((b.shape[0], ldb), dt)
    A[:, : a.shape[1]], B[:, : b.shape[1]] = a, b
    ldc = n + ldc_extra
    C = np.full((m, ldc), 7.0, dt)
    if dev is None:
        dev = object.__new__(cuda.CupyDevice)
        dev._blas, dev._stream, dev.cp = None, 0, cp
        dev.matmul = matmul
    calls = len(blas.calls)
    dev.gemm(dtype, m, n, k, A.ctypes.data, lda, ta, B.ctypes.data, ldb, tb, C.ctypes.data, ldc)
    want = (a.T if ta else a) @ (b.T if tb else b)
    np.testing.assert_allclose(C[:, :n], want, rtol=1e-6)
    assert (C[:, n:] == 7.0).all()  # the gap between rows untouched
    assert blas.calls[calls:] == [np.dtype(dt)]
    return dev


def test_cupy_device_copies_at_addresses_inside_its_allocations_and_arenas():
    """``CupyDevice``'s copies and fills reach the bytes at any address inside one of its
    allocations or arenas, not only at an allocation's start (the GPU's first PPO run
    timed a product whose matrix sits at an offset into its buffer, and its download was
    refused as "outside the device's memory": a stand-in for CuPy's pointers here); bytes
    that run past the end, or an address in none, are an internal error."""
    import types

    class Pointer:  # (CuPy's MemoryPointer: an address, plus an offset gives another)
        def __init__(self, ptr):
            self.ptr = ptr

        def __add__(self, k):
            return Pointer(self.ptr + k)

        def copy_to_host(self, host, nbytes):
            copies.append(("down", self.ptr, nbytes))

        def copy_from_host_async(self, host, nbytes):
            copies.append(("up", self.ptr, nbytes))

        def memset(self, value, nbytes):
            copies.append(("zero", self.ptr, nbytes))

    bases = iter([4096, 65536])
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(alloc=lambda n: Pointer(next(bases))))
    dev = object.__new__(cuda.CupyDevice)
    dev.cp, dev._mem, dev._arenas = fake, {}, {}
    copies = []
    buf = dev.alloc(1000)
    arena = dev.arena(4000)
    host = np.zeros(25, np.float32)  # (100 bytes)
    dev.download(buf, host)
    dev.download(buf + 900, host)  # (inside the allocation: the product's matrix)
    dev.download(dev.carve(arena, 3900, 100), host)
    dev.upload(buf, host, offset=400)
    dev.upload(buf + 8, host, offset=8)
    dev.zero(buf + 500, 500)
    assert copies == [
        ("down", 4096, 100),
        ("down", 4996, 100),
        ("down", 69436, 100),
        ("up", 4496, 100),
        ("up", 4112, 100),
        ("zero", 4596, 500),
    ]
    for ptr in (buf + 901, arena + 3901, arena + 4000, 100, buf - 8):
        with pytest.raises(RunError, match="outside the device's memory"):
            dev.download(ptr, host)
    dev.free(buf)
    with pytest.raises(RunError, match="outside the device's memory"):
        dev.download(buf + 10, host)


def test_cupy_device_s_launch_passes_the_loop_values_as_the_module_s_struct():
    import ctypes

    from timerlc.cuda import render

    # the module's struct and the runtime's parameter buffers agree
    assert cuda.ARGS == render.ARGS
    assert f"struct tl_args {{ long long v[{render.ARGS}]; }};" in prelude.PRELUDE
    signature = (
        "void **table, const tl_args args_in, char *scratch, int *err, const long long *shift"
    )
    assert signature in render.__doc__
    assert (
        "tl_set_shift(long long *shift, const int *index, long long n,\n"
        "                                        const tl_args d)"
    ) in prelude.SHIFT_KERNEL
    seen = []

    class _Driver:
        @staticmethod
        def launchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            seen.append((f, (gx, gy, gz), (bx, by, bz), shared, stream, params))

    def word(ptrs, k, ctype=ctypes.c_uint64):
        return ctype.from_address(ptrs[k]).value

    dev = object.__new__(cuda.CupyDevice)
    dev._driver, dev._stream, dev._dynamic = _Driver, 0, {}
    dev._launch_params(4242)
    dev.launch(99, 1000, np.array([3, -5], np.int64), 2000, 17, 3000)
    (f, grid, block, shared, stream, params), *_ = seen
    assert (f, grid, block, shared, stream) == (99, (17, 1, 1), (cuda.THREADS, 1, 1), 0, 0)
    ptrs = (ctypes.c_uint64 * 5).from_address(params)
    args = list((ctypes.c_int64 * cuda.ARGS).from_address(ptrs[1]))
    assert (word(ptrs, 0), args[:2], word(ptrs, 2), word(ptrs, 3), word(ptrs, 4)) == (
        1000,
        [3, -5],
        2000,
        4242,
        3000,
    )
    dev.launch(99, 1000, np.array([3, -5], np.int64), 2000, 17)
    assert word((ctypes.c_uint64 * 5).from_address(seen[-1][-1]), 4) == 0  # no shift: null
    # tl_set_shift: the shifts' and the indices' addresses, their number, the values
    seen.clear()
    dev.set_shift(98, 5000, 6000, 300, np.array([7, -2], np.int64))
    ((f, grid, block, shared, stream, params),) = seen
    assert (f, grid, block) == (98, (-(-300 // cuda.THREADS), 1, 1), (cuda.THREADS, 1, 1))
    ptrs = (ctypes.c_uint64 * 4).from_address(params)
    d = list((ctypes.c_int64 * cuda.ARGS).from_address(ptrs[3]))
    assert (word(ptrs, 0), word(ptrs, 1), word(ptrs, 2, ctypes.c_int64)) == (5000, 6000, 300)
    assert d == [7, -2] + [0] * (cuda.ARGS - 2)


class _StrictPointer:
    """A CuPy ``MemoryPointer`` over host bytes whose copies read ``mem.value`` as CuPy's do
    (``memory.pyx``: ``runtime.memcpy(self.ptr, mem.value, ...)``): an int address fails."""

    def __init__(self, buf: np.ndarray, offset: int = 0):
        self.buf, self.offset = buf, offset

    def __add__(self, offset: int):
        return _StrictPointer(self.buf, self.offset + offset)

    def _host(self, mem, size):
        import ctypes

        return np.frombuffer((ctypes.c_char * size).from_address(mem.value), np.uint8)

    def copy_from_host_async(self, mem, size):
        self.buf[self.offset : self.offset + size] = self._host(mem, size)

    def copy_to_host(self, mem, size):
        self._host(mem, size)[:] = self.buf[self.offset : self.offset + size]


def test_cupy_device_s_copies_hand_cupy_a_c_void_p():
    dev = object.__new__(cuda.CupyDevice)
    memory = np.zeros(64, np.uint8)
    dev._mem, dev._arenas = {1000: (_StrictPointer(memory), memory.nbytes)}, {}
    dev.upload(1000, np.arange(4, dtype=np.float32), offset=16)
    back = np.zeros(8, np.float32)
    dev.download(1000, back)
    np.testing.assert_array_equal(back, [0, 0, 0, 0, 0, 1, 2, 3])

    record = np.zeros(cuda.RECORD, np.int64)
    record[0], record[1], record[2:4] = 7, 73, [3, 17]  # code 7, statement 73, (3, 17)

    class _Err:
        data = _StrictPointer(record.view(np.uint8).copy())

        def fill(self, value):
            self.data.buf[:] = value

    dev._err, dev._code = _Err(), np.zeros(cuda.RECORD, np.int64)
    code, sid, values = dev.failure()
    assert (code, sid, values[:3]) == (7, 73, (3, 17, 0))
    assert dev.code() == 0  # read, then cleared


# a metric each iteration; the take fails at i = 4 where FAR > 0
METRIC_THEN_FAIL = """
config I = 6, K = 300, FAR = 1000
dim i < I
dim k < K
c[k] = f32(k)
s[0, k] = c[k]
s[i, k] = s[i-1, k] + take(c[0:K], k + i // 4 * FAR) * 0.5
m[i] = sum(s[i, 0:K])
metric m
"""


def _metric_run(gen, async_metrics: bool):
    got: list = []
    device = EmuDevice()
    reads = [0]
    failure = device.failure

    def counted():
        reads[0] += 1
        return failure()

    device.failure = counted
    rt = DeviceRuntime(
        gen.plan,
        lambda *m: got.append(m),
        text=gen.text,
        device=device,
        async_metrics=async_metrics,
    )
    return rt, got, reads


@needs_cxx
def test_metrics_come_down_without_the_host_waiting_for_them():
    """A metric's values are copied down in the launches' stream with the failure record,
    and handed on once the device got there: the same rows in the same order as when the
    host read each (a wait for the device), with fewer reads of the failure record."""
    from timerlc.compiler import generate_code

    path = PROGRAMS / "ppo.rtl"
    sets = {"B": "8", "T": "16", "total_steps": "384"}
    graph = check_source(Source(str(path), path.read_text()), overrides=sets)
    gen = generate_code(compile_plan(run_passes(graph)), target="cuda")
    rows, waits = {}, {}
    for on in (False, True):
        rt, got, reads = _metric_run(gen, on)
        rt.run()
        rt.envs.close()
        rows[on], waits[on] = got, reads[0]
    assert rows[True] == rows[False] and len(rows[True]) == 21
    assert waits[True] < waits[False]


@needs_cxx
def test_the_metrics_before_a_failure_are_handed_on_then_the_failure_explained():
    graph = graph_of(METRIC_THEN_FAIL)
    from timerlc.compiler import generate_code

    gen = generate_code(compile_plan(run_passes(graph)), target="cuda")
    want_rows: list = []
    with pytest.raises(RunError) as want:
        compiled_run(graph, lambda *m: want_rows.append(m), backend="cpu")
    assert "at i=4" in str(want.value)
    for on in (False, True):
        rt, got, _ = _metric_run(gen, on)
        with pytest.raises(RunError) as e:
            rt.run()
        assert str(e.value) == str(want.value)
        assert [m[1] for m in got] == [{"i": i} for i in range(4)]
        np.testing.assert_allclose([m[2] for m in got], [m[2] for m in want_rows], rtol=1e-6)


def test_cupy_device_s_snapshot_copies_in_the_launches_stream_without_waiting():
    """``CupyDevice.snapshot`` against a stand-in for CuPy: the values' bytes and the
    failure record copied device-to-host into pinned memory in the launches' stream, then
    an event recorded there (``ready`` asks it, ``wait`` waits for it)."""
    from types import SimpleNamespace

    log = []

    class _Event:
        done = False

        def record(self, stream):
            log.append(("record", stream.name))

        def synchronize(self):
            log.append(("synchronize",))

    def memcpy(dst, src, nbytes, kind, stream):
        log.append(("copy", src, nbytes, kind, stream))

    dev = object.__new__(cuda.CupyDevice)
    dev.cp = SimpleNamespace(
        cuda=SimpleNamespace(
            Event=_Event,
            alloc_pinned_memory=lambda n: bytearray(n),
            runtime=SimpleNamespace(memcpyAsync=memcpy),
        )
    )
    dev._stream_obj = SimpleNamespace(name="launches", ptr=77)
    dev._stream = 77
    dev._err = SimpleNamespace(data=SimpleNamespace(ptr=5000))
    snap = dev.snapshot(1000, 12)
    values, record, _ = snap
    assert values.nbytes == 12 and record.dtype == np.int64 and len(record) == cuda.RECORD
    assert log == [
        ("copy", 1000, 12, 2, 77),
        ("copy", 5000, 8 * cuda.RECORD, 2, 77),
        ("record", "launches"),
    ]
    assert dev.ready(snap) is False
    dev.wait(snap)
    assert log[-1] == ("synchronize",)


def test_tf32_rounds_to_ten_bits_of_mantissa_to_the_nearest_even():
    one = np.float32(1.0)
    ulp = np.float32(2.0**-10)  # (TF32's last bit at 1)
    x = np.array(
        [1.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-11 + 2.0**-20, -(1 + 3 * 2.0**-11)],
        np.float32,
    )
    got = cuda.tf32(x)
    want = [one, one, one + 2 * ulp, one + ulp, -(one + 2 * ulp)]
    np.testing.assert_array_equal(got, np.array(want, np.float32))
    special = np.array([np.inf, -np.inf, np.nan, 0.0], np.float32)
    got = cuda.tf32(special)
    assert np.isinf(got[:2]).all() and np.isnan(got[2]) and got[3] == 0
    assert got.dtype == np.float32


PRODUCT = """
config N = 300, H = 64
dim i < 3
x[n] = sin(f32(n) * 0.37 + f32(arange(H)) * 0.0137)
dim n < N
m[0] = reshape(f32(arange(H * H)) * 0.0291 - 0.31, [H, H])
m[i+1] = m[i] * 0.75 + expand(sum(y[i], 0), 0) * 0.0001
y[i] = x[0:N] @ m[i]
out x, m, y
"""


@needs_cxx
def test_matmul_precision_tensorfloat32_rounds_the_products_operands(tmp_path):
    """``--matmul-precision tensorfloat32`` (the cuda backends): a BLAS product's float32
    operands are TF32 (on the emulated device, rounded to 10 bits of mantissa, ``tf32``);
    float32 by default; refused with exit 2 on another backend."""
    prog = tmp_path / "p.rtl"
    prog.write_text(src(PRODUCT))
    graph = graph_of(PRODUCT)
    gen = generate(compile_plan(run_passes(graph)), "cuda")
    assert any(
        isinstance(f, items.GemmCall)
        for _, ph in list(gen.plan.kernels.launches) + list(gen.plan.kernels.fused_launches)
        for f in ph
    )
    got = {}
    for precision in ("float32", "tensorfloat32"):
        out = tmp_path / f"{precision}.npz"
        r = cli(
            "run", prog, "--backend", "cuda-emu", "--matmul-precision", precision,
            "--outputs", out, "--no-progress",
        )  # fmt: skip
        assert r.exit_code == 0, r.stderr
        got[precision] = dict(np.load(out))
    for precision, operand in (("float32", lambda a: a), ("tensorfloat32", cuda.tf32)):
        x, m = got[precision]["x"], got[precision]["m"][:3]  # (each run's own m: y feeds it)
        want = np.einsum(
            "nh,ihk->ink", operand(x).astype(np.float64), operand(m).astype(np.float64)
        )
        np.testing.assert_allclose(got[precision]["y"], want, rtol=1e-5, atol=1e-5)
    x, m = got["tensorfloat32"]["x"], got["tensorfloat32"]["m"][:3]
    exact = np.einsum("nh,ihk->ink", x.astype(np.float64), m.astype(np.float64))
    assert not np.allclose(got["tensorfloat32"]["y"], exact, rtol=1e-5, atol=1e-5)
    r = cli("run", prog, "--matmul-precision", "tensorfloat32", "--no-progress")
    assert r.exit_code == 2
    assert "--matmul-precision tensorfloat32 is for the cuda backends" in r.stderr


def test_a_run_prints_its_chains_and_joint_products_as_chosen(capsys):
    """``runner._print_chains`` and ``_print_joints`` (one helper, ``_print_choices``): a
    line of how many ran each way, then a line for each that was timed at its first call
    (a choice untimed, as on the emulation, has none)."""
    import types

    from timerlc import runner

    rt = types.SimpleNamespace(
        chain_choices={
            ("chain", "f_0o"): (2e-5, 1e-5, True),
            ("chain", "f_3c"): (None, None, False),
        },
        joint_choices={("joint", "a", "b"): (3e-6, 4e-6, False)},
        product_disagreements={},
    )
    runner._print_chains(rt)
    runner._print_joints(rt)
    assert capsys.readouterr().err.splitlines() == [
        "  chains: 1 of 2 ran as one function, 1 as the launches they stand for",
        "    f_0o: the chain 10.0 us, the launches 20.0 us -> the chain",
        "  pairs of products in one pass (TF32): 0 ran so, 1 apart",
        "    a then b: joint 4.0 us, apart 3.0 us -> apart",
    ]
