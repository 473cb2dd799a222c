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
from mlactl.util.defaults import ACT_DTYPES, DEFAULT_CHUNK, KV_DTYPES, OUTPUT_FORMATS, POLICIES
from mlactl.util.errors import MlactlError
from mlactl.util.limits import check_points


class LazyGroup(typer.core.TyperGroup):
    """The root command group, building `tune` and `plot` only when they are asked for: their
    options take ~30 ms to import and introspect, which `mlactl analyze` should not pay."""

    LAZY = {
        "tune": ("mlactl.cli.tune", "tune_app"),
        "plot": ("mlactl.cli.plot", "plot_app"),
        "engines": ("mlactl.cli.engines", "engines_app"),
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
        command = super().get_command(ctx, name)
        if command is not None:
            from mlactl.cli.helptext import polish

            polish(command)
        return command

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Usage errors as one `Error:` line (not click's boxed usage), and a closed pipe
        (`mlactl analyze | head`) as a quiet exit, like other Unix tools."""
        from mlactl.cli.errors import run_root

        return run_root(super().main, args, prog_name, complete_var, standalone_mode, **extra)


app = typer.Typer(
    cls=LazyGroup,
    help="Expand or absorb? Exact cost model, Triton kernels and autotuner for Multi-head Latent "
    "Attention (DeepSeek-V2/V3/R1, Kimi K2).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

FORMATS = OUTPUT_FORMATS
DTYPES = ACT_DTYPES

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
EnginesOpt = Annotated[
    Optional[str],
    typer.Option(
        "--engines",
        help="Engines whose own path rule to show, comma-separated: sglang, sglang-triton, sglang-trtllm, "
        "vllm (default: sglang,vllm). Rules from sgl-project/sglang@0a8dcfa9 attention_backend_handler.py "
        "and vllm-project/vllm@0014ca6b mla_attention.py; see docs/engines.md.",
    ),
]
EngineOptionOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--engine-option",
        help="[ENGINE.]KEY=VALUE, repeatable: sglang threshold (8192), capacity (131072), backend (fa3); "
        "vllm threshold (128), backend (flashmla; flash_attn_mla: threshold 512), workspace (65536).",
    ),
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
            if isinstance(exc, BrokenPipeError):
                raise  # the reader went away: LazyGroup.main exits quietly
            where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
            typer.echo(f"Error:{where} {exc.strerror or exc}", err=True)
            raise typer.Exit(2) from None

    return wrapper


def one_int(text: str, option: str, minimum: int = 1) -> int:
    from mlactl.model.shapes import parse_sizes

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
        if suffix in ("json", "csv"):
            return suffix
        if suffix not in ("", "txt", "table"):
            raise MlactlError(
                f"--output {output}: cannot tell the format from '.{suffix}'; "
                "pass --format table, json or csv, or end the name in .json, .csv or .txt"
            )
        return "table"
    return choice(fmt, "--format", FORMATS)


def load_model(model: str, tp: str):
    from mlactl.model import config as models

    return models.resolve(model).with_tp(one_int(tp, "--tp"))


def load_hardware(hardware: str, measured: bool):
    from mlactl.model import hardware as hw

    return hw.resolve(hardware, measured=measured)


def console(output: Optional[Path] = None):
    from rich.console import Console

    if output is None:
        con = Console()
        if not con.is_terminal:  # piped: rich would assume 80 columns and fold the tables
            con = Console(width=max(con.width, 132))
        return con
    return Console(record=True, file=io.StringIO(), width=132)


def fit_width(output: Optional[Path] = None) -> Optional[int]:
    """The width tables must fit: the terminal's, or None (piped or to a file: full values)."""
    con = console(output)
    return con.width if output is None and con.is_terminal else None


def emit(fmt: str, output: Optional[Path], *, json_data=None, write_csv=None, tables=()):
    """Write json/csv/table output to stdout or, atomically, to a file."""
    from mlactl.util.io import atomic_open

    if fmt == "json":
        from mlactl.output.report import dumps

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


def explicit(ctx, **values) -> dict:
    """Of these option values, the ones the user typed (None for those left at their default)."""

    def typed(name: str) -> bool:  # by name: typer ships its own copy of click's ParameterSource
        source = ctx.get_parameter_source(name)
        return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")

    return {k: v if typed(k) else None for k, v in values.items()}


def measured_results(ctx, path: Optional[Path], model, tp, dtype, kv_dtype, hardware):
    """The results file for --policy measured and the settings it brings: the one given, or the
    newest `mlactl tune paths` left for this model (mlactl.results.measured). Returns (data, settings
    {model, tp, dtype, kv_dtype, hardware}, notes)."""
    from mlactl.results import measured
    from mlactl.results import store as results

    given = explicit(ctx, model=model, tp=tp, dtype=dtype, kv_dtype=kv_dtype, hardware=hardware)
    data: Optional[dict]
    if path is not None:
        data = results.load(path)
    else:
        cfg = load_model(model, tp)
        dims = {k: getattr(cfg, k) for k in measured.DIMS}
        hw_name = load_hardware(given["hardware"], False).name if given["hardware"] else None
        data, path = measured.find(dims, given["kv_dtype"], hw_name)
        if data is None:
            where = f" on {hw_name}" if hw_name else ""
            kv = f", kv {given['kv_dtype']}" if given["kv_dtype"] else ""
            raise MlactlError(
                f"no measured crossovers for {cfg.name} (H={cfg.H}{kv}){where}: "
                "run `mlactl tune paths` there, or pass --results FILE"
            )
        given.update(model=model, tp=tp)  # looked up for these: the file's own name may differ
    if not measured.usable_crossovers(data):
        raise MlactlError(f"{path} has no measured crossovers (it holds no `mlactl tune paths` run)")
    picked = measured.adopt(data, str(path), given)
    settings = {
        "model": picked.model,
        "tp": str(picked.tp),
        "dtype": picked.dtype,
        "kv_dtype": picked.kv_dtype,
        "hardware": picked.hardware or hardware,
    }
    return dict(data, _path=str(path)), settings, picked.notes


def table_width(output: Optional[Path]) -> tuple[int, bool]:
    """The width tables must fit, and whether it is a terminal's (where columns may be dropped);
    piped or written to a file, the tables print every value in full within 132 columns."""
    width = fit_width(output)
    return (132, False) if width is None else (width, True)


def load_calibration(spec: Optional[str], hw):
    """The calibration for --calibration (None without it), refused for another hardware."""
    if spec is None:
        return None
    from mlactl.decide.calibration import store

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
    ctx: typer.Context,
    model: ModelOpt = "deepseek-v3",
    hardware: HardwareOpt = "h800",
    measured: MeasuredOpt = False,
    tp: TpOpt = "1",
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
    kv_dtype: KvDtypeOpt = "bf16",
    dtype: DtypeOpt = "bf16",
    chunk: ChunkOpt = str(DEFAULT_CHUNK),
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
            "(sglang, sglang-triton, sglang-trtllm, vllm).",
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
    calibration: CalibrationOpt = None,
    fmt: FormatOpt = None,
    output: OutputOpt = None,
):
    """FLOPs, bytes, intensity and roofline time of each path, op by op; the best path; the crossover.

    Each row also shows what each engine's own rule runs (default: sglang and vllm) and the time
    it loses against the best path that fits; docs/engines.md cites each rule's source.

    Example: mlactl analyze --model deepseek-v3 --hardware h200 --new 1:4096:*2 --prefix 0,32K
    (with --calibration NAME: calibrated time, see `mlactl calibrate`)
    """
    from mlactl.decide import analysis
    from mlactl.decide.engines import parse_engines
    from mlactl.model.shapes import grid, parse_sizes
    from mlactl.output import render

    fmt = output_format(fmt, output)
    if policy is not None:
        choice(policy, "--policy", POLICIES)
    results_data, settings_notes = None, []
    if policy == "measured":
        results_data, settings, settings_notes = measured_results(ctx, results, model, tp, dtype, kv_dtype, hardware)
        model, tp, dtype, kv_dtype, hardware = (settings[k] for k in ("model", "tp", "dtype", "kv_dtype", "hardware"))
    elif results is not None:
        raise MlactlError("--results goes with --policy measured")
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
    engine_params = parse_engines(engines, engine_option)
    check_points(len(b), fmt)
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
        engines=engine_params,
        policy=policy,
        results_data=results_data,
        calibration=cal,
    )
    width, terminal = table_width(output)
    tables = [render.header(result), *result.notes, render.analysis_table(result, width=width, drop=terminal)]
    if cal is not None:
        tables.insert(1, calibration_line(cal))
    if results_data is not None:
        tables.insert(2, f"measured policy: {results_data['_path']} ({results_data['device']['name']})")
        tables[3:3] = settings_notes
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
        from mlactl.output.report import to_json

        return dict(to_json(result), **calibration_json(cal))

    def csv_data(fh):
        from mlactl.output.report import write_analysis_csv

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
    chunk: ChunkOpt = str(DEFAULT_CHUNK),
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
    from mlactl.decide import analysis
    from mlactl.model import cost
    from mlactl.model.shapes import parse_sizes
    from mlactl.output import render, report
    from mlactl.output.csvout import write_csv

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
    chunk: ChunkOpt = str(DEFAULT_CHUNK),
    engines: EnginesOpt = None,
    engine_option: EngineOptionOpt = None,
    calibration: CalibrationOpt = None,
    fmt: FormatOpt = None,
    output: OutputOpt = None,
):
    """A mixed batch from a CSV of requests: the path of each, and the batch total per strategy.

    Each engine's rule is applied to the whole batch the engine's way: SGLang judges the extend
    requests together on their summed prefix (decode requests run as their own batch), vLLM
    judges each request on its query length (docs/engines.md).

    Example: mlactl batch requests.csv --hardware h200   (requests.csv: new,prefix / 1,8000 / 512,0 ...)
    """
    from mlactl.decide import analysis
    from mlactl.decide.engines import parse_engines
    from mlactl.decide.requests import read_requests
    from mlactl.output import render, report

    fmt = output_format(fmt, output)
    cfg = load_model(model, tp)
    hw = load_hardware(hardware, measured)
    engine_params = parse_engines(engines, engine_option)
    cal = load_calibration(calibration, hw)
    new, prefix, count = read_requests(requests, fmt)
    result = analysis.analyze_batch(
        cfg,
        hw,
        new,
        prefix,
        count,
        kv_dtype=choice(kv_dtype, "--kv-dtype", KV_DTYPES),
        dtype=choice(dtype, "--dtype", DTYPES),
        chunk=one_int(chunk, "--chunk"),
        engines=engine_params,
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
    fmt: Annotated[
        Optional[str], typer.Option("--format", "-f", help="table or json (default: from --output's extension).")
    ] = None,
    output: OutputOpt = None,
):
    """The models and the hardware profiles mlactl knows.

    Example: mlactl list --format json
    """
    from mlactl.model import config as model
    from mlactl.model import hardware
    from mlactl.output import render

    fmt = output_format(fmt, output)
    if fmt == "csv":
        raise MlactlError("mlactl list writes table or json (two tables do not make one CSV)")
    models = [(name, model.from_name(name)) for name in model.preset_names()]
    profiles = hardware.all_profiles()
    emit(
        fmt,
        output,
        json_data=lambda: {
            "models": {n: c.to_dict() for n, c in models},
            "hardware": {h.name: h.to_dict() for h in profiles},
        },
        tables=[render.models_table(models, fit_width(output)), render.hardware_table(profiles, fit_width(output))],
    )


def main() -> None:
    if sys.argv[1:2] != ["tune"]:
        # Outside tune, mlactl's arithmetic is elementwise numpy: starting OpenBLAS's thread pool
        # would only add ~60 ms to every start. A value the user set wins.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    app()


if __name__ == "__main__":
    main()
