"""`mlactl plot`: the charts of mlactl.output.plot from the command line. Parse, work out the chart's
data (plot.X_data), draw it (plot.draw_X), save; no math here.

matplotlib is imported only when a chart is drawn (inside mlactl.output.plot's drawing functions), so
`mlactl --help` and `mlactl analyze` never load it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from mlactl.cli import complete
from mlactl.cli.common import Setup, command, given_options, one_int, resolve
from mlactl.cli.options import (
    MACHINE,
    BatchOpt,
    ContextOpt,
    DataDirOpt,
    EngineOptionOpt,
    FrameworkVersionOpt,
    Opts,
    PrefixOpt,
)
from mlactl.decide import analysis
from mlactl.decide.calibration import run, store
from mlactl.decide.calibration.score import check_measured_on, panels
from mlactl.decide.engines import context_for, parse_engines
from mlactl.model.shapes import grid, parse_sizes
from mlactl.output import chartdata, plot
from mlactl.output.plot import image_format
from mlactl.results import store as results_store
from mlactl.util import progress, safe
from mlactl.util.errors import MlactlError
from mlactl.util.io import open_input, read_json, refuse_input
from mlactl.util.limits import check_plot

# Made before importing mlactl.cli, as mlactl/cli/tune.py does its tune_app: the root group
# (LazyGroup in mlactl/cli/__init__.py) imports this module only when `plot` is asked for.
plot_app = typer.Typer(
    help="Charts: roofline, crossover, path map, tune sweep and replay, predicted and measured.\n\n"
    "Example: mlactl plot crossover --hardware h200 --results run.json -o crossover.png",
    no_args_is_help=True,
)


ResultsOpt = Annotated[
    Optional[list[Path]],
    typer.Option(
        "--results", "-r", help="A results file `mlactl tune` wrote; repeat for several. Adds the measurements."
    ),
]
DpiOpt = Annotated[str, typer.Option("--dpi", help="Resolution of a .png (dots per inch).")]
DataOpt = Annotated[
    Optional[Path],
    typer.Option("--data", help="Also write what the chart drew, one row per point, line or cell: .csv or .json."),
]


def output_opt(chart: str):
    return typer.Option(
        "--output", "-o", help=f"Image file, format from the extension: .png, .svg or .pdf (default: {chart}.png)."
    )


# Roofline defaults: decode after 4K and 32K cached tokens, and a 4K-token prefill (new, prefix).
ROOFLINE_SHAPES = ((1, 4096), (1, 32768), (4096, 0))
# Path-map defaults, filled in to four log-spaced steps per doubling by geometric_fill.
PATHMAP_NEW = "1:16K:*2"
PATHMAP_PREFIX = "0,64:128K:*2"


def geometric_fill(values: list[int], per_octave: int = 4) -> list[int]:
    """The given sizes plus `per_octave` log-spaced integers between consecutive ones: a smooth
    map from a short default list. User-given lists are drawn as given."""

    positive = [v for v in values if v > 0]
    filled = set(values)
    for lo, hi in zip(positive, positive[1:]):
        steps = max(1, round(np.log2(hi / lo) * per_octave))
        filled.update(int(round(v)) for v in np.geomspace(lo, hi, steps + 1))
    return sorted(filled)


def chart_analyses(setup: Setup, batch, new, prefix, engines=None, calibrated_only: bool = False, spans=False):
    """The analysis a chart draws, by roofline time, and (with a calibration) by calibrated time:
    (roofline, calibrated or None); with `calibrated_only` the calibrated one alone, as the first.
    `spans`: the calibrated crossover's interval too (the crossover chart's; the slow part of a
    calibrated analysis, which the other charts do not draw)."""

    check_plot(len(batch), 0)  # before the analysis: a chart's points cost more than a table's
    args = (setup.cfg, setup.hw, batch, new, prefix)
    kwargs = {"kv_dtype": setup.kv_dtype, "dtype": setup.dtype, "chunk": setup.chunk, "engines": engines}

    def calibrated():
        return analysis.analyze(*args, calibration=setup.calibration, crossover_spans=spans, **kwargs)

    with progress.task(f"analysing {len(batch):,} points"):
        if calibrated_only:
            return calibrated(), None
        roof = analysis.analyze(*args, **kwargs)
        return roof, None if setup.calibration is None else calibrated()


def draw(chart: str, setup: Setup, shapes, output: Path, dpi: str, data: Optional[Path]) -> None:
    """Analyse the shapes (by roofline, and calibrated with a calibration), work out `chart` of
    mlactl.output.plot with the measurements, draw it and write it (and its --data)."""
    b, n, p = shapes
    result, calibrated = chart_analyses(setup, b, n, p, spans=chart == "crossover")
    chart_data = plot.CHARTS[chart][0]
    drawn = chart_data(result, checked_results(setup, result), calibrated=calibrated)
    write(chart, drawn, output, dpi, data, setup.notes)


def checked_results(setup: Setup, result) -> list[dict]:
    """The --results files (read once, by resolve), each checked against the model and machine
    analysed: a second file measured elsewhere is an error naming it."""
    for data in setup.results:
        plot.check_results(data, data["_path"], result.cost, result.hw)
    return setup.results


def measured_shapes(setup: Setup) -> tuple[list[int], list[int]]:
    """The batch sizes and prefixes the --results files measured (paths and crossovers)."""
    rows = [r for data in setup.results for section in ("paths", "crossovers") for r in data.get(section, [])]
    return sorted({int(r["batch"]) for r in rows}), sorted({int(r["prefix"]) for r in rows})


def write(
    chart: str,
    drawn,
    output: Path,
    dpi: str,
    data: Optional[Path] = None,
    notes: list[str] = (),  # type: ignore[assignment]
) -> None:
    """Draw `drawn`, what plot.X_data worked out for `chart`, write the image, and its --data."""
    fig = plot.CHARTS[chart][1](drawn)
    for note in notes:  # where the settings came from (a results file, a calibration)
        typer.echo(safe.text(note, 2000))
    plot.save(fig, output, dpi=one_int(dpi, "--dpi"))
    typer.echo(f"Wrote {safe.text(output)}")
    if data is not None:
        chartdata.write(data, chart, drawn.as_dict())
        typer.echo(f"Wrote {safe.text(data)}")


def check_output(output: Path, data: Optional[Path] = None) -> None:
    """Fail on a bad extension before any work is done."""

    image_format(output)
    chartdata.check(data)


def check_not_inputs(output: Path, data: Optional[Path] = None) -> None:
    """Fail, before any drawing, on an output or --data file that is an input already read."""
    refuse_input(output, "--output")
    if data is not None:
        refuse_input(data, "--data")


@command(plot_app, None, *MACHINE)
def roofline(
    opts: Opts,
    batch: BatchOpt = "1",
    new: Annotated[
        Optional[str],
        typer.Option(
            "--new",
            "-n",
            help="New tokens per request: list or range (default: decode after 4K and 32K, and a 4K prefill).",
        ),
    ] = None,
    prefix: PrefixOpt = None,
    context: ContextOpt = None,
    results: ResultsOpt = None,
    output: Annotated[Path, output_opt("roofline")] = Path("roofline.png"),
    dpi: DpiOpt = "100",
    data: DataOpt = None,
):
    """Roofline: each path and its attention op against the machine's ceilings and ridge.

    FLOP/s against FLOP/byte, log-log. Measured path times from --results are drawn against
    their predicted points, with the fraction of the roofline time they reach; the model, tp,
    dtypes and hardware are the file's unless given.

    With --calibration NAME the calibrated time of each path is drawn too (x marks).

    Example: mlactl plot roofline --hardware h200 --results run.json -o roofline.svg
    """

    check_output(output, data)
    setup = resolve(opts, results or ())
    check_not_inputs(output, data)
    if prefix is not None and context is not None:
        raise MlactlError("give either --prefix or --context, not both")
    batches = parse_sizes(batch, "--batch")
    if new is None and prefix is None and context is None:
        shapes = np.array([(b, n, p) for b in batches for n, p in ROOFLINE_SHAPES])
        b, n, p = shapes.T
    else:
        b, n, p = grid(
            batches,
            parse_sizes(new or "1", "--new"),
            prefix=None if context is not None else parse_sizes(prefix or "4K,32K", "--prefix", minimum=0),
            context=parse_sizes(context, "--context") if context is not None else None,
        )
    draw("roofline", setup, (b, n, p), output, dpi, data)


@command(plot_app, None, *MACHINE)
def crossover(
    opts: Opts,
    batch: Annotated[
        str, typer.Option("--batch", "-b", help="Requests per batch, one value (default: 1, or the one measured).")
    ] = "1",
    new: Annotated[str, typer.Option("--new", "-n", help="New tokens along the x axis: list or range.")] = "1:4096",
    prefix: Annotated[
        str,
        typer.Option(
            "--prefix",
            "-p",
            help="One panel per prefix: list or range, K = 1024 (default: those measured, else 0,4K,32K).",
        ),
    ] = "0,4K,32K",
    results: ResultsOpt = None,
    output: Annotated[Path, output_opt("crossover")] = Path("crossover.png"),
    dpi: DpiOpt = "100",
    data: DataOpt = None,
):
    """Time against new tokens per prefix, with the predicted and measured crossovers.

    One panel per prefix: expand, expand_chunked and absorb predicted by the roofline, measured
    times from --results, and the crossovers marked with their values. With --results the
    panels are the prefixes measured (unless --prefix is given), and the model, tp, dtypes and
    hardware are the file's.

    With --calibration NAME the calibrated curves (dotted) and crossovers are drawn too.

    Example: mlactl plot crossover --hardware h200 --prefix 0,4K,32K --results run.json -o crossover.png
    """

    check_output(output, data)
    setup = resolve(opts, results or ())
    check_not_inputs(output, data)
    batch_value, prefixes = one_int(batch, "--batch"), parse_sizes(prefix, "--prefix", minimum=0)
    typed = given_options("batch", "prefix")
    if setup.results:
        measured_batches, measured_prefixes = measured_shapes(setup)
        if "batch" not in typed and measured_batches:
            batch_value = measured_batches[0]
        if "prefix" not in typed and measured_prefixes:
            prefixes = measured_prefixes
    b, n, p = grid([batch_value], parse_sizes(new, "--new"), prefix=prefixes)
    if len(set(p.tolist())) > plot.MAX_CROSSOVER_PANELS:
        raise MlactlError(f"--prefix: at most {plot.MAX_CROSSOVER_PANELS} prefixes (one panel each)")
    draw("crossover", setup, (b, n, p), output, dpi, data)


@command(plot_app, None, *MACHINE)
def pathmap(
    opts: Opts,
    batch: Annotated[str, typer.Option("--batch", "-b", help="Requests per batch (one value).")] = "1",
    new: Annotated[
        Optional[str],
        typer.Option(
            "--new", "-n", help=f"New tokens: list or range (default: {PATHMAP_NEW}, four steps per doubling)."
        ),
    ] = None,
    prefix: Annotated[
        Optional[str],
        typer.Option(
            "--prefix", "-p", help=f"Prefixes: list or range (default: {PATHMAP_PREFIX}, four steps per doubling)."
        ),
    ] = None,
    policy: Annotated[
        Optional[str],
        typer.Option(
            "--policy",
            help="Shade what this engine's rule loses against the best path instead: sglang, sglang-triton, "
            "sglang-trtllm, vllm or ENGINE@VERSION (see `mlactl engines --list` and docs/engines.md).",
            autocompletion=complete.policies,
        ),
    ] = None,
    engine_option: EngineOptionOpt = None,
    results: ResultsOpt = None,
    output: Annotated[Path, output_opt("pathmap")] = Path("pathmap.png"),
    dpi: DpiOpt = "100",
    data: DataOpt = None,
):
    """Which path is fastest over a (new tokens, prefix) grid, and by how much.

    The colour is the speedup of the best path over the best of the other kind (absorb against
    expand), with the measured crossovers from --results on top. With --policy ENGINE it is
    instead a loss map: how much slower that engine's own rule is than the best path that fits,
    with the boundaries where the engine's path changes. With --calibration NAME the map is by
    calibrated time.

    Example: mlactl plot pathmap --hardware h200 --policy sglang --engine-option threshold=4096 -o pathmap.pdf
    """

    check_output(output, data)
    setup = resolve(opts, results or ())
    check_not_inputs(output, data)
    news = parse_sizes(new, "--new") if new is not None else geometric_fill(parse_sizes(PATHMAP_NEW, "--new"))
    prefixes = (
        parse_sizes(prefix, "--prefix", minimum=0)
        if prefix is not None
        else geometric_fill(parse_sizes(PATHMAP_PREFIX, "--prefix", minimum=0))
    )
    b, n, p = grid([one_int(batch, "--batch")], news, prefix=prefixes)
    if policy is None and engine_option:
        raise MlactlError("--engine-option goes with --policy ENGINE")
    engines = None
    if policy is not None:
        engines = parse_engines(policy, engine_option, context_for(setup.cfg, setup.hw, setup.kv_dtype))
    if engines is not None and len(engines) != 1:
        raise MlactlError(f"--policy takes one engine, got {policy!r}")
    result, _ = chart_analyses(setup, b, n, p, engines, calibrated_only=setup.calibration is not None)
    drawn = plot.pathmap_data(result, checked_results(setup, result), policy=policy)
    write("pathmap", drawn, output, dpi, data, setup.notes)


@command(plot_app, None)
def tune(
    results: Annotated[Path, typer.Option("--results", "-r", help="The results file `mlactl tune kernels` wrote.")],
    kernel: Annotated[
        Optional[str], typer.Option("--kernel", "-k", help="Kernel whose sweep to draw (default: the first).")
    ] = None,
    bucket: Annotated[
        Optional[str],
        typer.Option("--bucket", help="Shape bucket of that kernel, as in the results file (default: the first)."),
    ] = None,
    output: Annotated[Path, output_opt("tune")] = Path("tune.png"),
    dpi: DpiOpt = "100",
    data: DataOpt = None,
):
    """Every launch config tried for one tuned shape: median times, failures, the best.

    Example: mlactl plot tune --results run.json --kernel mla_decode --bucket "B=128,H=128,S_q=1,ctx=8192"
    """

    check_output(output, data)
    loaded = results_store.load(results)
    check_not_inputs(output, data)
    write("tune", plot.tune_data(loaded, kernel=kernel, bucket=bucket), output, dpi, data)


@command(plot_app, "replay")
def replay_chart(
    report: Annotated[Path, typer.Argument(help="A report `mlactl replay TRACE -f json -o FILE` wrote.")],
    output: Annotated[Path, output_opt("replay")] = Path("replay.png"),
    dpi: DpiOpt = "100",
    data: DataOpt = None,
):
    """What each engine's path rule loses over the trace's time, and the path mix per step type.

    Top: attention time lost against the best path (per step and per request), per second of
    trace, one line per engine. Bottom: for each step type (decode, prefill, extend after a
    short or a long prefix, mixed), each engine's share of new tokens on each path.

    Example: mlactl replay trace.jsonl -o replay.json && mlactl plot replay replay.json -o replay.png
    """

    check_output(output, data)
    try:
        found = read_json(report, "replay report")  # the one reader: an -o or --data of it is refused next
    except MlactlError:
        _refuse_trace(report)
        raise
    check_not_inputs(output, data)
    if isinstance(found, dict) and "schema" not in found:
        _refuse_trace(report)
    plot.check_report(found, str(report))
    write("replay", plot.replay_data(found), output, dpi, data)


@command(plot_app, "transfer")
def transfer_chart(
    calibration: Annotated[
        str,
        typer.Option(
            "--calibration", help="The calibration to draw: a name or a file.", autocompletion=complete.calibrations
        ),
    ],
    system: Annotated[str, typer.Option("--system", help="aiconfigurator system measured, e.g. b300_sxm.")],
    framework: Annotated[str, typer.Option("--framework", help="aiconfigurator framework: sglang, trtllm or vllm.")],
    framework_version: FrameworkVersionOpt = None,
    data_dir: DataDirOpt = None,
    output: Annotated[Path, output_opt("transfer")] = Path("transfer.png"),
    dpi: DpiOpt = "100",
):
    """A calibration's predicted time against the time measured on its GPU, per op class, with each 80% interval and
    the roofline beside it: a transferred calibration on the tables of the GPU it was carried to.

    Example: mlactl calibrate transfer h200-aiconfigurator-sglang-0.5.14 --hardware b200 && mlactl plot transfer
    --calibration b200-from-h200-aiconfigurator-sglang-0.5.14 --system b200_sxm --framework sglang
    """

    check_output(output)
    drawn = transfer_chart_data(calibration, system, framework, framework_version, data_dir)
    check_not_inputs(output)
    write("transfer", drawn, output, dpi)


def transfer_chart_data(calibration: str, system: str, framework: str, version: Optional[str], data_dir):
    cal = store.resolve(calibration)
    where = f"{system}/{framework}"
    if system not in run.SYSTEM_PROFILES:
        raise MlactlError(f"no hardware profile for system {safe.text(system, 40)!r}")
    check_measured_on(cal, run.SYSTEM_PROFILES[system], where)
    groups, _ = run.aiconfigurator_groups(system, framework, version, data_dir)
    moved = cal.transferred
    title = f"calibration {cal.name}, predicted against {where}'s measurements" + (
        f"\ntransferred from {moved['from']['hardware']} to {cal.hardware}'s ceilings" if moved else ""
    )
    return plot.transfer_data(panels(cal, groups), title)


# the first fields of a request trace, as `mlactl replay` reads one (Mooncake's JSON lines, a CSV)
TRACE_FIELDS = ("timestamp", "input_length", "hash_ids", "arrival_s", "input_tokens")


def _refuse_trace(path: Path) -> None:
    """A request trace given where a replay report belongs: say what to run instead."""
    try:
        with open_input(path, "replay report") as fh:
            head = fh.read(4096).decode("utf-8", "replace").lstrip("\ufeff")
    except (MlactlError, OSError):
        return
    first = head.splitlines()[0] if head.strip() else ""
    if any(f'"{k}"' in first or first.split(",").count(k) for k in TRACE_FIELDS):
        raise MlactlError(
            f"{safe.text(path)} is a request trace, not a replay report: run `mlactl replay "
            f"{safe.text(path)} -f json -o report.json`, then `mlactl plot replay report.json`"
        )
