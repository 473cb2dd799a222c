"""`mlactl calibrate`: fit calibrated time to measurements and write a calibration file;
`mlactl calibrate score`: score a calibration on measurements of one's own."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
import typer.core
from rich.table import Table

from mlactl.cli.common import choice, cli_errors, emit, load_model, output_format
from mlactl.cli.options import FormatOpt, ModelOpt, TpOpt
from mlactl.decide.calibration import run, store
from mlactl.decide.calibration.model import TERMS
from mlactl.decide.calibration.score import score
from mlactl.decide.calibration.sources import csv_points
from mlactl.model import hardware as hwmod
from mlactl.util.errors import MlactlError


class CalibrateGroup(typer.core.TyperGroup):
    """`mlactl calibrate [fit] ...` fits (the default command, so the name may be left out);
    `mlactl calibrate score ...` scores."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["fit", *args]
        return super().parse_args(ctx, args)


calibrate_app = typer.Typer(
    cls=CalibrateGroup,
    help="Fit calibrated time to measured kernels (tune results, aiconfigurator's tables or a CSV), "
    "or score a calibration on your own measurements.\n\n"
    "`mlactl calibrate ...` fits (the `fit` command: its name may be left out); "
    "`mlactl calibrate score --calibration NAME ...` scores.\n\n"
    "Example: mlactl calibrate --from aiconfigurator --system h200_sxm --framework sglang",
    no_args_is_help=False,
)


SOURCES = ("results", "aiconfigurator", "csv")

FilesArg = Annotated[
    Optional[list[Path]], typer.Argument(help="Results files (--from results) or one CSV (--from csv).")
]
SourceOpt = Annotated[str, typer.Option("--from", help="results, aiconfigurator or csv.")]
SystemOpt = Annotated[
    Optional[str], typer.Option("--system", help="aiconfigurator system, e.g. h200_sxm, h100_sxm, b200_sxm.")
]
FrameworkOpt = Annotated[
    Optional[str], typer.Option("--framework", help="aiconfigurator framework: sglang, trtllm or vllm.")
]
VersionOpt = Annotated[
    Optional[str], typer.Option("--version", help="Framework version (default: the newest of each table).")
]
DataDirOpt = Annotated[
    Optional[Path],
    typer.Option("--data-dir", help="A folder laid out as aiconfigurator's (default: the installed package's)."),
]


def pct(v) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def signed(v) -> str:
    return "—" if v is None else f"{100 * v:+.1f}%"


def check_source(source: str, files, system, framework, version, data_dir) -> None:
    """The source options agree with each other (one `Error:` line where they do not)."""
    choice(source, "--from", SOURCES)
    if source == "aiconfigurator":
        if files:
            raise MlactlError("--from aiconfigurator takes no files: give --system and --framework")
        if not system or not framework:
            raise MlactlError("--from aiconfigurator needs --system (e.g. h200_sxm) and --framework (e.g. sglang)")
        return
    if system or framework or version or data_dir:
        raise MlactlError("--system, --framework, --version and --data-dir go with --from aiconfigurator")
    if not files:
        raise MlactlError(f"--from {source} needs a file: mlactl calibrate --from {source} FILE")
    for f in files:
        if not f.is_file():
            raise MlactlError(f"{f}: no such file")
    if source == "csv" and len(files) != 1:
        raise MlactlError("--from csv takes one file")


def parse_terms(text: Optional[str]) -> Optional[tuple[str, ...]]:
    """--terms a,b,c: known term names, at least one."""
    if text is None:
        return None
    terms = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in terms if t not in TERMS]
    if not terms or unknown:
        raise MlactlError(
            f"--terms: {'unknown ' + ', '.join(repr(t) for t in unknown) if unknown else 'no terms'}; "
            f"terms: {', '.join(TERMS)}"
        )
    return terms


def score_table(title: str, scores) -> Table:
    t = Table(title=title)
    for col in ("op", "source", "dtype", "n", "median", "p90", "bias", "in 80% interval", "measured range"):
        left = col in ("op", "source", "dtype")
        t.add_column(col, justify="left" if left else "right", overflow="fold" if col == "source" else "ellipsis")
    for s in scores:
        t.add_row(
            s.op, s.source, s.dtype, str(s.n), pct(s.median), pct(s.p90), signed(s.bias), pct(s.coverage),
            "no fit" if s.fit is None else pct(s.measured),
        )  # fmt: skip
    t.caption = (
        "|predicted/measured - 1| median and p90; bias: median of predicted/measured - 1 (> 0: predicted slow); "
        "the share of measurements inside their 80% interval, and of points inside the fit's measured range"
    )
    return t


