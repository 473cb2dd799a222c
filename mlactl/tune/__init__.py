"""Measuring kernels, paths and ceilings on a device, and keeping the results.

store, report, timing, ceilings and common import no torch at module level; inputs, space and
sweep do, so `mlactl tune` imports them only once it runs (never `mlactl analyze`)."""
