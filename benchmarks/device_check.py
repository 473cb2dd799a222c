"""The project's one prepared GPU run: every step under its own budget, 330 s of budgets in all.

    bash benchmarks/device_check.sh             # on the GPU machine (OUT defaults to ./device-out)
    bash benchmarks/device_check.sh --dry-run   # anywhere, no GPU: the plan, every budget, the tools

The machine lent here (one H200, torch 2.11, triton 3.6, no network) gives a session 15 minutes of
device time, start-up and idle time included; 330 s of budgets leave room to run it twice. Steps,
in order (docs/gpu-check.md says what each writes and how to read it):

    setup      20 s  pip install -e . (or the source tree on PYTHONPATH), versions, nvidia-smi
    smoke      20 s  one launch per decode tile height against its twin: the 20 s watchdog; if it
                     hangs or answers wrong, every later step is skipped and the summary says so
    gpu_check 115 s  benchmarks/gpu_check.py: whole-call and kernel-only times, the launched
                     kernels' registers and spills, the bitwise repeat check, clocks per row
    tests      80 s  the GPU tests; each failure printed on its line as it happens
    tune       55 s  mlactl tune --quick under its compile budget, the shipped defaults first
    schedules  40 s  benchmarks/bench_decode_schedules.py --quick

Each step is killed at its budget (SIGTERM to its process group, SIGKILL GRACE_S later, both
inside the budget). Each step's record is appended to $OUT/steps.jsonl as the step ends, and every
step writes its own results as it measures them, so a kill loses only what was in flight. The
clocks are sampled by nvidia-smi into $OUT/clocks.csv for the whole run. The last line is a
summary; the exit status is 1 when any step failed, timed out or was skipped, 2 on a bad plan.

$OUT holds 8 files at most (what the device tool brings back): device_check.log (written by the
shell wrapper), steps.jsonl, clocks.csv, smoke.json, gpu-check-*.json, tests.jsonl,
tune-quick.json, decode-schedules.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import gpu_check  # noqa: E402 - beside this file; it imports nothing heavy at its top

LIMIT_S = 330  # the budgets' sum: two runs and two machine starts fit the 15 device minutes
GRACE_S = 3  # between SIGTERM and SIGKILL, inside the step's budget
SLACK_S = 5  # a step still starts when this little of its budget is missing (the steps' own overhead)
# step: budget in seconds, in the order they run (most telling first)
PLAN = (
    ("setup", 20),
    ("smoke", gpu_check.SMOKE_WATCHDOG_S),
    ("gpu_check", 115),
    ("tests", 80),
    ("tune", 55),
    ("schedules", 40),
)
# of a step's budget, what its own inner budget leaves for start-up and the report
RESERVE_S = {"gpu_check": gpu_check.STARTUP_RESERVE_S, "tune": 10, "schedules": 15}
OUT_FILES = 8  # the device tool brings back at most 8 files
PLANNED_FILES = (
    "device_check.log",
    "steps.jsonl",
    "clocks.csv",
    gpu_check.SMOKE_FILE,
    "gpu-check-*.json",
    "tests.jsonl",
    "tune-quick.json",
    "decode-schedules.json",
)


@dataclass
class Step:
    name: str
    budget_s: float
    argv: list[str]
    env: dict = field(default_factory=dict)


def inner_budget(name: str, budget_s: float) -> float:
    return budget_s - RESERVE_S.get(name, 0)


def parse_plan(text: str | None) -> list[tuple[str, int]]:
    """'name:seconds name:seconds ...' (DEVICE_CHECK_STEPS), else PLAN."""
    if not text:
        return list(PLAN)
    out = []
    for part in text.split():
        name, _, budget = part.partition(":")
        if not budget.isdigit() or int(budget) < 1:
            raise ValueError(f"DEVICE_CHECK_STEPS: {part!r} is not name:seconds")
        out.append((name, int(budget)))
    return out


def build_steps(plan: list[tuple[str, int]], out: Path, python: str) -> list[Step]:
    """The command of each planned step (an unknown name is a plan error)."""
    steps = []
    for name, budget in plan:
        inner = inner_budget(name, budget)
        if name == "setup":
            argv = [python, str(HERE / "device_check.py"), "--setup"]
        elif name == "smoke":
            argv = [python, str(HERE / "gpu_check.py"), "--smoke-launch", "--out", str(out)]
        elif name == "gpu_check":
            argv = [
                python,
                str(HERE / "gpu_check.py"),
                "--skip-tests",
                "--skip-smoke-launch",
                "--out",
                str(out),
                "--bench-budget",
                f"{inner:g}",
            ]
        elif name == "tests":
            argv = gpu_check.gpu_tests_command(python)
        elif name == "tune":
            argv = [
                python,
                "-m",
                "mlactl.cli",
                "tune",
                "--quick",
                "--budget",
                f"{inner:g}",
                "--results-file",
                str(out / "tune-quick.json"),
            ]
        elif name == "schedules":
            argv = [
                python,
                str(HERE / "bench_decode_schedules.py"),
                "--quick",
                "--out",
                str(out),
                "--budget",
                f"{inner:g}",
            ]
        else:
            raise ValueError(f"no command for step {name!r}; steps: {', '.join(n for n, _ in PLAN)}")
        env = {gpu_check.TESTS_LOG_ENV: str(out / "tests.jsonl")} if name == "tests" else {}
        steps.append(Step(name, budget, argv, env))
    return steps


def check_plan(steps: list[Step], limit_s: float) -> list[str]:
    """Why the plan cannot run as planned ([] when it can)."""
    problems = []
    total = sum(s.budget_s for s in steps)
    if total > limit_s:
        problems.append(f"the step budgets add up to {total:g} s, over the {limit_s:g} s limit")
    names = [s.name for s in steps]
    if "smoke" in names and names.index("smoke") != (1 if names[0] == "setup" else 0):
        problems.append("the smoke launch must come first (after setup)")
    for s in steps:
        if s.name == "smoke" and s.budget_s != gpu_check.SMOKE_WATCHDOG_S:
            problems.append(
                f"the smoke step's budget is {s.budget_s:g} s: the watchdog is {gpu_check.SMOKE_WATCHDOG_S} s"
            )
        if s.name in RESERVE_S and inner_budget(s.name, s.budget_s) <= 0:
            problems.append(f"step {s.name}: {s.budget_s:g} s leaves nothing after its {RESERVE_S[s.name]} s reserve")
        if s.budget_s <= GRACE_S:
            problems.append(f"step {s.name}: {s.budget_s:g} s is not more than the {GRACE_S} s kill grace")
    if len(PLANNED_FILES) > OUT_FILES:
        problems.append(f"{len(PLANNED_FILES)} result files planned, the device tool brings back {OUT_FILES}")
    return problems


def append_record(path: Path, record: dict) -> None:
    """One JSON line, one write (O_APPEND): a kill leaves whole records."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


