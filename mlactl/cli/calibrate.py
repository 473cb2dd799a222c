"""`mlactl calibrate`: fit calibrated time to measurements and write a calibration file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import typer.core

from mlactl.cli import complete
from mlactl.cli.common import choice, command, emit, load_model, output_format, store_listing, table_width
from mlactl.cli.options import (
    OUTPUT,
    SHARED,
    DataDirOpt,
    FrameworkOpt,
    FrameworkVersionOpt,
    Option,
    Opts,
    SystemOpt,
)
from mlactl.decide.calibration import run, store
from mlactl.decide.calibration.fit import FitResult
from mlactl.decide.calibration.model import TERMS
from mlactl.decide.calibration.score import check_measured_on, score
from mlactl.decide.calibration.sources import csv_points
from mlactl.decide.calibration.transfer import transfer
from mlactl.model import hardware as hwmod
from mlactl.output.calibrate_tables import (
    fits_table,
    left_out_lines,
    pct,
    score_table,
    stored_table,
    terms_lines,
    transfer_table,
    uncovered_lines,
    unusable_lines,
)
from mlactl.results import store as results_store
from mlactl.util import progress, safe
from mlactl.util.errors import MlactlError


class CalibrateGroup(typer.core.TyperGroup):
    """`mlactl calibrate [fit] ...` fits (the default command, so the name may be left out, and
    `mlactl calibrate --help` is fit's help, which names the others); `mlactl calibrate score ...`
    scores, `transfer` carries a calibration to another GPU, `list` lists them, `show` shows one."""

    def parse_args(self, ctx, args):
        if not args or args[0] not in self.commands:
            args = ["fit", *args]
        return super().parse_args(ctx, args)


calibrate_app = typer.Typer(
    cls=CalibrateGroup,
    help="Fit calibrated time to measured kernels (tune results, aiconfigurator's tables or a CSV), "
    "or score a calibration on your own measurements.\n\n"
    "`mlactl calibrate ...` fits (the `fit` command: its name may be left out); "
    "`mlactl calibrate score --calibration NAME ...` scores; "
    "`mlactl calibrate transfer NAME --hardware GPU` carries a calibration to another GPU; "
    "`mlactl calibrate list` lists the calibrations you have, `mlactl calibrate show NAME` what one holds.\n\n"
    "Example: mlactl calibrate --from aiconfigurator --system h200_sxm --framework sglang",
    no_args_is_help=False,
)


SOURCES = ("results", "aiconfigurator", "csv")
# calibrate prints a table or JSON on stdout (the calibration itself is a file in --dir)
FORMAT = Option(
    Annotated[
        Optional[str],
        typer.Option(
            "--format", "-f", help="table or json (default: table).", autocompletion=complete.one_of(("table", "json"))
        ),
    ],
    None,
)
FilesArg = Annotated[
    Optional[list[Path]], typer.Argument(help="Results files (--from results) or one CSV (--from csv).")
]
SourceOpt = Annotated[str, typer.Option("--from", help="results, aiconfigurator or csv.")]
# where the measurements come from: --from and aiconfigurator's table options (fit and score)
MEASURED = {
    "source": Option(SourceOpt, "results"),
    "system": Option(SystemOpt, None),
    "framework": Option(FrameworkOpt, None),
    "framework_version": Option(FrameworkVersionOpt, None),
    "data_dir": Option(DataDirOpt, None),
}


@dataclass(frozen=True)
class CalibrateOpts(Opts):
    """The shared options of fit and score, with where their measurements come from."""

    source: str = "results"
    system: Optional[str] = None
    framework: Optional[str] = None
    framework_version: Optional[str] = None
    data_dir: Optional[Path] = None

    def check_source(self, files) -> None:
        """The source options agree with each other and with `files` (one `Error:` line where
        they do not)."""
        source = choice(self.source, "--from", SOURCES)
        if source == "aiconfigurator":
            if files:
                raise MlactlError("--from aiconfigurator takes no files: give --system and --framework")
            missing = [
                f"{o} (e.g. {e})"
                for o, v, e in (("--system", self.system, "h200_sxm"), ("--framework", self.framework, "sglang"))
                if not v
            ]
            if missing:
                raise MlactlError(f"--from aiconfigurator needs {' and '.join(missing)}")
            return
        if self.system or self.framework or self.framework_version or self.data_dir:
            raise MlactlError("--system, --framework, --framework-version and --data-dir go with --from aiconfigurator")
        if not files:
            raise MlactlError(f"--from {source} needs a file: mlactl calibrate --from {source} FILE")
        if source == "csv" and len(files) != 1:
            raise MlactlError("--from csv takes one file")

    def groups(self, files) -> tuple[dict, list[dict]]:
        """The measurements to score, {(op class, source, dtype): Points}, and the groups of
        aiconfigurator's tables left out (their rows are not kernel times)."""
        if self.source == "aiconfigurator":
            assert self.system is not None and self.framework is not None  # check_source said so
            with progress.task("reading aiconfigurator's tables"):
                return run.aiconfigurator_groups(self.system, self.framework, self.framework_version, self.data_dir)
        if self.source == "results":
            with progress.task(f"reading {len(files)} results file(s)"):
                return run.results_groups(files), []
        return csv_points(files[0], load_model(self.model, self.tp)), []


def measured_options(values: dict, given: frozenset) -> CalibrateOpts:
    return CalibrateOpts(**values, given=given)


# fit's and score's shared options after their own, and how they arrive (one CalibrateOpts)
MEASURED_COMMAND: dict[str, Any] = {
    "end": ("fmt",),
    "registry": SHARED | MEASURED,
    "into": measured_options,
    "fmt": FORMAT,
}


SCORE_HARDWARE = Option(
    Annotated[
        Optional[str],
        typer.Option(
            "--hardware",
            "-g",
            help="Profile the measurements were taken on (default: the system's, the results file's, or for a CSV "
            "the calibration's). A calibration of another GPU is refused: transfer it first.",
            autocompletion=complete.hardware,
        ),
    ],
    None,
)
HARDWARE = Option(
    Annotated[
        Optional[str],
        typer.Option(
            "--hardware",
            "-g",
            help="Profile the fit divides by (default: from the system or the results file).",
            autocompletion=complete.hardware,
        ),
    ],
    None,
)
SCORE_CALIBRATION = Option(
    Annotated[
        Optional[str],
        typer.Option(
            "--calibration",
            help="The calibration to score: a name from `mlactl calibrate` or a file.",
            autocompletion=complete.calibrations,
        ),
    ],
    None,
)
TRANSFER_HARDWARE = Option(
    Annotated[
        Optional[str],
        typer.Option(
            "--hardware", "-g", help="The GPU to carry it to: a profile NAME or FILE.", autocompletion=complete.hardware
        ),
    ],
    None,
)


def parse_terms(text: Optional[str]) -> Optional[tuple[str, ...]]:
    """--terms a,b,c: known term names, at least one."""
    if text is None:
        return None
    terms = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in terms if t not in TERMS]
    if not terms or unknown:
        what = "unknown " + ", ".join(repr(safe.text(t, 40)) for t in unknown) if unknown else "no terms"
        raise MlactlError(f"--terms: {what}; terms: {', '.join(TERMS)}")
    return terms


