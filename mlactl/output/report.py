"""An Analysis as the documented JSON schema (version 2) and as its CSV flattening.

JSON numbers are raw SI units: FLOPs, bytes, seconds, FLOP/byte. Integral figures are written as
integers. See README.md, "JSON schema", for every field.
"""

from __future__ import annotations

import json
import math

import numpy as np

from mlactl import __version__
from mlactl.decide.analysis import Analysis, Crossover, Window
from mlactl.decide.engines import arch_of
from mlactl.model.cost import OPS
from mlactl.output.csvout import Labels, write_csv
from mlactl.util.errors import MlactlError

SCHEMA = "mlactl.analysis"
# 2: the `fixed` rule and `threshold` gave way to the engines' rules: a header `engines` list and,
# per row, `engines: {name: {path, time_lost_s}}` (was `fixed_threshold`); CSV `NAME.path`,
# `NAME.time_lost_s`; batch JSON `engines` (was `threshold`/`fixed_path`).
# 3: versioned engine rules: each `engines` entry has engine, version, backend, threshold, every
# option's value (`options`), the ones set (`options_set`) and `why`; batch rows `engine_split`.
SCHEMA_VERSION = 3


def number(x):
    """A float as JSON wants it: int when integral, None when not finite."""
    x = float(x)
    if not math.isfinite(x):
        return None
    if x.is_integer() and abs(x) < 2**63:
        return int(x)
    return x


def number_or_none(x: float):
    """A float for JSON; None where it is not finite (a chosen path that does not fit)."""
    return x if math.isfinite(x) else None


def bound_name(compute_bound) -> str:
    return "compute" if compute_bound else "memory"


def document_head(schema: str, cost, hw) -> dict:
    """What a document of a cost model on a GPU opens with: its schema and versions, the model,
    the hardware profile, the dtypes and the chunk (batch's and engines' documents)."""
    return {
        "schema": schema,
        "schema_version": SCHEMA_VERSION,
        "mlactl_version": __version__,
        "model": dict(cost.cfg.to_dict(), softmax_scale=cost.cfg.softmax_scale),
        "hardware": hw.to_dict(),
        "kv_dtype": cost.kv_dtype,
        "dtype": cost.dtype,
        "chunk": cost.chunk,
    }


def model_json(analysis: Analysis) -> dict:
    return dict(analysis.cfg.to_dict(), softmax_scale=analysis.cfg.softmax_scale)


def hardware_json(analysis: Analysis) -> dict:
    hw = analysis.hw
    out = hw.to_dict()
    out["ridge"] = {d: hw.ridge(d) for d in sorted(hw.peak_tflops)}
    return out


def window_json(w: Window | None, interval=None, kind: str = "roofline") -> dict | None:
    """{first, last, count}; calibrated, also first_interval and last_interval ([lo, hi], 80%;
    null where the draws too often find no window)."""
    if w is None:
        return None
    out = {"first": w.first, "last": w.last, "count": w.count}
    if kind == "calibrated":
        out["first_interval"] = None if interval is None else list(interval[0])
        out["last_interval"] = None if interval is None else list(interval[1])
    return out


def crossover_json(crossover: Crossover) -> dict:
    """Per (batch, prefix): the crossovers; calibrated, also their 80% intervals ([lo, hi], hi null
    past max_new, both null where nine draws of ten find none up to max_new), each deciding op's
    basis and a note when one was not measured there. A DSA model: the windows where an expand
    path beats sparse_absorb."""
    if crossover.windows:
        return {
            "asymptotic_new": None,
            "max_new": crossover.max_new,
            "time": crossover.time_kind,
            "by_prefix": [
                {
                    "batch": r.batch,
                    "prefix": r.prefix,
                    "masked_expand": {
                        "by_flops": window_json(r.masked_by_flops),
                        "by_time": window_json(r.masked_by_time, r.masked_interval, crossover.time_kind),
                    },
                    "dense_expand": {"by_time": window_json(r.dense_by_time, r.dense_interval, crossover.time_kind)},
                }
                for r in crossover.windows
            ],
            "note": crossover.note,
        }

    def row(r) -> dict:
        out = {
            "batch": r.batch,
            "prefix": r.prefix,
            "by_flops": r.by_flops,
            "by_time": r.by_time,
            "by_time_chunked": r.by_time_chunked,
        }
        if crossover.time_kind == "calibrated":
            out["by_time_interval"] = None if r.by_time_interval is None else list(r.by_time_interval)
            out["by_time_chunked_interval"] = (
                None if r.by_time_chunked_interval is None else list(r.by_time_chunked_interval)
            )
            out["basis"] = r.basis
            out["note"] = r.note
        return out

    return {
        "asymptotic_new": crossover.asymptotic_new,
        "max_new": crossover.max_new,
        "time": crossover.time_kind,
        "by_prefix": [row(r) for r in crossover.rows],
        "note": crossover.note,
    }


