"""`mlactl tune --ray`: the Ray scheduler over `units.measure_unit`.

One actor per GPU (num_gpus=1), or with `--workers N` N CPU actors (num_cpus=1). The driver keeps
a queue of units per device type and hands the next one to whichever worker of that type is
idle (dynamic, so a slow bucket never holds up the rest). Each result comes back as store
entries that the driver merges into that device type's ResultsStore, the one source of truth,
which is saved (atomically, under its lock) after every unit: a driver killed at any point
loses only the units in flight, and a rerun of the same command skips what the store holds.

Faults: a worker that dies (kill -9, out of memory) or runs a unit past `unit_timeout_s` (it is
killed) loses only its in-flight unit. Ray restarts the actor; the unit goes back to the queue,
preferring another worker, up to `retries` more times, then is recorded as failed with the
reason. Actors live for the whole run, so each compiles a config once and reuses its in-memory
and on-disk Triton caches. Ray itself is imported only here, and only when `--ray` is given.
"""

from __future__ import annotations

import collections
import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any

from mlactl.model.cost import CostModel
from mlactl.tune import ceilings, sweep
from mlactl.tune import space as spaces
from mlactl.tune import store as store_mod
from mlactl.tune.sweep import (
    REFINE_STEPS,
    _paths_at,
    _update_best,
    crossover_row,
    next_refine_point,
    store_crossovers,
    write_best_config,
)
from mlactl.tune.units import Unit, UnitStore, is_done, kernel_units, measure_unit, seed_for
from mlactl.util.errors import MlactlError

INSTALL_HINT = "--ray needs Ray, an optional extra: pip install -e '.[ray]' (or pip install 'mlactl[ray]')"
RETRIES = 2  # a unit lost with its worker runs at most 1 + RETRIES times
UNIT_TIMEOUT_S = 600.0  # a unit still running after this is taken to hang: its worker is killed
START_TIMEOUT_S = 300.0  # workers not up by then: the cluster lacks the resources asked for
RESTART_TIMEOUT_S = 60.0  # a lost worker not back by then (Ray restarts it) is given no more units
RETIRE_AFTER = 3  # a worker whose last 3 units were all lost is given no more
# environment a worker needs to see as the driver does (Ray copies none of it to other nodes)
FORWARDED_ENV = ("MLACTL_HOME", "MLACTL_TUNED_DIR", "TRITON_INTERPRET", "TRITON_CACHE_DIR")


def import_ray():
    try:
        import ray
    except ImportError:
        raise MlactlError(INSTALL_HINT) from None
    return ray


@dataclass
class WorkerSetup:
    """What a worker builds its sweep.Context from (sent once, at start)."""

    cfg: Any  # MLAConfig
    backend: str
    kv_dtype: str
    dtype: str
    device_type: str  # "cuda" (one GPU per actor) or "cpu"
    warm: bool
    quick: bool
    timing_budget_s: float
    chunk: int
    env: dict = field(default_factory=dict)
    repeats: int = 2  # re-measurements of an unstable timing, as --repeats


class Worker:
    """A Ray actor's body: one device, one process, for the whole run."""

    def __init__(self, setup: WorkerSetup):
        os.environ.update(setup.env)  # before torch or triton is imported in this process
        import torch  # (nothing this module imports at its top loads either: mlactl.tune.inputs)

        if setup.device_type == "cpu":
            torch.set_num_threads(1)  # one core per actor (num_cpus=1); more would fight its neighbours
        self.setup = setup
        self.device = torch.device("cuda" if setup.device_type == "cuda" else "cpu")
        self.info, self.versions, self.timing = sweep.environment(self.device, setup.backend)

    def hello(self) -> dict:
        return {
            "pid": os.getpid(),
            "host": platform.node(),
            "info": self.info,
            "versions": self.versions,
            "timing": self.timing,
        }

    def measure(self, unit: Unit, seed: list, hw, header: dict, left_s: float, override=None) -> dict:
        s = self.setup
        ctx = sweep.Context(
            s.cfg,
            self.device,
            s.backend,
            s.kv_dtype,
            s.dtype,
            UnitStore(header, seed),
            hw,
            warm=s.warm,
            quick=s.quick,
            deadline=time.monotonic() + left_s,
            timing_budget_s=s.timing_budget_s,
            repeats=s.repeats,
        )
        start = time.monotonic()
        out = measure_unit(ctx, unit, s.chunk, override)
        out["worker_s"] = time.monotonic() - start
        return out


