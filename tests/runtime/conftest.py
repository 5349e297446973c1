import sys
from pathlib import Path

# Lets tests import the shared case definitions (cases.py) next to them.
sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config):
    config.addinivalue_line("markers", "distributed: spawns multi-process gloo worlds (torchrun)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
