"""The cpu backend's threads (``timerlc/runtime/pool.py``) apart from any program: PPO's
product shapes by NumPy's OpenBLAS on its own threads and on one, and cut by the pool; a
loop of tanh over a range handed to the pool and run alone. Each way runs in a process of
its own (OpenBLAS's idle threads spin after a call and would slow the next way's):

    python scripts/bench_threads.py            # all ways, 300 calls each
    python scripts/bench_threads.py --calls 1000

The medians of 5 runs of ``--calls`` calls, in microseconds a call.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = [  # (m, n, k, A transposed): PPO 256 x 128's minibatch step, and 16 x 128's
    (8192, 64, 64, False),
    (64, 64, 8192, True),
    (8192, 64, 4, False),
    (4, 64, 8192, True),
    (512, 64, 64, False),
    (64, 64, 512, True),
]
WAYS = ("openblas-own-threads", "openblas-1-thread", "pool")

# fn(frame, lo, hi): y[i] = tanh(x[i]) (through exp: a loop of transcendental work)
TANH = r"""
declare float @llvm.exp.f32(float)
define i32 @tanh_rows(ptr %frame, i64 %lo, i64 %hi) {
entry:
  %x = load ptr, ptr %frame
  %q = getelementptr ptr, ptr %frame, i64 1
  %y = load ptr, ptr %q
  br label %head
head:
  %i = phi i64 [ %lo, %entry ], [ %i1, %body ]
  %more = icmp slt i64 %i, %hi
  br i1 %more, label %body, label %done
body:
  %px = getelementptr float, ptr %x, i64 %i
  %v = load float, ptr %px
  %v2 = fmul float %v, 2.0
  %e = call float @llvm.exp.f32(float %v2)
  %a = fadd float %e, 1.0
  %b = fdiv float 2.0, %a
  %t = fsub float 1.0, %b
  %py = getelementptr float, ptr %y, i64 %i
  store float %t, ptr %py
  %i1 = add i64 %i, 1
  br label %head
done:
  ret i32 0
}
"""


def _timed(fn, calls: int) -> float:
    import numpy as np

    for _ in range(max(10, calls // 10)):
        fn()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t) / calls * 1e6)
    return float(np.median(runs))


def one_way(way: str, calls: int) -> dict:
    import numpy as np

    from timerlc.runtime import pool
    from timerlc.runtime.native import (
        _llvm,
        _optimized,
        blas_threads,
        cblas,
        target_machine,
    )

    blas = cblas()
    if blas is None:
        raise SystemExit("no BLAS of NumPy's found")
    p = None
    if way == "pool":
        p = pool.Pool(max(1, pool.threads() - 1), blas)  # (OpenBLAS then on one thread)
        gemm = p.gemm["s"]
    else:
        blas_threads(1 if way == "openblas-1-thread" else pool.threads())
        gemm = blas["s"]
    sgemm = pool.gemm_type("s")(gemm)
    out = {}
    for m, n, k, ta in SHAPES:
        a = np.random.rand(*((k, m) if ta else (m, k))).astype(np.float32)
        b = np.random.rand(k, n).astype(np.float32)
        c = np.zeros((m, n), np.float32)
        args = (101, 112 if ta else 111, 111, m, n, k, 1.0, a.ctypes.data, a.shape[1])
        args += (b.ctypes.data, n, 0.0, c.ctypes.data, n)
        out[f"{m}x{n}x{k}{' A^T' if ta else ''}"] = _timed(lambda args=args: sgemm(*args), calls)
    if way != "openblas-own-threads":
        llvm = _llvm()
        tm = target_machine()
        engine = llvm.create_mcjit_compiler(_optimized(TANH, tm), tm)
        engine.finalize_object()
        fn = engine.get_function_address("tanh_rows")
        for n in (32768, 524288):
            x = np.random.randn(n).astype(np.float32)
            y = np.zeros_like(x)
            frame = np.array([x.ctypes.data, y.ctypes.data], np.int64)
            if p is None:
                run = ctypes.CFUNCTYPE(
                    ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64
                )(fn)
                call = lambda run=run, frame=frame, n=n: run(frame.ctypes.data, 0, n)
            else:
                run = pool.RUN(p.run)
                call = lambda run=run, frame=frame, n=n: run(fn, frame.ctypes.data, 0, n, 8192, 4)
            out[f"tanh loop of {n}"] = _timed(call, calls)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300, help="calls a run (5 runs a way)")
    ap.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # (a child's)
    args = ap.parse_args()
    if args.way:
        print(json.dumps(one_way(args.way, args.calls)))
        return 0
    rows: dict[str, dict] = {}
    for way in WAYS:
        cmd = [sys.executable, __file__, "--way", way, "--calls", str(args.calls)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        for what, us in json.loads(done.stdout.strip().splitlines()[-1]).items():
            rows.setdefault(what, {})[way] = us
    print(f"| us a call | {' | '.join(WAYS)} |")
    print(f"|---|{'---|' * len(WAYS)}")
    for what, by in rows.items():
        cells = " | ".join(f"{by[w]:.1f}" if w in by else "-" for w in WAYS)
        print(f"| {what} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