@dataclass
class Slot:
    """The driver's view of one actor."""

    index: int
    actor: Any  # a Ray ActorHandle of Worker
    pid: int = 0
    host: str = ""
    device: str = ""  # the device name its results are keyed by
    done: int = 0
    failed: int = 0  # units lost while on this worker (each retried elsewhere or recorded)
    lost_in_a_row: int = 0
    busy: tuple | None = None  # (unit, start time, attempt, workers that lost it before)
    probing: float = 0.0  # lost a unit: since when it is asked whether it is back (0: it is not)
    reprobe_at: float = 0.0  # still restarting: ask again then
    retired: bool = False


@dataclass
class Device:
    """Everything of one device type: its store, a driver-side Context for crossover rows and
    tuned-config files, its queue of (unit, attempt, workers that lost it)."""

    name: str
    store: Any  # ResultsStore
    ctx: Any  # sweep.Context without a device
    header: dict
    queue: collections.deque = field(default_factory=collections.deque)


@dataclass
class Stats:
    units: int = 0  # finished, ok or recorded failed
    failed: int = 0  # recorded failed after every retry
    retried: int = 0
    resumed: int = 0  # skipped: already in the store
    wall_s: float = 0.0
    driver_s: float = 0.0  # time the driver spent on dispatch and merging (not waiting)
    worker_s: float = 0.0  # time workers spent measuring
    skipped: list[str] = field(default_factory=list)


