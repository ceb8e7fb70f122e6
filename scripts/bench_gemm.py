"""Benchmark: a matmul in generated code through the BLAS against the kernel's own loops.

For each shape m x k x n, a program computes ``a[r] @ w`` at 400 points (``a`` depends on
the point, ``w`` does not) with every matmul compiled as a BLAS call (the threshold of
``codegen.lower.BLAS_MIN_MACS`` set to 1), then runs it twice on the cpu runtime: with the
CBLAS it finds, and with none (the kernel's loops). Prints microseconds per call of the
matmul's statement (``CpuRuntime(profile=True)``: each call also pays a few microseconds of
Python). The threshold in codegen/lower.py comes from this table (docs/codegen.md).

  python scripts/bench_gemm.py
"""

from __future__ import annotations

from timerlc.codegen import lower
from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.diagnostics import Source
from timerlc.frontend.check import check_source
from timerlc.runtime import native
from timerlc.runtime.cpu import CpuRuntime

SHAPES = [
    (1, 64, 64),
    (16, 64, 2),
    (16, 4, 64),
    (16, 64, 64),
    (64, 64, 64),
    (512, 4, 64),
    (512, 64, 64),
    (2048, 64, 64),
]

PROGRAM = """config R = 400
dim r < R
a[r] = reshape(f32(arange({mk})) * 0.001 + f32(r) * 0.0001, [{m}, {k}])
w = reshape(f32(arange({kn})) * 0.001, [{k}, {n}])
y[r] = a[r] @ w
s[r] = sum(y[r])
out s
metric s
"""


def per_call(gen, sid: int, blas) -> float:
    setter = native._blas()[1]  # (its threads' setter kept)
    native._CBLAS[:] = [(blas, setter)]  # what the runtime finds (None: no BLAS)
    rt = CpuRuntime(gen.plan, native=gen.text, profile=True)
    rt.run()
    return rt.seconds[sid] / rt.calls[sid] * 1e6


def main():
    lower.BLAS_MIN_MACS = 1
    found = native.cblas()
    if found is None:
        print("no CBLAS found: nothing to compare")
        return
    print("| m x k x n | BLAS us | loops us |\n|---|---|---|")
    for m, k, n in SHAPES:
        text = PROGRAM.format(m=m, k=k, n=n, mk=m * k, kn=k * n)
        gen = generate_code(compile_plan(run_passes(check_source(Source("p.rtl", text)))))
        sid = next(s.id for s in gen.plan.statements if any(x.op == "matmul" for x in s.nodes))
        print(
            f"| {m}x{k}x{n} | {per_call(gen, sid, found):.1f} | {per_call(gen, sid, None):.1f} |"
        )


if __name__ == "__main__":
    main()
