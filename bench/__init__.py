"""liyagent's bench (`make bench`, `python -m bench`): every figure of issue 12 side by side,
against the targets. What each figure means and how it is counted: bench/README.md and the
docstring of each section's module (throughput, counts, sweep_scale, kill_trials)."""