class Cluster:
    """Actors on a Ray cluster and a loop that feeds them units.

    `open_device(info, versions, timing) -> (store, ctx)` is called once per device type seen
    among the workers; `on_done(device, unit, out)` after each unit (out: what the worker
    returned, {} for a unit the store already held, None for one that failed or was cut), and
    may `enqueue` more.
    """

    def __init__(self, address: str, workers: int | None, setup: WorkerSetup, open_device, console=None):
        self.ray = ray = import_ray()
        self.started = False
        if not ray.is_initialized():
            kwargs: dict = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            if address in ("", "local"):
                if workers:  # a local cluster of exactly the CPUs asked for
                    kwargs["num_cpus"] = workers
            else:
                kwargs["address"] = address
            try:
                ray.init(**kwargs)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise MlactlError(f"--ray {address or 'local'}: cannot reach a Ray cluster: {exc}") from None
            self.started = True
        self.setup = setup
        self.console = console
        try:
            self.slots = self._start(workers, setup)
            self.devices: dict[str, Device] = {}
            for slot in self.slots:
                if slot.device not in self.devices:
                    hello = self._hello[slot.index]
                    store, ctx = open_device(hello["info"], hello["versions"], hello["timing"])
                    self.devices[slot.device] = Device(slot.device, store, ctx, dict(store.data))
        except BaseException:
            self.close(kill=True)
            raise

    def _start(self, workers: int | None, setup: WorkerSetup) -> list[Slot]:
        ray = self.ray
        if workers:
            resources = {"num_cpus": 1}
            count = workers
        else:
            count = int(ray.cluster_resources().get("GPU", 0))
            resources = {"num_gpus": 1}
            if count == 0:
                raise MlactlError("the Ray cluster has no GPUs; for CPU actors use --backend torch --ray --workers N")
        # max_restarts=-1: Ray brings a killed actor back; its unit is retried by the driver
        cls = ray.remote(max_restarts=-1, max_task_retries=0, **resources)(Worker)
        slots = self.slots = [Slot(i, cls.remote(setup)) for i in range(count)]  # for close() on errors
        try:
            hellos = ray.get([s.actor.hello.remote() for s in slots], timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise MlactlError(
                f"{count} Ray workers did not start within {START_TIMEOUT_S:.0f} s "
                f"(the cluster has {ray.cluster_resources()}); ask for fewer --workers"
            ) from None
        except ray.exceptions.RayError as exc:
            raise MlactlError(f"a Ray worker failed to start: {_reason(exc)}") from None
        self._hello = hellos
        for slot, hello in zip(slots, hellos):
            slot.pid, slot.host, slot.device = hello["pid"], hello["host"], hello["info"]["name"]
        return slots

    # -- the loop --------------------------------------------------------------------------------

    def enqueue(self, device: str, unit: Unit, attempt: int = 0, lost_on: frozenset = frozenset()) -> None:
        self.devices[device].queue.append((unit, attempt, lost_on))
        self.total += 1

    def run(
        self,
        units: list[Unit],
        on_done,
        deadline: float = math.inf,
        override=None,
        retries: int = RETRIES,
        unit_timeout_s: float = UNIT_TIMEOUT_S,
        progress=None,
        on_dispatch=None,
    ) -> Stats:
        """Every unit on every device type; returns counts. Ctrl-C: workers are killed, the store
        keeps every finished unit, and KeyboardInterrupt goes on up."""
        ray = self.ray
        stats = Stats()
        self.total = 0
        start = time.monotonic()
        for device in self.devices:
            for unit in units:
                self.enqueue(device, unit)
        in_flight: dict = {}  # ObjectRef -> slot
        probes: set = set()  # the refs in in_flight that ask a worker whether it is back, not a unit

        def probe(slot) -> None:
            ref = slot.actor.hello.remote()
            in_flight[ref] = slot
            probes.add(ref)

        for slot in self.slots:  # lost a unit in an earlier run() and not yet heard from
            if slot.probing and not slot.retired:
                probe(slot)
        timed_out: dict[int, str] = {}  # slot index -> why it was killed
        bar = _Bar(progress, self)
        try:
            while True:
                busy_since = time.monotonic()
                for slot in self.slots:
                    if slot.reprobe_at and busy_since >= slot.reprobe_at:
                        slot.reprobe_at = 0.0
                        probe(slot)
                    if slot.busy is None and not slot.probing and not slot.retired:
                        ref = self._dispatch(slot, stats, deadline, override, on_done, on_dispatch)
                        if ref is not None:
                            in_flight[ref] = slot
                self._drop_orphans(stats, retries)
                stats.driver_s += time.monotonic() - busy_since
                if not any(s.busy for s in in_flight.values()):  # only restarts, if anything, in flight
                    if not any(d.queue for d in self.devices.values()):
                        break
                    if not in_flight:
                        time.sleep(0.05)  # restarting workers to ask again, or work just added
                        continue
                bar.show(stats, start)
                # wake at least twice a second for the bar, and in time for the next unit timeout
                soonest = min((s.busy[1] + unit_timeout_s for s in in_flight.values() if s.busy), default=math.inf)
                wait_s = min(0.5, max(0.0, soonest - time.monotonic()))
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=wait_s)
                busy_since = time.monotonic()
                for ref in ready:
                    slot = in_flight.pop(ref)
                    if ref in probes:  # a worker that lost its unit: back (restarted by Ray) or not
                        probes.discard(ref)
                        if not slot.probing:  # an earlier probe already heard it: never read as a unit
                            continue
                        try:
                            hello = ray.get(ref)
                            slot.pid, slot.host, slot.probing = hello["pid"], hello["host"], 0.0
                        except ray.exceptions.ActorUnavailableError:
                            slot.reprobe_at = time.monotonic() + 0.5  # being restarted: ask again soon
                        except ray.exceptions.RayError as exc:
                            slot.lost_in_a_row += 1
                            if slot.lost_in_a_row >= RETIRE_AFTER:
                                slot.retired, slot.probing = True, 0.0
                                stats.skipped.append(f"worker {slot.index} ({slot.host}) retired: {_reason(exc)}")
                            else:
                                probe(slot)
                        continue
                    unit, _, attempt, lost_on = slot.busy
                    slot.busy = None
                    try:
                        out = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        reason = timed_out.pop(slot.index, None) or _reason(exc)
                        slot.failed += 1
                        slot.lost_in_a_row += 1
                        if slot.lost_in_a_row >= RETIRE_AFTER:
                            slot.retired = True
                            stats.skipped.append(f"worker {slot.index} ({slot.host}) retired: {reason}")
                        else:  # no new unit until it answers: one sent now could die with the old process
                            slot.probing = time.monotonic()
                            probe(slot)
                        if attempt < retries:
                            stats.retried += 1
                            self.devices[slot.device].queue.appendleft((unit, attempt + 1, lost_on | {slot.index}))
                        else:
                            self._record_failure(slot.device, unit, f"{reason} ({attempt + 1} attempts)")
                            stats.units += 1
                            stats.failed += 1
                            on_done(self.devices[slot.device], unit, None)
                        continue
                    slot.done += 1
                    slot.lost_in_a_row = 0
                    stats.worker_s += out.get("worker_s", 0.0)
                    self._merge(slot.device, out)
                    stats.skipped += out["skipped"]
                    stats.units += 1
                    on_done(self.devices[slot.device], unit, out)
                now = time.monotonic()
                for ref, slot in list(in_flight.items()):  # a worker that does not come back: retired
                    if slot.probing and now - slot.probing > RESTART_TIMEOUT_S:
                        del in_flight[ref]
                        probes.discard(ref)
                        slot.reprobe_at = 0.0
                        slot.retired, slot.probing = True, 0.0
                        stats.skipped.append(f"worker {slot.index} ({slot.host}) retired: not back after restart")
                for slot in in_flight.values():  # a hung kernel: kill the worker, retry the unit
                    if slot.busy and now - slot.busy[1] > unit_timeout_s and slot.index not in timed_out:
                        timed_out[slot.index] = f"timed out after {unit_timeout_s:g} s"
                        ray.kill(slot.actor, no_restart=False)
                stats.driver_s += time.monotonic() - busy_since
        except KeyboardInterrupt:
            self.close(kill=True)
            raise
        finally:
            stats.wall_s = time.monotonic() - start
            bar.show(stats, start, final=True)
        return stats

    def _dispatch(self, slot: Slot, stats: Stats, deadline, override, on_done, on_dispatch):
        device = self.devices[slot.device]
        while device.queue:
            # the first unit this worker has not lost; one it lost waits for another live worker
            pick = next((i for i, q in enumerate(device.queue) if slot.index not in q[2]), None)
            if pick is None:
                others = [
                    s for s in self.slots if s.device == slot.device and not (s.retired or s.probing) and s is not slot
                ]
                if any(s.index not in device.queue[0][2] for s in others):
                    return None
                pick = 0
            unit, attempt, lost_on = device.queue[pick]
            del device.queue[pick]
            if attempt == 0 and is_done(device.store, unit, self.setup.backend, self.setup.chunk):
                stats.resumed += 1
                stats.units += 1
                on_done(device, unit, {})
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                stats.skipped.append(f"{unit.label()} on {device.name}: time budget spent")
                stats.units += 1
                on_done(device, unit, None)
                continue
            seed = seed_for(device.store, unit, self.setup.chunk)
            slot.busy = (unit, time.monotonic(), attempt, lost_on)
            ref = slot.actor.measure.remote(unit, seed, device.ctx.hw, device.header, left, override)
            if on_dispatch is not None:  # tests: a fault injected while the unit is in flight
                on_dispatch(slot, unit)
            return ref
        return None

    def _drop_orphans(self, stats: Stats, retries: int) -> None:
        """Units of a device type whose every worker was retired are recorded failed."""
        for device in self.devices.values():
            alive = [s for s in self.slots if s.device == device.name and not s.retired]
            while device.queue and not alive:
                unit = device.queue.popleft()[0]
                self._record_failure(device.name, unit, "no live worker left for this device")
                stats.units += 1
                stats.failed += 1

    def _merge(self, device: str, out: dict) -> None:
        store = self.devices[device].store
        for section, entry in out["entries"]:
            if section == "kernels":  # the bucket's best over every part, not just this one
                found = store.find("kernels", kernel=entry["kernel"], bucket=entry["bucket"])
                entry = store_mod._merge_kernel(entry, found) if found else entry
                _update_best(entry)
            store.add(section, entry)

    def _record_failure(self, device: str, unit: Unit, reason: str) -> None:
        """A unit lost with every worker it ran on: kept in the store as failed, with why."""
        store = self.devices[device].store
        if unit.section == "paths":
            for path in _paths_at(unit.prefix, self.setup.chunk):
                if store.find("paths", batch=unit.batch, new=unit.new, prefix=unit.prefix, path=path) is None:
                    row = {"batch": unit.batch, "new": unit.new, "prefix": unit.prefix, "path": path}
                    store.add("paths", dict(row, status="failed", reason=f"worker lost: {reason}", median_s=None))
        elif unit.section == "kernels":
            entry = store.find("kernels", kernel=unit.kernel, bucket=unit.bucket)
            entry = dict(entry) if entry else {"kernel": unit.kernel, "bucket": unit.bucket, "shape": unit.shape}
            entry.setdefault("configs", [])
            entry["failed_units"] = [*entry.get("failed_units", []), {"unit": unit.label(), "reason": reason}]
            store.add("kernels", entry)
        else:
            store.set_ceilings({"failed": reason})

    def close(self, kill: bool = False) -> None:
        """Stop the workers (they hold their GPUs or CPUs until then) and a cluster this run
        started; `kill` says the run was cut short (the same thing is done either way)."""
        ray = self.ray
        for slot in getattr(self, "slots", []):
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # noqa: BLE001 — already gone: nothing to stop
                pass
        self.slots = []
        if self.started:
            ray.shutdown()
            self.started = False


