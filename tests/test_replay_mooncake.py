"""Replay on Mooncake's real conversation trace, against a plain second count of its ideal.

The trace (kvcache-ai/Mooncake@3b5a5941 `FAST25-release/traces/conversation_trace.jsonl`) is
another project's data and is not committed: point MLACTL_MOONCAKE_TRACE at a copy to run this.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from conftest import run

TRACE = os.environ.get("MLACTL_MOONCAKE_TRACE", "")
BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "replay_side_by_side.py"


def ideal_block_hit_rate(path: Path) -> float:
    """Share of prompt tokens in 512-token blocks an earlier request already named, by the plain
    count of benchmarks/replay_side_by_side.py (its leading run of ids seen before, capped at
    its prompt; tests/test_replay_side_by_side.py checks it on a trace worked by hand)."""
    spec = importlib.util.spec_from_file_location("replay_side_by_side", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ideal_hit_rate(path)["hit_rate"]


@pytest.mark.skipif(not TRACE, reason="MLACTL_MOONCAKE_TRACE does not name Mooncake's conversation trace")
def test_real_conversation_trace_hit_rate_lies_between_block_ideal_and_45_5_percent(tmp_path):
    ideal = ideal_block_hit_rate(Path(TRACE))
    assert 0.372 < ideal < 0.376  # 37.4% by block, as counted before continuations were credited
    out = run("replay", TRACE, "--hardware", "h200", "--tp", "8", "--cache-tokens", "1000000000", "-f", "json")
    data = json.loads(out.output[out.output.index("{") :])  # after the warning that no GPU holds it
    assert data["trace"]["requests"] == 12031
    for engine in data["engines"]:
        rate = engine["cache"]["hit_rate"]
        # an unbounded cache credits continuations on top of the block ideal, never beyond 45.5%
        assert ideal <= rate <= 0.455, (engine["name"], rate, ideal)
