"""Benchmark: PPO's skinny products on the GPU, cuBLAS against a candidate kernel of ours.

PPO's minibatch step at 2048 x 128 makes products of 65,536 rows by 64 columns or fewer
(``x @ W`` and ``dy @ W^T`` with a 64 x 64 or 4 x 64 weight): on the H100 cuBLAS took 25-32 us
for each in float32 where the bytes take 10 and the arithmetic 9 (docs/performance.md), and
the bias and tanh after a forward product were a launch of their own (13.9 us). The
candidate: the weight in shared memory, each block 64 rows of A (in shared memory too), each
thread a 4 x 8 tile of C summed over k in registers, then the bias and tanh in the same
kernel (what the renderer would make of a product and the loop that consumes it). Before
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

BM, TM, TN = 64, 4, 8  # a block's rows of A; a thread's tile of C
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


def module_text() -> str:
    """The module: the renderer's head, then each shape's two kernels (and their entries
    for the emulation)."""
    from timerlc.cuda import render

    parts = [render.head()]
    for s, (_, k, n, trans, epi) in enumerate(SHAPES):
        text = KERNEL
        subst = {"NAME": f"skinny{s}", "BM": BM, "TM": TM, "TN": min(TN, n), "K": k, "N": n}
        subst |= {"TRANS": int(trans), "EPI": int(epi)}
        for key, value in subst.items():
            text = text.replace(f"@{key}@", str(value))
        parts.append(text)
        parts.append(render._emu_entry(f"skinny{s}", 1))
        parts.append(render._emu_entry(f"skinny{s}_epi", 1))
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
    ours = device.function(module, f"skinny{s}")
    epi_fn = device.function(module, f"skinny{s}_epi")
    blocks = min(-(-m // BM), device.grid_limit(ours))
    epi_blocks = min(-(-m * n // THREADS), device.grid_limit(epi_fn))

    def candidate():
        device.launch(ours, table, values, 0, blocks)

    def blas(dev):  # (the product and the epilogue in ``dev``'s stream, one after another)
        def run():
            ld_w = k if trans else n
            dev.gemm("f32", m, n, k, ptrs[0], k, False, ptrs[1], ld_w, trans, ptrs[3], n)
            if epi:
                dev.launch(epi_fn, table, values, 0, epi_blocks)

        return run

    def timed(run, dev=device) -> float:
        run()  # (a first call: loads, warms)
        times = []
        for _ in range(args.repeats):
            start = dev.mark()
            run()
            times.append(dev.elapsed(start, dev.mark()))
        return statistics.median(times) * 1e6

    got = np.empty((m, n), np.float32)
    candidate()
    device.download(ptrs[3], got)
    err = float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))
    if tf32 is None:  # (the emulation: values only)
        print(f"| {label} | - | - | - | {err:.2e} |", flush=True)
        return err
    f32_us, tf32_us, ours_us = timed(blas(device)), timed(blas(tf32), tf32), timed(candidate)
    print(f"| {label} | {f32_us:.1f} | {tf32_us:.1f} | {ours_us:.1f} | {err:.2e} |", flush=True)
    return err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emu", action="store_true", help="the emulated device (values only)")
    ap.add_argument("--rows", type=int, default=65536, help="rows of A (default PPO's 65,536)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls of each (median)")
    args = ap.parse_args()
    from cuda_gpu_check import open_device

    from timerlc.runtime.cuda import device_for

    device = open_device(args.emu, "cuda_skinny")
    if device is None:
        return 2
    tf32 = None if args.emu else device_for("cuda", matmul="tensorfloat32")
    module = device.load(module_text())
    rng = np.random.default_rng(0)
    print(
        f"| product ({args.rows} rows) | cuBLAS f32 us | cuBLAS TF32 us | ours us "
        "| ours: largest error |"
    )
    print("|---|---|---|---|---|")
    worst = 0.0
    for s, shape in enumerate(SHAPES):
        worst = max(worst, measure(device, tf32, module, s, shape, args, rng))
    print(f"largest error / largest value over all: {worst:.2e}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
