"""Layer 3, decisions: which path a batch runs and what a choice costs.

engines.py     the inference engines' own path rules, cited to their sources
policy.py      path policies (roofline, flops, measured, an engine's rule, auto)
workload.py    what each engine's rule loses on a workload; threshold sweeps
analysis.py    `mlactl analyze` as a library call: a grid or a batch, every path timed
requests.py    reading a mixed batch of requests
calibration/   time fitted to measurements (cost -> time), and the one time function
"""
