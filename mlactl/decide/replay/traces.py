"""Request traces: Mooncake's public JSON lines, or a CSV; the format is told from the content.

**Mooncake** (kvcache-ai/Mooncake, FAST25-release/README.md and FAST25-release/traces/*.jsonl,
commit 40ea55f8): one JSON object a line,

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}

`timestamp` is the arrival in milliseconds, `input_length` and `output_length` are tokens, and
`hash_ids` has one id per 512-token block of the prompt (the last block may be partial: the
released traces give ceil(input_length / 512) ids). Requests that share leading ids share that
prefix. A line with fewer ids than blocks gets ids of its own for the rest (they never match);
more ids than blocks is a bad line.

**CSV**: a header naming `arrival_s`, `input_tokens` and `output_tokens`, optionally
`cached_tokens` and `session` (other columns are ignored). A non-empty `cached_tokens` is what
the engine reported for that request: it is used as given (capped at input - 1) instead of the
simulated prefix cache. Rows of one `session` are the turns of a conversation in order: a turn's
prompt extends the previous turn's prompt and output, so its leading full blocks are that
conversation's, and the blocks its output completes are cached when it finishes. Without a
session, a row's prompt shares nothing.

Both are read line by line into flat arrays (56 bytes a request and 8 a Mooncake block),
never as a whole text, and checked against the memory budget as they grow. Arrivals must not
go backwards. Each bad line is one `Error:` line naming the file and the line; reading stops
after MAX_ERRORS of them.
"""

from __future__ import annotations

import csv
import io
import json
import math
from array import array
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np

from mlactl.util import numbers
from mlactl.util.defaults import REPLAY_BLOCK
from mlactl.util.errors import MlactlError, warn
from mlactl.util.io import open_input
from mlactl.util.limits import check_memory

