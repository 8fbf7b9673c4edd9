"""One dataset's search: Tune + Optuna over trials, ASHA, which trial is selected, and what a
full disk or a tracking outage leaves to repair."""
