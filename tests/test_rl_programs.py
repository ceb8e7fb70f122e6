"""The deep-RL example programs (programs/reinforce.rtl, reinforce_td.rtl, ppo.rtl,
rnn_reinforce.rtl) on the reference backend, checked against independent NumPy code.

For every program:
  * ``timerlc check`` accepts it silently at its default sizes;
  * a small run (a few iterations, tiny networks) gives finite metrics, and running
    the same build again gives identical metrics and outputs;
  * the episode-return metric (the mean return of the episodes that finished in an
    iteration, and their count) equals a NumPy computation from the rewards and dones;
  * its loss and its gradient (``grad`` through the rollout, GAE, minibatch gathers or
    the RNN's recurrence) equal a float64 NumPy recomputation from the ``out`` tensors,
    the gradient by central finite differences.
And: REINFORCE learns on the ``trivial`` environment, the n-step TD targets match NumPy,
and PPO's minibatches cover the batch exactly once per epoch.

The programs are run as written plus a few ``out`` lines (and, for PPO and REINFORCE,
an extra ``grad`` tensor that nothing reads) appended to a copy.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from timerlc.cli import cli

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
NAMES = ["reinforce", "reinforce_td", "ppo", "rnn_reinforce"]

# Small sizes: cartpole episodes last ~10-40 steps under a random policy, so T=30
# ends some of them, and in PPO some run across iterations.
SMALL = {
    "reinforce": dict(I=3, B=3, T=30, H=8),
    "reinforce_td": dict(I=3, B=3, T=30, N=4, H=8),
    "ppo": dict(I=3, B=2, T=30, EPOCHS=2, MB=3, H=8),
    "rnn_reinforce": dict(I=3, B=3, T=30, H=8, clip=1e9),  # no clipping: raw BPTT gradient
}
EXTRA = {
    "reinforce": "graw[i] = grad(loss[i], net[i])\n"
    "out r, done, o, a, g, net, graw, loss, ep_ret, episodes\n",
    "reinforce_td": "out r, done, v, target, ep_ret, episodes\n",
    "ppo": "graw[j] = grad(loss[j], net[j])\n"
    "out r, done, o, a, v, adv, idx, perm, net, graw, loss, approx_kl, ep_ret, episodes\n",
    "rnn_reinforce": "out r, done, o, a, net, gnet, loss, ep_ret, episodes\n",
}
METRICS = {
    "reinforce": {"ep_ret", "episodes", "loss"},
    "reinforce_td": {"ep_ret", "episodes", "loss", "v_loss"},
    "ppo": {
        "ep_ret",
        "episodes",
        "last_pg_loss",
        "last_v_loss",
        "last_entropy",
        "last_kl",
        "last_clipfrac",
    },
    "rnn_reinforce": {"ep_ret", "episodes", "loss", "gnorm"},
}


# ----------------------------------------------------------------------------- helpers
def cli_ok(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def build(tmp: Path, name: str, sets: dict, extra: str = "", env: str | None = None) -> Path:
    """Compile programs/NAME.rtl (plus ``extra`` lines) into a build folder."""
    src = tmp / f"{name}.rtl"
    src.write_text((PROGRAMS / f"{name}.rtl").read_text() + "\n" + extra)
    out = tmp / f"{name}-build"
    args = ["compile", str(src), "-o", str(out), "--backend", "reference"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    if env is not None:
        args += ["--env", f"E={env}"]
    cli_ok(*args)
    return out


def run_build(folder: Path, tag: str) -> tuple[dict, dict, str]:
    """Run a build folder; return (outputs, metrics {name: {i: value}}, metrics csv text)."""
    npz = folder.parent / f"{folder.name}-{tag}.npz"
    mcsv = folder.parent / f"{folder.name}-{tag}.csv"
    cli_ok("run", str(folder), "--backend", "reference", "--no-progress",
           "--outputs", str(npz), "--metrics", str(mcsv))  # fmt: skip
    with np.load(npz) as data:
        arrays = {k: data[k] for k in data.files}
    metrics: dict[str, dict[int, float]] = {}
    with open(mcsv, newline="") as fh:
        for row in csv.DictReader(fh):
            i = int(row["i"])
            assert i not in metrics.setdefault(row["name"], {}), f"reported twice: {row}"
            metrics[row["name"]][i] = float(row["value"])
    return arrays, metrics, mcsv.read_text()


def metric_array(metrics: dict, name: str, n: int) -> np.ndarray:
    assert sorted(metrics[name]) == list(range(n)), f"{name}: points {sorted(metrics[name])}"
    return np.array([metrics[name][i] for i in range(n)])


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """One compile and one run per program at SMALL sizes (cartpole), shared by the tests."""
    cache = {}

    def get(name):
        if name not in cache:
            tmp = tmp_path_factory.mktemp(name)
            folder = build(tmp, name, SMALL[name], EXTRA[name])
            arrays, metrics, text = run_build(folder, "a")
            cache[name] = dict(folder=folder, out=arrays, metrics=metrics, text=text)
        return cache[name]

    return get


def log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def mc_returns(r, done, gamma):
    """g[t] = r[t] + gamma * (1 - done[t]) * g[t+1], g[T-1] = r[T-1], along the last axis."""
    g = np.zeros(r.shape, np.float64)
    g[..., -1] = r[..., -1]
    for t in range(r.shape[-1] - 2, -1, -1):
        g[..., t] = r[..., t] + gamma * (1.0 - done[..., t]) * g[..., t + 1]
    return g


def finished_episodes(r, done, carry: bool):
    """Per iteration: (mean return of the episodes that ended in it, how many ended).
    r, done: [I, B, T]. ``carry``: episodes run on across iterations (PPO)."""
    n_i, n_b, n_t = r.shape
    sums, counts = np.zeros(n_i), np.zeros(n_i, np.int64)
    for b in range(n_b):
        run = 0.0
        for i in range(n_i):
            if not carry:
                run = 0.0
            for t in range(n_t):
                run += float(r[i, b, t])
                if done[i, b, t]:
                    sums[i] += run
                    counts[i] += 1
                    run = 0.0
    return sums / np.maximum(counts, 1), counts


def fields(out: dict, name: str, k: int) -> dict[str, np.ndarray]:
    """Record ``name`` at point k as {field: float64 array}."""
    pre = name + "."
    return {key[len(pre) :]: out[key][k].astype(np.float64) for key in out if key.startswith(pre)}


def finite_diff(f, params: dict[str, np.ndarray], eps=1e-6) -> dict[str, np.ndarray]:
    """Central differences of the scalar f(params) with respect to every entry."""
    grads = {}
    for k, p in params.items():
        g = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            old = p[idx]
            p[idx] = old + eps
            hi = f(params)
            p[idx] = old - eps
            lo = f(params)
            p[idx] = old
            g[idx] = (hi - lo) / (2 * eps)
        grads[k] = g
    return grads


def assert_grad_close(got: dict, want: dict, what: str):
    scale = max(1e-3, max(np.abs(w).max() for w in want.values()))
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-3, atol=2e-4 * scale,
                                   err_msg=f"{what}.{k}")  # fmt: skip


# ----------------------------------------------------------------------------- every program
@pytest.mark.parametrize("name", NAMES)
def test_check_is_silent(name):
    result = cli_ok("check", str(PROGRAMS / f"{name}.rtl"))
    assert result.output == ""


@pytest.mark.parametrize("name", NAMES)
def test_small_run_has_finite_metrics(name, small):
    s = small(name)
    n = SMALL[name]["I"]
    assert set(s["metrics"]) == METRICS[name]
    for m in METRICS[name]:
        values = metric_array(s["metrics"], m, n)
        assert np.all(np.isfinite(values)), f"{name}.{m}: {values}"


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_run(name, small):
    s = small(name)
    arrays, _, text = run_build(s["folder"], "b")
    assert text == s["text"]
    assert set(arrays) == set(s["out"])
    for k in arrays:
        np.testing.assert_array_equal(arrays[k], s["out"][k], err_msg=k)


@pytest.mark.parametrize("name", NAMES)
def test_episode_return_metric_matches_numpy(name, small):
    s = small(name)
    out, metrics = s["out"], s["metrics"]
    n = SMALL[name]["I"]
    want_ret, want_count = finished_episodes(out["r"], out["done"], carry=(name == "ppo"))
    assert want_count.sum() > 0, "no episode ended: the test checks nothing"
    np.testing.assert_array_equal(metric_array(metrics, "episodes", n), want_count)
    np.testing.assert_allclose(metric_array(metrics, "ep_ret", n), want_ret, rtol=1e-6)
    np.testing.assert_array_equal(out["episodes"], want_count)
    np.testing.assert_allclose(out["ep_ret"], want_ret, rtol=1e-6)


def test_ppo_episodes_run_across_iterations(small):
    """The PPO run above has an episode that starts in one iteration and ends in a later
    one (so the carried accumulator is exercised), and its environments are not reset."""
    out = small("ppo")["out"]
    o, done = out["o"], out["done"]
    np.testing.assert_array_equal(o[1:, :, 0], o[:-1, :, -1])
    spans = [
        (i, b)
        for i in range(done.shape[0] - 1)
        for b in range(done.shape[1])
        if not done[i, b, -1] and done[i + 1 :, b].any()
    ]
    assert spans


def test_a_different_seed_gives_a_different_run(tmp_path, small):
    folder = build(tmp_path, "reinforce", {**SMALL["reinforce"], "seed": 1}, EXTRA["reinforce"])
    _, _, text = run_build(folder, "a")
    assert text != small("reinforce")["text"]


# ----------------------------------------------------------------------------- REINFORCE
def reinforce_loss(p, o, a, adv):
    h = np.tanh(o @ p["w1"] + p["b1"])
    lp = log_softmax(h @ p["w2"] + p["b2"])
    logp = np.take_along_axis(lp, a[..., None], -1)[..., 0]
    return -np.mean(logp * adv)


def test_reinforce_loss_and_gradient_match_numpy(small):
    out = small("reinforce")["out"]
    gamma = 0.99
    g = mc_returns(out["r"].astype(np.float64), out["done"], gamma)
    np.testing.assert_allclose(out["g"], g, rtol=1e-5, atol=1e-4)
    for i in range(SMALL["reinforce"]["I"]):
        o, a = out["o"][i, :, :-1].astype(np.float64), out["a"][i]
        adv = g[i] - g[i].mean()  # baseline = true
        p = fields(out, "net", i)
        np.testing.assert_allclose(out["loss"][i], reinforce_loss(p, o, a, adv), rtol=1e-4,
                                   atol=1e-5)  # fmt: skip
        want = finite_diff(lambda q, o=o, a=a, adv=adv: reinforce_loss(q, o, a, adv), p)
        assert_grad_close(fields(out, "graw", i), want, f"reinforce grad at i={i}")


def test_reinforce_learns_on_trivial(tmp_path):
    """trivial with length 4 pays 1 when the action equals t % 2: a random policy earns 2
    per episode, the best 4. A few Adam steps must raise the finished-episode return."""
    sets = dict(I=20, B=8, T=8, H=16, lr=0.05)
    folder = build(tmp_path, "reinforce", sets, env="trivial?length=4")
    _, metrics, _ = run_build(folder, "a")
    ret = metric_array(metrics, "ep_ret", 20)
    assert np.all(metric_array(metrics, "episodes", 20) == 16)  # 2 episodes per instance
    assert ret[:3].mean() < 2.6
    assert ret[-3:].mean() >= ret[:3].mean() + 0.5, ret


# ----------------------------------------------------------------------------- n-step TD
def test_td_targets_match_numpy(small):
    out = small("reinforce_td")["out"]
    r, done, v, target = out["r"], out["done"], out["v"].astype(np.float64), out["target"]
    n_i, n_b, n_t = r.shape
    big_n, gamma = SMALL["reinforce_td"]["N"], 0.99
    want = np.zeros((n_i, n_b, n_t))
    for i in range(n_i):
        for b in range(n_b):
            for t in range(n_t):
                n = min(t + big_n, n_t) - t
                acc, alive = 0.0, True
                for k in range(n):
                    acc += gamma**k * r[i, b, t + k]
                    if done[i, b, t + k]:  # the episode ends: no later reward, no bootstrap
                        alive = False
                        break
                if alive:
                    acc += gamma**n * v[i, b, t + n]
                want[i, b, t] = acc
    assert done.any()
    np.testing.assert_allclose(target, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- PPO
def mlp3(p, pre, x):
    h1 = np.tanh(x @ p[pre + "w1"] + p[pre + "b1"])
    h2 = np.tanh(h1 @ p[pre + "w2"] + p[pre + "b2"])
    return h2 @ p[pre + "w3"] + p[pre + "b3"]


def gae(r, done, v, gamma=0.99, lam=0.95):
    """r, done [B, T]; v [B, T+1] (v[:, T] the bootstrap)."""
    adv = np.zeros(r.shape)
    last = 0.0
    for t in range(r.shape[1] - 1, -1, -1):
        nd = 1.0 - done[:, t]
        delta = r[:, t] + gamma * nd * v[:, t + 1] - v[:, t]
        last = delta + gamma * lam * nd * last
        adv[:, t] = last
    return adv


def ppo_loss(p, mb, clip_coef=0.2, ent_coef=0.01, vf_coef=0.5):
    """CleanRL's ppo.py minibatch loss (norm_adv, clip_vloss) in float64."""
    lp = log_softmax(mlp3(p, "pi_", mb["o"]))
    newlogp = lp[np.arange(len(mb["a"])), mb["a"]]
    ratio = np.exp(newlogp - mb["logp"])
    adv = mb["adv"]
    adv = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    pg = np.mean(np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - clip_coef, 1 + clip_coef)))
    newv = mlp3(p, "v_", mb["o"])[:, 0]
    v_clipped = mb["v"] + np.clip(newv - mb["v"], -clip_coef, clip_coef)
    v_loss = 0.5 * np.mean(np.maximum((newv - mb["ret"]) ** 2, (v_clipped - mb["ret"]) ** 2))
    entropy = np.mean(-np.sum(np.exp(lp) * lp, -1))
    return pg - ent_coef * entropy + vf_coef * v_loss, np.mean((ratio - 1) - np.log(ratio))


