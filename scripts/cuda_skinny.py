"""Benchmark: PPO's skinny products on the GPU, cuBLAS against our kernels (cuda/products.py).

PPO's minibatch step at 2048 x 128 makes products of 65,536 rows by 64 columns or fewer
(``x @ W``, ``dy @ W^T`` with a 64 x 64 or 4 x 64 weight, the value and policy heads' 64 x 1
and 64 x 2) and the weights' gradients over the rows (``x^T @ dy``), each bias's gradient
``sum(dy, 0)`` with it: on the H100 cuBLAS took 25-32 us for each in float32 where the bytes
take 5-11 (docs/performance.md, eleventh session). The renderer gives each kernels of ours
(``products.rows_lines``, ``gram_part_lines``, ``gram_sum_lines``), which the runtime times
against cuBLAS at a shape's first call; this measures them apart, at PPO's shapes: per
shape the device time (median of ``--repeats`` calls) of cuBLAS in float32 and in TF32 and
of ours (a gram's also with B's column sums, which cuBLAS does not make; a rows
product's also with a layer's bias and ``tanh`` made as it stores C, the epilogue the
renderer fuses: ``render._Kernel._rows_epilogues``), each result checked against NumPy
(float64); and where a shape has them (``products.tf32_form``), our TF32 functions (the
tensor cores' ``mma.sync``, for ``--matmul-precision tensorfloat32``), checked against
NumPy's product of the operands rounded to TF32.

  python scripts/cuda_skinny.py                       # on the GPU
  python scripts/cuda_skinny.py --emu --rows 200      # cuda-emu: the kernels' values only
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# (label, m, n, k, A read transposed, B read transposed); ROWS stands for --rows
ROWS = -1
SHAPES = [
    ("x @ W (64 x 64)", ROWS, 64, 64, False, False),
    ("dy @ W^T (64 x 64)", ROWS, 64, 64, False, True),
    ("x @ W (4 x 64)", ROWS, 64, 4, False, False),
    ("h @ W (64 x 2)", ROWS, 2, 64, False, False),
    ("h @ W (64 x 1)", ROWS, 1, 64, False, False),
    ("x^T @ dy (64 x 64)", 64, 64, ROWS, True, False),
    ("x^T @ dy (4 x 64)", 4, 64, ROWS, True, False),
    ("h^T @ dy (64 x 2)", 64, 2, ROWS, True, False),
    ("h^T @ dy (64 x 1)", 64, 1, ROWS, True, False),
]


def gemms(rows: int) -> list:
    """Each shape as the renderer's kernel IR gemm (its operands packed: ld = columns)."""
    from timerlc.codegen import kir

    out = []
    for _, m, n, k, ta, tb in SHAPES:
        m, k = (rows if m == ROWS else m), (rows if k == ROWS else k)
        lda, ldb = (m if ta else k), (k if tb else n)
        zero = kir.i64(0)
        out.append(kir.Gemm("f32", ta, tb, m, n, k, "a", zero, lda, "b", zero, ldb, "c", zero, n))
    return out


# a layer's bias (at the table's entry 3, floats) and tanh, as a rows product's epilogue
TANH = "tanhf(tl_v + ((const float *)table[3])[tl_col])"


def module_text(rows: int) -> str:
    """The module: the renderer's head, then each shape's functions of ours (``s{i}``; a
    gram's with B's column sums too, a rows product's with ``TANH``: ``s{i}x``) and their
    entries for the emulation."""
    from timerlc.cuda import products, render

    parts = [render.head()]
    for i, s in enumerate(gemms(rows)):
        fns = products.standalone(s, f"s{i}")
        if products.form(s.dtype, s.m, s.n, s.k, s.ta, s.tb) == "gram":
            fns += products.standalone(s, f"s{i}x", sums=True)
        else:
            fns += products.standalone(s, f"s{i}x", epilogue=TANH)
        if products.tf32_form(s.m, s.n, s.k, s.ta, s.tb):  # (TF32: s{i}t, s{i}tx)
            fns += products.standalone(s, f"s{i}t", tf32=True)
            gram = products.form(s.dtype, s.m, s.n, s.k, s.ta, s.tb) == "gram"
            fns += products.standalone(
                s, f"s{i}tx", sums=gram, epilogue=None if gram else TANH, tf32=True
            )
        for name, text in fns:
            parts += [text, render._emu_entry(name, 1)]
    return "\n".join(parts)