FORMATS = ("mooncake", "csv")
MAX_LINE = 1 << 20  # a Mooncake line of a 1M-token prompt holds ~2,000 ids: 16 KB
MAX_ERRORS = 20
CHECK_EVERY = 65_536
REQUEST_BYTES = 120  # arrays of a request here and in the scheduler's state, rounded up
ID_BYTES = 8
MAX_ID = 2**62  # Mooncake ids are kept apart from the ids made for sessions and lone prompts
SESSION_FLAG = 1 << 62
BLOCK_BITS = 24  # blocks per session stream: 2^24 blocks of 512 tokens, 8.6 billion tokens
# Arrivals are kept exact: each is read as an exact number (a JSON float as a Decimal) and made
# relative to the first arrival before it becomes a float, so epoch microseconds keep their last
# digit (1733000000000001 ms after ...000 is 1 ms later, not 0.98 ms). A timestamp is at most
# 1e18 (ms: 30 million years; 1e308 is refused) and a trace spans at most 1e9 s (31 years).
MAX_TIMESTAMP = Decimal(10) ** 18
MAX_SPAN_S = 1e9
_DECODER = json.JSONDecoder(parse_float=Decimal)  # one decoder: json.loads with options builds one a call
# The first bytes of a compressed file, and how to open it (a trace must be given uncompressed)
COMPRESSED = (
    (b"\x1f\x8b", "gzip", "gunzip -k {path}"),
    (b"BZh", "bzip2", "bunzip2 -k {path}"),
    (b"\xfd7zXZ\x00", "xz", "unxz -k {path}"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd {path}"),
    (b"PK\x03\x04", "zip", "unzip {path}"),
)
REQUIRED = ("arrival_s", "input_tokens", "output_tokens")
OPTIONAL = ("cached_tokens", "session")


@dataclass
class Trace:
    """A trace as flat arrays, one entry per request in arrival order.

    arrival: [N] float seconds after the trace's first arrival (which is `origin_s` in the
    file's clock: made relative while exact, so no digit of a far-from-zero clock is lost);
    input, output: [N] int tokens; cached: [N] int, a reported cache hit or -1 (simulate);
    line: [N] int, the file line of each request; session: [N] int, the conversation of a CSV
    turn or -1; ids, id_start: Mooncake's hash_ids, flat, and where each request's begin ([N+1]);
    parent: [N] the earlier request each Mooncake request is inferred to continue, or -1.
    """

    path: str
    format: str
    arrival: np.ndarray
    input: np.ndarray
    output: np.ndarray
    cached: np.ndarray
    line: np.ndarray
    session: np.ndarray
    ids: np.ndarray
    id_start: np.ndarray
    block: int = REPLAY_BLOCK
    parent: np.ndarray | None = None  # Mooncake: the request each continues, or -1 (infer_parents)
    origin_s: float = 0.0  # the first arrival in the file's own clock: arrival holds seconds after it

    def __len__(self) -> int:
        return len(self.input)

    @property
    def duration_s(self) -> float:
        return float(self.arrival[-1] - self.arrival[0]) if len(self) else 0.0

    @property
    def continued(self) -> int:
        """Requests inferred to continue an earlier one (Mooncake: `parents`)."""
        return 0 if self.parent is None else int((self.parent >= 0).sum())

    def _chain(self, i: int) -> int:
        """Blocks of request i's stream named by the trace (Mooncake: its full blocks' hash ids)."""
        return min(int(self.id_start[i + 1] - self.id_start[i]), int(self.input[i]) // self.block)

    def blocks(self, i: int) -> int:
        """Blocks of request i's stream its KV fills: its prompt and output but the last token
        (whose KV is never computed)."""
        return -(-(int(self.input[i]) + int(self.output[i]) - 1) // self.block)

    def stream(self, i: int) -> tuple[list[int], int, list[int] | None]:
        """Request i's token stream as block ids, one per `block` tokens of its prompt and output
        (the last partial), and where an earlier request's stream may stand in for it:
        (ids, alt_from, alts), block k matched as ids[k] or, from alt_from on, alts[k - alt_from].

        Mooncake: the full blocks' hash ids, then ids of the request's own (its partial block,
        its output); a request inferred to continue an earlier one (`parent`) may take that
        one's own blocks from the end of the shared hash ids. CSV: a session's blocks are the
        session's stream (each turn's prompt is the previous turn's prompt and output and more);
        a row without a session has blocks of its own."""
        n = self.blocks(i)
        if self.format == "mooncake":
            chain = self._chain(i)
            ids = self.ids[self.id_start[i] : self.id_start[i] + chain].tolist()
            ids += [_own(i, j) for j in range(chain, n)]
            p = -1 if self.parent is None else int(self.parent[i])
            if p < 0:
                return ids, 0, None
            start = self._chain(p)
            return ids, start, [_own(p, j) for j in range(start, self.blocks(p))]
        s = int(self.session[i])
        if s < 0:
            return [_own(i, j) for j in range(n)], 0, None
        return [_stream(s, j) for j in range(n)], 0, None


def infer_parents(trace: Trace) -> np.ndarray:
    """[N] the request each Mooncake request continues, or -1.

    Mooncake's hash ids name a prompt's blocks of 512 tokens, prefix by prefix; a conversation's
    next turn carries the last turn's prompt and its answer, but the ids cannot say so past the
    last turn's full blocks. So a request B is taken to continue an earlier request A when A's
    full blocks (at least one) are B's leading blocks and B's prompt is at least as long as A's:
    of the requests that qualify, the one with the most full blocks, the latest on a tie. B may
    then find A's partial block and output cached (up to B's own prompt less one token, at the
    engine's page). It is an inference: a request that shares a system prompt with a shorter
    one that ended at a block boundary is credited too, so replay reports the share of requests
    it credits (docs/replay.md)."""
    n = len(trace)
    parent = np.full(n, -1, dtype=np.int64)
    if trace.format != "mooncake":
        return parent
    ends: dict[int, int] = {}  # the hash of a chain of full blocks -> the latest request it is all of
    inp = trace.input.tolist()
    starts = trace.id_start.tolist()
    ids = trace.ids.tolist()
    block = trace.block
    for i in range(n):
        chain = min(starts[i + 1] - starts[i], inp[i] // block)
        given = ids[starts[i] : starts[i + 1]]
        h, key, best = 0, 0, -1
        for k, b in enumerate(given):
            h = hash((h, b))
            a = ends.get(h)
            if a is not None and inp[a] <= inp[i]:
                best = a  # a longer chain, found later in the walk, replaces a shorter one
            if k + 1 == chain:
                key = h
        parent[i] = best
        if chain:
            ends[key] = i
    return parent


def _own(i: int, j: int) -> int:
    """An id no other request's block has: block j of request i."""
    return -((i << BLOCK_BITS) + j + 1)


def _stream(s: int, j: int) -> int:
    """Block j of session s's token stream."""
    return SESSION_FLAG | (s << BLOCK_BITS) | j


class _Lines:
    """The file's lines with their numbers, each read with a bounded readline."""

    def __init__(self, fh, path: Path):
        self.fh, self.path, self.number = fh, path, 0

    def __iter__(self):
        while True:
            text = self.fh.readline(MAX_LINE)
            if not text:
                return
            self.number += 1
            if len(text) == MAX_LINE and not text.endswith("\n"):
                raise MlactlError(f"{self.path}: line {self.number}: longer than {MAX_LINE:,} characters; not a trace")
            yield self.number, text


class _Errors:
    """Bad lines, one message each; reading stops after MAX_ERRORS."""

    def __init__(self, path: Path):
        self.path = path
        self.messages: list[str] = []

    def add(self, line: int, message: str) -> None:
        self.messages.append(f"{self.path}: line {line}: {message}")
        if len(self.messages) >= MAX_ERRORS:
            self.raise_all(more=True)

    def raise_all(self, more: bool = False) -> None:
        if self.messages:
            text = "\nError: ".join(self.messages)
            if more:
                text += f"\nError: {self.path}: stopped after {MAX_ERRORS} bad lines"
            raise MlactlError(text)


class _Builder:
    def __init__(self, path: Path, fmt: str):
        self.path, self.fmt = path, fmt
        self.arrival, self.line = array("d"), array("q")
        self.input, self.output, self.cached, self.session = array("q"), array("q"), array("q"), array("q")
        self.ids, self.id_start = array("q"), array("q", [0])
        self.last: Decimal | int | None = None
        self.origin: Decimal | int | None = None
        self.scale = 1000 if fmt == "mooncake" else 1  # Mooncake's timestamps are milliseconds

    def arrives(self, value) -> float:
        """An arrival in the file's unit (an exact int or Decimal, checked by _clock) as float
        seconds after the first one; arrivals must not go backwards (against the last line whose
        arrival was readable, bad or not)."""
        last = self.last
        self.last = value if last is None else max(last, value)
        if self.origin is None:
            self.origin = value
        if last is not None and value < last:
            now, before = (float(Decimal(v) / self.scale) for v in (value, last))
            raise ValueError(f"arrival {now:g} s is before the previous request's {before:g} s; sort the trace")
        if isinstance(value, int) and isinstance(self.origin, int):
            seconds = (value - self.origin) / self.scale  # int / int: exact, correctly rounded
        else:
            seconds = float(Decimal(value - self.origin) / self.scale)
        if seconds > MAX_SPAN_S:
            raise ValueError(
                f"this arrival is {seconds:.3g} s after the first one (more than {MAX_SPAN_S:.0e} s, 31 years): "
                "are the timestamps in " + ("milliseconds?" if self.scale == 1000 else "seconds?")
            )
        return seconds

    def add(self, line: int, arrival: float, inp: int, out: int, cached: int, session: int, ids=()) -> None:
        self.arrival.append(arrival)
        self.line.append(line)
        self.input.append(inp)
        self.output.append(out)
        self.cached.append(cached)
        self.session.append(session)
        self.ids.extend(ids)
        self.id_start.append(len(self.ids))
        if len(self.input) % CHECK_EVERY == 0:
            check_requests_memory(len(self.input), len(self.ids), self.path)

    def build(self) -> Trace:
        if not len(self.input):
            raise MlactlError(f"{self.path}: no requests in the trace")

        def arr(a, dtype):
            return np.frombuffer(a, dtype=dtype).copy() if len(a) else np.zeros(0, dtype=dtype)

        return Trace(
            str(self.path),
            self.fmt,
            arr(self.arrival, np.float64),
            arr(self.input, np.int64),
            arr(self.output, np.int64),
            arr(self.cached, np.int64),
            arr(self.line, np.int64),
            arr(self.session, np.int64),
            arr(self.ids, np.int64),
            arr(self.id_start, np.int64),
            origin_s=0.0 if self.origin is None else float(Decimal(self.origin) / self.scale),
        )


def check_requests_memory(requests: int, ids: int, path) -> None:
    check_memory(
        requests * REQUEST_BYTES + ids * ID_BYTES,
        f"{requests:,}+ requests of {path}",
        "split the trace by time into several files and replay one at a time",
    )


def _whole(value, what: str, minimum: int) -> int:
    """A JSON number that is a whole count (4096 or 4096.0), at least `minimum`."""
    if isinstance(value, Decimal):  # JSON floats are read exactly (json.loads parse_float)
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {json.dumps(value)[:40]}")
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    if value < minimum or value >= 2**31:
        raise ValueError(f"{what} must be between {minimum} and 2^31 - 1, got {int(value)}")
    return int(value)


def _clock(value, what: str):
    """A timestamp as an exact number (int, or a Decimal from the JSON or CSV text), finite, from 0
    to MAX_TIMESTAMP."""
    ok = not isinstance(value, bool) and isinstance(value, (int, Decimal))
    ok = ok and (isinstance(value, int) or value.is_finite()) and 0 <= value <= MAX_TIMESTAMP
    if not ok:
        shown = json.dumps(value if not isinstance(value, Decimal) else str(value), default=str)[:40]
        raise ValueError(f"{what} must be a number from 0 to 1e18, got {shown}")
    return value


def _read_mooncake(lines, first: tuple[int, str], path: Path, errors: _Errors) -> Trace:
    out = _Builder(path, "mooncake")
    block = REPLAY_BLOCK
    repeated = [0]  # requests whose hash_ids repeat one: read as given (each id its own block)

    def one(number: int, text: str) -> None:
        if not text.lstrip().startswith("{"):
            errors.add(
                number, "not a JSON object: the trace's first line is JSON, so every line must be (mixed formats?)"
            )
            return
        try:
            row = _DECODER.decode(text)
        except (json.JSONDecodeError, RecursionError, InvalidOperation) as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            errors.add(number, f"not a JSON object ({msg})")
            return
        if not isinstance(row, dict):
            errors.add(number, f"expected a JSON object, got {type(row).__name__}")
            return
        missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in row]
        if missing:
            errors.add(number, f"missing {', '.join(missing)}")
            return
        try:
            arrival = out.arrives(_clock(row["timestamp"], "timestamp"))
            inp = _whole(row["input_length"], "input_length", 1)
            output = _whole(row["output_length"], "output_length", 1)
            ids = row["hash_ids"]
            if not isinstance(ids, list):
                raise ValueError("hash_ids must be a list of block ids")
            blocks = -(-inp // block)
            if len(ids) > blocks:
                raise ValueError(f"{len(ids)} hash_ids for {blocks} blocks of {block} tokens (input_length {inp})")
            for h in ids:
                if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < MAX_ID:
                    shown = json.dumps(h, default=str)[:40]
                    raise ValueError(f"hash_ids must be whole numbers from 0 to 2^62, got {shown}")
            if len(set(ids)) != len(ids):
                repeated[0] += 1
        except ValueError as exc:
            errors.add(number, str(exc))
            return
        out.add(number, arrival, inp, output, -1, -1, ids)

    one(*first)
    for number, text in lines:
        if text.strip():
            one(number, text)
    errors.raise_all()
    trace = out.build()
    trace.parent = infer_parents(trace)
    if repeated[0]:
        warn(
            f"{path}: {repeated[0]:,} request(s) repeat a hash id within their prompt (a block cached twice); "
            "read as given"
        )
    return trace


def _read_csv(lines, first: tuple[int, str], path: Path, errors: _Errors) -> Trace:
    out = _Builder(path, "csv")
    header_line, header_text = first
    header = [h.strip().lower() for h in next(csv.reader([header_text]))]
    missing = [k for k in REQUIRED if k not in header]
    if missing:
        raise MlactlError(
            f"{path}: line {header_line}: neither a Mooncake JSONL trace nor a CSV with a header naming "
            f"{', '.join(REQUIRED)} (optionally {', '.join(OPTIONAL)}); missing {', '.join(missing)}"
        )
    col = {k: header.index(k) for k in (*REQUIRED, *OPTIONAL) if k in header}
    sessions: dict[str, int] = {}
    last_turn: dict[int, tuple[int, int]] = {}  # session -> (input + output of its last turn, line)
    for number, text in lines:
        if not text.strip():
            continue
        if text.lstrip().startswith("{"):
            errors.add(number, "a JSON object in a CSV trace (mixed formats?): give one format a file")
            continue
        try:
            row = next(csv.reader([text]))
        except csv.Error as exc:
            errors.add(number, f"not CSV ({exc})")
            continue
        if len(row) != len(header):
            errors.add(number, f"{len(row)} fields, the header has {len(header)}")
            continue
        try:
            arrival = out.arrives(_clock(_exact(row[col["arrival_s"]], "arrival_s"), "arrival_s"))
            inp = _count(row[col["input_tokens"]], "input_tokens", 1)
            output = _count(row[col["output_tokens"]], "output_tokens", 1)
            cached = -1
            if "cached_tokens" in col and row[col["cached_tokens"]].strip():
                cached = _count(row[col["cached_tokens"]], "cached_tokens", 0)
                if cached > inp:
                    raise ValueError(f"cached_tokens {cached} is more than input_tokens {inp}")
                cached = min(cached, inp - 1)  # at least one token is always computed
            session = -1
            name = row[col["session"]].strip() if "session" in col else ""
            if name:
                session = sessions.setdefault(name, len(sessions))
                if session >= 1 << (62 - BLOCK_BITS):
                    raise ValueError("too many sessions")
                before = last_turn.get(session)
                if before is not None and inp < before[0]:
                    raise ValueError(
                        f"session {name[:40]!r}: input_tokens {inp} is shorter than the previous turn's prompt "
                        f"and output ({before[0]} tokens, line {before[1]}), which it extends"
                    )
                last_turn[session] = (inp + output, number)
        except ValueError as exc:
            errors.add(number, str(exc))
            continue
        out.add(number, arrival, inp, output, cached, session)
    errors.raise_all()
    return out.build()


def _exact(cell: str, what: str) -> Decimal:
    """A CSV number read exactly."""
    text = cell.strip()
    # ASCII decimal only (mlactl.util.numbers.FLOAT): Decimal() would also take 'inf', 'nan' or '٣'
    if not numbers.FLOAT.fullmatch(text):
        raise ValueError(f"{what} {text[:40]!r} is not a number")
    return Decimal(text)


def _count(cell: str, what: str, minimum: int) -> int:
    """A CSV cell that is a whole count, at least `minimum` (as _whole)."""
    text = cell.strip()
    if not (text.isascii() and text.isdigit()):  # str.isdigit alone takes '²' and '٣'
        raise ValueError(f"{what} {text[:40]!r} is not a whole number")
    return _whole(int(text), what, minimum)


def read_trace(path: str | Path) -> Trace:
    """Read a Mooncake JSONL or CSV trace (told apart by its first non-blank line)."""
    path = Path(path)
    # the one reader: regular files only, never a read that blocks (mlactl.util.io)
    raw = open_input(path, "trace")
    head = raw.peek(8)[:8] if hasattr(raw, "peek") else b""
    for magic, kind, command in COMPRESSED:
        if head.startswith(magic):
            raw.close()
            raise MlactlError(
                f"{path} is a {kind}-compressed file, not JSON lines or CSV: decompress it first "
                f"({command.format(path=path)}) and give the result"
            )
    fh = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
    errors = _Errors(path)
    with fh:
        lines = iter(_Lines(fh, path))
        try:
            first = next(((n, t) for n, t in lines if t.strip()), None)
            if first is None:
                raise MlactlError(f"{path}: empty file; expected a Mooncake JSONL trace or a CSV with a header")
            start = first[1].lstrip()
            if start.startswith("["):
                raise MlactlError(
                    f"{path}: line {first[0]}: a JSON array; Mooncake traces are JSON lines, one object a line"
                )
            if start.startswith("{"):
                return _read_mooncake(lines, first, path, errors)
            return _read_csv(lines, first, path, errors)
        except UnicodeDecodeError as exc:
            raise MlactlError(f"cannot read trace {path}: not UTF-8 text ({exc.reason})") from None
        except OSError as exc:
            raise MlactlError(f"cannot read trace {path}: {exc.strerror or exc}") from None