def engine_json(e) -> dict:
    """An engine rule as resolved (mlactl.decide.engines.EngineParams): its name, rule set
    (engine, version), source, the backend it resolved to, every option's value, and why."""
    return e.to_json()


def header_json(analysis: Analysis) -> dict:
    cost = analysis.cost
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "mlactl_version": __version__,
        "model": model_json(analysis),
        "hardware": hardware_json(analysis),
        "kv_dtype": cost.kv_dtype,
        "dtype": cost.dtype,
        "chunk": cost.chunk,
        "layers": analysis.layers,
        "engines": [engine_json(e) for e in analysis.engines],
        "policy": analysis.policy,
        "notes": analysis.notes,
    }


def to_json(analysis: Analysis) -> dict:
    """The whole analysis as one JSON-ready dict."""
    cols = {
        k: v.tolist()
        for k, v in {
            "batch": analysis.batch,
            "new": analysis.new,
            "prefix": analysis.prefix,
            "kv": analysis.kv_cache_bytes,
            "mha": analysis.mha_cache_bytes,
            "best": analysis.best,
            "best_by_flops": analysis.best_by_flops,
        }.items()
    }
    engine_cols = {
        e: (analysis.engine_paths[e].tolist(), analysis.engine_time_lost[e].tolist()) for e in analysis.engine_paths
    }
    lost_spans = analysis.engine_lost_spans

    def lost_span(e: str, i: int) -> dict:
        """Calibrated: the 80% interval of the time the rule loses there (null: it does not fit,
        or an op without evidence)."""
        if analysis.calibration is None:
            return {}
        if lost_spans is None or not np.isfinite(lost_spans[e][0][i]):
            return {"time_lost_interval_s": None}
        return {"time_lost_interval_s": [float(lost_spans[e][0][i]), float(lost_spans[e][1][i])]}

    paths = {}
    for name, pt in analysis.paths.items():
        paths[name] = {
            "flops": pt.flops.tolist(),
            "bytes": pt.bytes.tolist(),
            "time_s": pt.time_s.tolist(),
            "intensity": pt.intensity.tolist(),
            "cb": pt.compute_bound.tolist(),
            "peak": analysis.peak_expanded[name].tolist(),
            "fits": analysis.fits_memory[name].tolist(),
            "runs": analysis.runs[name].tolist(),
            "ops": [
                (o.name, o.flops.tolist(), o.bytes.tolist(), o.time_s.tolist(), o.compute_bound.tolist())
                for o in pt.ops
            ],
        }
    rows = []
    if analysis.policy is not None:
        policy_paths, policy_lost = analysis.policy_path.tolist(), analysis.policy_time_lost.tolist()
    spans = analysis.spans
    for i in range(len(analysis)):
        row_paths = {}
        for name, p in paths.items():
            row_paths[name] = {
                "flops": number(p["flops"][i]),
                "bytes": number(p["bytes"][i]),
                "intensity": number(p["intensity"][i]),
                "time_s": p["time_s"][i],
                "bound": bound_name(p["cb"][i]),
                "peak_expanded_bytes": number(p["peak"][i]),
                "fits_memory": p["fits"][i],
                "runs": p["runs"][i],
                "ops": [
                    {
                        "name": op,
                        "flops": number(f[i]),
                        "bytes": number(b[i]),
                        "time_s": t[i],
                        "bound": bound_name(cb[i]),
                    }
                    for op, f, b, t, cb in p["ops"]
                ],
            }
            if spans is not None:
                add_spans(row_paths[name], spans, name, i)
        rows.append(
            {
                "batch": cols["batch"][i],
                "new": cols["new"][i],
                "prefix": cols["prefix"][i],
                "context": cols["prefix"][i] + cols["new"][i],
                "paths": row_paths,
                "best": cols["best"][i],
                "best_by_flops": cols["best_by_flops"][i],
                "kv_cache_bytes": number(cols["kv"][i]),
                "mha_cache_bytes": number(cols["mha"][i]),
                "engines": {
                    e: {"path": path[i], "time_lost_s": number_or_none(lost[i]), **lost_span(e, i)}
                    for e, (path, lost) in engine_cols.items()
                },
            }
        )
        if analysis.best_fits is not None and not analysis.best_fits[i]:
            # no path fits the GPU's memory here: `best` is the fastest that would run with more
            rows[-1]["best_fits_memory"] = False
        if analysis.policy is not None:
            rows[-1]["policy"] = {
                "name": analysis.policy,
                "path": policy_paths[i],
                "time_lost_s": number_or_none(policy_lost[i]),
            }
        if analysis.forward is not None:
            rows[-1]["forward"] = forward_json(analysis.forward, i)
    out = header_json(analysis)
    if analysis.forward is not None:
        out["forward"] = {
            "scope": "model",
            "weight_dtype": analysis.forward.weight_dtype,
            "collectives": analysis.forward.comm_basis,
            "attention": "the best path, every layer",
        }
    out["rows"] = rows
    out["crossover"] = crossover_json(analysis.crossover)
    return out


