"""PPO on CartPole in plain eager PyTorch: the algorithm of programs/ppo.rtl (CleanRL's ppo.py).

A CleanRL-style single file, the baseline that scripts/bench.py compares timerlc with.
Per iteration i (of I = --iters, or total_steps // (B * T) like ppo.rtl):

  1. under torch.no_grad(), roll the policy out for T steps in each of B instances of
     timerlc's NumPy CartPole (``timerlc.envs.make("cartpole", B)``). The environments are
     reset once, before iteration 0 (seeded as timerlc's reference interpreter seeds them:
     ``seed32(seed) * 2**32 + site_id("env:E")``), and CONTINUE across iterations; finished
     episodes auto-reset inside the step;
  2. GAE with the value of the last observation o[T] as bootstrap. ``done[t]`` is the done
     flag of step t (ppo.rtl's convention, equivalent to CleanRL's shifted ``dones``):
     delta[t] = r[t] + gamma * (1 - done[t]) * v[t+1] - v[t],
     adv[t] = delta[t] + gamma * lam * (1 - done[t]) * adv[t+1], ret = adv + v;
  3. flatten the B*T samples (b major, as ppo.rtl) and run EPOCHS epochs, each over MB
     minibatches of a fresh permutation; per minibatch: advantage normalization (unbiased
     std + 1e-8), clipped surrogate, clipped value loss (0.5 * mean of the max), entropy
     bonus, loss = pg - ent_coef * entropy + vf_coef * v_loss, clip_grad_norm_(0.5) and one
     Adam step (eps 1e-5) with lr annealed linearly: lr * (1 - i / I).

Networks: separate actor and critic MLPs obs -> 64 -> 64 (tanh), orthogonal weights (gain
sqrt(2) hidden, 0.01 policy head, 1 value head), zero biases (CleanRL's layer_init).

Metrics per iteration: ep_ret (mean undiscounted return of the episodes that finished in
this iteration; the running return carries across iterations), episodes, and the losses,
entropy and approx_kl of the last minibatch and the mean clip fraction over all of them.

Random draws use torch's generator: runs match timerlc's statistically, not bit for bit.

  python scripts/baselines/torch_ppo.py --iters 50 --envs 4 --steps 128 --log

Prints one JSON line at the end: algo, impl, B, T, iters, seconds_per_iter (mean over
iterations 2..I: the first is warm-up), peak_rss_mb (ru_maxrss of this process), and
final_ep_ret (ep_ret of the last iteration).
"""

from __future__ import annotations

import argparse
import json
import math
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
    p.add_argument(
        "--iters", type=int, default=None, help="iterations I (default total_steps // (B * T))"
    )
    p.add_argument("--total-steps", type=int, default=500000, help="ppo.rtl's total_steps")
    p.add_argument("--envs", type=int, default=16, help="environments B (ppo.rtl: 16)")
    p.add_argument("--steps", type=int, default=128, help="rollout steps T (ppo.rtl: 128)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    p.add_argument(
        "--device", default="cpu", help="torch device of the networks and buffers (cpu, cuda)"
    )
    p.add_argument("--epochs", type=int, default=4, help="update epochs EPOCHS")
    p.add_argument("--minibatches", type=int, default=4, help="minibatches per epoch MB")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)  # as programs/ppo.rtl
    p.add_argument("--no-anneal-lr", action="store_true")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lam", type=float, default=0.95)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--no-clip-vloss", action="store_true")
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--no-norm-adv", action="store_true")
    p.add_argument("--log", action="store_true", help="print each iteration's metrics to stderr")
    return p.parse_args(argv)


def env_seed(seed: int, name: str = "E") -> int:
    """The seed timerlc's reference interpreter gives the first reset of environment NAME."""
    return rng.seed32(seed) * 2**32 + rng.site_id(f"env:{name}")


