"""Writing and reading files safely.

Writes: a regular file is replaced atomically (a reader sees the old file or the new one, never
half of one, and a killed write leaves the old file in place, so nothing a user measured is lost).
The replacement keeps the old file's mode; a symlink is followed and its target replaced, the
link left as it was. A character device, a FIFO, a socket, /dev/stdout, /dev/stderr, /dev/fd/N
or anything under /proc/ is written directly: replacing it would turn /dev/null into a regular
file, or leave a shell's redirection pointing at the old file.

Reads: capped in size (`--model /dev/zero` must not read forever); JSON nested past Python's
recursion limit is an error line, not a RecursionError.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path

from mlactl.util.errors import MlactlError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no file locks
    fcntl = None  # type: ignore[assignment]

# The largest file each reader takes. A config.json or a TOML profile is a few KiB; a results file
# of a long tune run a few MiB. A file above its cap is an error, never a read that runs forever.
MAX_READ_BYTES = 256 * 1024 * 1024
MAX_CONFIG_BYTES = 16 * 1024 * 1024  # a config.json, a TOML profile, a --space file


def _fail(path, exc: OSError):
    return MlactlError(f"cannot write {path}: {exc.strerror or exc}")


def _direct(path: Path) -> bool:
    """Write in place rather than replace: special files and the kernel's pseudo-files."""
    text = os.path.abspath(path)
    # /dev/stdout is a link to /proc/self/fd/1, which may be a regular file the shell redirected
    # into: replacing that file would lose the output. (/dev/shm/x is an ordinary file.)
    if text in ("/dev/stdout", "/dev/stderr") or text.startswith(("/dev/fd/", "/proc/")):
        return True
    try:
        st = os.stat(path)
    except OSError:
        return False
    return not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb"):
    """Open `path` for writing. A regular file (or a new one) is written to a temporary file
    beside it, then flushed, synced and renamed over it; on any error the temporary file is
    removed and `path` is untouched. Special files are written directly (module docstring)."""
    path = Path(path)
    if os.path.isdir(path):
        raise MlactlError(f"cannot write {path}: it is a directory; give a file name")
    if _direct(path):
        try:
            # append: for a device or FIFO it is the same, and `-o /dev/stdout >> log` keeps the log
            fh = open(path, mode.replace("w", "a"))
        except OSError as exc:
            raise _fail(path, exc) from None
        try:
            with fh:
                yield fh
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise
            raise _fail(path, exc) from None
        return
    target = Path(os.path.realpath(path))  # a symlink: replace what it points to, keep the link
    if target.is_dir():
        raise MlactlError(f"cannot write {path}: it is a directory; give a file name")
    folder = target.parent
    try:
        old = os.stat(target)
    except OSError:
        old = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise _fail(path, exc) from None
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        if old is not None:
            os.chmod(tmp, stat.S_IMODE(old.st_mode))  # an existing file keeps its mode (600 stays 600)
            with contextlib.suppress(OSError):  # and, where we may, its owner
                os.chown(tmp, old.st_uid, old.st_gid)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give a new file the usual mode
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno != errno.EPIPE:
            raise _fail(path, exc) from None  # disk full: name the file, not the temporary one
        raise


def read_bytes(path: str | Path, what: str, limit: int = MAX_READ_BYTES) -> bytes:
    """A file's bytes, at most `limit` of them; a directory, an unreadable file or one above the
    cap is one line naming the file."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise MlactlError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise MlactlError(f"cannot read {what} {path}: larger than {limit // (1024 * 1024)} MiB")
    return data


def read_text(path: str | Path, what: str, limit: int = MAX_READ_BYTES) -> str:
    """A file's text (UTF-8; a byte-order mark is dropped), or one line saying which file could
    not be read and why."""
    try:
        return read_bytes(path, what, limit).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise MlactlError(f"cannot read {what} {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def loads_json(text: str, where: str, hint: str = ""):
    """Parsed JSON, or one line naming `where` and the line where it stops being JSON. NaN and
    Infinity are not JSON and are refused."""

    def no_constant(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise MlactlError(f"{where}: line {exc.lineno}: not valid JSON ({exc.msg}){hint}") from None
    except RecursionError:
        raise MlactlError(f"{where}: nested too deeply to be a file mlactl reads{hint}") from None
    except ValueError as exc:
        raise MlactlError(f"{where}: not valid JSON ({exc}){hint}") from None


def read_json(path: str | Path, what: str, hint: str = "", limit: int = MAX_READ_BYTES):
    """Parsed JSON of a file (see loads_json)."""
    return loads_json(read_text(path, what, limit), str(path), hint)


def atomic_write(path: str | Path, data: str | bytes) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


@contextlib.contextmanager
def locked(path: str | Path):
    """Hold an exclusive lock on a hidden `.NAME.lock` beside `path` while reading, merging and
    rewriting `path`, so two processes updating one file take turns instead of losing each
    other's entries. The lock file is removed on release (no empty files left behind): the
    holder unlinks it before unlocking, and a waiter that wakes holding an unlinked file's lock
    starts over on the new one. POSIX only; elsewhere it does not lock."""
    path = Path(path)
    lock_path = path.parent / f".{path.name}.lock"
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(path, exc) from None
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _fail(lock_path, exc) from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder before us removed the file we waited on: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)  # closing drops the lock
