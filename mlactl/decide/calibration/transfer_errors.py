"""The transfer error model: written by benchmarks/bench_transfer.py, not by hand.

ERRORS["<op class>/<same|cross>"] = {"n": points, "pairs": [...], "quantiles": [log(measured /
predicted) at uncertainty.LEVELS]}: fits carried between the GPUs aiconfigurator has tables for
(MODEL["gpus"]), "same" where source and target share an architecture; "*/<crossing>" pools
every op class. Empty until the benchmark has run: a transferred fit then keeps its own interval.
"""

MODEL: dict = {"gpus": [], "levels": [], "written_by": "benchmarks/bench_transfer.py"}
ERRORS: dict = {}
