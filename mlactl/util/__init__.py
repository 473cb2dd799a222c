"""Layer 0, utilities: errors, safe file I/O, limits, schema checks, folders, defaults.

Imports nothing of mlactl's other layers; every other layer may import it.
"""
