"""Make the repository (testhost) and tests/ (hostlib) importable from every test directory."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
for path in (TESTS.parent, TESTS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
