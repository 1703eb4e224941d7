"""LAMB and the warm-up schedules where NVIDIA's layout puts them, for `from optimization import Lamb` at the root.
The code is bertrecipe/training/optimization.py: read it there; nothing in the package imports this file."""
from bertrecipe.training.optimization import Lamb, LinearWarmUpScheduler, PolyWarmUpScheduler

__all__ = ["Lamb", "LinearWarmUpScheduler", "PolyWarmUpScheduler"]
