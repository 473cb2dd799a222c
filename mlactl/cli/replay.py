"""`mlactl replay`: a request trace through each engine's scheduler and prefix cache, and what
each engine's path rule costs on that traffic. Parse, call mlactl.decide.replay, render."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from mlactl.cli.common import (
    DTYPES,
    choice,
    cli_errors,
    emit,
    load_calibration,
    load_hardware,
    load_model,
    one_int,
    output_format,
)
from mlactl.cli.options import (
    AllEnginesOpt,
    CalibrationOpt,
    ChunkOpt,
    DtypeOpt,
    EngineOptionOpt,
    FormatOpt,
    HardwareOpt,
    KvDtypeOpt,
    MeasuredOpt,
    ModelOpt,
    OutputOpt,
    TpOpt,
)
from mlactl.decide.replay import rules
from mlactl.decide.replay.replay import ReplaySettings, replay
from mlactl.decide.replay.traces import read_trace
from mlactl.model import weights as model_weights
from mlactl.output import replay as report
from mlactl.util.defaults import (
    DEFAULT_CHUNK,
    KV_DTYPES,
    REPLAY_HARDWARE,
    REPLAY_MAX_BATCH_TOKENS,
    REPLAY_MAX_RUNNING,
    REPLAY_MEM_FRACTION,
    REPLAY_TP,
    WEIGHT_DTYPES,
)
from mlactl.util.errors import MlactlError

replay_app = typer.Typer(add_completion=False)


def refuse_overwrite(output: Optional[Path], source: Path, what: str) -> None:
    """-o must not name the file being read: the run would replace what it replays."""
    try:
        same = output is not None and output.exists() and source.exists() and os.path.samefile(output, source)
    except OSError:
        same = False
    if same:
        raise MlactlError(f"--output {output} is {what} being read; write the report elsewhere")


def _number(text: str, option: str, low: float, high: float = math.inf, low_open: bool = False) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
        bound = f"above {low:g}" if low_open else f"of at least {low:g}"
        upper = "" if high == math.inf else f" and at most {high:g}"
        raise MlactlError(f"{option} must be a number {bound}{upper}, got {text!r}")
    return value


@replay_app.command(name="replay")
@cli_errors
def replay_cmd(
    trace: Annotated[
        Path,
        typer.Argument(
            help="Mooncake JSON lines (timestamp ms, input_length, output_length, hash_ids) or a CSV with "
            "arrival_s,input_tokens,output_tokens and optionally cached_tokens, session (told from the content)."
        ),
    ],
    model: ModelOpt = "deepseek-v3",
    hardware: HardwareOpt = REPLAY_HARDWARE,
    measured: MeasuredOpt = False,
    tp: TpOpt = str(REPLAY_TP),
    kv_dtype: KvDtypeOpt = "bf16",
    dtype: DtypeOpt = "bf16",
    weight_dtype: Annotated[
        Optional[str],
        typer.Option(
            "--weight-dtype",
            help="Weights outside attention: bf16, fp16 or fp8 (default: the model's; fp8 for DeepSeek-V3, Kimi K2).",
        ),
    ] = None,
    chunk: ChunkOpt = str(DEFAULT_CHUNK),
    engines: AllEnginesOpt = None,
    engine_option: EngineOptionOpt = None,
    max_batch_tokens: Annotated[
        str,
        typer.Option(
            "--max-batch-tokens",
            help="New tokens a step takes at most (vLLM max_num_batched_tokens, SGLang chunked_prefill_size).",
        ),
    ] = str(REPLAY_MAX_BATCH_TOKENS),
    max_running: Annotated[
        str,
        typer.Option("--max-running", help="Requests running at once at most (max_num_seqs, max_running_requests)."),
    ] = str(REPLAY_MAX_RUNNING),
    mem_fraction: Annotated[
        str,
        typer.Option("--mem-fraction", help="Share of the GPU's memory for the weights and the KV cache together."),
    ] = str(REPLAY_MEM_FRACTION),
    cache_tokens: Annotated[
        Optional[str],
        typer.Option(
            "--cache-tokens", help="KV cache size in tokens, instead of what --mem-fraction leaves after the weights."
        ),
    ] = None,
    no_prefix_cache: Annotated[
        bool, typer.Option("--no-prefix-cache", help="No prefix caching: every prompt is computed whole.")
    ] = False,
    step_overhead_ms: Annotated[
        str,
        typer.Option("--step-overhead-ms", help="Milliseconds every step adds to the clock (scheduling, launches)."),
    ] = "0",
    calibration: CalibrationOpt = None,
    jobs: Annotated[
        Optional[str],
        typer.Option("--jobs", help="Engines replayed side by side, in that many processes (default: one per CPU)."),
    ] = None,
    fmt: FormatOpt = None,
    output: OutputOpt = None,
):
    """Replay a request trace through each engine's scheduler and prefix cache, and say what its
    path rule costs on that traffic: attention time over the trace, the time lost against the
    best path per step and per request on the same steps, the share of steps and tokens per
    path, where it loses by step type, and the threshold that would lose least (every value
    that changes a path is tried).

    Each engine forms its own steps once, continuous batching with chunked prefill its own way
    (vLLM: decodes and chunks in one step; SGLang: extend and decode batches apart unless
    --engine-option sglang.enable_mixed_chunk=true), with an LRU prefix cache of 512-token
    blocks; the clock runs at the roofline time of each step (attention of every layer by the
    engine's rule, the other weights read once, --step-overhead-ms). docs/replay.md has the
    model and how it differs from the engines' own schedulers.

    Rules are versioned as the engines ship (ENGINE@VERSION; a bare name is the newest; `mlactl
    engines --list`) and resolved for the GPU's architecture and the cache dtype: each prints
    the backend it runs and why, and --engine-option sets the engine's own options.

    A DSA model (--model deepseek-v3.2) is replayed under the engines' DSA rules (sglang and
    vllm by default; paths sparse_absorb, masked_expand, dense_expand; SGLang's swept threshold
    is its dense one), with the indexer's cache row in the KV pool (docs/replay.md).

    Times are roofline, or calibrated with --calibration. `-f json` for the report (and `mlactl
    plot replay`), `-f csv` for one row per engine and step.

    Example: mlactl replay conversation_trace.jsonl --hardware h200 --tp 8 -o replay.json

    Example: mlactl replay trace.jsonl --engines sglang@0.5.14,sglang@0.5.23,vllm --kv-dtype fp8
    """

    fmt = output_format(fmt, output)
    refuse_overwrite(output, trace, "the trace")
    cfg = load_model(model, tp)
    hw = load_hardware(hardware, measured)
    cal = load_calibration(calibration, hw)
    if weight_dtype is not None:
        choice(weight_dtype, "--weight-dtype", WEIGHT_DTYPES)
    weights = model_weights.resolve(model, weight_dtype)
    kv = choice(kv_dtype, "--kv-dtype", KV_DTYPES)
    chosen = rules.parse(engines, engine_option, cfg, hw, kv)
    settings = ReplaySettings(
        max_batch_tokens=one_int(max_batch_tokens, "--max-batch-tokens"),
        max_running=one_int(max_running, "--max-running"),
        mem_fraction=_number(mem_fraction, "--mem-fraction", 0.0, 1.0, low_open=True),
        cache_tokens=None if cache_tokens is None else one_int(cache_tokens, "--cache-tokens"),
        prefix_cache=not no_prefix_cache,
        step_overhead_s=_number(step_overhead_ms, "--step-overhead-ms", 0.0) / 1e3,
    )
    act = choice(dtype, "--dtype", DTYPES)
    size = one_int(chunk, "--chunk")
    result = replay(
        read_trace(trace),
        cfg,
        weights,
        hw,
        chosen,
        settings,
        kv_dtype=kv,
        dtype=act,
        chunk=size,
        calibration=cal,
        keep_steps=fmt == "csv",
        jobs=None if jobs is None else one_int(jobs, "--jobs"),
    )
    emit(
        fmt,
        output,
        json_data=lambda: report.to_json(result),
        write_csv=lambda fh: report.write_csv(fh, result),
        tables=report.tables(result),
    )