class Interrupted(Exception):
    """SIGTERM or SIGINT to the run: the step in flight is killed, the rest are not started."""


def _interrupt(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def run_one(step: Step, timeout_s: float, env: dict) -> tuple[str, int | None]:
    """Run a step in its own process group; kill the group at `timeout_s` (SIGTERM, then SIGKILL
    GRACE_S later, both within it). Returns (status, return code or None)."""
    proc = subprocess.Popen(step.argv, cwd=REPO, env={**env, **step.env}, **gpu_check.own_group())
    try:
        rc = proc.wait(timeout=max(0.1, timeout_s - GRACE_S))
    except Interrupted:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            rc = proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            proc.wait()
        try:  # whatever the step left in its group (pytest's workers, say)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return "timeout", None
    return ("ok" if rc == 0 else "failed"), rc


def step_note(step: Step, status: str, out: Path) -> dict:
    """What the step's own files say about how it ended: the smoke launch's verdict, the tests
    that failed so far and the one in flight at a kill."""
    if step.name == "smoke":
        try:
            smoke = json.loads((out / gpu_check.SMOKE_FILE).read_text())
        except (OSError, ValueError):
            return {"smoke": "no smoke.json: it never got to write one"}
        return {"smoke": smoke.get("status"), **gpu_check.smoke_verdict(smoke, status == "timeout")}
    if step.name == "tests":
        log = gpu_check.read_tests_log(out / "tests.jsonl")
        ended = log["ended"].values()
        return {
            "passed": sum(r["outcome"] == "passed" for r in ended),
            "failed": [r["nodeid"] for r in ended if r["outcome"] in ("failed", "error")],
            "running_when_killed": log["running"] if status == "timeout" else [],
        }
    return {}


def run_plan(steps: list[Step], out: Path, limit_s: float = LIMIT_S, env: dict | None = None) -> int:
    """Run the steps in order; record each in steps.jsonl as it ends; print the summary line.
    0 when every step was ok, 1 otherwise (a failure, a timeout or a skipped step)."""
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "steps.jsonl"
    record_path.unlink(missing_ok=True)  # this run's records only (the device tool empties $OUT anyway)
    for step in steps:
        if gpu_check.TESTS_LOG_ENV in step.env:
            Path(step.env[gpu_check.TESTS_LOG_ENV]).unlink(missing_ok=True)
    handlers = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), str(HERE), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    clocks = out / "clocks.csv"
    sampler = gpu_check.start_clock_sampler(clocks)
    if sampler is not None:
        env[gpu_check.CLOCKS_ENV] = str(clocks)
    start, wall0 = time.monotonic(), time.time()
    print(f"device_check: plan ({sum(s.budget_s for s in steps):g} of {limit_s:g} s, OUT={out})", flush=True)
    for s in steps:
        print(f"  {s.name:<10} {s.budget_s:4g} s", flush=True)
    results, stop_reason = [], None
    try:
        for step in steps:
            used = time.monotonic() - start
            left = limit_s - used
            record = {"step": step.name, "budget_s": step.budget_s, "started_at_s": round(used, 1)}
            if stop_reason is not None:
                record.update(status="skipped", note=stop_reason)
            elif left < step.budget_s - SLACK_S:
                record.update(status="skipped", note=f"{step.budget_s:g} s would end past the {limit_s:g} s limit")
            if "status" in record:
                print(f"== {step.name}: skipped ({record['note']})", flush=True)
            else:
                print(f"== {step.name} (budget {step.budget_s:g} s, at {used:.0f} s)", flush=True)
                t0 = time.monotonic()
                try:
                    status, rc = run_one(step, min(step.budget_s, left), env)
                except Interrupted as exc:
                    status, rc, stop_reason = "failed", None, f"the run was interrupted ({exc}) during {step.name}"
                record.update(status=status, rc=rc, seconds=round(time.monotonic() - t0, 1))
                record.update(step_note(step, status, out))
                print(f"== {step.name}: {status} in {record['seconds']:.0f} s", flush=True)
                if step.name == "tests" and record["failed"]:
                    print(f"   failed: {', '.join(record['failed'])}", flush=True)
                if step.name == "tests" and record.get("running_when_killed"):
                    print(f"   running when killed: {', '.join(record['running_when_killed'])}", flush=True)
                if step.name == "smoke" and status == "timeout" and "slow_in" in record:
                    print(
                        f"device_check: the smoke launch was still on the host side ({record['phase']}) in "
                        f"{record['slow_in']} at its watchdog: no kernel hung, going on",
                        flush=True,
                    )
                elif step.name == "smoke" and status != "ok":
                    why = record.get("hung_in")
                    stop_reason = "the smoke launch " + (
                        f"hung in {why} (killed by its watchdog)"
                        if why
                        else f"failed ({record.get('smoke')}, exit {rc})"
                    )
                    later = [s.name for s in steps[steps.index(step) + 1 :]]
                    print(f"device_check: {stop_reason}: skipping {', '.join(later) or 'nothing'}", flush=True)
            append_record(record_path, record)
            results.append(record)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if sampler is not None:
            sampler.terminate()
            sampler.wait()
    by = {k: [r["step"] for r in results if r["status"] == k] for k in ("ok", "failed", "timeout", "skipped")}
    bad = bool(by["failed"] or by["timeout"] or by["skipped"])
    elapsed = time.monotonic() - start
    parts = [f"{len(v)} {k}" + (f" ({', '.join(v)})" if v and k != "ok" else "") for k, v in by.items()]
    summary = {"summary": "FAILED" if bad else "ok", **by, "seconds": round(elapsed, 1), "limit_s": limit_s}
    if sampler is not None:
        summary["clocks"] = gpu_check.clock_window(gpu_check.read_clocks(clocks), wall0, time.time())
    append_record(record_path, summary)
    if any(s.name == "gpu_check" for s in steps):
        print("\n".join(digest(out)), flush=True)
    print(
        f"device_check: SUMMARY {summary['summary']}: {', '.join(parts)}; {elapsed:.0f} s of {limit_s:g} s", flush=True
    )
    return 1 if bad else 0


