import os
import sys

from meshplan.cli import main

code = main()
if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
    # A torchrun worker ends here, its process group destroyed and its files written: skip the
    # interpreter's finalisation, where a gloo worker that has used torch.profiler aborts now and
    # then ("terminate called without an active exception", about 1 run in 50 on a loaded 2-core
    # machine, torch 2.13), which torchrun would report as a failed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
raise SystemExit(code)