@command(calibrate_app, "fit", *MEASURED, "hardware", "model", "tp", hardware=HARDWARE, **MEASURED_COMMAND)
def calibrate(
    files: FilesArg = None,
    opts: CalibrateOpts = CalibrateOpts(),
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
):
    """Fit calibrated time per op class and write a calibration file; print the fit quality.

    Per op class: n, the terms kept, median and p90 of |predicted/measured - 1| in-sample and held out.

    Held out over 5 random folds, and over the blocked split: fit context <= 8K (GEMM rows <= 1024), predict above.

    In 80%: the share of held-out measurements inside their 80% interval.

    Terms are selected by both held-out errors (--terms fixes them).

    Paths timed side by side (tune paths) are fitted together, each shape's common drift taken out first.

    A calibration of the same name already there is kept aside (NAME.YYYYMMDD-HHMMSS.json), never overwritten.

    Use the file with --calibration NAME on analyze, crossover, batch, engines and plot (they take its hardware).

    Score it on other measurements with `mlactl calibrate score --calibration NAME`, or here with --test FILE.

    Example: mlactl calibrate --from aiconfigurator --system h200_sxm --framework sglang
    """

    fmt = output_format(opts.fmt, None)
    if fmt == "csv":
        raise MlactlError("mlactl calibrate writes table or json")
    opts.check_source(files)
    source, system, framework = opts.source, opts.system, opts.framework
    fixed = parse_terms(terms)
    if test is not None and source == "aiconfigurator":
        raise MlactlError(
            "--test takes a results file or a CSV; score on aiconfigurator's tables with "
            "`mlactl calibrate score --calibration NAME --from aiconfigurator`"
        )
    hw = None
    if opts.hardware is not None:
        hw = hwmod.resolve(opts.hardware)
    if source == "aiconfigurator":
        assert system is not None and framework is not None  # check_source said so
        with progress.task("reading aiconfigurator's tables"):
            default, hw, desc, groups = run.from_aiconfigurator(
                system, framework, opts.framework_version, opts.data_dir, hw
            )
    elif source == "results":
        with progress.task(f"reading {len(files or [])} results file(s)"):
            default, hw, desc, groups = run.from_results(files, hw)
    else:
        if hw is None:
            raise MlactlError("--from csv needs --hardware NAME|FILE: the profile the times were measured on")
        default, hw, desc, groups = run.from_csv((files or [])[0], load_model(opts.model, opts.tp), hw)
    test_groups = None
    if test is not None:  # read before fitting: a bad test file costs no fit
        test_groups, _ = CalibrateOpts(source=source, model=opts.model, tp=opts.tp).groups([test])
    data, fits = run.build(name or default, hw, desc, groups, terms=fixed)
    path, kept = store.save(data, out_dir)
    tested = None if test_groups is None else score(store.load(path), test_groups)

    def json_data():
        out = {
            "calibration": {
                "name": data["name"],
                "hardware": data["hardware"],
                "path": str(path),
                "replaced": None if kept is None else str(kept),  # where the earlier one was kept
            },
            "left_out": desc.get("left_out", []),
            "fits": [f.summary_json() for f in fits],
        }
        if tested is not None:
            out["test"] = {"file": str(test), "scores": [s.to_json() for s in tested]}
        return out

    def tables():
        out = fit_tables(data["name"], hw.name, fits, desc) + written_lines(path, kept, data["name"], hw.name)
        if tested is not None:
            title = f"Scored on {safe.markup(test)} (measurements the fit never saw)"
            out.append(score_table(title, tested, table_width(None)[0]))
        return out

    emit(fmt, None, json_data=json_data, tables=tables() if fmt == "table" else ())


