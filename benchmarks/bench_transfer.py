"""How far a calibration carries to another GPU: leave-one-GPU-out transfer error and coverage.

For each framework of aiconfigurator-core's tables (sglang, trtllm, vllm), one calibration is
fitted per GPU of FIT_GPUS (`mlactl calibrate --from aiconfigurator`, cached in --cache), and
every ordered pair (source, target) of those GPUs is transferred (mlactl.decide.calibration.
transfer) and predicted on the target's tables, op class by op class, beside the roofline at
the target's ceilings. The log errors log(measured / predicted) of those pairs are the transfer
error model (by op class, and whether the pair crosses an architecture).

Leave-one-GPU-out: for each GPU G of FIT_GPUS, the error model is fitted on the pairs among the
other three only, the calibrations of the other GPUs are transferred to G with it, and scored on
G's tables as `mlactl calibrate score` scores (median and p90 of |predicted / measured - 1|, the
share inside the 80% interval). Goal: 80% intervals cover 65-90% of a held-out GPU's points.

HELD_OUT GPUs (b300_sxm, gb300, l40s, rtx_pro_6000_server) are never fitted and never choose
anything: with --held-out the shipped model (fitted on every pair of FIT_GPUS) is applied to
HELD_PAIRS and scored there, once, for the record.

    python benchmarks/bench_transfer.py                       # fit (cached), pairs, LOGO
    python benchmarks/bench_transfer.py --write-model         # and write profiles/transfer/errors.json
    python benchmarks/bench_transfer.py --held-out            # and score HELD_PAIRS
    python benchmarks/bench_transfer.py --no-near             # the same with `near` left behind

Prints medians and spreads and writes benchmarks/results/transfer.json. Never a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from mlactl.decide.calibration import run, store
from mlactl.decide.calibration import uncertainty as u
from mlactl.decide.calibration.score import fit_of, predicted
from mlactl.decide.calibration.transfer import error_key, error_keys, kernel_of, transfer
from mlactl.model import hardware
from mlactl.model.roofline import roofline_time
from mlactl.util.io import atomic_write

FIT_GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "gb200": "gb200"}
HELD_OUT = ("b300_sxm", "gb300", "l40s", "rtx_pro_6000_server")
HELD_PAIRS = (("h200_sxm", "b300_sxm", "sglang"), ("h200_sxm", "gb300", "sglang"), ("b200_sxm", "b300_sxm", "sglang"))
FRAMEWORKS = ("sglang", "trtllm", "vllm")
OUT = Path(__file__).parent / "results" / "transfer.json"
MODEL_FILE = Path(__file__).parent.parent / "profiles" / "transfer" / "errors.json"
PER_GROUP = 400  # points of one (pair, group) in the error model at most: a big table does not drown the rest
CORRECT = [True]  # --no-correct
POOLED = [False]  # --pooled: every key's quantiles of its residuals as pooled, whatever its targets
MIN_ROWS = 20  # op classes with fewer rows on a target are not summarised


def profile(system: str):
    return hardware.from_name(run.SYSTEM_PROFILES[system])


def calibration(system: str, framework: str, cache: Path):
    """The calibration of one GPU and framework: fitted once, then read from the cache."""
    path = cache / f"{system}-{framework}.json"
    if not path.exists():
        t0 = time.time()
        name, hw, desc, groups = run.from_aiconfigurator(system, framework, None, None, profile(system))
        data, _ = run.build(name, hw, desc, groups)
        path.write_text(json.dumps(data))
        print(f"# fitted {system}/{framework}: {len(groups)} groups in {time.time() - t0:.0f} s", flush=True)
    return store.validate(json.loads(path.read_text()), str(path))


_GROUPS: dict = {}


def groups(system: str, framework: str) -> dict:
    key = (system, framework)
    if key not in _GROUPS:
        try:
            _GROUPS[key] = run.aiconfigurator_groups(system, framework, None, None)[0]
        except Exception as exc:  # a GPU without this framework's tables
            print(f"# {system}/{framework}: {exc}")
            _GROUPS[key] = {}
    return _GROUPS[key]


def summary(err: np.ndarray) -> dict:
    return {"median": float(np.median(err)), "p90": float(np.percentile(err, 90))}


def scored(cal, target: str, framework: str, intervals: bool = True) -> list[dict]:
    """Each of the target's groups: n, the transferred prediction's error, its interval's coverage,
    the roofline's error at the target's ceilings, and the log residuals."""
    hw = profile(target)
    out = []
    for key, pts in sorted(groups(target, framework).items()):
        op, src, dtype = key
        p = predicted(cal, key, pts, intervals)
        phase = src.rsplit(":", 1)[-1] if src.endswith(("decode", "prefill")) else "decode"
        fit = fit_of(cal, op, dtype, phase, kernel_of({"source": src}))
        kernel = ((fit or {}).get("transfer") or {}).get("kernel") or {}
        y = np.asarray(pts.time_s, dtype=np.float64)
        roof = roofline_time(pts.flops, pts.bytes, hw.peak_flops("bf16"), hw.bandwidth)
        row = {"op": op, "source": src, "dtype": dtype, "n": len(pts), "roofline": summary(np.abs(roof / y - 1))}
        if p is None:
            out.append(dict(row, covered=False))
            continue
        has = bool(np.isfinite(p.lo).all())
        out.append(
            dict(
                row,
                covered=True,
                other=kernel.get("target") != kernel.get("measured"),
                # the table's kernel is neither the one measured nor the one the transfer says the
                # target runs (vLLM's FlashInfer fp8_block GEMM on Hopper, scored with DeepGEMM's fit)
                unmatched=kernel_of({"source": src}) not in (kernel.get("target"), kernel.get("measured")),
                kernel=kernel.get("target"),
                fit=" + ".join(p.used),
                error=summary(np.abs(p.time / y - 1)),
                bias=float(np.median(p.time / y - 1)),
                coverage=float(np.mean((p.lo <= y) & (y <= p.hi))) if has else None,
                inside=int(np.sum((p.lo <= y) & (y <= p.hi))) if has else None,
                log_residual=np.log(y / p.time),
            )
        )
    return out


def error_model(records: list[dict]) -> dict:
    """{key: {"n", "pairs", "quantiles", "shift"}} for every key of transfer.error_keys (op class
    or every class "*", at the crossing or within one architecture / across two) of the residual
    records [{"op", "crossing", "pair", "gpus", "log_residual"}].

    `shift` is the median of the key's residuals: what a transfer takes out. A GPU the model has
    not seen has a median of its own, so where the key's pairs reach two target GPUs or more, its
    quantiles are those of each target's residuals about the median of the other targets' (the
    correction a transfer to that target would have made without it), plus `shift`: the interval
    holds how far one target's median lies from the rest. With one target, the residuals as
    pooled (POOLED[0]: as pooled always, --pooled)."""
    rng = np.random.default_rng(30)
    pooled: dict = {}
    for r in records:
        res = r["log_residual"]
        if len(res) > PER_GROUP:
            res = rng.choice(res, PER_GROUP, replace=False)
        for key in error_keys(r["op"], r["crossing"], r["dtype"], r["other"], r["kernel"]):
            entry = pooled.setdefault(key, {"res": {}, "pairs": set()})
            entry["res"].setdefault(r["gpus"][1], []).append(res)
            entry["pairs"].add(r["pair"])
    out = {}
    for key, entry in sorted(pooled.items()):
        by_target = {t: np.concatenate(parts) for t, parts in entry["res"].items()}
        res = np.concatenate(list(by_target.values()))
        shift = float(np.median(res))
        if len(by_target) > 1 and not POOLED[0]:
            rest = {t: np.concatenate([v for o, v in by_target.items() if o != t]) for t in by_target}
            spread = np.concatenate([v - np.median(rest[t]) for t, v in by_target.items()]) + shift
        else:
            spread = res
        q = u.quantiles(spread)
        if q is not None:
            out[key] = {"n": int(len(res)), "pairs": sorted(entry["pairs"]), "quantiles": q, "shift": round(shift, 6)}
    return out


def residual_records(cals: dict, frameworks, near: bool) -> tuple[list[dict], list[dict]]:
    """Every ordered pair of FIT_GPUS, each framework: (residual records, per-group rows)."""
    records, rows = [], []
    for fw in frameworks:
        for s in FIT_GPUS:
            for t in FIT_GPUS:
                if s == t or (s, fw) not in cals:
                    continue
                src_hw, tgt_hw = profile(s), profile(t)
                moved = store.validate(transfer(cals[(s, fw)], src_hw, tgt_hw, errors={}, near=near), "pair")
                for g in scored(moved, t, fw, intervals=False):
                    crossing = error_key(g["op"], src_hw, tgt_hw)[1]
                    rows.append(dict({k: v for k, v in g.items() if k != "log_residual"}, source_gpu=s,
                                     target_gpu=t, framework=fw, crossing=crossing))  # fmt: skip
                    if g.get("covered") and not g.get("unmatched"):
                        records.append({"op": g["op"], "crossing": crossing, "pair": f"{s}>{t}:{fw}",
                                        "dtype": g["dtype"], "other": g["other"], "kernel": g["kernel"],
                                        "log_residual": g["log_residual"], "gpus": (s, t)})  # fmt: skip
    return records, rows


def by_class(rows: list[dict]) -> dict:
    """Per op class: groups, rows, median and spread (min-max) of the group medians and p90s,
    pooled coverage, and the roofline's median of medians."""
    out: dict = {}
    for r in rows:
        if not r.get("covered") or r.get("unmatched"):  # listed in the rows, not summarised
            continue
        e = out.setdefault(r["op"], {"groups": 0, "n": 0, "med": [], "p90": [], "in": 0, "checked": 0, "roof": []})
        e["groups"] += 1
        e["n"] += r["n"]
        e["med"].append(r["error"]["median"])
        e["p90"].append(r["error"]["p90"])
        e["roof"].append(r["roofline"]["median"])
        if r.get("coverage") is not None:
            e["in"] += r["inside"]
            e["checked"] += r["n"]
    return {
        op: {
            "groups": e["groups"],
            "n": e["n"],
            "median": float(np.median(e["med"])),
            "median_range": [float(min(e["med"])), float(max(e["med"]))],
            "p90": float(np.median(e["p90"])),
            "p90_range": [float(min(e["p90"])), float(max(e["p90"]))],
            "coverage": e["in"] / e["checked"] if e["checked"] else None,
            "roofline_median": float(np.median(e["roof"])),
        }
        for op, e in sorted(out.items())
        if e["n"] >= MIN_ROWS
    }