def digest(out: Path) -> list[str]:
    """The figures to read first, from the newest gpu-check-*.json in `out`, a few lines long: the
    device tool returns only the end of the output, and the steps after gpu_check print a lot."""
    found = sorted(out.glob("gpu-check-*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        return ["digest: no gpu-check-*.json"]
    try:
        doc = json.loads(found[-1].read_text())
    except (OSError, ValueError) as exc:
        return [f"digest: {found[-1].name} unreadable ({exc})"]
    lines = [
        f"digest of {found[-1].name}: row, whole-call ms, kernel-only ms, TFLOP/s and TB/s (at the "
        "kernel-only time where there is one), most spills, repeat, SM MHz"
    ]
    for r in doc.get("rows", []):
        if r.get("status") != "ok":
            lines.append(f"  {r.get('id', '?'):<34} {r.get('status')}: {str(r.get('error', ''))[:70]}")
            continue
        whole = r["timing"]["median_s"]
        kt = r.get("kernel_timing") or {}
        kernel = kt.get("median_s") if kt.get("status") == "ok" else None
        at = kernel or whole
        spills = max((k.get("n_spills") or 0 for k in (r.get("launched") or {}).get("kernels", [])), default=None)
        rep = r.get("repeat")
        clk = (r.get("clocks") or {}).get("sm_mhz") or {}
        kernel_ms = "-" if kernel is None else f"{kernel * 1e3:.3f}"
        repeat = "-" if rep is None else ("same" if rep["bitwise_equal"] else "DIFFERS")
        lines.append(
            f"  {r['id']:<34} {whole * 1e3:8.3f} {kernel_ms:>8} {r['flops'] / at / 1e12:7.1f} "
            f"{r['bytes'] / at / 1e12:6.2f} {'-' if spills is None else spills:>5} {repeat:>7} "
            f"{clk.get('min', '-')}-{clk.get('max', '-')}"
        )
    return lines


def setup() -> int:
    """The setup step: the checkout installed without a network (else it runs from PYTHONPATH),
    the GPU as nvidia-smi sees it, the versions, and that `mlactl` is this checkout."""
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation", "-e", "."]
    try:
        done = subprocess.run(pip, cwd=REPO, capture_output=True, text=True, timeout=12)
        ok = done.returncode == 0
        tail = (done.stdout + done.stderr).strip().splitlines()[-2:]
    except subprocess.TimeoutExpired:
        ok, tail = False, ["pip timed out"]
    print(
        "setup: pip install -e . done"
        if ok
        else f"setup: pip could not install ({' '.join(tail)[:200]}); running from the source tree on PYTHONPATH"
    )
    try:
        subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw",
                "--format=csv",
            ],
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"setup: nvidia-smi: {exc}")
    import torch
    import triton

    import mlactl

    where = os.path.realpath(mlactl.__file__)
    print(
        f"setup: torch {torch.__version__}, triton {triton.__version__}, python {sys.version.split()[0]}, "
        f"GPU {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}; mlactl from {where}"
    )
    if not where.startswith(os.path.realpath(REPO)):
        print(f"setup: mlactl is imported from {where}, not this checkout {REPO}")
        return 1
    return 0


