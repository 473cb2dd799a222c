"""Continuous batching with chunked prefill, each engine's way: the steps a trace makes.

Both schedulers share the model of a request: it arrives, waits, is admitted first come first
served (at most `max_running` run at once, and only when the engine's admission lets it: each
engine's class below), takes its cached prefix and the KV slots of what it computes step by step
(a preempted or retracted request comes back with its output so far as prompt), computes the
rest of its prompt in chunks (each chunk a row `new` tokens after `prefix` = the cached tokens
and the earlier chunks), samples its first output token with its last chunk, then decodes
output_length - 1 tokens, one a step (a row of one new token after all its earlier ones). They
differ in how a step is formed:

vLLM (vllm/v1/core/sched/scheduler.py, `Scheduler.schedule`, vllm-project/vllm@00024d31): one
token budget (`max_batch_tokens`, max_num_batched_tokens) per step, spent first on the running
requests in the order they were admitted (a decode takes 1, a partly computed prompt what is
left of it, up to the budget; once the budget is spent the later running requests wait a step),
then on waiting requests, first come first served, each taking min(rest of its prompt, budget)
while the budget lasts and fewer than max_running run. Decodes and chunks share one step.

SGLang (python/sglang/srt/managers/scheduler.py, `get_next_batch_to_run` and
`_get_new_batch_prefill_raw`, sgl-project/sglang@0003215c; PrefillAdder in schedule_policy.py
@00550cd1): when an extend batch can be formed it runs first ("Run prefill first if possible"),
and the running decodes wait; else the running requests decode. An extend batch continues the
one chunked request, then adds waiting requests first come first served (the default
schedule_policy "fcfs", server_args.py @001067ff) while `max_batch_tokens` (chunked_prefill_size)
lasts; the first that does not fit whole is cut to what is left and becomes the chunked request
(one at a time). With enable_mixed_chunk the running decodes join the extend batch and take a
token each of its budget (PrefillAdder's num_mixed_decode_tokens).

A decode row's prefix is the prompt plus the tokens decoded before it; each engine's rows are
formed once (the clock prices them by the engine's own rule; the feedback of other paths on when
steps run is ignored). Pure-decode stretches are stepped without touching each request: decodes
are kept as (prefix when they joined, decode count then), the heap of their last steps says when
the stretch ends, and each request's decodes are recorded once, as a span of decode steps.
docs/replay.md lists what differs from the engines' real schedulers.

vLLM's loop lets the running requests after the one that spends the budget sit a step out; here
that cannot happen (a step's decodes are never more than the step before's rows, so never more
than the budget), but a decoder that sits out is handled as vLLM does.
"""

from __future__ import annotations

import bisect
import heapq
from array import array
from collections import deque
from typing import Any

import numpy as np

from mlactl.decide.engines import steps as rules
from mlactl.decide.replay.cache import SEGMENT, TokenPool
from mlactl.decide.replay.clock import Clock
from mlactl.decide.replay.shipped import Shipped
from mlactl.decide.replay.traces import Trace
from mlactl.util.errors import MlactlError

WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3


class Schedule:
    """What a scheduler made, as flat arrays (numpy after `finish`).

    Steps [S]: start (clock when it began), time (the clock's step time), attention (the part
    of it the engine's attention takes), tokens (new tokens in it), sampled (rows that sample),
    decode (the decode count D of the step where its decoders decode, else -1: decode steps
    count 0, 1, 2, ... in order).
    Chunk rows [C]: step, req, new, prefix, last (the chunk that completes the prompt).
    Decode spans [P]: a request decodes in every decode step of D in [span_start, span_end),
    with the prefix span_c0 + D - span_d0 (all it has before that token): one span a request,
    more if it sat a step out (vLLM, when the budget runs out).
    Requests [N]: cached (tokens its prompt found cached), admitted, first_token, finished (clock),
    and the step each of those three happened in (admitted_step: the step it first joined;
    first_token_step, finished_step: the step at whose end it happened).
    """

    STEP = ("start", "time", "attention")
    STEP_INT = ("tokens", "sampled", "decode")
    CHUNK = ("chunk_step", "chunk_req", "chunk_new", "chunk_prefix", "chunk_last")
    SPAN = ("span_req", "span_start", "span_end", "span_c0", "span_d0")
    # array("d"/"q") while the scheduler appends, numpy arrays after finish()
    start: Any
    time: Any
    attention: Any
    tokens: Any
    sampled: Any
    decode: Any
    chunk_step: Any
    chunk_req: Any
    chunk_new: Any
    chunk_prefix: Any
    chunk_last: Any
    span_req: Any
    span_start: Any
    span_end: Any
    span_c0: Any
    span_d0: Any

    def __init__(self, requests: int):
        for name in self.STEP:
            setattr(self, name, array("d"))
        for name in self.STEP_INT + self.CHUNK + self.SPAN:
            setattr(self, name, array("q"))
        self.cached = np.zeros(requests, dtype=np.int64)
        self.preempted = 0  # vLLM's preemptions, SGLang's retractions
        self.recomputed = 0  # prompt (and output) tokens computed again after one
        self.admitted = np.full(requests, np.nan)
        self.first_token = np.full(requests, np.nan)
        self.finished = np.full(requests, np.nan)
        self.admitted_step = np.full(requests, -1, dtype=np.int64)
        self.first_token_step = np.full(requests, -1, dtype=np.int64)
        self.finished_step = np.full(requests, -1, dtype=np.int64)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.start)

    def add_step(self, start: float, time: float, attention: float, tokens: int, sampled: int, decode: int) -> None:
        self.start.append(start)
        self.time.append(time)
        self.attention.append(attention)
        self.tokens.append(tokens)
        self.sampled.append(sampled)
        self.decode.append(decode)

    def finish(self) -> Schedule:
        for name in self.STEP:
            setattr(self, name, np.frombuffer(getattr(self, name), dtype=np.float64).copy())
        for name in self.STEP_INT + self.CHUNK + self.SPAN:
            setattr(self, name, np.frombuffer(getattr(self, name), dtype=np.int64).copy())
        return self

    @property
    def decode_rows(self) -> int:
        return int(np.sum(self.span_end - self.span_start))


