"""The model layer: the seams every other layer shares (the event and collective schemas,
TraceMeta, the per-rank summary, the report contract, GPU peaks, kernel classes, errors).
Imports polars and the standard library only."""
