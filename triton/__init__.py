"""Triton deployment scripts, run as files (python triton/deployer.py ...), never imported as a package.

This folder's name is also that of OpenAI's Triton compiler package, which torch imports (torch._dynamo,
inductor) and which the repository root on sys.path would otherwise shadow with this folder. Importing
`triton` therefore hands over to the installed compiler package, or fails as if none were installed.
"""
import importlib
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_saved_path = sys.path[:]
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _ROOT]
del sys.modules[__name__]
try:
    sys.modules[__name__] = importlib.import_module(__name__)  # the installed package, when there is one
finally:
    sys.path[:] = _saved_path
