import sys
from pathlib import Path

# Lets test modules import shared helpers kept in tests/ (plan_base.py).
sys.path.insert(0, str(Path(__file__).parent))
