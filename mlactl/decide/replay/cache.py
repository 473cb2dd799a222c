"""The KV cache of one GPU as a pool of tokens, and the prefix cache over it.

The pool holds `capacity` tokens. What is cached is kept in segments: a segment is one 512-token
block of a token stream (a Mooncake hash id, a CSV session's stream, a request's own tokens), and
holds the first `size` tokens of that block, up to 512. A segment's content is a prefix of its
block, so a later request that has the same block in its stream can use any leading part of it:
the pool grows a segment when a request computes more of its block (a session's partial block,
filled by the turn's output) and never shrinks one while it is held.

A running request holds its segments: the ones its prompt matched, and the ones it computes
(which join the cache as they are computed: the prefill that computes tokens caches them, a
finished request caches its prompt and output). It also holds `private` tokens: what it reserved
at admission and has not yet cached. When it finishes it lets go of its segments, which stay
cached, evictable, most recently used last; its private tokens are freed. A new request takes
as many tokens as it needs, evicting the least recently used segments nobody holds (whole
segments); when even that is not enough it waits.

The engine's page (block) enters through the callers: a hit is floored to whole pages, and a
request reserves whole pages (scheduler.py). Eviction here goes by segments of 512 tokens, not
by page: an approximation of both engines' LRU, whose unit is the page (vLLM) or the radix node
(SGLang). With caching off nothing is matched or kept, but the pool still bounds what runs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

SEGMENT = 512  # tokens of a trace block: the unit the pool caches and evicts in


class TokenPool:
    """`capacity` tokens: cached segments held by running requests (`refs`) or by nobody
    (`lru`, least recently used first), each with its size in tokens, and `private` tokens held
    by running requests outside any segment."""

    def __init__(self, capacity: int, caching: bool = True):
        self.capacity = int(capacity)
        self.caching = caching
        self.refs: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.size: dict[int, int] = {}
        self.cached = 0  # tokens in segments, held or not
        self.evictable = 0  # tokens in segments nobody holds
        self.private = 0
        self.evicted = 0  # segments evicted
        self.version = 0  # moves whenever what a waiting request could match or take may have changed
        # a block id filed under another's full segment: a continuation's block that its parent
        # computed (`name`); stale once that segment is evicted
        self.alias: dict[int, int] = {}

    @property
    def used(self) -> int:
        return self.cached + self.private

    def __contains__(self, seg: int) -> bool:
        return seg in self.size

    def resolve(self, seg: int) -> int:
        """The segment block id `seg` is cached as: itself, or the full segment it was named
        after (`name`) while that is cached."""
        to = self.alias.get(seg)
        if to is None:
            return seg
        if to in self.size:
            return to
        del self.alias[seg]  # its segment was evicted
        return seg

    def name(self, ids: list[int], matched: list[int]) -> None:
        """A request matched `matched` for its blocks `ids`: where it took a full segment under
        another id (its parent's own block), file that segment under its own block id too, so a
        later request that continues this one finds it by this one's ids."""
        if not self.caching:
            return
        size, alias = self.size, self.alias
        for own, seg in zip(ids, matched):
            if own != seg and size.get(seg) == SEGMENT and own not in size:
                alias[own] = seg

    def match(self, ids: list[int], alt_from: int = 0, alts: list[int] | None = None) -> tuple[list[int], int]:
        """The cached lead of a stream: (the segments matched, their tokens). Block k is
        `ids[k]`, or where that is not cached and k >= alt_from, `alts[k - alt_from]` (the
        continuation of an earlier request); the walk stops at the first block neither holds and
        after the first segment that is not full."""
        if not self.caching:
            return [], 0
        size = self.size
        out: list[int] = []
        tokens = 0
        n_alt = len(alts) if alts else 0
        alias = self.alias
        for k, seg in enumerate(ids):
            if seg in alias:
                seg = self.resolve(seg)
            got = size.get(seg)
            if got is None and alts is not None and 0 <= k - alt_from < n_alt:
                seg = alts[k - alt_from]
                got = size.get(seg)
            if got is None:
                break
            out.append(seg)
            tokens += got
            if got < SEGMENT:
                break
        return out, tokens

    def touch(self, segments: list[int]) -> None:
        """A waiting request matched `segments` (SGLang's match_prefix refreshes the matched radix
        nodes' last access time): those nobody holds become the most recently used, the last of
        `segments` first, so the lead of a stream is used last and evicted after its tail (as in
        the radix tree, which evicts leaves). What is held is untouched (it is not evictable)."""
        lru = self.lru
        for seg in reversed(segments):
            if seg in lru:
                lru.move_to_end(seg)

    def room(self, matched: Sequence[int] = ()) -> int:
        """Tokens a request that holds `matched` could take: what is free and what nobody holds,
        less the matched segments (holding them makes them unevictable)."""
        lru, size = self.lru, self.size
        pinned = sum(size[s] for s in matched if s in lru)
        return self.capacity - self.used + self.evictable - pinned

    def fits(self, matched: list[int], need: int) -> bool:
        """Whether `admit(matched, need)` would succeed (nothing changed)."""
        return need <= self.room(matched)

    def admit(self, matched: list[int], need: int) -> bool:
        """Hold the `matched` segments and `need` tokens, evicting the least recently used
        segments nobody holds; False (nothing changed) when they do not fit."""
        if not self.fits(matched, need):
            return False
        for s in matched:
            self._hold(s)
        self._make_room(need)
        self.private += need
        return True

    def _hold(self, seg: int) -> None:
        if seg in self.lru:
            del self.lru[seg]
            self.evictable -= self.size[seg]
            self.refs[seg] = 1
        else:
            self.refs[seg] += 1

    def _make_room(self, need: int) -> None:
        while self.capacity - self.used < need and self.lru:
            seg, _ = self.lru.popitem(last=False)
            got = self.size.pop(seg)
            self.cached -= got
            self.evictable -= got
            self.evicted += 1

    def store(self, seg: int, hi: int, held: bool) -> bool:
        """A running request has the first `hi` tokens of segment `seg` computed (the caller
        takes them from its private tokens): the segment grows to them, or is made. `held`:
        whether the request holds it already; returns whether it holds it now (False with
        caching off, where nothing is kept)."""
        self.version += 1
        if not self.caching:
            return False
        got = self.size.get(seg)
        if got is None:
            self.size[seg] = hi
            self.cached += hi
            self.refs[seg] = 1
        else:
            if hi > got:
                self.size[seg] = hi
                self.cached += hi - got
                if seg in self.lru:
                    self.evictable += hi - got
            if not held:
                self._hold(seg)
        self._make_room(0)
        return True

    def release(self, held, private: int) -> None:
        """A request finished: its segments stay cached, now evictable (most recent last); its
        `private` tokens are freed."""
        self.version += 1
        for s in held:
            left = self.refs[s] - 1
            if left:
                self.refs[s] = left
            else:
                del self.refs[s]
                self.lru[s] = None
                self.evictable += self.size[s]
        self.private -= private