def measured_groups(source, files, system, framework, version, data_dir, model, tp) -> dict:
    if source == "aiconfigurator":
        return run.aiconfigurator_groups(system, framework, version, data_dir)
    if source == "results":
        return run.results_groups(files)
    return csv_points(files[0], load_model(model, tp))


@calibrate_app.command(name="fit")
@cli_errors
def calibrate(
    files: FilesArg = None,
    source: SourceOpt = "results",
    system: SystemOpt = None,
    framework: FrameworkOpt = None,
    version: VersionOpt = None,
    data_dir: DataDirOpt = None,
    hardware: Annotated[
        Optional[str],
        typer.Option(
            "--hardware", "-g", help="Profile the fit divides by (default: from the system or the results file)."
        ),
    ] = None,
    model: ModelOpt = "deepseek-v3",
    tp: TpOpt = "1",
    terms: Annotated[
        Optional[str],
        typer.Option(
            "--terms", help=f"Fit these terms, comma-separated, instead of selecting them: {', '.join(TERMS)}."
        ),
    ] = None,
    test: Annotated[
        Optional[Path],
        typer.Option(
            "--test",
            help="Score the calibration on this file too (a results file, or a CSV with --from csv): "
            "the errors of measurements the fit never saw.",
        ),
    ] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Calibration name (default: hardware-source).")] = None,
    out_dir: Annotated[
        Optional[Path], typer.Option("--dir", help="Write the file here (default: $MLACTL_HOME/calibrations/).")
    ] = None,
    fmt: FormatOpt = None,
):
    """Fit calibrated time per op class and write a calibration file; print the fit quality.

    Per op class: n, the terms kept, median and p90 of |predicted/measured - 1|, in-sample,
    held out over 5 random folds and over the blocked split (fit the lower part of the context,
    or of a GEMM's rows, predict the upper), and the held-out share of measurements inside
    their 80% interval.

    Terms are selected by both held-out errors (--terms fixes them). Paths timed side by side
    (tune paths) are fitted together, each shape's common drift taken out first.

    Use the file with --calibration NAME on analyze, crossover, batch and plot; score it on other
    measurements with `mlactl calibrate score --calibration NAME`, or here with --test FILE.

    Example: mlactl calibrate --from aiconfigurator --system h200_sxm --framework sglang
    """

    fmt = output_format(fmt, None)
    if fmt == "csv":
        raise MlactlError("mlactl calibrate writes table or json")
    check_source(source, files, system, framework, version, data_dir)
    fixed = parse_terms(terms)
    if test is not None:
        if source == "aiconfigurator":
            raise MlactlError("--test takes a results file or a CSV; score on aiconfigurator's tables with "
                              "`mlactl calibrate score NAME --from aiconfigurator`")  # fmt: skip
        if not test.is_file():
            raise MlactlError(f"--test {test}: no such file")
    hw = None
    if hardware is not None:
        hw = hwmod.resolve(hardware)
    if source == "aiconfigurator":
        assert system is not None and framework is not None  # check_source said so
        default, hw, desc, groups = run.from_aiconfigurator(system, framework, version, data_dir, hw)
    elif source == "results":
        default, hw, desc, groups = run.from_results(files, hw)
    else:
        if hw is None:
            raise MlactlError("--from csv needs --hardware NAME|FILE: the profile the times were measured on")
        default, hw, desc, groups = run.from_csv((files or [])[0], load_model(model, tp), hw)
    test_groups = None
    if test is not None:  # read before fitting: a bad test file costs no fit
        test_groups = measured_groups(source, [test], None, None, None, None, model, tp)
    data, fits = run.build(name or default, hw, desc, groups, terms=fixed)
    path = store.write(data, out_dir)
    tested = None if test_groups is None else score(store.load(path), test_groups)

    def json_data():
        out = {
            "calibration": {"name": data["name"], "hardware": data["hardware"], "path": str(path)},
            "fits": [
                {
                    "op": f.op,
                    "source": f.source,
                    "dtype": f.dtype,
                    "terms": list(f.terms),
                    "n": f.n,
                    # `near`'s residual table stays in the file: here, how many points it holds
                    "params": {
                        k: ({"points": len(v["log_residual"])} if k == "near" else v) for k, v in f.params.items()
                    },
                    "in_sample": f.in_sample,
                    "held_out": f.held_out,
                    "blocked": f.blocked,
                    "interval_coverage": ((f.extra.get("interval") or {}).get("coverage") or {}).get("held_out"),
                    "members": [m["terms"] for m in f.extra.get("members", [])],
                    **({"drift": f.drift} if f.drift else {}),
                }
                for f in fits
            ],
        }
        if tested is not None:
            out["test"] = {"file": str(test), "scores": [s.to_json() for s in tested]}
        return out

    def tables():

        t = Table(title=f"Calibration {data['name']} (hardware {hw.name}); |predicted/measured - 1|")
        cols = ("op", "source", "dtype", "n", "terms", "in-sample median", "p90", "held-out median", "p90",
                "blocked median", "p90", "in 80%")  # fmt: skip
        for col in cols:
            wide = col in ("source", "terms")  # a fit's source ends in its phase (:decode, :prefill)
            t.add_column(
                col,
                justify="left" if col in ("op", "source", "dtype", "terms") else "right",
                overflow="fold" if wide else "ellipsis",
            )
        for f in fits:
            blocked = f.blocked or {}
            t.add_row(
                f.op,
                f.source,
                f.dtype,
                str(f.n),
                "+".join(f.terms),
                pct(f.in_sample["median"]),
                pct(f.in_sample["p90"]),
                pct(f.held_out["median"]),
                pct(f.held_out["p90"]),
                pct(blocked.get("median")),
                pct(blocked.get("p90")),
                pct(((f.extra.get("interval") or {}).get("coverage") or {}).get("held_out")),
            )
        t.caption = (
            "held out: 5 random folds; blocked: fitted on context <= 8K (GEMM rows <= 1024), predicting above; "
            "in 80%: held-out measurements inside their 80% interval"
        )
        out: list = [t]
        for drift in {id(f.drift): f.drift for f in fits if f.drift}.values():
            out.append(
                f"{' and '.join(drift['paired_with'])} were timed side by side at {drift['shapes']} shapes and fitted "
                f"together: each shape's common drift (median {pct(drift['median_abs'])}, largest "
                f"{pct(drift['max_abs'])}) was taken out first; the errors are against the drift-free times"
            )
        if tested is not None:
            out.append(score_table(f"Scored on {test} (measurements the fit never saw)", tested))
        return out + [f"written: {path}  (use: --calibration {data['name']} --hardware {hw.name})"]

    emit(fmt, None, json_data=json_data, tables=tables() if fmt == "table" else ())


