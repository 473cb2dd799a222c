"""Layer 5, output: what a user reads. Rich tables fitted to the terminal, the JSON schema and
its CSV flattening, and the charts (plot/, one module a chart). Nothing here computes a figure.
"""
