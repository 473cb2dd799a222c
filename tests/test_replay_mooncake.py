"""Replay on Mooncake's real conversation trace, against a plain second count of its ideal.

The trace (kvcache-ai/Mooncake@3b5a5941 `FAST25-release/traces/conversation_trace.jsonl`) is
another project's data and is not committed: point MLACTL_MOONCAKE_TRACE at a copy to run this.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run

TRACE = os.environ.get("MLACTL_MOONCAKE_TRACE", "")


def ideal_block_hit_rate(path: Path) -> float:
    """Share of prompt tokens in 512-token blocks an earlier request already named.

    Mooncake's hash ids chain (a block's id stands for it and everything before it), so a
    request's hit is its leading run of ids seen before, each 512 tokens, capped at its prompt.
    """
    seen: set[int] = set()
    hit = total = 0
    for line in path.read_text().splitlines():
        row = json.loads(line)
        ids, prompt = row["hash_ids"], row["input_length"]
        lead = 0
        while lead < len(ids) and ids[lead] in seen:
            lead += 1
        hit += min(lead * 512, prompt)
        total += prompt
        seen.update(ids)
    return hit / total


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