@calibrate_app.command(name="score")
@cli_errors
def score_cmd(
    files: FilesArg = None,
    calibration: Annotated[
        Optional[str],
        typer.Option("--calibration", help="The calibration to score: a name from `mlactl calibrate` or a file."),
    ] = None,
    source: SourceOpt = "results",
    system: SystemOpt = None,
    framework: FrameworkOpt = None,
    version: VersionOpt = None,
    data_dir: DataDirOpt = None,
    model: ModelOpt = "deepseek-v3",
    tp: TpOpt = "1",
    fmt: FormatOpt = None,
):
    """Score a calibration on measurements: per op class n, median and p90 of |predicted/measured - 1|,
    bias, and the share of measurements inside their 80% interval.

    The measurements are a results file of `mlactl tune`, a CSV (op,batch,new,prefix,time_s; --model
    gives its FLOPs and bytes) or aiconfigurator's tables. Nothing is fitted or written.

    Example: mlactl calibrate score --calibration h200-aiconfigurator-sglang-0.5.14 --from csv my-h200.csv
    """

    fmt = output_format(fmt, None)
    if fmt == "csv":
        raise MlactlError("mlactl calibrate score writes table or json")
    if calibration is None:
        raise MlactlError("mlactl calibrate score needs --calibration NAME|FILE: the calibration to score")
    check_source(source, files, system, framework, version, data_dir)
    cal = store.resolve(calibration)
    scores = score(cal, measured_groups(source, files, system, framework, version, data_dir, model, tp))
    where = f"{system}/{framework}" if source == "aiconfigurator" else ", ".join(str(f) for f in files or [])

    def json_data():
        return {
            "calibration": cal.describe(),
            "measurements": {"from": source, "where": where},
            "scores": [s.to_json() for s in scores],
        }

    title = f"Calibration {cal.name} scored on {where}"
    emit(fmt, None, json_data=json_data, tables=[score_table(title, scores)] if fmt == "table" else ())
