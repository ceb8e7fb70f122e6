"""Benchmark: a layer chain's backward over a tile of rows at a time, one kernel, against the
products it stands for (a probe of the row-tile chain, docs/cuda.md "Row-tile chains").

PPO's minibatch step at 2048 x 128 spends most of its device time in 65,536-row passes of
a two-layer MLP's forward and backward: each statement a kernel or a product over all the
rows, each 65,536 x 64 intermediate (``dz2``, ``dz1``, ``1 - h^2``'s h) written to the
device's memory and read back by the next (docs/performance.md: some 300 us of the step's
~600 in the backward's kernels, twenty-third session's figures). A row-tile chain computes
a block's rows through the whole chain in its shared memory and leaves only the weights'
gradients, summed over its rows, behind. This measures what that buys before the compiler
learns to make it: one network's backward, as PPO's is,

    dW3 = h2^T dy            db3 = sum(dy, 0)
    dz2 = (dy @ W3^T) * (1 - h2^2)
    dW2 = h1^T dz2           db2 = sum(dz2, 0)
    dz1 = (dz2 @ W2^T) * (1 - h1^2)
    dW1 = x^T dz1            db1 = sum(dz1, 0)

(x: rows x 4, h1 and h2: rows x 64, dy: rows x N3) as ``chain_part``, each block a chunk of
rows at a time (``--parts`` chunks; ``TILE`` rows of it at a time in shared memory: the
tile's x, h1, h2 and dy loaded once, dz2 and dz1 made there), its chunk's gradients stored
as a copy, then ``chain_sum`` adding the copies in order (float64), and checks the six
gradients against NumPy's (float64). On a GPU it times the two, and cuBLAS's five products
of the same backward alone (no elementwise pass, no bias sums: less than the compiler's
path does), each the median of ``--repeats`` calls.

  python scripts/cuda_chain.py                          # on the GPU
  python scripts/cuda_chain.py --parts 256,512,1024     # the chunks swept
  python scripts/cuda_chain.py --emu --rows 2048 --parts 8   # cuda-emu: the values only
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

THREADS = 128  # of a block (the kernel's thread roles assume it)
TILE = 32  # rows of a tile in shared memory
HID = 64  # the hidden layers' width
K1 = 4  # the input's width (CartPole's observation)
STRIDE = HID + 4  # floats between two rows of a tile (16-byte aligned, banks apart)


def sizes(n3: int) -> dict[str, int]:
    """Each gradient's floats, in the order a copy holds them."""
    return {"dW3": HID * n3, "db3": n3, "dW2": HID * HID, "db2": HID, "dW1": K1 * HID, "db1": HID}


