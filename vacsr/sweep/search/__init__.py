"""One dataset's search: Tune + Optuna over trials, ASHA, and which trial is selected."""