def forward_json(f, i: int) -> dict:
    """One row's whole forward (analyze --scope model): FLOPs, bytes and roofline seconds, its
    attention's seconds (the best path, every layer), and each op outside attention over every
    layer it runs in (its interconnect bytes for the collectives)."""
    return {
        "flops": number(f.flops[i]),
        "bytes": number(f.bytes[i]),
        "time_s": float(f.time_s[i]),
        "attention_s": float(f.attention_s[i]),
        "ops": [
            {
                "name": o.name,
                "count": o.count,
                "flops": number(o.flops[i]),
                "bytes": number(o.bytes[i]),
                "comm_bytes": number(o.comm_bytes[i]),
                "time_s": float(o.time_s[i]),
            }
            for o in f.ops
        ],
    }


def _interval(span, i: int):
    return None if span is None else [float(span[0][i]), float(span[1][i])]


def add_spans(row_path: dict, spans, path: str, i: int) -> None:
    """A calibrated row's path: its time's 80% interval and weakest basis; each op's interval and
    basis ({"basis": "measured" | "extrapolated" | "roofline", "octaves", "axis"})."""
    row_path["time_interval_s"] = _interval(spans.paths[path], i)
    row_path["basis"] = str(spans.path_basis[path][i])
    for op in row_path["ops"]:
        op["time_interval_s"] = _interval(spans.ops[path][op["name"]], i)
        op.update(spans.op_estimates[path][op["name"]].basis_json(i))


def list_json(models, profiles) -> dict:
    """`mlactl list --format json`: each preset's config and each profile's ceilings, with the
    architecture the engines' rules resolve for it (None: taken for an SM90 part)."""
    return {
        "models": {name: cfg.to_dict() for name, cfg in models},
        "hardware": {hw.name: dict(hw.to_dict(), arch=arch_of(hw)) for hw in profiles},
    }


def dumps(data: dict) -> str:
    """Strict JSON: a NaN or Infinity (which JSON has not) is an error, never written."""
    try:
        return json.dumps(data, indent=1, allow_nan=False) + "\n"
    except ValueError:
        raise MlactlError(
            "a figure came out infinite or NaN (are the profile's ceilings within range?); nothing was written"
        ) from None


