#!/usr/bin/env python3
"""Fuzz the timerlc CLI: every input must give exit 0, 1, 2 or 3, never a traceback, an
internal error or a hang.

Inputs are seeded mutants of ``programs/*.rtl`` and ``tests/programs/*.rtl``: tokens and
lines deleted, duplicated, swapped or replaced (numbers by extreme values, names by other
names, keywords and operators of the grammar inserted), truncations, stray bytes and
unicode, and deep nesting (parentheses, ``not`` chains, long sums, lists, ``when``
chains, long lines). Each is checked (``timerlc check``); some are compiled, and a few run
with their size configs set to 2. The CLI runs in this process (click's test runner) with
a time limit per case.

    scripts/fuzz.py --n 10000 --seed 1 --out fuzz-failures/
    scripts/fuzz.py --n 2000 --backend cuda      # the compiles make CUDA kernels (no GPU)
    scripts/fuzz.py --n 2000 --threads           # the runs' loops on threads, a few a chunk

prints a summary; each failing input and its output go to ``--out``. Exit status 1 when
any case failed. tests/test_fuzz.py runs a bounded number of cases in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import resource
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDS = sorted(ROOT.glob("programs/*.rtl")) + sorted(ROOT.glob("tests/programs/*.rtl"))

TOKEN = re.compile(
    r'"[^"\n]*"|#[^\n]*|\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)?'
    r"|[A-Za-z_]\w*|//|<=|>=|==|!=|\*\*|\s+|\S"
)
NUMBERS = ["0", "-1", "1", "2147483648", "4294967296", "9" * 30, "1e99999", "1e-99999",
           "100000", "0.0", "-0.0", "3.5", "1e308", "65536", "7"]  # fmt: skip
INSERTS = ["config", "dim", "env", "batch", "params", "def", "when", "and", "or", "not",
           "out", "metric", "true", "false", "(", ")", "[", "]", "{", "}", ",", ":", ";",
           "=", "+", "-", "*", "/", "//", "%", "**", "<", "<=", "==", "!=", ".", "\n",
           "grad", "adam", "sum", "mean", "stop_grad", "reshape", "f32", "i32", "f64",
           "zeros", "ones", "glorot", "where", "log", "exp", "softmax", "categorical",
           "t", "i", "b", "x", "0:T", "t+1", "t-1", "T", '"cartpole"', '"nope"',
           "E.step", "E.reset()", "E.obs_dim", "\u00e9", "\u2212", "\uff15", "\x00", "\t",
           "#", '"']  # fmt: skip
SIZE_CONFIGS = ("I", "B", "T", "K", "N", "H", "M", "J", "MB", "W", "S", "L", "D")


@dataclass
class Case:
    index: int
    kind: str  # the mutation
    text: str
    command: str  # check, compile or run


@dataclass
class Outcome:
    case: Case
    status: int | None
    output: str
    failure: str | None  # why the case failed, None if it passed
    seconds: float


class Hang(BaseException):  # (not an Exception: the CLI reports those as internal errors)
    pass


def _tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def mutate(text: str, rng: random.Random) -> tuple[str, str]:
    """One mutant of ``text`` and the name of its mutation (one to three mutations)."""
    kinds = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        kind = rng.choice(MUTATIONS)
        text = kind(text, rng)
        kinds.append(kind.__name__.removeprefix("_m_"))
    return text, "+".join(kinds)


def _words(tokens):
    return [k for k, t in enumerate(tokens) if not t.isspace()]


def _m_delete_token(text, rng):
    toks = _tokens(text)
    ws = _words(toks)
    if ws:
        del toks[rng.choice(ws)]
    return "".join(toks)


def _m_duplicate_token(text, rng):
    toks = _tokens(text)
    ws = _words(toks)
    if ws:
        k = rng.choice(ws)
        toks.insert(k, toks[k])
    return "".join(toks)


def _m_swap_tokens(text, rng):
    toks = _tokens(text)
    ws = _words(toks)
    if len(ws) > 1:
        a, b = rng.sample(ws, 2)
        toks[a], toks[b] = toks[b], toks[a]
    return "".join(toks)


def _m_number(text, rng):
    toks = _tokens(text)
    nums = [k for k, t in enumerate(toks) if t[:1].isdigit() or (t[:1] == "." and len(t) > 1)]
    if nums:
        toks[rng.choice(nums)] = rng.choice(NUMBERS)
    return "".join(toks)


def _m_rename(text, rng):
    toks = _tokens(text)
    names = [k for k, t in enumerate(toks) if t[:1].isalpha() or t[:1] == "_"]
    if names:
        pool = [toks[k] for k in names] + ["zz", "_", "seed", "grad", "E", "x" * 200]
        toks[rng.choice(names)] = rng.choice(pool)
    return "".join(toks)


def _m_insert(text, rng):
    toks = _tokens(text)
    toks.insert(rng.randrange(len(toks) + 1), rng.choice(INSERTS))
    return "".join(toks)


def _m_lines(text, rng):
    lines = text.split("\n")
    k = rng.randrange(len(lines))
    op = rng.choice(("delete", "duplicate", "swap", "move"))
    if op == "delete":
        del lines[k]
    elif op == "duplicate":
        lines.insert(k, lines[k])
    elif op == "swap" and len(lines) > 1:
        j = rng.randrange(len(lines))
        lines[k], lines[j] = lines[j], lines[k]
    else:
        lines.insert(rng.randrange(len(lines) + 1), lines.pop(k))
    return "\n".join(lines)


def _m_truncate(text, rng):
    return text[: rng.randrange(len(text) + 1)]


def _m_bytes(text, rng):
    k = rng.randrange(len(text) + 1)
    junk = "".join(chr(rng.choice((0, 7, 0xA0, 0x2028, 0xFEFF, 0xD7FF, rng.randrange(32, 0x3000))))
                   for _ in range(rng.randrange(1, 4)))  # fmt: skip
    return text[:k] + junk + text[k:]


def _rhs_lines(text):
    lines = text.split("\n")
    eqs = [k for k, ln in enumerate(lines) if re.match(r"\s*\w+(\[[^\]]*\])?\s*=", ln)]
    return lines, eqs


def _m_deep(text, rng):
    """An equation's right-hand side nested deeply in one of several ways."""
    lines, eqs = _rhs_lines(text)
    if not eqs:
        return text
    k = rng.choice(eqs)
    lhs, _, rhs = lines[k].partition("=")
    rhs = rhs.split("#")[0].strip() or "1.0"
    n = rng.choice((50, 300, 1000, 2500, 5000))
    form = rng.choice(("parens", "not", "sum", "list", "neg", "call"))
    if form == "parens":
        rhs = "(" * n + rhs + ")" * n
    elif form == "not":
        rhs = "not " * n + rhs
    elif form == "sum":
        rhs = " + ".join([rhs] * n)
    elif form == "list":
        rhs = "[" * n + rhs + "]" * n
    elif form == "neg":
        rhs = "-" * n + rhs
    else:
        rhs = "exp(" * n + rhs + ")" * n
    lines[k] = f"{lhs}= {rhs}"
    return "\n".join(lines)