def dry_run(steps: list[Step], limit_s: float, python: str, out: Path) -> int:
    """The plan and every budget checked, every module the steps run imported, each script's own
    dry run; nothing is written but a scratch $OUT. 0: runnable; 1: a problem (listed)."""
    problems = check_plan(steps, limit_s)
    print(f"device_check --dry-run: {len(steps)} steps, {sum(s.budget_s for s in steps):g} of {limit_s:g} s")
    for s in steps:
        inner = f" (inner budget {inner_budget(s.name, s.budget_s):g} s)" if s.name in RESERVE_S else ""
        print(f"  {s.name:<10} {s.budget_s:4g} s{inner}: {' '.join(Path(a).name if '/' in a else a for a in s.argv)}")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")) if p),
    }
    checks = [
        [
            python,
            "-c",
            "import mlactl, os; assert os.path.realpath(mlactl.__file__).startswith("
            f"os.path.realpath({str(REPO)!r})), mlactl.__file__; import mlactl.cli.tune, mlactl.kernels.decode, "
            "mlactl.kernels.prefill, mlactl.kernels.merge, mlactl.kernels.attention, mlactl.tune.sweep, "
            "mlactl.tune.timing, torch, triton",
        ],
        [python, str(HERE / "bench_decode_schedules.py"), "--help"],
        [python, "-m", "mlactl.cli", "tune", "--help"],
        [python, str(HERE / "device_check.py"), "--check-tune-plan"],
    ]
    for s in steps:
        if s.name == "gpu_check":
            checks.append(
                [
                    python,
                    str(HERE / "gpu_check.py"),
                    "--dry-run",
                    "--bench-budget",
                    f"{inner_budget(s.name, s.budget_s):g}",
                    "--step-budget",
                    f"{s.budget_s:g}",
                ]
            )
        if s.name == "tests":
            checks.append([*s.argv[:3], "--collect-only", "-q", *s.argv[3:]])
    for cmd in checks:
        done = subprocess.run(cmd, cwd=REPO, env={**env, gpu_check.TESTS_LOG_ENV: ""}, capture_output=True, text=True)
        shown = " ".join(Path(a).name if "/" in a else a for a in cmd)[:100]
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            problems.append(f"`{shown}` exited {done.returncode}: {' | '.join(tail)[:400]}")
        elif "--dry-run" in cmd or "--check-tune-plan" in cmd:
            print("\n".join("    " + line for line in done.stdout.strip().splitlines()))
    for p in problems:
        print(f"  PROBLEM: {p}", file=sys.stderr)
    print(
        f"dry run: {'plan, budgets, tools and imports ok' if not problems else f'{len(problems)} problem(s)'} "
        f"({len(PLANNED_FILES)} result files planned, at most {OUT_FILES} come back)"
    )
    return 1 if problems else 0


