"""The request traces `mlactl replay` reads (mlactl/decide/replay/traces.py): Mooncake's JSON
lines and CSV sessions, and one error line per bad line of either."""

from __future__ import annotations

import pytest
from conftest import run

from mlactl.decide.replay.traces import MAX_ERRORS, read_trace
from mlactl.util.errors import MlactlError


def error_lines(result) -> list[str]:
    assert result.exit_code == 2, result.output
    return [line for line in result.output.splitlines() if line.strip()]


# Two lines of kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl (commit a2a4b18a)
MOONCAKE = (
    '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, '
    "11, 12, 13]}\n"
    '{"timestamp": 3000, "input_length": 915, "output_length": 355, "hash_ids": [0, 462]}\n'
)


def test_mooncake_lines(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(MOONCAKE)
    t = read_trace(f)
    assert t.format == "mooncake" and len(t) == 2
    assert t.arrival.tolist() == [0.0, 3.0]  # milliseconds to seconds
    assert t.input.tolist() == [6758, 915] and t.output.tolist() == [500, 355]
    # 6758 + 500 - 1 tokens of KV: 13 full hash blocks, then 2 blocks of its own (its partial
    # block's 102 tokens with its output); the second's partial block is its own too
    ids, _, alts = t.stream(0)
    assert ids[:13] == list(range(13)) and len(ids) == 15 and all(b < 0 for b in ids[13:]) and alts is None
    assert t.stream(1)[0][0] == 0 and len(t.stream(1)[0]) == 3
    assert t.cached.tolist() == [-1, -1] and t.parent.tolist() == [-1, -1]


def test_mooncake_with_fewer_ids_than_blocks_gets_ids_of_its_own(tmp_path):
    # Dynamo's synthesiser writes input_length // 512 ids: the partial last block has none
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 1100, "output_length": 2, "hash_ids": [7, 8]}\n')
    blocks = read_trace(f).stream(0)[0]
    assert blocks[:2] == [7, 8] and len(blocks) == 3 and blocks[2] < 0


def test_csv_sessions_chain_their_blocks(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(
        "\ufeffArrival_S, input_tokens,output_tokens,session,note\n0,1000,100,a,x\n5.5,1200,4,a,y\n6,600,1,,z\n"
    )
    t = read_trace(f)
    assert t.format == "csv" and t.arrival.tolist() == [0.0, 5.5, 6.0]
    first, second = t.stream(0)[0], t.stream(1)[0]
    # one stream a session: turn 1's 1099 tokens of KV (the last output token's is never
    # computed) fill its blocks 0 to 2 (512, 512, 75), turn 2's 1203 the same three (512, 512, 179)
    assert len(first) == 3 and second == first
    assert t.stream(2)[0][0] not in first  # no session: shares nothing


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param("", "empty file", id="empty"),
        pytest.param("[1, 2]\n", "a JSON array; Mooncake traces are JSON lines", id="array"),
        pytest.param("a,b\n1,2\n", "missing arrival_s, input_tokens, output_tokens", id="header"),
        pytest.param("arrival_s,input_tokens,output_tokens\n", "no requests", id="no-rows"),
    ],
)
def test_whole_file_errors(tmp_path, text, message):
    f = tmp_path / "t"
    f.write_text(text)
    with pytest.raises(MlactlError, match=message):
        read_trace(f)


def test_every_bad_line_gets_its_own_error_line(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}\n'
        '{"timestamp": 5, "input_length": 0, "output_length": 2, "hash_ids": []}\n'
        "\n"
        '{"timestamp": 6, "input_length": 100, "output_length": 2, "hash_ids": [1, 2]}\n'
        "not json\n"
        '{"timestamp": 1, "input_length": 100, "output_length": 2, "hash_ids": []}\n'
        '{"timestamp": 9, "input_length": 100.5, "output_length": 2, "hash_ids": ["x"]}\n'
        '{"timestamp": 9, "input_length": 100, "hash_ids": []}\n'
    )
    lines = error_lines(run("replay", f, ok=False))
    assert len(lines) == 6
    assert all(line.startswith(f"Error: {f}: line ") for line in lines)
    want = [
        ("line 2:", "input_length must be between 1"),
        ("line 4:", "2 hash_ids for 1 blocks of 512 tokens"),
        ("line 5:", "not a JSON object"),
        ("line 6:", "arrival 0.001 s is before the previous request's 0.006 s"),  # line 4's, bad as it is
        ("line 7:", "input_length must be a whole number"),
        ("line 8:", "missing output_length"),
    ]
    for line, (where, what) in zip(lines, want):
        assert where in line and what in line, line


def test_csv_bad_lines(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(
        "arrival_s,input_tokens,output_tokens,cached_tokens,session\n"
        "0,100,2,,s\n"
        "inf,100,2,,\n"
        "1,100,2,101,\n"
        "1,100,2\n"
        "2,50,2,,s\n"
        "3,4K,2,,\n"
    )
    lines = error_lines(run("replay", f, ok=False))
    assert [line.split(": line ")[1].split(":")[0] for line in lines] == ["3", "4", "5", "6", "7"]
    assert "arrival_s 'inf' is not a number" in lines[0]  # ASCII decimal only (mlactl.util.numbers)
    assert "cached_tokens 101 is more than input_tokens 100" in lines[1]
    assert "3 fields, the header has 5" in lines[2]
    assert "shorter than the previous turn's prompt and output (102 tokens, line 2)" in lines[3]
    assert "input_tokens '4K' is not a whole number" in lines[4]


def test_reading_stops_after_so_many_bad_lines(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,input_tokens,output_tokens\n" + "x,1,1\n" * (MAX_ERRORS + 10))
    lines = error_lines(run("replay", f, ok=False))
    assert len(lines) == MAX_ERRORS + 1 and f"stopped after {MAX_ERRORS} bad lines" in lines[-1]


def test_a_long_line_is_refused(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text("{" + " " * (1 << 20) + "\n")
    with pytest.raises(MlactlError, match="line 1: longer than"):
        read_trace(f)


def test_unreadable_trace(tmp_path):
    lines = error_lines(run("replay", tmp_path / "missing.jsonl", ok=False))
    assert len(lines) == 1 and "cannot read trace" in lines[0]
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00x")
    assert "not UTF-8" in error_lines(run("replay", tmp_path / "bin", ok=False))[0]
