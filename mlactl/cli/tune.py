"""`mlactl tune`: measure the kernels, the two paths and the machine; keep every result."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import Progress

from mlactl.cli import complete
from mlactl.cli.common import (
    choice,
    cli_errors,
    command,
    console,
    emit,
    fit_width,
    load_model,
    one_int,
    output_format,
    store_listing,
)
from mlactl.cli.options import SHARED, FormatOpt, ModelOpt, Option, OutputOpt, TpOpt, shared, whole_number
from mlactl.kernels.configs import device_slug
from mlactl.model import hardware
from mlactl.model.shapes import parse_sizes
from mlactl.output import tune_tables
from mlactl.output import tune_tables as report
from mlactl.output.progress import columns_for
from mlactl.results import measured
from mlactl.results import store as results_store
from mlactl.tune import compile as stage
from mlactl.tune import ray_runner, store, sweep
from mlactl.tune import space as spaces
from mlactl.tune.ray_runner import import_ray
from mlactl.util import dirs, safe
from mlactl.util.defaults import ACT_DTYPES, DEFAULT_CHUNK, KV_DTYPES, TUNE_BACKENDS
from mlactl.util.errors import MlactlError
from mlactl.util.io import MAX_CONFIG_BYTES, read_json


def _ray_address_optional(args: list[str]) -> list[str]:
    """`--ray` alone means a local cluster: Typer's parser has no options with an optional
    value, so a bare --ray (last, or before another option or a sub-command) gets "local"."""
    out = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == "--ray":
            following = args[i + 1] if i + 1 < len(args) else None
            if following is None or following.startswith("-") or following in SUBCOMMANDS:
                out.append("local")
    return out


SUBCOMMANDS = ("kernels", "paths", "ceilings", "compile", "list")


class _TuneGroup(typer.core.TyperGroup):
    def parse_args(self, ctx, args):
        return super().parse_args(ctx, _ray_address_optional(args))


tune_app = typer.Typer(
    cls=_TuneGroup,
    invoke_without_command=True,
    no_args_is_help=False,
)

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
# (dtypes or `auto`, completed as such)
TuneKvOpt = Annotated[
    str,
    typer.Option(
        "--kv-dtype", help="Cache dtype: bf16, fp16, fp8, fp32; auto = --dtype.", autocompletion=complete.KV_AUTO
    ),
]
TuneDtypeOpt = Annotated[
    str,
    typer.Option(
        "--dtype", help="bf16, fp16, fp32; auto = bf16 on a GPU, fp32 on a CPU.", autocompletion=complete.AUTO
    ),
]
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
RepeatsOpt = Annotated[
    int,
    typer.Option(
        "--repeats",
        parser=whole_number("--repeats", 0, 100),
        metavar="INT",
        help="Measure an unstable timing (CV over 10%) again up to this many times (0 to 100); the steadiest is kept.",
    ),
]
RayOpt = Annotated[
    Optional[str],
    typer.Option(
        "--ray",
        metavar="[ADDRESS]",
        help="Spread the work over a Ray cluster, one worker per GPU: ADDRESS 'auto' joins the "
        "cluster this node belongs to (ray start), a host:port another one; alone, --ray starts "
        "one on this machine. Needs the extra: pip install -e '.\\[ray]' (see docs/cluster.md).",
    ),
]
WorkersOpt = Annotated[
    Optional[int],
    typer.Option(
        "--workers",
        parser=whole_number("--workers", 1, 4096),
        metavar="INT",
        help="With --ray: N CPU workers (--backend torch or --interpret) instead of GPUs (1 to 4096).",
    ),
]


# The options the tune commands share, each defined once (mlactl.cli.options.shared): what runs
# (model, backend, device, dtypes) and how long and where it keeps what it measured.
TUNE_OPTIONS = {
    "model": SHARED["model"],
    "tp": SHARED["tp"],
    "backend": Option(BackendOpt, "triton"),
    "interpret": Option(InterpretOpt, False),
    "device": Option(DeviceOpt, None),
    "kv_dtype": Option(TuneKvOpt, "auto"),
    "dtype": Option(TuneDtypeOpt, "auto"),
    "quick": Option(QuickOpt, False),
    "budget": Option(BudgetOpt, None),
    "force": Option(ForceOpt, False),
    "results_file": Option(ResultsFileOpt, None),
    "warm": Option(WarmOpt, False),
    "repeats": Option(RepeatsOpt, 2),
    "ray": Option(RayOpt, None),
    "workers": Option(WorkersOpt, None),
}
WHAT_RUNS = ("model", "tp", "backend", "interpret", "device", "kv_dtype", "dtype")
HOW_LONG = ("quick", "budget", "force", "results_file", "warm", "repeats", "ray", "workers")


def tune_options(*names: str, end: tuple[str, ...] = ()):
    """The shared tune options `names` and `end`; the command receives them as one dict, `opts`."""
    return shared(*names, end=end, registry=TUNE_OPTIONS, into=lambda values, given: values)


@dataclass
class Run:
    """A tune invocation: its options, then (set up once for all its sweeps) the model, the
    device, the results store and the sweep context; with `ray` set, the Ray cluster instead of
    a local device, and one store per device type among its workers."""

    model: str = "deepseek-v3"
    tp: str = "1"
    backend: str = "triton"
    interpret: bool = False
    device: Optional[str] = None
    kv_dtype: str = "auto"
    dtype: str = "auto"
    quick: bool = False
    budget: Optional[str] = None
    force: bool = False
    results_file: Optional[Path] = None
    warm: bool = False
    chunk: int = DEFAULT_CHUNK
    run_name: Optional[str] = None
    repeats: int = 2  # re-measurements of a timing whose CV stays over 10%
    ray: Optional[str] = None  # a Ray address; "local" starts a cluster on this machine
    workers: Optional[int] = None  # with ray: this many CPU actors instead of one per GPU

    def __post_init__(self) -> None:
        self.start = time.monotonic()  # the budget counts from here: torch's import and set-up too
        backend = "interpret" if self.interpret else choice(self.backend, "--backend", TUNE_BACKENDS)
        if self.workers is not None and self.ray is None:
            raise MlactlError("--workers counts Ray workers: add --ray (or --ray auto for an existing cluster)")
        if self.ray is not None:
            import_ray()  # without the extra: one line on how to install it, before anything starts
        if backend == "interpret":
            os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton's JIT
        try:
            import torch
        except ImportError:
            raise MlactlError(
                "mlactl tune needs torch and triton: in the mlactl source folder, "
                "pip install torch==2.13.0 && pip install -e '.[kernels]' (README, Quick start)"
            ) from None
        if self.ray is not None:
            self.device_type = self._ray_device(backend)
        else:
            self.device_type = self._local_device(backend, torch)
        on_gpu = self.device_type == "cuda"
        dtype = self.dtype
        dtype = ("bf16" if on_gpu else "fp32") if dtype == "auto" else choice(dtype, "--dtype", ACT_DTYPES)
        kv_dtype = dtype if self.kv_dtype == "auto" else choice(self.kv_dtype, "--kv-dtype", KV_DTYPES)
        if kv_dtype == "fp8" and not hasattr(torch, "float8_e4m3fn"):
            raise MlactlError("--kv-dtype fp8 needs a torch with float8_e4m3fn")
        self.backend, self.dtype, self.kv_dtype = backend, dtype, kv_dtype
        self.cfg = load_model(self.model, self.tp)
        self.budget_s = one_int(self.budget, "--budget") if self.budget else (60 if self.quick else 300)
        self.stores: list = []

        # progress bars (and Ray's messages) on stderr, only where it is a terminal; tables and
        # what the run found on stdout, so `mlactl tune > run.txt` keeps them
        self.console = Console(stderr=True, emoji=False)
        self.out = console()
        self.width = fit_width()  # None: piped or to a file, full values
        self.cluster = None
        if self.ray is None:
            self.store, self.hw = self.open_store(*sweep.environment(self.torch_device, backend))
            self.ctx = self.context(self.store, self.hw, self.torch_device)
            return

        setup = ray_runner.WorkerSetup(
            self.cfg,
            backend,
            kv_dtype,
            dtype,
            self.device_type,
            self.warm,
            self.quick,
            0.02 if self.quick else 0.1,
            self.chunk,
            env={k: os.environ[k] for k in ray_runner.FORWARDED_ENV if k in os.environ},
            repeats=self.repeats,
        )

        def open_device(info, versions, timing):
            store, hw = self.open_store(info, versions, timing)
            return store, self.context(store, hw, None)

        self.cluster = ray_runner.Cluster(self.ray, self.workers, setup, open_device, self.console)
        first = next(iter(self.cluster.devices.values()))
        self.store, self.hw, self.ctx = first.store, first.ctx.hw, first.ctx
        names = ", ".join(f"{s.device} ({s.host})" for s in self.cluster.slots)
        self.say(f"Ray: {len(self.cluster.slots)} workers: {safe.markup(names, 2000)}")

    def _local_device(self, backend: str, torch) -> str:
        if backend == "triton" and not torch.cuda.is_available():
            raise MlactlError(
                "--backend triton needs a CUDA GPU and torch.cuda.is_available() is False; "
                "use --backend torch to time the twins here, or --interpret to test the "
                "pipeline under Triton's interpreter"
            )
        default_device = "cpu" if backend == "interpret" else ("cuda" if torch.cuda.is_available() else "cpu")
        device_name = choice(self.device or default_device, "--device", ("cuda", "cpu"))
        if device_name == "cuda" and not torch.cuda.is_available():
            raise MlactlError("--device cuda: no CUDA GPU is available (torch.cuda.is_available() is False)")
        if backend == "interpret" and device_name != "cpu":
            raise MlactlError("--interpret runs on the CPU; drop --device cuda")
        self.torch_device = torch.device(device_name)
        return device_name

    def _ray_device(self, backend: str) -> str:
        """With --ray: GPU actors (one per GPU), or with --workers N CPU actors."""
        wanted = "cpu" if self.workers else "cuda"
        if self.device is not None and choice(self.device, "--device", ("cuda", "cpu")) != wanted:
            raise MlactlError(
                "with --ray, --workers N runs CPU actors and no --workers one actor per GPU; "
                f"--device {self.device} contradicts that"
            )
        if wanted == "cpu" and backend == "triton":
            raise MlactlError("--workers runs CPU actors: use --backend torch (or --interpret) with it")
        if wanted == "cuda" and backend == "interpret":
            raise MlactlError("--interpret runs on CPUs: add --workers N for CPU actors")
        return wanted

    def open_store(self, info: dict, versions: dict, timing: dict):
        """The results store of one device (the device's own name keys it) and the hardware
        profile to predict with, if any."""

        on_gpu = info["type"] == "cuda"
        timing = dict(timing, l2="warm" if self.warm or not on_gpu else "cold", budget_s=self.budget_s)
        hw = None
        if on_gpu and info["hardware"]:
            hw = hardware.from_name(info["hardware"])
        elif not on_gpu and self.backend != "interpret":  # the interpreter's times predict nothing
            hw = hardware.detect("cpu")  # a profile `mlactl tune ceilings` wrote for this CPU
            hw = hw.with_measured() if hw is not None and hw.measured else None
        if hw is not None and self.dtype not in hw.peak_tflops:
            hw = None  # no ceiling for this dtype: measure without predicting
        path = self.results_file
        if path is not None and self.stores:  # a second device type on the cluster: its own file
            path = path.with_name(f"{path.stem}.{device_slug(info['name'])}{path.suffix}")
        path = path or store.default_path(
            device_slug(info["name"]),
            self.run_name or self.cfg.name,
            self.cfg.tp,
            self.dtype,
            self.kv_dtype,
            self.backend,
        )
        header = results_store.new_header(
            path, info, versions, self.backend, timing, self.cfg.to_dict(), self.kv_dtype, self.dtype, self.chunk
        )
        opened = store.ResultsStore(path, header, force=self.force)
        self.stores.append(opened)
        return opened, hw

    def context(self, store, hw, device):
        return sweep.Context(
            self.cfg,
            device,
            self.backend,
            self.kv_dtype,
            self.dtype,
            store,
            hw,
            warm=self.warm,
            quick=self.quick,
            timing_budget_s=0.02 if self.quick else 0.1,
            repeats=self.repeats,
        )

    def deadline(self, share: float) -> float:
        return self.start + share * self.budget_s

    def progress(self):

        return Progress(
            *columns_for(1),
            console=self.console,
            transient=False,
            disable=not self.console.is_terminal,
        )

    def say(self, text: str) -> None:
        self.out.print(text)

    def finish(self) -> None:
        for opened in self.stores:
            if opened.moved_aside:
                self.say(f"the earlier results were kept as {safe.markup(opened.moved_aside)}")
        if self.ctx.skipped:
            self.say(f"[yellow]skipped ({len(self.ctx.skipped)}):[/]")
            for line in self.ctx.skipped:
                self.say(f"  {safe.markup(line, 2000)}")
        if self.ctx.unstable:
            self.say(
                f"[yellow]{self.ctx.unstable} timing(s) stayed unstable (CV over 10%) after {self.ctx.repeats} "
                "re-measurement(s): marked unstable in the results; a quieter machine or more --repeats[/]"
            )
        if self.backend == "interpret":
            self.say(
                "[yellow]interpreter run: the pipeline was exercised; its times mean nothing "
                "(no tuned configs were written)[/]"
            )
        for opened in self.stores:
            resumed = " (resumed)" if opened.resumed else ""
            self.say(f"results: {safe.markup(opened.path)}{resumed}  ({time.monotonic() - self.start:.0f} s)")
        if self.cluster is not None:
            self.cluster.close()

    def on_ray(self, schedule, *args, **kwargs):
        """Run one scheduler of ray_runner on the cluster with the progress bar; Ctrl-C stops the
        workers and ends the command (the store holds every finished unit)."""
        with self.progress() as progress:
            try:
                found, stats = schedule(self.cluster, *args, progress=progress, **kwargs)
            except KeyboardInterrupt:
                self.cluster.close(kill=True)
                paths = ", ".join(str(s.path) for s in self.stores)
                kept = safe.markup(paths, 2000)
                self.say(f"interrupted: workers stopped; every finished unit is in {kept}; rerun to resume")
                raise typer.Exit(130) from None
        self.ctx.skipped += stats.skipped
        resumed = f", {stats.resumed} already in the store" if stats.resumed else ""
        self.say(
            f"Ray: {stats.units - stats.failed} units done, {stats.failed} failed, {stats.retried} retried"
            f"{resumed} in {stats.wall_s:.1f} s (driver busy {stats.driver_s:.2f} s)"
        )
        return found


def run_ceilings(run: Run) -> None:
    if run.cluster is not None:
        for name, result in run.on_ray(ray_runner.tune_ceilings).items():
            run.say(f"[bold]{safe.markup(name)}[/]")
            run.out.print(report.ceilings_table(result, run.hw, run.width))
        return
    with run.progress() as progress:
        run.ctx.progress = progress
        result = sweep.tune_ceilings(run.ctx)
    run.out.print(report.ceilings_table(result, run.hw, run.width))
    if run.device_type != "cuda" and run.backend != "interpret":
        measured = hardware.detect("cpu").with_measured()  # predict with what was just measured
        if run.ctx.dtype in measured.peak_tflops:
            run.ctx.hw = run.hw = measured
    if result.get("profile"):
        run.say(
            f"measured profile: {safe.markup(result['profile'])} (use it: mlactl analyze --hardware "
            f"{safe.markup(Path(result['profile']).stem)} --measured)"
        )


def run_kernels(run: Run, kernels: Optional[str], space: Optional[Path]) -> None:
    names = None
    if kernels:
        names = [k.strip() for k in kernels.split(",")]
        unknown = [k for k in names if k not in spaces.KERNELS]
        if unknown:
            raise MlactlError(f"--kernel {unknown[0]!r} is unknown; kernels: {', '.join(spaces.KERNELS)}")
    override = None
    if space is not None:
        override = read_json(space, "--space file", limit=MAX_CONFIG_BYTES)
        if not isinstance(override, list) or not all(isinstance(c, dict) for c in override):
            raise MlactlError(f"{space}: --space must hold a JSON list of config objects")
    if run.cluster is not None:
        found = run.on_ray(
            ray_runner.tune_kernels, names or spaces.default_kernels(run.ctx.cfg), override, deadline=run.ctx.deadline
        )
        for name, entries in found.items():
            run.say(f"[bold]{safe.markup(name)}[/]")
            run.out.print(report.kernels_table(entries, run.backend != "interpret", run.width, run.backend))
        return
    with run.progress() as progress:
        run.ctx.progress = progress
        entries = sweep.tune_kernels(run.ctx, names, override)
    run.out.print(report.kernels_table(entries, run.backend != "interpret", run.width, run.backend))


def run_paths(run: Run, batch: Optional[str], new: Optional[str], prefix: Optional[str]) -> None:
    kind = run.device_type
    news = parse_sizes(new or (sweep.QUICK_NEW if run.quick else sweep.DEFAULT_NEW)[kind], "--new")
    prefixes = parse_sizes(
        prefix or (sweep.QUICK_PREFIXES if run.quick else sweep.DEFAULT_PREFIXES)[kind], "--prefix", minimum=0
    )
    batches = parse_sizes(batch or "1", "--batch")
    if run.cluster is not None:
        found = run.on_ray(
            ray_runner.tune_paths, batches, news, prefixes, refine=not run.quick, deadline=run.ctx.deadline
        )
        for name, rows in found.items():
            run.say(f"[bold]{safe.markup(name)}[/]")
            run.out.print(report.paths_table(rows, run.backend != "interpret", run.width))
    else:
        with run.progress() as progress:
            run.ctx.progress = progress
            rows = sweep.tune_paths(run.ctx, batches, news, prefixes, run.chunk, refine=not run.quick)
        run.out.print(report.paths_table(rows, run.backend != "interpret", run.width))
    used = sorted({r["prefix"] for r in rows if r.get("measured_status") in ("found", "never")})
    if run.backend != "interpret" and used:
        cut = sorted({r["prefix"] for r in rows if r["prefix"] not in used})
        where = f" for prefixes {', '.join(map(str, used))}" + (
            f" (not {', '.join(map(str, cut))}: cut or unmeasured; the roofline chooses there)" if cut else ""
        )
        run.say(
            f"the measured policy is in place{where}: mla_attention(path='auto') and mlactl analyze --policy "
            "measured read it, and take the roofline's path more than an octave outside the prefixes measured"
        )


@tune_app.callback()
@cli_errors
@tune_options(*WHAT_RUNS, end=HOW_LONG)
def tune_all(ctx: typer.Context, opts: dict):
    """Run the kernels for real: autotune launch configs, time both paths, measure ceilings.

    With no sub-command: ceilings, then kernel configs, then both paths, in one run and one results file.

    Example: mlactl tune --quick   (on a CUDA GPU; --backend torch on a laptop)

    Example: mlactl tune --ray auto   (every GPU of a Ray cluster; docs/cluster.md)
    """
    if ctx.invoked_subcommand is not None:
        return
    run = Run(**opts)
    run_ceilings(run)
    run.ctx.deadline = run.deadline(0.55)
    run_kernels(run, None, None)
    run.ctx.deadline = run.deadline(1.0)
    run_paths(run, None, None, None)
    run.finish()


@tune_app.command("ceilings")
@cli_errors
@tune_options("device", "quick", "force", "results_file", "ray", "workers")
def tune_ceilings_cmd(opts: dict):
    """Achieved matmul TFLOP/s per dtype and copy bandwidth, written as a measured hardware profile.

    Example: mlactl tune ceilings   (then: mlactl analyze --hardware h200 --measured)
    """
    run = Run(backend="torch", warm=True, run_name="ceilings", **opts)
    run_ceilings(run)
    run.finish()


KernelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--kernel",
        help="Comma-separated: mla_decode, mla_prefill, merge_attn_states, mla_sparse_decode "
        "(default all; mla_sparse_decode only for a DSA model).",
    ),
]


@tune_app.command("kernels")
@cli_errors
@tune_options(*WHAT_RUNS, end=HOW_LONG)
def tune_kernels_cmd(
    opts: dict,
    kernel: KernelOpt = None,
    space: Annotated[
        Optional[Path],
        typer.Option("--space", help="JSON list of configs to try instead of the built-in search space."),
    ] = None,
):
    """Search each kernel's launch space per shape bucket; every candidate checked against its twin.

    Example: mlactl tune kernels --tp 8 --kv-dtype fp8 --kernel mla_decode

    Example: mlactl tune kernels --tp 8 --ray auto   (one worker per GPU of the cluster)
    """
    run = Run(**opts)
    run.ctx.deadline = run.deadline(1.0)
    run_kernels(run, kernel, space)
    run.finish()


@tune_app.command("paths")
@cli_errors
@tune_options(*WHAT_RUNS, end=HOW_LONG)
def tune_paths_cmd(
    opts: dict,
    batch: Annotated[Optional[str], typer.Option("--batch", "-b", help="Batch sizes (default 1).")] = None,
    new: Annotated[
        Optional[str],
        typer.Option("--new", "-n", help="New-token counts (default 1:4096:*2 on a GPU, 1:256:*2 on a CPU)."),
    ] = None,
    prefix: Annotated[
        Optional[str],
        typer.Option("--prefix", "-p", help="Prefixes (default 0,4K,16K,32K on a GPU, 0,256,1K on a CPU)."),
    ] = None,
):
    """Time the whole expand and absorb paths over new-token counts; the measured crossover per prefix.

    Example: mlactl tune paths --backend torch --model teaching --tp 8 --prefix 0,512

    Example: mlactl tune paths --backend torch --model teaching --tp 8 --ray --workers 2
    """
    run = Run(**opts)
    run.ctx.deadline = run.deadline(1.0)
    run_paths(run, batch, new, prefix)
    run.finish()


@command(tune_app, "compile")
def tune_compile_cmd(
    model: ModelOpt = "deepseek-v3",
    tp: TpOpt = "1",
    arch: Annotated[
        str, typer.Option("--arch", help="Target GPU: sm_90 (H100/H200), sm_100 (B200) or sm_80 (A100).")
    ] = "sm_90",
    kernel: KernelOpt = None,
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

    arch = choice(arch, "--arch", tuple(stage.ARCHS))
    dtype = choice(dtype, "--dtype", ("bf16", "fp16", "fp32"))
    kv_dtype = dtype if kv_dtype == "auto" else choice(kv_dtype, "--kv-dtype", KV_DTYPES)
    cfg = load_model(model, tp)
    names = spaces.default_kernels(cfg)
    if kernel:
        names = [k.strip() for k in kernel.split(",")]
        unknown = [k for k in names if k not in stage.KERNELS]
        if unknown:
            raise MlactlError(f"--kernel {unknown[0]!r} is unknown; kernels: {', '.join(stage.KERNELS)}")
    fmt = output_format(fmt, output)
    if fmt == "csv":
        raise MlactlError("--format csv is not offered for the compile report; use table or json")
    try:
        results = stage.run_report(cfg, names, arch, dtype, kv_dtype, candidates)
    except (RuntimeError, ImportError) as exc:
        raise MlactlError(str(exc)) from None
    width = fit_width(output)
    emit(
        fmt,
        output,
        json_data=lambda: results,
        tables=[tune_tables.compile_table(results, width)] if fmt == "table" else (),
    )


ListFormatOpt = Annotated[
    Optional[str],
    typer.Option(
        "--format", "-f", help="table or json (default: from --output's extension, else table).",
        autocompletion=complete.one_of(("table", "json")),
    ),
]  # fmt: skip


@command(tune_app, "list")
def tune_list_cmd(
    folder: Annotated[
        Optional[Path],
        typer.Option("--dir", help="List this folder and those below it (default: $MLACTL_HOME/results/)."),
    ] = None,
    fmt: ListFormatOpt = None,
    output: OutputOpt = None,
):
    """The results files `mlactl tune` left, newest first: when, on what device and hardware profile, with which
    backend, model and dtypes, and how much each measured (kernel buckets, path points, crossovers, ceilings).

    A file that cannot be read is listed with why. `mlactl calibrate --from results FILE`, `plot` and
    `analyze --policy measured --results FILE` take these files.

    Example: mlactl tune list --format json
    """

    fmt, where, none = store_listing(
        "mlactl tune list", fmt, output, folder, dirs.results_dir(), "results", "mlactl tune"
    )
    found = measured.runs(where)
    tables = [report.runs_table(where, found, fit_width(output)) if any(r.data is not None for r in found) else none]
    emit(
        fmt, output, json_data=lambda: measured.runs_json(where, found), tables=tables + report.unreadable_lines(found)
    )
