"""What a calibrated replay's intervals cost, and how far the sample of steps moves them.

    python benchmarks/bench_replay_intervals.py --calibration NAME|FILE [--requests 12000] [--hours 1]
                                               [--engines sglang,vllm] [--json out.json]

The synthetic trace of bench_replay.py (seeded), DeepSeek-V3 at TP 8 on the calibration's
hardware. For each engine, its schedule once, then its steps priced three ways, each timed (wall
and CPU) after one pricing that fills the calibration's caches: without intervals; with them as
`mlactl replay --calibration` draws them (above INTERVAL_STEPS steps, on a weighted sample); and
drawing every step. Prints each total's point
value and both intervals, the largest gap between their ends (relative to the end, or to the
interval's width where that is larger), and saves JSON (default
benchmarks/results/replay-intervals-<host>.json). Nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from bench_replay import save, synthetic_trace  # noqa: E402


def timed(fn, *args):
    start, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", required=True)
    parser.add_argument("--requests", type=int, default=12_000)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--engines", default="sglang,vllm")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from mlactl.decide.calibration.store import resolve
    from mlactl.decide.engines import steps as rules
    from mlactl.decide.replay import intervals
    from mlactl.decide.replay.cache import TokenPool
    from mlactl.decide.replay.clock import Clock
    from mlactl.decide.replay.replay import ReplaySettings, _price, kv_pool, shipped_for
    from mlactl.decide.replay.scheduler import scheduler_for
    from mlactl.decide.replay.traces import read_trace
    from mlactl.decide.workload import engine_cost
    from mlactl.model import hardware
    from mlactl.model.config import from_name
    from mlactl.model.cost import CostModel, WeightCost
    from mlactl.model.weights import from_name as weights_of

    cal = resolve(args.calibration)
    hw = hardware.resolve(cal.hardware)
    cfg = from_name("deepseek-v3").with_tp(8)
    cost, wc, s = CostModel(cfg), WeightCost(cfg, weights_of("deepseek-v3")), ReplaySettings()
    results: dict = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "calibration": cal.name,
        "hardware": hw.name,
        "interval_steps": intervals.INTERVAL_STEPS,
        "engines": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "trace.jsonl"
        results["trace"] = synthetic_trace(trace_path, args.requests, args.hours)
        trace = read_trace(trace_path)
    print(f"trace: {results['trace']}; calibration {cal.name} on {hw.name}")
    kv = kv_pool(wc, cost, hw, s)
    for e in rules.parse(args.engines, None, cfg, hw, "bf16"):
        clock = Clock(engine_cost(cost, e.params), hw, wc, rules.paths(e))
        settings = shipped_for(e, s, hw, kv, cfg)
        pool = TokenPool(settings.pool_tokens)
        sched = scheduler_for(e)(trace, e, pool, clock, settings).run()
        possible = intervals.Drawer.possible
        intervals.Drawer.possible = staticmethod(lambda p: False)  # type: ignore[method-assign]
        # warm: the calibration's caches fill on the first pricing
        _price(trace, cost, hw, cal, e, sched, s, False, settings.page)
        _, plain_s, plain_cpu = timed(_price, trace, cost, hw, cal, e, sched, s, False, settings.page)
        intervals.Drawer.possible = possible  # type: ignore[method-assign]
        sampled, sampled_s, sampled_cpu = timed(_price, trace, cost, hw, cal, e, sched, s, False, settings.page)
        keep = intervals.INTERVAL_STEPS
        intervals.INTERVAL_STEPS = len(sched) + 1
        every, every_s, every_cpu = timed(_price, trace, cost, hw, cal, e, sched, s, False, settings.page)
        intervals.INTERVAL_STEPS = keep
        rows = {}
        for name in intervals.TOTALS:
            a, b = sampled.intervals[name], every.intervals[name]
            if a is None or b is None:
                rows[name] = {"sampled": a, "every_step": b}
                continue
            width = b[1] - b[0]
            gap = max(abs(x - y) / max(abs(y), width, 1e-30) for x, y in zip(a, b))
            rows[name] = {"sampled": list(a), "every_step": list(b), "largest_gap": gap}
        results["engines"][e.label] = {
            "steps": len(sched),
            "price_s": plain_s,
            "price_cpu_s": plain_cpu,
            "with_intervals_s": sampled_s,
            "with_intervals_cpu_s": sampled_cpu,
            "every_step_s": every_s,
            "every_step_cpu_s": every_cpu,
            "time_s": sampled.time_s,
            "lost_s": sampled.lost_s,
            "totals": rows,
        }
        print(
            f"{e.label:<14} {len(sched):>8,} steps   price {plain_s:6.1f} s (cpu {plain_cpu:6.1f})   "
            f"with intervals {sampled_s:6.1f} s (cpu {sampled_cpu:6.1f})   "
            f"drawing every step {every_s:6.1f} s (cpu {every_cpu:6.1f})"
        )
        for name, r in rows.items():
            if "largest_gap" in r:
                lo, hi = r["sampled"]
                elo, ehi = r["every_step"]
                print(
                    f"    {name:<13} sampled {lo:10.2f}–{hi:10.2f} s   every step {elo:10.2f}–{ehi:10.2f} s   "
                    f"gap {100 * r['largest_gap']:.1f}%"
                )
    save(results, args.json or HERE / "results" / f"replay-intervals-{platform.node() or 'host'}.json")


if __name__ == "__main__":
    main()
