"""The tune chart: every launch config a kernel sweep timed for one shape bucket, against the
heuristic's choice and the twin.

`tune_data` reads what the chart shows (each config's time or failure, the best, the reference
lines, the axis range) without matplotlib; `draw_tune` draws it; `tune` does both."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlactl.output.plot.common import (
    ChartData,
    measured_label,
    median_of,
    new_figure,
)
from mlactl.output.render import seconds
from mlactl.util import safe
from mlactl.util.errors import MlactlError


def config_label(config: dict) -> str:
    """`BLOCK_N=64, num_warps=8` (names from the file escaped for mathtext)."""
    return safe.mathtext(", ".join(f"{k}={v}" for k, v in config.items()), 400) or "(default)"


@dataclass(frozen=True)
class TuneChart(ChartData):
    DATA = ("title", "kernel", "bucket", "configs", "best", "best_median_s", "default_median_s", "twin_median_s")
    DATA += ("default_faster", "warning")

    title: str
    kernel: str | None
    bucket: str | None
    configs: list  # [{label, config, status, reason, median_s}], top to bottom
    best_index: int | None  # in configs, of the best config (None: none ran)
    default_median_s: float | None
    twin_median_s: float | None
    default_faster: bool  # the launcher's default beat every config tried
    warning: str | None  # interpreter times
    left: float  # the bars' left end (seconds): half the fastest time
    xlim: tuple

    @property
    def best(self) -> str | None:
        """The best config's label."""
        return None if self.best_index is None else self.configs[self.best_index]["label"]

    @property
    def best_median_s(self) -> float | None:
        return None if self.best_index is None else self.configs[self.best_index]["median_s"]

    @property
    def best_word(self) -> str:
        return "  best tried: default faster" if self.default_faster else "  best"


def tune(data: dict, kernel: str | None = None, bucket: str | None = None):
    """(fig, data): `tune_data`, drawn, and what it holds as a dict.

    data: {"title", "kernel", "bucket", "configs": [{"label", "config", "status", "reason",
    "median_s"}], "best": label, "best_median_s", "default_median_s", "twin_median_s",
    "default_faster", "warning"}
    """
    chart = tune_data(data, kernel, bucket)
    return draw_tune(chart), chart.as_dict()


def tune_data(data: dict, kernel: str | None = None, bucket: str | None = None) -> TuneChart:
    """One tuned shape of a results file: the median time of every launch config tried, failed
    and wrong ones shown as such, the best one marked; the default config and the torch twin as
    reference lines when measured. The sweep is the first of `kernel` (any kernel if None) and
    `bucket` (the first if None)."""

    sweeps = data.get("kernels", [])
    device = data["device"]["name"]
    if not sweeps:
        raise MlactlError(f"the results from {device} hold no kernel sweeps (run `mlactl tune kernels`)")
    if kernel is not None:
        have = sorted({s.get("kernel") for s in sweeps})
        sweeps = [s for s in sweeps if s.get("kernel") == kernel]
        if not sweeps:
            raise MlactlError(f"the results hold no sweep of kernel {kernel!r} (they have: {', '.join(have)})")
    if bucket is not None:
        have = [s.get("bucket") for s in sweeps]
        sweeps = [s for s in sweeps if s.get("bucket") == bucket]
        if not sweeps:
            raise MlactlError(f"bucket {bucket!r} is not in the results (have: {'; '.join(map(str, have))})")
    sweep = sweeps[0]
    configs = []
    for i, tried in enumerate(sweep.get("configs", [])):
        status = tried.get("status", "ok")
        median = median_of(tried, f"{sweep.get('kernel')} configs[{i}]") if status == "ok" else None
        configs.append(
            {
                "label": config_label(tried.get("config", {})),
                "config": tried.get("config", {}),
                "status": status,
                "reason": safe.mathtext(tried.get("reason", ""), 400),
                "median_s": median,
            }
        )
    ok = [i for i, c in enumerate(configs) if c["status"] == "ok"]
    if not configs:
        backend = data.get("backend")
        why = (
            "the results were measured with --backend torch, whose plain-torch twins have no launch configs "
            "to tune: run `mlactl tune kernels` with --backend triton on a GPU (or interpret) for a sweep"
            if backend == "torch"
            else "the sweep was stopped before its first config (its time budget?): run `mlactl tune kernels` "
            "again with a larger --budget"
        )
        raise MlactlError(f"the sweep of {sweep.get('kernel')} at {sweep.get('bucket')} tried no configs: {why}")
    best = None
    if ok:
        chosen = [i for i in ok if configs[i]["config"] == sweep.get("best")]
        best = (chosen or [min(ok, key=lambda i: configs[i]["median_s"])])[0]
    default, twin = sweep.get("default_median_s"), sweep.get("twin_median_s")
    # The launcher's default config is timed apart from the space searched; when it beats every
    # config tried, the sweep's "best" is only the best of those, and the chart must say so (the
    # docs' interpreter sweep: 6 configs of BLOCK_N 16 at ~60 ms before the budget cut it, the
    # default with wider tiles at 30.7 ms, with p10-p90 spreads of 5%: not noise).
    default_faster = bool(best is not None and default and default < configs[best]["median_s"])
    times = [configs[i]["median_s"] for i in ok] + [t for t in (default, twin) if t]
    left = min(times) / 2 if times else 1e-6
    warning = None
    if data.get("backend") == "interpret":  # Triton's CPU interpreter: its times rank nothing a GPU runs
        warning = "interpreter times (Triton on the CPU): they say nothing of a GPU's speed or which config wins there"
    return TuneChart(
        title=(
            f"Tune: {safe.mathtext(sweep.get('kernel'))} at {safe.mathtext(sweep.get('bucket'))}\n"
            f"measured: {measured_label(data)}, model {safe.mathtext(data['model'].get('name'))}, "
            f"kv cache {safe.mathtext(data.get('kv_dtype', '?'))}"
        ),
        kernel=sweep.get("kernel"),
        bucket=sweep.get("bucket"),
        configs=configs,
        best_index=best,
        default_median_s=default,
        twin_median_s=twin,
        default_faster=default_faster,
        warning=warning,
        left=left,
        # room right of the longest bar for its label ("59.7ms  best tried: default faster")
        xlim=(left / 1.2, max(times or [left]) * (40 if default_faster else 4)),
    )


