"""`mlactl replay`: a request trace through each engine's scheduler and prefix cache, and what
each engine's path rule costs on that traffic. Parse, call mlactl.decide.replay, render."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mlactl.cli.common import choice, command, emit, one_int, output_format, resolve
from mlactl.cli.options import MACHINE, OUTPUT, AllEnginesOpt, EngineOptionOpt, Opts
from mlactl.decide.engines import steps as rules
from mlactl.decide.replay.replay import ReplaySettings, replay
from mlactl.decide.replay.shipped import FRACTION_OPTIONS, REAL_OPTIONS, SCHEDULER_OPTIONS, WORD_OPTIONS, word_option
from mlactl.decide.replay.traces import read_trace
from mlactl.model import weights as model_weights
from mlactl.output import replay as report
from mlactl.util import numbers, progress
from mlactl.util.defaults import REPLAY_HARDWARE, REPLAY_TP, WEIGHT_DTYPES
from mlactl.util.errors import MlactlError
from mlactl.util.io import refuse_input

replay_app = typer.Typer(add_completion=False)


# a serving node's defaults
@command(replay_app, "replay", *MACHINE, end=OUTPUT, hardware=REPLAY_HARDWARE, tp=str(REPLAY_TP))
def replay_cmd(
    trace: Annotated[
        Path,
        typer.Argument(
            help="Mooncake JSON lines (timestamp ms, input_length, output_length, hash_ids) or a CSV with "
            "arrival_s,input_tokens,output_tokens and optionally cached_tokens, session (told from the content)."
        ),
    ],
    opts: Opts,
    weight_dtype: Annotated[
        Optional[str],
        typer.Option(
            "--weight-dtype",
            help="Weights outside attention: bf16, fp16 or fp8 (default: the model's; fp8 for DeepSeek-V3, Kimi K2).",
        ),
    ] = None,
    engines: AllEnginesOpt = None,
    engine_option: EngineOptionOpt = None,
    max_batch_tokens: Annotated[
        Optional[str],
        typer.Option(
            "--max-batch-tokens",
            help="New tokens a step takes at most, every engine (vLLM max_num_batched_tokens, SGLang "
            "chunked_prefill_size; default: each engine's own for the GPU's memory).",
        ),
    ] = None,
    max_running: Annotated[
        Optional[str],
        typer.Option(
            "--max-running",
            help="Requests running at once at most, every engine (max_num_seqs, max_running_requests; "
            "default: each engine's own).",
        ),
    ] = None,
    mem_fraction: Annotated[
        Optional[str],
        typer.Option(
            "--mem-fraction",
            help="Share of the GPU's memory for the weights and the KV cache together, every engine "
            "(default: each engine's own: SGLang's mem_fraction_static as it derives it, vLLM's "
            "gpu_memory_utilization 0.92).",
        ),
    ] = None,
    cache_tokens: Annotated[
        Optional[str],
        typer.Option(
            "--cache-tokens",
            help="KV cache size in tokens, every engine, instead of what its memory fraction leaves after the weights.",
        ),
    ] = None,
    no_prefix_cache: Annotated[
        bool, typer.Option("--no-prefix-cache", help="No prefix caching: every prompt is computed whole.")
    ] = False,
    step_overhead_ms: Annotated[
        str,
        typer.Option("--step-overhead-ms", help="Milliseconds every step adds to the clock (scheduling, launches)."),
    ] = "0",
    jobs: Annotated[
        Optional[str],
        typer.Option("--jobs", help="Engines replayed side by side, in that many processes (default: one per CPU)."),
    ] = None,
    forward_tables: Annotated[
        Optional[str],
        typer.Option(
            "--forward-tables",
            metavar="SYS/FW",
            help="Time the clock's ops outside attention (GEMMs, routed experts, all-reduces) from "
            "aiconfigurator-core's measured tables of this system and framework, e.g. h200_sxm/sglang "
            "(SYS/FW/VERSION for a version; default: the roofline). Ops they did not measure stay there.",
        ),
    ] = None,
    tables_dir: Annotated[
        Optional[str],
        typer.Option(
            "--tables-dir", metavar="DIR", help="Read --forward-tables from here (default: the installed ones)."
        ),
    ] = None,
):
    """Replay a request trace through each engine's scheduler and prefix cache, and say what its
    path rule costs on that traffic: attention time over the trace, the time lost against the
    best path per step and per request on the same steps, the share of steps and tokens per
    path, where it loses by step type, and the threshold that would lose least (every value
    that changes a path is tried).

    Each engine forms its own steps once, continuous batching with chunked prefill its own way
    (vLLM: decodes and chunks in one step; SGLang: extend and decode batches apart unless
    --engine-option sglang.enable_mixed_chunk=true), with its own chunk, request cap and page
    for the GPU (settable under its own option names: sglang.chunked_prefill_size,
    sglang.max_running_requests, sglang.page_size, vllm.max_num_batched_tokens,
    vllm.max_num_seqs, vllm.block_size), SGLang's queue order (sglang.schedule_policy: fcfs as
    shipped, or lpm: the longest cached prefix first while at most 128 wait), its own admission
    (vLLM: a first chunk's slots, and the newest running request preempted when slots run out;
    SGLang: prompt and output beside new_token_ratio of the running outputs, and decoders
    retracted when the next decode does not fit) and an LRU prefix cache that keeps each
    finished request's prompt and output; the clock runs at the roofline time of each step's
    whole forward (attention of every layer by the engine's rule; the MLA projections, dense MLP,
    router, shared and routed experts and LM head, each op at its own roofline; two
    all-reduces a layer at TP over the profile's NVLink; --step-overhead-ms; with --forward-tables
    the ops outside attention that aiconfigurator-core measured take its times). Each loss is
    given as a share of attention and of the GPU's time. docs/replay.md has the model and how
    it differs from the engines' own schedulers.

    Rules are versioned as the engines ship (ENGINE@VERSION; a bare name is the newest; `mlactl
    engines --list`) and resolved for the GPU's architecture and the cache dtype: each prints
    the backend it runs and why, and --engine-option sets the engine's own options.

    A DSA model (--model deepseek-v3.2) is replayed under the engines' DSA rules (sglang and
    vllm by default; paths sparse_absorb, masked_expand, dense_expand; SGLang's swept threshold
    is its dense one), with the indexer's cache row in the KV pool (docs/replay.md).

    Times are roofline, or calibrated with --calibration (each engine's time, best and losses
    then with their 80% intervals). `-f json` for the report (and `mlactl plot replay`), `-f csv`
    for one row per engine and step.

    Example: mlactl replay conversation_trace.jsonl --hardware h200 --tp 8 -o replay.json

    Example: mlactl replay trace.jsonl --engines sglang@0.5.14,sglang@0.5.23,vllm --kv-dtype fp8
    """

    fmt = output_format(opts.fmt, opts.output)
    setup = resolve(opts)
    cfg, hw, kv = setup.cfg, setup.hw, setup.kv_dtype
    if weight_dtype is not None:
        choice(weight_dtype, "--weight-dtype", WEIGHT_DTYPES)
    weights = model_weights.resolve(opts.model, weight_dtype)
    rule_options, engine_settings = scheduler_options(engine_option)
    chosen = rules.parse(engines, rule_options, cfg, hw, kv)
    _check_targets(engine_settings, chosen)
    settings = ReplaySettings(
        max_batch_tokens=None if max_batch_tokens is None else one_int(max_batch_tokens, "--max-batch-tokens"),
        max_running=None if max_running is None else one_int(max_running, "--max-running"),
        engine_settings=engine_settings,
        mem_fraction=(
            None if mem_fraction is None else numbers.real(mem_fraction, "--mem-fraction", 0.0, 1.0, above=True)
        ),
        cache_tokens=None if cache_tokens is None else one_int(cache_tokens, "--cache-tokens"),
        prefix_cache=not no_prefix_cache,
        step_overhead_s=numbers.real(step_overhead_ms, "--step-overhead-ms", 0.0, 1e6) / 1e3,
        forward_tables=forward_tables,
        tables_dir=tables_dir,
    )
    with progress.task(f"reading {trace}"):
        requests = read_trace(trace)
    # the trace is read (and remembered): an -o naming it is refused now, before the replay runs
    if opts.output is not None:
        refuse_input(opts.output, "--output")
    with progress.task(f"replaying {len(requests):,} requests through {len(chosen)} engine rule(s)"):
        result = replay(
            requests,
            cfg,
            weights,
            hw,
            chosen,
            settings,
            kv_dtype=kv,
            dtype=setup.dtype,
            chunk=setup.chunk,
            calibration=setup.calibration,
            keep_steps=fmt == "csv",
            jobs=None if jobs is None else one_int(jobs, "--jobs"),
        )
    emit(
        fmt,
        opts.output,
        json_data=lambda: report.to_json(result),
        write_csv=lambda fh: report.write_csv(fh, result),
        tables=[*setup.markup_notes(), *report.tables(result)],
    )


def scheduler_options(options: list[str] | None) -> tuple[list[str], dict]:
    """`--engine-option`s that set replay's scheduler under the engine's own name
    (shipped.SCHEDULER_OPTIONS: SGLang's chunked_prefill_size, max_running_requests, page_size,
    schedule_policy (a word: shipped.WORD_OPTIONS), mem_fraction_static (a fraction),
    schedule_conservativeness (a number: shipped.REAL_OPTIONS); vLLM's
    max_num_batched_tokens, gpu_memory_utilization) apart from
    the rule's: (the rule's, {engine or family: {key: value}})."""
    family_of = {k: fam for fam, keys in SCHEDULER_OPTIONS.items() for k in keys}
    rest: list[str] = []
    out: dict[str, dict] = {}
    for text in options or []:
        key, eq, value = text.partition("=")
        target, dot, name = key.strip().rpartition(".")
        fam = family_of.get(name.strip())
        if not eq or fam is None:
            rest.append(text)
            continue
        target = target if dot else fam
        if not (target == fam or target.startswith((fam + "@", fam + "-"))):
            raise MlactlError(f"--engine-option {text!r}: {name.strip()} is an option of {fam}, not of {target}")
        name = name.strip()
        if name in WORD_OPTIONS:
            out.setdefault(target, {})[name] = word_option(fam, name, value)
        elif name in REAL_OPTIONS:
            lo, hi = REAL_OPTIONS[name]
            out.setdefault(target, {})[name] = numbers.real(value, f"--engine-option {text!r}", lo, hi)
        elif name == FRACTION_OPTIONS[fam]:
            out.setdefault(target, {})[name] = numbers.real(value, f"--engine-option {text!r}", 0.0, 1.0, above=True)
        else:
            out.setdefault(target, {})[name] = one_int(value, f"--engine-option {text!r}")
    return rest, out


def _check_targets(settings: dict, chosen) -> None:
    names = {e.name for e in chosen} | {e.family for e in chosen}
    for target in settings:
        if target not in names:
            raise MlactlError(
                f"--engine-option {target}.*: {target} is not among --engines ({', '.join(sorted(names))})"
            )
