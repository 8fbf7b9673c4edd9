"""Sweeps: Ray Tune + Optuna searches of Ray Train runs, recorded in MLflow."""
