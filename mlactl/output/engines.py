"""What `mlactl engines` prints and writes: the tables, the JSON document and the CSV of a
workload's report (mlactl.decide.workload.report), and the rule sets' catalogue (`--list`)."""

from __future__ import annotations

import numpy as np
from rich.table import Table

from mlactl import __version__
from mlactl.decide.engines import known_names
from mlactl.decide.engines.catalog import ARCHS, CACHES, shorthands
from mlactl.output.csvout import write_csv as write
from mlactl.output.render import SHORT, calibration_line, engine_lines, seconds, seconds_span, settings_line
from mlactl.output.report import SCHEMA_VERSION, calibration_json, document_head, engine_json, number_or_none
from mlactl.util import safe

# The sweep's table of every distinct threshold goes into the JSON up to this many entries.
MAX_SWEEP_VALUES = 1000


def rules_json(data: list[dict]) -> dict:
    """`--list --format json`: every rule set (mlactl.decide.engines.catalog.catalog())."""
    return {
        "schema": "mlactl.engine_rules",
        "schema_version": SCHEMA_VERSION,
        "rule_sets": data,
        "shorthands": shorthands(),
        "mlactl_version": __version__,
    }


def _cell(d: dict) -> str:
    if not d["backend"]:
        return "none"
    star = "*" if "would not start" in d["why"] else ""  # in front: a narrow column cuts the name's end
    return f"{star}{d['backend']} ({d['threshold']})"


def list_tables(data) -> list:
    """`--list`: the default backend of each rule set per architecture and cache dtype, then each
    rule set's backends, options and source."""
    top = Table(title="Default backend (decode threshold) for DeepSeek-V3, per GPU architecture and cache dtype")
    top.add_column("rule set", no_wrap=True)
    for a in ARCHS:
        for k in CACHES:
            top.add_column(f"{a} {k}")
    for r in data:
        cells = {(d["arch"], d["kv_dtype"]): _cell(d) for d in r["defaults"]}
        name = r["name"] + (" (newest)" if r["newest"] else "")
        top.add_row(name, *(cells[(a, k)] for a in ARCHS for k in CACHES))
    sparse = Table(
        title="Default backend for DeepSeek-V3.2 (DSA), per GPU architecture and cache dtype "
        "(SGLang: dense MHA threshold; vLLM: decode threshold at 128 heads)",
        caption="* vLLM would not start there (no sparse backend runs on it); that backend's rule is shown",
    )
    sparse.add_column("rule set", no_wrap=True)
    for a in ARCHS:
        for k in CACHES:
            sparse.add_column(f"{a} {k}")
    for r in data:
        if r["dsa_defaults"] is None:
            sparse.add_row(r["name"], *(["no DSA rule"] * len(ARCHS) * len(CACHES)))
            continue
        cells = {(d["arch"], d["kv_dtype"]): _cell(d) for d in r["dsa_defaults"]}
        sparse.add_row(r["name"], *(cells[(a, k)] for a in ARCHS for k in CACHES))
    out: list = [top, sparse]
    for r in data:
        src = r["source"]
        t = Table(title=f"{r['name']} options (--engine-option {r['engine']}.KEY=VALUE)")
        for col in ("option", "type", "default", "what it does"):
            t.add_column(col, overflow="fold")
        for k, o in r["options"].items():
            default = o["default"]
            shown = "(resolved)" if default is None else str(default).lower() if o["type"] == "bool" else str(default)
            kind = o["type"] + (f": {', '.join(o['choices'])}" if o["choices"] else "")
            t.add_row(k, kind, shown, o["help"])
        out.append(t)
        out.append(f"{r['name']} backends: {', '.join(r['backends'])}")
        files = "; ".join(f"{p} ({w})" for p, w in src["files"]).replace("[", "\\[")
        out.append(f"{r['name']} source: {src['repo']} {src['commit']}: {files}")
        if r["dsa_source"]:
            out.append(f"{r['name']} DSA rule: " + r["dsa_source"].replace("[", "\\["))
        for note in ([src["note"]] if src["note"] else []) + r["notes"]:
            out.append(f"  note: {note}")
    marks = "; ".join(f"{k} = {v}" for k, v in shorthands().items())
    out.append(f"Shorthands: {marks}. Names --engines takes: {', '.join(known_names())}")
    return out


def _value(v) -> str:
    return "off" if v is None else str(v)


def sentence(result, e, s) -> str:
    """`sglang's chunked_prefix_cache_threshold 8192 on h200 for this workload: best X, saves Y%`
    (a threshold of None is `off`: vLLM's masked MHA never runs in that bucket)."""
    lo, hi = s.best_range
    if s.best is None:
        rng = f"off, or any threshold from {lo} up"
    elif hi is None:
        rng = f"any threshold from {lo} up"
    elif lo == hi:
        rng = "only that threshold"
    else:
        rng = f"any threshold from {lo} to {hi}"
    if s.best == s.current or s.saves <= 0:
        same = "no other threshold" if rng == "only that threshold" else rng
        verdict = f"already the best ({same} does as well)"
    else:
        verdict = f"best threshold {_value(s.best)} ({rng}), saves {s.saves:.1%}"
    where = safe.markup(result.hw.name)
    return f"{e.params.engine}'s {s.option} {_value(s.current)} on {where} for this workload: {verdict}"


