"""Mooncake's conversation and synthetic traces through `mlactl replay`, side by side on H200 and B200.

    python benchmarks/replay_side_by_side.py [--traces DIR] [--runs 3] [--tp 8]
                                             [--hardware h200,b200] [--json OUT]

For each trace (DIR/conversation_trace.jsonl and DIR/synthetic_trace.jsonl, from
kvcache-ai/Mooncake@3b5a594133958449a1feaf1c9e0fc1b553e34a28 FAST25-release/traces/; another
project's data, never committed) and each GPU, runs `mlactl replay TRACE --hardware HW --tp 8
-f json` in a child process twice: with the engines' default cache (what fits the GPU) and with an
unbounded one (`--cache-tokens 1000000000`). Per engine it reports the cache hit rate, the time
lost against the best path as a share of attention time and of GPU time, TTFT and TPOT p50 and
p99, output tokens a second (under its rule, and TTFT p50, TPOT p50 and output tokens a second on
the best path: the same steps re-timed), its KV pool, and when the replay's last step ends (beside the trace's last
arrival: an engine that ends far later has been queueing). Beside them, the trace's ideal hit
rate by a plain count of its hash ids (`ideal_hit_rate`, not replay's code) and the cache ratio
Mooncake's paper gives for the trace (FAST'25, "Mooncake: Trading More Storage for Less
Computation", kvcache-ai/Mooncake FAST25-release/Mooncake-FAST25.pdf: 40% conversation, 66%
synthetic).

Each replay is timed --runs times (wall, and the child's CPU time: user + system, which the shared
machine's load does not inflate): median, min and max. Saves JSON atomically (default
benchmarks/results/replay_side_by_side-2core.json) and prints a table. Nothing asserts.
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

HERE = Path(__file__).resolve().parent
BLOCK = 512  # tokens a Mooncake hash id stands for
UNBOUNDED = 1_000_000_000  # --cache-tokens for a cache nothing is evicted from
TRACES = ("conversation", "synthetic")
PAPER = {"conversation": 0.40, "synthetic": 0.66}  # the cache ratio Mooncake's FAST'25 paper gives
CACHES = ("default", "unbounded")


def ideal_hit_rate(path: Path, block: int = BLOCK) -> dict:
    """Share of prompt tokens in blocks an earlier request already named: a plain count.

    Mooncake's hash ids chain (a block's id stands for it and everything before it), so a
    request's hit is its leading run of ids seen before, `block` tokens each, capped at its
    prompt; every earlier request counts, as if the cache never evicted and each had finished.
    """
    seen: set[int] = set()
    hit = total = requests = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        ids, prompt = row["hash_ids"], int(row["input_length"])
        lead = 0
        while lead < len(ids) and ids[lead] in seen:
            lead += 1
        hit += min(lead * block, prompt)
        total += prompt
        requests += 1
        seen.update(ids)
    return {"requests": requests, "prompt_tokens": total, "hit_tokens": hit, "hit_rate": hit / total if total else 0.0}


def engine_row(engine: dict) -> dict:
    """The figures of one engine in `mlactl replay -f json`'s `engines` list."""
    lat, best = engine["latency_s"], engine.get("latency_best_path_s") or {}
    return {
        "engine": engine["label"],
        "kv_cache_tokens": (engine.get("scheduler") or {}).get("kv_cache_tokens"),
        "hit_rate": engine["cache"]["hit_rate"],
        "lost_attention_pct": engine["lost_pct"],
        "lost_gpu_pct": engine["lost_gpu_pct"],
        "ttft_p50_s": lat["first_token"]["p50"],
        "ttft_p99_s": lat["first_token"]["p99"],
        "tpot_p50_s": lat["per_output_token"]["p50"],
        "tpot_p99_s": lat["per_output_token"]["p99"],
        "output_tokens_per_s": lat["output_tokens_per_s"],
        "best_ttft_p50_s": best.get("first_token", {}).get("p50"),
        "best_tpot_p50_s": best.get("per_output_token", {}).get("p50"),
        "best_output_tokens_per_s": best.get("output_tokens_per_s"),
        "ends_s": engine["duration_s"],
        "preempted": engine["cache"].get("preempted", 0),
    }


def replay_rows(replay: dict) -> dict:
    """A replay's setting (trace span, cache tokens) and one row per engine."""
    return {
        "requests": replay["trace"]["requests"],
        "last_arrival_s": replay["trace"]["duration_s"],
        "kv_cache_tokens": replay["kv_cache_tokens"],
        "engines": [engine_row(e) for e in replay["engines"]],
    }


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def replay_command(trace: Path, hardware: str, tp: int, cache: str, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "mlactl.cli", "replay", str(trace), "--hardware", hardware, "--tp", str(tp)]
    if cache == "unbounded":
        cmd += ["--cache-tokens", str(UNBOUNDED)]
    return [*cmd, "-f", "json", "-o", str(out)]


