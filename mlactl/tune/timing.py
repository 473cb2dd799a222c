"""One timing harness for kernels, paths and ceilings.

On CUDA: CUDA events around each call, after a warm-up; by default the L2 is flushed before every
repetition (a buffer twice the L2 is overwritten outside the timed region), so each call reads
its operands from HBM as it would inside a model ("cold"); `warm=True` skips the flush. On a CPU:
wall-clock time around each call ("wall-clock"). The number of repetitions adapts to the call's
length so that a measurement takes about `budget_s`. Figures are the median and the 10th/90th
percentiles of the repetitions.

A `deadline` (time.monotonic()) bounds a measurement: no warm-up call, repetition or
re-measurement is started that the last call's time says would end past it, and a timing cut
short says so (`budget_cut`). At least one repetition is always timed, so a call that ran (and
was checked) has a time; the most a deadline is overrun by is that repetition and the call to
size the repetitions (on a CPU the one call serves as both).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field, replace


@dataclass
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    repeats: int
    method: str  # "cuda-events" | "wall-clock"
    l2: str  # "cold" | "warm"
    times_s: list[float] = field(default_factory=list)
    cv: float = 0.0  # coefficient of variation of the repetitions: sample stdev / mean
    remeasured: int = 0  # how many times it was measured again for being unstable
    budget_cut: bool = False  # the deadline cut its warm-up, repetitions or re-measurements short

    def to_dict(self, keep_times: bool = False) -> dict:
        out = asdict(self)
        if not keep_times:
            out.pop("times_s")
        if not self.budget_cut:
            out.pop("budget_cut")
        if is_unstable(self):
            out["unstable"] = True
        return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def coefficient_of_variation(times: list[float]) -> float:
    """Sample standard deviation over mean; 0 for fewer than two repetitions."""
    if len(times) < 2:
        return 0.0
    mean = statistics.fmean(times)
    return statistics.stdev(times) / mean if mean > 0 else 0.0


def summarize(times: list[float], method: str, l2: str) -> Timing:
    return Timing(
        statistics.median(times),
        _percentile(times, 0.1),
        _percentile(times, 0.9),
        len(times),
        method,
        l2,
        list(times),
        cv=coefficient_of_variation(times),
    )


# A timing whose repetitions vary by more than this (stdev/mean) is unstable: on a shared 2-core
# CPU a quiet measurement of a 1 ms call stays under ~5%, one that another process disturbed
# reaches 20-50%.
UNSTABLE_CV = 0.10


def is_unstable(timing: Timing) -> bool:
    return timing.cv > UNSTABLE_CV


def time_stable(fn, repeats: int = 2, **kwargs) -> Timing:
    """`time_call`, measured again up to `repeats` times while unstable; the steadiest
    measurement (lowest CV) is kept, with `remeasured` saying how many more were taken."""
    return time_stable_all({"fn": fn}, repeats, **kwargs)["fn"]


def time_stable_all(fns: dict, repeats: int = 2, *, deadline: float = math.inf, **kwargs) -> dict[str, Timing]:
    """`time_interleaved`, measured again up to `repeats` times while any timing is unstable;
    the steadiest set (lowest worst CV) is kept whole, so its timings stay side by side. A
    re-measurement that would end past `deadline` (it takes as long as the first) is not started."""
    started = time.monotonic()
    best = time_interleaved(fns, deadline=deadline, **kwargs)
    took = time.monotonic() - started
    extra, cut = 0, False
    while any(is_unstable(t) for t in best.values()) and extra < repeats:
        if time.monotonic() + took > deadline:
            cut = True
            break
        extra += 1
        again = time_interleaved(fns, deadline=deadline, **kwargs)
        if max(t.cv for t in again.values()) < max(t.cv for t in best.values()):
            best = again
    for t in best.values():
        t.remeasured = extra
        t.budget_cut = t.budget_cut or cut
    return best


class _Flusher:
    """Overwrites a buffer twice the L2's size: evicts whatever the last call left there."""

    def __init__(self, device):
        import torch

        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20) or (64 << 20)
        self.buffer = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)

    def __call__(self):
        self.buffer.zero_()


_flushers: dict = {}


def time_call(fn, **kwargs) -> Timing:
    """Time `fn()` (no arguments; it must do the whole measured work each call); the keywords
    are `time_interleaved`'s."""
    return time_interleaved({"fn": fn}, **kwargs)["fn"]


