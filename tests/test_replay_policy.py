"""SGLang's schedule_policy in replay: "fcfs" as shipped (sgl-project/sglang@001067ff
python/sglang/srt/server_args.py, ServerArgs.schedule_policy) or "lpm" (@00550cd1
python/sglang/srt/managers/schedule_policy.py, SchedulePolicy.calc_priority): the waiting queue
sorted by each request's cached prefix, longest first and stably, while at most 128 wait
(`_determine_active_policy`), the match refreshing the matched prefix in the LRU.

Hand-made Mooncake traces on DeepSeek-V3 at TP 8 on an H200 (SGLang's fa3, page 1), one request
running at a time (max_running 1) so the others wait in the queue; every outcome worked by hand
in the test's docstring. Mooncake blocks are 512 tokens; a finished request caches its prompt and
all its output but the last token (here output 2: its prompt's blocks and one token of its own).
"""

from __future__ import annotations

import json

from conftest import error_line, mooncake, run
from test_replay import H200, V3, parse

from mlactl.decide.engines import steps as rules
from mlactl.decide.replay.cache import TokenPool
from mlactl.decide.replay.clock import Clock
from mlactl.decide.replay.scheduler import scheduler_for
from mlactl.decide.replay.shipped import Shipped
from mlactl.decide.replay.traces import read_trace
from mlactl.model.cost import CostModel, WeightCost
from mlactl.model.weights import from_name as weights_of


def schedule(trace_path, policy, tokens=100_000):
    """SGLang (page 1) over the trace, one request running at a time, a pool of `tokens`."""
    e = parse("sglang")
    clock = Clock(CostModel(V3), H200, WeightCost(V3, weights_of("deepseek-v3")), rules.paths())
    pool = TokenPool(tokens)
    sched = scheduler_for(e)(read_trace(trace_path), e, pool, clock, Shipped(8192, 1, 1, schedule_policy=policy))
    return sched.run()


def admitted_order(s) -> list[int]:
    return sorted(range(len(s.admitted)), key=lambda i: s.admitted[i])


def test_lpm_admits_a_later_request_with_a_cached_prefix_first(tmp_path):
    """A (t 0, blocks [1, 2], prompt 1024) runs; B (t 1 ms, block [9], 512) and C (t 2 ms, block
    [1], 512) arrive during A's prefill and wait (one runs at a time). A's prefill caches blocks 1
    and 2, so C's prefix is cached: 512 tokens, capped at its prompt less one, 511; B's nothing.
    lpm sorts the queue [B, C] to [C, B] (511 before 0): C runs second, B third; fcfs keeps
    arrival order, A, B, C. C hits 511 either way (nothing is evicted from 100,000 tokens)."""
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1024, 2, [1, 2]), (1, 512, 2, [9]), (2, 512, 2, [1])])
    lpm, fcfs = schedule(trace, "lpm"), schedule(trace, "fcfs")
    assert admitted_order(lpm) == [0, 2, 1]
    assert admitted_order(fcfs) == [0, 1, 2]
    assert lpm.cached.tolist() == fcfs.cached.tolist() == [0, 0, 511]
    assert lpm.admitted[1] > lpm.admitted[0] + 0.001  # both waited for A: they did queue behind it


def queue_of(tmp_path, unshared: int) -> str:
    """A (t 0, blocks [1, 2]) runs; at t 1 ms `unshared` requests of 64 tokens that share nothing
    (blocks 100, 101, ...) arrive, then C, block [1] (512 tokens), which finds 511 cached."""
    rows = [(0, 1024, 2, [1, 2])] + [(1, 64, 2, [100 + k]) for k in range(unshared)] + [(1, 512, 2, [1])]
    return mooncake(tmp_path / "t.jsonl", rows)


def test_lpm_keeps_a_queue_longer_than_128_in_arrival_order(tmp_path):
    """128 unshared requests and C wait behind A: 129 in the queue, more than 128, so lpm does not
    sort (SGLang falls back to fcfs) and the first unshared one (request 1) is admitted after A.
    That leaves 128 waiting: now lpm sorts, and C (request 129, the only one with a hit) jumps
    ahead of the other 127: admitted third, then requests 2, 3, ... in arrival order."""
    s = schedule(queue_of(tmp_path, 128), "lpm")
    order = admitted_order(s)
    assert order[:4] == [0, 1, 129, 2]
    assert order[4:] == list(range(3, 129))
    assert s.cached[129] == 511