def test_ppo_minibatches_cover_the_batch_once_per_epoch(small):
    out = small("ppo")["out"]
    sz = SMALL["ppo"]
    n, mb, epochs = sz["B"] * sz["T"], sz["MB"], sz["EPOCHS"]
    idx, perm = out["idx"], out["perm"]
    assert idx.shape == (sz["I"] * epochs * mb, n // mb)
    assert perm.shape == (sz["I"] * epochs, n)
    for e in range(sz["I"] * epochs):
        epoch = idx[e * mb : (e + 1) * mb].reshape(-1)
        np.testing.assert_array_equal(np.sort(epoch), np.arange(n), err_msg=f"epoch {e}")
        np.testing.assert_array_equal(epoch, perm[e])
    # the epochs are shuffled differently
    assert len({tuple(p) for p in perm}) == len(perm)


def test_ppo_gae_loss_and_gradient_match_numpy(small):
    out = small("ppo")["out"]
    sz = SMALL["ppo"]
    n_i, n_b, n_t, mb = sz["I"], sz["B"], sz["T"], sz["MB"]
    k_steps = sz["EPOCHS"] * mb
    for i in range(n_i):
        p0 = fields(out, "net", i * k_steps)  # the rollout's parameters
        o = out["o"][i].astype(np.float64)  # [B, T+1, obs]
        v = mlp3(p0, "v_", o)[..., 0]
        np.testing.assert_allclose(out["v"][i], v, rtol=1e-5, atol=1e-5)
        adv = gae(out["r"][i].astype(np.float64), out["done"][i], v)
        np.testing.assert_allclose(out["adv"][i], adv, rtol=1e-4, atol=1e-4)
        logp = log_softmax(mlp3(p0, "pi_", o[:, :-1]))
        logp = np.take_along_axis(logp, out["a"][i][..., None], -1)[..., 0]
        flat = dict(
            o=o[:, :-1].reshape(n_b * n_t, -1),
            a=out["a"][i].reshape(-1),
            logp=logp.reshape(-1),
            adv=adv.reshape(-1),
            ret=(adv + v[:, :-1]).reshape(-1),
            v=v[:, :-1].reshape(-1),
        )
        for k in range(k_steps):
            j = i * k_steps + k
            mbatch = {key: val[out["idx"][j]] for key, val in flat.items()}
            p = fields(out, "net", j)
            loss, kl = ppo_loss(p, mbatch)
            np.testing.assert_allclose(out["loss"][j], loss, rtol=1e-4, atol=1e-5,
                                       err_msg=f"loss[{j}]")  # fmt: skip
            np.testing.assert_allclose(out["approx_kl"][j], kl, atol=1e-6)
            if k == 0:  # the first step of an iteration uses the rollout's parameters
                assert abs(out["approx_kl"][j]) < 1e-6
            if k in (0, k_steps - 1):
                want = finite_diff(lambda q, mb=mbatch: ppo_loss(q, mb)[0], p)
                assert_grad_close(fields(out, "graw", j), want, f"ppo grad at j={j}")


# ----------------------------------------------------------------------------- RNN
def rnn_loss(p, x, a, done, adv):
    """x [B, T, obs], a [B, T], done [B, T], adv [B, T]: -mean(logp * adv) of the Elman
    policy whose state is zeroed at each episode start."""
    n_b, n_t = a.shape
    h = np.zeros((n_b, p["wh"].shape[0]))
    logp = np.zeros((n_b, n_t))
    for t in range(n_t):
        if t > 0:
            h = h * (1.0 - done[:, t - 1])[:, None]
        h = np.tanh(h @ p["wh"] + x[:, t] @ p["wx"] + p["bh"])
        lp = log_softmax(h @ p["wo"] + p["bo"])
        logp[:, t] = lp[np.arange(n_b), a[:, t]]
    return -np.mean(logp * adv)


def test_rnn_bptt_gradient_matches_finite_differences(small):
    out = small("rnn_reinforce")["out"]
    mask = (np.arange(out["o"].shape[-1]) % 2 == 0).astype(np.float64)  # partial = true
    assert out["done"].any()  # the state resets inside the rollout
    for i in range(SMALL["rnn_reinforce"]["I"]):
        x = out["o"][i, :, :-1].astype(np.float64) * mask
        a, done = out["a"][i], out["done"][i]
        g = mc_returns(out["r"][i].astype(np.float64), done, 0.99)
        adv = g - g.mean()
        p = fields(out, "net", i)
        np.testing.assert_allclose(out["loss"][i], rnn_loss(p, x, a, done, adv), rtol=1e-4,
                                   atol=1e-5)  # fmt: skip
        want = finite_diff(lambda q, x=x, a=a, d=done, adv=adv: rnn_loss(q, x, a, d, adv), p)
        # the recurrent weights get a gradient only through the recurrence
        assert np.abs(want["wh"]).max() > 1e-4
        assert_grad_close(fields(out, "gnet", i), want, f"rnn grad at i={i}")
