"""What the charts share: saving an image, checking and placing measured points, titles, labels,
the measured ceilings, and what each path is drawn as. matplotlib is imported inside the functions
that draw."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from mlactl.decide.analysis import Analysis
from mlactl.model.cost import OPS, CostModel
from mlactl.model.hardware import HardwareProfile, load_profile
from mlactl.model.roofline import path_time
from mlactl.results import store as results_store
from mlactl.results.measured import file_hardware
from mlactl.util import safe
from mlactl.util.errors import MlactlError
from mlactl.util.io import atomic_open
from mlactl.util.limits import check_plot

FORMATS = ("png", "svg", "pdf")


PATH_COLOURS = {
    "expand": "tab:orange",
    "expand_chunked": "tab:green",
    "absorb": "tab:blue",
    "mha": "tab:gray",
    "sparse_absorb": "tab:blue",
    "masked_expand": "tab:orange",
    "dense_expand": "tab:green",
}


class ChartData:
    """What a chart's data function returns (a frozen dataclass) shares: `as_dict`, the plain dict
    `--data` writes and the chart functions return: the attributes named in DATA, in that order
    (OPTIONAL ones left out where None), a nested ChartData or a sequence of them as its dict."""

    DATA: ClassVar[tuple[str, ...]] = ()
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def as_dict(self) -> dict:
        out = {}
        for key in self.DATA:
            value = getattr(self, key)
            if value is None and key in self.OPTIONAL:
                continue
            if isinstance(value, ChartData):
                value = value.as_dict()
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, ChartData) for v in value):
                value = [v.as_dict() for v in value]
            out[key] = value
        return out


# The words the charts use for each kind of path (the cost model names the paths, not their kinds):
# the path map's colour bar reads "<absorb's> faster | <the others'> faster".
KIND_WORDS = {
    "absorb": "absorb",
    "expand": "expand",
    "expand_chunked": "expand",
    "sparse_absorb": "sparse absorb",
    "masked_expand": "masked or dense MHA",
    "dense_expand": "masked or dense MHA",
}


@dataclass(frozen=True)
class Roles:
    """The paths a model chooses between (cost.choices), by what they do: the one that absorbs
    W_UK into the query (its ops hold q_absorb, mlactl.model.cost.OPS), and the ones that expand
    the cache, in the cost model's order. The last expand path is drawn apart: dashed on the
    crossover chart, a + on the path map (expand_chunked; a DSA model's dense_expand)."""

    absorb: str
    expand: tuple[str, ...]

    @property
    def marked(self) -> str:
        return self.expand[-1]

    def kind_words(self) -> tuple[str, str]:
        """(absorb's word, the expand paths' words joined by "or")."""
        others = " or ".join(dict.fromkeys(KIND_WORDS.get(p, p) for p in self.expand))
        return KIND_WORDS.get(self.absorb, self.absorb), others


def roles(cost: CostModel) -> Roles:
    absorbing = [p for p in cost.choices if "q_absorb" in OPS[p]]
    if len(absorbing) != 1:
        raise MlactlError(f"the charts need one absorbing path among {', '.join(cost.choices)}")
    return Roles(absorbing[0], tuple(p for p in cost.choices if p != absorbing[0]))


# Where the crossover table (mlactl.decide.analysis) keeps each expand path's figure by time, and
# its 80% interval where it has one: a number (the path wins from there on) or a Window (it wins
# from its first count to its last).
SOLVED_FIELDS = {
    "expand": ("by_time", "by_time_interval"),
    "expand_chunked": ("by_time_chunked", "by_time_chunked_interval"),
    "masked_expand": ("masked_by_time", None),
    "dense_expand": ("dense_by_time", None),
}


@dataclass(frozen=True)
class Win:
    """Where an expand path beats the absorbing one, by time: from `first` new tokens on, up to
    `last` (None: no end, a crossover)."""

    first: int
    last: int | None = None


def solved_win(row, path: str) -> Win | None:
    """`path`'s win in a row of the crossover table (a CrossoverRow or a WindowRow); None where
    it never wins, or where the row is None (not solved)."""
    if row is None:
        return None
    value = getattr(row, SOLVED_FIELDS[path][0])
    if value is None:
        return None
    return Win(value.first, value.last) if hasattr(value, "first") else Win(value)


def solved_interval(row, path: str):
    """The 80% interval of `path`'s crossover in a calibrated row, where the table has one."""
    field = SOLVED_FIELDS[path][1]
    return None if row is None or field is None else getattr(row, field)


def solved_rows(analysis: Analysis) -> dict:
    """The crossover table's rows by (batch, prefix): an MLA model's crossovers or a DSA model's
    windows, whichever the analysis holds."""
    found = analysis.crossover
    return {(r.batch, r.prefix): r for r in (*found.rows, *found.windows)}


# Dates left out of the files, so that a regenerated image is byte-for-byte the same.
NO_DATE = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}


