"""Learning: the RL programs learn CartPole from the command line, on the cpu backend.

The budget: with its default configuration (seed 0), a program must reach a mean episodic
return of at least 475 (CartPole-v1's "solved", out of 500) averaged over 10 consecutive
iterations, within the iterations given below. `ep_ret[i]` is the mean return of the
episodes that ended in iteration i (0 when none did, which counts against the mean).

Measured on this repository's 2-core CI machine: REINFORCE (16 envs x 500 steps per
iteration) first reaches it at iteration 47; the test allows 100 iterations (about a
minute). These runs are slow by design (they are the proof that training works end to
end); they are the only tests that train to convergence.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
SOLVED, WINDOW = 475.0, 10


def _timerlc() -> list[str]:
    script = Path(sys.executable).with_name("timerlc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "timerlc.cli"]


def train(tmp_path, program: str, *sets: str) -> list[float]:
    metrics = tmp_path / "m.csv"
    args = [str(PROGRAMS / program), "--backend", "cpu", "--metrics", str(metrics)]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(
        _timerlc() + ["run", *args, "--no-progress"], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(metrics.open()))
    return [float(row["value"]) for row in rows if row["name"] == "ep_ret"]


def best_mean(values: list[float], window: int = WINDOW) -> float:
    return max(sum(values[k - window : k]) / window for k in range(window, len(values) + 1))


def test_best_mean_is_over_consecutive_iterations():
    assert best_mean([0.0] * 9 + [500.0] * 10) == 500.0
    assert best_mean([500.0, 0.0] * 10) == 250.0


def test_reinforce_learns_cartpole(tmp_path):
    returns = train(tmp_path, "reinforce.rtl", "I=100")
    assert len(returns) == 100
    assert best_mean(returns) >= SOLVED, [round(x) for x in returns]
