"""`mlactl.replay`: a request trace through each engine's scheduler and prefix cache."""

from __future__ import annotations

from pathlib import Path

from mlactl.api.common import Result, _engine_names, _setup
from mlactl.decide import setup as settings
from mlactl.decide.engines import steps as replay_rules
from mlactl.decide.replay.replay import Replay, ReplaySettings
from mlactl.decide.replay.replay import replay as run_replay
from mlactl.decide.replay.traces import read_trace
from mlactl.model import weights as model_weights
from mlactl.output import replay as replay_out
from mlactl.util import progress
from mlactl.util.defaults import DEFAULT_MODEL, REPLAY_HARDWARE, REPLAY_TP


def replay(
    trace: str | Path,
    model: str | None = None,
    hardware: str | None = None,
    *,
    tp: int | None = None,
    kv_dtype: str | None = None,
    dtype: str | None = None,
    chunk: int | None = None,
    weight_dtype: str | None = None,
    engines=None,
    engine_options=(),
    scheduler: dict | None = None,
    max_batch_tokens: int | None = None,
    max_running: int | None = None,
    mem_fraction: float | None = None,
    cache_tokens: int | None = None,
    prefix_cache: bool = True,
    step_overhead_ms: float = 0.0,
    calibration: str | Path | None = None,
    keep_steps: bool = False,
    jobs: int | None = None,
) -> Result[Replay]:
    """`mlactl replay`: a request trace (Mooncake JSON lines, or a CSV) through each engine's
    scheduler and prefix cache, every step priced under the engine's rule and the best paths.
    Unset, the GPU is an H200 and TP 8 (a serving node), as the command's defaults. `scheduler`
    sets the engines' own scheduler options ({"sglang": {"chunked_prefill_size": 16384}});
    `mem_fraction` None: each engine's own share of the GPU's memory;
    `keep_steps` keeps every step for the CSV. `value` is a Replay."""
    s = _setup(
        model, hardware, tp, kv_dtype, dtype, chunk, calibration,
        defaults={"hardware": REPLAY_HARDWARE, "tp": REPLAY_TP},
    )  # fmt: skip
    weights = model_weights.resolve(model or DEFAULT_MODEL, weight_dtype)
    chosen = replay_rules.parse(_engine_names(engines), list(engine_options or ()), s.cfg, s.hw, s.kv_dtype)
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
