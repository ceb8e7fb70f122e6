"""``timerlc run FILE.rtl`` keeps its build (``timerlc.buildcache``): the same program run
again loads it instead of compiling, and anything the compile read that changed (the text,
an option, an environment file, timerlc itself) makes another; an entry that does not load
is compiled again, never run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rtl_helpers import cli, src
from test_rtl_envs import COUNTER, USER

from timerlc import buildcache
from timerlc import cli as timerlc_cli

# (test_rtl_envs's program of its environment file walk.rtl, with a config and a metric)
PROGRAM = USER.replace("T = 30", "T = 30, k = 2").replace(
    "out o, r, d", "ret = mean(r[0:B, 0:T]) * f32(k)\nmetric ret"
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The cache on, in a folder of the test's; counts the compiles (``cli._compile``)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(buildcache.ENV, "1")
    compiles = []
    real = timerlc_cli._compile

    def counted(*args, **kwargs):
        compiles.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(timerlc_cli, "_compile", counted)
    (tmp_path / "walk.rtl").write_text(src(COUNTER))
    prog = tmp_path / "p.rtl"
    prog.write_text(src(PROGRAM))
    return tmp_path, prog, compiles


def metrics(tmp_path, prog, *options) -> list:
    out = tmp_path / "m.jsonl"
    got = cli("run", prog, "--no-progress", "--metrics", out, *options)
    assert got.exit_code == 0, got.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def entries(tmp_path) -> list:
    folder = tmp_path / "xdg" / "timerlc" / "builds"
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_a_program_run_again_loads_its_build(cache):
    tmp_path, prog, compiles = cache
    first = metrics(tmp_path, prog)
    assert compiles == ["cpu"] and len(entries(tmp_path)) == 1
    (entry,) = entries(tmp_path)
    kernels = tmp_path / "xdg" / "timerlc" / "builds" / entry / "kernels"
    assert list(kernels.glob("cpu-*.o"))  # (the machine code, kept with the build)
    assert metrics(tmp_path, prog) == first and compiles == ["cpu"]  # (no compile)
    assert metrics(tmp_path, prog, "--seed", "3") and compiles == ["cpu"] * 2
    assert metrics(tmp_path, prog, "--set", "k=5") and compiles == ["cpu"] * 3
    assert metrics(tmp_path, prog, "--backend", "reference")  # (never kept)
    assert compiles == ["cpu"] * 3 + ["reference"] and len(entries(tmp_path)) == 3


def test_a_change_of_what_the_compile_read_compiles_again(cache, monkeypatch):
    tmp_path, prog, compiles = cache
    first = metrics(tmp_path, prog)
    prog.write_text(src(PROGRAM.replace("f32(k)", "f32(k) + 1.0")))
    assert metrics(tmp_path, prog) != first and len(compiles) == 2
    prog.write_text(src(PROGRAM))
    assert metrics(tmp_path, prog) == first and len(compiles) == 2  # (the first is kept)
    env = tmp_path / "walk.rtl"
    env.write_text(env.read_text() + "\n")  # (the environment file: read by the compile)
    assert metrics(tmp_path, prog) == first and len(compiles) == 3
    assert metrics(tmp_path, prog) == first and len(compiles) == 3
    monkeypatch.setattr(buildcache, "fingerprint", lambda: "another timerlc")
    assert metrics(tmp_path, prog) == first and len(compiles) == 4


def test_a_build_that_does_not_load_is_compiled_again(cache):
    tmp_path, prog, compiles = cache
    first = metrics(tmp_path, prog)
    (entry,) = entries(tmp_path)
    folder = tmp_path / "xdg" / "timerlc" / "builds" / entry
    ll = folder / "kernels" / "cpu.ll"
    ll.write_text(ll.read_text().replace("define", "define ", 1))  # (not the plan's hash)
    assert metrics(tmp_path, prog) == first and len(compiles) == 2
    (folder / "plan.json").write_text("{")
    assert metrics(tmp_path, prog) == first and len(compiles) == 3
    (folder / "deps.json").write_text('{"files": 3}')
    assert metrics(tmp_path, prog) == first and len(compiles) == 4
    assert metrics(tmp_path, prog) == first and len(compiles) == 4


def test_a_user_plugin_s_program_is_not_kept_and_the_cache_keeps_the_newest(cache, monkeypatch):
    tmp_path, prog, compiles = cache
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # (tests/env_plugins.py)
    plugin = "E=env_plugins:make_counter?scale=0.5&every=4"  # (2 actions: a % 2)
    counter = tmp_path / "c.rtl"
    counter.write_text(src(PROGRAM.replace("E.step(a[b, t])", "E.step(a[b, t] % 2)")))
    for _ in range(2):
        assert metrics(tmp_path, counter, "--env", plugin)
    assert len(compiles) == 2 and entries(tmp_path) == []
    monkeypatch.setattr(buildcache, "KEPT", 2)
    for k in (1, 2, 3):
        metrics(tmp_path, prog, "--set", f"k={k}")
    assert len(entries(tmp_path)) == 2
    metrics(tmp_path, prog, "--set", "k=3")  # (kept: the newest two)
    assert len(compiles) == 5
    monkeypatch.setenv(buildcache.ENV, "0")
    metrics(tmp_path, prog, "--set", "k=3")
    assert len(compiles) == 6
