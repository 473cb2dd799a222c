"""`mlactl tune`: measure the kernels, the two paths and the machine; keep every result."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

tune_app = typer.Typer(
    invoke_without_command=True,
    no_args_is_help=False,
)

from mlactl.cli import (  # noqa: E402  (tune_app exists before mlactl.cli imports this module)
    KV_DTYPES,
    FormatOpt,
    ModelOpt,
    OutputOpt,
    TpOpt,
    choice,
    cli_errors,
    load_model,
    one_int,
)
from mlactl.errors import MlactlError  # noqa: E402

BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        help="triton (CUDA), torch (the twins, any device) or interpret "
        "(Triton's CPU interpreter: tests the pipeline, times are meaningless).",
    ),
]
InterpretOpt = Annotated[bool, typer.Option("--interpret", help="Same as --backend interpret.")]
DeviceOpt = Annotated[
    Optional[str],
    typer.Option(
        "--device", help="cuda or cpu (default: cuda for triton, cpu for interpret, cuda if present for torch)."
    ),
]
TuneKvOpt = Annotated[str, typer.Option("--kv-dtype", help="Cache dtype: bf16, fp16, fp8, fp32; auto = --dtype.")]
TuneDtypeOpt = Annotated[str, typer.Option("--dtype", help="bf16, fp16, fp32; auto = bf16 on a GPU, fp32 on a CPU.")]
QuickOpt = Annotated[bool, typer.Option("--quick", help="Fewer shapes and configs (about a minute on an H200).")]
BudgetOpt = Annotated[
    Optional[str],
    typer.Option("--budget", help="Seconds this run may take (default 300, 60 with --quick); what is cut is listed."),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Start the run over (the old results file is kept beside it).")]
ResultsFileOpt = Annotated[
    Optional[Path],
    typer.Option("--results-file", help="Where this run's results go (default under $MLACTL_HOME/results/)."),
]
WarmOpt = Annotated[bool, typer.Option("--warm", help="Do not flush the L2 between repetitions (default: cold).")]


class Run:
    """A tune invocation: device, model, store and context, set up once for all its sweeps."""

    def __init__(
        self,
        model,
        tp,
        backend,
        interpret,
        device,
        kv_dtype,
        dtype,
        quick,
        budget,
        force,
        results_file,
        warm,
        chunk=8192,
        run_name=None,
    ):
        backend = "interpret" if interpret else choice(backend, "--backend", ("triton", "torch", "interpret"))
        if backend == "interpret":
            os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton's JIT
        try:
            import torch
        except ImportError:
            raise MlactlError(
                "mlactl tune needs torch and triton: pip install torch, then "
                "pip install 'mlactl[kernels]' (README, Quick start)"
            ) from None
        from mlactl import hardware
        from mlactl.kernels.configs import device_slug
        from mlactl.tune import store, sweep

        if backend == "triton" and not torch.cuda.is_available():
            raise MlactlError(
                "--backend triton needs a CUDA GPU and torch.cuda.is_available() is False; "
                "use --backend torch to time the twins here, or --interpret to test the "
                "pipeline under Triton's interpreter"
            )
        default_device = "cpu" if backend == "interpret" else ("cuda" if torch.cuda.is_available() else "cpu")
        device_name = choice(device or default_device, "--device", ("cuda", "cpu"))
        if device_name == "cuda" and not torch.cuda.is_available():
            raise MlactlError("--device cuda: no CUDA GPU is available (torch.cuda.is_available() is False)")
        if backend == "interpret" and device_name != "cpu":
            raise MlactlError("--interpret runs on the CPU; drop --device cuda")
        self.device = torch.device(device_name)
        on_gpu = self.device.type == "cuda"
        dtype = (
            ("bf16" if on_gpu else "fp32") if dtype == "auto" else choice(dtype, "--dtype", ("bf16", "fp16", "fp32"))
        )
        kv_dtype = dtype if kv_dtype == "auto" else choice(kv_dtype, "--kv-dtype", KV_DTYPES)
        if kv_dtype == "fp8" and not hasattr(torch, "float8_e4m3fn"):
            raise MlactlError("--kv-dtype fp8 needs a torch with float8_e4m3fn")
        self.cfg = load_model(model, tp)
        self.backend, self.quick = backend, quick
        self.budget = one_int(budget, "--budget") if budget else (60 if quick else 300)
        self.start = time.monotonic()

        info, versions, timing = sweep.environment(self.device, backend)
        timing.update(l2="warm" if warm or not on_gpu else "cold", budget_s=self.budget)
        hw = None
        if on_gpu and info["hardware"]:
            hw = hardware.from_name(info["hardware"])
        elif not on_gpu and backend != "interpret":  # the interpreter's times predict nothing
            hw = hardware.detect("cpu")  # a profile `mlactl tune ceilings` wrote for this CPU
            hw = hw.with_measured() if hw is not None and hw.measured else None
        if hw is not None and dtype not in hw.peak_tflops:
            hw = None  # no ceiling for this dtype: measure without predicting
        path = results_file or store.default_path(
            device_slug(info["name"]), run_name or self.cfg.name, self.cfg.tp, dtype, kv_dtype, backend
        )
        header = {
            "schema": "mlactl.results",
            "schema_version": 1,
            "run_id": Path(path).stem,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "mlactl_version": versions["mlactl"],
            "device": info,
            "versions": versions,
            "backend": backend,
            "timing": timing,
            "model": self.cfg.to_dict(),
            "kv_dtype": kv_dtype,
            "dtype": dtype,
            "chunk": chunk,
        }
        self.store = store.ResultsStore(path, header, force=force)
        self.hw = hw
        self.chunk = chunk
        from rich.console import Console

        self.console = Console(stderr=True)
        if not self.console.is_terminal:  # piped or captured: do not fold the tables at 80 columns
            self.console = Console(stderr=True, width=max(self.console.width, 132))
        self.ctx = sweep.Context(
            self.cfg,
            self.device,
            backend,
            kv_dtype,
            dtype,
            self.store,
            hw,
            warm=warm,
            quick=quick,
            timing_budget_s=0.02 if quick else 0.1,
        )

    def deadline(self, share: float) -> float:
        return self.start + share * self.budget

    def progress(self):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )

    def say(self, text: str) -> None:
        self.console.print(text)

    def finish(self) -> None:
        if self.store.moved_aside:
            self.say(f"the earlier results were kept as {self.store.moved_aside}")
        if self.ctx.skipped:
            self.say(f"[yellow]skipped ({len(self.ctx.skipped)}):[/]")
            for line in self.ctx.skipped:
                self.say(f"  {line}")
        if self.backend == "interpret":
            self.say("[yellow]interpreter run: the pipeline was exercised; its times mean nothing[/]")
        resumed = " (resumed)" if self.store.resumed else ""
        self.say(f"results: {self.store.path}{resumed}  ({time.monotonic() - self.start:.0f} s)")


def run_ceilings(run: Run) -> None:
    from mlactl.tune import report, sweep

    with run.progress() as progress:
        run.ctx.progress = progress
        result = sweep.tune_ceilings(run.ctx)
    run.console.print(report.ceilings_table(result, run.hw))
    if run.device.type != "cuda" and run.backend != "interpret":
        from mlactl import hardware

        measured = hardware.detect("cpu").with_measured()  # predict with what was just measured
        if run.ctx.dtype in measured.peak_tflops:
            run.ctx.hw = run.hw = measured
    if result.get("profile"):
        run.say(
            f"measured profile: {result['profile']} (use it: mlactl analyze --hardware "
            f"{Path(result['profile']).stem} --measured)"
        )


def run_kernels(run: Run, kernels: Optional[str], space: Optional[Path]) -> None:
    from mlactl.tune import report, sweep
    from mlactl.tune import space as spaces

    names = None
    if kernels:
        names = [k.strip() for k in kernels.split(",")]
        unknown = [k for k in names if k not in spaces.KERNELS]
        if unknown:
            raise MlactlError(f"--kernel {unknown[0]!r} is unknown; kernels: {', '.join(spaces.KERNELS)}")
    override = None
    if space is not None:
        from mlactl.io import read_json

        override = read_json(space, "--space file")
        if not isinstance(override, list) or not all(isinstance(c, dict) for c in override):
            raise MlactlError(f"{space}: --space must hold a JSON list of config objects")
    with run.progress() as progress:
        run.ctx.progress = progress
        entries = sweep.tune_kernels(run.ctx, names, override)
    run.console.print(report.kernels_table(entries, run.backend != "interpret"))


def run_paths(run: Run, batch: Optional[str], new: Optional[str], prefix: Optional[str]) -> None:
    from mlactl.shapes import parse_sizes
    from mlactl.tune import report, sweep

    kind = "cuda" if run.device.type == "cuda" else "cpu"
    news = parse_sizes(new or (sweep.QUICK_NEW if run.quick else sweep.DEFAULT_NEW)[kind], "--new")
    prefixes = parse_sizes(
        prefix or (sweep.QUICK_PREFIXES if run.quick else sweep.DEFAULT_PREFIXES)[kind], "--prefix", minimum=0
    )
    batches = parse_sizes(batch or "1", "--batch")
    with run.progress() as progress:
        run.ctx.progress = progress
        rows = sweep.tune_paths(run.ctx, batches, news, prefixes, run.chunk, refine=not run.quick)
    run.console.print(report.paths_table(rows, run.backend != "interpret"))
    if run.backend != "interpret":
        run.say(
            "the measured policy is in place: mla_attention(path='auto') and mlactl analyze --policy measured read it"
        )


def _common(model, tp, backend, interpret, device, kv_dtype, dtype, quick, budget, force, results_file, warm):
    return Run(model, tp, backend, interpret, device, kv_dtype, dtype, quick, budget, force, results_file, warm)


@tune_app.callback()
@cli_errors
def tune_all(
    ctx: typer.Context,
    model: ModelOpt = "deepseek-v3",
    tp: TpOpt = "1",
    backend: BackendOpt = "triton",
    interpret: InterpretOpt = False,
    device: DeviceOpt = None,
    kv_dtype: TuneKvOpt = "auto",
    dtype: TuneDtypeOpt = "auto",
    quick: QuickOpt = False,
    budget: BudgetOpt = None,
    force: ForceOpt = False,
    results_file: ResultsFileOpt = None,
    warm: WarmOpt = False,
):
    """Run the kernels for real: autotune launch configs, time both paths, measure ceilings.

    With no sub-command: ceilings, then kernel configs, then both paths, in one run and one results file.

    Example: mlactl tune --quick   (on a CUDA GPU; --backend torch on a laptop)
    """
    if ctx.invoked_subcommand is not None:
        return
    run = _common(model, tp, backend, interpret, device, kv_dtype, dtype, quick, budget, force, results_file, warm)
    run_ceilings(run)
    run.ctx.deadline = run.deadline(0.55)
    run_kernels(run, None, None)
    run.ctx.deadline = run.deadline(1.0)
    run_paths(run, None, None, None)
    run.finish()


@tune_app.command("ceilings")
@cli_errors
def tune_ceilings_cmd(
    device: DeviceOpt = None,
    quick: QuickOpt = False,
    force: ForceOpt = False,
    results_file: ResultsFileOpt = None,
):
    """Achieved matmul TFLOP/s per dtype and copy bandwidth, written as a measured hardware profile.

    Example: mlactl tune ceilings   (then: mlactl analyze --hardware h200 --measured)
    """
    run = Run(
        "deepseek-v3",
        "1",
        "torch",
        False,
        device,
        "auto",
        "auto",
        quick,
        None,
        force,
        results_file,
        True,
        run_name="ceilings",
    )
    run_ceilings(run)
    run.finish()


@tune_app.command("kernels")
@cli_errors
def tune_kernels_cmd(
    model: ModelOpt = "deepseek-v3",
    tp: TpOpt = "1",
    backend: BackendOpt = "triton",
    interpret: InterpretOpt = False,
    device: DeviceOpt = None,
    kv_dtype: TuneKvOpt = "auto",
    dtype: TuneDtypeOpt = "auto",
    kernel: Annotated[
        Optional[str],
        typer.Option("--kernel", help="Comma-separated: mla_decode, mla_prefill, merge_attn_states (default all)."),
    ] = None,
    space: Annotated[
        Optional[Path],
        typer.Option("--space", help="JSON list of configs to try instead of the built-in search space."),
    ] = None,
    quick: QuickOpt = False,
    budget: BudgetOpt = None,
    force: ForceOpt = False,
    results_file: ResultsFileOpt = None,
    warm: WarmOpt = False,
):
    """Search each kernel's launch space per shape bucket; every candidate checked against its twin.

    Example: mlactl tune kernels --tp 8 --kv-dtype fp8 --kernel mla_decode
    """
    run = _common(model, tp, backend, interpret, device, kv_dtype, dtype, quick, budget, force, results_file, warm)
    run.ctx.deadline = run.deadline(1.0)
    run_kernels(run, kernel, space)
    run.finish()


@tune_app.command("paths")
@cli_errors
def tune_paths_cmd(
    model: ModelOpt = "deepseek-v3",
    tp: TpOpt = "1",
    backend: BackendOpt = "triton",
    interpret: InterpretOpt = False,
    device: DeviceOpt = None,
    kv_dtype: TuneKvOpt = "auto",
    dtype: TuneDtypeOpt = "auto",
    batch: Annotated[Optional[str], typer.Option("--batch", "-b", help="Batch sizes (default 1).")] = None,
    new: Annotated[
        Optional[str],
        typer.Option("--new", "-n", help="New-token counts (default 1:4096:*2 on a GPU, 1:256:*2 on a CPU)."),
    ] = None,
    prefix: Annotated[
        Optional[str],
        typer.Option("--prefix", "-p", help="Prefixes (default 0,4K,16K,32K on a GPU, 0,256,1K on a CPU)."),
    ] = None,
    quick: QuickOpt = False,
    budget: BudgetOpt = None,
    force: ForceOpt = False,
    results_file: ResultsFileOpt = None,
    warm: WarmOpt = False,
):
    """Time the whole expand and absorb paths over new-token counts; the measured crossover per prefix.

    Example: mlactl tune paths --backend torch --model teaching --tp 8 --prefix 0,512
    """
    run = _common(model, tp, backend, interpret, device, kv_dtype, dtype, quick, budget, force, results_file, warm)
    run.ctx.deadline = run.deadline(1.0)
    run_paths(run, batch, new, prefix)
    run.finish()


@tune_app.command("compile")
@cli_errors
def tune_compile_cmd(
    model: ModelOpt = "deepseek-v3",
    tp: TpOpt = "1",
    arch: Annotated[
        str, typer.Option("--arch", help="Target GPU: sm_90 (H100/H200), sm_100 (B200) or sm_80 (A100).")
    ] = "sm_90",
    kernel: Annotated[
        Optional[str],
        typer.Option("--kernel", help="Comma-separated: mla_decode, mla_prefill, merge_attn_states (default all)."),
    ] = None,
    kv_dtype: TuneKvOpt = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    candidates: Annotated[
        bool, typer.Option("--candidates", help="Also compile every config of tune's search space (minutes).")
    ] = False,
    fmt: FormatOpt = None,
    output: OutputOpt = None,
):
    """Compile each kernel's default config for a GPU, no GPU needed: shared memory, registers, spills.

    Uses Triton's compiler and the ptxas it selects for the target. JSON (-f json) is a list of
    {kernel, shape, config, arch, smem_bytes, registers, spill_bytes, stack_bytes, warnings, ...};
    a config that spills or does not fit has "dropped" set to the reason (tune skips it).

    Example: mlactl tune compile --arch sm_90 --kernel mla_decode --kv-dtype fp8 -f json
    """
    from mlactl.cli import emit, output_format
    from mlactl.tune import compile as stage

    arch = choice(arch, "--arch", tuple(stage.ARCHS))
    dtype = choice(dtype, "--dtype", ("bf16", "fp16", "fp32"))
    kv_dtype = dtype if kv_dtype == "auto" else choice(kv_dtype, "--kv-dtype", KV_DTYPES)
    names = list(stage.KERNELS)
    if kernel:
        names = [k.strip() for k in kernel.split(",")]
        unknown = [k for k in names if k not in stage.KERNELS]
        if unknown:
            raise MlactlError(f"--kernel {unknown[0]!r} is unknown; kernels: {', '.join(stage.KERNELS)}")
    fmt = output_format(fmt, output)
    if fmt == "csv":
        raise MlactlError("--format csv is not offered for the compile report; use table or json")
    cfg = load_model(model, tp)
    try:
        results = stage.run_report(cfg, names, arch, dtype, kv_dtype, candidates)
    except (RuntimeError, ImportError) as exc:
        raise MlactlError(str(exc)) from None
    emit(fmt, output, json_data=lambda: results, tables=[stage.table(results)] if fmt == "table" else ())