def check_tune_plan() -> int:
    """What `tune --quick` will try, without a GPU: the shipped default first among each bucket's
    candidates, and a compile budget inside the sweep's time."""
    from mlactl.model.config import from_name
    from mlactl.tune import space, sweep

    cfg = from_name("deepseek-v3")
    problems = []
    for name in space.default_kernels(cfg):
        spec = space.KERNELS[name]
        for shape in spec.buckets(cfg, True, "cuda"):
            got = space.candidates(spec, cfg, shape, "bf16", "bf16", space.HOPPER_SMEM, quick=True)
            shipped = space.shipped_configs(spec, cfg, shape, "bf16", "bf16", set().union(*map(set, got)))
            ok = bool(shipped) and got[: len(shipped)] == shipped
            print(f"tune --quick {name} {shape}: {len(got)} candidates, shipped first: {ok} {shipped}")
            if not ok:
                problems.append(f"{name} {shape}: the shipped config is not the first candidate")
    print(
        f"tune --quick compile budget: {sweep.QUICK_COMPILE_BUDGET_S:g} s a bucket, at most "
        f"{sweep.COMPILE_SHARE:.2f} of the time left"
    )
    if not 0 < sweep.QUICK_COMPILE_BUDGET_S < inner_budget("tune", dict(PLAN)["tune"]):
        problems.append("the quick compile budget does not fit the tune step's budget")
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="check the plan, every budget and the tools; no GPU")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default $OUT, else ./device-out)")
    ap.add_argument("--setup", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--check-tune-plan", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.setup:
        return setup()
    if args.check_tune_plan:
        return check_tune_plan()
    python = os.environ.get("PYTHON") or sys.executable
    limit = float(os.environ.get("DEVICE_CHECK_LIMIT_S") or LIMIT_S)
    try:
        plan = parse_plan(os.environ.get("DEVICE_CHECK_STEPS"))
        out = args.out or Path(os.environ.get("OUT") or "device-out")
        steps = build_steps(plan, out.resolve() if not args.dry_run else Path(tempfile.mkdtemp()), python)
    except ValueError as exc:
        print(f"device_check: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        return dry_run(steps, limit, python, out)
    problems = check_plan(steps, limit)
    if problems:
        for p in problems:
            print(f"device_check: {p}", file=sys.stderr)
        return 2
    os.environ.setdefault("MLACTL_HOME", tempfile.mkdtemp(prefix="mlactl-home."))  # tuned files: not $OUT
    return run_plan(steps, out.resolve(), limit)


if __name__ == "__main__":
    sys.exit(main())
