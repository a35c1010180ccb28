import sys
from pathlib import Path

# The dashboard test drives processes with the interop test's harness (tests/interop/harness.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))