def image_format(path) -> str:
    """The image format a file name asks for; an unsupported extension is an error."""

    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        got = f"'.{suffix}'" if suffix else "no extension"
        raise MlactlError(f"cannot write an image to {path}: {got}; use .png, .svg or .pdf")
    return suffix


MIN_DPI = 20  # FreeType refuses a font rendered below one pixel per em: 7 pt at 10 dpi


def _rasterized(fig) -> bool:
    """Whether any artist of `fig` is drawn as pixels even in an SVG or PDF (the path map's cells)."""
    return any(getattr(a, "get_rasterized", lambda: False)() for a in fig.findobj())


def check_pixels(inches, dpi: int, fmt: str = "png") -> None:
    """The pixels Agg must draw: a PNG's whole canvas (at most 2^16 - 1 a side), or in an SVG or
    PDF the rasterized artists at `dpi` (Agg's limit, 2^23 - 1 a side); either must fit memory."""

    width, height = (float(x) * dpi for x in inches)
    side = 2**16 if fmt == "png" else 2**23
    if max(width, height) >= side:
        most = int((side - 1) / max(inches))
        what = (
            "a PNG is at most 65,535 a side"
            if fmt == "png"
            else "its cells are drawn as pixels, at most 8,388,607 a side"
        )
        hint = ", or write .svg or .pdf" if fmt == "png" else ""
        raise MlactlError(
            f"--dpi {dpi} makes a {width:,.0f} x {height:,.0f} pixel image; {what} (--dpi {most} at most here){hint}"
        )
    check_plot(0, width * height)


def save(fig, path, dpi: int = 100) -> None:
    """Write `fig` to `path` (png, svg or pdf, from the extension), atomically."""
    import matplotlib

    fmt = image_format(path)
    if dpi < MIN_DPI:
        raise MlactlError(
            f"--dpi {dpi} is too small: at least {MIN_DPI} (smaller rounds the 7-point labels to no pixels)"
        )
    if fmt == "png" or _rasterized(fig):
        check_pixels(fig.get_size_inches(), dpi, fmt)
    # a fixed salt for the SVG's element ids, which are otherwise random
    with matplotlib.rc_context({"svg.hashsalt": "mlactl"}), atomic_open(path, "wb") as fh:
        fig.savefig(fh, format=fmt, dpi=dpi, metadata=NO_DATE[fmt])


def check_results(data: dict, where: str, cost: CostModel, hw: HardwareProfile) -> None:
    """A results file must come from the model, machine and dtypes asked: its points would
    otherwise be placed with another cost model than the one they were measured with."""
    results_store.check_matches(data, where, cost.cfg.name, hw.name)
    heads = data["model"].get("H")
    if heads is not None and heads != cost.cfg.H:
        raise MlactlError(
            f"{where} was measured with {heads} heads per GPU, not {cost.cfg.H} "
            "(pass --tp to match, or another results file)"
        )
    for key, option in (("kv_dtype", "--kv-dtype"), ("dtype", "--dtype"), ("chunk", "--chunk")):
        value = data.get(key)
        if value is not None and value != getattr(cost, key):
            raise MlactlError(
                f"{where} was measured with {key} {value}, not {getattr(cost, key)} (pass {option} {value} to match)"
            )


