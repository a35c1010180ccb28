import sys
from pathlib import Path

# `harness` sits beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))
