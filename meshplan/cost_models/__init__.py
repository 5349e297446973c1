"""The cost model: FLOPs, compute time, memory, communication and pipeline schedules -> Estimate.

Pure Python/NumPy; never imports torch, so `meshplan plan` stays fast anywhere.
"""
