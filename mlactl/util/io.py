"""Reading and writing files safely: the one reader and the one writer every command uses.

Reads (`open_input`, and `read_bytes`/`read_text`/`read_json` over it): the file is opened with
O_NONBLOCK and its type checked on the open descriptor before a byte is read, so a FIFO, a
device, a socket or a directory given as an input is one error line instead of a read that blocks
or runs forever; only a regular file is read (and stdin as `-` where a command documents it).
Reads are capped in size, and JSON nested past Python's recursion limit is an error line, not a
RecursionError. Store folders ($MLACTL_HOME/hardware, results, calibrations) are listed with
`store_files`, which skips anything that is not a regular file with a warning naming it.

Writes (`atomic_open`, `atomic_write`): a regular file is replaced atomically (a reader sees the
old file or the new one, never half of one, and a killed write leaves the old file in place, so
nothing a user measured is lost). The replacement keeps the old file's mode; a symlink is followed
and its target replaced, the link left as it was. A character device, a FIFO, a socket,
/dev/stdout, /dev/stderr, /dev/fd/N or anything under /proc/ is written directly: replacing it
would turn /dev/null into a regular file, or leave a shell's redirection pointing at the old file.
Inside a command (`command_scope`, which the CLI opens for every command), every file read is
remembered, and a write that resolves to one of them is refused: `-o run.json` cannot destroy
the `--results run.json` it was computed from. A store that updates the file it read (a results
file, a tuned-config file) says so with `update=True`. Temporary, lock and backup names beside a
file are cut to fit the file system's longest name (255 bytes), so a legal 255-byte name works.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import os
import re
import stat
import sys
import tempfile
import time
from pathlib import Path

from mlactl.util import safe
from mlactl.util.errors import MlactlError, warn

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no file locks
    fcntl = None  # type: ignore[assignment]

# The largest file each reader takes. A config.json or a TOML profile is a few KiB; a results file
# of a long tune run a few MiB. A file above its cap is an error, never a read that runs forever.
MAX_READ_BYTES = 256 * 1024 * 1024
MAX_CONFIG_BYTES = 16 * 1024 * 1024  # a config.json, a TOML profile, a --space file


def _fail(path, exc: OSError):
    return MlactlError(f"cannot write {safe.text(path)}: {exc.strerror or exc}")


# -- what a command has read: an output may not replace it ---------------------------------------

_INPUTS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("mlactl_inputs", default=None)


@contextlib.contextmanager
def command_scope():
    """Remember the files read until the block ends (one command), so that `atomic_open`
    refuses to replace any of them. Nested scopes share the outer one (tune's group and its
    sub-command are one command)."""
    if _INPUTS.get() is not None:
        yield
        return
    token = _INPUTS.set({})
    try:
        yield
    finally:
        _INPUTS.reset(token)


def _remember(st: os.stat_result, path) -> None:
    inputs = _INPUTS.get()
    if inputs is not None and stat.S_ISREG(st.st_mode):
        inputs.setdefault((st.st_dev, st.st_ino), str(path))


def _input_named(target) -> str | None:
    """The input of this command that `target` (an existing file) is, if it is one."""
    inputs = _INPUTS.get()
    if not inputs:
        return None
    try:
        st = os.stat(target)
    except OSError:
        return None
    return inputs.get((st.st_dev, st.st_ino))


def refuse_input(path, option: str = "") -> None:
    """Refuse `path` as an output when it resolves (links, hard links, `./` spellings all
    included) to a file this command read: checked by `atomic_open` and, before the work
    starts, by commands that know their output early."""
    found = _input_named(path)
    if found is not None:
        what = f"{option} {safe.text(path)}" if option else safe.text(path)
        same = "" if os.path.abspath(found) == os.path.abspath(path) else f" (the same file as {safe.text(found)})"
        raise MlactlError(
            f"cannot write {what}: it is an input of this command{same}; write to another file (the input is kept)"
        )


# -- what mlactl reads back as a measurement: an output may not replace it -------------------------

# (what the file is, how its first bytes show it): the results of `mlactl tune`, a calibration,
# a tuned-config file, a profile holding `mlactl tune ceilings`' [measured] table
MEASUREMENTS = (
    ("mlactl.results", "an `mlactl tune` results file", re.compile(rb'"schema"\s*:\s*"mlactl\.results"')),
    ("mlactl.calibration", "an mlactl calibration", re.compile(rb'"schema"\s*:\s*"mlactl\.calibration"')),
    ("tuned-configs", "a tuned-config file of `mlactl tune`", re.compile(rb'"triton_version"\s*:')),
    ("measured-profile", "a hardware profile with measured ceilings", re.compile(rb"(?m)^\s*\[measured\]\s*$")),
)
SNIFF_BYTES = 1 << 20  # a measurement says what it is in its header; a results file may be long


def measurement(path) -> tuple[str, str] | None:
    """(kind, description) when `path` is an existing regular file that mlactl would read back as
    a measurement (MEASUREMENTS), else None. Only the file's first MiB is read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.read(fd, SNIFF_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    for kind, what, pattern in MEASUREMENTS:
        if pattern.search(head):
            return kind, what
    return None


