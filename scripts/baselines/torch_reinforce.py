"""REINFORCE on CartPole in plain eager PyTorch: the algorithm of programs/reinforce.rtl.

A CleanRL-style single file, the baseline that scripts/bench.py compares timerlc with. It
does what reinforce.rtl's equations do, iteration by iteration:

  * B instances of timerlc's NumPy CartPole (``timerlc.envs.make("cartpole", B)``), reset at
    the start of EVERY iteration; the first reset is seeded as timerlc's reference
    interpreter seeds it (``seed32(seed) * 2**32 + site_id("env:E")``), later resets continue
    the environments' random streams;
  * a policy MLP obs -> H (tanh) -> num_actions, Glorot-uniform weights, zero biases;
  * a T-step rollout with a sampled categorical action per step (same-step auto-reset);
  * Monte-Carlo returns g[t] = r[t] + gamma * (1 - done[t]) * g[t+1], g[T-1] = r[T-1]
    (episodes cut at their end, no bootstrap at the end of the rollout);
  * baseline = mean of g over the whole [B, T] batch (or 0 with --no-baseline);
  * loss = -mean(log pi(a | o) * stop_grad(g - baseline)); one Adam step (betas 0.9/0.999,
    eps 1e-8, as timerlc's adam);
  * metrics: ep_ret = mean undiscounted return of the episodes that FINISHED inside the
    rollout (0 if none), episodes = how many finished, loss.

Implementation choice: the rollout runs under torch.no_grad() and the log-probabilities
are recomputed afterwards in one batched forward over the stored [T*B] observations (same
parameters, same observations, so the same values and gradient as differentiating
through the rollout's logits, which reinforce.rtl's equations express).

Random draws (initialization, actions) use torch's generator, so runs match timerlc's
statistically, not bit for bit.

  python scripts/baselines/torch_reinforce.py --iters 40 --envs 8 --steps 200 --log

Prints one JSON line at the end: algo, impl, B, T, iters, seconds_per_iter (mean over
iterations 2..I: the first is warm-up), peak_rss_mb (ru_maxrss of this process), and
final_ep_ret (ep_ret of the last iteration).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np
import torch
import torch.nn as nn

from timerlc import rng
from timerlc.envs import make


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=200, help="iterations I (reinforce.rtl: 200)")
    p.add_argument("--envs", type=int, default=16, help="environments B (reinforce.rtl: 16)")
    p.add_argument("--steps", type=int, default=500, help="rollout steps T (reinforce.rtl: 500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    p.add_argument(
        "--device", default="cpu", help="torch device of the networks and buffers (cpu, cuda)"
    )
    p.add_argument("--hidden", type=int, default=64, help="hidden units H")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--no-baseline", action="store_true", help="config baseline = false")
    p.add_argument("--log", action="store_true", help="print each iteration's metrics to stderr")
    return p.parse_args(argv)


def env_seed(seed: int, name: str = "E") -> int:
    """The seed timerlc's reference interpreter gives the first reset of environment NAME."""
    return rng.seed32(seed) * 2**32 + rng.site_id(f"env:{name}")


class Policy(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, hidden)
        self.fc2 = nn.Linear(hidden, num_actions)
        for layer in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(layer.weight)  # glorot (the fans are symmetric)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    B, T = args.envs, args.steps

    env = make("cartpole", B)
    obs_dim = int(np.prod(env.single_observation_space.shape))
    num_actions = int(env.single_action_space.n)
    dev = torch.device(args.device)
    policy = Policy(obs_dim, num_actions, args.hidden).to(dev)
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)

    obs_buf = torch.zeros((T, B, obs_dim), dtype=torch.float32, device=dev)
    act_buf = torch.zeros((T, B), dtype=torch.int64, device=dev)
    rew_buf = torch.zeros((T, B), dtype=torch.float32, device=dev)
    done_buf = torch.zeros((T, B), dtype=torch.float32, device=dev)

    iter_seconds: list[float] = []
    history: list[dict] = []
    started = time.perf_counter()
    for it in range(args.iters):
        t0 = time.perf_counter()
        # --- rollout: every iteration starts from a reset ---
        o = env.reset(seed=env_seed(args.seed) if it == 0 else None)
        running = np.zeros(B, dtype=np.float64)
        finished_sum, finished = 0.0, 0
        with torch.no_grad():
            for t in range(T):
                x = torch.from_numpy(o).to(dev)
                obs_buf[t] = x
                logits = policy(x)
                a = torch.distributions.Categorical(logits=logits).sample()
                act_buf[t] = a
                o, r, d = env.step(a.cpu().numpy())
                rew_buf[t] = torch.from_numpy(r).to(dev)
                done_buf[t] = torch.from_numpy(d.astype(np.float32)).to(dev)
                # episode statistics (run / ended / episodes of reinforce.rtl)
                running += r
                finished_sum += float(running[d].sum())
                finished += int(d.sum())
                running[d] = 0.0

            # --- Monte-Carlo returns, cut at episode ends ---
            g = torch.zeros((T, B), dtype=torch.float32, device=dev)
            g[T - 1] = rew_buf[T - 1]
            for t in range(T - 2, -1, -1):
                g[t] = rew_buf[t] + args.gamma * (1.0 - done_buf[t]) * g[t + 1]
            base = g.mean() if not args.no_baseline else torch.zeros((), device=dev)
            adv = g - base

        # --- loss and one Adam step ---
        logits = policy(obs_buf.reshape(T * B, obs_dim))
        logp = torch.log_softmax(logits, dim=-1).gather(1, act_buf.reshape(T * B, 1)).squeeze(1)
        loss = -(logp * adv.reshape(T * B)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        ep_ret = finished_sum / max(finished, 1)
        if dev.type == "cuda":
            torch.cuda.synchronize()  # (the step is queued, not done)
        iter_seconds.append(time.perf_counter() - t0)
        row = {"i": it, "ep_ret": ep_ret, "episodes": finished, "loss": loss.item()}
        history.append(row)
        if args.log:
            print(json.dumps(row), file=sys.stderr, flush=True)

    env.close()
    timed = iter_seconds[1:] or iter_seconds
    result = {
        "algo": "reinforce",
        "impl": "torch",
        "B": B,
        "T": T,
        "iters": args.iters,
        "seconds_per_iter": sum(timed) / len(timed) if timed else None,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "final_ep_ret": history[-1]["ep_ret"] if history else None,
        "final_episodes": history[-1]["episodes"] if history else None,
        "threads": torch.get_num_threads(),
        "device": str(dev),
        # the most bytes torch's allocator held on the GPU (its cache left out)
        "peak_device_mb": torch.cuda.max_memory_allocated(dev) / 2**20
        if dev.type == "cuda"
        else None,
        "total_seconds": time.perf_counter() - started,
    }
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