def module_text(rows: int, parts: int, n3: int) -> str:
    """The renderer's head, ``chain_part`` and ``chain_sum`` for ``rows`` rows in ``parts``
    chunks and a head of ``n3`` columns: x, h1, h2, dy, W2, W3 at the table's entries 0 to
    5, the summed gradients (``sizes``' order, float32) at entry 6, the copies in the
    scratch memory."""
    from timerlc.cuda import render

    assert rows % parts == 0 and (rows // parts) % TILE == 0, "chunks of whole tiles"
    chunk, e = rows // parts, sum(sizes(n3).values())
    at = dict(zip(sizes(n3), np.cumsum([0, *sizes(n3).values()])))
    s = STRIDE
    part = rf"""
extern "C" __global__ void chain_part(void **table, const tl_args args_in, char *scratch,
                                      int *err, const long long *shift) {{
  const float *X = (const float *)table[0], *H1 = (const float *)table[1];
  const float *H2 = (const float *)table[2], *DY = (const float *)table[3];
  const float *W2 = (const float *)table[4], *W3 = (const float *)table[5];
  float *copies = (float *)scratch;
  __shared__ float4 s_w2t4[{HID * HID // 4}];  // W2^T: row k (an output of layer 2), col c
  __shared__ float4 s_h14[{TILE * s // 4}], s_h24[{TILE * s // 4}], s_dz24[{TILE * s // 4}];
  __shared__ float s_x[{TILE * K1}], s_dy[{TILE * n3}], s_w3[{HID * n3}];
  float *s_w2t = (float *)s_w2t4, *s_h1 = (float *)s_h14, *s_h2 = (float *)s_h24;
  float *s_dz2 = (float *)s_dz24, *s_dz1 = s_h2;  // (dz1 in h2's place: h2 read by then)
  const int tid = threadIdx.x;
  for (int q = tid; q < {HID * HID}; q += blockDim.x)
    s_w2t[q] = W2[(q % {HID}) * {HID} + q / {HID}];
  for (int q = tid; q < {HID * n3}; q += blockDim.x) s_w3[q] = W3[q];
  const int ty = tid / 8, tx = tid % 8;  // dW2's tile: rows ty*4.., columns tx*8..
  const int tr = tid / 8, tc = tid % 8;  // dz1's tile: rows tr*2.., columns tc*8..
  for (long long p = blockIdx.x; p < {parts}; p += gridDim.x) {{
    float a2[4][8] = {{}}, a1[2] = {{}}, a3 = 0.0f;
    double d1 = 0.0, d2 = 0.0, d3 = 0.0;
    for (long long r0 = p * {chunk}; r0 < (p + 1) * {chunk}; r0 += {TILE}) {{
      __syncthreads();  // (W's copied; the last tile read)
#pragma unroll
      for (int u = 0; u < {TILE * HID // 4 // THREADS}; u++) {{
        const int q = tid + u * {THREADS}, row = q / {HID // 4}, c4 = q % {HID // 4};
        s_h14[(row * {s}) / 4 + c4] = ((const float4 *)(H1 + (r0 + row) * {HID}))[c4];
        s_h24[(row * {s}) / 4 + c4] = ((const float4 *)(H2 + (r0 + row) * {HID}))[c4];
      }}
      if (tid < {TILE}) ((float4 *)s_x)[tid] = ((const float4 *)(X + r0 * {K1}))[tid];
      if (tid < {TILE * n3}) s_dy[tid] = DY[r0 * {n3} + tid];
      __syncthreads();
      // dz2 = (dy @ W3^T) * (1 - h2^2); dW3 and db3
      for (int q = tid; q < {TILE * HID}; q += blockDim.x) {{
        const int r = q / {HID}, c = q % {HID};
        float v = 0.0f;
        for (int o = 0; o < {n3}; o++) v = fmaf(s_dy[r * {n3} + o], s_w3[c * {n3} + o], v);
        const float h = s_h2[r * {s} + c];
        s_dz2[r * {s} + c] = v * (1.0f - h * h);
      }}
      if (tid < {HID * n3})
        for (int r = 0; r < {TILE}; r++)
          a3 = fmaf(s_h2[r * {s} + tid / {n3}], s_dy[r * {n3} + tid % {n3}], a3);
      if (tid < {n3})
        for (int r = 0; r < {TILE}; r++) d3 += (double)s_dy[r * {n3} + tid];
      __syncthreads();
      // dW2 += h1^T dz2 (a thread's 4 x 8); db2; dz1 = (dz2 @ W2^T) * (1 - h1^2)
#pragma unroll 4
      for (int r = 0; r < {TILE}; r++) {{
        const float4 a = s_h14[(r * {s}) / 4 + ty];
        const float4 b0 = s_dz24[(r * {s}) / 4 + tx * 2], b1 = s_dz24[(r * {s}) / 4 + tx * 2 + 1];
        const float av[4] = {{a.x, a.y, a.z, a.w}};
        const float bv[8] = {{b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w}};
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
          for (int j = 0; j < 8; j++) a2[i][j] = fmaf(av[i], bv[j], a2[i][j]);
      }}
      if (tid >= {HID})
        for (int r = 0; r < {TILE}; r++) d2 += (double)s_dz2[r * {s} + tid - {HID}];
      float c1[2][8] = {{}};
#pragma unroll 2
      for (int k0 = 0; k0 < {HID}; k0 += 4) {{
        const float4 x0 = s_dz24[(tr * 2 * {s} + k0) / 4];
        const float4 x1 = s_dz24[((tr * 2 + 1) * {s} + k0) / 4];
        const float xv[2][4] = {{{{x0.x, x0.y, x0.z, x0.w}}, {{x1.x, x1.y, x1.z, x1.w}}}};
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {{
          const float4 w0 = s_w2t4[((k0 + kk) * {HID}) / 4 + tc * 2];
          const float4 w1 = s_w2t4[((k0 + kk) * {HID}) / 4 + tc * 2 + 1];
          const float wv[8] = {{w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w}};
#pragma unroll
          for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) c1[i][j] = fmaf(xv[i][kk], wv[j], c1[i][j]);
        }}
      }}
      __syncthreads();  // (h2 read: dz1 in its place)
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) {{
          const int r = tr * 2 + i, c = tc * 8 + j;
          const float h = s_h1[r * {s} + c];
          s_dz1[r * {s} + c] = c1[i][j] * (1.0f - h * h);
        }}
      __syncthreads();
      // dW1 += x^T dz1 (two elements a thread); db1
#pragma unroll
      for (int u = 0; u < 2; u++) {{
        const int q = tid * 2 + u, i = q / {HID}, c = q % {HID};
        for (int r = 0; r < {TILE}; r++)
          a1[u] = fmaf(s_x[r * {K1} + i], s_dz1[r * {s} + c], a1[u]);
      }}
      if (tid < {HID})
        for (int r = 0; r < {TILE}; r++) d1 += (double)s_dz1[r * {s} + tid];
    }}
    float *copy = copies + p * {e};
    if (tid < {HID * n3}) copy[{at["dW3"]} + tid] = a3;
    if (tid < {n3}) copy[{at["db3"]} + tid] = (float)d3;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 8; j++) copy[{at["dW2"]} + (ty * 4 + i) * {HID} + tx * 8 + j] = a2[i][j];
    if (tid >= {HID}) copy[{at["db2"]} + tid - {HID}] = (float)d2;
    copy[{at["dW1"]} + tid * 2] = a1[0];
    copy[{at["dW1"]} + tid * 2 + 1] = a1[1];
    if (tid < {HID}) copy[{at["db1"]} + tid] = (float)d1;
  }}
}}

extern "C" __global__ void chain_sum(void **table, const tl_args args_in, char *scratch,
                                     int *err, const long long *shift) {{
  const float *copies = (const float *)scratch;
  float *out = (float *)table[6];
  for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < {e};
       q += (long long)gridDim.x * blockDim.x) {{
    double v = 0.0;
    for (int p = 0; p < {parts}; p++) v += (double)copies[(long long)p * {e} + q];
    out[q] = (float)v;
  }}
}}
"""
    return f"{render.head()}\n{part}"


def reference(x, h1, h2, dy, w2, w3) -> dict[str, np.ndarray]:
    """The six gradients in float64 (``sizes``' order)."""
    x, h1, h2, dy, w2, w3 = (a.astype(np.float64) for a in (x, h1, h2, dy, w2, w3))
    dz2 = (dy @ w3.T) * (1 - h2**2)
    dz1 = (dz2 @ w2.T) * (1 - h1**2)
    return {
        "dW3": h2.T @ dy,
        "db3": dy.sum(0),
        "dW2": h1.T @ dz2,
        "db2": dz2.sum(0),
        "dW1": x.T @ dz1,
        "db1": dz1.sum(0),
    }


def _timed(run, dev, repeats: int) -> float:
    """Microseconds of the device's time for ``run`` (median of ``repeats`` calls, after a
    first)."""
    run()
    times = []
    for _ in range(repeats):
        start = dev.mark()
        run()
        times.append(dev.elapsed(start, dev.mark()))
    return statistics.median(times) * 1e6


def measure(device, rows: int, parts: int, n3: int, repeats: int, rng) -> float:
    """One line of the table: ``parts`` chunks; the largest error of the six gradients
    against NumPy's, relative to each one's largest value."""
    from timerlc.runtime.cuda import THREADS as BLOCK

    assert BLOCK == THREADS
    x = rng.standard_normal((rows, K1)).astype(np.float32)
    h1 = np.tanh(rng.standard_normal((rows, HID))).astype(np.float32)
    h2 = np.tanh(rng.standard_normal((rows, HID))).astype(np.float32)
    dy = (rng.standard_normal((rows, n3)) / rows).astype(np.float32)
    w2 = (rng.standard_normal((HID, HID)) * 0.2).astype(np.float32)
    w3 = (rng.standard_normal((HID, n3)) * 0.2).astype(np.float32)
    want = reference(x, h1, h2, dy, w2, w3)
    e = sum(sizes(n3).values())
    arrays = (x, h1, h2, dy, w2, w3)
    ptrs = [device.alloc(a.nbytes) for a in arrays] + [device.alloc(e * 4)]
    for p, a in zip(ptrs, arrays):
        device.upload(p, a)
    table = device.alloc(8 * len(ptrs))
    device.upload(table, np.array(ptrs, np.uint64))
    scratch = device.alloc(parts * e * 4)
    values = np.zeros(1, np.int64)
    module = device.load(module_text(rows, parts, n3))
    part, total = device.function(module, "chain_part"), device.function(module, "chain_sum")
    grid = min(parts, device.grid_limit(part))

    def chain():
        device.launch(part, table, values, scratch, grid)
        device.launch(total, table, values, scratch, min(-(-e // THREADS), 64))

    chain()
    got = np.empty(e, np.float32)
    device.download(ptrs[6], got)
    err, at = 0.0, 0
    for name, size in sizes(n3).items():
        w = want[name].reshape(-1)
        err = max(
            err, float(np.max(np.abs(got[at : at + size] - w)) / max(1e-30, np.max(np.abs(w))))
        )
        at += size
    if getattr(device, "cp", None) is None:  # (the emulation: the values only)
        print(f"| {rows} | {n3} | {parts} | - | - | {err:.2e} |", flush=True)
        return err
    chain_us = _timed(chain, device, repeats)
    # cuBLAS's five products of the same backward (into scratch of their own)
    big = [device.alloc(rows * HID * 4) for _ in range(2)]
    small = [device.alloc(HID * HID * 4) for _ in range(3)]

    def blas():
        g = device.gemm
        g("f32", HID, n3, rows, ptrs[2], HID, True, ptrs[3], n3, False, small[0], n3)
        g("f32", rows, HID, n3, ptrs[3], n3, False, ptrs[5], n3, True, big[0], HID)
        g("f32", HID, HID, rows, ptrs[1], HID, True, big[0], HID, False, small[1], HID)
        g("f32", rows, HID, HID, big[0], HID, False, ptrs[4], HID, True, big[1], HID)
        g("f32", K1, HID, rows, ptrs[0], K1, True, big[1], HID, False, small[2], HID)

    blas_us = _timed(blas, device, repeats)
    print(f"| {rows} | {n3} | {parts} | {chain_us:.1f} | {blas_us:.1f} | {err:.2e} |", flush=True)
    return err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emu", action="store_true", help="the emulated device (values only)")
    ap.add_argument("--rows", type=int, default=65536, help="rows (default PPO's 65,536)")
    ap.add_argument("--parts", default="256", help="comma-separated chunk counts")
    ap.add_argument("--heads", default="2,1", help="comma-separated head widths (N3)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls of each (median)")
    args = ap.parse_args()
    if args.emu:  # (the kernels' thread roles are a GPU block's 128 threads: emu_rt.cc)
        os.environ["TIMERLC_EMU_THREADS"] = str(THREADS)
    from cuda_gpu_check import open_device

    device = open_device(args.emu, "cuda_chain")
    if device is None:
        return 2
    rng = np.random.default_rng(0)
    print(
        "| rows | head | chunks | chain (part + sum) us | cuBLAS's 5 products alone us | error |"
    )
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for n3 in (int(h) for h in args.heads.split(",")):
        for parts in (int(p) for p in args.parts.split(",")):
            worst = max(worst, measure(device, args.rows, parts, n3, args.repeats, rng))
    print(f"largest error / largest value over all: {worst:.2e}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
