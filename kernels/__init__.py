"""MLA attention kernels (Triton) and their plain-torch twins, importable as mlactl.kernels.

    from mlactl.kernels import mla_attention, mla_decode, mla_prefill

The public names load their module on first use (PEP 562), so `mlactl.kernels.configs`, which
`mlactl tune` and the launchers share, is importable without torch.

absorb path   mla_decode (Triton, split-KV)        mla_decode_naive (torch twin)
expand path   mla_prefill (Triton, varlen causal)  mla_prefill_naive
              expand_kv, gather_latents, mla_prefill_expand, mla_prefill_chunked
merging       merge_attn_states (Triton)           merge_attn_states_naive
DSA           mla_sparse_decode (Triton, top-k)    mla_sparse_decode_naive, dsa_indexer_naive
the op        mla_attention: a mixed batch through expand, expand_chunked, absorb or auto
              (sparse_absorb with topk_indices)
"""

from importlib import import_module

_EXPORTS = {
    "mla_decode": "decode",
    "heuristic_config": "decode",
    "mla_decode_naive": "decode_naive",
    "mla_prefill": "prefill",
    "mla_prefill_naive": "prefill_naive",
    "merge_attn_states": "merge",
    "merge_attn_states_naive": "merge",
    "expand_kv": "expansion",
    "gather_latents": "expansion",
    "mla_prefill_expand": "expansion",
    "mla_prefill_chunked": "expansion",
    "mla_attention": "attention",
    "mla_sparse_decode": "sparse_decode",
    "mla_sparse_decode_naive": "sparse_decode_naive",
    "dsa_indexer_naive": "sparse_decode_naive",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
