"""Micro-benchmarks behind `meshplan profile-cluster`: compute, memory, collectives, and the torchrun launcher.

Everything here imports torch; the planner never imports this package.
"""
