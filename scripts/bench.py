"""Benchmark: timerlc against plain eager PyTorch on CartPole (REINFORCE and PPO).

This is a benchmark, not a test: it never fails on slow or missing results.

What runs. For each algorithm (reinforce, ppo) and each point (B envs, T rollout steps) of
a grid, two implementations of the same algorithm, each in its own subprocess (so that
peak memory is per run), one after the other:

  * torch:   scripts/baselines/torch_<algo>.py --iters I --envs B --steps T --seed S, an
             eager PyTorch (CPU, float32) transcription of programs/<algo>.rtl on the same
             NumPy CartPole (timerlc.envs);
  * timerlc: python -m timerlc.cli run programs/<algo>.rtl --backend BACKEND --set ...
             --no-progress --metrics TMP.csv, with I iterations (reinforce: --set I=I;
             ppo: --set total_steps=I*B*T, from which ppo.rtl derives I).

What is measured.
  * torch s/iter: the baseline's own timer, the mean wall time of iterations 2..I (the
    first iteration is warm-up and excluded; interpreter start-up and imports excluded).
  * timerlc s/iter: the mean time of iterations 2..I, measured from outside: the run
    streams its metrics to a .jsonl file row by row, and each iteration's rows appear when
    it ends; a thread tails the file. Start-up, imports, compile and the first iteration
    are excluded, as they are from the torch figure.
  * wall s/iter (both): the whole subprocess's wall time divided by I, start-up, imports
    and (timerlc) compile included.
  * peak MB: the peak resident set size (ru_maxrss) of each subprocess, read from
    os.wait4's resource usage of that child (the baseline also reports its own, the same).
  * speed-up = torch s/iter / timerlc s/iter; memory ratio = timerlc peak / torch peak
    (< 1 means timerlc used less).
  * ep_ret: the last iteration's ep_ret metric of each run (a sanity check only: the two
    use different random streams).

A timerlc run that fails (e.g. a backend this version does not have) shows "n/a" and the
last line of its stderr; the benchmark goes on.

  python scripts/bench.py                   # default grid, 5 iterations
  python scripts/bench.py --quick           # tiny grid, 3 iterations
  python scripts/bench.py --backend reference --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / "scripts" / "baselines"

DEFAULT_GRID = {
    "reinforce": [(b, t) for b in (4, 16, 64) for t in (128, 512)],
    "ppo": [(b, t) for b in (4, 16) for t in (128,)],
}
QUICK_GRID = {
    "reinforce": [(4, 32), (8, 64)],
    "ppo": [(4, 64)],
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Compare timerlc with eager PyTorch baselines on CartPole."
    )
    p.add_argument("--iters", type=int, default=None, help="iterations per run (default 5)")
    p.add_argument("--quick", action="store_true", help="a tiny grid (and 3 iterations)")
    p.add_argument("--backend", default="cpu", help="timerlc backend (default cpu)")
    p.add_argument(
        "--algos", default="reinforce,ppo", help="comma-separated subset of reinforce,ppo"
    )
    p.add_argument("--envs", default=None, help="comma-separated B values (overrides the grid)")
    p.add_argument("--steps", default=None, help="comma-separated T values (overrides the grid)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads for the baselines")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per subprocess")
    p.add_argument("--json", dest="json_path", default=None, help="save raw results to this file")
    return p.parse_args(argv)


def run_child(cmd: list[str], timeout: float) -> dict:
    """Run cmd in the repository root; its wall time, peak RSS, exit status and output."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err)
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
            "cmd": cmd,
            "rc": proc.returncode,
            "wall_s": wall,
            "peak_rss_mb": usage.ru_maxrss / 1024,  # Linux: kilobytes
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def run_torch(algo: str, B: int, T: int, iters: int, args) -> dict:
    cmd = [sys.executable, str(BASELINES / f"torch_{algo}.py")]
    cmd += ["--iters", str(iters), "--envs", str(B), "--steps", str(T), "--seed", str(args.seed)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    child = run_child(cmd, args.timeout)
    res = {"ok": False, "wall_s": child["wall_s"], "peak_rss_mb": child["peak_rss_mb"]}
    if child["rc"] != 0:
        res["error"] = last_line(child["stderr"]) or f"exit status {child['rc']}"
        return res
    try:
        report = json.loads(last_line(child["stdout"]))
    except ValueError:
        res["error"] = "no JSON line on stdout"
        return res
    res.update(
        ok=True,
        seconds_per_iter=report["seconds_per_iter"],
        wall_seconds_per_iter=child["wall_s"] / iters,
        self_reported_peak_rss_mb=report["peak_rss_mb"],
        final_ep_ret=report.get("final_ep_ret"),
        threads=report.get("threads"),
    )
    return res


def final_metric(path: Path, name: str):
    """The value of metric NAME at the last point written to a timerlc metrics .jsonl."""
    try:
        with open(path) as fh:
            rows = [r for r in map(json.loads, filter(str.strip, fh)) if r.get("name") == name]
    except (OSError, ValueError):
        return None
    return float(rows[-1]["value"]) if rows else None


class IterationClock(threading.Thread):
    """Tails a metrics .jsonl file while a run writes it (rows are flushed one by one) and
    notes when the first row of each iteration ``i`` appears: an iteration's metrics are
    written when it ends, so the gaps between those times are iteration times, free of
    start-up and compile."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path, self.seen, self.done = path, {}, threading.Event()

    def run(self):
        pos, pending = 0, ""
        while True:
            finished = self.done.is_set()
            try:
                with open(self.path) as fh:
                    fh.seek(pos)
                    chunk = fh.read()
                    pos = fh.tell()
            except OSError:
                chunk = ""
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
            time.sleep(0.002)

    def seconds_per_iter(self):
        """Mean time of iterations 2..I (the first one includes warm-up), or None."""
        if len(self.seen) < 2:
            return None
        order = sorted(self.seen)
        return (self.seen[order[-1]] - self.seen[order[0]]) / (len(order) - 1)


def run_timerlc(algo: str, B: int, T: int, iters: int, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [sys.executable, "-m", "timerlc.cli", "run", f"programs/{algo}.rtl"]
        cmd += ["--backend", args.backend]
        sets = [f"B={B}", f"T={T}", f"seed={args.seed}"]
        sets.append(f"I={iters}" if algo == "reinforce" else f"total_steps={iters * B * T}")
        for s in sets:
            cmd += ["--set", s]
        cmd += ["--no-progress", "--metrics", str(metrics)]
        clock = IterationClock(metrics)
        clock.start()
        child = run_child(cmd, args.timeout)
        clock.done.set()
        clock.join()
        res = {"ok": False, "wall_s": child["wall_s"], "peak_rss_mb": child["peak_rss_mb"]}
        if child["rc"] != 0:
            res["error"] = last_line(child["stderr"]) or f"exit status {child['rc']}"
            return res
        res.update(
            ok=True,
            seconds_per_iter=clock.seconds_per_iter(),  # iterations 2..I, as torch's timer
            wall_seconds_per_iter=child["wall_s"] / iters,  # with start-up and compile
            final_ep_ret=final_metric(metrics, "ep_ret"),
        )
        return res


def fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def table(results: list[dict]) -> str:
    head = [
        "algo",
        "B",
        "T",
        "torch s/iter",
        "timerlc s/iter",
        "speed-up",
        "torch peak MB",
        "timerlc peak MB",
        "mem ratio",
        "torch wall s/iter",
        "timerlc wall s/iter",
        "torch ep_ret",
        "timerlc ep_ret",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in results:
        tq, tl = r["torch"], r["timerlc"]
        t_s = tq.get("seconds_per_iter") if tq["ok"] else None
        l_s = tl.get("seconds_per_iter") if tl["ok"] else None
        t_m = tq["peak_rss_mb"] if tq["ok"] else None
        l_m = tl["peak_rss_mb"] if tl["ok"] else None
        cells = [
            r["algo"],
            str(r["B"]),
            str(r["T"]),
            fmt(t_s, ".4f"),
            fmt(l_s, ".4f"),
            fmt(ratio(t_s, l_s), ".2f") + ("x" if t_s and l_s else ""),
            fmt(t_m, ".0f"),
            fmt(l_m, ".0f"),
            fmt(ratio(l_m, t_m), ".2f"),
            fmt(tq.get("wall_seconds_per_iter"), ".4f"),
            fmt(tl.get("wall_seconds_per_iter"), ".4f"),
            fmt(tq.get("final_ep_ret"), ".1f"),
            fmt(tl.get("final_ep_ret"), ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def grid_for(algo: str, args) -> list[tuple[int, int]]:
    base = (QUICK_GRID if args.quick else DEFAULT_GRID)[algo]
    if args.envs is None and args.steps is None:
        return base
    envs = [int(x) for x in args.envs.split(",")] if args.envs else sorted({b for b, _ in base})
    steps = [int(x) for x in args.steps.split(",")] if args.steps else sorted({t for _, t in base})
    return [(b, t) for b in envs for t in steps]


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    iters = args.iters if args.iters is not None else (3 if args.quick else 5)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    for a in algos:
        if a not in DEFAULT_GRID:
            raise SystemExit(f"unknown algo '{a}' (known: {', '.join(DEFAULT_GRID)})")

    results = []
    for algo in algos:
        for B, T in grid_for(algo, args):
            print(f"# {algo} B={B} T={T} I={iters} ...", file=sys.stderr, flush=True)
            tq = run_torch(algo, B, T, iters, args)
            if not tq["ok"]:
                print(f"#   torch failed: {tq['error']}", file=sys.stderr, flush=True)
            tl = run_timerlc(algo, B, T, iters, args)
            if not tl["ok"]:
                print(f"#   timerlc failed: {tl['error']}", file=sys.stderr, flush=True)
            results.append(
                {"algo": algo, "B": B, "T": T, "iters": iters, "torch": tq, "timerlc": tl}
            )

    print(f"\ntimerlc backend: {args.backend}; iterations per run: {iters}; seed: {args.seed}\n")
    print(table(results))
    print(
        "\ntimerlc s/iter = mean time of iterations 2..I, from when each iteration's metrics "
        "appear in the streamed metrics file\n"
        "  (no start-up, no compile, no warm-up); torch s/iter = the same iterations from the "
        "baseline's own timer.\n"
        "  wall s/iter = the whole subprocess / iterations (start-up, imports and, for timerlc, "
        "compile included).\n"
        "  speed-up = torch s/iter / timerlc s/iter; mem ratio = timerlc peak / torch peak "
        "(peak RSS of each subprocess)."
    )
    failures = {r["timerlc"]["error"] for r in results if not r["timerlc"]["ok"]}
    for err in sorted(failures):
        print(f"  timerlc n/a: {err}")
    if args.json_path:
        Path(args.json_path).write_text(
            json.dumps({"backend": args.backend, "iters": iters, "results": results}, indent=2)
            + "\n"
        )
        print(f"\nraw results saved to {args.json_path}")
    return results


if __name__ == "__main__":
    main()
