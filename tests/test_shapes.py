import pytest

from mlactl.model.shapes import grid, parse_sizes
from mlactl.util.errors import MlactlError


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("1,64,512", [1, 64, 512]),
        ("512,1,64,64", [1, 64, 512]),
        ("0:32K:8K", [0, 8192, 16384, 24576, 32768]),
        ("1:4096:*4", [1, 4, 16, 64, 256, 1024, 4096]),
        ("8k", [8192]),
        ("1M", [1048576]),
        ("1:3", [1, 2, 3]),
        ("0:10:4", [0, 4, 8]),
        ("1, 2 ,3", [1, 2, 3]),
    ],
)
def test_parse_sizes(spec, expected):
    assert parse_sizes(spec, "--x", minimum=0) == expected


@pytest.mark.parametrize(
    "spec, minimum, message",
    [
        ("0", 1, "--x: 0 must be a positive integer"),
        ("-5", 0, "-5 must be an integer >= 0"),
        ("1.5", 1, "'1.5' is not a whole number"),
        ("abc", 1, "'abc' is not a whole number"),
        ("1,,2", 1, "empty item"),
        ("10:1", 1, "ends before it starts"),
        ("1:2:3:4", 1, "is not a range"),
        ("1:10:0", 1, "step in '1:10:0' must be at least 1"),
        ("1:10:*1", 1, "factor .* must be at least 2"),
        ("0:10:*2", 0, "cannot start at 0"),
    ],
)
def test_parse_sizes_errors(spec, minimum, message):
    with pytest.raises(MlactlError, match=message):
        parse_sizes(spec, "--x", minimum=minimum)


def test_grid_order_and_context():
    b, n, p = grid([1, 2], [1, 10], prefix=[0, 100])
    assert list(zip(b, n, p)) == [
        (1, 1, 0),
        (1, 10, 0),
        (1, 1, 100),
        (1, 10, 100),
        (2, 1, 0),
        (2, 10, 0),
        (2, 1, 100),
        (2, 10, 100),
    ]
    b, n, p = grid([1], [1, 10], context=[10, 100])
    assert list(zip(n, p)) == [(1, 9), (10, 0), (1, 99), (10, 90)]


def test_context_shorter_than_new():
    with pytest.raises(MlactlError, match="--context 5 is shorter than --new 10"):
        grid([1], [10], context=[5])