def measured_label(data: dict) -> str:
    """Device, backend, versions and timing method of a results file, for titles (names from the
    file escaped for mathtext: mlactl.util.safe)."""
    versions = ", ".join(f"{k} {v}" for k, v in data.get("versions", {}).items() if k != "python" and v)
    timing = data.get("timing", {}).get("method")
    parts = [data["device"]["name"], f"{data['backend']} backend", versions, timing]
    return safe.mathtext(", ".join(str(p) for p in parts if p), 400)


def median_of(row: dict, where: str) -> float:
    t = row.get("median_s")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
        raise MlactlError(f"{where}: median_s must be a positive number of seconds, got {t!r}")
    return float(t)


def measured_points(analysis: Analysis, results: list[dict]) -> list[dict]:
    """Every measured path time of the results, placed by the cost model: FLOP/s = cost FLOPs of
    the shape / median_s, intensity = cost FLOPs / cost bytes. `fraction` is the roofline's time
    over the measured one (1.0: at the roofline)."""
    if results and analysis.layers != 1:
        raise MlactlError("measurements are per layer: analyse one layer to compare with them")
    cost, hw = analysis.cost, analysis.hw
    points = []
    for source, data in enumerate(results):
        for i, row in enumerate(data.get("paths", [])):
            median = median_of(row, f"{data['device']['name']} paths[{i}]")
            b, n, p = (int(row[k]) for k in ("batch", "new", "prefix"))
            predicted = path_time(cost.ops(row["path"], b, n, p), hw, cost.dtype, row["path"])
            flops, nbytes, predicted_s = (float(x) for x in (predicted.flops, predicted.bytes, predicted.time_s))
            points.append(
                {
                    "source": source,
                    "path": row["path"],
                    "batch": b,
                    "new": n,
                    "prefix": p,
                    "label": shape_label(b, n, p),
                    "median_s": median,
                    "predicted_s": predicted_s,
                    "flops": flops,
                    "bytes": nbytes,
                    "intensity": flops / nbytes,
                    "flops_per_s": flops / median,
                    "predicted_flops_per_s": flops / predicted_s,
                    "fraction": predicted_s / median,
                    # faster than the roofline allows: the ceilings it was placed with are too low
                    "above_ceiling": predicted_s > median,
                }
            )
    return points


def measured_crossover_rows(results: list[dict], batch: int) -> list[dict]:
    """The measured crossover rows of one batch size, from every results file."""
    rows = []
    for source, data in enumerate(results):
        for i, row in enumerate(data.get("crossovers", [])):
            if not isinstance(row, dict) or "batch" not in row or "prefix" not in row:
                raise MlactlError(f"{data['device']['name']} crossovers[{i}] lacks batch or prefix")
            if int(row["batch"]) == batch:
                rows.append(
                    {"source": source, "batch": batch, "prefix": int(row["prefix"]), "new": row.get("measured")}
                )
    return rows


def tokens(n) -> str:
    """4096 -> '4K', 32768 -> '32K', 1000 -> '1000' (K = 1024, as the CLI reads it)."""
    n = int(n)
    for factor, suffix in ((1 << 20, "M"), (1 << 10, "K")):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)


def shape_label(batch, new, prefix) -> str:
    return f"b={batch} n={tokens(new)} p={tokens(prefix)}"


def percent(fraction: float) -> str:
    """0.45 -> '45%', 0.032 -> '3.2%', 0.0012 -> '0.12%': two significant digits below 10%, so a
    CPU run against a GPU's roofline does not read '0%'."""
    value = 100 * fraction
    return f"{value:.0f}%" if value >= 10 else f"{value:.2g}%"


