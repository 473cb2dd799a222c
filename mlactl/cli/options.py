"""The CLI's options, each defined once: a command reuses these aliases (`model: ModelOpt =
"deepseek-v3"`), so a flag reads and behaves the same in every command that has it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Preset name (see `mlactl list`) or path to a Hugging Face config.json.")
]
HardwareOpt = Annotated[
    str, typer.Option("--hardware", "-g", help="Hardware profile name (see `mlactl list`) or path to a .toml profile.")
]
MeasuredOpt = Annotated[
    bool,
    typer.Option("--measured", help="Use the ceilings `mlactl tune ceilings` measured instead of the datasheet's."),
]
TpOpt = Annotated[
    str,
    typer.Option("--tp", help="Tensor-parallel degree: divides the heads per GPU (the latent cache is replicated)."),
]
BatchOpt = Annotated[
    str, typer.Option("--batch", "-b", help="Requests per batch: list or range, e.g. 1,32,128 or 1:256:*2.")
]
NewOpt = Annotated[
    str, typer.Option("--new", "-n", help="New tokens per request: list or range, e.g. 1,64,512 or 1:4096:*2.")
]
PrefixOpt = Annotated[
    Optional[str],
    typer.Option("--prefix", "-p", help="Cached tokens before the new ones: list or range, e.g. 0:32K:4K (K = 1024)."),
]
ContextOpt = Annotated[
    Optional[str], typer.Option("--context", "-c", help="Instead of --prefix: total context including the new tokens.")
]
KvDtypeOpt = Annotated[
    str, typer.Option("--kv-dtype", help="Cache dtype: bf16, fp16, fp8 (half the bytes of bf16) or fp32.")
]
DtypeOpt = Annotated[
    str, typer.Option("--dtype", help="Activation, weight and compute dtype: bf16, fp16 or fp32 (CPU measurements).")
]
ChunkOpt = Annotated[str, typer.Option("--chunk", help="Prefix tokens per chunk of the expand_chunked path.")]
LayersOpt = Annotated[str, typer.Option("--layers", help="Layers to count: a number, or 'all' for the model's.")]
_ENGINES_HELP = (
    "Engine rules to {verb}, comma-separated: ENGINE or ENGINE@VERSION, e.g. sglang@0.5.14, vllm@0.33.0 (a "
    "bare name is the newest; sglang-triton, sglang-trtllm force a backend; default: {default}). `mlactl "
    "engines --list` shows every rule set; docs/engines.md cites each rule."
)
EnginesOpt = Annotated[
    Optional[str], typer.Option("--engines", help=_ENGINES_HELP.format(verb="show", default="sglang,vllm"))
]
# the same, for a command that judges all four by default (replay)
AllEnginesOpt = Annotated[
    Optional[str],
    typer.Option(
        "--engines", help=_ENGINES_HELP.format(verb="judge", default="sglang,sglang-triton,sglang-trtllm,vllm")
    ),
]
EngineOptionOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--engine-option",
        help="[ENGINE.]KEY=VALUE, repeatable, under the engine's own option names, e.g. "
        "sglang.enable_mixed_chunk=true, sglang.disable_chunked_prefix_cache=true, "
        "sglang.attention_backend=flashinfer, vllm.backend=flashinfer_mla, vllm.num_speculative_tokens=3. "
        "`mlactl engines --list` lists each version's keys and defaults.",
    ),
]
FormatOpt = Annotated[
    Optional[str],
    typer.Option("--format", "-f", help="table, json or csv (default: from --output's extension, else table)."),
]
OutputOpt = Annotated[
    Optional[Path], typer.Option("--output", "-o", help="Write to this file (atomically) instead of stdout.")
]
CalibrationOpt = Annotated[
    Optional[str],
    typer.Option(
        "--calibration",
        help="Calibrated time instead of the roofline: a name from `mlactl calibrate` or a calibration file.",
    ),
]
