"""PPO on CartPole in JAX, PureJaxRL-style: the algorithm of programs/ppo.rtl and torch_ppo.py.

A single file in the structure of PureJaxRL's ppo.py (github.com/luchris429/purejaxrl), the
JAX baseline that scripts/bench.py compares timerlc with. The whole run is one ``jax.jit``:
``train(key)`` is a ``lax.scan`` over the I iterations, and one iteration is

  1. the rollout: a ``lax.scan`` over T steps of B CartPoles written in ``jax.numpy``
     (below), with the parameters at the start of the iteration. The environments are
     reset once, before iteration 0, and CONTINUE across iterations; finished episodes
     auto-reset inside the step;
  2. GAE, a reverse ``lax.scan`` over t, bootstrapping from V(o[T]); ``done[t]`` is the done
     flag of step t (ppo.rtl's and torch_ppo.py's convention);
  3. flatten the B*T samples (b major) and run EPOCHS epochs (a ``lax.scan``), each over MB
     minibatches (a nested ``lax.scan``) of a fresh permutation; per minibatch: advantage
     normalization (unbiased std + 1e-8), clipped surrogate, clipped value loss, entropy
     bonus, global gradient-norm clipping to 0.5 (as torch's clip_grad_norm_) and one Adam
     step (eps 1e-5, written below: optax is not a dependency) with lr annealed linearly:
     lr * (1 - i / I).

Hyperparameters, networks (separate 64-64 tanh actor and critic, orthogonal weights with gain
sqrt(2) / 0.01 / 1, zero biases) and metrics are torch_ppo.py's and ppo.rtl's.

CartPole: the dynamics of timerlc/envs/cartpole.py (gymnasium's CartPole-v1 with its 500-step
TimeLimit): the same constants and explicit Euler step in the same order on a float64 state
(hence ``jax_enable_x64``; every network array stays float32), float32 observations, reward
1 on every step, same-step auto-reset to a state uniform in [-0.05, 0.05). Random draws use
jax.random, so runs match timerlc's and torch's statistically, not bit for bit.

  python scripts/baselines/jax_ppo.py --iters 50 --envs 16 --steps 128 --log

Prints one JSON line at the end, as torch_ppo.py: algo, impl, B, T, iters, seconds_per_iter
(the compiled run's time / I: tracing and XLA compilation are done ahead of time and timed
apart as compile_seconds), peak_rss_mb (ru_maxrss of this process), final_ep_ret. With --log
the per-iteration metrics go to stderr after the run (they leave the jit only at its end).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp

# Ordering restriction: before any array is made. The CartPole state is float64 like timerlc's;
# everything else is created float32 explicitly (train() checks that it stays so).
jax.config.update("jax_enable_x64", True)

F32 = jnp.float32

# --- CartPole-v1, vectorized in jax.numpy: timerlc/envs/cartpole.py's constants and step ---
GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5  # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02  # seconds between state updates
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
RESET_LOW, RESET_HIGH = -0.05, 0.05
MAX_EPISODE_STEPS = 500
OBS_DIM, NUM_ACTIONS = 4, 2


class EnvState(NamedTuple):
    state: jax.Array  # float64 [B, 4]: x, x_dot, theta, theta_dot
    steps: jax.Array  # int32 [B]: steps into the current episode


def cartpole_reset(key: jax.Array, num_envs: int) -> tuple[EnvState, jax.Array]:
    """B fresh cart-poles and their float32 observations."""
    state = jax.random.uniform(key, (num_envs, 4), jnp.float64, RESET_LOW, RESET_HIGH)
    return EnvState(state, jnp.zeros(num_envs, jnp.int32)), state.astype(F32)


def cartpole_step(key: jax.Array, env: EnvState, action: jax.Array):
    """One step of every instance: (env, obs, reward, done), finished instances reset.

    The operations and their order are CartPole.step's in timerlc/envs/cartpole.py."""
    x, x_dot, theta, theta_dot = env.state.T
    force = jnp.where(action == 1, FORCE_MAG, -FORCE_MAG)
    costheta = jnp.cos(theta)
    sintheta = jnp.sin(theta)
    temp = (force + POLEMASS_LENGTH * jnp.square(theta_dot) * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        LENGTH * (4.0 / 3.0 - MASSPOLE * jnp.square(costheta) / TOTAL_MASS)
    )
    xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    x = x + TAU * x_dot
    x_dot = x_dot + TAU * xacc
    theta = theta + TAU * theta_dot
    theta_dot = theta_dot + TAU * thetaacc
    state = jnp.stack((x, x_dot, theta, theta_dot), axis=1)

    terminated = (
        (x < -X_THRESHOLD)
        | (x > X_THRESHOLD)
        | (theta < -THETA_THRESHOLD)
        | (theta > THETA_THRESHOLD)
    )
    steps = env.steps + 1
    done = terminated | (steps >= MAX_EPISODE_STEPS)
    reward = jnp.ones(action.shape, F32)
    # same-step auto-reset (gymnax's way: draw a reset state for every instance, keep the
    # ones that finished)
    fresh, _ = cartpole_reset(key, action.shape[0])
    state = jnp.where(done[:, None], fresh.state, state)
    steps = jnp.where(done, 0, steps)
    return EnvState(state, steps), state.astype(F32), reward, done


