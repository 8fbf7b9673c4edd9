"""The final phase: the selected config re-run on every seed, then its test evaluations."""