def layer_init(layer: nn.Linear, std: float = math.sqrt(2.0)) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, 0.0)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int, hidden: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, num_actions), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        logits = self.actor(x)
        probs = torch.distributions.Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.get_value(x)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    B, T = args.envs, args.steps
    N = B * T
    MB = args.minibatches
    if N % MB:
        raise SystemExit(f"minibatches ({MB}) must divide B * T ({N})")
    MBS = N // MB
    iters = args.iters if args.iters is not None else args.total_steps // N

    env = make("cartpole", B)
    obs_dim = int(np.prod(env.single_observation_space.shape))
    num_actions = int(env.single_action_space.n)
    dev = torch.device(args.device)
    agent = Agent(obs_dim, num_actions, args.hidden).to(dev)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)

    # rollout storage, [T, B] like CleanRL
    obs = torch.zeros((T, B, obs_dim), dtype=torch.float32, device=dev)
    actions = torch.zeros((T, B), dtype=torch.int64, device=dev)
    logprobs = torch.zeros((T, B), dtype=torch.float32, device=dev)
    rewards = torch.zeros((T, B), dtype=torch.float32, device=dev)
    dones = torch.zeros((T, B), dtype=torch.float32, device=dev)
    values = torch.zeros((T, B), dtype=torch.float32, device=dev)

    next_obs = torch.from_numpy(env.reset(seed=env_seed(args.seed))).to(dev)
    running = np.zeros(B, dtype=np.float64)  # return so far of each instance's episode

    iter_seconds: list[float] = []
    history: list[dict] = []
    started = time.perf_counter()
    for it in range(iters):
        t0 = time.perf_counter()
        if not args.no_anneal_lr:
            optimizer.param_groups[0]["lr"] = args.lr * (1.0 - it / iters)

        # --- 1. rollout with the parameters at the start of the iteration ---
        finished_sum, finished = 0.0, 0
        with torch.no_grad():
            for t in range(T):
                obs[t] = next_obs
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                actions[t] = action
                logprobs[t] = logprob
                values[t] = value
                o, r, d = env.step(action.cpu().numpy())
                next_obs = torch.from_numpy(o).to(dev)
                rewards[t] = torch.from_numpy(r).to(dev)
                dones[t] = torch.from_numpy(d.astype(np.float32)).to(dev)
                running += r
                finished_sum += float(running[d].sum())
                finished += int(d.sum())
                running[d] = 0.0

            # --- 2. GAE, bootstrapping from V(o[T]) ---
            next_value = agent.get_value(next_obs)
            advantages = torch.zeros((T, B), dtype=torch.float32, device=dev)
            lastgaelam = torch.zeros(B, dtype=torch.float32, device=dev)
            for t in reversed(range(T)):
                nextvalues = next_value if t == T - 1 else values[t + 1]
                nextnonterminal = 1.0 - dones[t]
                delta = rewards[t] + args.gamma * nextnonterminal * nextvalues - values[t]
                lastgaelam = delta + args.gamma * args.lam * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns = advantages + values

        # --- 3. flatten (b major, as ppo.rtl) and optimize ---
        b_obs = obs.transpose(0, 1).reshape(N, obs_dim)
        b_actions = actions.transpose(0, 1).reshape(N)
        b_logprobs = logprobs.transpose(0, 1).reshape(N)
        b_advantages = advantages.transpose(0, 1).reshape(N)
        b_returns = returns.transpose(0, 1).reshape(N)
        b_values = values.transpose(0, 1).reshape(N)

        clipfracs = []
        for _epoch in range(args.epochs):
            perm = torch.randperm(N, device=dev)
            for start in range(0, N, MBS):
                mb = perm[start : start + MBS]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb], b_actions[mb]
                )
                logratio = newlogprob - b_logprobs[mb]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())

                mb_advantages = b_advantages[mb]
                if not args.no_norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (
                        mb_advantages.std() + 1e-8
                    )

                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(
                    ratio, 1 - args.clip_coef, 1 + args.clip_coef
                )
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                if not args.no_clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb]) ** 2
                    v_clipped = b_values[mb] + torch.clamp(
                        newvalue - b_values[mb], -args.clip_coef, args.clip_coef
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

        ep_ret = finished_sum / max(finished, 1)
        if dev.type == "cuda":
            torch.cuda.synchronize()  # (the last steps are queued, not done)
        iter_seconds.append(time.perf_counter() - t0)
        row = {
            "i": it,
            "ep_ret": ep_ret,
            "episodes": finished,
            "last_pg_loss": pg_loss.item(),
            "last_v_loss": v_loss.item(),
            "last_entropy": entropy_loss.item(),
            "last_kl": approx_kl.item(),
            "last_clipfrac": float(np.mean(clipfracs)),
        }
        history.append(row)
        if args.log:
            print(json.dumps(row), file=sys.stderr, flush=True)

    env.close()
    timed = iter_seconds[1:] or iter_seconds
    result = {
        "algo": "ppo",
        "impl": "torch",
        "B": B,
        "T": T,
        "iters": iters,
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
