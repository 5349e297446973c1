"""meshplan: find the fastest parallel layout for training a transformer on a cluster, then run it."""

__version__ = "0.1.0"
