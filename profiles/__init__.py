"""Shipped data: hardware profiles (hardware/*.toml). Tuned kernel configs are not shipped until
measured on the GPUs they name; `mlactl tune` writes them to the user folder (kernels/configs.py)."""
