"""From flags to a checked SweepPlan, before Ray starts; the sweep folder's layout and owner."""
