import sys
from pathlib import Path

# `harness` (the interop suite's: processes, the debug sluice) and the aioquic client.
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "interop"))
sys.path.insert(0, str(HERE))