def draw_tune(chart: TuneChart, fig=None):
    """Draw `chart` (tune_data) on `fig`, a new Figure a row per config by default."""
    configs, left = chart.configs, chart.left
    fig, axes = new_figure(9, 1.6 + 0.28 * len(configs), fig=fig)
    ax = axes[0, 0]
    ys = np.arange(len(configs))[::-1]
    for k, (yy, c) in enumerate(zip(ys, configs)):
        if c["status"] != "ok":
            ax.plot(left, yy, "x", color="tab:red", ms=8, mew=2)
            ax.annotate(
                f"{c['status']}: {c['reason']}".rstrip(": "),
                (left, yy),
                xytext=(8, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
                color="tab:red",
            )
            continue
        is_best = k == chart.best_index
        ax.hlines(yy, left, c["median_s"], color="tab:green" if is_best else "tab:blue", lw=5 if is_best else 3)
        ax.plot(
            c["median_s"],
            yy,
            "*" if is_best else "o",
            color="tab:green" if is_best else "tab:blue",
            ms=13 if is_best else 5,
            mec="black" if is_best else None,
        )
        ax.annotate(
            seconds(c["median_s"]) + (chart.best_word if is_best else ""),
            (c["median_s"], yy),
            xytext=(8, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    for value, label, style in (
        (chart.default_median_s, "default config", "--"),
        (chart.twin_median_s, "torch twin", ":"),
    ):
        if value:
            ax.axvline(value, color="gray", ls=style, lw=1.2)
            ax.annotate(
                f"{label} {seconds(value)}",
                (value, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -10),
                textcoords="offset points",
                fontsize=7,
                color="gray",
            )
    ax.set_yticks(ys, labels=[c["label"] for c in configs], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(*chart.xlim)
    ax.set_ylim(-0.7, len(configs) - 0.3)
    ax.set_xlabel("median time (s)")
    ax.grid(True, axis="x", which="major", alpha=0.3)
    if chart.warning is not None:
        ax.text(0.5, 0.5, "interpreter times:\nnot a GPU's", transform=ax.transAxes, ha="center", va="center",
                fontsize=20, color="tab:red", alpha=0.25, rotation=20)  # fmt: skip
        ax.set_title(chart.warning, fontsize=8, color="tab:red")
    fig.suptitle(chart.title, fontsize=9)
    return fig
