"""A vectorised CSV writer: a million analysed points in seconds, where pandas takes tens.

Each column becomes a byte matrix [rows, width] plus a mask of the bytes to keep; the row's
matrices are laid side by side with separators, and the kept bytes, read in row-major order,
are the CSV text. No per-value Python.

Numbers: integral values below 1e15 are written as integers (exact); every other number with
10 significant digits in scientific notation (1.234567891e-05); nan and inf as Python spells
them. A missing value is passed as nan and written `nan`, or, with `missing=""`, left empty (a
crossover not found up to --max-new: the table's `> 64`, JSON's null). Text columns
hold a few distinct values (path names, bounds) and must not contain commas or quotes.
"""

from __future__ import annotations

import numpy as np

SIG = 10  # significant digits of non-integral numbers
INT_LIMIT = 1e15  # integral values below this are written as exact integers
CHUNK = 32768  # rows per block: bounds memory at about rows * line width * 2 bytes

_ZERO = ord("0")
# every 4-digit group as 4 ASCII bytes: one divide per 4 digits instead of one per digit
_GROUPS = (np.arange(10000)[:, None] // np.array([1000, 100, 10, 1]) % 10 + _ZERO).astype(np.uint8)
_GROUPS32 = _GROUPS.copy().view(np.uint32).reshape(-1)  # the same, one 4-byte word per group
_POW10 = 10.0 ** np.arange(1, 17)


def _digits(v: np.ndarray, width: int) -> np.ndarray:
    """[n, width] ASCII digits of non-negative integral v (< 2**53), zero-padded on the left.

    Float arithmetic is exact below 2**53 and vectorises, where int64 division does not; every
    group of 4 digits is one table lookup written as one 4-byte word.
    """
    groups = -(-width // 4)
    out = np.empty((len(v), groups), np.uint32)
    rest = np.asarray(v, dtype=np.float64)
    for g in range(groups - 1, -1, -1):
        high = np.floor(rest * 1e-4)
        out[:, g] = _GROUPS32[(rest - high * 10000.0).astype(np.intp)]
        rest = high
    return out.view(np.uint8)[:, groups * 4 - width :]


def _significant(v: np.ndarray, width: int) -> np.ndarray:
    """Keep-mask over `width` zero-padded digits of v that drops the leading zeros."""
    ndigits = 1 + np.searchsorted(_POW10, v, side="right")
    return np.arange(width)[None, :] >= (width - ndigits)[:, None]


def _int_width(x: np.ndarray) -> int:
    top = int(np.abs(x).max()) if len(x) else 0
    return 1 + len(str(top))  # sign + digits


def _format_int(x: np.ndarray, mat: np.ndarray, keep: np.ndarray) -> None:
    """x: float64 integral values with |x| < INT_LIMIT, into mat/keep [n, _int_width(x)]."""
    v = np.abs(x)
    width = mat.shape[1] - 1
    mat[:, 0] = ord("-")
    keep[:, 0] = x < 0
    mat[:, 1:] = _digits(v, width)
    keep[:, 1:] = _significant(v, width)


FLOAT_WIDTH = 1 + SIG + 1 + 2 + 3  # sign, mantissa, point, 'e' and exponent sign, 3 exponent digits


def _format_float(x: np.ndarray, mat: np.ndarray, keep: np.ndarray) -> None:
    """x: finite float64 -> -d.ddddddddde-XXX with trailing fraction zeros dropped; 0 -> 0."""
    y = np.abs(x)
    zero = y == 0
    y = np.where(zero, 1.0, y)
    shift: np.ndarray | int = 0
    if y.min() < 1e-290:  # 10.0 ** e underflows for subnormals: scale those up first
        tiny = y < 1e-290
        y = np.where(tiny, np.where(tiny, y, 0.0) * 1e300, y)
        shift = np.where(tiny, 300, 0)
    e = np.floor(np.log10(y)).astype(np.int64)
    scaled = y / np.power(10.0, e)
    high, low = scaled >= 10, scaled < 1  # log10 rounding can miss by one
    scaled = np.where(high, scaled / 10, np.where(low, scaled * 10, scaled))
    e = e + high - low
    m = np.where(zero, 0.0, np.rint(scaled * 10 ** (SIG - 1)))
    over = m >= 10**SIG  # rounding carried into a new digit
    m = np.where(over, np.rint(m / 10), m)
    e = e + over - shift
    mant = _digits(m, SIG)
    nonzero = mant[:, 1:] != _ZERO
    last = np.where(nonzero.any(axis=1), SIG - 2 - np.argmax(nonzero[:, ::-1], axis=1), -1)
    exp_abs = np.abs(e)
    mat[:, 0] = ord("-")
    keep[:, 0] = x < 0
    mat[:, 1] = mant[:, 0]
    keep[:, 1] = True
    mat[:, 2] = ord(".")
    keep[:, 2] = last >= 0
    mat[:, 3 : SIG + 2] = mant[:, 1:]
    keep[:, 3 : SIG + 2] = np.arange(SIG - 1)[None, :] <= last[:, None]
    mat[:, SIG + 2] = ord("e")
    mat[:, SIG + 3] = np.where(e < 0, ord("-"), ord("+"))
    keep[:, SIG + 2 : SIG + 4] = ~zero[:, None]
    mat[:, SIG + 4 :] = _digits(exp_abs, 3)
    keep[:, SIG + 4] = (exp_abs >= 100) & ~zero
    keep[:, SIG + 5 :] = ~zero[:, None]


class Labels:
    """A text column given as small integer codes into a list of labels (path names, bounds):
    formatting it is one table lookup per row, with no sorting of strings."""

    def __init__(self, codes, labels):
        self.codes = np.asarray(codes, dtype=np.intp)
        self.labels = [str(label) for label in labels]

    def __len__(self):
        return len(self.codes)

    def __getitem__(self, rows):
        return Labels(self.codes[rows], self.labels)

    @classmethod
    def of(cls, values) -> Labels:
        labels, codes = np.unique(np.asarray(values).astype(str), return_inverse=True)
        return cls(codes.reshape(-1), labels.tolist())


def _label_table(labels: list[str]):
    encoded = [u.encode() for u in labels]
    for u in encoded:
        if b"," in u or b'"' in u or b"\n" in u:
            raise ValueError(f"text value {u!r} needs quoting, which this writer does not do")
    width = max((len(u) for u in encoded), default=0) or 1
    table = np.zeros((len(encoded), width), np.uint8)
    table_keep = np.zeros((len(encoded), width), bool)
    for i, u in enumerate(encoded):
        table[i, : len(u)] = np.frombuffer(u, np.uint8)
        table_keep[i, : len(u)] = True
    return table, table_keep


class _Column:
    """How one column of one block is formatted: its width, then filling a slice of the block."""

    def __init__(self, values, missing: str = "nan"):
        self.missing = missing
        if not isinstance(values, Labels):
            values = np.asarray(values)
            if values.dtype.kind not in "biuf":
                values = Labels.of(values)
        if isinstance(values, Labels):
            self.kind = "text"
            self.table, self.table_keep = _label_table(values.labels)
            self.codes = values.codes
            self.width = self.table.shape[1]
            return
        x = values.astype(np.float64, copy=False)
        self.x = x
        finite = np.isfinite(x)
        all_finite = bool(finite.all())
        integral = (np.abs(x) < INT_LIMIT) & (x == np.floor(x))
        if all_finite and integral.all():
            self.kind = "int"
            self.width = _int_width(x)
        elif all_finite and not (integral & (x != 0)).any():
            self.kind = "float"  # zeros are fine: they print as 0
            self.width = FLOAT_WIDTH
        else:
            self.kind = "mixed"
            self.is_int = finite & integral
            self.is_float = finite & ~integral
            self.special = ~finite
            self.width = max(_int_width(np.where(self.is_int, x, 0.0)), FLOAT_WIDTH, 4)

    def fill(self, mat: np.ndarray, keep: np.ndarray) -> None:
        if self.kind == "text":
            mat[:] = self.table[self.codes]
            keep[:] = self.table_keep[self.codes]
            return
        x = self.x
        if self.kind == "int":
            _format_int(x, mat, keep)
            return
        if self.kind == "float":
            _format_float(x, mat, keep)
            return
        keep[:] = False
        for rows, width, formatter in ((self.is_int, None, _format_int), (self.is_float, FLOAT_WIDTH, _format_float)):
            if rows.any():
                width = width or _int_width(x[rows])
                m = np.zeros((rows.sum(), width), np.uint8)
                k = np.zeros((rows.sum(), width), bool)
                formatter(x[rows], m, k)
                mat[rows, :width], keep[rows, :width] = m, k
        if self.special.any():
            rows = self.special
            words = [self.missing, "inf", "-inf"]
            codes = np.where(np.isnan(x[rows]), 0, np.where(x[rows] > 0, 1, 2))
            table, table_keep = _label_table(words)
            mat[rows, : table.shape[1]] = table[codes]
            keep[rows, : table.shape[1]] = table_keep[codes]


def write_csv(fh, header: list[str], columns: list, chunk: int = CHUNK, missing: str = "nan") -> None:
    """Write a header and equal-length columns (numeric arrays, text arrays or Labels) to a
    binary file object; a NaN is written as `missing` ("nan", or "" for an empty field)."""
    if len(header) != len(columns):
        raise ValueError("one header name per column")
    fh.write((",".join(header) + "\n").encode())
    columns = [c if isinstance(c, Labels) else np.asarray(c) for c in columns]
    columns = [
        Labels.of(c) if not isinstance(c, Labels) and c.dtype.kind not in "biuf" else c for c in columns
    ]  # label text columns once, not once per block
    n = len(columns[0]) if columns else 0
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        cols = [_Column(c[start:stop], missing) for c in columns]
        total = sum(c.width + 1 for c in cols)
        mat = np.empty((stop - start, total), np.uint8)
        keep = np.empty((stop - start, total), bool)
        at = 0
        for c in cols:
            c.fill(mat[:, at : at + c.width], keep[:, at : at + c.width])
            at += c.width
            mat[:, at] = ord(",")
            keep[:, at] = True
            at += 1
        mat[:, -1] = ord("\n")
        fh.write(mat[keep].tobytes())
