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
NumPy's product of the operands rounded to TF32; then the joint function of PPO's
``dz @ W^T`` and ``h^T @ dz`` (``products.joint_tf32_lines``: one pass over their rows)
against our two TF32 functions apart.

With ``--tilings TMxTN,...`` it measures instead our float32 rows products (the rows
shapes above, plain and with ``tanh`` as their epilogue) with each thread's tile of C forced
to TM rows by TN columns (``products._rows_tiling``: TN must divide the product's columns
and the block's tile of A fit its shared memory, else that shape keeps its own tiling, as
the line says): on the H200 these ran at a quarter of the memory's bandwidth (twentieth
session), their inner loop 12 loads of shared memory for 32 FMAs at the 4 x 8 tiles.

  python scripts/cuda_skinny.py                       # on the GPU
  python scripts/cuda_skinny.py --emu --rows 200      # cuda-emu: the kernels' values only
  python scripts/cuda_skinny.py --tilings 4x8,8x8,2x8,4x4,8x4,1x8
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
        parts += [text for _, text in fns]
    r, g = joint_gemms(rows)  # (the joint function, and the two it stands for: TF32)
    fns = products.joint_standalone(r, g, "jt", sums=True, epilogue=_grad(0))
    fns += products.standalone(r, "jr", epilogue=_grad(3), tf32=True)
    fns += products.standalone(g, "jg", sums=True, tf32=True)
    parts += [text for _, text in fns]
    return "\n".join(parts)


def _grad(entry: int) -> str:
    """A gradient's epilogue ``dh * (1 - h^2)``, h 64 columns at the table's ``entry``."""
    h = f"((const float *)table[{entry}])[r * 64 + tl_col]"
    return f"tl_v * (1.0f - {h} * {h})"


def joint_gemms(rows: int) -> tuple:
    """PPO's ``dz @ W^T`` (64 x 64) and ``h^T @ dz`` over ``rows`` rows: the pair a joint
    function makes in one pass (``products.joint_tf32_lines``)."""
    from timerlc.codegen import kir

    zero = kir.i64(0)
    r = kir.Gemm("f32", False, True, rows, 64, 64, "b", zero, 64, "w", zero, 64, "c", zero, 64)
    g = kir.Gemm("f32", True, False, 64, 64, rows, "a", zero, 64, "b", zero, 64, "g", zero, 64)
    return r, g


