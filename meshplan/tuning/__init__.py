"""Measured search: an Optuna study that runs candidate plans (planner first) and keeps the best measured."""