def tables(result, notes=()) -> list:

    wl = result.workload
    cost = result.cost
    head = (
        settings_line(cost.cfg, result.hw, cost.kv_dtype, cost.dtype, "one layer")
        + f"; {len(wl)} shapes ({safe.markup(wl.source)}); "
        f"{'roofline' if result.calibration is None else 'calibrated'} times of the "
        "paths that fit, weighted by each shape's weight"
    )
    total = Table(title="What each engine's rule loses on this workload")
    total.add_column("engine", no_wrap=True)
    for col in ("time", "lost", "lost %"):
        total.add_column(col, justify="right", no_wrap=True)

    def cell(value: float, span) -> str:  # `61.6ms`, calibrated `61.6ms (50.2–70.1ms)`
        if value == float("inf"):
            return "does not fit"
        return seconds(value) + ("" if span is None else f" ({seconds_span(*span)})")

    for e in result.engines:
        pct = e.loss.lost_s / e.loss.time_s if e.loss.time_s and e.loss.lost_s != float("inf") else float("nan")
        total.add_row(
            e.params.label,
            cell(e.loss.time_s, e.loss.time_span),
            cell(e.loss.lost_s, e.loss.lost_span),
            "—" if pct != pct else f"{pct:.1%}",
        )
    total.caption = f"best path everywhere: {seconds(result.total_best_s)}"
    if any(e.loss.lost_span is not None for e in result.engines):
        total.caption += "; calibrated: (80% interval, the best path and the rule's compared draw by draw)"
    paths, counts = np.unique(result.best, return_counts=True)
    split = ", ".join(f"{SHORT[str(p)]} at {c}" for p, c in zip(paths, counts))
    out: list = [head, *notes, *result.notes, total, f"The best path: {split} of the {len(wl)} shapes"]
    for e in result.engines:
        worst = result.worst(e)
        if not worst:
            out.append(f"{e.params.label} loses nothing on this workload")
            continue
        t = Table(title=f"Where {e.params.label} loses most")
        for col in ("batch", "new", "prefix", "weight", "runs", "best", "lost/run", "share"):
            t.add_column(col, justify="left" if col in ("runs", "best") else "right", no_wrap=True)
        for i in worst:
            share = e.lost[i] * wl.weight[i] / e.loss.lost_s if e.loss.lost_s not in (0, float("inf")) else float("nan")
            t.add_row(
                str(wl.batch[i]),
                str(wl.new[i]),
                str(wl.prefix[i]),
                f"{wl.weight[i]:g}",
                SHORT[e.paths[i]],
                SHORT[result.best[i]],
                seconds(e.lost[i]) if e.lost[i] != float("inf") else "no fit",
                "—" if share != share else f"{share:.0%}",
            )
        out.append(t)
    for e in result.engines:
        out += [sentence(result, e, s) for s in e.sweeps]
    out += engine_lines([e.params for e in result.engines])
    if result.engines:
        out.append("Sources: " + "; ".join(sorted({e.params.citation for e in result.engines})))
    if result.calibration is not None:
        out.append(calibration_line(result.calibration))
    return out


def to_json(result) -> dict:

    wl = result.workload
    engines = []
    for e in result.engines:
        item = dict(
            engine_json(e.params),
            time_s=number_or_none(e.loss.time_s),
            lost_s=number_or_none(e.loss.lost_s),
            **(
                {
                    "time_interval_s": None if e.loss.time_span is None else list(e.loss.time_span),
                    "lost_interval_s": None if e.loss.lost_span is None else list(e.loss.lost_span),
                }
                if result.calibration is not None
                else {}
            ),
            worst=[
                {
                    "batch": int(wl.batch[i]),
                    "new": int(wl.new[i]),
                    "prefix": int(wl.prefix[i]),
                    "weight": float(wl.weight[i]),
                    "path": str(e.paths[i]),
                    "best": str(result.best[i]),
                    "lost_s": number_or_none(float(e.lost[i])),
                }
                for i in result.worst(e)
            ],
        )
        item["sweeps"] = [sweep_json(s) for s in e.sweeps]
        item["sweep"] = item["sweeps"][0] if e.sweeps else None  # the first, as before several were swept
        engines.append(item)
    return {
        **document_head("mlactl.engines", result.cost, result.hw),
        "time_model": "roofline" if result.calibration is None else "calibrated",
        **calibration_json(result.calibration),
        "workload": {"source": wl.source, "shapes": len(wl), "total_weight": float(wl.weight.sum())},
        "best_time_s": result.total_best_s,
        "engines": engines,
        "notes": result.notes,
    }


def sweep_json(s) -> dict:
    """One swept threshold (a None threshold is off: masked MHA never runs in that bucket)."""
    out = {
        "option": s.option,
        "current": s.current,
        "current_time_s": number_or_none(s.current_time_s),
        "best": s.best,
        "best_range": list(s.best_range),
        "best_time_s": number_or_none(s.best_time_s),
        "saves": s.saves,
        "values_count": len(s.curve),
    }
    if len(s.curve) <= MAX_SWEEP_VALUES:  # a million distinct sums would be a 100 MB table
        out["values"] = [{"threshold": t, "time_s": number_or_none(v)} for t, v in s.curve]
    return out


def write_csv(fh, result) -> None:
    """One row per shape: its weight, the best path, and each engine's path and loss per run."""

    wl = result.workload
    header = ["batch", "new", "prefix", "weight", "best", "best_time_s"]
    columns = [wl.batch, wl.new, wl.prefix, wl.weight, result.best, result.best_time]
    for e in result.engines:
        header += [f"{e.params.engine}.path", f"{e.params.engine}.time_lost_s"]
        columns += [e.paths, e.lost]
    write(fh, header, columns)
