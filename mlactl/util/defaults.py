"""Defaults and choices shared by the CLI, the library and the kernels: each written once here.

Plain constants, nothing imported: `mlactl --help` and `mlactl analyze` read this module before
numpy is loaded, and `mlactl.kernels` reads it without the CLI.
"""

from __future__ import annotations

# What a run analyses when it is not told: the model mlactl names first, a GPU, one GPU's heads.
DEFAULT_MODEL = "deepseek-v3"
DEFAULT_HARDWARE = "h800"
DEFAULT_TP = 1

# Prefix tokens per chunk of expand_chunked (`--chunk`, `mla_attention(chunk=)`): at DeepSeek-V3's
# 128 heads one chunk of expanded K/V is 8192 x 128 x (128 + 128) x 2 B = 512 MiB in bf16.
DEFAULT_CHUNK = 8192

# Bytes per element of each dtype name mlactl uses (the names of the JSON and the CLI).
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
KV_DTYPES = ("bf16", "fp16", "fp8", "fp32")  # latent cache; fp8 is e4m3 with a per-tensor scale
ACT_DTYPES = ("bf16", "fp16", "fp32")  # activations, weights, compute peak; fp32 for CPU runs
# The linear layers' stored weights outside attention (`mlactl replay --weight-dtype`): DeepSeek-V3
# and Kimi K2 ship fp8 (e4m3, 128x128 block scales), DeepSeek-V2 bf16.
WEIGHT_DTYPES = ("bf16", "fp16", "fp8")

# The MLA paths an engine can run over a latent cache (`mha` in mlactl.model.cost is a baseline).
MLA_PATHS = ("expand", "expand_chunked", "absorb")
# The engines whose path rules mlactl.decide.engines models (`--engines`, `--policy ENGINE`).
ENGINES = ("sglang", "sglang-triton", "sglang-trtllm", "vllm")
# `mlactl analyze --policy`.
POLICIES = ("roofline", "flops", "measured", *ENGINES)
# What runs the kernels: `mla_attention(backend=)` takes the first two; `mlactl tune --backend`
# also takes Triton's CPU interpreter.
KERNEL_BACKENDS = ("triton", "torch")
TUNE_BACKENDS = (*KERNEL_BACKENDS, "interpret")

# Tokens per page of a paged latent cache, as FlashMLA lays it out (tune's inputs, compile cases).
KV_PAGE = 64

OUTPUT_FORMATS = ("table", "json", "csv")

# `mlactl replay` (each engine's scheduler and memory defaults are its own:
# mlactl.decide.replay.shipped): the prefix cache's block (the Mooncake traces' 512 tokens), and
# what --format csv and the charts bin the trace into.
REPLAY_BLOCK = 512
REPLAY_TP = 8
REPLAY_HARDWARE = "h200"
REPLAY_TIMELINE_BINS = 60
# A chunk whose request has at least this many tokens before it is "after a long prefix" in the
# report's step types: SGLang's summed-prefix threshold (SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD).
REPLAY_LONG_PREFIX = 8192
