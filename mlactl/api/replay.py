"""`mlactl.replay`: a request trace through each engine's scheduler and prefix cache."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mlactl.api.common import Result, Settings, _engines, _setup
from mlactl.decide import setup as settings
from mlactl.decide.engines import steps as replay_rules
from mlactl.decide.replay.replay import Replay, ReplaySettings
from mlactl.decide.replay.replay import replay as run_replay
from mlactl.decide.replay.traces import read_trace
from mlactl.model import weights as model_weights
from mlactl.output import replay as replay_out
from mlactl.util import progress
from mlactl.util.defaults import DEFAULT_MODEL, REPLAY_HARDWARE, REPLAY_TP

if TYPE_CHECKING:
    from typing_extensions import Unpack


def replay(
    trace: str | Path,
    model: str | None = None,
    hardware: str | None = None,
    *,
    weight_dtype: str | None = None,
    scheduler: dict | None = None,
    max_batch_tokens: int | None = None,
    max_running: int | None = None,
    mem_fraction: float | None = None,
    cache_tokens: int | None = None,
    prefix_cache: bool = True,
    step_overhead_ms: float = 0.0,
    keep_steps: bool = False,
    jobs: int | None = None,
    **given: Unpack[Settings],
) -> Result[Replay]:
    """`mlactl replay`: a request trace (Mooncake JSON lines, or a CSV) through each engine's
    scheduler and prefix cache, every step priced under the engine's rule and the best paths,
    under the `Settings`. Unset, the GPU is an H200 and TP 8 (a serving node), as the command's defaults. `scheduler`
    sets the engines' own scheduler options ({"sglang": {"chunked_prefill_size": 16384}});
    `mem_fraction` None: each engine's own share of the GPU's memory;
    `keep_steps` keeps every step for the CSV. `value` is a Replay."""
    s = _setup("replay", model, hardware, given, defaults={"hardware": REPLAY_HARDWARE, "tp": REPLAY_TP})
    weights = model_weights.resolve(model or DEFAULT_MODEL, weight_dtype)
    chosen = replay_rules.parse(*_engines(given), s.cfg, s.hw, s.kv_dtype)
    knobs = ReplaySettings(
        max_batch_tokens=None if max_batch_tokens is None else settings.one_int(max_batch_tokens, "--max-batch-tokens"),
        max_running=None if max_running is None else settings.one_int(max_running, "--max-running"),
        engine_settings=dict(scheduler or {}),
        mem_fraction=None if mem_fraction is None else float(mem_fraction),
        cache_tokens=None if cache_tokens is None else settings.one_int(cache_tokens, "--cache-tokens"),
        prefix_cache=prefix_cache,
        step_overhead_s=float(step_overhead_ms) / 1e3,
    )
    with progress.task(f"reading {trace}"):
        requests = read_trace(trace)
    with progress.task(f"replaying {len(requests):,} requests through {len(chosen)} engine rule(s)"):
        result = run_replay(
            requests,
            s.cfg,
            weights,
            s.hw,
            chosen,
            knobs,
            kv_dtype=s.kv_dtype,
            dtype=s.dtype,
            chunk=s.chunk,
            calibration=s.calibration,
            keep_steps=keep_steps,
            jobs=jobs,
        )
    return Result(result, s, lambda: replay_out.to_json(result), lambda fh: replay_out.write_csv(fh, result))