def _reason(exc: BaseException) -> str:
    """One line for why a unit was lost."""
    name = type(exc).__name__
    if "OutOfMemory" in name:
        return "out of memory (Ray's memory monitor killed the worker)"
    if "ActorDied" in name or "ActorError" in name or "WorkerCrashed" in name:
        return "worker died (killed, or its process crashed)"
    cause = getattr(exc, "cause", None)
    text = f"{type(cause).__name__}: {cause}" if cause is not None else f"{name}: {exc}"
    return text.strip().splitlines()[0][:300]


class _Bar:
    """The cluster's progress: one line for all units with the ETA, one per worker."""

    def __init__(self, progress, cluster: Cluster):
        self.progress, self.cluster = progress, cluster
        if progress is None:
            return
        self.total = progress.add_task("units (done+failed / queued)", total=None)
        self.rows = {s.index: progress.add_task(f"worker {s.index}", total=None) for s in cluster.slots}

    def show(self, stats: Stats, start: float, final: bool = False) -> None:
        if self.progress is None:
            return
        done = stats.units
        self.progress.update(
            self.total,
            total=max(self.cluster.total, done),
            completed=done,
            description=f"units: {done - stats.failed} done, {stats.failed} failed, {stats.retried} retried",
        )
        for s in self.cluster.slots:
            state = "retired" if s.retired else ("1 in flight: " + s.busy[0].label() if s.busy else "idle")
            state = "restarting" if s.probing else state
            self.progress.update(
                self.rows[s.index],
                total=s.done + s.failed + (1 if s.busy else 0),
                completed=s.done + s.failed,
                description=f"  worker {s.index} {s.device} {s.host}:{s.pid}  {s.done} done, {s.failed} lost, {state}",
            )