def time_interleaved(
    fns: dict,
    *,
    device=None,
    warm: bool = False,
    warmup: int = 3,
    budget_s: float = 0.1,
    min_repeats: int = 5,
    max_repeats: int = 200,
    deadline: float = math.inf,
) -> dict[str, Timing]:
    """Time several calls in turns: round r runs each once, starting from a different one each
    round, so a machine that slows down for a while slows every call alike. A comparison (which
    path wins at this shape) then reads both under the same conditions; timed one after the other,
    a shared machine's drift moved a CPU crossover by 20-50%. Each call gets about `budget_s`."""
    import torch

    names = list(fns)
    cuda = device is not None and torch.device(device).type == "cuda"
    flush = None
    if cuda:
        device = torch.device(device)
        if not warm:
            flush = _flushers.get(device)
            if flush is None:
                flush = _flushers[device] = _Flusher(device)

    def timed_once(fn) -> float:
        if not cuda:
            t0 = time.perf_counter()
            fn()
            return max(time.perf_counter() - t0, 1e-9)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return max(start.elapsed_time(end) / 1e3, 1e-7)

    def fits(seconds: float) -> bool:
        return time.monotonic() + seconds <= deadline

    cut = False
    for name in names:
        last = 0.0
        for _ in range(warmup):
            if not fits(last):
                cut = True
                break
            t0 = time.perf_counter()
            fns[name]()
            last = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize(device)
    first = {name: timed_once(fns[name]) for name in names}
    once = max(first.values())
    repeats = int(min(max_repeats, max(min_repeats, budget_s / once)))
    if math.isfinite(deadline):  # no round that would end past the deadline; one round at least
        fit = max(0, int((deadline - time.monotonic()) // (once * len(names))))
        if fit < repeats:
            repeats, cut = fit, True
    times: dict[str, list] = {name: [] for name in names}
    if repeats == 0 and not cuda:  # on a CPU the sizing call was timed as a repetition is: it stands
        return {name: replace(summarize([first[name]], "wall-clock", "warm"), budget_cut=True) for name in names}
    repeats = max(1, repeats)
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            if not cuda:
                t0 = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - t0)
                continue
            if flush is not None:
                flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name]()
            end.record()
            times[name].append((start, end))
    if cuda:
        torch.cuda.synchronize(device)
        times = {name: [s.elapsed_time(e) / 1e3 for s, e in pairs] for name, pairs in times.items()}
    method, l2 = ("cuda-events", "warm" if warm else "cold") if cuda else ("wall-clock", "warm")
    return {name: replace(summarize(times[name], method, l2), budget_cut=cut) for name in names}


# -- kernel-only time ------------------------------------------------------------------------------

# GPU-side sleeps before the start event, so the GPU reaches it only once the host has queued
# what is timed: ~2 ms at the H200's 1.98 GHz for a call's own launches (mla_decode's host side
# is 133-339 us), ~100 us for one graph replay (a single launch from the host)
QUEUE_AHEAD_CYCLES = 4_000_000
QUEUE_AHEAD_GRAPH_CYCLES = 200_000


def time_kernel(
    fn,
    *,
    device,
    warm: bool = False,
    warmup: int = 3,
    budget_s: float = 0.1,
    min_repeats: int = 5,
    max_repeats: int = 200,
) -> Timing:
    """The GPU time of `fn()`'s launches alone, without the host side of the call: `fn` is
    captured once in a CUDA graph and the graph's replays are timed with CUDA events (method
    "cuda-graph"). A call that cannot be captured (a host sync inside, say) is timed with its
    launches queued behind a GPU-side sleep instead, so the start event is reached only after the
    host has issued them all (method "cuda-events-queued"; a replay is queued behind a shorter
    one too). The L2 is flushed before each repetition unless `warm`. Needs CUDA: on a CPU,
    `time_call`'s whole-call time is the only figure."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("time_kernel needs a CUDA device: on a CPU only the whole call can be timed")
    for _ in range(max(1, warmup)):  # compiles (Triton JIT) and allocator growth stay outside the graph
        fn()
    torch.cuda.synchronize(device)
    graph, run, method = None, fn, "cuda-graph"
    try:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            fn()  # a warm-up on the capture's side stream, as torch's graph docs ask
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except Exception:  # noqa: BLE001 - any capture failure: fall back to queued events
        graph, run, method = None, fn, "cuda-events-queued"
        torch.cuda.synchronize(device)
    flush = None if warm else _flushers.get(device) or _flushers.setdefault(device, _Flusher(device))

    def once() -> tuple:
        if flush is not None:
            flush()
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            sleep(QUEUE_AHEAD_CYCLES if graph is None else QUEUE_AHEAD_GRAPH_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        return start, end

    run()
    torch.cuda.synchronize(device)
    s, e = once()
    torch.cuda.synchronize(device)
    first = max(s.elapsed_time(e) / 1e3, 1e-7)
    repeats = int(min(max_repeats, max(min_repeats, budget_s / first)))
    pairs = [once() for _ in range(repeats)]
    torch.cuda.synchronize(device)
    times = [max(a.elapsed_time(b) / 1e3, 1e-7) for a, b in pairs]
    return summarize(times, method, "warm" if warm else "cold")
