"""Where a cuda run's time goes on the host: the device runtime's primitives, and a program's
run with and without its parts.

A program at PPO's sizes is launch-bound on a GPU: thousands of small launches an iteration,
each costing the host more than the GPU (docs/cuda.md, "Launch overhead"). This measures,
on the device (``--emu``: the emulated one, for the plumbing only):

- ``launch``: a function of the module launched over one block, as the runtime launches
  (``CupyDevice.launch``), then one wait: microseconds per launch;
- ``launch + code read``: a launch, then the failure record read (a wait for the device:
  what the runtime did after each kernel that can fail until it read them late):
  microseconds per launch and read;
- ``launch in a graph``: a CUDA graph of 100 such launches replayed (``runtime/graphs.py``):
  microseconds per launch;
- ``gemm``: a 2048x64 @ 64x64 product by the device's BLAS, as the runtime calls it; a
  minibatch step's weight gradients (65,536 terms), the device's time each;
- ``program``: PPO (or ``--program``) at ``--set`` sizes, timed per iteration (from the
  metrics' rows: they come down when the device gets there and the host next looks, so
  where the host runs ahead of a busy device, as graphs let it, the rows of a short run
  arrive together at its end and the figure says nothing: on the H100, 0.06 ms an
  iteration for PPO, whose iteration takes 11; ``scripts/bench.py`` measures that) as it
  runs, and with the host's work alone (a device that launches
  nothing: the interpreter's floor); each with the runs of the tree replayed as CUDA graphs
  and without, and with its loops run as launches instead of loop kernels
  (``cuda/loops.py``); once with each replay between two CUDA events: the device's
  milliseconds an iteration in the runs that took it longest. ``--kernels``: only the
  program without graphs, each launch and product between two events (``Timed``): the
  functions and product shapes the device's time an iteration goes to.

    python scripts/cuda_overheads.py --set B=2048 --set T=128 --set total_steps=2621440
    python scripts/cuda_overheads.py --emu --set B=16 --set T=16 --set total_steps=1280
    python scripts/cuda_overheads.py --kernels --program reinforce --set B=2048 --set T=128
    python scripts/cuda_overheads.py --kernels --matmul-precision tensorfloat32 --set B=2048 \
        --set T=128 --set total_steps=1572864     # TF32 products (ours, joint ones)
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EMPTY = r"""
extern "C" __global__ void tl_empty(void **table, const tl_args args, char *scratch, int *err,
                                    const long long *shift) {
  if (threadIdx.x == 0 && args.v[0] < 0) err[0] = (int)args.v[0];
}
"""


def primitives(device, n: int) -> dict[str, float]:
    from timerlc.cuda import render

    module = device.load(render.head() + EMPTY)
    fn = device.function(module, "tl_empty")
    table, scratch = device.alloc(64), device.alloc(64)
    args = np.zeros(1, np.int64)
    out = {}
    device.code()  # (the module loaded, the device idle)
    started = time.perf_counter()
    for _ in range(n):
        device.launch(fn, table, args, scratch, 1)
    device.code()
    out["launch"] = (time.perf_counter() - started) / n * 1e6
    started = time.perf_counter()
    for _ in range(n):
        device.launch(fn, table, args, scratch, 1)
        device.code()
    out["launch + code read"] = (time.perf_counter() - started) / n * 1e6
    # a CUDA graph of 100 launches, replayed (runtime/graphs.py): the cost of a launch in it
    device.begin_capture()
    for _ in range(100):
        device.launch(fn, table, args, scratch, 1)
    graph = device.end_capture()
    device.replay(graph)
    device.code()
    started = time.perf_counter()
    for _ in range(max(1, n // 100)):
        device.replay(graph)
    device.code()
    out["launch in a graph"] = (time.perf_counter() - started) / (max(1, n // 100) * 100) * 1e6
    m, k, c = 2048, 64, 64
    a, b, d = device.alloc(m * k * 4), device.alloc(k * c * 4), device.alloc(m * c * 4)
    for p, nbytes in ((a, m * k * 4), (b, k * c * 4), (d, m * c * 4)):
        device.zero(p, nbytes)
    device.gemm("f32", m, c, k, a, k, False, b, c, False, d, c)
    device.code()
    started = time.perf_counter()
    for _ in range(n // 4):
        device.gemm("f32", m, c, k, a, k, False, b, c, False, d, c)
    device.code()
    out["gemm 2048x64x64"] = (time.perf_counter() - started) / (n // 4) * 1e6
    out.update(weight_gradients(device))
    return out


def weight_gradients(device, reps: int = 20) -> dict[str, float]:
    """A minibatch step's weight gradients (``x^T @ dy``: 65,536 terms, 64 x 64 and 4 x 64
    results), the device's microseconds each (between two of its marks, ``reps`` in a row),
    and the largest relative difference from float64's product, of random operands. (Split
    over their terms, a strided batch of 128 products and a sum, they took 33 and 34.7 us on
    the H100 against 30.4 and 25 as one product: docs/performance.md.)"""
    out = {}
    k, n = 65536, 64
    rng = np.random.default_rng(0)
    for m in (64, 4):
        x = rng.standard_normal((k, m)).astype(np.float32)
        dy = rng.standard_normal((k, n)).astype(np.float32)
        a, b = device.alloc(x.nbytes), device.alloc(dy.nbytes)
        device.upload(a, x)
        device.upload(b, dy)
        d = device.alloc(m * n * 4)
        device.gemm("f32", m, n, k, a, m, True, b, n, False, d, n)  # (a first call)
        c = np.zeros((m, n), np.float32)
        device.download(d, c)
        start = device.mark()
        for _ in range(reps):
            device.gemm("f32", m, n, k, a, m, True, b, n, False, d, n)
        seconds = device.elapsed(start, device.mark())
        out[f"gemm {m}x{n}x{k} A^T (device)"] = seconds / reps * 1e6
        want = x.astype(np.float64).T @ dy.astype(np.float64)
        err = float(np.max(np.abs(c - want)) / np.max(np.abs(want)))
        out[f"gemm {m}x{n}x{k} A^T: largest error / largest value"] = err
    return out


_GENERATED: dict = {}  # (program, sets) -> its code for the cuda target, made once


def program(
    device,
    name: str,
    sets: dict[str, str],
    graphs: bool = True,
    time_graphs: bool = False,
    loops: bool = True,
) -> dict:
    from timerlc.compiler import compile_plan, generate_code, run_passes
    from timerlc.diagnostics import Source
    from timerlc.frontend.check import check_source
    from timerlc.runner import _print_products
    from timerlc.runtime.cuda import DeviceRuntime

    at = (name, tuple(sorted(sets.items())))
    if at not in _GENERATED:
        path = ROOT / "programs" / f"{name}.rtl"
        graph = check_source(Source(str(path), path.read_text()), overrides=sets)
        _GENERATED[at] = generate_code(compile_plan(run_passes(graph)), target="cuda")
    gen = _GENERATED[at]
    rows: list[float] = []
    last = [None]

    def on_metric(name, coords, value):
        at = coords.get("i", next(iter(coords.values()), None))
        if at != last[0]:  # (a new iteration's first row)
            last[0] = at
            rows.append(time.perf_counter())

    rt = DeviceRuntime(
        gen.plan,
        on_metric,
        text=gen.text,
        device=device,
        graphs=graphs,
        time_graphs=time_graphs,
        loops=loops,
    )
    started = time.perf_counter()
    rt.run()
    total = time.perf_counter() - started
    if device.products == "fastest":  # (which products ran as ours: their times)
        with contextlib.redirect_stderr(sys.stdout):
            _print_products(rt)
    per = np.diff(rows)[1:] if len(rows) > 2 else np.array([total])
    launches = rt.launches / max(1, len(rows))
    rt.envs.close()
    return {
        "s/iter": float(np.median(per)),
        "iterations": len(rows),
        "launches/iter": launches,
        "BLAS/iter": rt.blas_calls / max(1, len(rows)),
        "replayed/iter": rt.graph_launches / max(1, len(rows)),
        # (launches and products one after another: outside graphs, and each replay's
        # longest chain of waits, runtime/graphs.py's Order)
        "chained/iter": rt.chained / max(1, len(rows)),
        "graphs": rt.graphs_made,
        # per run: the device's seconds in its replays an iteration, and replays an iteration
        "runs": {
            run: (seconds / max(1, len(rows)), count / max(1, len(rows)))
            for run, (seconds, count) in rt.graph_seconds.items()
        },
        "refused": rt.graph_refusals,
    }


SPIN = r"""
extern "C" __global__ void tl_spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {}
}
"""


class Timed:
    """The device with each launch and product between two of its marks (``mark``,
    ``elapsed``: CUDA events on a GPU): the device's seconds of each function (by its name and
    blocks) and of each product (by its shape), read ``BATCH`` pairs at a time. Run without
    graphs (a captured launch is not timed), it says which kernels an iteration's device time
    goes to. On a GPU a busy wait of ``SPIN_US`` runs before each first mark, so that the call
    is in the device's queue before the mark is reached: what the GPU would wait for the
    host between the two is not counted (the figures are the device's own work); each
    call's figure is its median (a first call's loading of cuBLAS's kernels is not)."""

    BATCH = 256
    SPIN_US = 30

    def __init__(self, device):
        self._device = device
        self._names: dict = {}
        self._marks: list = []
        self.seconds: dict[tuple, list] = {}  # (kind, what) -> [seconds of each call]
        self._spin = None
        cp = getattr(device, "cp", None)
        if cp is not None:  # (a GPU: its clock rate in kHz)
            fn = cp.RawModule(code=SPIN).get_function("tl_spin")
            khz = cp.cuda.Device().attributes["ClockRate"]
            cycles = np.int64(khz * self.SPIN_US // 1000)
            self._spin = lambda: fn((1,), (1,), (cycles,))

    def __getattr__(self, name):
        return getattr(self._device, name)

    def function(self, module, name):
        fn = self._device.function(module, name)
        self._names[id(fn)] = (fn, name)  # (kept: its id stays its own)
        return fn

    def _timed(self, what, run):
        if self._spin is not None:
            self._spin()
        start = self._device.mark()
        run()
        self._marks.append((what, start, self._device.mark()))
        if len(self._marks) >= self.BATCH:
            self.read()

    def launch(self, fn, table, values, scratch, grid, shift=0):
        name = self._names.get(id(fn), (None, repr(fn)))[1]
        self._timed(
            ("launch", f"{name} ({grid} blocks)"),
            lambda: self._device.launch(fn, table, values, scratch, grid, shift),
        )

    def gemm(self, dtype, m, n, k, a, lda, ta, b, ldb, tb, c, ldc):
        shape = f"{dtype} {m}x{n}x{k}{' A^T' if ta else ''}{' B^T' if tb else ''}"
        self._timed(
            ("gemm", shape),
            lambda: self._device.gemm(dtype, m, n, k, a, lda, ta, b, ldb, tb, c, ldc),
        )

    def read(self):
        for what, start, end in self._marks:
            self.seconds.setdefault(what, []).append(self._device.elapsed(start, end))
        self._marks = []


def _idle():
    """A device that runs nothing (its memory the emulation's): the host's work alone."""
    from timerlc.runtime.cuda import EmuDevice

    class Idle(EmuDevice):
        MAX_BLOCKS = 65535

        def load(self, text, cache=None, defines=()):
            return None

        def function(self, module, name):
            return name

        def launch(self, *a):
            pass

        def gemm(self, *a):
            pass

        def set_shift(self, *a):
            pass

        def upload(self, *a, **k):
            pass

        def download(self, *a):
            pass

        def zero(self, *a):
            pass

        def failure(self):
            return 0, 0, ()

        def snapshot(self, ptr, nbytes):  # (no failure: its record is never zeroed here)
            return np.zeros(max(nbytes, 1), np.uint8), np.zeros(10, np.int64), None

    return Idle()


def kernels(timed: Timed, iterations: int, top: int = 30):
    """The device's time an iteration by function and by product shape (``Timed``: each
    call's median): the ``top`` largest, and the sums of each kind."""
    timed.read()
    per = max(1, iterations)
    total = {"launch": 0.0, "gemm": 0.0}
    rows = []
    for (kind, what), seconds in timed.seconds.items():
        median = float(np.median(seconds))
        total[kind] += median * len(seconds) / per
        rows.append((median * len(seconds) / per, len(seconds) / per, median, kind, what))
    print(
        f"  device time an iteration: {total['launch'] * 1e3:.3f} ms in launches, "
        f"{total['gemm'] * 1e3:.3f} ms in products (each call's median, its own work on the "
        "device: the host's time between the two marks not counted)",
        flush=True,
    )
    rows.sort(key=lambda r: -r[0])
    for per_iter, count, median, kind, what in rows[:top]:
        print(
            f"  {per_iter * 1e3:8.3f} ms/iter {count:7.1f} x {median * 1e6:9.1f} us  "
            f"{kind:6s} {what}",
            flush=True,
        )
    rest = rows[top:]
    if rest:  # (the H200's PPO: 2.5 of 12.9 ms an iteration below its top 30)
        print(
            f"  {sum(r[0] for r in rest) * 1e3:8.3f} ms/iter in {len(rest)} more functions "
            f"and product shapes ({sum(r[1] for r in rest):.1f} calls an iteration; --top)",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emu", action="store_true", help="the emulated device (cuda-emu)")
    ap.add_argument("--program", default="ppo")
    ap.add_argument(
        "--top", type=int, default=30, help="--kernels: the largest this many (default 30)"
    )
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("-n", type=int, default=4000, help="launches for the primitives")
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="only the program without graphs, each launch and product timed (where the "
        "device's time goes)",
    )
    ap.add_argument(
        "--launches",
        action="store_true",
        help="only count the launches an iteration makes, and those one after another in "
        "its graphs (graphs.Order), on a device that runs nothing "
        "(no GPU needed; products of ours counted as their functions; the count without "
        "graphs)",
    )
    from cuda_gpu_check import add_matmul_precision, open_device

    add_matmul_precision(ap)
    args = ap.parse_args()

    sets = dict(s.split("=", 1) for s in args.set)
    if args.launches:
        r = program(_idle(), args.program, sets, False, False, True)
        g = program(_idle(), args.program, sets, True, False, True)
        print(
            f"{args.program}: {r['launches/iter']:.2f} launches an iteration "
            f"({r['iterations']} iterations counted); with graphs "
            f"{g['chained/iter']:.1f} of them one after another"
        )
        return 0
    device = open_device(args.emu, "cuda_overheads", args.matmul_precision)
    if device is None:
        return 2
    if args.kernels:
        timed = Timed(device)
        r = program(timed, args.program, sets, False, False, True)
        print(
            f"{args.program} without graphs, each launch and product timed: "
            f"{r['s/iter'] * 1e3:.2f} ms/iter ({r['iterations']} iterations)",
            flush=True,
        )
        kernels(timed, r["iterations"], args.top)
        return 0
    for what, value in primitives(device, args.n).items():
        unit = "" if "error" in what else " us"
        print(f"  {what:24s} {value:9.3g}{unit}", flush=True)
    for label, dev, graphs in (
        ("as it runs", device, True),
        ("as it runs, replays timed", device, True),
        ("as it runs, no loop kernels", device, True),
        ("as it runs, no graphs", device, False),
        ("host only (nothing launched)", _idle(), True),
        ("host only, no loop kernels", _idle(), True),
        ("host only, no graphs", _idle(), False),
    ):
        r = program(dev, args.program, sets, graphs, "timed" in label, "no loop" not in label)
        print(
            f"{args.program} {label:30s} {r['s/iter'] * 1e3:8.2f} ms/iter "
            f"({r['iterations']} iterations, {r['launches/iter']:.0f} launches and "
            f"{r['BLAS/iter']:.0f} BLAS products an iteration, {r['replayed/iter']:.0f} of "
            f"them replayed in {r['graphs']} graphs, {r['chained/iter']:.0f} one after "
            "another)",
            flush=True,
        )
        for error in r["refused"][:1]:
            print(f"  a capture was refused: {error[:300]}", flush=True)
        # the runs whose replays took the device the longest (an iteration's share)
        for run, (seconds, count) in sorted(r["runs"].items(), key=lambda kv: -kv[1][0])[:6]:
            print(f"  {seconds * 1e3:8.3f} ms/iter in {count:6.1f} replays of {run}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
