"""What each function of a program's CUDA module holds of an H100, without a GPU.

Compiles the module the cuda backend builds for a program (``--set`` its sizes) with nvcc
for sm_90, reads ptxas's report of each function (registers, shared memory, bytes spilled
to local memory) and estimates the blocks of 128 threads an H100 multiprocessor holds of
it at once (by its registers, its shared memory and the multiprocessor's 2048 threads;
on a GPU the driver's occupancy decides, ``CupyDevice.grid_limit``). A function that holds
fewer than 16 blocks an SM gets a smaller grid, each of its threads more points; a spill
is a slow load. Sorted by blocks an SM, then registers:

  python scripts/cuda_resources.py ppo --set B=2048 --set T=128 --set total_steps=1572864
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# an H100 (sm_90) multiprocessor: its registers, shared memory (and the 1 KB the driver keeps
# for each block), threads, blocks; registers are given to a warp 256 at a time
REGISTERS, SHARED, RESERVED, THREADS_SM, BLOCKS_SM, GRANULE = 65536, 233472, 1024, 2048, 32, 256
THREADS = 128  # of a block (cuda.render.THREADS)

ENTRY = re.compile(r"Compiling entry function '(\w+)'")
SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
SMEM = re.compile(r"(\d+) bytes smem")


def blocks_per_sm(registers: int, smem: int) -> tuple[int, str]:
    """The blocks of ``THREADS`` threads an SM holds of a function, and what limits them."""
    warps = THREADS // 32
    per_warp = -(-max(registers, 1) * 32 // GRANULE) * GRANULE
    limits = {
        "threads": THREADS_SM // THREADS,
        "blocks": BLOCKS_SM,
        "registers": REGISTERS // (per_warp * warps),
        "shared": SHARED // (smem + RESERVED),
    }
    why = min(limits, key=limits.get)
    return limits[why], why


def report(text: str) -> list[dict]:
    """Each function's registers, shared memory, spills and blocks an SM (``text``: ptxas's
    verbose report)."""
    rows, current = [], None
    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            current = {"name": m.group(1), "spill": 0}
            rows.append(current)
            continue
        if current is None:
            continue
        m = SPILL.search(line)
        if m:
            current["spill"] = int(m.group(1)) + int(m.group(2))
        m = USED.search(line)
        if m:
            smem = SMEM.search(line)  # (ptxas leaves it out where there is none)
            current["registers"], current["smem"] = (
                int(m.group(1)),
                int(smem.group(1)) if smem else 0,
            )
            current["blocks"], current["limit"] = blocks_per_sm(
                current["registers"], current["smem"]
            )
    return [r for r in rows if "registers" in r]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("program", help="a program of programs/ (its name)")
    ap.add_argument("--set", action="append", default=[], help="a config value, NAME=VALUE")
    ap.add_argument("--all", action="store_true", help="every function (default: below 16)")
    args = ap.parse_args()
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("cuda_resources: nvcc is not on PATH")
        return 2
    from timerlc.compiler import compile_plan, generate_code, run_passes
    from timerlc.diagnostics import Source
    from timerlc.frontend.check import check_source

    path = ROOT / "programs" / f"{args.program}.rtl"
    sets = dict(s.split("=", 1) for s in args.set)
    graph = check_source(Source(str(path), path.read_text()), overrides=sets)
    text = generate_code(compile_plan(run_passes(graph)), target="cuda").text
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / "module.cu"
        cu.write_text(text)
        cmd = [nvcc, "-cubin", "-arch=sm_90", "-Xptxas", "-v", str(cu), "-o", str(cu) + ".o"]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        print(r.stderr[-3000:])
        return 1
    rows = sorted(report(r.stderr), key=lambda x: (x["blocks"], -x["registers"]))
    shown = [x for x in rows if args.all or x["blocks"] < 16 or x["spill"]]
    print(f"{len(rows)} functions; {len(shown)} shown (fewer than 16 blocks an SM, or spills)")
    print("| function | registers | shared B | spilled B | blocks an SM | limit |")
    print("|---|---|---|---|---|---|")
    for x in shown:
        print(
            f"| {x['name']} | {x['registers']} | {x['smem']} | {x['spill']} | {x['blocks']} "
            f"| {x['limit']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
