"""The mlactl command line: parse, call the library, render. No math here.

Bad input anywhere becomes one line on stderr, `Error: ...`, and exit status 2.
"""

from __future__ import annotations

import functools
import io
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
import typer.core
import typer.main

from mlactl import __version__
from mlactl.errors import MlactlError


class LazyGroup(typer.core.TyperGroup):
    """The root command group, building `tune` and `plot` only when they are asked for: their
    options take ~30 ms to import and introspect, which `mlactl analyze` should not pay."""

    LAZY = {
        "tune": ("mlactl.cli.tune", "tune_app"),
        "plot": ("mlactl.cli.plot", "plot_app"),
        "calibrate": ("mlactl.cli.calibrate", "calibrate_app"),
    }

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.LAZY))

    def get_command(self, ctx, name):
        if name in self.LAZY and name not in self.commands:
            import importlib

            module, attr = self.LAZY[name]
            command = typer.main.get_command(getattr(importlib.import_module(module), attr))
            command.name = name
            self.commands[name] = command
        return super().get_command(ctx, name)


app = typer.Typer(
    cls=LazyGroup,
    help="Expand or absorb? Exact cost model, Triton kernels and autotuner for Multi-head Latent "
    "Attention (DeepSeek-V2/V3/R1, Kimi K2).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

FORMATS = ("table", "json", "csv")
KV_DTYPES = ("bf16", "fp16", "fp8", "fp32")  # as mlactl.cost, without importing numpy at start
DTYPES = ("bf16", "fp16", "fp32")

# -- options shared by several commands (defined once) ------------------------------------------

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Preset name (see `mlactl list`) or path to a Hugging Face config.json.")
]
HardwareOpt = Annotated[
    str, typer.Option("--hardware", "-g", help="Hardware profile name (see `mlactl list`) or path to a .toml profile.")
]
MeasuredOpt = Annotated[
    bool,
    typer.Option("--measured", help="Use the ceilings `mlactl tune ceilings` measured instead of the datasheet's."),
]
TpOpt = Annotated[
    str,
    typer.Option("--tp", help="Tensor-parallel degree: divides the heads per GPU (the latent cache is replicated)."),
]
BatchOpt = Annotated[
    str, typer.Option("--batch", "-b", help="Requests per batch: list or range, e.g. 1,32,128 or 1:256:*2.")
]
NewOpt = Annotated[
    str, typer.Option("--new", "-n", help="New tokens per request: list or range, e.g. 1,64,512 or 1:4096:*2.")
]
PrefixOpt = Annotated[
    Optional[str],
    typer.Option("--prefix", "-p", help="Cached tokens before the new ones: list or range, e.g. 0:32K:4K (K = 1024)."),
]
ContextOpt = Annotated[
    Optional[str], typer.Option("--context", "-c", help="Instead of --prefix: total context including the new tokens.")
]
KvDtypeOpt = Annotated[
    str, typer.Option("--kv-dtype", help="Cache dtype: bf16, fp16, fp8 (half the bytes of bf16) or fp32.")
]
DtypeOpt = Annotated[
    str, typer.Option("--dtype", help="Activation, weight and compute dtype: bf16, fp16 or fp32 (CPU measurements).")
]
ChunkOpt = Annotated[str, typer.Option("--chunk", help="Prefix tokens per chunk of the expand_chunked path.")]
LayersOpt = Annotated[str, typer.Option("--layers", help="Layers to count: a number, or 'all' for the model's.")]
ThresholdOpt = Annotated[
    str, typer.Option("--threshold", help="Prefix from which the fixed-threshold policy picks expand_chunked.")
]
FormatOpt = Annotated[
    Optional[str],
    typer.Option("--format", "-f", help="table, json or csv (default: from --output's extension, else table)."),
]
OutputOpt = Annotated[
    Optional[Path], typer.Option("--output", "-o", help="Write to this file (atomically) instead of stdout.")
]
CalibrationOpt = Annotated[
    Optional[str],
    typer.Option(
        "--calibration",
        help="Calibrated time instead of the roofline: a name from `mlactl calibrate` or a calibration file.",
    ),
]


