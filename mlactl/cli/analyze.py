"""`mlactl analyze`: every path of every shape, op by op; the best path; the crossover."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mlactl.api import grid as api
from mlactl.cli import complete
from mlactl.cli.common import (
    calibration_line,
    command,
    emit,
    load_model,
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
)
from mlactl.model.shapes import check_context
from mlactl.output import render
from mlactl.output.report import write_analysis_csv
from mlactl.util import safe

analyze_app = typer.Typer(add_completion=False)


@command(analyze_app, "analyze", *MACHINE, end=OUTPUT)
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
    scope: Annotated[
        str,
        typer.Option(
            "--scope",
            help="attention (the paths), or model: also each row's whole forward pass at this TP "
            "(attention by the best path on every layer, the MLA projections, dense MLP, MoE router and "
            "experts, LM head and all-reduces, each at its roofline).",
        ),
    ] = "attention",
    weight_dtype: Annotated[
        Optional[str],
        typer.Option(
            "--weight-dtype",
            help="With --scope model: the weights outside attention, bf16, fp16 or fp8 (default: the model's).",
        ),
    ] = None,
    policy: Annotated[
        Optional[str],
        typer.Option(
            "--policy",
            help="Also show this policy's choice and what it loses: roofline, flops, measured, or an engine "
            "(sglang, sglang-triton, sglang-trtllm, vllm, or ENGINE@VERSION such as sglang@0.5.14).",
            autocompletion=complete.policies,
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
    api.check_policy(policy, results, opts.model, lambda: load_model(opts.model, opts.tp))
    setup = resolve(opts, [results] if results is not None else (), find_results=policy == "measured")
    cfg, cal = setup.cfg, setup.calibration
    answer = api.analyze(
        setup=setup,
        batch=batch,
        new=new,
        prefix=prefix,
        context=context,
        layers=layers,
        engines=engines,
        engine_options=engine_option or (),
        policy=policy,
        results=results,
        scope=scope,
        weight_dtype=weight_dtype,
        model=opts.model,
        fmt=fmt,
    )
    result = answer.value
    check_context(cfg, result.context)
    results_data = setup.results[0] if setup.results else None
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
    elif result.cost.windows:
        tables.append(
            f"{cfg.attention} model: --crossover for the windows where masked or dense MHA beats sparse absorb"
        )
    else:
        asym = result.crossover.asymptotic_new
        tables.append(
            "Crossover (asymptotic, by FLOPs): "
            + ("none (expand never takes fewer FLOPs)" if asym is None else f"{asym:.1f} new tokens")
            + "; --crossover for the table per prefix"
        )

    emit(
        fmt,
        opts.output,
        json_data=answer.to_json,
        write_csv=lambda fh: write_analysis_csv(fh, result, ops=ops),
        tables=tables,
    )
