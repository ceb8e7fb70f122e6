"""The cuda backend without a GPU: ``timerlc compile --backend cuda`` writes the CUDA C of a
build (which nvcc compiles), ``--backend cuda`` says in one line why it cannot run here, and
the device runtime (``timerlc/runtime/cuda.py``) runs plans on the emulated device
(``cuda-emu``), whose memory is its own: a value the runtime forgets to copy between the
host and the device, a buffer it forgets to zero or a table entry it forgets to update gives
wrong values here, as it would on a GPU."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import cli, compiled_run, src, timerlc_cmd
from test_cuda import _nvcc

from timerlc.cuda.emu import compiler
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.plan import items
from timerlc.reference.interpreter import outputs, run_graph
from timerlc.runtime import cuda
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
    assert plan["kernels"]["trees"] == [] and not plan["kernels"].get("fused")
    assert len(plan["kernels"]["statements"]) > 100
    text = (out / "kernels" / "cuda.cu").read_text()
    assert text.startswith(items.CUDA_KERNELS_HEADER)
    launches = plan["kernels"]["launches"]
    assert [r[0] for r in launches] == [r[0] for r in plan["kernels"]["statements"]]
    assert text.count("__global__ void") == sum(len(phases) for _, phases in launches)
    # no machine code: the device's compiler makes it where the build runs
    assert sorted(p.name for p in (out / "kernels").iterdir()) == ["cuda.cu"]
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (TIMERLC_REQUIRE_NVCC=1 makes this a failure)")
    cmd = [nvcc, "-c", "-x", "cu", str(out / "kernels" / "cuda.cu"), "-o", str(tmp_path / "k.o")]
    cmd += ["--fmad=false", "-t", "2", "-gencode", "arch=compute_80,code=sm_80"]
    cmd += ["-gencode", "arch=compute_90,code=sm_90"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning" not in r.stderr, r.stderr[-3000:]


def test_run_on_cuda_where_it_cannot_run_is_one_line_and_exit_2(tmp_path, monkeypatch):
    def no_gpu(self):
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
    r = cli("run", out, "--backend", "cuda-emu", "--metrics", tmp_path / "emu.csv", "--profile")
    assert r.exit_code == 0, r.stderr
    assert "device runtime:" in r.stderr and "launches" in r.stderr
    r = cli("run", PROGRAMS / "reinforce.rtl", *SMALL_REINFORCE, "--metrics", tmp_path / "cpu.csv")
    assert r.exit_code == 0, r.stderr
    emu = (tmp_path / "emu.csv").read_text().splitlines()
    cpu = (tmp_path / "cpu.csv").read_text().splitlines()
    assert len(emu) == len(cpu) > 3
    for a, b in zip(emu[1:], cpu[1:]):
        *ka, va = a.split(",")
        *kb, vb = b.split(",")
        assert ka == kb and math.isclose(float(va), float(vb), rel_tol=1e-4, abs_tol=1e-5), (a, b)


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
    """``y`` takes ``x``'s memory: its kernel computes the max and the mean once (one
    thread), then every point into a temporary, then copies it into the buffer (1000
    threads each, over several blocks, the emulation's three, striding over the points)."""
    graph = graph_of(STEPS)
    rt, gen = compiled_run(graph, backend="cuda-emu")
    (sid,) = [s.id for s in gen.plan.statements if gen.plan.buffer(s.id).name == "y"]
    assert gen.plan.buffer(sid).donor is not None
    phases = dict(gen.plan.kernels.launches)[sid]
    assert phases == ((f"s{sid}", 1), (f"s{sid}_1", 1000), (f"s{sid}_2", 1000))
    assert "(long long)gridDim.x * blockDim.x" in gen.text
    cpu, _ = compiled_run(graph, backend="cpu")
    same_outputs(rt, cpu, ("y",))
    want = outputs(run_graph(graph))["y"]
    np.testing.assert_allclose(rt.value("y"), want, rtol=1e-5, atol=1e-6)


@needs_cxx
def test_a_point_that_fails_in_a_later_block_is_reported():
    """The take's index leaves the source at k = 700, which the third block of the grid
    computes: the block's code reaches the runtime, and the interpreter names the point."""
    text = """
    config K = 1000
    dim k < K
    x[k] = f32(k)
    y[k] = take(x[0:K], k + k // 700 * 5000)
    out y
    """
    graph = graph_of(text)
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
        (lambda k: k["launches"][0][1].__setitem__(0, ["zz", 1]), "first launch"),
        (lambda k: k["launches"][0][1].append([k["launches"][0][1][0][0], 1]), "named twice"),
        (lambda k: k["launches"][0][1][0].__setitem__(1, 0), "out of range"),
        (lambda k: k["launches"][0].__setitem__(1, []), "1 to 64 launches"),
    ]
    for change, words in cases:
        bad = json.loads(json.dumps(data))
        change(bad["kernels"])
        with pytest.raises(items.PlanError, match=words):
            items.from_json(bad, "p")


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
    assert "(1 thread), " in text and "(1000 threads)" in text