# --- Adam (torch.optim.Adam's update) and global-norm clipping (clip_grad_norm_) ---
class AdamState(NamedTuple):
    m: dict
    v: dict
    count: jax.Array


def adam_init(params) -> AdamState:
    zeros = jax.tree.map(jnp.zeros_like, params)
    return AdamState(zeros, zeros, jnp.zeros((), jnp.int32))


def adam_update(params, grads, opt: AdamState, lr, b1=0.9, b2=0.999, eps=1e-8):
    count = opt.count + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g, opt.m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * g * g, opt.v, grads)
    c = count.astype(F32)
    bc1, bc2 = 1.0 - b1**c, 1.0 - b2**c
    params = jax.tree.map(
        lambda p, m, v: p - lr * (m / bc1) / (jnp.sqrt(v / bc2) + eps), params, m, v
    )
    return params, AdamState(m, v, count)


def clip_by_global_norm(grads, max_norm: float):
    total = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    scale = jnp.minimum(max_norm / (total + 1e-6), 1.0)
    return jax.tree.map(lambda g: g * scale, grads)


# --- networks: lists of (w [in, out], b [out]) layers ---
def init_mlp(key, sizes, gains):
    keys = jax.random.split(key, len(gains))
    return [
        (
            jax.nn.initializers.orthogonal(gain)(k, (n_in, n_out), F32),
            jnp.zeros(n_out, F32),
        )
        for k, n_in, n_out, gain in zip(keys, sizes[:-1], sizes[1:], gains)
    ]


def mlp(layers, x):
    for w, b in layers[:-1]:
        x = jnp.tanh(x @ w + b)
    w, b = layers[-1]
    return x @ w + b


def init_agent(key, hidden: int) -> dict:
    k_actor, k_critic = jax.random.split(key)
    root2 = math.sqrt(2.0)
    return {
        "actor": init_mlp(k_actor, (OBS_DIM, hidden, hidden, NUM_ACTIONS), (root2, root2, 0.01)),
        "critic": init_mlp(k_critic, (OBS_DIM, hidden, hidden, 1), (root2, root2, 1.0)),
    }


class Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array
    logp: jax.Array
    value: jax.Array
    reward: jax.Array
    done: jax.Array
    ended: jax.Array  # the return of an episode that finished at this step, else 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--iters", type=int, default=None, help="iterations I (default total_steps // (B * T))"
    )
    p.add_argument("--total-steps", type=int, default=500000, help="ppo.rtl's total_steps")
    p.add_argument("--envs", type=int, default=16, help="environments B (ppo.rtl: 16)")
    p.add_argument("--steps", type=int, default=128, help="rollout steps T (ppo.rtl: 128)")
    p.add_argument("--seed", type=int, default=0)
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
    p.add_argument(
        "--matmul-precision",
        default=None,
        help="jax_default_matmul_precision for the run (e.g. float32: true float32 products; "
        "default: JAX's own, which on recent NVIDIA GPUs computes float32 products with TF32)",
    )
    return p.parse_args(argv)


