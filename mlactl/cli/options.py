"""The CLI's options, each defined once: a command reuses these aliases (`batch: BatchOpt =
"1"`), so a flag reads and behaves the same in every command that has it. The options most
commands share (the model, the machine, the dtypes, the calibration, the output) are given with
their defaults by one decorator, `shared`, and reach the command as one `Opts`; mlactl.cli.common
.resolve turns that into the model, hardware, calibration and dtypes, the same way for all."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer

from mlactl import __version__
from mlactl.cli import complete
from mlactl.util import numbers
from mlactl.util.defaults import DEFAULT_CHUNK, DEFAULT_HARDWARE, DEFAULT_MODEL, DEFAULT_TP
from mlactl.util.errors import MlactlError

try:  # typer >= 0.24 carries its own click
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover
    from click import get_current_context  # type: ignore[no-redef]


def whole_number(option: str, minimum: int = 0, maximum: int = 1 << 20):
    """A parser for a typed integer option: ASCII digits only, within [minimum, maximum]
    (mlactl.util.numbers), so `--repeats ٣` or `--workers 1e9` is one error line, where click's
    int() would take the first and overflow on neither but hang on the work."""

    def parse(text) -> int:
        if isinstance(text, int) and not isinstance(text, bool):
            text = str(text)
        try:
            return numbers.integer(str(text), option, minimum, maximum)
        except MlactlError as exc:
            raise typer.BadParameter(str(exc).removeprefix(f"{option}: ")) from None

    return parse


ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Preset name (see `mlactl list`) or path to a Hugging Face config.json.",
        autocompletion=complete.models,
    ),
]
HardwareOpt = Annotated[
    str,
    typer.Option(
        "--hardware",
        "-g",
        help="Hardware profile name (see `mlactl list`) or path to a .toml profile.",
        autocompletion=complete.hardware,
    ),
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
    str,
    typer.Option(
        "--kv-dtype",
        help="Cache dtype: bf16, fp16, fp8 (half the bytes of bf16) or fp32.",
        autocompletion=complete.KV_DTYPE,
    ),
]
DtypeOpt = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="Activation, weight and compute dtype: bf16, fp16 or fp32 (CPU measurements).",
        autocompletion=complete.DTYPE,
    ),
]
ChunkOpt = Annotated[str, typer.Option("--chunk", help="Prefix tokens per chunk of the expand_chunked path.")]
LayersOpt = Annotated[str, typer.Option("--layers", help="Layers to count: a number, or 'all' for the model's.")]
_ENGINES_HELP = (
    "Engine rules to {verb}, comma-separated: ENGINE or ENGINE@VERSION, e.g. sglang@0.5.14, vllm@0.33.0 (a "
    "bare name is the newest; sglang-triton, sglang-trtllm force a backend; default: {default}). `mlactl "
    "engines --list` shows every rule set; docs/engines.md cites each rule."
)
EnginesOpt = Annotated[
    Optional[str],
    typer.Option(
        "--engines", help=_ENGINES_HELP.format(verb="show", default="sglang, vllm"), autocompletion=complete.engines
    ),
]
# the same, for a command that judges all four by default (replay)
AllEnginesOpt = Annotated[
    Optional[str],
    typer.Option(
        "--engines",
        help=_ENGINES_HELP.format(verb="judge", default="sglang, sglang-triton, sglang-trtllm, vllm"),
        autocompletion=complete.engines,
    ),
]
EngineOptionOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--engine-option",
        # (examples short enough to stay whole in the help's column at 80: `mlactl engines --list`
        # has every key, e.g. sglang.disable_chunked_prefix_cache and vllm.num_speculative_tokens)
        help="[ENGINE.]KEY=VALUE, repeatable, under the engine's own option names, e.g. "
        "vllm.backend=flashmla, or sglang.enable_mixed_chunk (a flag: =true). `mlactl engines --list` lists "
        "each version's keys and defaults.",
    ),
]
# aiconfigurator's tables (calibrate --from aiconfigurator, score, plot transfer)
SystemOpt = Annotated[
    Optional[str], typer.Option("--system", help="aiconfigurator system, e.g. h200_sxm, h100_sxm, b200_sxm.")
]
FrameworkOpt = Annotated[
    Optional[str],
    typer.Option(
        "--framework", help="aiconfigurator framework: sglang, trtllm or vllm.", autocompletion=complete.FRAMEWORKS
    ),
]
FrameworkVersionOpt = Annotated[
    Optional[str],
    typer.Option("--framework-version", help="aiconfigurator framework version (default: the newest of each table)."),
]
DataDirOpt = Annotated[
    Optional[Path],
    typer.Option("--data-dir", help="A folder laid out as aiconfigurator's (default: the installed package's)."),
]
FormatOpt = Annotated[
    Optional[str],
    typer.Option(
        "--format",
        "-f",
        help="table, json or csv (default: from --output's extension, else table).",
        autocompletion=complete.FORMAT,
    ),
]
OutputOpt = Annotated[
    Optional[Path], typer.Option("--output", "-o", help="Write to this file (atomically) instead of stdout.")
]


def version_callback(value: bool):
    if value:
        typer.echo(f"mlactl {__version__}")
        raise typer.Exit()


# mlactl's own version, on the root command (`calibrate --version` was the framework's: now
# --framework-version, and `calibrate --version` is refused with that suggestion)
VersionOpt = Annotated[
    bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Print mlactl's version and exit.")
]
CalibrationOpt = Annotated[
    Optional[str],
    typer.Option(
        "--calibration",
        help="Calibrated time instead of the roofline: a name from `mlactl calibrate` or a calibration file.",
        autocompletion=complete.calibrations,
    ),
]


# -- the shared settings: each option's alias and default, once ----------------------------------


@dataclass(frozen=True)
class Option:
    """One shared option: its annotated type (flags and help) and its default."""

    annotation: Any
    default: Any


SHARED: dict[str, Option] = {
    "model": Option(ModelOpt, DEFAULT_MODEL),
    "hardware": Option(HardwareOpt, DEFAULT_HARDWARE),
    "measured": Option(MeasuredOpt, False),
    "tp": Option(TpOpt, str(DEFAULT_TP)),
    "kv_dtype": Option(KvDtypeOpt, "bf16"),
    "dtype": Option(DtypeOpt, "bf16"),
    "chunk": Option(ChunkOpt, str(DEFAULT_CHUNK)),
    "calibration": Option(CalibrationOpt, None),
    "fmt": Option(FormatOpt, None),
    "output": Option(OutputOpt, None),
}
# The model and machine a command analyses, and where its answer goes: what most commands take.
MACHINE = ("model", "hardware", "measured", "tp", "kv_dtype", "dtype", "chunk", "calibration")
OUTPUT = ("fmt", "output")


@dataclass(frozen=True)
class Opts:
    """The shared options of one run, as given: every SHARED value (its default where the
    command does not offer it) and the names the user typed (`given`)."""

    model: str = SHARED["model"].default
    hardware: str = SHARED["hardware"].default
    measured: bool = SHARED["measured"].default
    tp: str = SHARED["tp"].default
    kv_dtype: str = SHARED["kv_dtype"].default
    dtype: str = SHARED["dtype"].default
    chunk: str = SHARED["chunk"].default
    calibration: Optional[str] = None
    fmt: Optional[str] = None
    output: Optional[Path] = None
    given: frozenset = frozenset()

    def typed(self, name: str) -> bool:
        """Whether the user gave option `name` (rather than leaving its default)."""
        return name in self.given


F = TypeVar("F", bound=Callable[..., Any])


def shared(
    *names: str,
    end: tuple[str, ...] = (),
    registry: dict[str, Option] | None = None,
    into: Callable[[dict, frozenset], Any] | None = None,
    **override: Any,
) -> Callable[[F], F]:
    """Give a command the shared options `names` (at its `opts` parameter) and `end` (after its
    own options), each with its one definition from `registry` (default SHARED); `override`
    replaces a definition for this command: an Option, or just another default. The command
    receives them as one `opts` argument: an Opts with the names the user typed in `opts.given`,
    or what `into(values, given)` makes of them.

        @shared(*MACHINE, end=OUTPUT)
        def analyze(opts: Opts, batch: BatchOpt = "1", ...): ...
    """
    registry = SHARED if registry is None else registry
    make = into or (lambda values, given: Opts(**values, given=given))

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn, eval_str=True)  # the annotations as objects, for Typer
        own = list(signature.parameters.values())
        at = [p.name for p in own].index("opts")

        def param(name: str) -> inspect.Parameter:
            spec = override.get(name, registry[name])
            if not isinstance(spec, Option):
                spec = Option(registry[name].annotation, spec)
            keyword = inspect.Parameter.KEYWORD_ONLY
            return inspect.Parameter(name, keyword, default=spec.default, annotation=spec.annotation)

        keyword = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[at + 1 :]]
        params = own[:at] + [param(n) for n in names] + keyword + [param(n) for n in end]
        added = (*names, *end)
        defaults = {p.name: p.default for p in params if p.name in added}

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            values = {n: kwargs.pop(n, defaults[n]) for n in added}  # Typer passes all; a caller may not
            ctx = get_current_context(silent=True)
            given = frozenset(n for n in added if ctx is not None and _typed(ctx, n))
            return fn(*args, opts=make(values, given), **kwargs)

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate


def given_options(*names: str) -> set[str]:
    """Of these options of the running command, the ones the user typed."""
    ctx = get_current_context(silent=True)
    return {n for n in names if ctx is not None and _typed(ctx, n)}


def _typed(ctx, name: str) -> bool:
    """Whether option `name` came from the command line (by name: typer ships its own click)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
