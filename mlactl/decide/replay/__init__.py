"""Replay a request trace through each engine's scheduler and prefix cache (`mlactl replay`).

traces     read Mooncake JSON lines or a CSV into flat arrays
cache      the KV pool in blocks and the LRU prefix cache over it
shipped    each engine's scheduler and cache defaults as it ships
clock      a step's time, priced in the scheduler's loop
scheduler  continuous batching with chunked prefill, vLLM's and SGLang's way
pricing    every step priced under the rule, the best paths and every threshold
intervals  the 80% intervals of a calibrated replay's totals
replay     the whole run, and what each engine's rule costs

The engines' path rules come from mlactl.decide.engines (its `steps` module).
"""
