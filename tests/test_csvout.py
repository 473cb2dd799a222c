"""The vectorised CSV writer against Python's own float parsing and csv module."""

import csv
import io

import numpy as np
import pytest

from mlactl.output.csvout import write_csv


def write(columns, header=None, chunk=7):
    buf = io.BytesIO()
    write_csv(buf, header or [f"c{i}" for i in range(len(columns))], columns, chunk=chunk)
    return list(csv.reader(io.StringIO(buf.getvalue().decode())))


def test_exact_integers_and_edge_values():
    values = np.array(
        [
            0.0,
            1.0,
            7.0,
            10.0,
            999.0,
            1000.0,
            123456789012345.0,
            999999999999999.0,
            -5.0,
            1e15,
            2.5,
            -0.125,
            1e-300,
            5e-324,
            1.7e308,
            np.nan,
            np.inf,
            -np.inf,
        ]
    )
    rows = write([values])
    got = [r[0] for r in rows[1:]]
    assert got[:10] == ["0", "1", "7", "10", "999", "1000", "123456789012345", "999999999999999", "-5", "1e+15"]
    assert got[10:12] == ["2.5e+00", "-1.25e-01"]
    assert got[12:] == ["1e-300", "4.940656458e-324", "1.7e+308", "nan", "inf", "-inf"]


def test_round_trip_random_floats():
    rng = np.random.default_rng(0)
    values = rng.random(3000) * 10.0 ** rng.integers(-40, 40, 3000) * rng.choice([-1, 1], 3000)
    rows = write([values])
    for v, (s,) in zip(values, rows[1:]):
        assert float(s) == pytest.approx(v, rel=6e-10)  # 10 significant digits


def test_mixed_columns_and_text():
    ints = np.array([3, 12, 7], dtype=np.int64)
    floats = np.array([0.5, 2.0, 1e-6])
    text = np.array(["absorb", "expand", "expand_chunked"])
    rows = write([ints, floats, text], header=["n", "t", "path"], chunk=2)
    assert rows == [
        ["n", "t", "path"],
        ["3", "5e-01", "absorb"],
        ["12", "2", "expand"],
        ["7", "1e-06", "expand_chunked"],
    ]


def test_text_needing_quotes_is_refused():
    with pytest.raises(ValueError, match="needs quoting"):
        write([np.array(["a,b"])])


def test_crossover_csv_leaves_none_found_empty_not_nan():
    """`crossover --max-new 64`: after a 1K prefix expand first wins at 135 new tokens on an H200
    (tests/golden/crossover.csv), past 64, so the table says `> 64`; the CSV said `nan`."""
    from typer.testing import CliRunner

    from mlactl.cli import app

    out = CliRunner().invoke(app, ["crossover", "--hardware", "h200", "--tp", "1", "--max-new", "64",
                                   "--prefix", "0,1K", "-f", "csv"])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[1:] == ["1,0,1,1,1", "1,1024,159,,"]
    assert "nan" not in out.stdout


def test_missing_values_written_as_asked():
    buf = io.BytesIO()
    write_csv(buf, ["a", "b"], [np.array([1.0, np.nan]), np.array([np.inf, 2.5])], missing="")
    assert buf.getvalue().decode().splitlines() == ["a,b", "1,inf", ",2.5e+00"]
