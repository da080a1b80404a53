"""The job reduce: summaries and collective rows -> clock alignment, collective matching,
wait, stragglers, the job waterfall."""
