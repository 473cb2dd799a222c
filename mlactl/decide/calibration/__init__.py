"""Calibrated time: cost.py's FLOPs and bytes mapped to measured time, per op class.

model.py    the time of one op class: t_fixed + roofline with fitted efficiencies + the terms
            the data earns (tile padding, waves, split-KV as FA3 picks it, serial KV-block latency,
            a pass over the cache)
fit.py      robust fit in relative error; k-fold held-out error
selection.py  the term sets a fit tries per op class, and the one kept (fit_groups, select)
sources     aiconfigurator.py (NVIDIA's measured tables), sources.py (tune results, CSV)
paired.py   whole paths timed side by side, fitted together without each shape's drift
store.py    calibration files under $MLACTL_HOME/calibrations/
time.py     THE time function every printed time goes through (roofline or calibrated)

Importing this package imports none of its modules: an analysis without a calibration loads
only what it prices with (time.py, estimate.py, store.py), never the fitting. Nothing here
imports scipy (only fitting does) nor torch.
"""