def make_train(args, iters: int):
    """train(key) -> (final runner state, metrics stacked over the iterations)."""
    B, T = args.envs, args.steps
    N = B * T
    MB = args.minibatches
    if N % MB:
        raise SystemExit(f"minibatches ({MB}) must divide B * T ({N})")
    MBS = N // MB

    def ppo_loss(params, mb: Transition, adv, ret):
        logits = mlp(params["actor"], mb.obs)
        value = mlp(params["critic"], mb.obs)[:, 0]
        logp_all = jax.nn.log_softmax(logits)
        newlogp = jnp.take_along_axis(logp_all, mb.action[:, None], axis=1)[:, 0]
        entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=1).mean()
        logratio = newlogp - mb.logp
        ratio = jnp.exp(logratio)
        if not args.no_norm_adv:
            adv = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
        clipped = jnp.clip(ratio, 1.0 - args.clip_coef, 1.0 + args.clip_coef)
        pg_loss = jnp.maximum(-adv * ratio, -adv * clipped).mean()
        if not args.no_clip_vloss:
            v_clipped = mb.value + jnp.clip(value - mb.value, -args.clip_coef, args.clip_coef)
            v_loss = 0.5 * jnp.maximum((value - ret) ** 2, (v_clipped - ret) ** 2).mean()
        else:
            v_loss = 0.5 * ((value - ret) ** 2).mean()
        loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
        approx_kl = ((ratio - 1.0) - logratio).mean()
        clipfrac = (jnp.abs(ratio - 1.0) > args.clip_coef).astype(F32).mean()
        return loss, (pg_loss, v_loss, entropy, approx_kl, clipfrac)

    grad_fn = jax.value_and_grad(ppo_loss, has_aux=True)

    def update_step(runner, i):
        params, opt, env, obs, running, key = runner

        # --- 1. rollout with the parameters at the start of the iteration ---
        def env_step(carry, _):
            env, obs, running, key = carry
            key, k_act, k_env = jax.random.split(key, 3)
            logits = mlp(params["actor"], obs)
            value = mlp(params["critic"], obs)[:, 0]
            action = jax.random.categorical(k_act, logits)
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=1)[:, 0]
            env, next_obs, reward, done = cartpole_step(k_env, env, action)
            running = running + reward
            ended = jnp.where(done, running, 0.0)
            running = jnp.where(done, 0.0, running)
            tr = Transition(obs, action, logp, value, reward, done, ended)
            return (env, next_obs, running, key), tr

        (env, obs, running, key), traj = jax.lax.scan(env_step, (env, obs, running, key), None, T)

        # --- 2. GAE, a reverse scan bootstrapping from V(o[T]) ---
        def gae_step(carry, tr):
            gae, next_value = carry
            value, reward, done = tr
            nonterminal = 1.0 - done.astype(F32)
            delta = reward + args.gamma * nonterminal * next_value - value
            gae = delta + args.gamma * args.lam * nonterminal * gae
            return (gae, value), gae

        last_value = mlp(params["critic"], obs)[:, 0]
        _, adv = jax.lax.scan(
            gae_step,
            (jnp.zeros(B, F32), last_value),
            (traj.value, traj.reward, traj.done),
            reverse=True,
        )
        ret = adv + traj.value

        # --- 3. flatten (b major, as ppo.rtl) and optimize ---
        def flat(x):
            return jnp.swapaxes(x, 0, 1).reshape((N,) + x.shape[2:])

        batch = (jax.tree.map(flat, traj), flat(adv), flat(ret))
        frac = 1.0 - i.astype(F32) / iters
        lr_now = args.lr * frac if not args.no_anneal_lr else jnp.asarray(args.lr, F32)

        def update_epoch(carry, _):
            params, opt, key = carry
            key, k_perm = jax.random.split(key)
            perm = jax.random.permutation(k_perm, N)
            mbs = jax.tree.map(lambda x: x[perm].reshape((MB, MBS) + x.shape[1:]), batch)

            def update_minibatch(carry, mb):
                params, opt = carry
                tr, adv, ret = mb
                (_, aux), grads = grad_fn(params, tr, adv, ret)
                grads = clip_by_global_norm(grads, args.max_grad_norm)
                params, opt = adam_update(params, grads, opt, lr_now, eps=1e-5)
                return (params, opt), aux

            (params, opt), aux = jax.lax.scan(update_minibatch, (params, opt), mbs)
            return (params, opt, key), aux

        (params, opt, key), aux = jax.lax.scan(update_epoch, (params, opt, key), None, args.epochs)
        pg_loss, v_loss, entropy, approx_kl, clipfrac = aux  # each [EPOCHS, MB]
        episodes = traj.done.sum()
        metrics = {
            "ep_ret": traj.ended.sum() / jnp.maximum(episodes, 1),
            "episodes": episodes,
            "last_pg_loss": pg_loss[-1, -1],
            "last_v_loss": v_loss[-1, -1],
            "last_entropy": entropy[-1, -1],
            "last_kl": approx_kl[-1, -1],
            "last_clipfrac": clipfrac.mean(),
        }
        return (params, opt, env, obs, running, key), metrics

    def train(key):
        key, k_init, k_env = jax.random.split(key, 3)
        params = init_agent(k_init, args.hidden)
        env, obs = cartpole_reset(k_env, B)
        running = jnp.zeros(B, jnp.float64)  # return so far of each instance's episode
        runner = (params, adam_init(params), env, obs, running, key)
        return jax.lax.scan(update_step, runner, jnp.arange(iters))

    return train


def check_float32(params) -> None:
    """x64 mode must not have promoted the networks (it would make this baseline slower)."""
    bad = {str(x.dtype) for x in jax.tree.leaves(params)} - {"float32"}
    if bad:
        raise SystemExit(f"jax_ppo: parameters became {sorted(bad)}, not float32")


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.matmul_precision:
        jax.config.update("jax_default_matmul_precision", args.matmul_precision)
    B, T = args.envs, args.steps
    iters = args.iters if args.iters is not None else args.total_steps // (B * T)
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
        "algo": "ppo",
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
