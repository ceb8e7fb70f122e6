"""How each program's kernels run on a device: their steps by kind, and the work left on
one thread.

The cuda renderer (``timerlc/cuda/render.py``, docs/cuda.md) cuts each statement's kernel
into steps: a parallel loop, a gemm and a reduction run over the grid, a run of the other
statements on one thread. A serial step's loops run one iteration after another on a single
GPU thread, so a big one is where a GPU run would crawl. This prints, per program (at the
sizes ``--set`` gives), the steps of each kind and the serial steps with the most loop
iterations per call (counted from the loops' constant bounds: a loop whose bounds are not
constants counts its body once, a gemm its multiply-adds), without a GPU.

    python scripts/cuda_steps.py                              # every program, its own sizes
    python scripts/cuda_steps.py ppo --set B=2048 --set T=128 --top 10
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def work(stmts) -> int:
    """The iterations of ``stmts`` on one thread (the longer branch of an ``if``)."""
    from timerlc.codegen import kir

    total = 0
    for s in stmts:
        if isinstance(s, kir.For):
            lo, hi = s.lo, s.hi
            n = 1
            if isinstance(lo, kir.Const) and isinstance(hi, kir.Const):
                n = max(int(hi.value) - int(lo.value), 0)
            total += n * max(1, work(s.body))
        elif isinstance(s, kir.If):
            total += max(work(s.then), work(s.orelse))
        elif isinstance(s, kir.Gemm):
            total += s.m * s.n * s.k
        elif isinstance(s, kir.Permute):
            total += s.n
        else:
            total += 1
    return total


def report(name: str, sets: dict, top: int) -> int:
    """Print one program's report; the serial work of its kernels per call (summed)."""
    from timerlc.compiler import compile_source, generate_code
    from timerlc.cuda import render
    from timerlc.diagnostics import Source

    path = ROOT / "programs" / f"{name}.rtl"
    _, plan, _ = compile_source(Source(str(path), path.read_text()), sets, backend="cuda-emu")
    gen = generate_code(plan, target="cuda")
    kinds: Counter = Counter()
    serial = []
    for k in gen.kernels:
        for kind, body in render.steps(k):
            kinds[kind] += 1
            if kind == "serial":
                serial.append((work(body), k.name))
    serial.sort(reverse=True)
    total = sum(w for w, _ in serial)
    size = " ".join(f"{k}={v}" for k, v in sets.items())
    print(f"{name} {size}".rstrip() + f": {len(gen.kernels)} kernels")
    print(
        "  steps: "
        + ", ".join(
            f"{kinds[k]} {k}" for k in ("parallel", "either", "blas", "gemm", "reduce", "perm")
        )
    )
    print(f"         {kinds['serial']} serial, {total} iterations on one thread per call of each")
    for w, kname in serial[:top]:
        print(f"    {w:>12}  {kname}")
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("programs", nargs="*", help="program names (default: every program)")
    p.add_argument("--set", action="append", default=[], help="NAME=VALUE (a config)")
    p.add_argument("--top", type=int, default=5, help="the serial steps to list (5)")
    args = p.parse_args(argv)
    sets = dict(s.split("=", 1) for s in args.set)
    names = args.programs or sorted(f.stem for f in (ROOT / "programs").glob("*.rtl"))
    for name in names:
        report(name, sets if args.programs else {}, args.top)
    return 0


if __name__ == "__main__":
    # (the compiler recurses deeply on big programs, as the CLI's deep stack allows)
    sys.setrecursionlimit(100000)
    threading.stack_size(512 * 1024 * 1024)
    result: list = []

    def run():
        try:
            result.append(main())
        except SystemExit as e:  # (argparse's --help and usage errors, in the thread)
            result.append(e.code if isinstance(e.code, int) else 2)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    sys.exit(result[0] if result else 1)
