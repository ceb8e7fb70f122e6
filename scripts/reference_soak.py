"""The cpu backend against the reference interpreter at configs drawn at random (a long
check, never a test).

The tests run each program against the reference at one or two small sizes
(tests/test_cpu_backend.py). This draws each program's configs from small ranges (sizes of
1 and 2 among them, odd ones, the bool configs' both values), the RL programs' environment
(cartpole in NumPy, written in RTL or gymnasium's own, with episodes of 3 to 5 steps, so
that rollouts reset mid-way: ``ENVS``) and now and then a memory budget, runs the program
as written on the reference (``--backend reference``: the semantic oracle) and the
optimized plan on the cpu backend (its kernels compiled), and prints for each draw the
largest relative difference of the metrics (each against the reference's value, or 1e-2
where that is smaller: a metric that cancels to near zero, as cumsum's ``gap``, differs by
the order of its sums alone) and of the outputs (each array's against its largest value).
``cuda_soak.py`` checks the cuda backend against the cpu's: a bug of a pass, the schedule
or the memory plan, which both backends share, shows only here::

    .venv/bin/python scripts/reference_soak.py --seconds 1800 --seed 3

With ``--small-tiles`` every gather that only products read is computed in each of them,
a few floats a tile (``cuda_soak.small_tiles``): PPO's minibatch products take the path
image-sized observations take.

With ``--threads`` every parallel loop of a kernel goes to the pool of threads in chunks of
a few iterations, and every product of 64 multiply-adds or more is cut (``llvm.render``'s
``PAR_WORK``/``PAR_CHUNK``, ``runtime.pool``'s ``GEMM_SPLIT_MACS``), on three threads
whatever the machine's CPUs (docs/codegen.md, "Threads").

With ``--check-windows`` the plan is interpreted in the runtime's checking mode instead:
a read of a ring buffer (a window, an inner window) that finds another point than the one
it asks for fails the draw, where a wrong value might otherwise round away.

A line starts ``ok``, ``DIFF`` (past ``--tolerance``: exit status 1), ``FAIL`` (an
exception of the compile or of either run that is not a program error: exit status 1) or
``PROG`` (a program error at that config, as the CLI would print it: PPO over one
iteration, whose ``run[i, b, 0]`` for i >= 1 then defines no point, is one).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (program -> configs to draw from: small, as the reference interprets every point)
RANDOM = {
    "ppo": {
        "B": [1, 2, 3, 5],
        "T": [2, 3, 5, 8],
        "MB": [1, 2],
        "H": [4, 8, 33],
        "EPOCHS": [1, 2],
        "norm_adv": ["true", "false"],
        "clip_vloss": ["true", "false"],
        "anneal_lr": ["true", "false"],
    },
    "reinforce": {
        "I": [1, 2, 3],
        "B": [1, 2, 5],
        "T": [1, 2, 7, 20],
        "H": [3, 8, 33],
        "baseline": ["true", "false"],
    },
    "reinforce_td": {"I": [2, 3], "B": [1, 2, 5], "T": [2, 3, 9], "N": [1, 2, 3], "H": [3, 8]},
    "rnn_reinforce": {
        "I": [2],
        "B": [1, 2, 4],
        "T": [2, 3, 9],
        "H": [2, 4, 8],
        "baseline": ["true", "false"],
        "partial": ["true", "false"],
    },
    "attention": {"B": [1, 2, 7], "S": [1, 2, 6, 9], "E": [1, 8, 13], "A": [1, 2, 5]},
    "cumsum": {"T": [1, 2, 8, 33], "I": [1, 2, 7]},
    "rnn": {"B": [1, 2, 5], "T": [1, 2, 12], "D": [1, 3], "H": [1, 8, 13], "O": [1, 2]},
    "window_mean": {"B": [1, 3], "T": [1, 2, 9, 30], "W": [1, 2, 3, 9]},
    "returns": {
        "I": [1, 3],
        "B": [1, 4],
        "T": [1, 2, 5, 17],
        "N": [1, 2, 3],
        "period": [1, 2, 7],
    },
    "swaps": {},
}
BUDGETS = [None, None, None, 0.3, 0.6]  # (a memory budget, as a fraction of the plan's peak)
# (the RL programs' environment E: the built-in in NumPy or written in RTL, compiled with
# the program, and short episodes, so that the rollouts reset mid-way)
ENVS = [
    "cartpole",
    "rtl:cartpole",
    "cartpole?max_episode_steps=3",
    "rtl:cartpole?max_episode_steps=3",
    "cartpole?max_episode_steps=5&sutton_barto_reward=true",
    "gym:CartPole-v1",  # (gymnasium's own, a plugin on the host)
    "gym:CartPole-v1?max_episode_steps=4",
]


def drawn(rng) -> tuple[str, dict, float | None]:
    """A program, its configs and a budget (or None)."""
    while True:
        program = rng.choice(sorted(RANDOM))
        sets = {k: rng.choice(v) for k, v in RANDOM[program].items()}
        if program == "ppo":
            if sets["B"] * sets["T"] % sets["MB"]:
                continue
            sets["total_steps"] = rng.choice([1, 2, 3]) * sets["B"] * sets["T"]
        if program in ("ppo", "reinforce", "reinforce_td", "rnn_reinforce"):
            sets["env:E"] = rng.choice(ENVS)  # (an environment, not a config)
        return program, sets, rng.choice(BUDGETS)


def run(program: str, sets: dict, budget: float | None, check_windows: bool = False) -> float:
    """The largest relative difference between the reference and the cpu backend
    (``check_windows``: its statements interpreted, every read of a ring buffer checked to
    find the point it asks for, ``CpuRuntime(check_windows=True)``)."""
    from timerlc.compiler import compile_plan, generate_code, run_passes
    from timerlc.diagnostics import Source
    from timerlc.frontend.check import check_source
    from timerlc.reference.interpreter import run_graph
    from timerlc.runtime.cpu import CpuRuntime

    path = ROOT / "programs" / f"{program}.rtl"
    if not path.exists():  # (swaps: a test's program)
        path = ROOT / "tests" / "programs" / f"{program}.rtl"
    source = Source(str(path), path.read_text())
    sets = {k: str(v) for k, v in sets.items()}
    envs = {"E": sets.pop("env:E")} if "env:E" in sets else None

    def sink(into):
        return lambda n, p, v: into.append((n, tuple(sorted(p.items())), float(v)))

    want: list = []
    written = check_source(source, overrides=sets, envs=envs)
    ref = run_graph(run_passes(written, None, False), sink(want))
    graph = run_passes(check_source(source, overrides=sets, envs=envs))
    plan = compile_plan(graph)
    if budget is not None:
        plan = compile_plan(graph, memory_budget=int(budget * plan.memory_peak))
    gen = generate_code(plan, target="cpu")
    got: list = []
    if check_windows:
        rt = CpuRuntime(gen.plan, sink(got), check_windows=True)
    else:
        rt = CpuRuntime(gen.plan, sink(got), native=gen.text)
    try:
        rt.run()
    finally:
        rt.envs.close()
    if [m[:2] for m in sorted(want)] != [m[:2] for m in sorted(got)]:
        return float("inf")
    worst = 0.0
    for (_, _, a), (_, _, b) in zip(sorted(want), sorted(got)):
        if not (np.isnan(a) and np.isnan(b)):
            worst = max(worst, abs(a - b) / max(1e-2, abs(a)))
    for name in graph.outputs:
        x = np.asarray(ref.value(name), np.float64)
        y = np.asarray(rt.value(name), np.float64)
        if x.shape != y.shape:
            return float("inf")
        if x.size:
            same = (np.isnan(x) & np.isnan(y)) | (x == y)
            scale = np.max(np.abs(np.where(np.isfinite(x), x, 0.0)), initial=1e-6)
            worst = max(worst, float(np.max(np.where(same, 0.0, np.abs(x - y)))) / scale)
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0, help="draw for this long")
    ap.add_argument("--seed", type=int, default=0, help="the draws' seed")
    ap.add_argument("--tolerance", type=float, default=1e-3, help="the largest difference let by")
    ap.add_argument(
        "--check-windows",
        action="store_true",
        help="interpret the plan, checking that every read of a ring buffer finds its point "
        "(a window too small fails the draw), instead of running its kernels",
    )
    from cuda_soak import add_small_tiles, small_chunks, small_tiles, soaked

    add_small_tiles(ap)
    ap.add_argument(
        "--threads",
        action="store_true",
        help="hand every parallel loop to the threads in chunks of a few iterations, and cut "
        "every product but the smallest, on three threads (llvm.render.PAR_WORK, "
        "runtime.pool)",
    )
    args = ap.parse_args()
    if args.small_tiles:
        small_tiles()
    if args.threads:
        small_chunks()

    from timerlc.diagnostics import ProgramError

    rng, until = random.Random(args.seed), time.perf_counter() + args.seconds

    def drawing():
        while time.perf_counter() < until:
            program, sets, budget = drawn(rng)
            text = " ".join(f"{k}={v}" for k, v in sets.items())
            text += f" budget={budget}" if budget is not None else ""
            yield program, text, (sets, budget)

    def one(program: str, what: tuple) -> tuple[float, str]:
        return run(program, *what, args.check_windows), ""

    return 1 if soaked(drawing(), one, args.tolerance, ProgramError) else 0


if __name__ == "__main__":
    sys.exit(main())
