"""The memory plan at image-sized observations (a benchmark of the plan, no run): PPO and
REINFORCE of ``programs/`` on the ``trivial`` environment with observations of
``--obs`` (default 3x256x256), their policy and value nets reading each observation
flattened (``reshape(o, [E.obs_dim])``: the programs as written take a vector). Prints
the plan's peak (``memory.peak``: the most bytes the buffers hold at once, by the
compiler's count) and its largest buffers.

    python scripts/memory_pixels.py
    python scripts/memory_pixels.py --obs 3x64x64 --set B=64 --set T=128
    python scripts/memory_pixels.py --live --top 20   # what the peak holds
    python scripts/memory_pixels.py --scratch         # and the kernels' scratch memory

What a CleanRL-style PyTorch PPO holds at the same sizes, for comparison: its rollout's
observations, ``T * B * obs_dim * 4`` bytes (1.5 GiB at 3x256x256, B=16, T=128), a
minibatch's copy of them, and four copies of the first layers' weights (parameters,
gradients, Adam's two moments: ``obs_dim * 64 * 4`` bytes each per net).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (program, {text as written: flattened}, configs): each replacement must apply once
VARIANTS = {
    "ppo": (
        {
            "logits[i, b, t] = actor(net[i * K], o[i, b, t])": (
                "logits[i, b, t] = actor(net[i * K], reshape(o[i, b, t], [E.obs_dim]))"
            ),
            "v[i, b, t] = critic(net[i * K], o)": (
                "v[i, b, t] = critic(net[i * K], reshape(o, [E.obs_dim]))"
            ),
            "v[i, b, T] = critic(net[i * K], o[i, b, T])": (
                "v[i, b, T] = critic(net[i * K], reshape(o[i, b, T], [E.obs_dim]))"
            ),
        },
        {"B": "16", "T": "128", "total_steps": "6144"},
    ),
    "reinforce": (
        {
            "logits[i, b, t] = policy(net[i], o[i, b, t])": (
                "logits[i, b, t] = policy(net[i], reshape(o[i, b, t], [E.obs_dim]))"
            ),
        },
        {"I": "3", "B": "16", "T": "128"},
    ),
}


def flattened(name: str) -> str:
    text = (ROOT / "programs" / f"{name}.rtl").read_text()
    for old, new in VARIANTS[name][0].items():
        if text.count(old) != 1:
            raise SystemExit(f"programs/{name}.rtl: {old!r} is not there once; update this script")
        text = text.replace(old, new)
    return text


def live_at_peak(plan) -> tuple[int, list[int]]:
    """The top-level item of the tree where the buffers hold the most bytes, and those
    buffers: each from the first top-level item whose calls write or read it to its free
    (an output or a metric: to the end), as ``plan.memory`` counts them (a loop is one item,
    so a buffer its body uses counts for all of it; no swaps, no donations; a buffer in
    another's memory counts as that one)."""
    from timerlc.plan.items import Call, Free, walk

    readers = plan.readers()
    reads: dict[int, set[int]] = {}
    for src, rs in readers.items():
        for sid, _ in rs:
            reads.setdefault(sid, set()).add(src)
    kept = {sid for _, sid, _ in plan.outputs + plan.metrics}
    first: dict[int, int] = {}
    end: dict[int, int] = {}
    for k, item in enumerate(plan.tree):
        if isinstance(item, Free):
            for sid in item.buffers:
                end[sid] = k
            continue
        for c in walk([item]):
            if isinstance(c, Call):
                for sid in {c.statement} | reads.get(c.statement, set()):
                    first.setdefault(plan.storage_of(sid), k)  # (in another's memory: that)
    n = len(plan.tree)
    held = [
        [sid for sid, a in first.items() if a <= k <= (n if sid in kept else end.get(sid, n))]
        for k in range(n)
    ]
    bytes_at = [sum(plan.buffer(sid).nbytes for sid in h) for h in held]
    k = max(range(n), key=lambda j: bytes_at[j])
    return k, held[k]


def scratch(plan) -> str:
    """The kernels' scratch memory, which the plan's peak leaves out: on the cpu backend each
    statement's kernel and each loop tree's function has its own for the run (pages it never
    touches cost nothing); on the cuda backend one for every call, the most any takes."""
    import dataclasses

    from timerlc.compiler import generate_code
    from timerlc.runner import format_bytes

    cpu = generate_code(plan).plan.kernels
    own = [n for _, _, n in cpu.statements] + [n for _, _, n in cpu.trees]
    cuda = generate_code(dataclasses.replace(plan, kernels=None), target="cuda").plan.kernels
    calls = [n for _, _, n in cuda.statements] + [n for n, _ in cuda.fused_launches]
    calls += [n for _, _, n in cuda.loops]
    return (
        f"kernels' scratch: cpu {format_bytes(sum(own))} in all ({len(own)} kernels and trees,"
        f" the largest {format_bytes(max(own, default=0))}); cuda {format_bytes(max(calls))}"
    )


def main(argv=None) -> int:
    from timerlc.compiler import compile_plan, run_passes
    from timerlc.diagnostics import Source
    from timerlc.frontend.check import check_source
    from timerlc.runner import format_bytes

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--obs", default="3x256x256", help="the observation's shape (AxBxC)")
    p.add_argument("--programs", default="ppo,reinforce")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--top", type=int, default=6, help="the largest buffers to list")
    p.add_argument(
        "--scratch",
        action="store_true",
        help="also generate the kernels (cpu and cuda) and print their scratch memory",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="list the largest buffers on the device during the top-level item of the peak",
    )
    args = p.parse_args(argv)
    env = f"trivial?obs={args.obs}&actions=6"
    obs_bytes = 4 * math.prod(int(x) for x in args.obs.split("x"))
    for name in args.programs.split(","):
        sets = dict(VARIANTS[name][1])
        sets.update(kv.split("=", 1) for kv in args.set)
        source = Source(f"{name}-flattened.rtl", flattened(name))
        graph = run_passes(check_source(source, overrides=sets, envs={"E": env}))
        plan = compile_plan(graph)
        rollout = obs_bytes * int(sets["B"]) * int(sets["T"])
        print(
            f"{name} obs={args.obs} {' '.join(f'{k}={v}' for k, v in sorted(sets.items()))}: "
            f"plan peak {format_bytes(plan.memory_peak)}; one rollout's observations "
            f"{format_bytes(rollout)}"
        )
        if args.scratch:
            print("  " + scratch(plan))
        shown = plan.buffers
        if args.live:
            k, held = live_at_peak(plan)
            total = sum(plan.buffer(sid).nbytes for sid in held)
            print(f"  during top-level item {k} of {len(plan.tree)}: {format_bytes(total)}")
            shown = [plan.buffer(sid) for sid in held]
        for b in sorted(shown, key=lambda b: -b.nbytes)[: args.top]:
            storage = (
                "block" if b.window is None else ", ".join(f"{w.dim}:{w.size}" for w in b.windows)
            )
            print(f"  {b.name or '%' + str(b.id):12s} {format_bytes(b.nbytes):>10s}  {storage}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