def refuse_measurement(path, allowed: str | None = None) -> None:
    """Refuse to replace (or move aside) `path` when it holds a measurement of another kind than
    `allowed`: `calibrate --dir res --name run` must not take the place of `res/run.json` that
    `mlactl tune` wrote, nor `-o` any file a user measured."""
    found = measurement(path)
    if found is not None and found[0] != allowed:
        raise MlactlError(
            f"cannot write {safe.text(path)}: it is {found[1]}, a measurement mlactl reads back; "
            "write to another file or name (it is kept as it is)"
        )


def name_max(folder) -> int:
    """The longest file name (bytes) the file system of `folder` allows; 255 where it cannot say."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return safe.NAME_MAX


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


def _utf8(mode: str) -> dict:
    """A text file mlactl writes is UTF-8 whatever the locale (`LC_ALL=C` would make it ASCII, and
    the first `µs` would fail the write)."""
    return {} if "b" in mode else {"encoding": "utf-8"}


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb", update: bool = False):
    """Open `path` for writing. A regular file (or a new one) is written to a temporary file
    beside it, then flushed, synced and renamed over it; on any error the temporary file is
    removed and `path` is untouched. Special files are written directly (module docstring).
    A file this command read is refused unless `update` (a store rewriting its own file)."""
    path = Path(path)
    if os.path.isdir(path):
        raise MlactlError(f"cannot write {safe.text(path)}: it is a directory; give a file name")
    if not update:
        refuse_input(path)
    if _direct(path):
        try:
            # append: for a device or FIFO it is the same, and `-o /dev/stdout >> log` keeps the log
            fh = open(path, mode.replace("w", "a"), **_utf8(mode))
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
        raise MlactlError(f"cannot write {safe.text(path)}: it is a directory; give a file name")
    if not update:  # a store rewriting its own file says so; nothing else replaces a measurement
        refuse_measurement(target)
    folder = target.parent
    try:
        old = os.stat(target)
    except OSError:
        old = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # mkstemp adds 8 characters between prefix and suffix: cut the name so that the whole fits
        prefix = safe.fit_name(target.name, head=".", tail=".", limit=name_max(folder) - 8 - len(".tmp"))
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".tmp")
    except OSError as exc:
        raise _fail(path, exc) from None
    try:
        with os.fdopen(fd, mode, **_utf8(mode)) as fh:
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


KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind(mode: int) -> str:
    """'a regular file', 'a FIFO (named pipe)', 'a directory', ... for a stat mode."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def open_input(path: str | Path, what: str, stdin: bool = False):
    """Open an input for reading in binary: a regular file, or stdin for `-` when `stdin`. The
    file is opened with O_NONBLOCK (a FIFO with no writer does not block the open) and its type
    is checked on the descriptor, so nothing swapped in between is read; anything but a regular
    file is one MlactlError line. The caller closes it (stdin is not closed: the handle returned
    is a duplicate)."""
    if stdin and str(path) == "-":
        return os.fdopen(os.dup(sys.stdin.fileno()), "rb")
    shown = safe.text(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a FIFO on some systems) cannot be opened so
            with contextlib.suppress(OSError):
                found = kind(os.stat(path).st_mode)
                raise MlactlError(f"cannot read {what} {shown}: it is {found}, not a regular file") from None
        raise MlactlError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MlactlError(f"cannot read {what} {shown}: it is {kind(st.st_mode)}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # ordinary reads from here on (a regular file never blocks)
        _remember(st, path)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | Path, what: str, limit: int = MAX_READ_BYTES, stdin: bool = False) -> bytes:
    """A file's bytes, at most `limit` of them, read through `open_input`; anything but a
    regular file, an unreadable file or one above the cap is one line naming the file."""
    with open_input(path, what, stdin) as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise MlactlError(f"cannot read {what} {safe.text(path)}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise MlactlError(f"cannot read {what} {safe.text(path)}: larger than {limit // (1024 * 1024)} MiB")
    return data


def read_text(path: str | Path, what: str, limit: int = MAX_READ_BYTES, stdin: bool = False) -> str:
    """A file's text (UTF-8; a byte-order mark is dropped), or one line saying which file could
    not be read and why."""
    try:
        return read_bytes(path, what, limit, stdin).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise MlactlError(
            f"cannot read {what} {safe.text(path)}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None


def loads_json(text: str, where: str, hint: str = ""):
    """Parsed JSON, or one line naming `where` and the line where it stops being JSON. NaN and
    Infinity are not JSON and are refused."""

    def no_constant(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise MlactlError(f"{safe.text(where)}: line {exc.lineno}: not valid JSON ({exc.msg}){hint}") from None
    except RecursionError:
        raise MlactlError(f"{safe.text(where)}: nested too deeply to be a file mlactl reads{hint}") from None
    except ValueError as exc:
        raise MlactlError(f"{safe.text(where)}: not valid JSON ({exc}){hint}") from None


def read_json(path: str | Path, what: str, hint: str = "", limit: int = MAX_READ_BYTES):
    """Parsed JSON of a file (see loads_json). A file that is plainly something else where JSON
    is read (a CSV: a first line of comma-separated names) says so instead of 'not valid JSON'."""
    text = read_text(path, what, limit)
    first = text.lstrip().split("\n", 1)[0]
    if first and first[0] not in "{[" and "," in first and all(c.strip() for c in first.split(",")):
        raise MlactlError(
            f"{safe.text(path)} is a CSV ({safe.text(first, 60)}), but JSON ({what}) is read here; "
            "a command that reads CSV takes it with --from csv or as its argument"
        )
    return loads_json(text, str(path), hint)


def atomic_write(path: str | Path, data: str | bytes, update: bool = False) -> None:
    with atomic_open(path, "wb", update=update) as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


@contextlib.contextmanager
def locked(path: str | Path):
    """Hold an exclusive lock on a hidden `.NAME.lock` beside `path` while reading, merging and
    rewriting `path`, so two processes updating one file take turns instead of losing each
    other's entries. The lock file is removed on release (no empty files left behind): the
    holder unlinks it before unlocking, and a waiter that wakes holding an unlinked file's lock
    starts over on the new one. POSIX only; elsewhere it does not lock."""
    path = Path(path)
    lock_path = path.parent / safe.fit_name(path.name, head=".", tail=".lock", limit=name_max(path.parent))
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


def keep_aside(path: str | Path, kind: str | None = None) -> Path:
    """Rename `path` to NAME.YYYYMMDD-HHMMSS[.N]SUFFIX beside it and return the new name, a name
    reserved first with an exclusive create (a plain rename would silently overwrite a backup
    another process just made) and cut to fit the file system's longest name. Call it under
    `locked(path)`. With `kind` (a MEASUREMENTS kind: what the caller is about to write), a file
    holding a measurement of another kind is refused, not moved."""
    path = Path(path)
    if kind is not None:
        refuse_measurement(path, kind)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    limit = name_max(path.parent)
    for n in range(10_000):
        tail = f".{stamp}{f'.{n}' if n else ''}{path.suffix}"
        target = path.with_name(safe.fit_name(path.stem, tail=tail, limit=limit))
        try:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            continue
        except OSError as exc:
            why = exc.strerror or exc
            raise MlactlError(f"cannot keep {safe.text(path)} aside as {safe.text(target)}: {why}") from None
        os.replace(path, target)  # over our own empty reservation only
        return target
    raise MlactlError(f"cannot keep {safe.text(path)} aside: 10,000 backups of it exist already")


def store_files(folder: str | Path, pattern: str = "*", recursive: bool = False) -> list[Path]:
    """The regular files of a store folder whose names match `pattern`, sorted. Anything else
    that matches (a FIFO, a device, a socket, a directory named x.json, a dangling link) is
    skipped with a warning naming it: it must not block or break a command that only looked."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.rglob(pattern) if recursive else folder.glob(pattern)):
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            warn(f"skipped {safe.text(path)}: {exc.strerror or exc}")
            continue
        if stat.S_ISREG(mode):
            found.append(path)
        elif not (recursive and stat.S_ISDIR(mode)):
            warn(f"skipped {safe.text(path)}: it is {kind(mode)}, not a regular file")
    return found


def contained(path: str | Path, folder: str | Path) -> Path:
    """`path`, refused unless it lies inside `folder` once every link is resolved and is not
    itself a symbolic link: a link planted in a store folder must not make mlactl write
    elsewhere."""
    path, folder = Path(path), Path(folder)
    if path.is_symlink():
        raise MlactlError(
            f"cannot write {safe.text(path)}: it is a symbolic link (to {safe.text(os.readlink(path))}); "
            f"mlactl writes only plain files in {safe.text(folder)}: remove the link or choose another name"
        )
    real, root = os.path.realpath(path), os.path.realpath(folder)
    if os.path.commonpath([real, root]) != root:
        raise MlactlError(
            f"cannot write {safe.text(path)}: it resolves to {safe.text(real)}, outside {safe.text(folder)}"
        )
    return path
