import sys
from pathlib import Path

# tests/mutants.py is imported by name, both here and by the suite subprocesses it starts
sys.path.insert(0, str(Path(__file__).parent))
