"""The builds ``timerlc run FILE.rtl`` keeps, so that running an unchanged program again
does not compile it again (LANGUAGE.md 12: run "compiles if needed").

A build is the plan and its kernel file (and, on the cpu, the machine code the run makes),
kept in the user's cache (``files.user_cache("builds")``, private to the user) under a key:
a hash of what the compile reads (the program's text and path, ``--set``, ``--seed``,
``--env``, the backend, ``--memory-budget``) and of timerlc's own files and the versions of
the packages its compile uses (``fingerprint``: another compiler makes another build). What else the compile read is in
the entry's ``deps.json`` and checked before the entry is used: an environment file
(``FILE.rtl``: its resolved path and the hash of its bytes), gymnasium's version for a
``gym:`` environment. A program whose environment is a plugin of the user's
(``package.module:factory``, an entry point) is not kept: its compile-time attributes
come from code the cache cannot watch.

An entry is loaded as a build folder is (``runtime.plan.load_plan``, ``load_kernels``:
data, each field checked, the kernel file against the plan's hash of it); one that does
not load is removed and the program compiled again. Entries are written whole into a
temporary folder and renamed into place, so two runs at once each see a whole entry or
none; the newest ``KEPT`` are kept. ``TIMERLC_BUILD_CACHE=0`` turns the cache off (the
test suite does, but for the cache's own tests).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from timerlc.files import env_file, user_cache, write_text

KEPT = 32  # the most builds the cache keeps (the most recently used)
ENV = "TIMERLC_BUILD_CACHE"
DEPS = "deps.json"
PLAN = "plan.json"
_SUFFIXES = (".py", ".lark", ".rtl", ".h", ".cc")
_COMPILER_PACKAGES = ("islpy", "sympy", "lark", "numpy")


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip() != "0"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """A hash of timerlc's own files (its code, the grammar, the built-in environments,
    the CUDA emulation's sources), its version and those of the packages the compile uses
    (islpy's schedules, sympy's index forms, lark, NumPy): the compiler that makes a
    build."""
    import timerlc

    root = Path(timerlc.__file__).resolve().parent
    h = hashlib.sha256(f"timerlc {timerlc.__version__}\0".encode())
    files = sorted(
        p
        for p in root.rglob("*")
        if p.suffix in _SUFFIXES and "__pycache__" not in p.parts and p.is_file()
    )
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    grammar = root.parent / "grammar" / "rtl.lark"  # (a checkout's; else the package's copy)
    if grammar.is_file():
        h.update(grammar.read_bytes())
    from importlib import metadata

    for package in _COMPILER_PACKAGES:  # (what the compile's decisions may depend on)
        try:
            h.update(f"{package} {metadata.version(package)}\0".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{package} none\0".encode())
    return h.hexdigest()


def key(path: str, text: str, overrides: dict, envs: dict, backend: str, budget) -> str:
    """The key of the build of program ``text`` at ``path`` with these options."""
    what = {
        "compiler": fingerprint(),
        "path": str(Path(path).resolve()),
        "text": text,
        "overrides": sorted(overrides.items()),
        "envs": sorted(envs.items()),
        "backend": backend,
        "budget": budget,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _folder() -> Path | None:
    return user_cache("builds")


def lookup(k: str):
    """The plan and kernel text of the build kept under key ``k``, or None (none kept, or
    one whose dependencies changed or that does not load: then removed)."""
    folder = _folder()
    if folder is None:
        return None
    entry = folder / k
    if not (entry / DEPS).is_file():
        return None
    from timerlc.runtime.plan import PlanError, load_kernels, load_plan

    try:
        deps = json.loads((entry / DEPS).read_text(encoding="utf-8"))
        if not _holds(deps):
            _remove(entry)
            return None
        plan = load_plan(entry / PLAN)
        code = load_kernels(entry, plan)
    except (OSError, ValueError, PlanError):
        _remove(entry)
        return None
    try:
        os.utime(entry)  # (the most recently used: the last to go)
    except OSError:
        pass
    return entry, plan, code


def store(k: str, plan, code: str | None, source, envs: dict):
    """Keep the build of ``plan`` (its kernel file ``code``), compiled from ``source`` with
    the environments ``envs`` bound (``--env``), under key ``k``; the folder it is kept in,
    where the run then keeps its machine code, or None (not kept: no cache folder, an
    environment plugin of the user's, a folder that could not be written)."""
    folder = _folder()
    if folder is None or code is None:
        return None
    from timerlc.diagnostics import TimerlcError
    from timerlc.envs.base import EnvError

    try:
        deps = dependencies(source, envs)
    except (OSError, EnvError, TimerlcError):  # (as it was read: the compile just read it)
        return None
    if deps is None:
        return None
    from timerlc.plan import items

    entry = folder / k
    try:
        work = Path(tempfile.mkdtemp(prefix=".new-", dir=folder))
        (work / "kernels").mkdir()
        write_text(work / plan.kernels.file, code)
        write_text(work / PLAN, items.dumps(plan))
        write_text(work / DEPS, json.dumps(deps, indent=1) + "\n")  # (last: a whole entry)
        try:
            os.rename(work, entry)
        except OSError:  # (another run kept it first, or an old entry is in the way)
            _remove(entry)
            try:
                os.rename(work, entry)
            except OSError:
                _remove(work)
                return None
    except OSError:
        return None
    _trim(folder)
    return entry


def dependencies(source, envs: dict) -> dict | None:
    """What the compile of ``source`` (the program) read besides its text and timerlc: the
    environment files its ``env`` lines (or ``envs``, ``--env``) name (each as named, the
    folder it was looked for in besides the current one, its path and the hash of its
    bytes) and gymnasium's version; None where an environment is a plugin of the user's."""
    from timerlc.envs.registry import BUILTINS, GYM_PREFIX, parse_spec
    from timerlc.frontend import ast, envrtl
    from timerlc.frontend.parser import parse

    files, gym = [], None
    base = Path(source.name).resolve().parent  # (as the compile looks: check.check_source)
    for stmt in parse(source.text).statements:
        if not isinstance(stmt, ast.EnvDecl):
            continue
        spec = envs.get(stmt.name.name, stmt.plugin)
        name, _ = parse_spec(spec)
        if envrtl.is_rtl(spec):
            if name.startswith(envrtl.RTL_PREFIX):
                continue  # (built in: part of the fingerprint)
            path = envrtl._path(name, base).resolve()
            files.append([name, str(base), str(path), _hash(path)])
        elif name.startswith(GYM_PREFIX):
            gym = _gym_version()
        elif name not in BUILTINS:
            return None
    return {"files": files, "gymnasium": gym}


def _holds(deps) -> bool:
    """Whether what a kept build read (its ``deps.json``, checked as data) is as it was."""
    if not (isinstance(deps, dict) and set(deps) == {"files", "gymnasium"}):
        return False
    files, gym = deps["files"], deps["gymnasium"]
    if not isinstance(files, list) or not (gym is None or isinstance(gym, str)):
        return False
    for row in files:
        if not (isinstance(row, list) and len(row) == 4 and all(isinstance(x, str) for x in row)):
            return False
        name, base, path, digest = row
        p = env_file(name, Path(base))
        if str(p.resolve()) != path or _hash(p) != digest:
            return False
    return gym is None or gym == _gym_version()


def _hash(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _gym_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("gymnasium")
    except metadata.PackageNotFoundError:
        return None


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _trim(folder: Path) -> None:
    """Remove all but the ``KEPT`` most recently used entries (and temporary folders a
    stopped run left, older than an hour)."""
    import time

    try:
        entries = [p for p in folder.iterdir() if p.is_dir()]
        stale = [p for p in entries if p.name.startswith(".new-")]
        kept = sorted(
            (p for p in entries if not p.name.startswith(".")),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
    except OSError:
        return
    now = time.time()
    for p in stale:
        try:
            if now - p.stat().st_mtime > 3600:
                _remove(p)
        except OSError:
            pass
    for p in kept[KEPT:]:
        _remove(p)
