"""Run programs on the cuda backend (the device runtime over a GPU, through CuPy) and
compare them with the cpu backend (LLVM kernels).

Each program is compiled for both backends, run on both, and its metrics and outputs
compared; it prints, per program, the launches, the device's peak memory, the bytes copied
each way, both runs' seconds and the largest relative difference (docs/cuda.md). A check
of the backend on a lent GPU, at the tests' small sizes; not a benchmark (the first run of
a module includes NVRTC's compile of it).

    python scripts/cuda_gpu_check.py [PROGRAM ...]     # default: every program
    python scripts/cuda_gpu_check.py --emu             # the same on the emulated device
    python scripts/cuda_gpu_check.py --matmul-precision tensorfloat32   # TF32 products

Exits 2 where CuPy or a GPU is missing, 1 where a program fails (its traceback printed, the
others still run) or its values differ by more than 1e-4 (1e-2 with TF32 products, whose
operands are rounded to 10 bits: against the cpu backend's float32).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
import traceback
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


def check(name: str, device, graphs: bool = True) -> float:
    from timerlc.compiler import compile_plan, generate_code, run_passes
    from timerlc.diagnostics import Source
    from timerlc.frontend.check import check_source
    from timerlc.runner import _print_products
    from timerlc.runtime.cpu import CpuRuntime
    from timerlc.runtime.cuda import DeviceRuntime

    path = ROOT / "programs" / f"{name}.rtl"
    graph = check_source(Source(str(path), path.read_text()), overrides=SMALL.get(name, {}))
    plan = compile_plan(run_passes(graph))
    cu = generate_code(plan, target="cuda")
    cpu = generate_code(plan)
    got, want = [], []
    started = time.perf_counter()
    rt = DeviceRuntime(
        cu.plan, lambda *m: got.append(m), text=cu.text, device=device, graphs=graphs
    )
    rt.run()
    dev_s = time.perf_counter() - started
    started = time.perf_counter()
    ref = CpuRuntime(cpu.plan, lambda *m: want.append(m), native=cpu.text)
    ref.run()
    cpu_s = time.perf_counter() - started
    diff = 0.0
    assert [m[:2] for m in got] == [m[:2] for m in want], name
    for (_, _, a), (_, _, b) in zip(got, want):
        if math.isnan(a) != math.isnan(b):  # (a nan on one side only: max() would skip it)
            diff = math.inf
        elif not math.isnan(a):
            diff = max(diff, abs(a - b) / max(1.0, abs(b)))
    for out, _, _ in plan.outputs:
        x, y = rt.value(out).astype(np.float64), ref.value(out).astype(np.float64)
        if x.size:
            both = np.isnan(x) & np.isnan(y)
            d = np.abs(x - y) / np.maximum(1.0, np.abs(y))
            d = np.where(both, 0.0, np.where(np.isnan(d), np.inf, d))  # (one side's nan)
            diff = max(diff, float(np.max(d)))
    print(
        f"{name:14s} {rt.launches:6d} launches, {rt.blas_calls:4d} BLAS products, "
        f"device peak {rt.device_peak_bytes:9d} B (arena {rt.layout.size if rt.layout else 0} B), "
        f"up {rt.uploaded:9d} B, down {rt.downloaded:9d} B, {rt.graph_replays} graph replays, "
        f"{len(rt._loop_parts)} loop kernels; "
        f"{dev_s:6.2f} s (cpu {cpu_s:5.2f} s); "
        f"metrics {len(got)}, largest relative difference {diff:.2e}",
        flush=True,
    )
    with contextlib.redirect_stderr(sys.stdout):  # (which products ran as ours, timed)
        _print_products(rt)
    for error in rt.graph_refusals[:1]:  # (the run went on as launches)
        print(f"  {name}: the GPU refused a CUDA graph: {error[:400]}", flush=True)
    rt.envs.close()
    ref.envs.close()
    return diff


def add_matmul_precision(ap):
    """The scripts' ``--matmul-precision`` (``open_device``'s ``matmul``) on parser ``ap``."""
    ap.add_argument(
        "--matmul-precision",
        default="float32",
        choices=("float32", "tensorfloat32"),
        help="the device's float32 products (tensorfloat32: TF32 on the tensor cores, ours "
        "and cuBLAS's, as `timerlc run --matmul-precision`)",
    )


def open_device(emu: bool, script: str, matmul: str = "float32"):
    """The GPU's device (``emu``: the emulated one), its float32 products as ``matmul``
    says, its name printed; None, with why, where there is none (the script then exits
    2)."""
    from timerlc.runtime.cuda import DeviceUnavailable, device_for

    try:
        device = device_for("cuda-emu" if emu else "cuda", matmul)
    except DeviceUnavailable as e:
        print(f"{script}: {e}")
        return None
    print(f"device: {device.describe()}", flush=True)
    return device


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("programs", nargs="*", help="program names (default: all)")
    ap.add_argument("--emu", action="store_true", help="the emulated device (cuda-emu)")
    ap.add_argument(
        "--no-graphs", action="store_true", help="launch every call (no CUDA graphs replayed)"
    )
    add_matmul_precision(ap)
    args = ap.parse_args()
    device = open_device(args.emu, "cuda_gpu_check", args.matmul_precision)
    if device is None:
        return 2
    names = args.programs or sorted(p.stem for p in (ROOT / "programs").glob("*.rtl"))
    worst, failed = 0.0, []
    for name in names:
        try:
            worst = max(worst, check(name, device, not args.no_graphs))
        except Exception:  # noqa: BLE001 - one program's failure is reported, the rest run
            failed.append(name)
            print(f"{name}: FAILED", flush=True)
            traceback.print_exc()
    print(f"largest relative difference over all: {worst:.2e}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    bar = 1e-2 if args.matmul_precision == "tensorfloat32" else 1e-4
    return 0 if worst < bar and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
