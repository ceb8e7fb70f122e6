"""A large gather that only products read (a minibatch's rows of image-sized observations):
not stored (``schedule.build._gathered_operands``), each product computing its rows a tile
at a time (``codegen.lower._Lowering._tiled_gemm``). The thresholds are lowered here so that
a small program takes that path: the values must be the reference's on every compiled
backend, and the plan must hold no buffer of the gathered rows."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import numpy as np
import pytest
from rtl_helpers import reference_and_native, src

from timerlc.codegen import kir, lower
from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.diagnostics import Source
from timerlc.frontend.check import check_source
from timerlc.schedule import build

# a minibatch of M rows of D features, gathered from N, through two layers' products: the
# first layer's (rows x w: tiles along D) and its weight's gradient (rows^T x g: tiles along
# D, the product's rows); D a tile's width and a part of one (the last tile narrower)
PROGRAM = """
config N = 64, D = 45, H = 5, M = 12, S = 4
dim s < S
obs = reshape(sin(f32(arange(N * D)) * 0.37), [N, D])
perm[s] = permutation(N)
idx[s] = perm[s][0:M]
params net[s] {
  w1 : f32[D, H] = normal(0.3)
  w2 : f32[D, H] = normal(0.3)
}
xb[s] = take(obs, idx[s], 0)
h[s] = tanh(xb[s] @ net[s].w1)
v[s] = tanh(xb[s] @ net[s].w2)
loss[s] = sum(h[s] * h[s]) + mean(v[s])
net[s+1] = adam(net[s], grad(loss[s], net[s]), 0.01)
out net, h, v, loss
"""

BYTES = 12 * 45 * 4  # the gathered rows'


@pytest.fixture
def small_tiles(monkeypatch):
    """Thresholds under the program's gather: tiles of 100 floats (along D: 8 columns of
    12 rows, the last of 5; along the gradient's rows: 8 rows of its 12 columns); for the
    cuda target, of 200 (``GPU_SCRATCH``: 16 columns or rows, the last of 13)."""
    monkeypatch.setattr(build, "GATHER_OPERAND_BYTES", BYTES - 1)
    monkeypatch.setattr(lower, "TILED_OPERAND_BYTES", BYTES - 1)
    monkeypatch.setattr(lower, "OPERAND_TILE_BYTES", 400)
    monkeypatch.setattr(lower, "GPU_SCRATCH", 800)


def _graph(text: str = PROGRAM):
    return check_source(Source("p.rtl", src(text)))


def _gemms(gen) -> list[kir.Gemm]:
    return [
        s
        for k in (*gen.kernels, *gen.fused)
        for s in kir.walk_tree(k.body)
        if isinstance(s, kir.Gemm)
    ]


def _takes(plan) -> list[int]:
    return [st.id for st in plan.statements if st.node.op == "take"]


def test_a_large_gather_only_products_read_is_not_stored(small_tiles):
    plan = compile_plan(run_passes(_graph()))
    assert _takes(plan) == []
    gen = generate_code(plan)
    widths = sorted((g.k, g.m) for g in _gemms(gen))
    # along D: 5 tiles of 8 columns (12 x 8 x 4 bytes <= 400) and the last of 5, for each
    # layer's product; the gradients: 5 tiles of 8 of the weight's 45 rows, the last of 5
    assert widths.count((8, 12)) == 2 * 5 and widths.count((5, 12)) == 2
    assert widths.count((12, 8)) == 2 * 5 and widths.count((12, 5)) == 2


def test_the_cuda_target_s_tiles_are_as_large_as_a_call_s_unblocked_scratch(small_tiles):
    """On a GPU every call shares one scratch memory: tiles of ``GPU_SCRATCH``, fewer
    launches a product than the cpu's tiles (each kernel's own scratch there)."""
    plan = compile_plan(run_passes(_graph()))
    cu = generate_code(dataclasses.replace(plan, kernels=None), target="cuda")
    # (each statement's own kernel; the fused ones the trees launch hold them again)
    widths = sorted(
        (g.k, g.m) for k in cu.kernels for g in kir.walk_tree(k.body) if isinstance(g, kir.Gemm)
    )
    assert widths.count((16, 12)) == 2 * 2 and widths.count((13, 12)) == 2
    assert widths.count((12, 16)) == 2 * 2 and widths.count((12, 13)) == 2


def test_a_gather_under_the_threshold_is_stored_as_before():
    plan = compile_plan(run_passes(_graph()))
    assert len(_takes(plan)) == 1
    assert not any(g.m == 8 or g.k == 8 for g in _gemms(generate_code(plan)))


def test_a_gather_something_else_reads_is_stored(small_tiles):
    """The rows also summed (a reader that is no product): one buffer, read by all."""
    text = PROGRAM.replace("out net, h, v, loss", "rs[s] = sum(xb[s])\nout net, h, v, loss, rs")
    plan = compile_plan(run_passes(_graph(text)))
    assert len(_takes(plan)) == 1


def test_products_of_gathered_tiles_give_the_reference_s_values(small_tiles):
    """On the cpu backend and, where there is a host C++ compiler, on cuda-emu
    (``reference_and_native`` runs every compiled backend under test)."""
    want, got, gen = reference_and_native(_graph())
    assert _gemms(gen)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-5, atol=2e-6, err_msg=name)


def test_the_tiled_products_cuda_source_compiles_with_nvcc(small_tiles, tmp_path):
    import os

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if os.environ.get("TIMERLC_REQUIRE_NVCC") == "1":
            pytest.fail("nvcc is not on PATH and TIMERLC_REQUIRE_NVCC=1")
        pytest.skip("nvcc is not on PATH (TIMERLC_REQUIRE_NVCC=1 makes this a failure)")
    plan = compile_plan(run_passes(_graph()))
    cu = generate_code(dataclasses.replace(plan, kernels=None), target="cuda")
    assert not cu.interpreted, cu.interpreted
    path = tmp_path / "p.cu"
    path.write_text(cu.text)
    cmd = [nvcc, "-cubin", "-x", "cu", str(path), "-o", str(tmp_path / "p.cubin")]
    cmd += ["--fmad=false", "-gencode", "arch=compute_80,code=sm_80", "-Ofc", "max"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning" not in r.stderr, r.stderr[-3000:]


def test_a_minibatch_s_gather_of_the_flattened_rollout_loads_consecutive_elements():
    """``take(reshape(o[i, 0:B, 0:T], [B * T, obs_dim]), idx, 0)``: the reshape is a strided
    view of the rollout's buffer, so each element loads at its strides (``lower._view``),
    not at its 5-dim index unravelled from the flat one (divisions and remainders an
    element: no vector loads). At image-sized observations the gather of 384 MiB took 168
    ms that way, 40 this way (docs/performance.md)."""
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "programs" / "ppo.rtl"
    graph = check_source(
        Source(str(path), path.read_text()), overrides={"B": "4", "T": "16", "total_steps": "128"}
    )
    gen = generate_code(compile_plan(run_passes(graph)))
    (sid,) = [
        st.id
        for st in gen.plan.statements
        if st.node.op == "take" and st.node.types[0].shape[-1] == 4
    ]
    stores = [
        line
        for k in (*gen.kernels, *gen.fused)
        for line in kir.text(k).splitlines()
        if line.strip().startswith(f"b{sid}_0[")
    ]
    assert stores
    for line in stores:
        assert "floordiv" not in line and "mod(" not in line, line
