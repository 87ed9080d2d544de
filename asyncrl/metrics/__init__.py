"""Metrics: trackers (JSONL always, TensorBoard optionally), plots and the run report."""
