"""A program's device time under the CUDA backend's knobs (a benchmark, never a test).

Each combination of the knobs given is a build and a run of the program (graphs on, each
replay between two CUDA events: ``scripts/cuda_overheads.py``'s "replays timed"), and a line
of the device's milliseconds an iteration in the runs of graphs that took it longest, and in
all of them. The knobs:

- ``--parts``: ``cuda.render.PARTS``, the most blocks (each a partial copy) a reduction's
  first pass runs on; the last block combines the copies;
- ``--array-parts``: ``cuda.render.ARRAY_PARTS``, the most blocks an array reduction (a
  column sum: the bias gradients) runs on, its copies combined in groups of blocks first;
- ``--unroll``: ``cuda.render.UNROLL``, the times the GPU's compilers unroll a reduction's
  loop over its terms (``TL_UNROLL``);
- ``--blocks``: the device's ``MAX_BLOCKS``, the largest grid a launch gets (0: the GPU's
  own, ``runtime.cuda.resident_blocks``);
- ``--products``: the device's products policy (``runtime.cuda.PRODUCTS``: ``fastest``,
  ``ours``, ``blas``) for the products with kernels of ours;
- ``--gram-sums``: ``cuda.render.GRAM_SUMS`` (1: a bias gradient rides on its weight
  gradient's gram; 0: a reduction of its own);
- ``--epilogues``: ``cuda.render.ROWS_EPILOGUES`` (1: a layer's elementwise loop after its
  rows product made by the product's function of ours; 0: a launch of its own after it);
- ``--product-parts``: ``cuda.products.MAX_PARTS``, the most copies a gram sums into;
- ``--copy-batch``: ``cuda.products.COPY_BATCH``, the loads a thread issues at a time into
  shared memory;
- ``--joints``: ``cuda.render.JOINTS`` (1: a layer's gradient and its weight's gradient
  with joint functions, which the runtime times against the two where TF32 is asked for;
  0: none);
- ``--fuse-ties``: ``codegen.tree.SEQ_TIES`` (1: consecutive calls joined into one kernel
  where that launches no more functions, larger kernels; 0: only where fewer);
- ``--in-flight``: ``cuda.render.IN_FLIGHT``, the points of a grid loop of stores alone a
  thread takes at a time, their loads before their stores (1: one after another);
- ``--vec-rows``: ``cuda.products.VEC_ROWS`` (1: rows products read their shared memory 16
  bytes at a time, ``_rows_vec_lines``; 0: 4 bytes);
- ``--vec-grams``: ``cuda.products.VEC_GRAMS`` (1: grams' parts read their operands 16
  bytes at a time, ``_gram_operands``; 0: 4 bytes);
- ``--perm-buckets``: ``cuda.render.PERM_BUCKETS``, the most buckets a permutation sorts
  by (``_Kernel.perm_buckets``; 0: every permutation by the merge sort's passes);
- ``--long-row``: ``cuda.render.LONG_ROW``, the points a row from which a loop stays out of
  merged rows over any rows (a large value: only ``WIDE_ROWS``' rule);
- ``--merged-sums``: ``cuda.products.MERGED_SUMS``, the most elements of a gram that adds its
  copies in its part function (``_merged_sums``; 0: every gram's copies a launch of their
  own);
- ``--beside``: ``cuda.render.BESIDE`` (1: a step of loops next to a product of ours that
  touches nothing of it runs in the product's launch, ``_Kernel._beside``; 0: a launch of
  its own).
- ``--chains``: ``cuda.render.CHAINS`` (1: a kernel's steps over the same rows run as one
  function where the runtime finds that faster, ``_Kernel._chains``; 0: no chain), with
  ``--products``: ``ours`` runs every chain, ``blas`` none (the launches they stand for),
  ``fastest`` each as timed.
- ``--chain-floats``: ``cuda.render.CHAIN_SMEM_FLOATS``, the most shared memory a chain's
  function takes (floats; past 12,000 the launch's dynamic shared memory: chains of chains;
  12000: none).
- ``--chain-remap``: ``cuda.render.CHAIN_REMAP`` (1: a chain's own buffers a tile at a time
  in its chunk's first tile's rows, ``_chain_remap``; 0: the whole buffers).
- ``--spread``: ``cuda.render.SPREAD`` (1: a small reduction every block makes whole, then
  the loops after it over the grid, one launch, ``_Kernel._spread``; 0: the loops a launch
  after the reduction's).

``--matmul-precision tensorfloat32`` runs them all with TF32 products (ours, cuBLAS's, the
joint functions).

On the H100 (2026-11-27) it chose the grid (65,535 blocks: 13.2 ms an iteration in PPO's
minibatch step; 4,224: 9.3; 2,112, the GPU's own: 9.2-9.3; 1,056: 9.5) and the unroll (4:
11.47 ms in the step's two graphs, 8: 11.27, 16: 11.23), and kept 256 copies (128: 10.2 in
the step's forward and backward, 64: 12.6, 1,024 at 4,224 blocks: 9.8). docs/performance.md.

    python scripts/cuda_sweep.py --parts 256,512,1024 --unroll 8 --set B=2048 --set T=128 \\
        --set total_steps=1572864
    python scripts/cuda_sweep.py --array-parts 256,1024,2048 --set B=2048 --set T=128 \\
        --set total_steps=1572864
    python scripts/cuda_sweep.py --products blas,ours --gram-sums 0,1 --set B=2048 \\
        --set T=128 --set total_steps=1572864
    python scripts/cuda_sweep.py --products fastest --epilogues 0,1 --set B=2048 \\
        --set T=128 --set total_steps=1572864
    python scripts/cuda_sweep.py --matmul-precision tensorfloat32 --products fastest \
        --joints 0,1 --fuse-ties 0,1 --set B=2048 --set T=128 --set total_steps=1572864
    python scripts/cuda_sweep.py --in-flight 1,2,4,8 --set B=2048 --set T=128 \\
        --set total_steps=1572864
    python scripts/cuda_sweep.py --vec-rows 0,1 --perm-buckets 0,2048 --set B=2048 \
        --set T=128 --set total_steps=1572864
    python scripts/cuda_sweep.py --products fastest --merged-sums 0,256 --beside 0,1 \
        --set B=2048 --set T=128 --set total_steps=1572864
    python scripts/cuda_sweep.py --emu --parts 256,64 --set B=16 --set T=8 --set total_steps=512
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emu", action="store_true", help="the emulated device (cuda-emu)")
    ap.add_argument("--program", default="ppo")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--parts", default="256", help="comma-separated PARTS values")
    ap.add_argument("--array-parts", default="2048", help="comma-separated ARRAY_PARTS values")
    ap.add_argument("--unroll", default="8", help="comma-separated UNROLL values")
    ap.add_argument("--blocks", default="0", help="comma-separated grid caps (0: the GPU's own)")
    ap.add_argument("--products", default="", help="comma-separated products policies")
    ap.add_argument("--gram-sums", default="1", help="comma-separated GRAM_SUMS values (0, 1)")
    ap.add_argument("--epilogues", default="1", help="comma-separated ROWS_EPILOGUES (0, 1)")
    ap.add_argument("--product-parts", default="256", help="comma-separated MAX_PARTS values")
    ap.add_argument("--copy-batch", default="8", help="comma-separated COPY_BATCH values")
    ap.add_argument("--joints", default="1", help="comma-separated JOINTS values (0, 1)")
    ap.add_argument("--fuse-ties", default="0", help="comma-separated SEQ_TIES values (0, 1)")
    ap.add_argument("--in-flight", default="4", help="comma-separated IN_FLIGHT values")
    ap.add_argument("--vec-rows", default="1", help="comma-separated VEC_ROWS values (0, 1)")
    ap.add_argument("--vec-grams", default="1", help="comma-separated VEC_GRAMS values (0, 1)")
    ap.add_argument("--perm-buckets", default="2048", help="comma-separated PERM_BUCKETS")
    ap.add_argument("--long-row", default="128", help="comma-separated LONG_ROW values")
    ap.add_argument("--merged-sums", default="256", help="comma-separated MERGED_SUMS values")
    ap.add_argument("--beside", default="1", help="comma-separated BESIDE values (0, 1)")
    ap.add_argument("--chains", default="1", help="comma-separated CHAINS values (0, 1)")
    ap.add_argument("--chain-remap", default="1", help="comma-separated CHAIN_REMAP (0, 1)")
    ap.add_argument("--spread", default="1", help="comma-separated SPREAD values (0, 1)")
    ap.add_argument(
        "--chain-floats", default="25600", help="comma-separated CHAIN_SMEM_FLOATS values"
    )
    from cuda_gpu_check import add_matmul_precision, open_device

    add_matmul_precision(ap)
    ap.add_argument("--top", type=int, default=3, help="the runs of graphs shown per line")
    args = ap.parse_args()
    import cuda_overheads as co

    from timerlc.codegen import tree
    from timerlc.cuda import products, render

    device = open_device(args.emu, "cuda_sweep", args.matmul_precision)
    if device is None:
        return 2
    own = device.MAX_BLOCKS
    sets = dict(s.split("=", 1) for s in args.set)
    policies = [p.strip() for p in args.products.split(",") if p.strip()] or [device.products]
    knobs = itertools.product(
        numbers(args.parts),
        numbers(args.array_parts),
        numbers(args.unroll),
        numbers(args.blocks),
        policies,
        numbers(args.gram_sums),
        numbers(args.epilogues),
        numbers(args.product_parts),
        numbers(args.copy_batch),
        numbers(args.joints),
        numbers(args.fuse_ties),
        numbers(args.in_flight),
        numbers(args.vec_rows),
        numbers(args.vec_grams),
        numbers(args.perm_buckets),
        numbers(args.long_row),
        numbers(args.merged_sums),
        numbers(args.beside),
        numbers(args.chains),
        numbers(args.chain_floats),
        numbers(args.chain_remap),
        numbers(args.spread),
    )
    for (
        parts,
        array_parts,
        unroll,
        blocks,
        policy,
        sums,
        epi,
        pparts,
        batch,
        joints,
        ties,
        flight,
        vec,
        vec_grams,
        buckets,
        long_row,
        merged,
        beside,
        chains,
        chain_floats,
        remap,
        spread,
    ) in knobs:
        render.PARTS, render.ARRAY_PARTS, render.UNROLL = parts, array_parts, unroll
        render.GRAM_SUMS, products.MAX_PARTS, products.COPY_BATCH = bool(sums), pparts, batch
        render.ROWS_EPILOGUES, render.JOINTS, tree.SEQ_TIES = bool(epi), bool(joints), bool(ties)
        render.IN_FLIGHT, products.VEC_ROWS = flight, bool(vec)
        products.VEC_GRAMS, products.MERGED_SUMS = bool(vec_grams), merged
        render.BESIDE, render.CHAINS = bool(beside), bool(chains)
        render.CHAIN_SMEM_FLOATS, render.CHAIN_REMAP = chain_floats, bool(remap)
        render.SPREAD = bool(spread)
        render.PERM_BUCKETS, render.LONG_ROW = buckets, long_row
        device.MAX_BLOCKS = blocks or own
        device.products = policy
        co._GENERATED.clear()  # (a build of its own: the knobs change the kernels)
        started = time.perf_counter()
        label = (
            f"PARTS {parts:5d} ARRAY_PARTS {array_parts:5d} UNROLL {unroll:3d} "
            f"blocks {device.MAX_BLOCKS:6d} products {policy} GRAM_SUMS {sums} EPILOGUES {epi} "
            f"MAX_PARTS {pparts} COPY_BATCH {batch} JOINTS {joints} SEQ_TIES {ties} "
            f"IN_FLIGHT {flight} VEC_ROWS {vec} VEC_GRAMS {vec_grams} PERM_BUCKETS {buckets} "
            f"LONG_ROW {long_row} MERGED_SUMS {merged} BESIDE {beside} CHAINS {chains} "
            f"CHAIN_SMEM_FLOATS {chain_floats} CHAIN_REMAP {remap} SPREAD {spread}"
        )
        try:
            r = co.program(device, args.program, sets, True, True, True)
        except Exception as e:  # noqa: BLE001 - one combination's failure, the rest run
            print(f"{label}: {type(e).__name__}: {e}"[:400], flush=True)
            continue
        runs = sorted(r["runs"].items(), key=lambda kv: -kv[1][0])
        total = sum(seconds for seconds, _ in r["runs"].values())
        shown = "; ".join(
            f"{seconds * 1e3:.3f} in {count:.1f} x {run[:24]}"
            for run, (seconds, count) in runs[: args.top]
        )
        print(
            f"{label}: {total * 1e3:8.3f} ms/iter in the graphs' replays "
            f"({time.perf_counter() - started:.0f} s); {shown}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