def test_lpm_sorts_a_queue_of_exactly_128(tmp_path):
    """127 unshared requests and C: 128 waiting, at most 128, so lpm sorts and C (request 128)
    runs right after A; fcfs runs it last."""
    path = queue_of(tmp_path, 127)
    assert admitted_order(schedule(path, "lpm"))[:3] == [0, 128, 1]
    assert admitted_order(schedule(path, "fcfs"))[-1] == 128


def test_lpm_matching_keeps_a_waiting_prefix_cached(tmp_path):
    """The touch, with the order the same under both policies.

    A (t 0, blocks [1, 11], prompt 1024) runs and finishes: blocks 1, 11 and A's own block (1
    token) are cached and nobody holds them, least recently used first: [1, 11, a]. B (t 100 ms,
    [2, 12], 1024) runs alone; X (t 101, [2, 5], 1024) and C (t 102, [1, 6], 1024) arrive during
    its prefill and wait. When B is done: [1, 11, a, 2, 12, b], 2,050 tokens cached, in a pool of
    2,561 tokens. X and C each find 512 cached (block 2, block 1): a tie, so lpm keeps X first,
    as fcfs does. X takes block 2 and needs 512 tokens of 511 free: one segment is evicted.

    fcfs (plain LRU): the least recent, block 1, C's prefix; C then finds nothing cached (0).
    lpm: the match of the queue [X, C] moved block 2, then block 1, to the most recent end:
    [11, a, 12, b, 2, 1]; block 11 is evicted and C finds its 512 tokens."""
    rows = [(0, 1024, 2, [1, 11]), (100, 1024, 2, [2, 12]), (101, 1024, 2, [2, 5]), (102, 1024, 2, [1, 6])]
    trace = mooncake(tmp_path / "t.jsonl", rows)
    lpm, fcfs = schedule(trace, "lpm", 2561), schedule(trace, "fcfs", 2561)
    assert admitted_order(lpm) == admitted_order(fcfs) == [0, 1, 2, 3]
    assert lpm.admitted[2] > lpm.finished[1] - 1e-9 and lpm.admitted[1] < 0.101  # X waited for B
    assert fcfs.cached.tolist() == [0, 0, 512, 0]
    assert lpm.cached.tolist() == [0, 0, 512, 512]


def test_touch_moves_only_unheld_segments_deepest_first():
    """TokenPool.touch: [7, 8] held by nobody, 9 held; touching [7, 9, 8] puts 8 then 7 at the
    most recent end (the lead used last), leaves 9 held, and the others' order alone."""
    pool = TokenPool(10_000)
    for seg in (6, 7, 8, 9):
        pool.store(seg, 512, held=False)
    pool.release([6, 7, 8], 0)  # 9 stays held
    assert list(pool.lru) == [6, 7, 8]
    pool.touch([7, 9, 8])
    assert list(pool.lru) == [6, 8, 7] and pool.refs == {9: 1}
    assert pool.evictable == 3 * 512 and pool.cached == 4 * 512


def test_a_bad_schedule_policy_is_one_error_line(tmp_path):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 600, 3, [1, 2])])
    args = ("--engines", "sglang", "--engine-option", "sglang.schedule_policy=dfs-weight")
    result = run("replay", trace, *args, ok=False)
    assert error_line(result) == "Error: sglang.schedule_policy takes fcfs or lpm, got 'dfs-weight'"


def test_the_json_names_the_policy(tmp_path):
    """Each SGLang engine's scheduler states its schedule_policy (fcfs unless set, and why);
    vLLM's has none."""
    trace = mooncake(tmp_path / "t.jsonl", [(0, 600, 3, [1, 2])])
    shipped = json.loads(run("replay", trace, "--engines", "sglang,vllm", "-f", "json").output)["engines"]
    sglang, vllm = (e["scheduler"] for e in shipped)
    assert sglang["schedule_policy"] == "fcfs" and "schedule_policy fcfs (default)" in sglang["why"]
    assert "schedule_policy" not in vllm
    args = ("--engines", "sglang", "--engine-option", "sglang.schedule_policy=LPM", "-f", "json")
    (only,) = json.loads(run("replay", trace, *args).output)["engines"]
    assert only["scheduler"]["schedule_policy"] == "lpm" and "schedule_policy lpm (set)" in only["scheduler"]["why"]
