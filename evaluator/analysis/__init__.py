"""Analyses: the main study (metrics, stats, worked examples), scaling and routing. Each computes typed
results from typed records; none imports `evaluator.render`."""