def fit_tables(name: str, hardware: str, fits, source: dict) -> list:
    """A fitted calibration as `mlactl calibrate` prints it: its fits, the terms each kept, the
    tables left out, and how whole paths timed side by side were fitted together."""
    out: list = [fits_table(name, hardware, fits, table_width(None)[0]), *terms_lines(fits)]
    out += left_out_lines(source)
    for drift in {id(f.drift): f.drift for f in fits if f.drift}.values():
        out.append(
            f"{' and '.join(drift['paired_with'])} were timed side by side at {drift['shapes']} shapes and fitted "
            f"together: each shape's common drift (median {pct(drift['median_abs'])}, largest "
            f"{pct(drift['max_abs'])}) was taken out first; the errors are against the drift-free times"
        )
    return out


def measured_hardware(source, files, system, hardware: Optional[str]) -> Optional[str]:
    """The profile the measurements to score were taken on: --hardware, else the system's
    (aiconfigurator) or the results files' own; None (a CSV, a CPU run): the calibration's."""
    if hardware is not None:
        return hwmod.resolve(hardware).name
    if source == "aiconfigurator":
        if system not in run.SYSTEM_PROFILES:
            raise MlactlError(f"no hardware profile for system {safe.text(system, 40)!r}: pass --hardware NAME|FILE")
        return run.SYSTEM_PROFILES[system]
    if source == "results":
        named = {(results_store.load(f).get("device") or {}).get("hardware") for f in files or []}
        return named.pop() if len(named) == 1 and None not in named else None
    return None


