"""MLA attention kernels (Triton) and their plain-torch twins, importable as mlactl.kernels."""
