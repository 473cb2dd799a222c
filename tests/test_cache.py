"""The replay's cache of KV blocks (mlactl/decide/replay/cache.py): least recently used eviction
of unheld segments, growing a session's partial block, and a pool that caches nothing."""

from __future__ import annotations

from mlactl.decide.replay.cache import TokenPool


def test_pool_evicts_least_recently_used_unheld_segments():
    pool = TokenPool(2048)
    assert pool.admit([], 1024)
    pool.private -= 1024
    assert pool.store(1, 512, False) and pool.store(2, 512, False)
    pool.release([1, 2], 0)  # cached, evictable: 1 then 2
    assert pool.admit([], 1024)
    pool.private -= 1024
    pool.store(3, 512, False)
    pool.store(4, 512, False)
    assert pool.match([1, 2, 9]) == ([1, 2], 1024) and pool.match([9, 1]) == ([], 0)
    assert not pool.fits([], 1025)  # 3 and 4 are held: only 1 and 2 (1024 tokens) can go
    assert pool.admit([2], 100)  # holds 2 again, so 1 is evicted
    assert 1 not in pool and 2 in pool and pool.evicted == 1
    pool.release([3, 4], 0)
    pool.release([2], 100)
    assert pool.used == 1536 and list(pool.lru) == [3, 4, 2]  # most recently used last


def test_pool_grows_a_segment_and_stops_a_match_after_a_partial_one():
    pool = TokenPool(10_000)
    pool.store(7, 76, False)  # a session's block with 76 tokens so far
    assert pool.match([5, 7], 0, None) == ([], 0)
    pool.store(5, 512, False)
    assert pool.match([5, 7, 8], 0, None) == ([5, 7], 588)  # the walk ends after the partial one
    pool.store(7, 300, True)  # the same holder computed more of it: it grows
    assert pool.size[7] == 300 and pool.cached == 812
    pool.store(7, 100, False)  # a second holder of fewer tokens shares it, nothing grows
    assert pool.refs[7] == 2 and pool.cached == 812
    # the continuation's block stands in where the request's own is missing
    assert pool.match([5, 9], 1, [7]) == ([5, 7], 812)


def test_pool_without_caching_matches_nothing():
    pool = TokenPool(10, caching=False)
    assert pool.admit([], 3)
    assert not pool.store(1, 2, False)
    assert pool.match([1]) == ([], 0) and pool.private == 3
    pool.release([], 3)
    assert pool.used == 0
