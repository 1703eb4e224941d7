"""The benchmarks are commands (`python benchmarks/<name>.py`); this file lets the tests import the two whose
functions they check (time_to_accuracy, fault_injection)."""
