"""Layer 1, the model: MLA shapes (config), hardware profiles, workload shapes, the cost of every
op (cost.py, the one source of FLOPs and bytes) and its roofline time.

`mlactl.model.MLAConfig`, `from_name`, `resolve` and the presets are re-exported from
`mlactl.model.config`, where they were before the package had layers.
"""

from mlactl.model.config import ALIASES, HF_FIELDS, PRESETS, MLAConfig, from_hf_config, from_name, preset_names, resolve

__all__ = ["ALIASES", "HF_FIELDS", "PRESETS", "MLAConfig", "from_hf_config", "from_name", "preset_names", "resolve"]