def _m_when_chain(text, rng):
    lines, eqs = _rhs_lines(text)
    if not eqs:
        return text
    k = rng.choice(eqs)
    n = rng.choice((10, 200, 1500))
    conds = " or ".join(f"t == {j}" for j in range(n))
    lines[k] = lines[k].split("#")[0].split(" when ")[0] + f" when {conds}"
    return "\n".join(lines)


def _m_long_config(text, rng):
    n = rng.choice((100, 1000, 3000))
    return f"config zz_long = {' + '.join(['1'] * n)}\n" + text


MUTATIONS = (
    [_m_delete_token] * 4
    + [_m_duplicate_token] * 2
    + [_m_swap_tokens] * 2
    + [_m_number] * 4
    + [_m_rename] * 3
    + [_m_insert] * 4
    + [_m_lines] * 3
    + [_m_truncate, _m_bytes, _m_deep, _m_when_chain, _m_long_config]
)


def cases(n: int, seed: int, compile_every: int = 5, run_every: int = 25):
    """``n`` cases, deterministic for ``seed``."""
    rng = random.Random(seed)
    texts = [p.read_text() for p in SEEDS]
    for k in range(n):
        text, kind = mutate(rng.choice(texts), rng)
        command = "check"
        if k % run_every == run_every - 1:
            command = "run"
        elif k % compile_every == compile_every - 1:
            command = "compile"
        yield Case(k, kind, text, command)


def _small_sets(text: str) -> list[str]:
    declared = set(
        re.findall(r"\b([A-Za-z_]\w*)\s*=", " ".join(re.findall(r"config[^\n]*", text)))
    )
    return [a for name in SIZE_CONFIGS if name in declared for a in ("--set", f"{name}=2")]


@contextlib.contextmanager
def _time_limit(seconds: float):
    def alarm(signum, frame):
        raise Hang()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def _memory_limit(extra_bytes: int):
    """At most ``extra_bytes`` more address space than the process has now (a run that
    asks for more gets a MemoryError, which timerlc reports as exit 3)."""
    try:
        with open("/proc/self/status") as fh:
            size = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("VmSize:"))
        old = resource.getrlimit(resource.RLIMIT_AS)
        limit = size + extra_bytes
        if old[1] != resource.RLIM_INFINITY:
            limit = min(limit, old[1])
        resource.setrlimit(resource.RLIMIT_AS, (limit, old[1]))
    except (OSError, ValueError, StopIteration):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)


