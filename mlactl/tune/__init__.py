"""Measuring kernels, paths and ceilings on a device, and keeping the results.

No module here imports torch or triton at its top: they load when a measurement runs (inputs
are made, a kernel is launched), so `mlactl tune` can say in one line that torch is missing, and
a Ray worker sets its environment (TRITON_INTERPRET) before either loads. `mlactl analyze`
imports none of this package."""
