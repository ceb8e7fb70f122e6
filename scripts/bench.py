"""Benchmark: timerlc against eager PyTorch and jitted JAX on CartPole (REINFORCE and PPO).

This is a benchmark, not a test: it never fails on slow or missing results.

What runs. For each algorithm (reinforce, ppo) and each point B envs x T rollout steps of a
grid (by default 16x128, 64x128, 256x128, 16x512), three implementations of the same
algorithm on the same CartPole dynamics, each in its own subprocess (so that peak memory is
its own), alternating:

  * timerlc: python -m timerlc.cli run programs/<algo>.rtl --backend BACKEND --set B=.. T=..
             --no-progress --metrics TMP.jsonl, with I iterations (reinforce: --set I=I;
             ppo: --set total_steps=I*B*T, from which ppo.rtl derives I);
  * torch:   scripts/baselines/torch_<algo>.py: eager PyTorch in CleanRL's structure, on
             timerlc's NumPy CartPole (timerlc.envs);
  * jax:     scripts/baselines/jax_<algo>.py: PureJaxRL's structure, the whole run under one
             jax.jit, CartPole in jax.numpy with timerlc's dynamics (pip install -e .[bench]);
             its float32 products as JAX computes them by default (TF32 on recent NVIDIA
             GPUs: 10 bits of mantissa; timerlc's are float32);
  * jax-f32: the same with --matmul-precision float32 (true float32 products, as timerlc's:
             the like-for-like comparison on a GPU; on a CPU the same as jax). Not by default.
  * timerlc-tf32: with --matmul-precision float32,tensorfloat32, timerlc again with its
             float32 products in TF32 (the like-for-like figure against jax on a GPU).

What is measured. Every system runs N and N + M iterations; a time per iteration is
(time(N + M) - time(N)) / M, so that what every run does once (interpreter start-up, imports,
timerlc's compile, JAX's tracing and XLA compile, first-iteration warm-up) cancels out.

  * s/iter (the headline): time(n) is the run's own window over its iterations, which leaves
    start-up and compile out and its warm-up in: torch, its training loop (total_seconds);
    jax, the ahead-of-time compiled run (run_seconds); timerlc, from the first to the last
    iteration's metrics rows appearing in the streamed metrics file (a thread here tails
    it). The median of --repeats R measurements (3): one run slowed by another job on the
    machine skews a difference of two runs.
  * wall s/iter (second table): time(n) is the whole subprocess's wall time, measured here
    the same way for every system. Compile times vary by a second or more on a busy machine
    (JAX's: 3-6 s at 16x128 with another job on the second core), and all of that lands in
    the difference: use it as a cross-check, with a large N.
  * N is --iters; M is N, or more for a system whose N run's in-run estimate says that N
    iterations take less than --min-diff-seconds (M then takes that long: two runs a
    system, where raising N and redoing the N run took three); the second table gives each
    N + M. Each run's window and each system's figure are printed as they come, and --json
    is rewritten after every run (a bench stopped by a time limit keeps what it measured).
    A run's "in-run" estimate (its window over its iterations) only sizes M: it is not
    comparable across systems (JAX's compiled run of N = 10 iterations held a first run's
    cost, 17 ms an iteration on the H200 where the H100's differenced figures were 2.7-8.6;
    timerlc's window leaves its first iteration out).
  * peak MB: the peak resident set size (ru_maxrss) of each subprocess, read from os.wait4's
    resource usage of that child; the largest over a system's runs.
  * ratios: timerlc / torch and timerlc / jax, of s/iter and of peak MB (< 1: timerlc
    faster / smaller).
  * JAX's compile seconds and each system's last ep_ret (a sanity check only: the three use
    different random streams) are in the second table.

Threads: each framework's default unless --threads. On a 2-core machine where another job
keeps a core busy, give --threads 1: torch's default of a thread per core then waits on the
busy core at every op (torch_reinforce.py at 16x128 took 1.7 s/iter with 2 threads, 0.035 s
with 1).

OpenBLAS: timerlc's cpu products call numpy's OpenBLAS, whose kernels follow the CPU unless
OPENBLAS_CORETYPE names others (XLA and torch do not use it). Some machines set it, with
OPENBLAS_L2_SIZE, to an older kind: this project's 2-core machines set Haswell (AVX2) on an
AVX-512 CPU, where PPO's 8192 x 64 x 64 products take 1.8x the time of SkylakeX's kernels.
The header names the kernels that ran; to measure with the CPU's own, unset both in the
bench's command alone:

  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python scripts/bench.py --algos ppo

A run that fails (e.g. a backend this version does not have) or a baseline whose framework
is not installed shows "n/a" or "not installed"; the benchmark goes on.

  python scripts/bench.py                             # the default grid, N = 10, 3 repeats
  python scripts/bench.py --quick                     # a tiny grid, N = 3
  python scripts/bench.py --algos ppo --configs 16x128 --iters 10 --baselines torch,jax
  python scripts/bench.py --backend reference --json out.json

On a GPU machine: --device cuda runs the torch baselines with their networks and buffers on
the GPU (the environments stay NumPy on the host, as in CleanRL) and jax on the GPU
(JAX_PLATFORMS; --device cpu pins it to the CPU), and --backend cuda runs timerlc's device
runtime. The main table then adds each system's peak device memory: torch's allocator's
(max_memory_allocated), XLA's (peak_bytes_in_use), timerlc's device runtime's (arena,
scratch and the rest: the line a device run ends with; not --profile, which times each call
and so replays no CUDA graph).

  python scripts/bench.py --device cuda --backend cuda --algos ppo --configs 16x128,256x128,2048x128
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / "scripts" / "baselines"
# baseline -> the module it needs; its script is scripts/baselines/<SCRIPT>_<algo>.py
KNOWN_BASELINES = {"torch": "torch", "jax": "jax", "jax-f32": "jax"}
SCRIPT = {"torch": "torch", "jax": "jax", "jax-f32": "jax"}
# a baseline's own arguments: jax-f32 is the jax baseline with true float32 products (JAX's
# default on recent NVIDIA GPUs computes float32 products with TF32: 10 bits of mantissa)
EXTRA_ARGS = {"jax-f32": ["--matmul-precision", "float32"]}

DEFAULT_CONFIGS = [(16, 128), (64, 128), (256, 128), (16, 512)]
DEFAULT_GRID = {"reinforce": DEFAULT_CONFIGS, "ppo": DEFAULT_CONFIGS}
QUICK_GRID = {
    "reinforce": [(4, 32), (8, 64)],
    "ppo": [(4, 64)],
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Compare timerlc with eager PyTorch and jitted JAX baselines on CartPole."
    )
    p.add_argument(
        "--iters",
        type=int,
        default=None,
        help="N: runs of N and N + M iterations, M = N or more (default 10)",
    )
    p.add_argument("--quick", action="store_true", help="a tiny grid (and N = 3)")
    p.add_argument("--backend", default="cpu", help="timerlc backend (default cpu)")
    p.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the baselines run: torch's --device, JAX_PLATFORMS for jax (default cpu; "
        "cuda on a GPU machine, with --backend cuda for timerlc)",
    )
    p.add_argument(
        "--algos", default="reinforce,ppo", help="comma-separated subset of reinforce,ppo"
    )
    p.add_argument(
        "--baselines", default="torch,jax", help="comma-separated subset of torch,jax (or none)"
    )
    p.add_argument(
        "--configs", default=None, help="comma-separated BxT points, e.g. 16x128,64x128"
    )
    p.add_argument("--envs", default=None, help="comma-separated B values (overrides the grid)")
    p.add_argument("--steps", default=None, help="comma-separated T values (overrides the grid)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads for every system: torch.set_num_threads, XLA's intra-op threads, "
        "OMP/OPENBLAS/MKL_NUM_THREADS (default: each framework's own)",
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="median of this many measurements (3; quick 1)"
    )
    p.add_argument(
        "--min-diff-seconds",
        type=float,
        default=None,
        help="make the long run at least this long in iterations (M of N + M, by the N "
        "run's estimate; default 1; quick 0.3)",
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per subprocess")
    p.add_argument(
        "--matmul-precision",
        default="float32",
        help="timerlc's --matmul-precision (the cuda backends; tensorfloat32: as the jax "
        "baseline's products on a recent NVIDIA GPU); float32,tensorfloat32 runs both, the "
        "second as the system timerlc-tf32, against the same baselines' runs",
    )
    p.add_argument("--json", dest="json_path", default=None, help="save raw results to this file")
    return p.parse_args(argv)


# a device run's last line: "... device peak 1.0 MiB (1094372 bytes) ..."
DEVICE_PEAK = re.compile(r"device peak [^(]*\((\d+) bytes\)")


def child_env(threads: int | None, device: str = "cpu") -> dict:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = device  # (jax on the GPU only where asked, and then for sure)
    if threads:
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = str(threads)
        if threads == 1:  # XLA has no flag for a number of threads other than one
            xla = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla).strip()
    return env


def blas_kernels() -> str:
    """Which OpenBLAS kernels timerlc's products ran on (numpy's OpenBLAS, in this process's
    environment, which the children inherit). ``OPENBLAS_CORETYPE`` (which some machines set
    to an older kind than their CPU's) changes them; XLA and torch do not use OpenBLAS."""
    from timerlc.runtime.native import blas_core

    forced = os.environ.get("OPENBLAS_CORETYPE")
    return f"OpenBLAS kernels: {blas_core() or 'unknown'}" + (
        f" (OPENBLAS_CORETYPE={forced})" if forced else ""
    )


def run_child(cmd: list[str], timeout: float, env: dict) -> dict:
    """Run cmd in the repository root; its wall time, peak RSS, exit status and output."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, env=env)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {
            "rc": proc.returncode,
            "wall_s": wall,
            "peak_rss_mb": usage.ru_maxrss / 1024,  # Linux: kilobytes
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def finish(child: dict, iters: int) -> dict:
    """The common part of one run's record; ok False with the error when the child failed."""
    res = {"iters": iters, "ok": child["rc"] == 0, "wall_s": child["wall_s"]}
    res["peak_rss_mb"] = child["peak_rss_mb"]
    if not res["ok"]:
        res["error"] = last_line(child["stderr"]) or f"exit status {child['rc']}"
    return res


def run_baseline(impl: str, algo: str, B: int, T: int, iters: int, args) -> dict:
    cmd = [sys.executable, str(BASELINES / f"{SCRIPT[impl]}_{algo}.py")]
    cmd += ["--iters", str(iters), "--envs", str(B), "--steps", str(T), "--seed", str(args.seed)]
    cmd += EXTRA_ARGS.get(impl, [])
    if args.threads and impl == "torch":
        cmd += ["--threads", str(args.threads)]
    if impl == "torch":
        cmd += ["--device", args.device]
    child = run_child(cmd, args.timeout, child_env(args.threads, args.device))
    res = finish(child, iters)
    if not res["ok"]:
        return res
    try:
        report = json.loads(last_line(child["stdout"]))
    except ValueError:
        return {**res, "ok": False, "error": "no JSON line on stdout"}
    res.update(
        in_run_seconds_per_iter=report["seconds_per_iter"],
        # the window over the iterations: jax's compiled run, torch's training loop
        timed_s=report["run_seconds"] if SCRIPT[impl] == "jax" else report["total_seconds"],
        final_ep_ret=report.get("final_ep_ret"),
        compile_seconds=report.get("compile_seconds"),
        peak_device_mb=report.get("peak_device_mb"),
    )
    return res


class IterationClock(threading.Thread):
    """Tails a metrics .jsonl file while a run writes it (rows are flushed one by one) and
    notes when the first row of each iteration ``i`` appears: an iteration's metrics are
    written when it ends, so the gaps between those times are iteration times, free of
    start-up and compile. It reads only when the file grew (a stat every 5 ms): the machine
    may have two cores, and the run being timed needs them."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path, self.seen, self.done = path, {}, threading.Event()

    def run(self):
        pos, pending = 0, ""
        while True:
            finished = self.done.is_set()
            chunk = ""
            try:
                if os.stat(self.path).st_size > pos:
                    with open(self.path) as fh:
                        fh.seek(pos)
                        chunk = fh.read()
                        pos = fh.tell()
            except OSError:
                pass
            now = time.perf_counter()
            pending += chunk
            *lines, pending = pending.split("\n")
            for line in lines:
                try:
                    i = json.loads(line).get("i")
                except ValueError:
                    continue
                if i is not None and i not in self.seen:
                    self.seen[i] = now
            if finished:
                return
            time.sleep(0.005)

    def window(self):
        """Seconds from the first iteration's end to the last's (iterations 2..I), or None."""
        if len(self.seen) < 2:
            return None
        order = sorted(self.seen)
        return self.seen[order[-1]] - self.seen[order[0]]

    def seconds_per_iter(self):
        """Mean time of iterations 2..I (the first one includes warm-up), or None."""
        window = self.window()
        return None if window is None else window / (len(self.seen) - 1)


def final_metric(path: Path, name: str):
    """The value of metric NAME at the last point written to a timerlc metrics .jsonl."""
    try:
        with open(path) as fh:
            rows = [r for r in map(json.loads, filter(str.strip, fh)) if r.get("name") == name]
    except (OSError, ValueError):
        return None
    return float(rows[-1]["value"]) if rows else None


PRECISIONS = ("float32", "tensorfloat32")


def precisions(text: str) -> list[str]:
    """``--matmul-precision``'s list: one or both of ``PRECISIONS``, each once."""
    got = [x.strip() for x in text.split(",") if x.strip()]
    if not got or len(set(got)) != len(got) or any(x not in PRECISIONS for x in got):
        raise SystemExit(
            f"--matmul-precision: '{text}' is not one or both of {', '.join(PRECISIONS)}"
        )
    return got


def timerlc_systems(args) -> dict[str, str]:
    """timerlc's systems and their precisions: ``timerlc`` the first of
    ``--matmul-precision``'s, ``timerlc-tf32`` TF32 where it comes second."""
    got = precisions(args.matmul_precision)
    return {"timerlc": got[0], **({"timerlc-tf32": got[1]} if len(got) > 1 else {})}


def run_timerlc(algo: str, B: int, T: int, iters: int, args, precision: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [sys.executable, "-m", "timerlc.cli", "run", f"programs/{algo}.rtl"]
        cmd += ["--backend", args.backend]
        sets = [f"B={B}", f"T={T}", f"seed={args.seed}"]
        sets.append(f"I={iters}" if algo == "reinforce" else f"total_steps={iters * B * T}")
        for s in sets:
            cmd += ["--set", s]
        cmd += ["--no-progress", "--metrics", str(metrics)]
        if precision != "float32":
            cmd += ["--matmul-precision", precision]
        device = args.backend in ("cuda", "cuda-emu")
        clock = IterationClock(metrics)
        clock.start()
        child = run_child(cmd, args.timeout, child_env(args.threads))
        clock.done.set()
        clock.join()
        res = finish(child, iters)
        if res["ok"]:
            res.update(
                in_run_seconds_per_iter=clock.seconds_per_iter(),
                # iterations 2..n: the long and N windows still differ by M iterations
                timed_s=clock.window(),
                final_ep_ret=final_metric(metrics, "ep_ret"),
            )
            peak = DEVICE_PEAK.search(child["stderr"]) if device else None
            res["peak_device_mb"] = int(peak.group(1)) / 2**20 if peak else None
        return res


def run_system(system: str, algo: str, B: int, T: int, iters: int, args) -> dict:
    ours = timerlc_systems(args)
    if system in ours:
        return run_timerlc(algo, B, T, iters, args, ours[system])
    return run_baseline(system, algo, B, T, iters, args)


def long_n(run: dict, n: int, min_seconds: float) -> int:
    """The long run's iterations: 2N, or more where the N run's in-run estimate says that N
    more iterations would take less than ``min_seconds`` (then N + min_seconds / estimate:
    the difference of the two runs spans at least ``min_seconds``)."""
    est = run.get("in_run_seconds_per_iter") if run["ok"] else None
    if est is None or est * n >= min_seconds:
        return 2 * n
    # (at most 50 N more: an estimate near 0, a run of iterations the clock barely saw,
    # asked for tens of thousands; an estimate of 0, N iterations within one of the clock's
    # polls of the metrics file, 5 ms: REINFORCE 16 x 128's ten took 3 ms, and its long run
    # was 2N, a difference of 10 iterations the clock could not see)
    return n + (50 * n if est <= 0 else min(math.ceil(min_seconds / est), 50 * n))


def said(system: str, iters: int, run: dict) -> str:
    """One line on a run as it ends (the log keeps each run even where the bench is stopped
    before its tables): its window, its in-run estimate, or why it failed."""
    if not run["ok"]:
        return f"#   {system} N={iters}: failed"
    est = run.get("in_run_seconds_per_iter")
    return (
        f"#   {system} N={iters}: window {fmt(run.get('timed_s'), '.3f')} s, wall "
        f"{run['wall_s']:.1f} s, in-run {fmt(est and est * 1e3, '.2f')} ms/iter"
    )


def measure(algo: str, B: int, T: int, systems: list[str], missing: dict, args, saved=None):
    """Every system at one point: runs of N and of N + M iterations (M = N, or more where
    N's in-run estimate says M iterations would take less than --min-diff-seconds),
    alternating systems. Each system's figure is noted as soon as it has one, and
    ``saved(runs, n_long)`` is called after every run (the partial JSON)."""
    n = args.n
    n_long = {s: 2 * n for s in systems}
    runs = {s: [] for s in systems}  # (short, long) pairs
    live = [s for s in systems if s not in missing]
    for rep in range(args.repeats):
        short = {}
        for s in live:
            short[s] = run_system(s, algo, B, T, n, args)
            note(said(s, n, short[s]))
            if saved:
                saved({**runs, s: runs[s] + [[short[s]]]}, n_long)
        if rep == 0:  # a longer long run where the N run was too short to difference
            for s in live:
                n_long[s] = long_n(short[s], n, args.min_diff_seconds)
        for s in live:
            if not short[s]["ok"]:  # it failed: the long run would too
                runs[s].append((short[s], short[s]))
                continue
            long = run_system(s, algo, B, T, n_long[s], args)
            note(said(s, n_long[s], long))
            runs[s].append((short[s], long))
            got = summarize(runs[s], n, n_long[s], None)
            if got["ok"]:
                note(
                    f"#   {s}: {fmt(got['seconds_per_iter'] and got['seconds_per_iter'] * 1e3, '.3f')}"
                    f" ms/iter so far ((N={n_long[s]}) - (N={n})), wall "
                    f"{got['wall_seconds_per_iter'] * 1e3:.3f}"
                )
            if saved:
                saved(runs, n_long)
    return {s: summarize(runs[s], n, n_long[s], missing.get(s)) for s in systems}


def summarize(pairs: list[tuple[dict, dict]], n: int, n_long: int, missing: str | None) -> dict:
    """A system's figures at one point from its (N run, long run) pairs: s/iter = the
    difference of the two runs' windows over the difference of their iterations."""
    if missing:
        return {"ok": False, "missing": True, "error": missing}
    errors = [r["error"] for pair in pairs for r in pair if not r["ok"]]
    res = {"n": n, "n_long": n_long, "runs": [list(pair) for pair in pairs]}
    res["peak_rss_mb"] = max(r["peak_rss_mb"] for pair in pairs for r in pair)
    device = [r.get("peak_device_mb") for pair in pairs for r in pair]
    res["peak_device_mb"] = max((d for d in device if d is not None), default=None)
    if errors:
        return {**res, "ok": False, "error": errors[0]}
    more = n_long - n
    wall_diffs = [(long["wall_s"] - short["wall_s"]) / more for short, long in pairs]
    diffs = [
        (long["timed_s"] - short["timed_s"]) / more
        for short, long in pairs
        if long.get("timed_s") is not None and short.get("timed_s") is not None
    ]
    longest = pairs[-1][1]
    return {
        **res,
        "ok": True,
        "seconds_per_iter": statistics.median(diffs) if diffs else None,
        "diffs": diffs,
        "wall_seconds_per_iter": statistics.median(wall_diffs),
        "wall_diffs": wall_diffs,
        "compile_seconds": longest.get("compile_seconds"),
        "final_ep_ret": longest.get("final_ep_ret"),
    }


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or b is None or b <= 0 or a <= 0 else a / b


def cell(res: dict, key: str, spec: str) -> str:
    if res.get("missing"):
        return "not installed"
    return fmt(res.get(key) if res["ok"] else None, spec)


def value(res: dict, key: str):
    return res.get(key) if res["ok"] else None


def spread(res: dict) -> str:
    """The smallest and largest of a system's per-repeat s/iter."""
    diffs = res.get("diffs") if res.get("ok") else None
    if not diffs:
        return "n/a"
    return f"{min(diffs):.4f}-{max(diffs):.4f}"


def paired(tl: dict, other: dict) -> str:
    """timerlc's s/iter over the other's, repeat by repeat (repeat k of both ran minutes
    apart at most, so a slow phase of the machine hits both): median (smallest-largest)."""
    a = tl.get("diffs") if tl.get("ok") else None
    b = other.get("diffs") if other.get("ok") else None
    if not a or not b:
        return "n/a"
    qs = [x / y for x, y in zip(a, b) if x > 0 and y > 0]
    if not qs:
        return "n/a"
    return f"{statistics.median(qs):.2f} ({min(qs):.2f}-{max(qs):.2f})"


def markdown(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def tables(results: list[dict], baselines: list[str], ours=("timerlc",)) -> tuple[str, str]:
    """The main table and the check table; ``ours``: timerlc's systems (``timerlc_systems``),
    each one's ratios to each baseline."""
    systems = list(ours) + baselines
    pairs = [(o, b) for o in ours for b in baselines]
    head = ["algo", "B x T"] + [f"{s} s/iter" for s in systems]
    head += [f"{o}/{b}" for o, b in pairs]
    head += [f"{s} peak MB" for s in systems] + [f"MB {o}/{b}" for o, b in pairs]
    # device memory, where a system ran on one (torch's and XLA's allocators' peaks;
    # timerlc's device runtime's, arena and scratch included)
    gpu = any(value(r["systems"][s], "peak_device_mb") for r in results for s in systems)
    head += [f"{s} GPU MB" for s in systems] + [f"GPU {o}/{b}" for o, b in pairs] if gpu else []
    check_head = ["algo", "B x T"] + [f"{s} N + M" for s in systems]
    check_head += [f"{s} wall s/iter" for s in systems]
    check_head += [f"{s} s/iter range" for s in systems]
    check_head += [f"{o}/{b} per repeat" for o, b in pairs]
    check_head += ["jax compile s"] if "jax" in baselines else []
    check_head += [f"{s} ep_ret" for s in systems]
    rows, check_rows = [], []
    for r in results:
        sy = r["systems"]
        row = [r["algo"], f"{r['B']}x{r['T']}"]
        row += [cell(sy[s], "seconds_per_iter", ".4f") for s in systems]
        for o, b in pairs:
            q = ratio(value(sy[o], "seconds_per_iter"), value(sy[b], "seconds_per_iter"))
            row.append(fmt(q, ".2f"))
        row += [cell(sy[s], "peak_rss_mb", ".0f") for s in systems]
        for o, b in pairs:
            q = ratio(value(sy[o], "peak_rss_mb"), value(sy[b], "peak_rss_mb"))
            row.append(fmt(q, ".2f"))
        if gpu:
            row += [cell(sy[s], "peak_device_mb", ".1f") for s in systems]
            for o, b in pairs:
                q = ratio(value(sy[o], "peak_device_mb"), value(sy[b], "peak_device_mb"))
                row.append(fmt(q, ".2f"))
        rows.append(row)

        check = [r["algo"], f"{r['B']}x{r['T']}"]
        check += [cell(sy[s], "n_long", "d") for s in systems]
        check += [cell(sy[s], "wall_seconds_per_iter", ".4f") for s in systems]
        check += [spread(sy[s]) for s in systems]
        check += [paired(sy[o], sy[b]) for o, b in pairs]
        check += [cell(sy["jax"], "compile_seconds", ".1f")] if "jax" in baselines else []
        check += [cell(sy[s], "final_ep_ret", ".1f") for s in systems]
        check_rows.append(check)
    return markdown(head, rows), markdown(check_head, check_rows)


def parse_configs(text: str) -> list[tuple[int, int]]:
    points = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        try:
            b, t = item.lower().split("x")
            points.append((int(b), int(t)))
        except ValueError:
            raise SystemExit(f"--configs: '{item}' is not BxT (e.g. 16x128)") from None
    return points


def grid_for(algo: str, args) -> list[tuple[int, int]]:
    if args.configs:
        return parse_configs(args.configs)
    base = (QUICK_GRID if args.quick else DEFAULT_GRID)[algo]
    if args.envs is None and args.steps is None:
        return base
    envs = [int(x) for x in args.envs.split(",")] if args.envs else sorted({b for b, _ in base})
    steps = [int(x) for x in args.steps.split(",")] if args.steps else sorted({t for _, t in base})
    return [(b, t) for b in envs for t in steps]


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    args.n = args.iters if args.iters is not None else (3 if args.quick else 10)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.min_diff_seconds is None:
        args.min_diff_seconds = 0.3 if args.quick else 1.0
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    for a in algos:
        if a not in DEFAULT_GRID:
            raise SystemExit(f"unknown algo '{a}' (known: {', '.join(DEFAULT_GRID)})")
    baselines = [b.strip() for b in args.baselines.split(",") if b.strip() not in ("", "none")]
    for b in baselines:
        if b not in KNOWN_BASELINES:
            raise SystemExit(f"unknown baseline '{b}' (known: {', '.join(KNOWN_BASELINES)})")
    missing = {
        b: f"{KNOWN_BASELINES[b]} is not installed (pip install -e .[bench] for jax)"
        for b in baselines
        if importlib.util.find_spec(KNOWN_BASELINES[b]) is None
    }
    ours = list(timerlc_systems(args))
    systems = ours + baselines

    results = []

    def save(extra: dict | None = None):
        if args.json_path:
            body = {"backend": args.backend, "iters": args.n, "args": vars(args)}
            body["results"] = results
            if extra is not None:  # (a point under way: its runs so far)
                body["partial"] = extra
            Path(args.json_path).write_text(json.dumps(body, indent=2) + "\n")

    for algo in algos:
        for B, T in grid_for(algo, args):
            note(f"# {algo} B={B} T={T} N={args.n} ...")

            def saved(runs, n_long, algo=algo, B=B, T=T):
                save({"algo": algo, "B": B, "T": T, "n_long": n_long, "runs": runs})

            sy = measure(algo, B, T, systems, missing, args, saved)
            for s in systems:
                if not sy[s]["ok"] and not sy[s].get("missing"):
                    note(f"#   {s} failed: {sy[s]['error']}")
            results.append({"algo": algo, "B": B, "T": T, "systems": sy})
            save()

    print(
        f"\ntimerlc backend: {args.backend} (float32 products: "
        f"{', '.join(f'{k} {v}' for k, v in timerlc_systems(args).items())}); "
        f"baselines on: {args.device}; N = {args.n}, M = N or more "
        f"(at least {args.min_diff_seconds:g} s); repeats: {args.repeats}; "
        f"seed: {args.seed}; "
        f"threads: {args.threads or 'default'}"
        f"{'; ' + blas_kernels() if args.backend == 'cpu' else ''}\n"
    )
    main_table, check_table = tables(results, baselines, ours)
    print(main_table)
    print(
        "\ns/iter = (time(N + M) - time(N)) / M, time(n) = each run's own window over its "
        "iterations (torch: its training loop; jax: the compiled\n"
        "  run; timerlc: first to last iteration's metrics row), median over repeats; "
        "start-up, compile and warm-up cancel out.\n"
        "  peak MB = the largest ru_maxrss of the system's subprocesses; timerlc/X = "
        "timerlc's figure / X's (< 1: timerlc faster or smaller).\n"
    )
    print(check_table)
    print(
        "\nN + M: each system's long run (M = N, or more until M iterations take "
        "--min-diff-seconds). wall s/iter = (wall(N + M) - wall(N)) / M of whole subprocesses:\n"
        "  compile-time noise lands in it, a cross-check only. s/iter range: the repeats' "
        "smallest and largest. timerlc/X per repeat:\n"
        "  repeat k of each system against repeat k of the other (they run minutes apart at "
        "most, so a slow phase of a shared\n"
        "  machine hits both), median (smallest-largest). ep_ret: the last iteration's "
        "(different random streams: a sanity check only)."
    )
    for s in systems:
        for err in sorted(
            {r["systems"][s]["error"] for r in results if not r["systems"][s]["ok"]}
        ):
            print(f"  {s} n/a: {err}")
    if args.json_path:
        save()
        print(f"\nraw results saved to {args.json_path}")
    return results


if __name__ == "__main__":
    main()