def title(
    chart: str, analysis: Analysis, results: list[dict], calibrated: Analysis | None = None, notes=(), how: str = ""
) -> str:
    """Model, machine, ceilings and cache dtype; the kind of time drawn (roofline, or the
    calibration named, with `how` it is drawn); then the measurements' devices, or that there are
    none; then any `notes`. Every name from a file is escaped for mathtext."""
    cfg, hw, cost = analysis.cfg, analysis.hw, analysis.cost
    tp = f", tp {cfg.tp}" if cfg.tp > 1 else ""
    ceilings = "measured" if hw.using_measured else "nominal"
    head = (
        f"{chart}: {safe.mathtext(cfg.name)}{tp} on {safe.mathtext(hw.display)} ({ceilings} ceilings), "
        f"kv cache {cost.kv_dtype}, {cost.dtype} compute"
    )
    cal = analysis.calibration if analysis.calibration is not None else getattr(calibrated, "calibration", None)
    if cal is not None:
        drawn = f" ({how})" if how else ""
        moved = getattr(cal, "transferred", None)
        how_made = "fitted to measurements" if not moved else f"transferred from {moved['from']['hardware']}"
        head += f"\ncalibrated times{drawn}: {safe.mathtext(cal.name)}, {safe.mathtext(how_made)}"
    lines = [head]
    if results:
        lines.append("measured: " + "; ".join(measured_label(d) for d in results))
        for d in results:  # measured where no profile is known: say whose roofline it is drawn against
            device = str(d["device"]["name"]).lower()
            if file_hardware(d) is None and not any(m.lower() in device for m in hw.match):
                lines.append(
                    f"{safe.mathtext(d['device']['name'])} has no hardware profile (mlactl tune ceilings writes one): "
                    f"its times are against {safe.mathtext(hw.display)}'s roofline"
                )
    elif cal is None:
        lines.append("analytic only: no results file")
    lines += [safe.mathtext(n, 400) for n in notes]
    return "\n".join(lines)


def new_figure(width: float, height: float, nrows: int = 1, ncols: int = 1, fig=None):
    """A Figure of `width` x `height` inches with an nrows x ncols grid of axes; with `fig`, that
    grid on the Figure given (its size and layout are the caller's)."""
    if fig is None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def ceilings(hw: HardwareProfile, dtype: str, results: list[dict]) -> list[dict]:
    """Rooflines to draw: the datasheet's for every compute dtype of the profile, and measured
    ones (the profile's own, and each results file's) for the dtypes they measured -- or for the
    compute dtype alone when they measured only the bandwidth."""
    nominal = hw
    if hw.using_measured:  # the profile's peaks were swapped: read the datasheet's back
        nominal = load_profile(hw.path) if hw.path else None
    rooflines = []
    if nominal is not None:
        rooflines.append(("nominal", nominal, sorted(nominal.peak_tflops)))
    if hw.measured:
        measured = hw if hw.using_measured else hw.with_measured()
        device = hw.measured.get("device", hw.name)
        rooflines.append((f"measured on {device}", measured, sorted(hw.measured.get("peak_tflops", {})) or [dtype]))
    for data in results:
        table = data.get("ceilings")
        if not table:
            continue
        where = f"{data['device']['name']} ceilings"
        peaks = table.get("peak_tflops", {})
        for key, value in [
            *(("peak_tflops." + k, v) for k, v in peaks.items()),
            ("bandwidth_tbs", table.get("bandwidth_tbs", 1.0)),
        ]:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise MlactlError(f"{where}: {key} must be a positive number, got {value!r}")
        measured = replace(hw, measured=table).with_measured()
        rooflines.append((f"measured on {data['device']['name']}", measured, sorted(peaks) or [dtype]))
    out = [
        {
            "label": label,
            "dtype": d,
            "peak_flops": profile.peak_flops(d),
            "bandwidth": profile.bandwidth,
            "ridge": profile.ridge(d),
        }
        for label, profile, dtypes in rooflines
        for d in dtypes
    ]
    # the profile's measurement and a results file's are often the same run: draw it once
    unique = {(c["label"], c["dtype"], c["peak_flops"], c["bandwidth"]): c for c in reversed(out)}
    return [c for c in out if unique[(c["label"], c["dtype"], c["peak_flops"], c["bandwidth"])] is c]


def power_ticks(lo, hi, most: int = 9) -> list[int]:
    """Powers of two from lo to hi, every 1, 2, 4... octaves so that at most `most` remain."""
    first, last = math.ceil(math.log2(lo)), math.floor(math.log2(hi))
    every = 1
    while (last - first) // every + 1 > most:
        every *= 2
    return [1 << e for e in range(first, last + 1, every)]
