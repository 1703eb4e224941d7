#!/usr/bin/env bash
# The whole recipe on the embedded default corpus, on this machine's CPU (or GPU): text -> vocab -> shards ->
# phase 1 and phase 2 pre-training -> held-out masked-LM accuracy -> loss curves -> fill-in-the-mask demo.
# Offline; a second run reuses what is complete. QUICKSTART_STEPS=N makes a short run (N phase-1 steps); an
# output folder holds one run, so another N (or --family) there is refused: move it away or pass --output_dir.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/ensure_venv.sh
source scripts/ensure_venv.sh
ensure_venv requirements.txt
exec .venv/bin/python scripts/quickstart.py "$@"