class Scheduler:
    """Runs one engine's scheduler over a trace (`run`); subclasses form the steps."""

    def __init__(self, trace: Trace, engine: rules.Engine, pool: TokenPool, clock: Clock, settings: Shipped):
        self.trace, self.engine, self.pool, self.clock, self.settings = trace, engine, pool, clock, settings
        n = len(trace)
        self.inp = trace.input.tolist()
        self.out = trace.output.tolist()
        self.arrival = trace.arrival.tolist()
        self.given_cached = trace.cached.tolist()
        self.phase = [WAITING] * n
        self.computed = [0] * n
        self.stored = [0] * n  # tokens of its stream it took from the cache or has cached since
        self.streams: list[tuple | None] = [None] * n  # Trace.stream(i), while it runs
        self.held: list[dict[int, None]] = [{} for _ in range(n)]
        self.private = [0] * n
        self.alloc = [0] * n  # tokens it holds slots for (whole pages): its hit and what it reserved
        self.inp_orig = list(self.inp)  # self.inp / self.out move on when a request is preempted
        # decodes: prefix c0 when it joined at decode count d0, and the decode count it ends at
        self.c0 = [0] * n
        self.d0 = [0] * n
        self.end = [0] * n
        self.begin = [0] * n  # the decode count its current span began at
        self.heap: list[tuple[int, int]] = []
        self.decoders: dict[int, None] = {}  # in the order they were admitted
        self.sum_c0_d0 = 0  # sum of c0 - d0 over the decoders: their prefixes sum to this + B * D
        self.sum_end = 0  # sum of the decoders' end: the decode steps they have left sum to this - B * D
        self.D = 0  # decode steps done
        self.waiting: deque[int] = deque()
        self.running: list[int] = []  # admitted and not finished, in admission order
        self.next_arrival = 0
        self.blocked_at: tuple | None = None  # the head's `_blocked_key` when it could not be admitted
        self.finishes = 0
        self.chunked: int | None = None  # SGLang's one chunked request (vLLM keeps none)
        self.rule = rules.OneStep(engine)
        self.decode_path = self.rule.decode
        self._own_chunk: dict[int, int | None] = {}
        self.own_path = rules.chunked_path(engine)  # the path the engine's own chunk is for
        if self.decode_path in self.clock.partial_paths:
            raise MlactlError(
                f"{engine.label} decodes on {self.decode_path}, whose cost depends on each prefix's chunks: "
                "replay's clock prices decodes from their summed prefix only"
            )
        self.s = Schedule(n)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> Schedule:
        n = len(self.inp)
        now = self.arrival[0] if n else 0.0
        while self.finishes < n:
            self._arrive(now)
            if not self.running and not self.waiting:
                now = max(now, self.arrival[self.next_arrival])
                continue
            if self._decode_only():
                now = self._decode_run(now)
            else:
                now = self._step(now)
        self.s.evicted = self.pool.evicted
        return self.s.finish()

    def _arrive(self, now: float) -> None:
        arrival, i, n = self.arrival, self.next_arrival, len(self.arrival)
        while i < n and arrival[i] <= now:
            self.waiting.append(i)
            i += 1
        self.next_arrival = i

    def _blocked_key(self, head: int) -> tuple:
        """What the head's admission depends on besides itself: the pool (vLLM); SGLang's also
        moves with its estimate of the running requests' outputs, which decays every decode step."""
        return (head, self.pool.version)

    def _plan_head(self, budget: int, commit: bool = True, offset: float = 0.0):
        """(the head of the queue, matched segments, cached tokens, tokens to reserve) for
        admitting it with `budget` new tokens left in the step (taking them from the pool with
        `commit`), or None when it cannot be admitted now; what blocked it is remembered
        (`blocked_at`), so it is not tried again until that moves.

        The hit is the stream's cached lead, capped at input - 1 (one token is always computed:
        vLLM's `max_cache_hit_length = request.num_tokens - 1` in KVCacheManager.get_computed_blocks,
        SGLang's `max_prefix_len = input_len - 1` in Req._compute_max_prefix_len, schedule_batch.py) and floored to
        whole pages (vLLM hits full blocks; SGLang's paged radix cache matches page-aligned keys).
        The reservation is the pages of its first chunk: both engines allocate a request's slots
        step by step as it computes (vLLM's allocate_slots for the tokens scheduled; SGLang's
        alloc for the extend, then a slot a decode); the engine's own admission test comes on
        top (`_admissible`)."""
        if not self.waiting or len(self.running) >= self.settings.max_running:
            return None
        i = self.waiting[0]
        key = self._blocked_key(i)
        if self.blocked_at == key:
            return None
        matched, cached = self._hit(i)
        need = self._pages(cached + min(self.inp[i] - cached, budget)) - cached
        ok = self._admissible(i, matched, cached, offset)
        ok = ok and (self.pool.admit(matched, need) if commit else self.pool.fits(matched, need))
        if not ok:
            self.blocked_at = key
            return None
        return i, matched, cached, need

    def _can_admit(self) -> bool:
        """Whether the head of the queue could be admitted now (no change made)."""
        return self._plan_head(self.settings.max_batch_tokens, commit=False) is not None

    def _pages(self, tokens: int) -> int:
        page = self.settings.page
        return -(-tokens // page) * page

    def _hit(self, i: int) -> tuple[list[int], int]:
        """(matched segments, cached tokens) of request i's hit now (as `_plan_head` takes it)."""
        stream = self.streams[i]
        if stream is None:
            stream = self.streams[i] = self.trace.stream(i)
        given = self.given_cached[i]
        if given >= 0:
            return [], given
        matched, tokens = self.pool.match(*stream)
        return matched, min(tokens, self.inp[i] - 1) // self.settings.page * self.settings.page

    def _admissible(self, i: int, matched: list[int], cached: int, offset: float) -> bool:
        """The engine's own test before it reserves a new request's first chunk (vLLM: none)."""
        return True

    def _admit(self, now: float, budget: int, offset: float = 0.0) -> tuple[int, int, int] | None:
        """Admit the head of the queue: its first chunk's row (request, new, prefix = its cached
        tokens), at most `budget` new tokens, or None when it must wait."""
        got = self._plan_head(budget, offset=offset)
        if got is None:
            return None
        i, matched, cached, need = got
        if matched:
            stream = self.streams[i]
            assert stream is not None
            self.pool.name(stream[0], matched)
        self.waiting.popleft()
        self.running.append(i)
        self.phase[i] = PREFILL
        self.computed[i] = cached
        self.held[i] = dict.fromkeys(matched)
        self.private[i] = need
        self.alloc[i] = cached + need
        self.stored[i] = cached
        if np.isnan(self.s.admitted[i]):
            self.s.cached[i] = cached
            self.s.admitted[i] = now
            self.s.admitted_step[i] = len(self.s.start)  # the step being formed
        else:  # back after a preemption: all it computes now it had computed before
            self.s.recomputed += self.inp[i] - cached
        return i, min(self.inp[i] - cached, budget), cached

    def _grow(self, i: int, upto: int) -> bool:
        """Request i needs slots for its first `upto` tokens: the pages it lacks, from the pool
        (evicting what nobody holds); False, and nothing changed, when they do not fit."""
        extra = self._pages(upto) - self.alloc[i]
        if extra <= 0:
            return True
        if not self.pool.admit([], extra):
            return False
        self.alloc[i] += extra
        self.private[i] += extra
        return True

    def _evict_request(self, i: int) -> None:
        """Request i leaves the running ones and goes back to the head of the queue (vLLM's
        preemption, SGLang's retraction): its slots are freed, what it cached stays cached
        (evictable); it comes back with its prompt and the output it has so far as its prompt
        (vLLM's request.num_tokens, SGLang's origin_input_ids + output_ids), recomputed less
        what it finds cached."""
        if self.phase[i] == DECODE:
            generated = self._prefix(i) - self.inp[i] + 1  # its KV covers all but the newest token
            self._stop_decoding(i, self.D)
            self.inp[i] += generated
            self.out[i] -= generated
        if self.chunked == i:
            self.chunked = None
        self._let_go(i, WAITING)
        self.computed[i] = self.stored[i] = 0
        self.waiting.appendleft(i)
        self.s.preempted += 1
        self.blocked_at = None

    def _decode_slots(self, k: int, ids=None) -> list[tuple[int, int]]:
        """(decoder, tokens) for each decoder (or each of `ids`) that lacks slots to decode `k`
        more steps: the whole pages it lacks (a request's slots are always whole pages)."""
        D, c0, d0, alloc, page = self.D, self.c0, self.d0, self.alloc, self.settings.page
        out = []
        for i in self.decoders if ids is None else ids:
            extra = -(-(c0[i] + D - d0[i] + k) // page) * page - alloc[i]
            if extra > 0:
                out.append((i, extra))
        return out

    def _decode_room(self, k: int, ids=None) -> int:
        """Tokens of the pool the decoders (or `ids`) lack to decode `k` more steps."""
        return sum(extra for _, extra in self._decode_slots(k, ids))

    def _steps_that_fit(self, steps: int) -> int:
        """The most decode steps (up to `steps`) whose slots the pool holds for every decoder."""
        room = self.pool.room()
        B = len(self.decoders)
        # every decoder holds the slots of what it has computed, so k steps need at most
        # k + page - 1 more each
        if room >= B * (steps + self.settings.page - 1) or self._decode_room(steps) <= room:
            return steps
        lo, hi = 0, steps  # need(lo) fits, need(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._decode_room(mid) <= room:
                lo = mid
            else:
                hi = mid
        return lo

    def _reserve_decodes(self, k: int) -> None:
        """Every decoder takes the slots of its next `k` decodes (they fit: _steps_that_fit)."""
        grown = self._decode_slots(k)
        total = sum(extra for _, extra in grown)
        if not total:
            return
        ok = self.pool.admit([], total)  # one reservation for all: the same evictions, in the same order
        assert ok, "internal error: decode slots that were counted do not fit"
        for i, extra in grown:
            self.alloc[i] += extra
            self.private[i] += extra

    # -- steps -----------------------------------------------------------------------------

    def _decode_only(self) -> bool:
        raise NotImplementedError

    def _form(self, now: float) -> tuple[list, bool, list]:
        """The step's chunk rows [(request, new, prefix)], whether the decoders decode in it,
        and the decoders that wait this step (vLLM, when the budget runs out)."""
        raise NotImplementedError

    def _step(self, now: float) -> float:
        """One step formed the engine's way; returns the clock after it."""
        chunks, decoding, skipped = self._form(now)
        if not chunks and not decoding:
            raise MlactlError("internal error: replay formed an empty step")
        step = len(self.s.start)
        if decoding:
            for i in skipped:  # they sit out this decode step: their prefix stays
                self._rebase(i, 1)
        B = len(self.decoders) - len(skipped) if decoding else 0
        skip = set(skipped)
        dec_ids = [i for i in self.decoders if i not in skip] if decoding and skipped else None
        attention, tokens, sampled = self._price(chunks, B, dec_ids)
        t = attention + self.clock.other(tokens, sampled)
        s = self.s
        s.add_step(now, t, attention, tokens, sampled, self.D if decoding and B else -1)
        end = now + t
        for i, new, prefix in chunks:
            s.chunk_step.append(step)
            s.chunk_req.append(i)
            s.chunk_new.append(new)
            s.chunk_prefix.append(prefix)
            s.chunk_last.append(prefix + new == self.inp[i])
            # its prompt is computed up to there: those tokens join the cache (the prefill that
            # computes tokens caches them)
            self.computed[i] = prefix + new
            self._store(i, prefix + new)
        if decoding and B:
            self.D += 1
            self._finish_decodes(end)
        for i, new, prefix in chunks:
            if prefix + new == self.inp[i]:
                self._prefilled(i, end)
        return end

    def _price(self, chunks, B: int, dec_ids) -> tuple[float, int, int]:
        """The clock's attention seconds, tokens and sampled rows of a step: B decodes (the
        decoders, or `dec_ids`), then the chunks."""
        clock = self.clock
        decoders = self.decoders if dec_ids is None else dec_ids
        rows_new = [new for _, new, _ in chunks]
        rows_prefix = [prefix for _, _, prefix in chunks]
        sum_prefix = 0
        if B:
            sum_prefix = self.sum_c0_d0 + B * self.D if dec_ids is None else sum(self._prefix(i) for i in dec_ids)
        decode_prefixes = None
        if B and clock.dsa:  # a DSA step reads its decodes' top-k and (SGLang, mixed) their longest prefix
            decode_prefixes = [self._prefix(i) for i in decoders]
        # the engine's rule over the step's rows: the decodes (their prefixes summing to
        # sum_prefix), then the chunks
        longest = max(decode_prefixes) if decode_prefixes else 0
        dec, rest = self.rule.paths(B, sum_prefix, rows_new, rows_prefix, longest)
        paths = [dec] * B + rest
        launches: dict[str, list] = {}
        own = self.own_path
        with_context = sum(1 for p in paths[:B] if p == own)  # a decode has a prefix
        with_context += sum(1 for p, pre in zip(paths[B:], rows_prefix) if p == own and pre > 0)
        chunk_size = self._own_chunk.get(with_context, 0)
        if chunk_size == 0:
            chunk_size = self._own_chunk[with_context] = rules.own_chunk_size(self.engine, with_context)
        if B:
            path = paths[0]
            if any(p != path for p in paths[1:B]) or path in clock.partial_paths:
                partial = clock.partial_paths
                for i, p in zip(decoders, paths[:B]):
                    pre = self._prefix(i)
                    self._add(launches, p, clock.features(1, pre, chunk_size, p in partial), pre, chunk_size)
            else:
                selected = clock.decode_selected(decode_prefixes) if decode_prefixes is not None else 0.0
                launches[path] = [clock.decode_features(B, sum_prefix, selected), 1.0]
        for p, new, prefix in zip(paths[B:], rows_new, rows_prefix):
            self._add(
                launches, p, clock.features(new, prefix, chunk_size, p in clock.partial_paths), prefix, chunk_size
            )
        attention = sum(clock.launch(p, sums, mm) for p, (sums, mm) in launches.items())
        tokens = B + sum(rows_new)
        sampled = B + sum(1 for (i, new, prefix) in chunks if prefix + new == self.inp[i])
        return attention, tokens, sampled

    def _add(self, launches: dict, path: str, features: list[float], prefix: int, chunk: int | None) -> None:
        got = launches.get(path)
        m = self.clock.partials(prefix, chunk) if path in self.clock.partial_paths else 1.0
        if got is None:
            launches[path] = [features, m]
        else:
            got[0] = [a + b for a, b in zip(got[0], features)]
            got[1] = max(got[1], m)

    def _decode_run(self, now: float) -> float:
        """Decode steps, every decoder in each, until one finishes or an arrival may change the
        next step."""
        B = len(self.decoders)
        steps = self._steps_that_fit(self._next_end() - self.D)
        if steps == 0:  # the pool cannot hold the next decode of every decoder
            return self._short_of_decode_slots(now)
        admits = self._admits_after(steps)
        watch = not self.waiting  # a head that waits for room waits whatever arrives
        arrival = self.arrival[self.next_arrival] if self.next_arrival < len(self.arrival) else float("inf")
        clock, path = self.clock, self.decode_path
        other = clock.other(B, B)
        sum_prefix = self.sum_c0_d0 + B * self.D
        selected = self._selected(B) if clock.dsa else None
        s = self.s
        k = 0
        while k < steps:
            if k and watch and arrival <= now:
                break
            if k and k == admits:  # the head is admitted now (SGLang: its estimate has decayed)
                break
            chosen = selected(self.D + k) if selected is not None else 0.0
            attention = clock.launch(path, clock.decode_features(B, sum_prefix, chosen), 1.0)
            t = attention + other
            s.add_step(now, t, attention, B, B, self.D + k)
            now += t
            sum_prefix += B
            k += 1
        self.D += k
        self._decayed(k)
        # every decoder now takes the slots of what it has computed: the stretch's steps fit the
        # pool (_steps_that_fit), nothing else took slots meanwhile, so taking them at its end
        # leaves the pool as taking each in its step would have
        self._reserve_decodes(0)
        self._finish_decodes(now)
        return now

    def _short_of_decode_slots(self, now: float) -> float:
        """A decode-only step the pool cannot hold: each engine's own way out (a step formed
        as usual: vLLM preempts in it; SGLang retracts first)."""
        return self._step(now)

    def _admits_after(self, steps: int) -> int:
        """The decode step of a stretch after which the head of the queue would be admitted
        (none: -1). vLLM's admission changes only with the pool, which a stretch leaves alone."""
        return -1

    def _decayed(self, steps: int) -> None:
        """`steps` decode steps ran (SGLang's estimate decays by them)."""

    def _selected(self, B: int):
        """A DSA model's decodes' selected pairs at decode count D: decoder i's prefix is
        b_i + D (b_i = c0 - d0), and it attends min(b_i + D + 1, topk) keys. With the b_i sorted
        and their prefix sums, each step is a bisect: the decoders with b_i >= topk - 1 - D
        are at topk, the rest sum to sum(b_i) + their count * (D + 1)."""
        topk = self.clock.topk
        bases = sorted(self.c0[i] - self.d0[i] for i in self.decoders)
        sums = [0]
        for b in bases:
            sums.append(sums[-1] + b)

        def selected(D: int) -> float:
            under = bisect.bisect_left(bases, topk - 1 - D)  # the decoders below topk
            return float(sums[under] + under * (D + 1) + (B - under) * topk)

        return selected

    def _next_end(self) -> int:
        """The decode count at which the next decoder finishes (stale heap entries dropped)."""
        heap, end, phase = self.heap, self.end, self.phase
        while heap and (end[heap[0][1]] != heap[0][0] or phase[heap[0][1]] != DECODE):
            heapq.heappop(heap)
        return heap[0][0]

    # -- request state ------------------------------------------------------------------------

    def _prefix(self, i: int) -> int:
        return self.c0[i] + self.D - self.d0[i]

    def _rebase(self, i: int, wait: int) -> None:
        """Decoder i sits out `wait` decode steps (from the current one): its span ends here and a
        new one begins after them; its prefix and its end move on by that."""
        self._close_span(i, self.D)
        self.begin[i] = self.D + wait
        self.d0[i] += wait
        self.sum_c0_d0 -= wait
        self.end[i] += wait
        self.sum_end += wait
        heapq.heappush(self.heap, (self.end[i], i))

    def _close_span(self, i: int, end: int) -> None:
        """Decoder i's current span ends at decode count `end` (exclusive)."""
        if end > self.begin[i]:
            s = self.s
            s.span_req.append(i)
            s.span_start.append(self.begin[i])
            s.span_end.append(end)
            s.span_c0.append(self.c0[i])
            s.span_d0.append(self.d0[i])

    def _store(self, i: int, upto: int) -> None:
        """Request i's stream is computed up to `upto` tokens: the segments that covers grow to
        them, taken from its private tokens (with caching off they stay private)."""
        lo = self.stored[i]
        if upto <= lo:
            return
        self.stored[i] = upto
        pool = self.pool
        if not pool.caching:
            return
        stream = self.streams[i]
        assert stream is not None
        ids, held = stream[0], self.held[i]
        self.private[i] -= upto - lo
        pool.private -= upto - lo  # first: the segments take these tokens, so no room is made for them
        for k in range(lo // SEGMENT, -(-upto // SEGMENT)):
            seg = pool.resolve(ids[k])
            if pool.store(seg, min(upto - k * SEGMENT, SEGMENT), seg in held):
                held[seg] = None

    def _prefilled(self, i: int, now: float) -> None:
        """Request i's prompt is done: it sampled its first token; it decodes the rest."""
        if np.isnan(self.s.first_token[i]):
            self.s.first_token[i] = now
            self.s.first_token_step[i] = len(self.s.start) - 1  # the step that just ended
        left = self.out[i] - 1
        if left == 0:
            self._finish(i, now)
            return
        self.phase[i] = DECODE
        self.c0[i], self.d0[i], self.end[i] = self.inp[i], self.D, self.D + left
        self.begin[i] = self.D
        self.sum_c0_d0 += self.inp[i] - self.D
        self.sum_end += self.end[i]
        self.decoders[i] = None
        heapq.heappush(self.heap, (self.end[i], i))

    def _finish_decodes(self, now: float) -> None:
        heap, end = self.heap, self.end
        while heap and heap[0][0] <= self.D:
            e, i = heapq.heappop(heap)
            if end[i] != e or self.phase[i] != DECODE:
                continue  # moved on since (it sat out a step)
            self._stop_decoding(i, e)
            self._finish(i, now)

    def _stop_decoding(self, i: int, end: int) -> None:
        """Decoder i leaves the decoders at decode count `end`, its span closed there."""
        del self.decoders[i]
        self.sum_c0_d0 -= self.c0[i] - self.d0[i]
        self.sum_end -= self.end[i]
        self._close_span(i, end)

    def _finish(self, i: int, now: float) -> None:
        """Request i is done: its prompt and output, less the last token (whose KV is never
        computed), join the cache (SGLang's release_kv_cache caches kv_committed_len tokens of
        origin_input_ids + output_ids; vLLM caches every full block it filled), and it lets go."""
        self.s.finished[i] = now
        self.s.finished_step[i] = len(self.s.start) - 1
        self._store(i, self.inp[i] + self.out[i] - 1)
        self._let_go(i, DONE)
        self.finishes += 1

    def _let_go(self, i: int, phase: int) -> None:
        """Request i leaves the running ones (finished or sent back to wait): its segments stay
        cached, its private slots are freed."""
        self.phase[i] = phase
        self.running.remove(i)
        self.pool.release(self.held[i], self.private[i])
        self.held[i], self.private[i], self.alloc[i], self.streams[i] = {}, 0, 0, None


class VllmScheduler(Scheduler):
    """vLLM v1 (vllm-project/vllm@00024d31 vllm/v1/core/sched/scheduler.py, Scheduler.schedule).

    Each step allocates the slots of the tokens it schedules (`kv_cache_manager.allocate_slots`
    for the running requests in order, a decode's one token, a chunk's tokens); a request
    whose slots do not fit preempts the newest running request (`self.running.pop()` under the
    default FCFS policy: its blocks freed, `num_computed_tokens = 0`, back at the head of the
    waiting queue) and tries again, until it fits or it is itself the one preempted, which ends
    the step's running requests. New requests are admitted only in a step that preempted none
    (`if not preempted_reqs`), each taking the slots of its first chunk."""

    def _decode_only(self) -> bool:
        if len(self.running) != len(self.decoders) or not self.decoders:
            return False
        if len(self.decoders) > self.settings.max_batch_tokens:
            return False
        return not self._can_admit()

    def _form(self, now: float):
        budget = self.settings.max_batch_tokens
        chunks, skipped = [], []
        decoded = 0
        preempted = False
        k = 0
        while k < len(self.running):
            i = self.running[k]
            if budget <= 0:
                if self.phase[i] == DECODE:
                    skipped.append(i)
                k += 1
                continue
            prefill = self.phase[i] == PREFILL
            c = min(self.inp[i] - self.computed[i], budget) if prefill else 1
            upto = self.computed[i] + c if prefill else self.c0[i] + self.D - self.d0[i] + 1
            fits = upto <= self.alloc[i] or self._grow(i, upto)
            while not fits:
                victim = self.running[-1]
                self._evict_request(victim)
                preempted = True
                if victim == i:
                    break
                fits = self._grow(i, upto)
            if not fits:
                break
            if prefill:
                chunks.append((i, c, self.computed[i]))
            else:
                decoded += 1
            budget -= c
            k += 1
        while budget > 0 and not preempted:
            row = self._admit(now, budget)
            if row is None:
                break
            chunks.append(row)
            budget -= row[1]
        return chunks, decoded > 0, skipped


# SGLang's estimate of the output its running requests will still need (sgl-project/sglang@0003215c
# python/sglang/srt/environ.py; Scheduler.init_schedule_policy): new_token_ratio starts at
# min(SGLANG_INIT_NEW_TOKEN_RATIO (0.7) x schedule_conservativeness (1.0 as shipped), 1), decays by
# (init - min) / 600 a decode step down to min = min(init x 0.14, 1)
# (SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS), and after a retraction is
# reset from the survivors with SGLANG_RETRACT_DECODE_STEPS (20) steps of headroom each; a request's
# own output counts at most SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION (4096).
SGLANG_INIT_RATIO = 0.7
SGLANG_MIN_RATIO_FACTOR = 0.14
SGLANG_RATIO_DECAY_STEPS = 600
SGLANG_RETRACT_STEPS = 20
SGLANG_CLIP_NEW = 4096
# SchedulePolicy._determine_active_policy (schedule_policy.py @00550cd1): lpm falls back to fcfs
# while more than 128 requests wait ("Turn off the expensive prefix matching and sorting").
SGLANG_LPM_QUEUE_MAX = 128


class SglangScheduler(Scheduler):
    """SGLang (sgl-project/sglang@0003215c python/sglang/srt/managers/scheduler.py; PrefillAdder in
    schedule_policy.py @00550cd1; retract_decode in schedule_batch.py @000eaffa).

    A new request is admitted when its rest of prompt, its output (max_new_tokens, here the
    trace's output length, clipped at 4096) and a page fit in what is free or evictable, less
    `new_token_ratio` of every running request's output still to come and what the requests
    admitted earlier in the pass took (PrefillAdder.add_one_req against rem_total_tokens,
    _get_running_request_total_token_offset); it then allocates its chunk. Before a decode
    step, if the pool cannot hold every decoder's next token (check_decode_mem), decoders are
    retracted, the one with the fewest output tokens first (the longest prompt among equals),
    until the rest fit, and new_token_ratio is reset from the survivors; else it decays."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        given = self.settings.conservativeness  # scales its output estimate (1.0 as shipped)
        init = min(SGLANG_INIT_RATIO * (1.0 if given is None else given), 1.0)
        self.min_ratio = min(init * SGLANG_MIN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (init - self.min_ratio) / SGLANG_RATIO_DECAY_STEPS
        self.ratio = init
        self._lpm_seen: tuple | None = None  # the pool and queue the last lpm pass left

    def _prioritise(self) -> None:
        """schedule_policy "lpm" (SchedulePolicy.calc_priority, schedule_policy.py @00550cd1): while
        at most 128 requests wait, match each waiting request's prefix in queue order (which
        refreshes the matched nodes in the LRU: TokenPool.touch) and sort the queue by its hit,
        longest first, stably (`_sort_by_longest_prefix`); the order it leaves stays until the next
        sort. Skipped when neither the pool nor the queue moved since the last pass (the same
        matches, the same order, and touching again changes nothing). The in-batch prefix
        caching that holds back a request sharing an uncached prefix with another waiting one
        is not modelled (docs/replay.md)."""
        waiting = self.waiting
        if self.settings.schedule_policy != "lpm" or not waiting or len(waiting) > SGLANG_LPM_QUEUE_MAX:
            return
        pool = self.pool
        seen = (pool.version, pool.evicted, tuple(waiting))
        if seen == self._lpm_seen:
            return
        hits = []
        for i in waiting:
            matched, cached = self._hit(i)
            pool.touch(matched)
            hits.append(-cached)
        order = sorted(range(len(hits)), key=hits.__getitem__)
        if any(k != j for j, k in enumerate(order)):
            ids = list(waiting)
            waiting.clear()
            waiting.extend(ids[k] for k in order)
            self.blocked_at = None
        self._lpm_seen = (pool.version, pool.evicted, tuple(waiting))

    def _blocked_key(self, head: int) -> tuple:
        return (head, self.pool.version, self.D, self.ratio)

    def _reserved_outputs(self) -> float:
        """new_token_ratio of the running decoders' outputs still to come (their decode steps
        left, the clip at 4096 applied when each was admitted)."""
        return self.ratio * (self.sum_end - len(self.decoders) * self.D)

    def _head_need(self, i: int, cached: int) -> int:
        return self.inp[i] - cached + min(self.out[i], SGLANG_CLIP_NEW) + self.settings.page

    def _admissible(self, i: int, matched: list[int], cached: int, offset: float) -> bool:
        if not self.running:  # alone it always fits (replay checks every request fits the pool)
            return True
        room = self.pool.room(matched)
        return self._head_need(i, cached) < room - self._reserved_outputs() - offset

    def _admits_after(self, steps: int) -> int:
        """The first step of the stretch after which the head's test passes as the estimate
        decays and the decoders' outputs to come shrink (the pool as at the stretch's start,
        less one slot a decoder a step)."""
        if not self.waiting or len(self.running) >= self.settings.max_running:
            return -1
        head = self.waiting[0]
        matched, cached = self._hit(head)
        B = len(self.decoders)
        room = self.pool.room(matched)  # before the stretch takes its slots
        left = self.sum_end - B * self.D
        need = self._head_need(head, cached)
        chunk = self._pages(cached + min(self.inp[head] - cached, self.settings.max_batch_tokens)) - cached
        for k in range(1, steps):
            ratio = max(self.ratio - k * self.ratio_decay, self.min_ratio)
            free = room - B * k
            if need < free - ratio * (left - B * k) and chunk <= free:
                return k
        return -1

    def _decayed(self, steps: int) -> None:
        self.ratio = max(self.ratio - steps * self.ratio_decay, self.min_ratio)

    def _retract(self) -> None:
        """check_decode_mem failed: retract decoders (fewest output tokens first, the longest
        prompt among equals) until the others' next decode fits, at least one, never the last;
        new_token_ratio from the survivors: (their output so far + 20 steps each) / their outputs."""
        order = sorted(
            self.decoders, key=lambda i: (self._prefix(i) - self.inp_orig[i], -self.inp_orig[i]), reverse=True
        )
        first = True
        while len(order) > 1 and (first or self._decode_room(1, order) > self.pool.room()):
            first = False
            self._evict_request(order.pop())
        if order:
            done = sum(self._prefix(i) - self.inp_orig[i] + 1 for i in order)
            total = sum(self.out[i] + self.inp[i] - self.inp_orig[i] for i in order)
            self.ratio = min(1.0, (done + SGLANG_RETRACT_STEPS * len(order)) / total)

    def _short_of_decode_slots(self, now: float) -> float:
        self._retract()
        return now

    def _decode_only(self) -> bool:
        self._prioritise()  # each pass orders the queue first (get_new_batch_prefill: calc_priority)
        if self.chunked is not None or not self.decoders:
            return False
        return not self._can_admit()

    def _form(self, now: float):
        mixed = self.engine.mixed_chunk
        budget = self.settings.max_batch_tokens - (len(self.decoders) if mixed else 0)
        chunks = []
        offset = 0.0  # what the requests admitted in this pass reserve (PrefillAdder's budget)
        if budget > 0 and self.chunked is not None:
            i = self.chunked
            rest = self.inp[i] - self.computed[i]
            c = min(rest, budget)
            if self._grow(i, self.computed[i] + c):
                chunks.append((i, c, self.computed[i]))
                budget -= c
                if c == rest:
                    self.chunked = None
                    offset += min(self.out[i], SGLANG_CLIP_NEW)
            else:
                budget = 0
        while budget > 0 and self.chunked is None:
            row = self._admit(now, budget, offset)
            if row is None:
                break
            chunks.append(row)
            i, c, cached = row
            budget -= c
            offset += self._pages(c)
            if cached + c < self.inp[i]:
                self.chunked = i
            else:
                offset += min(self.out[i], SGLANG_CLIP_NEW)
        decoding = bool(self.decoders) and (mixed or not chunks)
        if decoding:  # check_decode_mem, then a slot for every decoder's next token
            room = self.pool.room()
            if room < len(self.decoders) * self.settings.page and self._decode_room(1) > room:
                self._retract()
            self._reserve_decodes(1)
            if not chunks:
                self._decayed(1)
        return chunks, decoding, []


def scheduler_for(engine: rules.Engine):
    return VllmScheduler if engine.family == rules.VLLM else SglangScheduler
