"""mlactl: expand or absorb? Cost model, kernels and tuner for Multi-head Latent Attention."""

__version__ = "0.1.0"
