"""The KV cache of one GPU as a pool of blocks, and the prefix cache over it.

The pool holds `capacity` blocks of `block` tokens (512, the Mooncake traces' block). A running
request holds its blocks: the cached ones its prompt matched, the ones its prefill computed
(which join the cache as they are computed: the prefill that computes a block caches it), and
the rest of its context (prompt and output) reserved at admission without an id. When it
finishes it lets go of its blocks: those with an id stay cached, evictable, most recently used
last; the rest are freed. A new request takes as many blocks as it needs, evicting the least
recently used cached blocks nobody holds; when even that is not enough it waits.

A request's cached prefix is its leading blocks that are in the cache (held or not), capped at
input - 1 tokens by the caller: one token is always computed. With caching off nothing is
matched and nothing keeps an id, but the pool still bounds what runs at once.

Reserving a request's whole context at admission is mlactl's simplification: vLLM allocates
blocks as a request grows and preempts (recomputes) the newest when they run out; SGLang admits
on an estimate of the output (new_token_ratio) and retracts decodes on a shortage. Neither is
modelled (docs/replay.md).
"""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    """`capacity` blocks: the ids held by running requests (`refs`), the cached ids nobody holds
    in least-recently-used order (`lru`), and `private` blocks held without an id."""

    def __init__(self, capacity: int, caching: bool = True):
        self.capacity = int(capacity)
        self.caching = caching
        self.refs: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.private = 0
        self.evicted = 0
        self.version = 0  # moves whenever what a waiting request could match or take may have changed

    @property
    def used(self) -> int:
        return len(self.refs) + len(self.lru) + self.private

    def __contains__(self, block: int) -> bool:
        return block in self.refs or block in self.lru

    def match(self, ids: list[int]) -> int:
        """How many of `ids`, from the first, are cached."""
        if not self.caching:
            return 0
        n = 0
        for b in ids:
            if b not in self.refs and b not in self.lru:
                break
            n += 1
        return n

    def fits(self, matched: list[int], need: int) -> bool:
        """Whether `admit(matched, need)` would succeed (nothing changed)."""
        pinned_lru = sum(1 for b in matched if b in self.lru)
        return need <= self.capacity - self.used + len(self.lru) - pinned_lru

    def admit(self, matched: list[int], need: int) -> bool:
        """Hold the `matched` cached blocks and `need` new ones, evicting the least recently used
        cached blocks nobody holds; False (nothing changed) when they do not fit."""
        if not self.fits(matched, need):
            return False
        for b in matched:
            if b in self.lru:
                del self.lru[b]
                self.refs[b] = 1
            else:
                self.refs[b] += 1
        free = self.capacity - self.used
        while free < need:
            self.lru.popitem(last=False)
            self.evicted += 1
            free += 1
        self.private += need
        return True

    def computed(self, ids: list[int]) -> None:
        """A running request computed the blocks `ids` (held privately until now): they join the
        cache, held by it. A block another request cached meanwhile is shared, its copy freed."""
        self.version += 1
        self.private -= len(ids)
        if not self.caching:
            self.private += len(ids)
            return
        for b in ids:
            if b in self.lru:
                del self.lru[b]
                self.refs[b] = 1
            elif b in self.refs:
                self.refs[b] += 1
            else:
                self.refs[b] = 1

    def release(self, held: list[int], private: int) -> None:
        """A request finished: its ids stay cached, now evictable (most recent last); its
        `private` blocks are freed."""
        self.version += 1
        for b in held:
            left = self.refs[b] - 1
            if left:
                self.refs[b] = left
            else:
                del self.refs[b]
                self.lru[b] = None
        self.private -= private

    def rename(self, old: int, new: int) -> None:
        """A held block gets another id (a session's partial prompt block, full once the output
        fills it): the old id is dropped; the new one is held instead (shared if cached)."""
        left = self.refs[old] - 1
        if left:
            self.refs[old] = left
            self.private += 1  # the old id stays with its other holders: this copy is private
            self.computed([new])
            return
        del self.refs[old]
        if new in self.refs or new in self.lru:
            self.private += 1
            self.computed([new])
        else:
            self.refs[new] = 1