def csv_columns(analysis: Analysis, ops: bool = False) -> tuple[list[str], list[np.ndarray]]:
    """The CSV flattening: one row per point; path columns `expand.time_s`, and with `ops`
    also op columns `expand.kv_expand.flops`."""

    paths = analysis.cost.paths

    def path_labels(names):
        return Labels(sum(i * (names == p) for i, p in enumerate(paths)), paths)

    cols: dict[str, np.ndarray] = {
        "batch": analysis.batch,
        "new": analysis.new,
        "prefix": analysis.prefix,
        "context": analysis.context,
        "best": path_labels(analysis.best),
        "best_by_flops": path_labels(analysis.best_by_flops),
        "kv_cache_bytes": analysis.kv_cache_bytes,
        "mha_cache_bytes": analysis.mha_cache_bytes,
    }
    for e in analysis.engine_paths:
        cols[f"{e}.path"] = path_labels(analysis.engine_paths[e])
        cols[f"{e}.time_lost_s"] = analysis.engine_time_lost[e]
        if analysis.engine_lost_spans is not None:  # calibrated: its 80% interval
            cols[f"{e}.time_lost_lo_s"], cols[f"{e}.time_lost_hi_s"] = analysis.engine_lost_spans[e]
    if analysis.policy is not None:
        cols["policy.path"] = path_labels(analysis.policy_path)
        cols["policy.time_lost_s"] = analysis.policy_time_lost
    if analysis.forward is not None:  # --scope model
        f = analysis.forward
        cols["forward.flops"], cols["forward.bytes"] = f.flops, f.bytes
        cols["forward.time_s"], cols["forward.attention_s"] = f.time_s, f.attention_s
        for o in f.ops:
            cols[f"forward.{o.name}.time_s"] = o.time_s
    bounds = ["memory", "compute"]
    for name in paths:
        pt = analysis.paths[name]
        cols[f"{name}.flops"] = pt.flops
        cols[f"{name}.bytes"] = pt.bytes
        cols[f"{name}.intensity"] = pt.intensity
        cols[f"{name}.time_s"] = pt.time_s
        cols[f"{name}.bound"] = Labels(pt.compute_bound, bounds)
        cols[f"{name}.peak_expanded_bytes"] = analysis.peak_expanded[name]
        cols[f"{name}.fits_memory"] = Labels(analysis.fits_memory[name], ["false", "true"])
        spans = analysis.spans
        if spans is not None:  # calibrated: the 80% interval and the weakest basis of the path's ops
            if spans.paths[name] is not None:
                cols[f"{name}.time_lo_s"], cols[f"{name}.time_hi_s"] = spans.paths[name]
            cols[f"{name}.basis"] = Labels.of(spans.path_basis[name])
        if analysis.cost.restricted:
            cols[f"{name}.runs"] = Labels(analysis.runs[name], ["false", "true"])
        if ops:
            for op in pt.ops:
                assert op.name in OPS[name]
                cols[f"{name}.{op.name}.flops"] = op.flops
                cols[f"{name}.{op.name}.bytes"] = op.bytes
                cols[f"{name}.{op.name}.time_s"] = op.time_s
                cols[f"{name}.{op.name}.bound"] = Labels(op.compute_bound, bounds)
                if spans is not None:
                    if spans.ops[name][op.name] is not None:
                        lo, hi = spans.ops[name][op.name]
                        cols[f"{name}.{op.name}.time_lo_s"], cols[f"{name}.{op.name}.time_hi_s"] = lo, hi
                    est = spans.op_estimates[name][op.name]
                    cols[f"{name}.{op.name}.basis"] = Labels.of(est.basis)
                    cols[f"{name}.{op.name}.octaves"] = est.octaves
    return list(cols), list(cols.values())


def write_analysis_csv(fh, analysis: Analysis, ops: bool = False) -> None:
    header, columns = csv_columns(analysis, ops)
    write_csv(fh, header, columns)


def _pair(span):
    return None if span is None else list(span)


def batch_json(ba) -> dict:
    """A mixed batch (analysis.BatchAnalysis) as JSON: requests, then totals per strategy."""

    return {
        **document_head("mlactl.batch", ba.cost, ba.hw),
        "layers": ba.layers,
        "engines": [
            dict(
                engine_json(e),
                time_s=ba.losses[e.engine].time_s,
                **({"time_interval_s": _pair(ba.losses[e.engine].time_span)} if ba.intervals else {}),
                lost_s=ba.losses[e.engine].lost_s,
            )
            for e in ba.engines
        ],
        "requests": [
            {
                "new": int(ba.new[i]),
                "prefix": int(ba.prefix[i]),
                "count": int(ba.count[i]),
                "own_time_s": {p: float(ba.own_time[p][i]) for p in ba.cost.choices},
                "path": str(ba.assignments["per_request"][i]),
                "engine_paths": {e.engine: str(ba.assignments[e.engine][i]) for e in ba.engines},
                **_split(ba, i),
            }
            for i in range(len(ba.new))
        ],
        "totals": {
            s: {
                "time_s": number_or_none(ba.totals[s]),
                **({"time_interval_s": _pair(ba.intervals.get(s))} if ba.intervals else {}),
            }
            for s in ba.strategies
        },
        "best_strategy": ba.best_strategy,
    }


