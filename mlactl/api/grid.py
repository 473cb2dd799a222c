"""`mlactl.analyze` and `mlactl.crossover`: a grid of shapes, and the crossover per prefix."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mlactl.api.common import Machine, Result, Settings, Sizes, _engines, _setup, sizes
from mlactl.decide import analysis as analysis_mod
from mlactl.decide import forward as forward_mod
from mlactl.decide import setup as settings
from mlactl.decide.analysis import Analysis, Crossover
from mlactl.decide.engines import context_for, is_engine, parse_engines, parse_policy
from mlactl.decide.setup import Setup
from mlactl.model import weights as model_weights
from mlactl.model.shapes import grid
from mlactl.output import report
from mlactl.util import limits, progress
from mlactl.util.defaults import DEFAULT_MODEL, POLICIES
from mlactl.util.errors import MlactlError

if TYPE_CHECKING:
    from typing_extensions import Unpack

SCOPES = ("attention", "model")  # analyze --scope: the attention paths, or the whole forward too


def check_policy(policy: str | None, results, model: str, load_model: Callable) -> None:
    """Refuse a --policy analyze cannot take, before any file is looked for: an unknown name,
    --results without measured, measured for a DSA model (tune measures MLA paths only)."""
    if policy is not None and not is_engine(policy):
        settings.choice(policy, "--policy", POLICIES)
    if results is not None and policy != "measured":
        raise MlactlError("--results goes with --policy measured")
    if policy == "measured" and results is None and not (cfg := load_model()).measurable:
        raise MlactlError(
            f"--policy measured: {model} is a {cfg.attention} model and `mlactl tune paths` measures MLA paths only; "
            "use roofline, flops or an engine"
        )


def analyze(
    model: str | None = None,
    hardware: str | None = None,
    *,
    batch: Sizes = 1,
    new: Sizes = (1, 64, 128, 256, 1024, 4096),
    prefix: Sizes | None = None,
    context: Sizes | None = None,
    layers: int | str = 1,
    policy: str | None = None,
    results: str | Path | None = None,
    scope: str = "attention",
    weight_dtype: str | None = None,
    fmt: str | None = None,
    setup: Setup | None = None,
    **given: Unpack[Settings],
) -> Result[Analysis]:
    """`mlactl analyze`: every path's FLOPs, bytes and time at each (batch, new, prefix), the
    best path, each engine's path and what it loses, and the crossover, under the `Settings`
    (tp, kv_dtype, dtype, chunk, calibration, engines, engine_options). `policy` adds one more
    choice and its loss: roofline, flops, an engine (with the `engine_options` it would take
    among `engines`) or measured (the crossovers of `results`, a `mlactl tune paths` file, or
    the newest one for this model). `scope="model"` adds each row's whole forward pass
    (`value.forward`: attention by the best path on every layer plus the projections, MLP, MoE,
    LM head and all-reduces, at the weights' dtype, `weight_dtype` or the model's). `fmt` is the
    format the answer will be written in (the memory guard counts it); `setup` gives settings
    already resolved. `value` is an mlactl.decide.analysis.Analysis."""
    settings.choice(scope, "--scope", SCOPES)
    if weight_dtype is not None and scope != "model":
        raise MlactlError("--weight-dtype goes with --scope model")
    if setup is None:
        check_policy(policy, results, model or DEFAULT_MODEL, lambda: settings.load_model(model or DEFAULT_MODEL, 1))
    found = [results] if results is not None else ()
    s = _setup("analyze", model, hardware, given, setup=setup, results_files=found, find_results=policy == "measured")
    if prefix is not None and context is not None:
        raise MlactlError("give either --prefix or --context, not both")
    b, n, p = grid(
        sizes(batch, "--batch"),
        sizes(new, "--new"),
        prefix=None if context is not None else sizes(prefix if prefix is not None else "0,8K,32K", "--prefix", 0),
        context=sizes(context, "--context") if context is not None else None,
    )
    n_layers = s.cfg.layers if str(layers).strip().lower() == "all" else settings.one_int(layers, "--layers")
    ctx = context_for(s.cfg, s.hw, s.kv_dtype)
    names, options = _engines(given)
    chosen = parse_engines(names, options, ctx)
    # an engine policy takes the same engine options it would take among the engines
    rule = parse_policy(policy, names, options, ctx) if policy is not None and is_engine(policy) else policy
    limits.check_points(len(b), fmt)
    with progress.task(f"analysing {len(b):,} points"):
        result = analysis_mod.analyze(
            s.cfg,
            s.hw,
            b,
            n,
            p,
            kv_dtype=s.kv_dtype,
            dtype=s.dtype,
            chunk=s.chunk,
            layers=n_layers,
            engines=chosen,
            policy=rule,
            results_data=s.results[0] if s.results else None,
            calibration=s.calibration,
        )
    if scope == "model":
        result = with_forward(result, model_weights.resolve(model or s.cfg.name, weight_dtype), n_layers)
    return Result(
        result,
        s,
        lambda: dict(report.to_json(result), **report.calibration_json(s.calibration)),
        lambda fh: report.write_analysis_csv(fh, result),
    )


def with_forward(result: Analysis, weights, layers: int) -> Analysis:
    """The analysis with each row's whole forward (`Analysis.forward`): attention by the best
    path, scaled from the `layers` analysed to every layer of the model, plus the rest."""
    idx = np.arange(len(result.best))
    pick = {p: result.best == p for p in result.cost.choices}

    def best_of(field: str) -> np.ndarray:
        out = np.zeros(len(idx))
        for p, at in pick.items():
            out[at] = getattr(result.paths[p], field)[at]
        return out * (result.cfg.layers / layers)

    f = forward_mod.forward(
        result.cfg, weights, result.hw, result.cost.dtype, result.batch, result.new,
        best_of("time_s"), best_of("flops"), best_of("bytes"),
    )  # fmt: skip
    return replace(result, forward=f)


def crossover(
    model: str | None = None,
    hardware: str | None = None,
    *,
    batch: Sizes = 1,
    prefix: Sizes = "0,1K,4K,8K,16K,32K,64K,128K",
    max_new: int | str = analysis_mod.DEFAULT_MAX_NEW,
    setup: Setup | None = None,
    **given: Unpack[Machine],
) -> Result[Crossover]:
    """`mlactl crossover`: per (batch, prefix), the new-token count from which expand beats
    absorb, by FLOPs and by time (a DSA model: its windows), under the `Machine` settings (tp,
    kv_dtype, dtype, chunk, calibration). `value` is a Crossover."""
    s = _setup("crossover", model, hardware, given, Machine, setup=setup)
    cost = s.cost()
    s.hw.peak_flops(cost.dtype)
    pairs = [(b, p) for b in sizes(batch, "--batch") for p in sizes(prefix, "--prefix", 0)]
    if len(pairs) > analysis_mod.MAX_CROSSOVER_PREFIXES:
        raise MlactlError(f"{len(pairs)} (batch, prefix) pairs; at most {analysis_mod.MAX_CROSSOVER_PREFIXES} at once")
    limit = settings.one_int(max_new, "--max-new")
    result = analysis_mod.crossover_table(cost, s.hw, pairs, max_new=limit, calibration=s.calibration)
    calibrated = s.calibration is not None
    return Result(
        result,
        s,
        lambda: report.crossover_document(cost, s.hw, result, s.calibration),
        lambda fh: report.write_crossover_csv(fh, result, calibrated=calibrated),
    )