def cli_errors(fn):
    """Turn a library error into one line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MlactlError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(2) from None
        except OSError as exc:
            where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
            typer.echo(f"Error:{where} {exc.strerror or exc}", err=True)
            raise typer.Exit(2) from None

    return wrapper


def one_int(text: str, option: str, minimum: int = 1) -> int:
    from mlactl.shapes import parse_sizes

    values = parse_sizes(text, option, minimum)
    if len(values) != 1:
        raise MlactlError(f"{option} takes one value, got {text!r}")
    return values[0]


def choice(text: str, option: str, choices) -> str:
    if text not in choices:
        raise MlactlError(f"{option} must be one of {', '.join(choices)}, got {text!r}")
    return text


def output_format(fmt: Optional[str], output: Optional[Path]) -> str:
    if fmt is None:
        suffix = output.suffix.lower().lstrip(".") if output else ""
        return suffix if suffix in ("json", "csv") else "table"
    return choice(fmt, "--format", FORMATS)


def load_model(model: str, tp: str):
    from mlactl import model as models

    return models.resolve(model).with_tp(one_int(tp, "--tp"))


def load_hardware(hardware: str, measured: bool):
    from mlactl import hardware as hw

    return hw.resolve(hardware, measured=measured)


def console(output: Optional[Path] = None):
    from rich.console import Console

    if output is None:
        con = Console()
        if not con.is_terminal:  # piped: rich would assume 80 columns and fold the tables
            con = Console(width=max(con.width, 132))
        return con
    return Console(record=True, file=io.StringIO(), width=132)


def emit(fmt: str, output: Optional[Path], *, json_data=None, write_csv=None, tables=()):
    """Write json/csv/table output to stdout or, atomically, to a file."""
    from mlactl.io import atomic_open

    if fmt == "json":
        from mlactl.report import dumps

        text = dumps(json_data())
        if output is None:
            sys.stdout.write(text)
        else:
            with atomic_open(output, "w") as fh:
                fh.write(text)
    elif fmt == "csv":
        if output is None:
            sys.stdout.flush()
            write_csv(sys.stdout.buffer)
            sys.stdout.buffer.flush()
        else:
            with atomic_open(output, "wb") as fh:
                write_csv(fh)
    else:
        con = console(output)
        for item in tables:
            con.print(item)
        if output is not None:
            with atomic_open(output, "w") as fh:
                fh.write(con.export_text())


def measured_results(cfg, hw, kv_dtype: str, path: Optional[Path]) -> dict:
    """The results file for --policy measured: the one given (checked against the model and
    hardware), or the newest `mlactl tune paths` left for them."""
    from mlactl import results

    if path is not None:
        data = results.load(path)
        results.check_matches(data, str(path), model_name=cfg.name, hardware_name=hw.name)
    else:
        dims = {k: getattr(cfg, k) for k in ("H", "r", "dC", "dR", "dV")}
        data, path = results.find_results(dims, kv_dtype, hardware_name=hw.name)
        if data is None:
            raise MlactlError(
                f"no measured crossovers for {cfg.name} (H={cfg.H}, kv {kv_dtype}) on {hw.name}: "
                "run `mlactl tune paths` there, or pass --results FILE"
            )
    if not data.get("crossovers"):
        raise MlactlError(f"{path} has no measured crossovers (it holds no `mlactl tune paths` run)")
    return dict(data, _path=str(path))


def load_calibration(spec: Optional[str], hw):
    """The calibration for --calibration (None without it), refused for another hardware."""
    if spec is None:
        return None
    from mlactl.calibration import store

    cal = store.resolve(spec)
    store.check_hardware(cal, hw.name)
    if hw.using_measured:
        raise MlactlError(
            f"calibration {cal.name!r} was fitted against {hw.name}'s nominal ceilings: drop --measured "
            "(its efficiencies already say how far from the datasheet the kernels run)"
        )
    return cal


def calibration_line(cal) -> str:
    return f"times: calibrated with {cal.name} ({cal.path}); ops it lacks keep roofline time"


def calibration_json(cal) -> dict:
    """What a JSON output records about its times: roofline, or the calibration used."""
    if cal is None:
        return {"time": "roofline"}
    return {"time": "calibrated", "calibration": cal.describe()}


def version_callback(value: bool):
    if value:
        typer.echo(f"mlactl {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
):
    """Expand or absorb? Exact cost model, Triton kernels and autotuner for MLA attention."""


@app.command()
@cli_errors
def analyze(
    model: ModelOpt = "deepseek-v3",
    hardware: HardwareOpt = "h800",
    measured: MeasuredOpt = False,
    tp: TpOpt = "1",
    batch: BatchOpt = "1",
    new: NewOpt = "1,64,128,256,1024,4096",
    prefix: PrefixOpt = None,
    context: ContextOpt = None,
    kv_dtype: KvDtypeOpt = "bf16",
    dtype: DtypeOpt = "bf16",
    chunk: ChunkOpt = "8192",
    layers: LayersOpt = "1",
    threshold: ThresholdOpt = "8192",
    ops: Annotated[bool, typer.Option("--ops", help="Also show every op (table) or add op columns (csv).")] = False,
    crossover: Annotated[
        bool, typer.Option("--crossover", help="Also print the crossover table (always in JSON).")
    ] = False,
    policy: Annotated[
        Optional[str],
        typer.Option(
            "--policy", help="Also show this policy's choice and what it loses: roofline, flops, fixed or measured."
        ),
    ] = None,
    results: Annotated[
        Optional[Path],
        typer.Option(
            "--results",
            help="Results file of `mlactl tune paths` for --policy measured "
            "(default: the newest for this model and hardware).",
        ),
    ] = None,
    calibration: CalibrationOpt = None,
    fmt: FormatOpt = None,
    output: OutputOpt = None,
):
    """FLOPs, bytes, intensity and roofline time of each path, op by op; the best path; the crossover.

    Example: mlactl analyze --model deepseek-v3 --hardware h200 --new 1:4096:*2 --prefix 0,32K
    (with --calibration NAME: calibrated time, see `mlactl calibrate`)
    """
    from mlactl import analysis, render
    from mlactl.shapes import grid, parse_sizes

    fmt = output_format(fmt, output)
    cfg = load_model(model, tp)
    hw = load_hardware(hardware, measured)
    cal = load_calibration(calibration, hw)
    if prefix is not None and context is not None:
        raise MlactlError("give either --prefix or --context, not both")
    b, n, p = grid(
        parse_sizes(batch, "--batch"),
        parse_sizes(new, "--new"),
        prefix=None if context is not None else parse_sizes(prefix or "0,8K,32K", "--prefix", minimum=0),
        context=parse_sizes(context, "--context") if context is not None else None,
    )
    n_layers = cfg.layers if layers.strip().lower() == "all" else one_int(layers, "--layers")
    if policy is not None:
        choice(policy, "--policy", ("roofline", "flops", "fixed", "measured"))
    results_data = None
    if policy == "measured":
        results_data = measured_results(cfg, hw, kv_dtype, results)
    elif results is not None:
        raise MlactlError("--results goes with --policy measured")
    result = analysis.analyze(
        cfg,
        hw,
        b,
        n,
        p,
        kv_dtype=choice(kv_dtype, "--kv-dtype", KV_DTYPES),
        dtype=choice(dtype, "--dtype", DTYPES),
        chunk=one_int(chunk, "--chunk"),
        layers=n_layers,
        threshold=one_int(threshold, "--threshold"),
        policy=policy,
        results_data=results_data,
        calibration=cal,
    )
    tables = [render.header(result), *result.notes, render.analysis_table(result)]
    if cal is not None:
        tables.insert(1, calibration_line(cal))
    if results_data is not None:
        tables.insert(2, f"measured policy: {results_data['_path']} ({results_data['device']['name']})")
    if ops:
        tables.append(render.ops_table(result))
    if crossover:
        tables.append(render.crossover_table(result.crossover))
    else:
        asym = result.crossover.asymptotic_new
        tables.append(
            f"Crossover (asymptotic, by FLOPs): {'none' if asym is None else f'{asym:.1f}'} "
            "new tokens; --crossover for the table per prefix"
        )

    def json_data():
        from mlactl.report import to_json

        return dict(to_json(result), **calibration_json(cal))

    def csv_data(fh):
        from mlactl.report import write_analysis_csv

        write_analysis_csv(fh, result, ops=ops)

    emit(fmt, output, json_data=json_data, write_csv=csv_data, tables=tables)


@app.command(name="crossover")
@cli_errors
def crossover_cmd(
    model: ModelOpt = "deepseek-v3",
    hardware: HardwareOpt = "h800",
    measured: MeasuredOpt = False,
    tp: TpOpt = "1",
    batch: BatchOpt = "1",
    prefix: Annotated[
        str, typer.Option("--prefix", "-p", help="Prefixes to solve for: list or range.")
    ] = "0,1K,4K,8K,16K,32K,64K,128K",
    kv_dtype: KvDtypeOpt = "bf16",
    dtype: DtypeOpt = "bf16",
    chunk: ChunkOpt = "8192",
    max_new: Annotated[
        str, typer.Option("--max-new", help="Search the roofline crossover up to this many new tokens.")
    ] = "128K",
    calibration: CalibrationOpt = None,
    fmt: FormatOpt = None,
    output: OutputOpt = None,
):
    """For each prefix, the new-token count from which expand beats absorb, by FLOPs and by roofline.

    Example: mlactl crossover --hardware h200 --batch 1,64 --prefix 0:64K:8K
    """
    from mlactl import analysis, cost, render, report
    from mlactl.csvout import write_csv
    from mlactl.shapes import parse_sizes

    fmt = output_format(fmt, output)
    cfg = load_model(model, tp)
    hw = load_hardware(hardware, measured)
    cal = load_calibration(calibration, hw)
    model_cost = cost.CostModel(
        cfg,
        kv_dtype=choice(kv_dtype, "--kv-dtype", KV_DTYPES),
        dtype=choice(dtype, "--dtype", DTYPES),
        chunk=one_int(chunk, "--chunk"),
    )
    hw.peak_flops(model_cost.dtype)
    pairs = [(b, p) for b in parse_sizes(batch, "--batch") for p in parse_sizes(prefix, "--prefix", minimum=0)]
    if len(pairs) > analysis.MAX_CROSSOVER_PREFIXES:
        raise MlactlError(f"{len(pairs)} (batch, prefix) pairs; at most {analysis.MAX_CROSSOVER_PREFIXES} at once")
    result = analysis.crossover_table(model_cost, hw, pairs, max_new=one_int(max_new, "--max-new"), calibration=cal)

    def json_data():
        return {
            "schema": "mlactl.crossover",
            "schema_version": report.SCHEMA_VERSION,
            "model": dict(cfg.to_dict(), softmax_scale=cfg.softmax_scale),
            "hardware": hw.to_dict(),
            "kv_dtype": model_cost.kv_dtype,
            "dtype": model_cost.dtype,
            "chunk": model_cost.chunk,
            "crossover": report.crossover_json(result),
            **calibration_json(cal),
        }

    def csv_data(fh):
        import numpy as np

        rows = result.rows
        cols = [[r.batch for r in rows], [r.prefix for r in rows]] + [
            [np.nan if v is None else v for v in (getattr(r, k) for r in rows)]
            for k in ("by_flops", "by_time", "by_time_chunked")
        ]
        write_csv(
            fh,
            ["batch", "prefix", "by_flops", "by_time", "by_time_chunked"],
            [np.asarray(c, dtype=np.float64) for c in cols],
        )

    header = (
        f"[bold]{cfg.name}[/] on [bold]{hw.display}[/] ({'measured' if hw.using_measured else 'nominal'}), "
        f"kv cache {model_cost.kv_dtype}"
    )
    lines = [header] + ([calibration_line(cal)] if cal is not None else [])
    emit(fmt, output, json_data=json_data, write_csv=csv_data, tables=[*lines, render.crossover_table(result)])


@app.command(name="batch")
@cli_errors
def batch_cmd(
    requests: Annotated[Path, typer.Argument(help="CSV with a header and columns new,prefix (and optionally count).")],
    model: ModelOpt = "deepseek-v3",
    hardware: HardwareOpt = "h800",
    measured: MeasuredOpt = False,
    tp: TpOpt = "1",
    kv_dtype: KvDtypeOpt = "bf16",
    dtype: DtypeOpt = "bf16",
    chunk: ChunkOpt = "8192",
    threshold: ThresholdOpt = "8192",
    calibration: CalibrationOpt = None,
    fmt: FormatOpt = None,
    output: OutputOpt = None,
):
    """A mixed batch from a CSV of requests: the path of each, and the batch total per strategy.

    Example: mlactl batch requests.csv --hardware h200   (requests.csv: new,prefix / 1,8000 / 512,0 ...)
    """
    from mlactl import analysis, render, report
    from mlactl.requests import read_requests

    fmt = output_format(fmt, output)
    cfg = load_model(model, tp)
    hw = load_hardware(hardware, measured)
    cal = load_calibration(calibration, hw)
    new, prefix, count = read_requests(requests)
    result = analysis.analyze_batch(
        cfg,
        hw,
        new,
        prefix,
        count,
        kv_dtype=choice(kv_dtype, "--kv-dtype", KV_DTYPES),
        dtype=choice(dtype, "--dtype", DTYPES),
        chunk=one_int(chunk, "--chunk"),
        threshold=one_int(threshold, "--threshold"),
        calibration=cal,
    )
    emit(
        fmt,
        output,
        json_data=lambda: dict(report.batch_json(result), **calibration_json(cal)),
        write_csv=lambda fh: report.write_batch_csv(fh, result),
        tables=([calibration_line(cal)] if cal is not None else []) + list(render.batch_tables(result)),
    )


@app.command(name="list")
@cli_errors
def list_cmd(
    fmt: FormatOpt = None,
    output: OutputOpt = None,
):
    """The models and the hardware profiles mlactl knows.

    Example: mlactl list --format json
    """
    from mlactl import hardware, model, render

    fmt = output_format(fmt, output)
    if fmt == "csv":
        raise MlactlError("mlactl list writes table or json")
    models = [(name, model.from_name(name)) for name in model.preset_names()]
    profiles = hardware.all_profiles()
    emit(
        fmt,
        output,
        json_data=lambda: {
            "models": {n: c.to_dict() for n, c in models},
            "hardware": {h.name: h.to_dict() for h in profiles},
        },
        tables=[render.models_table(models), render.hardware_table(profiles)],
    )


def main() -> None:
    if sys.argv[1:2] != ["tune"]:
        # Outside tune, mlactl's arithmetic is elementwise numpy: starting OpenBLAS's thread pool
        # would only add ~60 ms to every start. A value the user set wins.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    app()


if __name__ == "__main__":
    main()
