"""How fast `mlactl replay` runs an hour of production-sized traffic through the engines.

    python benchmarks/bench_replay.py [--requests 12000] [--hours 1] [--repeats 3] [--json out.json]
                                      [--model deepseek-v3] [--hardware h200] [--tp 8]

Writes a synthetic Mooncake-format trace (seeded; its shape below), then times the command end
to end (`mlactl replay TRACE -f json`, the model's default engines: all four for DeepSeek-V3 at
TP 8 on an H200, the defaults; sglang and vllm with their DSA rules for --model deepseek-v3.2)
and, in process, each phase: reading the trace, each engine's scheduler and the pricing of its
steps. Prints medians with min and max, steps per second, and saves JSON (default
benchmarks/results/replay-<host>.json). Issue target: under 30 s on the 2-core machine for
12,000 requests in an hour, median prompt 7K tokens, about 350 output tokens. Nothing asserts.

The machine is shared: the load average is saved, and the command's CPU time (user + system,
which contention does not inflate) beside its wall time; on an idle machine the two agree.

The trace: Poisson arrivals; prompts log-normal (median 7,000 tokens, sigma 0.9, 16 to 128K);
outputs log-normal (median 350, sigma 0.5, 1 to 4,096); 40% of prompts open with one of 50
shared system prompts (1 to 8 blocks of 512, Zipf-popular) and 20% are a later turn that
repeats an earlier prompt's blocks before its own, as Mooncake's hash_ids share prefixes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BLOCK = 512


def synthetic_trace(path: Path, requests: int, hours: float, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(hours * 3600.0 / requests, requests)
    arrival_ms = np.floor(np.cumsum(gaps) * 1000).astype(np.int64)
    prompt = np.clip(np.round(rng.lognormal(np.log(7000), 0.9, requests)), 16, 131072).astype(np.int64)
    output = np.clip(np.round(rng.lognormal(np.log(350), 0.5, requests)), 1, 4096).astype(np.int64)
    systems = [list(range(1_000_000 + 100 * k, 1_000_000 + 100 * k + int(rng.integers(1, 9)))) for k in range(50)]
    popular = 1.0 / np.arange(1, 51)
    popular /= popular.sum()
    next_id = 0
    earlier: list[list[int]] = []
    with open(path, "w") as fh:
        for i in range(requests):
            blocks = -(-int(prompt[i]) // BLOCK)
            roll = rng.random()
            if roll < 0.2 and earlier:
                head = earlier[int(rng.integers(len(earlier)))]
            elif roll < 0.6:
                head = systems[int(rng.choice(50, p=popular))]
            else:
                head = []
            head = head[: blocks - 1]
            own = list(range(next_id, next_id + blocks - len(head)))
            next_id += len(own)
            ids = head + own
            earlier.append(ids)
            if len(earlier) > 2000:
                earlier.pop(0)
            row = {"timestamp": int(arrival_ms[i]), "input_length": int(prompt[i]), "output_length": int(output[i])}
            fh.write(json.dumps({**row, "hash_ids": ids}) + "\n")
    return {
        "requests": requests,
        "hours": hours,
        "median_prompt": float(np.median(prompt)),
        "mean_output": float(output.mean()),
        "seed": seed,
    }


def ideal_hit_rate(path: Path, page: int = 1) -> dict:
    """The trace's hit rate with a cache that never evicts and every earlier request done, worked
    out plainly from the file (a second implementation of replay's matching): by hash ids alone
    (each prompt's longest run of leading full blocks some earlier prompt had), and with each
    request's inferred continuation credited (the latest earlier request with the most full
    blocks that are all this one's leading ids, whose prompt is no longer: its prompt and output
    but the last token), at most input - 1 and in whole pages."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    seen: set = set()
    ends: dict = {}
    by_block = with_continuations = total = 0
    for i, r in enumerate(rows):
        inp, ids = r["input_length"], r["hash_ids"]
        chain = ids[: min(len(ids), inp // BLOCK)]
        prefixes = [tuple(chain[: k + 1]) for k in range(len(chain))]
        shared = max((k + 1 for k, p in enumerate(prefixes) if p in seen), default=0) * BLOCK
        parent = max(
            (k + 1 for k in range(len(ids)) if ends.get(tuple(ids[: k + 1])) is not None
             and rows[ends[tuple(ids[: k + 1])]]["input_length"] <= inp),
            default=0,
        )  # fmt: skip
        credit = 0
        if parent:
            a = rows[ends[tuple(ids[:parent])]]
            credit = a["input_length"] + a["output_length"] - 1
        cap = inp - 1
        by_block += min(shared, cap) // page * page
        with_continuations += min(max(shared, credit), cap) // page * page
        total += inp
        seen.update(prefixes)
        if chain:
            ends[tuple(chain)] = i
    return {
        "page": page,
        "by_block": by_block / total,
        "with_continuations": with_continuations / total,
    }


def summary(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": len(times)}


def show(name: str, s: dict, extra: str = "") -> None:
    spread = f"(min {s['min_s']:.2f}, max {s['max_s']:.2f}, {s['runs']} runs)"
    print(f"{name:<36} median {s['median_s']:8.2f} s   {spread}{extra}")


def in_process(trace: Path, model: str = "deepseek-v3", hardware_name: str = "h200", tp: int = 8) -> dict:
    """Each phase timed once: read, then per engine its scheduler and its pricing."""
    from mlactl.decide.engines import steps as rules
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

    start, cpu = time.perf_counter(), time.process_time()
    t = read_trace(trace)
    phases: dict = {"read_s": time.perf_counter() - start, "read_cpu_s": time.process_time() - cpu, "engines": {}}
    cfg = from_name(model).with_tp(tp)
    hw = hardware.resolve(hardware_name)
    cost, wc, s = CostModel(cfg), WeightCost(cfg, weights_of(model)), ReplaySettings()
    kv = kv_pool(wc, cost, hw, s)
    for e in rules.parse(None, None, cfg, hw, "bf16"):
        clock = Clock(engine_cost(cost, e.params), hw, wc, rules.paths(e))
        start, cpu = time.perf_counter(), time.process_time()
        settings = shipped_for(e, s, hw, kv, cfg)
        pool = TokenPool(settings.pool_tokens)
        sched = scheduler_for(e)(t, e, pool, clock, settings)
        sched = sched.run()
        scheduled, scheduled_cpu = time.perf_counter() - start, time.process_time() - cpu
        start, cpu = time.perf_counter(), time.process_time()
        _price(t, cost, hw, None, e, sched, s, False, settings.page)
        priced, priced_cpu = time.perf_counter() - start, time.process_time() - cpu
        phases["engines"][e.label] = {
            "steps": len(sched),
            "rows": int(sched.decode_rows + len(sched.chunk_new)),
            "schedule_s": scheduled,
            "price_s": priced,
            "schedule_cpu_s": scheduled_cpu,
            "price_cpu_s": priced_cpu,
            "steps_per_s": len(sched) / (scheduled + priced),
        }
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12_000)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--model", default="deepseek-v3")
    parser.add_argument("--hardware", default="h200")
    parser.add_argument("--tp", type=int, default=8)
    args = parser.parse_args()
    where = ["--model", args.model, "--hardware", args.hardware, "--tp", str(args.tp)]

    results: dict = {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "setup": f"{args.model}, tp {args.tp}, {args.hardware}, bf16 kv, the model's default engines (deepseek-v3: "
        "sglang, sglang-triton, sglang-trtllm, vllm; a DSA model: sglang, vllm) under the newest rule sets "
        "(sglang@0.5.23, vllm@0.33.0); defaults",
    }
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        results["trace"] = synthetic_trace(trace, args.requests, args.hours)
        print(f"trace: {results['trace']}")
        out = Path(tmp) / "replay.json"
        cmd = [sys.executable, "-m", "mlactl.cli", "replay", str(trace), *where, "-f", "json", "-o", str(out)]
        times, cpu = [], []
        for _ in range(args.repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        report = json.loads(out.read_text())
        steps = sum(e["steps"] for e in report["engines"])
        results["end_to_end"] = dict(summary(times), steps=steps, steps_per_s=steps / statistics.median(times))
        results["end_to_end_cpu"] = summary(cpu)
        show(f"mlactl replay, {len(report['engines'])} engines", results["end_to_end"], f"   {steps:,} steps, "
             f"{results['end_to_end']['steps_per_s']:,.0f} steps/s")  # fmt: skip
        show("  its CPU time (user + system)", results["end_to_end_cpu"])
        results["phases"] = in_process(trace, args.model, args.hardware, args.tp)
        print(f"read the trace: {results['phases']['read_s']:.2f} s")
        for name, p in results["phases"]["engines"].items():
            print(
                f"  {name:<16} {p['steps']:>8,} steps {p['rows']:>10,} rows   schedule {p['schedule_s']:6.2f} s "
                f"(cpu {p['schedule_cpu_s']:5.2f})   price {p['price_s']:6.2f} s (cpu {p['price_cpu_s']:5.2f})   "
                f"{p['steps_per_s']:>9,.0f} steps/s"
            )
        keys = ("version", "backend", "threshold", "steps", "time_s", "best_time_s", "lost_pct", "best_threshold")
        keys += ("cache", "scheduler")
        results["report"] = {e["name"]: {k: e[k] for k in keys} for e in report["engines"]}
        results["continued"] = report["trace"]["continued"] / report["trace"]["requests"]
        results["ideal_hit_rate"] = [ideal_hit_rate(trace, page) for page in (1, 16, 64, 512)]
        print(f"continuations credited: {100 * results['continued']:.1f}% of requests")
        for e in report["engines"]:
            print(f"  {e['name']:<16} cache hit {100 * e['cache']['hit_rate']:5.1f}% at page {e['cache']['page']}")
        for ideal in results["ideal_hit_rate"]:
            print(
                f"  never evicting, page {ideal['page']:>3}: {100 * ideal['by_block']:5.1f}% by hash ids, "
                f"{100 * ideal['with_continuations']:5.1f}% with continuations"
            )
    save(results, args.json or HERE / "results" / f"replay-{platform.node() or 'host'}.json")


def save(results: dict, path: Path) -> None:
    """The results with the load average after the run, as JSON at `path`."""
    results["load_average_after"] = os.getloadavg()
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
