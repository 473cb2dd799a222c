"""Atomic file writes: a reader sees the old file or the new one, never half of one, and a
killed write leaves the old file in place (nothing a user measured is lost)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from mlactl.errors import MlactlError


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb"):
    """Open a temporary file beside `path`; on success it is flushed, synced and renamed over
    `path`; on any error it is removed and `path` is untouched."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise MlactlError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_text(path: str | Path, what: str) -> str:
    """A file's text, or one line saying which file could not be read and why."""
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise MlactlError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None


def read_json(path: str | Path, what: str, hint: str = ""):
    """Parsed JSON, or one line naming the file and the line where it stops being JSON."""
    import json

    try:
        return json.loads(read_text(path, what))
    except json.JSONDecodeError as exc:
        raise MlactlError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg}){hint}") from None


def atomic_write(path: str | Path, data: str | bytes) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


@contextlib.contextmanager
def locked(path: str | Path):
    """Hold an exclusive lock on a hidden `.NAME.lock` beside `path` while reading, merging and
    rewriting `path`, so two processes updating one file take turns instead of losing each
    other's entries. POSIX only; elsewhere it does not lock."""
    path = Path(path)
    lock_path = path.parent / f".{path.name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as fh:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            yield
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
