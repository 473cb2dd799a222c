"""Measuring kernels and paths on a device. torch is imported lazily inside."""
