"""The benchmarks: each module is a command run from the repository root as `python -m benchmarks.<name>` (--help
lists its flags); what several of them share is in benchmarks/common.py. The modules import each other, and the
tests import them, as `benchmarks.<name>`."""
