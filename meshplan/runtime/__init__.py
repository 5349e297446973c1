"""Runtime: execute a plan with native PyTorch distributed APIs (torchrun, DeviceMesh, FSDP2, TP/SP,
pipelining, CP, selective AC, torchao float8, DCP). See command.py for the entry point."""