def target_shifts(records: list[dict]) -> dict:
    """{op: {crossing: {target GPU: median log(measured / predicted)}}} of the raw pairs: how far
    one target GPU's median lies from another's for the same op class and crossing, which is what
    a GPU the model has not seen may add (error_model keeps it in a key's quantiles)."""
    pooled: dict = {}
    for r in records:
        pooled.setdefault(r["op"], {}).setdefault(r["crossing"], {}).setdefault(r["gpus"][1], []).append(
            r["log_residual"]
        )

    def medians(by_target: dict) -> dict:
        return {t: round(float(np.median(np.concatenate(v))), 4) for t, v in sorted(by_target.items())}

    return {op: {c: medians(by) for c, by in x.items()} for op, x in sorted(pooled.items())}


def print_shifts(shifts: dict) -> None:
    print("\nmedian log(measured / predicted) per target GPU, raw pairs (a target's median against another's)")
    for op, by_crossing in shifts.items():
        for crossing, by_target in sorted(by_crossing.items()):
            cells = "  ".join(f"{t} {100 * (np.exp(v) - 1):+6.1f}%" for t, v in by_target.items())
            print(f"  {op:18} {crossing:12} {cells}")


def print_classes(title: str, classes: dict) -> None:
    print(f"\n{title}")
    head = f"{'op class':18} {'groups':>6} {'rows':>6} {'median (range)':>22} {'p90 (range)':>24}"
    print(f"{head} {'in 80%':>7} {'roof':>6}")
    for op, c in classes.items():
        med = f"{100 * c['median']:.1f} ({100 * c['median_range'][0]:.0f}-{100 * c['median_range'][1]:.0f})"
        p90 = f"{100 * c['p90']:.1f} ({100 * c['p90_range'][0]:.0f}-{100 * c['p90_range'][1]:.0f})"
        cov = "—" if c["coverage"] is None else f"{100 * c['coverage']:.1f}"
        print(f"{op:18} {c['groups']:6} {c['n']:6} {med:>22} {p90:>24} {cov:>7} {100 * c['roofline_median']:6.1f}")


