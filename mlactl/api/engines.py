"""`mlactl.engine_loss`: what each engine's rule loses on a workload."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mlactl.api.common import Result, Settings, Sizes, _engines, _setup, sizes
from mlactl.decide import workload as workload_mod
from mlactl.decide.engines import context_for, default_selection, parse_engines
from mlactl.decide.setup import Setup
from mlactl.decide.workload import WorkloadReport
from mlactl.model.shapes import grid
from mlactl.output import engines as engines_out
from mlactl.util import progress
from mlactl.util.errors import MlactlError

if TYPE_CHECKING:
    from typing_extensions import Unpack


def engine_loss(
    model: str | None = None,
    hardware: str | None = None,
    *,
    workload: str | Path | None = None,
    batch: Sizes = 1,
    new: Sizes = "1,16,64,256,1024,4096",
    prefix: Sizes = "0,1K,4K,8K,16K,32K",
    fmt: str | None = None,
    setup: Setup | None = None,
    **given: Unpack[Settings],
) -> Result[WorkloadReport]:
    """`mlactl engines`: what each engine's own rule loses against the best path on a workload
    (a CSV of batch, new, prefix, weight; or the grid of `batch`, `new`, `prefix`), where it
    loses most, and the threshold that would lose least, under the `Settings`. `value` is a
    workload report whose `engines` hold each rule's time, loss and their intervals."""
    s = _setup("engine_loss", model, hardware, given, setup=setup)
    names, options = _engines(given)
    if names is None:  # the shorthands fix a dense backend: a DSA model's default is the two engines
        names = ",".join(default_selection(s.cfg))
    chosen = parse_engines(names, options, context_for(s.cfg, s.hw, s.kv_dtype))
    if workload is not None:
        wl = workload_mod.read_workload(Path(workload))
    else:
        b, n, p = grid(sizes(batch, "--batch"), sizes(new, "--new"), prefix=sizes(prefix, "--prefix", 0))
        wl = workload_mod.grid_workload(b, n, p)
    if len(wl) > 1_000_000:
        raise MlactlError(f"{len(wl)} shapes; at most 1,000,000 at once")
    with progress.task(f"costing {len(wl):,} shapes on every engine's rule"):
        result = workload_mod.report(s.cost(), s.hw, wl, chosen, calibration=s.calibration)
    return Result(result, s, lambda: engines_out.to_json(result), lambda fh: engines_out.write_csv(fh, result))
