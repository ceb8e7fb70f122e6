"""Run programs with their CUDA C kernels on a GPU (CuPy) and compare with the LLVM kernels.

The first slice of the cuda backend renders the kernels (timerlc/cuda/render.py) but has no
device runtime yet: this check runs a plan on the cpu runtime, one statement call at a time,
and runs each statement that has a CUDA kernel on the GPU: the buffers it names are copied to
the device, the kernel is launched as one block, and what it wrote is copied back. Slow, and
only a check of the generated kernels themselves (docs/cuda.md); its output is each
program's largest difference from the LLVM run.

    python scripts/cuda_gpu_check.py [PROGRAM ...]     # default: every program, small sizes

Needs CuPy and a GPU; it compiles the module with nvcc (CuPy's ``backend="nvcc"``).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SMALL = {
    "ppo": {"B": "4", "T": "16", "total_steps": "128"},
    "reinforce": {"I": "3", "B": "4", "T": "16"},
    "reinforce_td": {"I": "3", "B": "4", "T": "16"},
    "rnn_reinforce": {"I": "3", "B": "4", "T": "16"},
}
DTYPE = {"bool": np.uint8, "i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64}
THREADS = 128


def gpu_kernels(cp, mod, gen, skipped, rt_box):
    """Per kernel name, a function ``(table, args, scratch) -> code`` that runs the kernel
    on the GPU over copies of the buffers it names."""
    plan = gen.plan
    out = {}
    for k in gen.kernels:
        if k.name in skipped:
            continue
        fn = mod.get_function(k.name)

        def call(table, args, scratch, k=k, fn=fn):
            rt = rt_box[0]
            size = max(s.index for s in k.slots) + 1 if k.slots else 1
            ptrs = np.zeros(size, np.uint64)
            keep = []
            for s in k.slots:
                addr = int(rt.table[s.index])
                if s.state:  # an environment's state array, which the runtime keeps
                    host = next(a for a in rt.env_state.values() if a.ctypes.data == addr)
                else:
                    buf = plan.buffer(s.sid)
                    n = math.prod(buf.extents) * math.prod(buf.outputs[s.out].shape)
                    size = n * np.dtype(DTYPE[s.dtype]).itemsize
                    host = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(addr)).view(
                        DTYPE[s.dtype]
                    )
                dev = cp.asarray(host)
                ptrs[s.index] = dev.data.ptr
                keep.append((s, host, dev))
            nargs = max(len(k.params), 1)
            a = np.ctypeslib.as_array((ctypes.c_int64 * nargs).from_address(args)).copy()
            d_table, d_args = cp.asarray(ptrs), cp.asarray(a)
            d_scratch = cp.zeros(max(k.scratch_bytes, 8), cp.uint8)
            d_err = cp.zeros(1, cp.int32)
            fn((1,), (THREADS,), (d_table, d_args, d_scratch, d_err))
            code = int(d_err.get()[0])
            if code == 0:
                for s, host, dev in keep:
                    if s.write:
                        host[...] = dev.get()
            return code

        out[k.name] = call
    return out


def check(name: str, cp) -> float:
    from timerlc.compiler import compile_plan, generate_code, run_passes
    from timerlc.cuda.render import render_module
    from timerlc.diagnostics import Source
    from timerlc.frontend.check import check_source
    from timerlc.runtime.cpu import CpuRuntime

    path = ROOT / "programs" / f"{name}.rtl"
    graph = check_source(Source(str(path), path.read_text()), overrides=SMALL.get(name, {}))
    gen = generate_code(compile_plan(run_passes(graph)))
    text, skipped = render_module(gen.kernels + gen.fused)
    started = time.perf_counter()
    mod = cp.RawModule(code=text, backend="nvcc", options=("-std=c++17", "--fmad=false"))
    box = [None]
    kernels = gpu_kernels(cp, mod, gen, skipped, box)  # (nvcc runs at the first)
    compiled = time.perf_counter() - started
    got, want = [], []
    rt = CpuRuntime(gen.plan, lambda *m: got.append(m), native=gen.text, kernels=kernels)
    box[0] = rt
    rt.run()
    ref = CpuRuntime(gen.plan, lambda *m: want.append(m), native=gen.text)
    ref.run()
    diff = 0.0
    assert [m[:2] for m in got] == [m[:2] for m in want], name
    for (_, _, a), (_, _, b) in zip(got, want):
        if not (math.isnan(a) and math.isnan(b)):
            diff = max(diff, abs(a - b) / max(1.0, abs(b)))
    for out, _, _ in gen.plan.outputs:
        x, y = rt.value(out).astype(np.float64), ref.value(out).astype(np.float64)
        if x.size:
            both = np.isnan(x) & np.isnan(y)
            d = np.abs(x - y) / np.maximum(1.0, np.abs(y))
            diff = max(diff, float(np.max(np.where(both, 0.0, d))))
    n = len(gen.kernels) + len(gen.fused)
    print(
        f"{name:14s} kernels {n - len(skipped)}/{n} on the GPU (nvcc {compiled:.1f} s), "
        f"metrics {len(got)}, largest relative difference {diff:.2e}",
        flush=True,
    )
    return diff


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("programs", nargs="*", help="program names (default: all)")
    args = ap.parse_args()
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no CuPy or no GPU: say so
        print(f"cuda_gpu_check: no GPU through CuPy here ({type(e).__name__}: {e})")
        return 2
    names = args.programs or sorted(p.stem for p in (ROOT / "programs").glob("*.rtl"))
    worst = max(check(n, cp) for n in names)
    print(f"largest relative difference over all: {worst:.2e}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