@command(
    calibrate_app,
    "score",
    "calibration",
    *MEASURED,
    "model",
    "tp",
    "hardware",
    calibration=SCORE_CALIBRATION,
    hardware=SCORE_HARDWARE,
    **MEASURED_COMMAND,
)
def score_cmd(files: FilesArg = None, opts: CalibrateOpts = CalibrateOpts()):
    """Score a calibration on measurements: per op class n, median and p90 of |predicted/measured - 1|,
    bias, and the share of measurements inside their 80% interval.

    The measurements are a results file of `mlactl tune`, a CSV (op,batch,new,prefix,time_s; --model
    gives its FLOPs and bytes) or aiconfigurator's tables. Nothing is fitted or written.

    Example: mlactl calibrate score --calibration h200-aiconfigurator-sglang-0.5.14 --from csv my-h200.csv
    """

    fmt = output_format(opts.fmt, None)
    if fmt == "csv":
        raise MlactlError("mlactl calibrate score writes table or json")
    if opts.calibration is None:
        raise MlactlError("mlactl calibrate score needs --calibration NAME|FILE: the calibration to score")
    opts.check_source(files)
    source, system = opts.source, opts.system
    cal = store.resolve(opts.calibration)
    where = f"{system}/{opts.framework}" if source == "aiconfigurator" else ", ".join(str(f) for f in files or [])
    measured_on = measured_hardware(source, files, system, opts.hardware)
    check_measured_on(cal, measured_on, where)  # before reading the tables: a wrong GPU costs nothing
    if measured_on is not None:
        store.check_ceilings(cal, hwmod.resolve(opts.hardware or measured_on))
    groups, left = opts.groups(files)
    scores = score(cal, groups, measured_on, where)

    def json_data():
        return {
            "calibration": cal.describe(),
            "measurements": {"from": source, "where": where},
            "scores": [s.to_json() for s in scores],
            "left_out": left,
        }

    title = f"Calibration {safe.markup(cal.name)} scored on {safe.markup(where)}"
    note = cal.transfer_note()
    tables = (
        [
            score_table(title, scores, table_width(None)[0]),
            *uncovered_lines(scores),
            *left_out_lines({"left_out": left}),
        ]
        + ([safe.markup(note)] if note else [])
        if fmt == "table"
        else []
    )
    emit(fmt, None, json_data=json_data, tables=tables)


def written_lines(path, kept, name: str, hardware: str, more: str = "") -> list[str]:
    """Where a new calibration went (and where the one it replaced is kept), and how to use it."""
    where = (
        f"replaced: {safe.markup(path)} (the earlier calibration of this name is kept as {safe.markup(kept)})"
        if kept is not None
        else f"written: {safe.markup(path)}"
    )
    use = f"use: --calibration {safe.markup(name)}  (its hardware, {safe.markup(hardware)}, comes with it{more})"
    return [where, use]


@command(calibrate_app, "transfer", "hardware", end=("fmt",), hardware=TRANSFER_HARDWARE, fmt=FORMAT)
def transfer_cmd(
    calibration: Annotated[
        str,
        typer.Argument(
            help="The calibration to carry: a name from `mlactl calibrate` or a file.",
            autocompletion=complete.calibrations,
        ),
    ],
    opts: Opts = Opts(),
    name: Annotated[
        Optional[str], typer.Option("--name", help="Name of the new calibration (default: TARGET-from-NAME).")
    ] = None,
    out_dir: Annotated[
        Optional[Path], typer.Option("--dir", help="Write the file here (default: $MLACTL_HOME/calibrations/).")
    ] = None,
):
    """Carry a calibration to a GPU it was not measured on, and write it as a calibration for that GPU.

    Each fit keeps what belongs to the kernel (launch and per-request costs in seconds, efficiencies as fractions
    of the ceilings) and takes the target's ceilings, SM count and L2.

    Terms of one kernel (FA3's split and fp8-cache pass, DeepGEMM's SM90 tiles) travel only where the engine runs
    that kernel on the target, by its default backend there; elsewhere the fit falls back to a member without them.

    Each interval is widened by the error transfer itself makes, measured leave-one-GPU-out over the GPUs
    aiconfigurator has tables for.

    analyze, crossover, engines, replay and plot accept the result for the target and say its times are transferred.

    Example: mlactl calibrate transfer h200-aiconfigurator-sglang-0.5.14 --hardware b300
    """

    fmt = output_format(opts.fmt, None)
    if fmt == "csv":
        raise MlactlError("mlactl calibrate transfer writes table or json")
    if opts.hardware is None:
        raise MlactlError("mlactl calibrate transfer needs --hardware NAME|FILE: the GPU to carry the calibration to")
    cal = store.resolve(calibration)
    source_hw = hwmod.resolve(cal.hardware)
    store.check_ceilings(cal, source_hw)
    target = hwmod.resolve(opts.hardware)
    data = transfer(cal, source_hw, target, name)
    path, kept = store.save(data, out_dir)

    def json_data():
        return {
            "calibration": {
                "name": data["name"],
                "hardware": data["hardware"],
                "path": str(path),
                "replaced": None if kept is None else str(kept),
                "transferred": data["transfer"]["from"] | {"to": data["transfer"]["to"]},
            },
            "fits": [
                {k: f.get(k) for k in ("op", "source", "dtype", "terms", "transfer")}
                | {"interval_transfer": (f.get("interval") or {}).get("transfer")}
                for f in data["fits"]
            ],
        }

    def tables():
        out: list = [transfer_table(data["name"], cal.hardware, target.name, data["fits"], table_width(None)[0])]
        out += written_lines(path, kept, data["name"], target.name, "; its times are transferred")
        return out

    emit(fmt, None, json_data=json_data, tables=tables() if fmt == "table" else ())


