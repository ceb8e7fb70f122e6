"""Files timerlc writes and the memory a run may take: checked first, written whole.

In: the ``--outputs`` / ``--metrics`` paths, the arrays to save, a build's files. Out:
``probe_writable`` (can a file be created there: checked before anything runs),
``save_npz`` and ``write_text`` (a temporary file in the same folder, renamed over the
target only once complete: an interrupted or failed write leaves an earlier file as it
was), ``memory_available`` and ``user_cache`` (the user's own folder for what timerlc
keeps between runs).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from timerlc.diagnostics import UsageError

# the mask of the points computed that an interrupted run saves with each output array
# (docs/interruptions.md)
VALID_SUFFIX = ".__valid__"


def env_file(name: str, base: Path | None) -> Path:
    """Where an environment file named ``name`` (``env E = "walk.rtl"``) is looked for: as
    named (from the current directory), else in ``base``, the program's folder. The
    compile's rule (``frontend.envrtl``) and the kept builds' check of what it read
    (``buildcache``); whether the file is there is the caller's to ask."""
    path = Path(name)
    if not path.is_absolute() and base is not None and not path.is_file():
        path = base / path
    return path


def probe_writable(path: str, option: str):
    """A file can be created at ``path`` (a temporary one is made next to it, then removed;
    ``path`` itself is not touched), else a ``UsageError`` naming ``option``."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"{option} {path}: it is a folder")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: there is no folder {parent}")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{option} {path}: the file cannot be written")
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{p.name[:100]}.", suffix=".probe")
    except OSError as e:
        raise UsageError(
            f"{option} {path}: cannot create a file in {parent} ({e.strerror})"
        ) from None
    os.close(fd)
    os.unlink(tmp)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file, then a rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:100]}.", suffix=".tmp")
    done = False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
        done = True
    finally:
        if not done:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def save_npz(path: str, arrays: dict) -> None:
    """Save ``arrays`` to ``path`` as ``np.savez`` does, atomically: the data go to a
    temporary file in the same folder, which replaces ``path`` only once it is complete and
    on disk. On any failure or interruption (``KeyboardInterrupt``) the temporary file is
    removed and ``path`` is as it was."""
    import numpy as np

    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{p.name[:100]}.", suffix=".tmp")
    done = False
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
        done = True
    finally:
        if not done:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def memory_available() -> int | None:
    """Bytes of memory a run can take now: the kernel's ``MemAvailable``, within the
    cgroup's limit when there is one; None where it cannot be known."""
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    for limit_file, used_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            used = int(Path(used_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            avail = min(avail, max(int(limit) - used, 0))
        break
    return avail


def user_cache(name: str) -> Path | None:
    """``$XDG_CACHE_HOME/timerlc/NAME`` (else ``~/.cache/timerlc/NAME``), made if need be
    and private to the user (mode 0700), or None where it cannot be made or is not the
    user's own: what is kept there is loaded as code (a parser's tables, compiled modules),
    so never from a folder another user can write, as a shared temporary folder is."""
    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"))
        folder = base / "timerlc" / name
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        middle = folder.parent.stat()
        if hasattr(os, "getuid") and middle.st_uid == os.getuid() and middle.st_mode & 0o022:
            # (ours, made by an earlier version under a umask of 002: made private; a
            # folder another user put in it meanwhile is theirs, refused below)
            folder.parent.chmod(0o700)
        folder.mkdir(mode=0o700, exist_ok=True)
        # (the folders above it too: another user who may write ``timerlc/`` could put a
        # folder of theirs in place of ``NAME/``, and one who may write the base could move
        # ``timerlc/`` itself, unless the base's sticky bit keeps them from moving what is
        # ours, as the shared temporary folder's does; a base only the user's group may
        # write, as a umask of 002 makes ``~/.cache``, is the user's private group's)
        stats = [(base.stat(), 0o002), (folder.parent.stat(), 0o022), (folder.stat(), 0o022)]
    except (OSError, RuntimeError):  # (RuntimeError: no home folder)
        return None
    if hasattr(os, "getuid"):
        for k, (st, others) in enumerate(stats):
            owner = st.st_uid == os.getuid() or (k == 0 and st.st_uid == 0)
            sticky = k == 0 and st.st_mode & 0o1000
            if not owner or (st.st_mode & others and not sticky):
                return None
    return folder