def timed_replay(cmd: list[str], out: Path, runs: int) -> tuple[dict, dict]:
    """Runs `cmd` `runs` times; the last run's JSON and the wall and CPU spread."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return json.loads(out.read_text()), {"wall_s": spread(walls), "cpu_s": spread(cpus)}


def save_atomic(path: Path, data: dict) -> None:
    """Write JSON to a temporary file beside `path`, then rename it over: never a half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.3f}" if s < 1 else f"{s:.2f}" if s < 100 else f"{s:.0f}"


def table(results: dict) -> str:
    """One line per trace, GPU, cache and engine, under a header naming the columns."""
    head = (
        f"{'trace':<13}{'gpu':<5}{'cache':<10}{'engine':<15}{'hit':>6}{'ideal':>6}{'paper':>6}"
        f"{'lost att':>9}{'lost gpu':>9}{'TTFT p50':>9}{'p99':>8}{'TPOT p50':>9}{'p99':>8}"
        f"{'out tok/s':>10}{'best TTFT':>10}{'TPOT':>8}{'tok/s':>7}{'ends s':>7}{'wall s':>7}{'cpu s':>7}"
    )
    lines = [head]
    for run in results["replays"]:
        ideal = results["traces"][run["trace"]]["ideal"]["hit_rate"]
        paper = results["traces"][run["trace"]]["paper_cache_ratio"]
        for row in run["engines"]:
            lines.append(
                f"{run['trace']:<13}{run['hardware']:<5}{run['cache']:<10}{row['engine']:<15}"
                f"{row['hit_rate']:>6.1%}{ideal:>6.1%}{paper:>6.0%}"
                f"{row['lost_attention_pct']:>8.1f}%{row['lost_gpu_pct']:>8.1f}%"
                f"{_seconds(row['ttft_p50_s']):>9}{_seconds(row['ttft_p99_s']):>8}"
                f"{_seconds(row['tpot_p50_s']):>9}{_seconds(row['tpot_p99_s']):>8}"
                f"{row['output_tokens_per_s']:>10.0f}"
                f"{_seconds(row.get('best_ttft_p50_s')):>10}{_seconds(row.get('best_tpot_p50_s')):>8}"
                f"{row.get('best_output_tokens_per_s') or 0:>7.0f}{row['ends_s']:>7.0f}"
                f"{run['timing']['wall_s']['median']:>7.1f}{run['timing']['cpu_s']['median']:>7.1f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--traces", type=Path, default=Path("/tmp/mooncake"), help="folder of Mooncake's traces")
    parser.add_argument("--runs", type=int, default=3, help="timed replays of each case")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--hardware", default="h200,b200", help="comma-separated GPU profiles")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "replay_side_by_side-2core.json")
    args = parser.parse_args(argv)
    gpus = [g for g in args.hardware.split(",") if g]

    results: dict = {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "setup": f"deepseek-v3, tp {args.tp}, bf16 kv, the model's default engines under the newest rules; "
        f"cache: the engines' default (what fits the GPU) or --cache-tokens {UNBOUNDED}; {args.runs} timed runs",
        "source": "kvcache-ai/Mooncake@3b5a594133958449a1feaf1c9e0fc1b553e34a28 FAST25-release/traces/",
        "paper": "Mooncake: Trading More Storage for Less Computation (FAST'25): cache ratio of each trace",
        "traces": {},
        "replays": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in TRACES:
            trace = args.traces / f"{name}_trace.jsonl"
            results["traces"][name] = {
                "file": f"FAST25-release/traces/{trace.name}",
                "ideal": ideal_hit_rate(trace),
                "paper_cache_ratio": PAPER[name],
            }
            for hw in gpus:
                for cache in CACHES:
                    out = Path(tmp) / f"{name}-{hw}-{cache}.json"
                    replay, timing = timed_replay(replay_command(trace, hw, args.tp, cache, out), out, args.runs)
                    run = {"trace": name, "hardware": hw, "cache": cache, **replay_rows(replay), "timing": timing}
                    results["replays"].append(run)
                    print(f"{name} {hw} {cache}: {timing['wall_s']['median']:.1f} s wall", flush=True)
    results["load_average_after"] = os.getloadavg()
    save_atomic(args.json, results)
    print(table(results))
    print(f"saved {args.json}")


if __name__ == "__main__":
    main()