def measure(device, tf32, module, i: int, s, label: str, args, rng) -> tuple[float, float]:
    """Shape ``i``'s line of the table: its products timed (on a GPU) and checked; ours'
    largest error relative to the largest value, and our TF32 functions' against the
    product of the operands rounded to TF32 (0 where the shape has none)."""
    from timerlc.cuda import products
    from timerlc.runtime import cuda
    from timerlc.runtime.cuda import THREADS

    a = rng.standard_normal((s.k, s.m) if s.ta else (s.m, s.k)).astype(np.float32)
    b = (rng.standard_normal((s.n, s.k) if s.tb else (s.k, s.n)) * 0.1).astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.T if s.ta else a64) @ (b64.T if s.tb else b64)
    want_sums = (b64.T if s.tb else b64).sum(0)
    bias = (rng.standard_normal(s.n) * 0.1).astype(np.float32)
    want_tanh = np.tanh(want + bias.astype(np.float64))
    ptrs = [device.alloc(x.nbytes) for x in (a, b)] + [device.alloc(s.m * s.n * 4)]
    ptrs.append(device.alloc(s.n * 8))
    for p, x in zip(ptrs, (a, b)):
        device.upload(p, x)
    table = device.alloc(8 * 4)
    device.upload(table, np.array(ptrs, np.uint64))
    scratch = device.alloc(max(8, products.scratch_bytes(s.m, s.n, s.k, s.ta, s.tb, True)))
    values = np.zeros(1, np.int64)
    kinds = products.launches(s.m, s.n, s.k, s.ta, s.tb)
    gram = kinds != ("rows",)
    if not gram:
        device.upload(ptrs[3], bias)  # (a rows product's epilogue's bias)

    def ours(sums: bool, t: str = ""):
        fns = []
        for kind in kinds:
            name = f"s{i}{t}{'x' if sums else ''}{kind[0]}"
            if kind == "sum":  # (a TF32 gram's copies added by the float32 one's function)
                name = f"s{i}{'x' if sums else ''}s"
            fn = device.function(module, name)
            if kind == "rows" and t:
                threads = products.rows_tf32_threads(s.m)
            elif kind == "rows":
                threads = products.rows_threads(s.m, s.n, s.k)
            elif kind == "part":
                threads = products.gram_part_threads(s.k)
            else:
                threads = products.gram_sum_threads(s.m, s.n, s.k)
            fns.append((fn, min(-(-threads // THREADS), device.grid_limit(fn))))

        def run():
            for fn, grid in fns:
                device.launch(fn, table, values, scratch, grid)

        return run

    def blas(dev):
        return lambda: dev.gemm(
            "f32", s.m, s.n, s.k, ptrs[0], s.lda, s.ta, ptrs[1], s.ldb, s.tb, ptrs[2], s.ldc
        )

    has_tf32 = products.tf32_form(s.m, s.n, s.k, s.ta, s.tb)
    a_t, b_t = (cuda.tf32(x, away=True).astype(np.float64) for x in (a, b))
    want_t = (a_t.T if s.ta else a_t) @ (b_t.T if s.tb else b_t)
    wants = {"": (want, want_tanh), "t": (want_t, np.tanh(want_t + bias.astype(np.float64)))}
    errs = {"": 0.0, "t": 0.0}
    for t in ("", "t") if has_tf32 else ("",):
        for sums in (False, True):  # (a gram's with column sums; a rows product's with TANH)
            device.upload(ptrs[2], np.full(s.m * s.n, np.nan, np.float32))
            ours(sums, t)()
            got = np.empty(s.m * s.n, np.float32)
            device.download(ptrs[2], got)
            plain, tanh = wants[t]
            e = _error(got.reshape(s.m, s.n), tanh if sums and not gram else plain)
            errs[t] = max(errs[t], e)
            if sums and gram:
                got_sums = np.empty(s.n)
                device.download(ptrs[3], got_sums)
                errs[t] = max(errs[t], _error(got_sums, want_sums))
    err, err_t = errs[""], errs["t"]
    shown_t = f"{err_t:.2e}" if has_tf32 else "-"
    if tf32 is None:  # (the emulation: values only)
        print(f"| {label} | - | - | - | - | {err:.2e} | - | - | {shown_t} |", flush=True)
        return err, err_t
    f32_us, tf32_us = _timed(blas(device), device, args), _timed(blas(tf32), tf32, args)
    ours_us = _timed(ours(False), device, args)
    sums_us = f"{_timed(ours(True), device, args):.1f}"
    t_us = t_sums_us = "-"
    if has_tf32:
        t_us = f"{_timed(ours(False, 't'), device, args):.1f}"
        t_sums_us = f"{_timed(ours(True, 't'), device, args):.1f}"
    print(
        f"| {label} | {f32_us:.1f} | {tf32_us:.1f} | {ours_us:.1f} | {sums_us} | {err:.2e} "
        f"| {t_us} | {t_sums_us} | {shown_t} |",
        flush=True,
    )
    return err, err_t


def _error(got, want) -> float:
    """The largest difference of ``got`` from ``want``, relative to want's largest value (at
    least 1)."""
    return float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))


def _timed(run, dev, args) -> float:
    """Microseconds of the device's time for ``run`` (median of ``args.repeats`` calls,
    after a first)."""
    run()
    times = []
    for _ in range(args.repeats):
        start = dev.mark()
        run()
        times.append(dev.elapsed(start, dev.mark()))
    return statistics.median(times) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emu", action="store_true", help="the emulated device (values only)")
    ap.add_argument("--rows", type=int, default=65536, help="rows (default PPO's 65,536)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls of each (median)")
    args = ap.parse_args()
    from cuda_gpu_check import open_device

    from timerlc.runtime.cuda import device_for

    device = open_device(args.emu, "cuda_skinny")
    if device is None:
        return 2
    tf32 = None if args.emu else device_for("cuda", matmul="tensorfloat32")
    module = device.load(module_text(args.rows))
    rng = np.random.default_rng(0)
    print(
        f"| product ({args.rows} rows) | cuBLAS f32 us | cuBLAS TF32 us | ours us | "
        "ours with B's column sums (gram) or bias and tanh (rows) us | error | ours TF32 us "
        "| ours TF32 with sums or bias and tanh us | TF32 error |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    worst = worst_t = 0.0
    for i, (s, (label, *_)) in enumerate(zip(gemms(args.rows), SHAPES)):
        err, err_t = measure(device, tf32, module, i, s, label, args, rng)
        worst, worst_t = max(worst, err), max(worst_t, err_t)
    print(f"largest error / largest value over all: {worst:.2e} (TF32's: {worst_t:.2e})")
    # (TF32's against the operands rounded to TF32: the tensor cores' sums may round
    # otherwise than float32's in order, far less than a wrong fragment's error)
    return 0 if worst < 1e-4 and worst_t < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