# -- the three measurements, scheduled on the cluster ---------------------------------------------

MAX_PARTS = 8  # a bucket's launch space is cut into at most this many units (one per worker)


def tune_kernels(cluster: Cluster, names, override=None, deadline: float = math.inf, **run_kw):
    """Every bucket of every kernel on every device type; best configs into each type's
    tuned-config file. Returns ({device: [kernel entries]}, Stats)."""
    s = cluster.setup
    parts = 1 if s.backend == "torch" else max(1, min(MAX_PARTS, len(cluster.slots)))
    if override is not None:
        parts = max(1, min(parts, len(override)))
    units = kernel_units(s.cfg, names, s.quick, s.device_type, parts)
    pending = {d: collections.Counter((u.kernel, u.bucket) for u in units) for d in cluster.devices}
    lost: dict[str, set] = {d: set() for d in cluster.devices}
    found: dict[str, list[dict]] = {d: [] for d in cluster.devices}

    def finish(device: Device, unit: Unit) -> None:
        entry = device.store.find("kernels", kernel=unit.kernel, bucket=unit.bucket)
        if entry is None:
            return
        found[device.name].append(entry)
        if (unit.kernel, unit.bucket) not in lost[device.name]:
            file_dtype = spaces.KERNELS[unit.kernel].dtype_name(s.kv_dtype, s.dtype)
            write_best_config(device.ctx, unit.kernel, file_dtype, unit.bucket, entry)

    def on_done(device: Device, unit: Unit, out) -> None:
        key = (unit.kernel, unit.bucket)
        if unit.part < 0:
            finish(device, unit)
            return
        if out is None:
            lost[device.name].add(key)
        pending[device.name][key] -= 1
        if pending[device.name][key] > 0:
            return
        entry = device.store.find("kernels", kernel=unit.kernel, bucket=unit.bucket) or {}
        if (
            unit.kernel == "mla_decode"
            and s.backend != "torch"
            and override is None
            and key not in lost[device.name]
            and entry.get("best")
        ):  # the second stage, split-KV factors over the best tile, as in the serial run
            cluster.enqueue(device.name, Unit("kernels", unit.kernel, unit.bucket, unit.shape_json, -1, parts))
        else:
            finish(device, unit)

    stats = cluster.run(units, on_done, deadline=deadline, override=override, **run_kw)
    return found, stats


