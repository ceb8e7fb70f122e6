"""The example programs of programs/*.rtl, checked against independent NumPy code.

For every program:
  * ``timerlc check`` accepts it silently;
  * a reference run (at its default sizes and at small ``--set`` sizes) gives the
    ``out`` tensors that plain NumPy, written here from the program's math and not
    from timerlc, computes;
  * a CLI run writes the ``--outputs`` npz and the ``--metrics`` csv / jsonl, whose
    rows are the metric values, one per point;
  * the different forms of one quantity in the program (a recurrence and its closed
    form, a gather and its one-hot form, ...) agree.

Expected values are computed in float64 and compared with float32 tolerances.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from click.testing import CliRunner

from timerlc.cli import cli

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
RTOL, ATOL = 2e-5, 2e-5  # float32 arithmetic against float64 expectations


# ----------------------------------------------------------------------------- helpers
def run_cli(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result


def run_program(tmp_path: Path, name: str, sets: dict, metrics: str | None = None):
    """Run programs/NAME.rtl on the reference backend; return (outputs, metrics path)."""
    out = tmp_path / f"{name}.npz"
    args = [
        "run",
        str(PROGRAMS / f"{name}.rtl"),
        "--backend",
        "reference",
        "--no-progress",
        "--outputs",
        str(out),
    ]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    mpath = None
    if metrics:
        mpath = tmp_path / f"{name}.{metrics}"
        args += ["--metrics", str(mpath)]
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    with np.load(out) as data:
        arrays = {k: data[k] for k in data.files}
    return arrays, mpath


def close(actual, expected, rtol=RTOL, atol=ATOL, what=""):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(
        actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol, err_msg=what
    )


def arange_grid(n, shape):
    return np.arange(n, dtype=np.float64).reshape(shape)


# ----------------------------------------------------------------------------- expectations
# Each function takes the sizes (defaults updated with the overrides) and returns
# (outputs, metrics): outputs maps every `out` name to its expected array;
# metrics maps every metric name to {point: value}, a point being a dict of dims.


def expect_cumsum(c):
    T, I, freq = c["T"], c["I"], c["freq"]
    P = c.get("P", T // 4)
    t = np.arange(T)
    x = np.sin(t * freq) + 0.1 * (t % 3)
    c_rec = np.zeros(T)
    for k in range(T):
        c_rec[k] = x[k] + (c_rec[k - 1] if k else 0.0)
    c_win = np.array([x[: k + 1].sum() for k in range(T)])
    y = np.cos(0.5 * np.arange(I)[:, None] + t[None, :] * freq)
    acc = np.zeros((I, T))
    seg = np.zeros((I, T))
    for i in range(I):
        run = 0.0
        segrun = 0.0
        for k in range(T):
            run += y[i, k]
            segrun = y[i, k] if k % P == 0 else segrun + y[i, k]
            acc[i, k] = run
            seg[i, k] = segrun
    total = y.sum(axis=1)
    outs = dict(
        x=x,
        c_rec=c_rec,
        c_win=c_win,
        c_scan=c_win,
        c_all=np.cumsum(x),
        y=y,
        acc=acc,
        acc_all=np.cumsum(y, axis=1),
        seg=seg,
        total=total,
    )
    metrics = {"total": {(("i", i),): total[i] for i in range(I)}, "gap": {(): 0.0}}
    return outs, metrics


def expect_returns(c):
    I, B, T, gamma, lam, N, period = (c[k] for k in ("I", "B", "T", "gamma", "lam", "N", "period"))
    i, b, t = np.meshgrid(np.arange(I), np.arange(B), np.arange(T), indexing="ij")
    r = np.cos(0.7 * t + b) + 0.1 * i
    done = (t + 2 * b + i) % period == period - 1
    v = 0.5 * np.sin(0.3 * (t + b))
    nd = 1.0 - done

    # loops over (i, b) and backward over t: written as plainly as possible
    g = np.zeros_like(r)
    g_nd = np.zeros_like(r)
    adv = np.zeros_like(r)
    for ii in range(I):
        for bb in range(B):
            for k in range(T - 1, -1, -1):
                last = k == T - 1
                g[ii, bb, k] = r[ii, bb, k] + (
                    0 if last else gamma * nd[ii, bb, k] * g[ii, bb, k + 1]
                )
                g_nd[ii, bb, k] = r[ii, bb, k] + (0 if last else gamma * g_nd[ii, bb, k + 1])
                v_next = 0.0 if last else v[ii, bb, k + 1]
                delta = (
                    r[ii, bb, k] + (0 if last else gamma * nd[ii, bb, k] * v_next) - v[ii, bb, k]
                )
                adv[ii, bb, k] = delta + (
                    0 if last else gamma * lam * nd[ii, bb, k] * adv[ii, bb, k + 1]
                )
    # n-step returns as explicit sums
    nstep = np.zeros_like(r)
    for k in range(T):
        hi = min(k + N, T)
        disc = gamma ** np.arange(hi - k)
        nstep[..., k] = (r[..., k:hi] * disc).sum(-1)
        if k + N < T:
            nstep[..., k] += gamma**N * v[..., k + N]
    ret = g[:, :, 0].mean(axis=1)
    adv_mean = adv.mean(axis=(1, 2))
    episodes = done.sum(axis=(1, 2)).astype(np.float64)
    outs = dict(
        r=r, done=done, v=v, g=g, g_nd=g_nd, g_ds=g_nd, nstep=nstep, nstep_w=nstep, adv=adv, ret=ret
    )
    metrics = {
        "ret": {(("i", k),): ret[k] for k in range(I)},
        "adv_mean": {(("i", k),): adv_mean[k] for k in range(I)},
        "episodes": {(("i", k),): episodes[k] for k in range(I)},
    }
    return outs, metrics


def expect_window_mean(c):
    B, T, W = c["B"], c["T"], c["W"]
    alpha = 2.0 / (W + 1)
    b, t = np.meshgrid(np.arange(B), np.arange(T), indexing="ij")
    x = 0.05 * t + np.sin(0.2 * t + b) + 0.3 * np.cos(2.3 * (t * (b + 1)))
    mean_w = np.zeros((B, T))
    max_w = np.zeros((B, T))
    min_w = np.zeros((B, T))
    full_mean = np.zeros((B, T))
    full_std = np.zeros((B, T))
    wma = np.zeros((B, T))
    weights = np.arange(1, W + 1) / (W * (W + 1) // 2)
    for k in range(T):
        w = x[:, max(0, k - W + 1) : k + 1]
        mean_w[:, k], max_w[:, k], min_w[:, k] = w.mean(1), w.max(1), w.min(1)
        if k >= W - 1:
            full = x[:, k - W + 1 : k + 1]
            full_mean[:, k] = full.mean(1)
            full_std[:, k] = full.std(1)
            wma[:, k] = (full * weights).sum(1)
    ema = np.zeros((B, T))
    ema[:, 0] = x[:, 0]
    for k in range(1, T):
        ema[:, k] = alpha * x[:, k] + (1 - alpha) * ema[:, k - 1]
    ema_err = np.abs(x - ema).mean(1)
    mean_err = np.abs(x - mean_w).mean(1)
    outs = dict(
        x=x,
        mean_w=mean_w,
        max_w=max_w,
        min_w=min_w,
        range_w=max_w - min_w,
        ema=ema,
        full_mean=full_mean,
        full_std=full_std,
        wma=wma,
        weights=weights,
    )
    metrics = {
        "ema_err": {(("b", k),): ema_err[k] for k in range(B)},
        "mean_err": {(("b", k),): mean_err[k] for k in range(B)},
        "last_ema": {(("b", k),): ema[k, T - 1] for k in range(B)},
    }
    return outs, metrics


def expect_rnn(c):
    B, T, D, H, O, scale = (c[k] for k in ("B", "T", "D", "H", "O", "scale"))
    wx = scale * 0.4 * np.sin(arange_grid(D * H, (D, H)) * 0.7 + 0.5)
    wh = scale * 0.3 * np.cos(arange_grid(H * H, (H, H)) * 1.3) / np.sqrt(H)
    bias = np.full(H, 0.05)
    wo = scale * 0.5 * np.sin(arange_grid(H * O, (H, O)) * 0.9 + 1.0)
    bo = np.zeros(O)
    # inputs and targets live on t = 1..T (index 0 is outside their domain: 0)
    x = np.zeros((B, T + 1, D))
    target = np.zeros((B, T + 1, O))
    h = np.zeros((B, T + 1, H))
    y = np.zeros((B, T + 1, O))
    for bb in range(B):
        for s in range(1, T + 1):
            x[bb, s] = np.sin(0.25 * (s - 1) * (1.0 + np.arange(D)) + bb)
            target[bb, s] = np.cos(0.25 * (s - 1) + bb * (1.0 + np.arange(O)))
            h[bb, s] = np.tanh(h[bb, s - 1] @ wh + x[bb, s] @ wx + bias)
            y[bb, s] = h[bb, s] @ wo + bo
    sq = (y[:, 1:] - target[:, 1:]) ** 2
    step_err = sq.mean(axis=(0, 2))
    loss = sq.mean()
    h_norm = np.sqrt((h[:, T] ** 2).sum(-1))
    outs = {
        "h": h,
        "y": y,
        "target": target,
        "x": x,
        "net.wx": wx,
        "net.wh": wh,
        "net.b": bias,
        "net.wo": wo,
        "net.bo": bo,
    }
    metrics = {
        "loss": {(): loss},
        "step_err": {(("t", s),): step_err[s - 1] for s in range(1, T + 1)},
        "h_norm": {(("b", k),): h_norm[k] for k in range(B)},
    }
    return outs, metrics


def _log_softmax(z, axis=-1):
    m = z.max(axis=axis, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=axis, keepdims=True))


def expect_attention(c):
    B, S, E, A, temp = (c[k] for k in ("B", "S", "E", "A", "temp"))
    wq = 0.9 * np.sin(arange_grid(E * E, (E, E)) * 0.61)
    wk = 0.9 * np.cos(arange_grid(E * E, (E, E)) * 0.43)
    wv = 0.3 * np.sin(arange_grid(E * E, (E, E)) * 0.29 + 1.0)
    wout = 1.5 * np.cos(arange_grid(E * A, (E, A)) * 0.77)
    bout = 0.01 * np.arange(A)
    emb = np.stack([np.sin(arange_grid(S * E, (S, E)) * (0.37 + 0.2 * b) + b) for b in range(B)])
    q, k, v = emb @ wq, emb @ wk, emb @ wv
    scores = q @ np.swapaxes(k, 1, 2) / np.sqrt(E)
    causal = np.tril(np.ones((S, S), bool))
    scores = np.where(causal, scores, -np.inf)
    att = np.exp(scores - scores.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    ctx = att @ v
    logits = (ctx[:, S - 1] @ wout + bout) / temp
    lsm = _log_softmax(logits)
    probs = np.exp(lsm)
    lse = np.log(np.exp(logits).sum(-1))
    ent = -(probs * lsm).sum(-1)
    a = logits.argmax(-1)
    logp = lsm[np.arange(B), a]
    outs = dict(
        emb=emb,
        q=q,
        k=k,
        v=v,
        att=att,
        ctx=ctx,
        q_all=q,
        logits=logits,
        probs=probs,
        lse=lse,
        ent=ent,
        a=a,
        logp=logp,
        logp_oh=logp,
        all_logp=logp,
        greedy=a,
        p_first=probs[:, 0],
    )
    metrics = {"mean_logp": {(): logp.mean()}, "mean_ent": {(): ent.mean()}}
    return outs, metrics


@dataclass
class Program:
    name: str
    defaults: dict  # the program's config defaults (the sizes the expectation needs)
    small: dict  # --set overrides for a quick run
    expect: Callable


PROGRAM_LIST = [
    Program("cumsum", dict(T=32, I=4, freq=0.3), dict(T=10, I=3), expect_cumsum),
    Program(
        "returns",
        dict(I=3, B=4, T=16, gamma=0.9, lam=0.95, N=3, period=7),
        dict(I=2, B=3, T=9, gamma=0.8, N=4, period=4),
        expect_returns,
    ),
    Program("window_mean", dict(B=3, T=40, W=5), dict(B=2, T=11, W=3), expect_window_mean),
    Program(
        "rnn",
        dict(B=2, T=12, D=3, H=8, O=2, scale=1.0),
        dict(B=3, T=5, D=2, H=4, O=3, scale=1.5),
        expect_rnn,
    ),
    Program(
        "attention",
        dict(B=4, S=6, E=8, A=5, temp=0.1),
        dict(B=3, S=4, E=5, A=3, temp=0.5),
        expect_attention,
    ),
]
BY_NAME = {p.name: p for p in PROGRAM_LIST}
NAMES = [p.name for p in PROGRAM_LIST]


def sizes(p: Program, sets: dict) -> dict:
    return {**p.defaults, **sets}


def compare_outputs(arrays: dict, expected: dict, program: str):
    assert set(arrays) == set(expected), (
        f"{program}: outputs {sorted(arrays)} != {sorted(expected)}"
    )
    for name, want in expected.items():
        got = arrays[name]
        if want.dtype == bool or np.issubdtype(np.asarray(want).dtype, np.integer):
            assert got.shape == np.shape(want), (
                f"{program}.{name}: shape {got.shape} != {np.shape(want)}"
            )
            np.testing.assert_array_equal(got, want, err_msg=f"{program}.{name}")
        else:
            assert got.dtype == np.float32, f"{program}.{name} is {got.dtype}"
            close(got, want, what=f"{program}.{name}")


# ----------------------------------------------------------------------------- tests
# The RL programs (environments, sampling, training) are tested in test_rl_programs.py.
RL_PROGRAMS = ["ppo", "reinforce", "reinforce_td", "rnn_reinforce"]


def test_every_program_is_tested():
    assert sorted(p.stem for p in PROGRAMS.glob("*.rtl")) == sorted(NAMES + RL_PROGRAMS)


@pytest.mark.parametrize("name", NAMES)
def test_check_is_silent(name):
    result = run_cli("check", str(PROGRAMS / f"{name}.rtl"))
    assert result.exit_code == 0, result.output
    assert result.output == ""


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("which", ["defaults", "small"])
def test_outputs_match_numpy(name, which, tmp_path):
    p = BY_NAME[name]
    sets = {} if which == "defaults" else p.small
    arrays, _ = run_program(tmp_path, name, sets)
    expected, _ = p.expect(sizes(p, sets))
    compare_outputs(arrays, expected, name)


def read_metric_rows(path: Path) -> list[dict]:
    """Rows as {"name", dims..., "value"}; dims a row lacks are absent."""
    rows = []
    if path.suffix == ".jsonl":
        for line in path.read_text().splitlines():
            rows.append(json.loads(line))
        return rows
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames[0] == "name" and reader.fieldnames[-1] == "value", (
            reader.fieldnames
        )
        for row in reader:
            out = {"name": row["name"], "value": row["value"]}
            for d in reader.fieldnames[1:-1]:
                if row[d] != "":
                    out[d] = int(row[d])
            rows.append(out)
    return rows


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_cli_writes_outputs_and_metrics(name, fmt, tmp_path):
    p = BY_NAME[name]
    arrays, mpath = run_program(tmp_path, name, p.small, metrics=fmt)
    expected, metrics = p.expect(sizes(p, p.small))
    compare_outputs(arrays, expected, name)

    rows = read_metric_rows(mpath)
    seen: dict[str, dict] = {m: {} for m in metrics}
    for row in rows:
        assert row["name"] in metrics, f"unexpected metric row {row}"
        point = tuple(sorted((k, v) for k, v in row.items() if k not in ("name", "value")))
        assert point not in seen[row["name"]], f"metric point reported twice: {row}"
        seen[row["name"]][point] = float(row["value"])
    for m, want in metrics.items():
        assert set(seen[m]) == set(want), (
            f"{name}: metric {m} points {sorted(seen[m])} != {sorted(want)}"
        )
        for point, value in want.items():
            close(
                seen[m][point],
                value,
                rtol=1e-5,
                atol=1e-5,
                what=f"{name}: metric {m} at {dict(point)}",
            )
    # a metric that is also an output reports the values saved in the npz
    for m in metrics:
        if m in arrays:
            for point, value in seen[m].items():
                idx = tuple(v for _, v in point)
                close(
                    value,
                    arrays[m][idx],
                    rtol=1e-6,
                    atol=1e-7,
                    what=f"{name}: metric {m} vs output",
                )


# ------------------------------------------------------------ the forms of one quantity agree
@pytest.mark.parametrize("sets", [{}, {"T": 23, "I": 2, "P": 5}])
def test_cumsum_forms_agree(sets, tmp_path):
    o, _ = run_program(tmp_path, "cumsum", sets)
    tol = dict(rtol=1e-5, atol=1e-5)
    close(o["c_win"], o["c_rec"], what="sum(x[0:t+1]) vs recurrence", **tol)
    close(o["c_scan"], o["c_rec"], what="cumsum(x)[t] vs recurrence", **tol)
    close(o["c_all"], o["c_rec"], what="cumsum(x[0:T]) vs recurrence", **tol)
    close(o["acc_all"], o["acc"], what="cumsum(y, 1) vs recurrence over (i, t)", **tol)
    close(o["total"], o["acc"][:, -1], what="sum(y[i, 0:T]) vs acc[i, T-1]", **tol)
    # the segmented sum equals the running sum minus its value just before the segment
    P = sets.get("P", o["x"].shape[0] // 4)
    starts = (np.arange(o["x"].shape[0]) // P) * P
    before = np.where(starts > 0, o["acc"][:, np.maximum(starts - 1, 0)], 0.0)
    close(o["seg"], o["acc"] - before, rtol=1e-4, atol=1e-4, what="segmented sum vs running sum")


@pytest.mark.parametrize("sets", [{}, {"T": 30, "gamma": 0.99, "N": 7, "period": 1000}])
def test_returns_forms_agree(sets, tmp_path):
    o, _ = run_program(tmp_path, "returns", sets)
    close(o["g_ds"], o["g_nd"], rtol=1e-5, atol=1e-5, what="discounted_sum vs backward recurrence")
    close(o["nstep_w"], o["nstep"], rtol=1e-5, atol=1e-5, what="n-step: min() window vs when-split")
    if not o["done"].any():  # no episode ends: the masked recurrence is the plain one
        close(o["g"], o["g_ds"], rtol=1e-5, atol=1e-5, what="masked recurrence without dones")
    else:
        # the masked return is the discounted sum up to (and including) the episode end
        gamma = sets.get("gamma", 0.9)
        r, done = o["r"].astype(np.float64), o["done"]
        T = r.shape[-1]
        for idx in np.ndindex(r.shape[:-1]):
            for t in range(T):
                ends = np.flatnonzero(done[idx][t:])
                stop = t + ends[0] + 1 if len(ends) else T
                want = (r[idx][t:stop] * gamma ** np.arange(stop - t)).sum()
                close(o["g"][idx][t], want, rtol=1e-5, atol=1e-5, what=f"g{idx + (t,)}")
    # with N = T-1, only t = 0 bootstraps (from v[T-1], in place of r[T-1]); every
    # later window reaches the end and the n-step return is the full discounted sum.
    # (N = T would leave nstep_w's `when t + N < T` equation empty: an error.)
    T, gamma = sets.get("T", 16), sets.get("gamma", 0.9)
    o2, _ = run_program(tmp_path, "returns", {**sets, "N": T - 1})
    close(
        o2["nstep"][..., 1:],
        o2["g_ds"][..., 1:],
        rtol=1e-5,
        atol=1e-5,
        what="n-step with N = T-1 vs full return",
    )
    boot = o2["g_ds"][..., 0] + gamma ** (T - 1) * (o2["v"][..., T - 1] - o2["r"][..., T - 1])
    close(o2["nstep"][..., 0], boot, rtol=1e-5, atol=1e-5, what="n-step with N = T-1 at t = 0")


def test_window_forms_agree(tmp_path):
    o, _ = run_program(tmp_path, "window_mean", {"W": 4})
    W = 4
    # where the window is full, the growing-window mean is the full-window mean
    close(
        o["full_mean"][:, W - 1 :],
        o["mean_w"][:, W - 1 :],
        rtol=1e-5,
        atol=1e-5,
        what="full vs growing window",
    )
    assert np.all(o["full_mean"][:, : W - 1] == 0) and np.all(o["wma"][:, : W - 1] == 0)
    assert np.all(o["min_w"] <= o["mean_w"] + 1e-6) and np.all(o["mean_w"] <= o["max_w"] + 1e-6)
    # W = 1: every window is the point itself
    o1, _ = run_program(tmp_path, "window_mean", {"W": 1, "T": 7})
    for k in ("mean_w", "max_w", "min_w", "full_mean", "wma"):
        close(o1[k], o1["x"], rtol=1e-6, atol=1e-6, what=f"{k} with W = 1")
    close(o1["ema"], o1["x"], rtol=1e-6, atol=1e-6, what="ema with alpha = 1")
    close(o1["full_std"], np.zeros_like(o1["x"]), atol=1e-6, what="std of one point")


def test_rnn_forms_agree(tmp_path):
    o, mpath = run_program(tmp_path, "rnn", {"T": 6}, metrics="jsonl")
    rows = [json.loads(line) for line in mpath.read_text().splitlines()]
    step = {r["t"]: r["value"] for r in rows if r["name"] == "step_err"}
    (loss,) = [r["value"] for r in rows if r["name"] == "loss"]
    close(
        np.mean([step[t] for t in sorted(step)]),
        loss,
        rtol=1e-5,
        atol=1e-6,
        what="mean of step errors vs loss",
    )
    assert np.all(o["h"][:, 0] == 0) and np.all(np.abs(o["h"]) < 1)
    # a zero gain leaves only the biases: h = tanh(b) at every step, y = 0
    o0, _ = run_program(tmp_path, "rnn", {"T": 3, "scale": 0.0})
    close(
        o0["h"][:, 1:],
        np.full_like(o0["h"][:, 1:], np.tanh(0.05)),
        rtol=1e-6,
        atol=1e-7,
        what="h with scale 0",
    )
    close(o0["y"], np.zeros_like(o0["y"]), atol=1e-7, what="y with scale 0")


def test_attention_forms_agree(tmp_path):
    o, _ = run_program(tmp_path, "attention", {})
    close(o["logp_oh"], o["logp"], rtol=1e-6, atol=1e-6, what="one_hot form vs gather")
    close(
        o["all_logp"], o["logp"], rtol=1e-6, atol=1e-6, what="take_along over the batch vs gather"
    )
    np.testing.assert_array_equal(o["greedy"], o["a"])
    close(o["q_all"], o["q"], rtol=1e-6, atol=1e-6, what="batched @ vs per-point @")
    close(
        o["att"].sum(-1), np.ones(o["att"].shape[:-1]), rtol=1e-5, atol=1e-5, what="attention rows"
    )
    assert np.all(np.triu(o["att"], 1) == 0), "causal mask"
    close(o["probs"].sum(-1), np.ones(o["probs"].shape[0]), rtol=1e-5, atol=1e-5, what="probs")
    close(
        o["logp"],
        o["logits"][np.arange(len(o["a"])), o["a"]] - o["lse"],
        rtol=1e-5,
        atol=1e-5,
        what="logp = l[a] - lse",
    )
    assert np.all(o["ent"] >= 0) and np.all(o["ent"] <= np.log(o["logits"].shape[1]) + 1e-5)
