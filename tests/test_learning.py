"""Learning: the RL programs learn CartPole from the command line, on the cpu backend.

The budget: run with its default configuration (seed 0), a program must reach a mean
episodic return of at least 475 (CartPole-v1's "solved", out of 500) averaged over 10
consecutive iterations within its first 150 iterations. `ep_ret[i]` is the mean return
of the episodes that ended in iteration i (0 when none did, which counts against it).

The test watches the metrics the run streams (`--metrics m.jsonl`, one row per point,
flushed as computed) and stops the run once it is solved, so a passing test costs only
the iterations it needed. Which iteration that is depends on every rounding of the run
(training is chaotic): on the NumPy interpreter REINFORCE (16 envs x 500 steps per
iteration) was solved at iteration 47 and PPO (16 envs x 128 steps, 16 minibatch steps
per iteration) at 51; with generated code (sums in f64, the C library's exp and tanh, the
BLAS's matmuls) PPO reaches 474.9 by iteration 100 and is solved at 105, and holds 500
from about 150 on. Each takes under half a minute.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from rtl_helpers import timerlc_cmd

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
SOLVED, WINDOW, BUDGET = 475.0, 10, 150


def best_mean(values: list[float], window: int = WINDOW) -> float:
    if len(values) < window:
        return float("-inf")
    return max(sum(values[k - window : k]) / window for k in range(window, len(values) + 1))


def train_until_solved(tmp_path, program: str, budget: int = BUDGET) -> list[float]:
    """Run the program with its defaults until it is solved or has run ``budget``
    iterations; the ep_ret of each iteration it ran."""
    metrics = tmp_path / "m.jsonl"
    err = (tmp_path / "stderr.txt").open("w")
    cmd = timerlc_cmd() + ["run", str(PROGRAMS / program), "--backend", "cpu"]
    proc = subprocess.Popen(cmd + ["--metrics", str(metrics), "--no-progress"], stderr=err)
    returns: list[float] = []
    pos = 0
    try:
        while True:
            done = proc.poll() is not None
            if metrics.exists():
                with metrics.open() as fh:
                    fh.seek(pos)
                    lines = fh.readlines()
                complete = [ln for ln in lines if ln.endswith("\n")]
                pos += sum(len(ln.encode()) for ln in complete)
                for ln in complete:
                    row = json.loads(ln)
                    if row["name"] == "ep_ret":
                        returns.append(row["value"])
            if best_mean(returns) >= SOLVED or len(returns) >= budget or done:
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        err.close()
    if done and proc.returncode != 0:
        raise AssertionError((tmp_path / "stderr.txt").read_text())
    return returns[:budget]


def test_best_mean_is_over_consecutive_iterations():
    assert best_mean([0.0] * 9 + [500.0] * 10) == 500.0
    assert best_mean([500.0, 0.0] * 10) == 250.0
    assert best_mean([500.0] * 9) == float("-inf")


def test_reinforce_solves_cartpole(tmp_path):
    returns = train_until_solved(tmp_path, "reinforce.rtl")
    assert best_mean(returns) >= SOLVED, [round(x) for x in returns]


def test_ppo_solves_cartpole(tmp_path):
    returns = train_until_solved(tmp_path, "ppo.rtl")
    assert best_mean(returns) >= SOLVED, [round(x) for x in returns]
