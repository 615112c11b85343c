"""Run reports: metrics on disk (metrics.jsonl, TensorBoard event files) and `psrl report` plots."""
