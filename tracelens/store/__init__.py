"""The store layer: discovery (paths -> trace files, ranks), the parse cache, atomic writes,
the job's config file, and the Job (per-rank handles and their lazy window scans)."""