def measure_joint(device, tf32, module, rows: int, args, rng) -> float:
    """The joint function's line: the device time of the joint (with the gradient's
    epilogue and dz's column sums), of our two TF32 functions apart (the same), and of
    cuBLAS's two TF32 products (neither); the joint's error against NumPy's products of the
    operands rounded to TF32 (the rows' C and the gram's, relative to each one's largest
    value)."""
    from timerlc.cuda import products
    from timerlc.runtime import cuda
    from timerlc.runtime.cuda import THREADS

    h = np.tanh(rng.standard_normal((rows, 64))).astype(np.float32)
    dz = (rng.standard_normal((rows, 64)) * 0.1).astype(np.float32)
    w = (rng.standard_normal((64, 64)) * 0.1).astype(np.float32)
    ht, dzt, wt = (cuda.tf32(x, away=True).astype(np.float64) for x in (h, dz, w))
    want_r = (dzt @ wt.T) * (1 - h.astype(np.float64) ** 2)
    want_g = ht.T @ dzt
    n = rows * 64 * 4
    ptrs = [device.alloc(x) for x in (n, n, 64 * 64 * 4, n, 64 * 64 * 4, 64 * 8)]
    for p, x in zip(ptrs, (h, dz, w)):
        device.upload(p, x)
    scratch = device.alloc(max(8, products.scratch_bytes(64, 64, rows, True, False, True)))
    values = np.zeros(1, np.int64)

    def table(entries):
        t = device.alloc(8 * len(entries))
        device.upload(t, np.array([ptrs[e] for e in entries], np.uint64))
        return t

    joint_table = table([0, 1, 2, 3, 4, 5])
    rows_table, gram_table = table([1, 2, 3, 0]), table([0, 1, 4, 5])
    part_threads = products.gram_part_threads(rows)
    launches = {
        "joint": [("jtj", joint_table, part_threads)],
        "apart": [("jrr", rows_table, products.rows_tf32_threads(rows))],
    }
    launches["apart"] += [("jgp", gram_table, part_threads)]
    sum_threads = products.gram_sum_threads(64, 64, rows)
    if products.parts(rows) > 1:
        launches["joint"].append(("jts", joint_table, sum_threads))
        launches["apart"].append(("jgs", gram_table, sum_threads))

    def run(what: str):
        fns = []
        for name, tab, threads in launches[what]:
            fn = device.function(module, name)
            fns.append((fn, tab, min(-(-threads // THREADS), device.grid_limit(fn))))

        def go():
            for fn, tab, grid in fns:
                device.launch(fn, tab, values, scratch, grid)

        return go

    got_r, got_g = np.empty((rows, 64), np.float32), np.empty((64, 64), np.float32)
    run("joint")()
    device.download(ptrs[3], got_r)
    device.download(ptrs[4], got_g)
    err = max(_error(got_r, want_r), _error(got_g, want_g))
    if tf32 is None:
        print(f"| joint: dz @ W^T with (1 - h^2), h^T @ dz with sums | - | - | - | {err:.2e} |")
        return err
    joint_us, apart_us = _timed(run("joint"), device, args), _timed(run("apart"), device, args)

    def blas():
        tf32.gemm("f32", rows, 64, 64, ptrs[1], 64, False, ptrs[2], 64, True, ptrs[3], 64)
        tf32.gemm("f32", 64, 64, rows, ptrs[0], 64, True, ptrs[1], 64, False, ptrs[4], 64)

    blas_us = _timed(blas, tf32, args)
    print(
        f"| joint: dz @ W^T with (1 - h^2), h^T @ dz with sums | {joint_us:.1f} | "
        f"{apart_us:.1f} | {blas_us:.1f} | {err:.2e} |"
    )
    return err


def measure(device, tf32, module, i: int, s, label: str, args, rng) -> tuple[float, float]:
    """Shape ``i``'s line of the table: its products timed (on a GPU) and checked; ours'
    largest error relative to the largest value, and our TF32 functions' against the
    product of the operands rounded to TF32 (0 where the shape has none)."""
    from timerlc.cuda import products
    from timerlc.runtime import cuda
    from timerlc.runtime.cuda import THREADS

    a, b, bias, ptrs, table = _operands(device, s, rng)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.T if s.ta else a64) @ (b64.T if s.tb else b64)
    want_sums = (b64.T if s.tb else b64).sum(0)
    want_tanh = np.tanh(want + bias.astype(np.float64))
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


def _operands(device, s, rng):
    """Product ``s``'s A and B and a bias of its n columns, drawn in that order, and the
    device memory a function of ours reads by its table: A and B uploaded, C (m x n
    float32), and the bias's or a gram's column sums' (n float64s); the table."""
    a = rng.standard_normal((s.k, s.m) if s.ta else (s.m, s.k)).astype(np.float32)
    b = (rng.standard_normal((s.n, s.k) if s.tb else (s.k, s.n)) * 0.1).astype(np.float32)
    bias = (rng.standard_normal(s.n) * 0.1).astype(np.float32)
    ptrs = [device.alloc(x.nbytes) for x in (a, b)] + [device.alloc(s.m * s.n * 4)]
    ptrs.append(device.alloc(s.n * 8))
    for p, x in zip(ptrs, (a, b)):
        device.upload(p, x)
    table = device.alloc(8 * 4)
    device.upload(table, np.array(ptrs, np.uint64))
    return a, b, bias, ptrs, table


def forced_tiling(tm: int, tn: int):
    """``products._rows_tiling`` with a thread's tile ``tm x tn`` where the shape allows it
    (else the shape's own), and whether it does (for the shape's ``n, k``)."""
    from timerlc.cuda import products

    own = products._rows_tiling

    def forced(n: int, k: int):  # (the forced tiling, or None where it does not fit)
        if n % tn:
            return None
        ct = n // tn
        bm = max(1, products.MAX_THREADS // ct) * tm
        bmp = bm + (1 - bm) % 32
        return (tm, tn, ct, bm, bmp) if k * n + k * bmp <= products.SMEM_FLOATS else None

    def tiling(n: int, k: int, chain: bool = False):  # (a chain's own, products.rows_lines)
        return own(n, k, chain) if chain else forced(n, k) or own(n, k)

    return tiling, lambda n, k: forced(n, k) is not None


def sweep_tilings(device, args, rng) -> float:
    """``--tilings``: each rows shape's product of ours with each forced tiling, timed and
    checked (plain, and with ``TANH``); the largest error."""
    from timerlc.cuda import products, render
    from timerlc.runtime.cuda import THREADS

    own = products._rows_tiling
    rows_shapes = [
        (i, s, label)
        for i, (s, (label, *_)) in enumerate(zip(gemms(args.rows), SHAPES))
        if products.launches(s.m, s.n, s.k, s.ta, s.tb) == ("rows",)
    ]
    print(
        f"| rows product ({args.rows} rows) | tile TM x TN | ours us "
        "| with bias and tanh us | error |"
    )
    print("|---|---|---|---|---|")
    worst = 0.0
    for text in args.tilings.split(","):
        tm, tn = (int(x) for x in text.lower().split("x"))
        tiling, fits = forced_tiling(tm, tn)
        products._rows_tiling = tiling
        try:
            parts = [render.head()]
            for i, s, _ in rows_shapes:
                fns = products.standalone(s, f"s{i}") + products.standalone(
                    s, f"s{i}x", epilogue=TANH
                )
                parts += [t for _, t in fns]
            module = device.load("\n".join(parts))
            for i, s, label in rows_shapes:
                a, b, bias, ptrs, table = _operands(device, s, rng)
                device.upload(ptrs[3], bias)
                want = a.astype(np.float64) @ (b.T if s.tb else b).astype(np.float64)
                scratch, values = device.alloc(8), np.zeros(1, np.int64)
                grid = -(-products.rows_threads(s.m, s.n, s.k) // THREADS)

                def run(fn, grid=grid, table=table, scratch=scratch, values=values):
                    return lambda: device.launch(
                        fn, table, values, scratch, min(grid, device.grid_limit(fn))
                    )

                err = 0.0
                for x, w in (("", want), ("x", np.tanh(want + bias.astype(np.float64)))):
                    device.upload(ptrs[2], np.full(s.m * s.n, np.nan, np.float32))
                    run(device.function(module, f"s{i}{x}r"))()
                    got = np.empty(s.m * s.n, np.float32)
                    device.download(ptrs[2], got)
                    err = max(err, _error(got.reshape(s.m, s.n), w))
                worst = max(worst, err)
                tile = (
                    f"{tm} x {tn}"
                    if fits(s.n, s.k)
                    else "its own: {} x {}".format(*own(s.n, s.k)[:2])
                )
                if args.emu:
                    print(f"| {label} | {tile} | - | - | {err:.2e} |", flush=True)
                    continue
                plain = _timed(run(device.function(module, f"s{i}r")), device, args)
                tanh = _timed(run(device.function(module, f"s{i}xr")), device, args)
                print(f"| {label} | {tile} | {plain:.1f} | {tanh:.1f} | {err:.2e} |", flush=True)
        finally:
            products._rows_tiling = own
    return worst


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
    ap.add_argument(
        "--tilings",
        default="",
        help="comma-separated TMxTN: our rows products with each thread's tile forced (only)",
    )
    args = ap.parse_args()
    from cuda_gpu_check import open_device

    from timerlc.runtime.cuda import device_for

    device = open_device(args.emu, "cuda_skinny")
    if device is None:
        return 2
    rng = np.random.default_rng(0)
    if args.tilings:
        worst = sweep_tilings(device, args, rng)
        print(f"largest error / largest value over all: {worst:.2e}")
        return 0 if worst < 1e-4 else 1
    tf32 = None if args.emu else device_for("cuda", matmul="tensorfloat32")
    module = device.load(module_text(args.rows))
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
    print()
    print(
        f"| a pair in one pass ({args.rows} rows) | joint TF32 us | ours TF32 apart us "
        "| cuBLAS TF32's two (neither epilogue nor sums) us | error |"
    )
    print("|---|---|---|---|---|")
    worst_t = max(worst_t, measure_joint(device, tf32, module, args.rows, args, rng))
    print(f"largest error / largest value over all: {worst:.2e} (TF32's: {worst_t:.2e})")
    # (TF32's against the operands rounded to TF32: the tensor cores' sums may round
    # otherwise than float32's in order, far less than a wrong fragment's error)
    return 0 if worst < 1e-4 and worst_t < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