LIST_FORMAT = Option(
    Annotated[
        Optional[str],
        typer.Option(
            "--format",
            "-f",
            help="table or json (default: from --output's extension, else table).",
            autocompletion=complete.one_of(("table", "json")),
        ),
    ],
    None,
)


@command(calibrate_app, "list", end=OUTPUT, fmt=LIST_FORMAT)
def list_cmd(
    opts: Opts = Opts(),
    folder: Annotated[
        Optional[Path], typer.Option("--dir", help="List this folder (default: $MLACTL_HOME/calibrations/).")
    ] = None,
):
    """The calibrations you have: the name --calibration takes, the GPU each is for, what it was fitted on
    (a transferred one: from which GPU), its fits and when it was made.

    A file there that cannot be used is listed with why. Earlier calibrations kept aside by a later one of the
    same name (NAME.YYYYMMDD-HHMMSS) are listed too: --calibration takes their names as well.

    Example: mlactl calibrate list --format json
    """

    fmt, where, none = store_listing(
        "mlactl calibrate list",
        opts.fmt,
        opts.output,
        folder,
        store.calibrations_dir(),
        "calibrations",
        "mlactl calibrate",
    )
    entries = store.stored(where)
    usable = any(e.calibration is not None for e in entries)
    tables = [stored_table(where, entries, table_width(opts.output)[0]) if usable else none]
    emit(fmt, opts.output, json_data=lambda: store.stored_json(where, entries), tables=tables + unusable_lines(entries))


@command(calibrate_app, "show", end=("fmt",), fmt=FORMAT)
def show_cmd(
    calibration: Annotated[
        str,
        typer.Argument(
            help="A name from `mlactl calibrate list`, or a calibration file.", autocompletion=complete.calibrations
        ),
    ],
    opts: Opts = Opts(),
):
    """What a stored calibration holds, as `mlactl calibrate` printed it when it was fitted: each fit's op class,
    kernel, terms and held-out error, and the share inside its 80% interval; a transferred one, what each fit rests
    on at the target and the transfer error its interval was widened by. Nothing is fitted.

    Example: mlactl calibrate show h200-aiconfigurator-sglang-0.5.14
    """

    fmt = output_format(opts.fmt, None)
    if fmt == "csv":
        raise MlactlError("mlactl calibrate show writes table or json")
    cal = store.resolve(calibration)
    fits = [FitResult.of(entry) for entry in cal.data["fits"]]
    source = cal.data.get("source") or {}

    def json_data():
        return {
            "calibration": cal.describe(),
            "made_from": cal.made_from(),
            "created": cal.data.get("created"),
            "left_out": source.get("left_out", []),
            "fits": [f.summary_json() | {"transfer": f.extra.get("transfer")} for f in fits],
        }

    t = cal.transferred
    if t is None:
        tables = fit_tables(cal.name, cal.hardware, fits, source)
    else:
        frm = t["from"]["hardware"]
        tables = [transfer_table(cal.name, frm, cal.hardware, cal.data["fits"], table_width(None)[0])]
        tables += [safe.markup(cal.transfer_note() or "")]
    tables.append(f"file: {safe.markup(cal.path)}; made from {safe.markup(cal.made_from())}")
    emit(fmt, None, json_data=json_data, tables=tables if fmt == "table" else ())