def _split(ba, i: int) -> dict:
    """`engine_split: {engine: {path: requests}}` for a row whose alike requests an engine runs on
    two paths (vLLM's split falls inside the row); nothing otherwise."""
    out = {}
    for e in ba.engines:  # engine_counts' columns are the engine's paths (absorb, expand, expand_chunked; DSA's)
        row = ba.engine_counts[e.engine][i]
        if (row > 0).sum() > 1:
            out[e.engine] = {p: int(c) for p, c in zip(e.paths, row) if c}
    return {"engine_split": out} if out else {}


def write_batch_csv(fh, ba) -> None:

    names = [e.engine for e in ba.engines]
    header = ["new", "prefix", "count"] + [f"{p}.own_time_s" for p in ba.cost.choices] + ["path"]
    header += [f"{e}.path" for e in names]
    columns = (
        [ba.new, ba.prefix, ba.count]
        + [ba.own_time[p] for p in ba.cost.choices]
        + [ba.assignments["per_request"]]
        + [ba.assignments[e] for e in names]
    )
    write_csv(fh, header, columns)


def to_frame(analysis: Analysis, ops: bool = False):
    """The CSV flattening as a pandas DataFrame, for notebooks (pandas is imported here only)."""
    import pandas as pd

    header, columns = csv_columns(analysis, ops)
    data = {}
    for name, col in zip(header, columns):
        if isinstance(col, Labels):
            data[name] = pd.Categorical.from_codes(col.codes, categories=col.labels)
        else:
            data[name] = np.asarray(col)
    return pd.DataFrame(data)


def calibration_json(cal) -> dict:
    """What a JSON output records about its times: roofline, or the calibration used."""
    if cal is None:
        return {"time": "roofline"}
    return {"time": "calibrated", "calibration": cal.describe()}


def crossover_document(cost, hw, result, cal) -> dict:
    """`mlactl crossover --format json`: the crossover (or a DSA model's windows) per (batch, prefix)."""
    cfg = cost.cfg
    return {
        "schema": "mlactl.crossover",
        "schema_version": SCHEMA_VERSION,
        "model": dict(cfg.to_dict(), softmax_scale=cfg.softmax_scale),
        "hardware": hw.to_dict(),
        "kv_dtype": cost.kv_dtype,
        "dtype": cost.dtype,
        "chunk": cost.chunk,
        "crossover": crossover_json(result),
        **calibration_json(cal),
    }


def write_crossover_csv(fh, result, calibrated: bool) -> None:
    """`mlactl crossover --format csv`: one row per (batch, prefix); calibrated, each crossover's
    80% interval ends too. An empty field: none up to --max-new (the table's `> N`)."""
    if result.windows:
        write_csv(fh, *window_columns(result.windows))
        return
    rows = result.rows
    header = ["batch", "prefix", "by_flops", "by_time", "by_time_chunked"]
    cols = [[r.batch for r in rows], [r.prefix for r in rows]] + [
        [np.nan if v is None else v for v in (getattr(r, k) for r in rows)] for k in header[2:]
    ]
    if calibrated:
        for k in ("by_time", "by_time_chunked"):
            spans = [getattr(r, f"{k}_interval") or (None, None) for r in rows]
            header += [f"{k}_lo", f"{k}_hi"]
            cols += [[np.nan if s[i] is None else s[i] for s in spans] for i in (0, 1)]
    write_csv(fh, header, [np.asarray(c, dtype=np.float64) for c in cols], missing="")  # none up to --max-new


def window_columns(windows) -> tuple[list[str], list[np.ndarray]]:
    """A DSA model's windows as CSV columns: first, last and count of each window (empty: none)."""
    header, cols = ["batch", "prefix"], [[w.batch for w in windows], [w.prefix for w in windows]]
    for name, key in (
        ("masked_by_flops", "masked_by_flops"),
        ("masked_by_time", "masked_by_time"),
        ("dense_by_time", "dense_by_time"),
    ):
        for part in ("first", "last", "count"):
            header.append(f"{name}.{part}")
            cols.append([np.nan if getattr(w, key) is None else getattr(getattr(w, key), part) for w in windows])
    return header, [np.asarray(c, dtype=np.float64) for c in cols]
