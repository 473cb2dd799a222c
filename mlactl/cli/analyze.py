"""`mlactl analyze`: every path of every shape, op by op; the best path; the crossover."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mlactl.cli.common import (
    calibration_json,
    calibration_line,
    choice,
    cli_errors,
    emit,
    load_model,
    one_int,
    output_format,
    resolve,
    table_width,
)
from mlactl.cli.options import (
    MACHINE,
    OUTPUT,
    BatchOpt,
    ContextOpt,
    EngineOptionOpt,
    EnginesOpt,
    LayersOpt,
    NewOpt,
    Opts,
    shared,
)
from mlactl.decide import analysis
from mlactl.decide.engines import context_for, is_engine, parse_engines, parse_policy
from mlactl.model.shapes import grid, parse_sizes
from mlactl.output import render
from mlactl.output.report import to_json, write_analysis_csv
from mlactl.util import progress, safe
from mlactl.util.defaults import POLICIES
from mlactl.util.errors import MlactlError
from mlactl.util.limits import check_points

analyze_app = typer.Typer(add_completion=False)


@analyze_app.command(name="analyze")
@cli_errors
@shared(*MACHINE, end=OUTPUT)
def analyze(
    opts: Opts,
    batch: BatchOpt = "1",
    new: NewOpt = "1,64,128,256,1024,4096",
    prefix: Annotated[
        Optional[str],
        typer.Option(
            "--prefix",
            "-p",
            help="Cached tokens before the new ones: list or range, e.g. 0:32K:4K (K = 1024) (default: 0,8K,32K).",
        ),
    ] = None,
    context: ContextOpt = None,
    layers: LayersOpt = "1",
    engines: EnginesOpt = None,
    engine_option: EngineOptionOpt = None,
    ops: Annotated[bool, typer.Option("--ops", help="Also show every op (table) or add op columns (csv).")] = False,
    crossover: Annotated[
        bool, typer.Option("--crossover", help="Also print the crossover table (always in JSON).")
    ] = False,
    policy: Annotated[
        Optional[str],
        typer.Option(
            "--policy",
            help="Also show this policy's choice and what it loses: roofline, flops, measured, or an engine "
            "(sglang, sglang-triton, sglang-trtllm, vllm, or ENGINE@VERSION such as sglang@0.5.14).",
        ),
    ] = None,
    results: Annotated[
        Optional[Path],
        typer.Option(
            "--results",
            help="Results file of `mlactl tune paths` for --policy measured; its model, tp, dtypes and "
            "hardware are used (default: the newest for this model).",
        ),
    ] = None,
):
    """FLOPs, bytes, intensity and roofline time of each path, op by op; the best path; the crossover.

    Each row also shows what each engine's own rule runs (default: sglang and vllm) and the time
    it loses against the best path that fits; docs/engines.md cites each rule's source.

    A DSA model (deepseek-v3.2, or a config with index_topk, index_n_heads, index_head_dim) has
    the paths sparse_absorb, masked_expand and dense_expand (context at most top-k), and each
    engine's DSA rule: SGLang's dense one-shot threshold, vLLM's sparse backends with dense and
    masked MHA.

    Example: mlactl analyze --model deepseek-v3 --hardware h200 --new 1:4096:*2 --prefix 0,32K
    (with --calibration NAME: calibrated time, see `mlactl calibrate`)
    """

    fmt = output_format(opts.fmt, opts.output)
    if policy is not None and not is_engine(policy):
        choice(policy, "--policy", POLICIES)
    if policy == "measured" and results is None and load_model(opts.model, opts.tp).is_dsa:
        raise MlactlError(
            f"--policy measured: {opts.model} is a DSA model and `mlactl tune paths` measures MLA paths only; "
            "use roofline, flops or an engine"
        )
    if results is not None and policy != "measured":
        raise MlactlError("--results goes with --policy measured")
    setup = resolve(opts, [results] if results is not None else (), find_results=policy == "measured")
    cfg, cal = setup.cfg, setup.calibration
    if prefix is not None and context is not None:
        raise MlactlError("give either --prefix or --context, not both")
    b, n, p = grid(
        parse_sizes(batch, "--batch"),
        parse_sizes(new, "--new"),
        prefix=None if context is not None else parse_sizes(prefix or "0,8K,32K", "--prefix", minimum=0),
        context=parse_sizes(context, "--context") if context is not None else None,
    )
    n_layers = cfg.layers if layers.strip().lower() == "all" else one_int(layers, "--layers")
    ctx = context_for(cfg, setup.hw, setup.kv_dtype)
    engine_params = parse_engines(engines, engine_option, ctx)
    # an engine policy takes the same --engine-options it would take among --engines
    chosen_policy = parse_policy(policy, engines, engine_option, ctx) if policy and is_engine(policy) else policy
    check_points(len(b), fmt)
    results_data = setup.results[0] if setup.results else None
    with progress.task(f"analysing {len(b):,} points"):
        result = analysis.analyze(
            cfg,
            setup.hw,
            b,
            n,
            p,
            kv_dtype=setup.kv_dtype,
            dtype=setup.dtype,
            chunk=setup.chunk,
            layers=n_layers,
            engines=engine_params,
            policy=chosen_policy,
            results_data=results_data,
            calibration=cal,
        )
    width, terminal = table_width(opts.output)
    tables = [
        render.header(result),
        *result.notes,
        render.analysis_table(result, width=width, drop=terminal),
        *render.engine_lines(result.engines),
    ]
    lines = [calibration_line(cal)] if cal is not None else []
    if results_data is not None:
        device = results_data["device"]["name"]
        lines.append(f"measured policy: {safe.markup(results_data['_path'])} ({safe.markup(device)})")
    tables[1:1] = lines + setup.markup_notes()
    if ops:
        tables.append(render.ops_table(result))
    if crossover:
        tables.append(render.crossover_table(result.crossover))
    elif cfg.is_dsa:
        tables.append("DSA model: --crossover for the windows where masked or dense MHA beats sparse absorb")
    else:
        asym = result.crossover.asymptotic_new
        tables.append(
            "Crossover (asymptotic, by FLOPs): "
            + ("none (expand never takes fewer FLOPs)" if asym is None else f"{asym:.1f} new tokens")
            + "; --crossover for the table per prefix"
        )

    def json_data():
        return dict(to_json(result), **calibration_json(cal))

    def csv_data(fh):
        write_analysis_csv(fh, result, ops=ops)

    emit(fmt, opts.output, json_data=json_data, write_csv=csv_data, tables=tables)
