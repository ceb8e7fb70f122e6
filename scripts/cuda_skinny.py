"""Benchmark: PPO's skinny products on the GPU, cuBLAS against a candidate kernel of ours.

PPO's minibatch step at 2048 x 128 makes products of 65,536 rows by 64 columns or fewer
(``x @ W`` and ``dy @ W^T`` with a 64 x 64 or 4 x 64 weight): on the H100 cuBLAS took 25-32 us
for each in float32 where the bytes take 10 and the arithmetic 9 (docs/performance.md), and
the bias and tanh after a forward product were a launch of their own (13.9 us). The
candidate: the weight in shared memory, each block 64 rows of A (in shared memory too), each
thread a 4 x 8 tile of C summed over k in registers, then the bias and tanh in the same
kernel (what the renderer would make of a product and the loop that consumes it). The
weight gradients (``x^T @ dy`` over the 65,536 rows, 32 and 27 us, and the bias's
``sum(dy, 0)``, a reduction of its own, 56-77 us before 2026-11-27): a candidate of two
launches, each of ``PARTS`` blocks a partial dW and db of a chunk of rows (a tile a thread,
in registers), then the copies added in a fixed order, ``LANES`` threads an element. Before
the renderer makes such kernels, this measures whether they pay: per shape, the device time
(median of ``--repeats`` calls) of cuBLAS in float32 and in TF32 (with the bias and tanh as
a kernel of their own where the shape has them) and of the candidate; each result checked
against NumPy (float64).

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

BM, TM, TN = 64, 4, 8  # a block's rows of A; a thread's tile of C (the gradients': TM x TN)
# the candidate's tilings, each a kernel: (a block's rows of A, a thread's rows, its columns),
# 128 tiles a block of 64 columns
TILINGS = [(64, 4, 8), (64, 8, 4), (32, 2, 8)]
# (name, k, n, B transposed (dy @ W^T: W is n x k), bias and tanh after the product)
SHAPES = [
    ("x @ W + b, tanh (64 x 64)", 64, 64, False, True),
    ("dy @ W^T (64 x 64)", 64, 64, True, False),
    ("x @ W + b, tanh (4 x 64)", 4, 64, False, True),
]

KERNEL = r"""
/* C[m x N] = A[m x K] @ B (B: K x N, or N x K transposed), then + bias, tanh (EPI) */
extern "C" __global__ void @NAME@(void **table, const tl_args args_in, char *scratch, int *err,
                                   const long long *shift) {
  const float *A = (const float *)table[0];
  const float *B = (const float *)table[1];
  const float *bias = (const float *)table[2];
  float *C = (float *)table[3];
  const long long m = args_in.v[0];
  __shared__ float As[@BM@][@K@ + 1];  /* (+1: a warp's rows in distinct banks) */
  __shared__ float Bs[@K@][@N@];
  for (int q = threadIdx.x; q < @K@ * @N@; q += blockDim.x) {
    const int kk = q / @N@, j = q % @N@;
    Bs[kk][j] = @TRANS@ ? B[j * @K@ + kk] : B[kk * @N@ + j];
  }
  const int tcols = @N@ / @TN@, tiles = (@BM@ / @TM@) * (@N@ / @TN@);
  for (long long r0 = (long long)blockIdx.x * @BM@; r0 < m; r0 += (long long)gridDim.x * @BM@) {
    __syncthreads();  /* (the tile before read; B written) */
    for (int q = threadIdx.x; q < @BM@ * @K@; q += blockDim.x) {
      const int row = q / @K@, kk = q % @K@;
      As[row][kk] = r0 + row < m ? A[(r0 + row) * @K@ + kk] : 0.0f;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < tiles; t += blockDim.x) {
      const int ty = t / tcols, tx = t % tcols;
      float acc[@TM@][@TN@];
#pragma unroll
      for (int i = 0; i < @TM@; i++)
#pragma unroll
        for (int j = 0; j < @TN@; j++) acc[i][j] = 0.0f;
#pragma unroll 4
      for (int kk = 0; kk < @K@; kk++) {
        float a[@TM@], b[@TN@];
#pragma unroll
        for (int i = 0; i < @TM@; i++) a[i] = As[ty * @TM@ + i][kk];
#pragma unroll
        for (int j = 0; j < @TN@; j++) b[j] = Bs[kk][tx * @TN@ + j];
#pragma unroll
        for (int i = 0; i < @TM@; i++)
#pragma unroll
          for (int j = 0; j < @TN@; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
#pragma unroll
      for (int i = 0; i < @TM@; i++) {
        const long long r = r0 + ty * @TM@ + i;
        if (r >= m) break;
#pragma unroll
        for (int j = 0; j < @TN@; j++) {
          const int col = tx * @TN@ + j;
          C[r * @N@ + col] = @EPI@ ? tanhf(acc[i][j] + bias[col]) : acc[i][j];
        }
      }
    }
  }
}

/* the bias and tanh after cuBLAS's product, a kernel of their own (as PPO's s142) */
extern "C" __global__ void @NAME@_epi(void **table, const tl_args args_in, char *scratch,
                                       int *err, const long long *shift) {
  const float *bias = (const float *)table[2];
  float *C = (float *)table[3];
  const long long n = args_in.v[0] * @N@;
  for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < n;
       g += (long long)gridDim.x * blockDim.x)
    C[g] = tanhf(C[g] + bias[g % @N@]);
}
"""


# the weight gradients: (name, k, n): dW = x^T @ dy (k x n over the rows) and db = sum(dy, 0)
GRADIENTS = [
    ("x^T @ dy, sum(dy, 0) (64 x 64)", 64, 64),
    ("x^T @ dy, sum(dy, 0) (4 x 64)", 4, 64),
]
PARTS = (132, 264, 528)  # the gradient's blocks, each a partial dW and db of its rows (1-4 an SM)
LANES = 4  # the combination's threads an element (each every LANES-th partial copy)

GRADIENT = r"""
/* partial dW = X^T @ D and db = sum(D, 0) of the block's rows (a chunk of them), into its
   copy of part (K * N + N floats a block): each thread a TM x TN tile of dW, summed in
   registers over the rows, 64 rows of X and D at a time in shared memory */
extern "C" __global__ void @NAME@_part(void **table, const tl_args args_in, char *scratch,
                                        int *err, const long long *shift) {
  const float *X = (const float *)table[0];
  const float *D = (const float *)table[1];
  float *part = (float *)table[4];
  const long long m = args_in.v[0];
  __shared__ float Xs[64][@K@];
  __shared__ float Ds[64][@N@];
  const long long rows = (m + gridDim.x - 1) / gridDim.x;
  const long long lo = (long long)blockIdx.x * rows, hi = lo + rows < m ? lo + rows : m;
  const int tcols = @N@ / @TN@, tiles = (@K@ / @TM@) * tcols;
  for (int t0 = 0; t0 < tiles; t0 += blockDim.x) {  /* (the same turns on every thread) */
    const int t = t0 + threadIdx.x;
    const bool mine = t < tiles;
    const int ty = mine ? t / tcols : 0, tx = mine ? t % tcols : 0;
    float acc[@TM@][@TN@], dsum[@TN@];
#pragma unroll
    for (int j = 0; j < @TN@; j++) {
      dsum[j] = 0.0f;
#pragma unroll
      for (int i = 0; i < @TM@; i++) acc[i][j] = 0.0f;
    }
    for (long long r0 = lo; r0 < hi; r0 += 64) {
      __syncthreads();
      for (int q = threadIdx.x; q < 64 * @K@; q += blockDim.x)
        Xs[q / @K@][q % @K@] = r0 + q / @K@ < hi ? X[r0 * @K@ + q] : 0.0f;
      for (int q = threadIdx.x; q < 64 * @N@; q += blockDim.x)
        Ds[q / @N@][q % @N@] = r0 + q / @N@ < hi ? D[r0 * @N@ + q] : 0.0f;
      __syncthreads();
      if (mine) {
#pragma unroll 4
        for (int r = 0; r < 64; r++) {
          float a[@TM@], b[@TN@];
#pragma unroll
          for (int i = 0; i < @TM@; i++) a[i] = Xs[r][ty * @TM@ + i];
#pragma unroll
          for (int j = 0; j < @TN@; j++) b[j] = Ds[r][tx * @TN@ + j];
#pragma unroll
          for (int i = 0; i < @TM@; i++)
#pragma unroll
            for (int j = 0; j < @TN@; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
          if (ty == 0)
#pragma unroll
            for (int j = 0; j < @TN@; j++) dsum[j] += b[j];
        }
      }
    }
    if (mine) {
      float *own = part + (long long)blockIdx.x * (@K@ * @N@ + @N@);
#pragma unroll
      for (int i = 0; i < @TM@; i++)
#pragma unroll
        for (int j = 0; j < @TN@; j++) own[(ty * @TM@ + i) * @N@ + tx * @TN@ + j] = acc[i][j];
      if (ty == 0)
#pragma unroll
        for (int j = 0; j < @TN@; j++) own[@K@ * @N@ + tx * @TN@ + j] = dsum[j];
    }
  }
}

/* the blocks' copies added, in a fixed order: each element by LANES threads (each every
   LANES-th copy), then the lanes in order; dW into table[2], db into table[3] */
extern "C" __global__ void @NAME@_sum(void **table, const tl_args args_in, char *scratch,
                                       int *err, const long long *shift) {
  float *dW = (float *)table[2];
  float *db = (float *)table[3];
  const float *part = (const float *)table[4];
  const long long copies = args_in.v[1], E = @K@ * @N@ + @N@;
  __shared__ float red[@THREADS@];
  const int lanes = blockDim.x % @LANES@ == 0 ? @LANES@ : 1, per = blockDim.x / lanes;
  for (long long e0 = (long long)blockIdx.x * per; e0 < E; e0 += (long long)gridDim.x * per) {
    const long long e = e0 + threadIdx.x % per;
    const int lane = threadIdx.x / per;
    float v = 0.0f;
    if (e < E)
#pragma unroll 8
      for (long long p = lane; p < copies; p += lanes) v += part[p * E + e];
    red[threadIdx.x] = v;
    __syncthreads();
    if (lane == 0 && e < E) {
      float total = 0.0f;
      for (int l = 0; l < lanes; l++) total += red[threadIdx.x + l * per];
      if (e < @K@ * @N@) dW[e] = total; else db[e - @K@ * @N@] = total;
    }
    __syncthreads();
  }
}
"""


def module_text() -> str:
    """The module: the renderer's head, then each shape's two kernels (and their entries
    for the emulation)."""
    from timerlc.cuda import render

    parts = [render.head()]
    for s, (_, k, n, trans, epi) in enumerate(SHAPES):
        for v, (bm, tm, tn) in enumerate(TILINGS):
            text = KERNEL if v == 0 else KERNEL[: KERNEL.index("/* the bias and tanh after")]
            subst = {"NAME": f"skinny{s}_{v}", "BM": bm, "TM": tm, "TN": min(tn, n), "K": k}
            subst |= {"N": n, "TRANS": int(trans), "EPI": int(epi)}
            for key, value in subst.items():
                text = text.replace(f"@{key}@", str(value))
            parts.append(text)
            parts.append(render._emu_entry(f"skinny{s}_{v}", 1))
        parts.append(render._emu_entry(f"skinny{s}_0_epi", 1))
    for g, (_, k, n) in enumerate(GRADIENTS):
        text = GRADIENT
        subst = {"NAME": f"grad{g}", "TM": TM, "TN": min(TN, n), "K": k, "N": n}
        subst |= {"THREADS": render.THREADS, "LANES": LANES}
        for key, value in subst.items():
            text = text.replace(f"@{key}@", str(value))
        parts.append(text)
        parts.append(render._emu_entry(f"grad{g}_part", 2))
        parts.append(render._emu_entry(f"grad{g}_sum", 2))
    return "\n".join(parts)


def reference(a, w, bias, trans: bool, epi: bool) -> np.ndarray:
    c = a.astype(np.float64) @ (w.T if trans else w).astype(np.float64)
    return np.tanh(c + bias) if epi else c


def measure(device, tf32, module, s: int, shape: tuple, args, rng) -> float:
    """Shape ``s``'s line of the table: its products timed (on a GPU) and checked; the
    candidate's largest error relative to the largest value."""
    from timerlc.runtime.cuda import THREADS

    label, k, n, trans, epi = shape
    m = args.rows
    a = rng.standard_normal((m, k), np.float32)
    w = (rng.standard_normal((n, k) if trans else (k, n)) * 0.1).astype(np.float32)
    bias = (rng.standard_normal(n) * 0.1).astype(np.float32)
    want = reference(a, w, bias, trans, epi)
    ptrs = [device.alloc(x.nbytes) for x in (a, w, bias)] + [device.alloc(m * n * 4)]
    for p, x in zip(ptrs, (a, w, bias)):
        device.upload(p, x)
    table = device.alloc(8 * 4)
    device.upload(table, np.array(ptrs, np.uint64))
    values = np.array([m], np.int64)
    epi_fn = device.function(module, f"skinny{s}_0_epi")
    epi_blocks = min(-(-m * n // THREADS), device.grid_limit(epi_fn))

    def candidate(v: int):
        fn = device.function(module, f"skinny{s}_{v}")
        blocks = min(-(-m // TILINGS[v][0]), device.grid_limit(fn))
        return lambda: device.launch(fn, table, values, 0, blocks)

    def blas(dev):  # (the product and the epilogue in ``dev``'s stream, one after another)
        def run():
            ld_w = k if trans else n
            dev.gemm("f32", m, n, k, ptrs[0], k, False, ptrs[1], ld_w, trans, ptrs[3], n)
            if epi:
                dev.launch(epi_fn, table, values, 0, epi_blocks)

        return run

    err = 0.0
    for v in range(len(TILINGS)):
        got = np.full((m, n), np.nan, np.float32)
        device.upload(ptrs[3], got)
        candidate(v)()
        device.download(ptrs[3], got)
        err = max(err, _error(got, want))
    if tf32 is None:  # (the emulation: values only)
        print(f"| {label} | - | - | {' | '.join('-' for _ in TILINGS)} | {err:.2e} |", flush=True)
        return err
    f32_us, tf32_us = _timed(blas(device), device, args), _timed(blas(tf32), tf32, args)
    ours = " | ".join(f"{_timed(candidate(v), device, args):.1f}" for v in range(len(TILINGS)))
    print(f"| {label} | {f32_us:.1f} | {tf32_us:.1f} | {ours} | {err:.2e} |", flush=True)
    return err


def measure_gradient(device, tf32, module, g: int, shape: tuple, args, rng) -> float:
    """Weight gradient ``g``'s line: cuBLAS's ``x^T @ dy`` (the bias gradient not counted:
    PPO's is a reduction of its own) against ours (both, two launches); the candidate's
    largest error relative to the largest value."""
    from timerlc.runtime.cuda import THREADS

    label, k, n = shape
    m = args.rows
    x = rng.standard_normal((m, k), np.float32)
    dy = (rng.standard_normal((m, n)) * 0.1).astype(np.float32)
    want = np.concatenate(
        [(x.astype(np.float64).T @ dy.astype(np.float64)).ravel(), dy.sum(0, dtype=np.float64)]
    )
    part_fn = device.function(module, f"grad{g}_part")
    sum_fn = device.function(module, f"grad{g}_sum")
    counts = [max(1, min(p, -(-m // 64), device.grid_limit(part_fn))) for p in args.parts]
    elements = k * n + n
    ptrs = [device.alloc(x.nbytes), device.alloc(dy.nbytes), device.alloc(k * n * 4)]
    ptrs += [device.alloc(n * 4), device.alloc(max(counts) * elements * 4)]
    device.upload(ptrs[0], x)
    device.upload(ptrs[1], dy)
    table = device.alloc(8 * 5)
    device.upload(table, np.array(ptrs, np.uint64))
    per = THREADS // LANES
    sum_blocks = min(-(-elements // per), device.grid_limit(sum_fn))

    def candidate(copies: int):
        values = np.array([m, copies], np.int64)

        def run():
            device.launch(part_fn, table, values, 0, copies)
            device.launch(sum_fn, table, values, 0, sum_blocks)

        return run

    def blas(dev):
        return lambda: dev.gemm("f32", k, n, m, ptrs[0], k, True, ptrs[1], n, False, ptrs[2], n)

    err = 0.0
    for copies in counts:
        candidate(copies)()
        dw, db = np.empty(k * n, np.float32), np.empty(n, np.float32)
        device.download(ptrs[2], dw)
        device.download(ptrs[3], db)
        got = np.concatenate([dw, db])
        err = max(err, _error(got, want))
    if tf32 is None:
        print(f"| {label} | - | - | {' | '.join('-' for _ in counts)} | {err:.2e} |", flush=True)
        return err
    f32_us, tf32_us = _timed(blas(device), device, args), _timed(blas(tf32), tf32, args)
    ours = " | ".join(f"{_timed(candidate(c), device, args):.1f}" for c in counts)
    print(f"| {label} | {f32_us:.1f} | {tf32_us:.1f} | {ours} | {err:.2e} |", flush=True)
    return err


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
    ap.add_argument("--rows", type=int, default=65536, help="rows of A (default PPO's 65,536)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls of each (median)")
    ap.add_argument(
        "--parts",
        default=",".join(str(p) for p in PARTS),
        help="a gradient's blocks, each a column of its table (comma-separated)",
    )
    args = ap.parse_args()
    args.parts = [int(p) for p in args.parts.split(",") if p.strip()]
    from cuda_gpu_check import open_device

    from timerlc.runtime.cuda import device_for

    device = open_device(args.emu, "cuda_skinny")
    if device is None:
        return 2
    tf32 = None if args.emu else device_for("cuda", matmul="tensorfloat32")
    module = device.load(module_text())
    rng = np.random.default_rng(0)
    tilings = " | ".join(f"ours {bm}x{tm}x{tn} us" for bm, tm, tn in TILINGS)
    print(f"| product ({args.rows} rows) | cuBLAS f32 us | cuBLAS TF32 us | {tilings} | error |")
    print("|---|---|---|" + "---|" * len(TILINGS) + "---|")
    worst = 0.0
    for s, shape in enumerate(SHAPES):
        worst = max(worst, measure(device, tf32, module, s, shape, args, rng))
    parts = " | ".join(f"ours on {p} blocks us" for p in args.parts)
    print(f"\n| gradient ({args.rows} rows) | cuBLAS f32 us | cuBLAS TF32 us | {parts} | error |")
    print("|---|---|---|" + "---|" * len(args.parts) + "---|")
    for g, shape in enumerate(GRADIENTS):
        worst = max(worst, measure_gradient(device, tf32, module, g, shape, args, rng))
    print(f"largest error / largest value over all: {worst:.2e}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
