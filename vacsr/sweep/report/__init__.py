"""What a sweep reports: its final table, `vacsr best`, the sensitivity analysis, progress."""