def run_case(case: Case, work: Path, timeout: float, backend: str | None = None) -> Outcome:
    from click.testing import CliRunner

    from timerlc.cli import cli

    path = work / f"case{case.index}.rtl"
    path.write_text(case.text, encoding="utf-8", errors="surrogatepass")
    args = [case.command, str(path)]
    if backend and case.command != "check":
        args += ["--backend", backend]
    if case.command == "compile":
        args += ["-o", str(work / f"build{case.index}")]
    elif case.command == "run":
        args += [*_small_sets(case.text), "--no-progress", "--outputs", str(work / "o.npz")]
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:  # click 8.2 keeps stderr apart already
        runner = CliRunner()
    started = time.perf_counter()
    try:
        with _time_limit(timeout), _memory_limit(2 << 30):
            result = runner.invoke(cli, args, catch_exceptions=True)
    except Hang:
        return Outcome(case, None, "", f"no answer within {timeout} s", timeout)
    seconds = time.perf_counter() - started
    output = (result.stdout or "") + (result.stderr or "")
    failure = None
    exc = result.exception
    if isinstance(exc, Hang):
        failure = f"no answer within {timeout} s"
    elif exc is not None and not isinstance(exc, SystemExit):
        failure = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    elif "Traceback (most recent call last)" in output:
        failure = "a traceback was printed"
    elif "timerlc: internal error:" in output:
        failure = next(line for line in output.splitlines() if "internal error:" in line)
    elif result.exit_code not in (0, 1, 2, 3):
        failure = f"exit status {result.exit_code}"
    return Outcome(case, result.exit_code, output, failure, seconds)


def fuzz(
    n: int,
    seed: int,
    timeout: float = 60.0,
    out: Path | None = None,
    progress=None,
    backend: str | None = None,
):
    """Run ``n`` cases (the compiles and runs on ``backend``: None, the default); the
    outcomes."""
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="timerlc-fuzz-") as tmp:
        work = Path(tmp)
        for case in cases(n, seed):
            outcome = run_case(case, work, timeout, backend)
            outcomes.append(outcome)
            if outcome.failure and out is not None:
                out.mkdir(parents=True, exist_ok=True)
                stem = out / f"case{case.index}-{case.command}"
                stem.with_suffix(".rtl").write_text(case.text, errors="surrogatepass")
                stem.with_suffix(".txt").write_text(
                    f"timerlc {case.command} case{case.index}.rtl ({case.kind})\n"
                    f"{outcome.failure}\n--- output ---\n{outcome.output}"
                )
            if progress:
                progress(outcome)
    return outcomes


def summary(outcomes, wall: float) -> str:
    by_status: dict = {}
    for o in outcomes:
        by_status[o.status] = by_status.get(o.status, 0) + 1
    commands: dict = {}
    for o in outcomes:
        commands[o.case.command] = commands.get(o.case.command, 0) + 1
    failed = [o for o in outcomes if o.failure]
    slowest = max(outcomes, key=lambda o: o.seconds, default=None)
    lines = [
        f"{len(outcomes)} cases in {wall:.0f} s "
        f"({', '.join(f'{c} {k}' for k, c in sorted(commands.items()))})",
        "exit status: "
        + ", ".join(
            f"{k if k is not None else 'none'}: {c}"
            for k, c in sorted(by_status.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
        )  # fmt: skip
        + (f"; slowest {slowest.seconds:.1f} s (case {slowest.case.index})" if slowest else ""),
        f"failures: {len(failed)}",
    ]
    for o in failed[:20]:
        head = o.failure.strip().splitlines()[-1] if o.failure.strip() else o.failure
        lines.append(f"  case {o.case.index} ({o.case.command}, {o.case.kind}): {head}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="number of cases (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the mutations (default 0)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case (default 60)")
    ap.add_argument("--out", type=Path, default=None, help="folder for failing inputs")
    ap.add_argument(
        "--backend",
        default=None,
        help="the compiles' and runs' backend (default: the CLI's; cuda compiles the CUDA "
        "kernels without a GPU, cuda-emu runs them on the CPU)",
    )
    ap.add_argument(
        "--threads",
        action="store_true",
        help="the cpu runs hand every parallel loop and reduction to the threads in chunks "
        "of a few iterations, and cut every product but the smallest, on three threads "
        "(cuda_soak.small_chunks)",
    )
    args = ap.parse_args(argv)
    if args.threads:
        sys.path.insert(0, str(ROOT / "scripts"))
        from cuda_soak import small_chunks

        small_chunks()
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    started = time.perf_counter()

    def progress(o):
        if (o.case.index + 1) % 100 == 0:
            print(f"  {o.case.index + 1} cases, {time.perf_counter() - started:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
        if o.failure:
            print(f"  FAILED case {o.case.index} ({o.case.command}, {o.case.kind})",
                  file=sys.stderr, flush=True)  # fmt: skip

    outcomes = fuzz(args.n, args.seed, args.timeout, args.out, progress, args.backend)
    print(summary(outcomes, time.perf_counter() - started))
    return 1 if any(o.failure for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
