"""REINFORCE on CartPole in JAX, PureJaxRL-style: the algorithm of programs/reinforce.rtl.

The JAX counterpart of torch_reinforce.py, the baseline that scripts/bench.py compares timerlc
with, written like jax_ppo.py: the whole run is one ``jax.jit``, ``train(key)`` a ``lax.scan``
over the I iterations, and one iteration is

  * reset the B CartPoles (jax_ppo.py's, in ``jax.numpy``, timerlc's dynamics) at the start of
    EVERY iteration, as reinforce.rtl does;
  * a T-step rollout (``lax.scan``) with a sampled categorical action per step (same-step
    auto-reset) of a policy MLP obs -> H (tanh) -> num_actions, Glorot-uniform weights, zero
    biases;
  * Monte-Carlo returns g[t] = r[t] + gamma * (1 - done[t]) * g[t+1], g[T-1] = r[T-1] (a
    reverse ``lax.scan``: episodes cut at their end, no bootstrap);
  * baseline = mean of g over the [B, T] batch (or 0 with --no-baseline);
  * loss = -mean(log pi(a | o) * stop_grad(g - baseline)), its log-probabilities recomputed
    in one batched forward over the stored observations (as torch_reinforce.py); one Adam
    step (betas 0.9/0.999, eps 1e-8, lr 0.01);
  * metrics: ep_ret (mean undiscounted return of the episodes that FINISHED inside the
    rollout, 0 if none), episodes, loss.

Random draws use jax.random: runs match timerlc's and torch's statistically, not bit for bit.

  python scripts/baselines/jax_reinforce.py --iters 40 --envs 8 --steps 200 --log

Prints one JSON line at the end, as torch_reinforce.py: algo, impl, B, T, iters,
seconds_per_iter (the compiled run's time / I; compilation is timed apart as
compile_seconds), peak_rss_mb (ru_maxrss of this process), final_ep_ret.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp

# CartPole, Adam and the float64 set-up (jax_enable_x64) are jax_ppo.py's, next to this file.
from jax_ppo import (
    F32,
    NUM_ACTIONS,
    OBS_DIM,
    adam_init,
    adam_update,
    cartpole_reset,
    cartpole_step,
    check_float32,
)


class Step(NamedTuple):
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    done: jax.Array
    ended: jax.Array  # the return of an episode that finished at this step, else 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=200, help="iterations I (reinforce.rtl: 200)")
    p.add_argument("--envs", type=int, default=16, help="environments B (reinforce.rtl: 16)")
    p.add_argument("--steps", type=int, default=500, help="rollout steps T (reinforce.rtl: 500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=64, help="hidden units H")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--no-baseline", action="store_true", help="config baseline = false")
    p.add_argument("--log", action="store_true", help="print each iteration's metrics to stderr")
    p.add_argument(
        "--matmul-precision",
        default=None,
        help="jax_default_matmul_precision for the run (e.g. float32: true float32 products; "
        "default: JAX's own, which on recent NVIDIA GPUs computes float32 products with TF32)",
    )
    return p.parse_args(argv)


def init_policy(key, hidden: int):
    k1, k2 = jax.random.split(key)
    glorot = jax.nn.initializers.glorot_uniform()
    return [
        (glorot(k1, (OBS_DIM, hidden), F32), jnp.zeros(hidden, F32)),
        (glorot(k2, (hidden, NUM_ACTIONS), F32), jnp.zeros(NUM_ACTIONS, F32)),
    ]


def policy(params, x):
    (w1, b1), (w2, b2) = params
    return jnp.tanh(x @ w1 + b1) @ w2 + b2


def make_train(args, iters: int):
    """train(key) -> (final runner state, metrics stacked over the iterations)."""
    B, T = args.envs, args.steps

    def reinforce_loss(params, obs, action, adv):
        logp = jax.nn.log_softmax(policy(params, obs))
        logp = jnp.take_along_axis(logp, action[:, None], axis=1)[:, 0]
        return -(logp * adv).mean()

    grad_fn = jax.value_and_grad(reinforce_loss)

    def update_step(runner, _):
        params, opt, key = runner
        key, k_reset, k_roll = jax.random.split(key, 3)

        # --- rollout: every iteration starts from a reset ---
        def env_step(carry, _):
            env, obs, running, key = carry
            key, k_act, k_env = jax.random.split(key, 3)
            action = jax.random.categorical(k_act, policy(params, obs))
            env, next_obs, reward, done = cartpole_step(k_env, env, action)
            running = running + reward
            ended = jnp.where(done, running, 0.0)
            running = jnp.where(done, 0.0, running)
            return (env, next_obs, running, key), Step(obs, action, reward, done, ended)

        env, obs = cartpole_reset(k_reset, B)
        running = jnp.zeros(B, jnp.float64)
        _, traj = jax.lax.scan(env_step, (env, obs, running, k_roll), None, T)

        # --- Monte-Carlo returns, cut at episode ends: a reverse scan ---
        def return_step(g_next, step):
            reward, done = step
            g = reward + args.gamma * (1.0 - done.astype(F32)) * g_next
            return g, g

        _, g = jax.lax.scan(return_step, jnp.zeros(B, F32), (traj.reward, traj.done), reverse=True)
        base = g.mean() if not args.no_baseline else 0.0
        adv = (g - base).reshape(T * B)  # data, not a function of params: no gradient

        # --- loss and one Adam step ---
        loss, grads = grad_fn(
            params, traj.obs.reshape(T * B, OBS_DIM), traj.action.reshape(T * B), adv
        )
        params, opt = adam_update(params, grads, opt, args.lr)

        episodes = traj.done.sum()
        metrics = {
            "ep_ret": traj.ended.sum() / jnp.maximum(episodes, 1),
            "episodes": episodes,
            "loss": loss,
        }
        return (params, opt, key), metrics

    def train(key):
        key, k_init = jax.random.split(key)
        params = init_policy(k_init, args.hidden)
        return jax.lax.scan(update_step, (params, adam_init(params), key), None, iters)

    return train


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.matmul_precision:
        jax.config.update("jax_default_matmul_precision", args.matmul_precision)
    B, T, iters = args.envs, args.steps, args.iters
    key = jax.random.key(args.seed)

    started = time.perf_counter()
    compiled = jax.jit(make_train(args, iters)).lower(key).compile()
    compiled_at = time.perf_counter()
    runner, metrics = jax.block_until_ready(compiled(key))
    finished_at = time.perf_counter()
    check_float32(runner[0])

    metrics = jax.device_get(metrics)
    history = [{"i": it, **{k: v[it].item() for k, v in metrics.items()}} for it in range(iters)]
    if args.log:
        for row in history:
            print(json.dumps(row), file=sys.stderr, flush=True)
    run_seconds = finished_at - compiled_at
    result = {
        "algo": "reinforce",
        "impl": "jax",
        "B": B,
        "T": T,
        "iters": iters,
        "seconds_per_iter": run_seconds / iters if iters else None,
        "run_seconds": run_seconds,
        "compile_seconds": compiled_at - started,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "final_ep_ret": history[-1]["ep_ret"] if history else None,
        "final_episodes": history[-1]["episodes"] if history else None,
        "jax": jax.__version__,
        "matmul_precision": jax.config.jax_default_matmul_precision,
        "device": str(jax.devices()[0]),
        "peak_device_mb": peak_device_mb(),
        "total_seconds": finished_at - started,
    }
    print(json.dumps(result), flush=True)
    return result


def peak_device_mb():
    """The most MB XLA's allocator held on the device (a GPU's; None where the device
    keeps no such count, as the CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else peak / 2**20


if __name__ == "__main__":
    main()