def _times(store, b: int, n: int, p: int, chunk: int) -> dict[str, float]:
    rows = [store.find("paths", batch=b, new=n, prefix=p, path=path) for path in _paths_at(p, chunk)]
    return {r["path"]: r["median_s"] for r in rows if r is not None and r.get("status") == "ok"}


@dataclass
class _Group:
    """The points of one (batch, prefix) on one device type: those not back yet, those measured
    (the grid, then the bisection's), and how many bisection steps were taken."""

    pending: set
    news: list
    steps: int = 0


def tune_paths(cluster: Cluster, batches, news, prefixes, refine: bool = True, deadline: float = math.inf, **run_kw):
    """Both paths at every point on every device type, the crossover bisected as in the serial
    run once a (batch, prefix) has all its points. Returns ({device: [crossover rows]}, Stats)."""
    s = cluster.setup
    cost = CostModel(s.cfg, kv_dtype=s.kv_dtype, dtype=s.dtype, chunk=s.chunk)
    units = [Unit("paths", batch=b, new=n, prefix=p) for b in batches for p in prefixes for n in news]
    groups = {d: {(b, p): _Group(set(news), list(news)) for b in batches for p in prefixes} for d in cluster.devices}
    rows: dict[str, list[dict]] = {d: [] for d in cluster.devices}

    def on_done(device: Device, unit: Unit, out) -> None:
        b, n, p = unit.batch, unit.new, unit.prefix
        group = groups[device.name][(b, p)]
        group.pending.discard(n)
        if (
            out is None
            and not _times(device.store, b, n, p, s.chunk)
            and device.store.find("paths", batch=b, new=n, prefix=p, path="expand") is None
        ):
            group.news.remove(n)  # cut by the budget: not measured, as in the serial run
        if group.pending:
            return
        times = {m: _times(device.store, b, m, p, s.chunk) for m in group.news}
        if refine and group.steps < REFINE_STEPS and time.monotonic() < deadline:
            mid = next_refine_point(times)
            if mid is not None:
                group.steps += 1
                group.news.append(mid)
                group.pending.add(mid)
                cluster.enqueue(device.name, Unit("paths", batch=b, new=mid, prefix=p))
                return
        cut = any(m not in group.news for m in news)  # points the budget left unmeasured
        rows[device.name].append(crossover_row(device.ctx, cost, b, p, times, cut))
        store_crossovers(device.ctx, rows[device.name])

    stats = cluster.run(units, on_done, deadline=deadline, **run_kw)
    return rows, stats


def tune_ceilings(cluster: Cluster, write_profile: bool = True, **run_kw):
    """The ceilings of each device type, measured on one of its workers; a measured hardware
    profile per type. Returns ({device: ceilings}, Stats)."""

    found: dict[str, dict] = {}

    def on_done(device: Device, unit: Unit, out) -> None:
        if out == {}:  # resumed
            found[device.name] = device.store.data["ceilings"]
        elif out and out.get("ceilings"):
            result = dict(out["ceilings"])
            if write_profile and cluster.setup.backend != "interpret":
                result["profile"] = str(ceilings.write_measured_profile(device.name, result))
            device.store.set_ceilings(result)
            found[device.name] = result

    stats = cluster.run([Unit("ceilings")], on_done, **run_kw)
    return found, stats