def carry(cal, source: str, target: str, model: dict, near: bool):
    data = transfer(cal, profile(source), profile(target), errors=model, near=near, correct=CORRECT[0])
    return store.validate(data, f"{source}>{target}")


def strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "log_residual"} for r in rows]


def logo(cals: dict, records: list[dict], frameworks, near: bool) -> dict:
    """Leave-one-GPU-out: per held-out GPU of FIT_GPUS, the model of the other GPUs' pairs, the
    other GPUs' calibrations transferred to it and scored there."""
    out = {}
    for g in FIT_GPUS:
        model = error_model([r for r in records if g not in r["gpus"]])
        rows = []
        for fw in frameworks:
            for s in FIT_GPUS:
                if s == g or (s, fw) not in cals:
                    continue
                moved = store.validate(
                    transfer(cals[(s, fw)], profile(s), profile(g), errors=model, near=near, correct=CORRECT[0]), "logo"
                )
                rows += [dict(r, source_gpu=s, framework=fw) for r in strip(scored(moved, g, fw))]
        out[g] = {"rows": rows, "classes": by_class(rows)}
        print_classes(
            f"held out {g} (error model from the other GPUs' pairs): transferred from each other GPU", out[g]["classes"]
        )
    return out


def write_model(model: dict) -> None:
    meta = {"gpus": list(FIT_GPUS), "levels": list(u.LEVELS), "written_by": "benchmarks/bench_transfer.py"}
    meta["per_group"] = PER_GROUP
    doc = {"about": json.loads(MODEL_FILE.read_text())["about"], "model": meta, "errors": model}
    atomic_write(MODEL_FILE, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {MODEL_FILE}")


def held_out(cals: dict, model: dict, near: bool) -> dict:
    out = {}
    for s, t, fw in HELD_PAIRS:
        cal = cals.get((s, fw))
        if cal is None:
            continue
        moved = store.validate(
            transfer(cal, profile(s), profile(t), errors=model, near=near, correct=CORRECT[0]), "held"
        )
        rows = strip(scored(moved, t, fw))
        out[f"{s}>{t}:{fw}"] = {"rows": rows, "classes": by_class(rows)}
        print_classes(f"held-out pair {s} -> {t} ({fw}), the shipped model", out[f"{s}>{t}:{fw}"]["classes"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "mlactl-bench-transfer"))
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument("--output", default=str(OUT))
    ap.add_argument("--write-model", action="store_true", help="write the error model of every pair")
    ap.add_argument("--held-out", action="store_true", help="score HELD_PAIRS with the model of every pair")
    ap.add_argument("--no-near", action="store_true", help="leave `near` behind in every transfer")
    ap.add_argument("--no-correct", action="store_true", help="widen only: keep the transfer's median error")
    ap.add_argument("--pooled", action="store_true", help="quantiles of the pooled residuals, not about other targets")
    ap.add_argument("--gpus", default=None, help="only these of FIT_GPUS (a quick check of the script)")
    args = ap.parse_args()
    if args.gpus:
        for g in set(FIT_GPUS) - set(args.gpus.split(",")):
            del FIT_GPUS[g]
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    frameworks = args.frameworks.split(",")
    near = not args.no_near
    CORRECT[0] = not args.no_correct
    POOLED[0] = args.pooled
    start = time.time()
    cals = {}
    for fw in frameworks:
        for s in FIT_GPUS:
            if groups(s, fw):
                cals[(s, fw)] = calibration(s, fw, cache)
    records, rows = residual_records(cals, frameworks, near)
    print_classes("every ordered pair of " + ", ".join(FIT_GPUS) + " (no widening)", by_class(rows))
    for crossing in sorted({r["crossing"] for r in rows}):
        print_classes(f"pairs {crossing}", by_class([r for r in rows if r["crossing"] == crossing]))
    model = error_model(records)
    shifts = target_shifts(records)
    print_shifts(shifts)
    result = {
        "benchmark": "bench_transfer",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "fit_gpus": list(FIT_GPUS),
        "frameworks": frameworks,
        "near_travels": near,
        "correct": CORRECT[0],
        "pooled": POOLED[0],
        "pairs": {"rows": rows, "classes": by_class(rows)},
        "target_shifts": shifts,
        "logo": logo(cals, records, frameworks, near),
        "model": model,
    }
    if args.held_out:
        result["held_out"] = held_out(cals, model, near)
    if args.write_model:
        write_model(model)
    result["seconds"] = round(time.time() - start, 1)
    result["load_average_after"] = os.getloadavg()
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"saved {args.output} ({result['seconds']} s)")


if __name__ == "__main__":
    main()
