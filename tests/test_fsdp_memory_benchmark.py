"""benchmarks/fsdp_memory.py on the tiny config: what a process holds of the parameters, gradients and LAMB state
under FSDP is 1/W of DDP's (up to the padding of shards), counted from the tensors themselves."""
import json
import subprocess
import sys

import pytest

from helpers import ENV, REPO_ROOT


@pytest.mark.slow
def test_a_sharded_process_holds_a_wth_of_ddps_state(tmp_path):
    output = tmp_path / "fsdp_memory.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.fsdp_memory", "--config", "bert_configs/tiny.json",
                             "--layouts", "ddp:2", "fsdp:2", "fsdp:4", "--steps", "1", "--output", str(output)],
                   cwd=REPO_ROOT, env=ENV, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["layout"]: row for row in json.loads(output.read_text())["layouts"]}
    whole = rows["ddp:2"]["parameters"] * 4 * 4  # fp32 weights, gradients and LAMB's two moments
    assert all(rank["parameters"] + rank["gradients"] + rank["optimizer_state"] == whole
               for rank in rows["ddp:2"]["ranks"])
    for layout, processes in (("fsdp:2", 2), ("fsdp:4", 4)):
        shares = [rank["parameters"] + rank["gradients"] + rank["optimizer_state"] for rank in rows[layout]["ranks"]]
        assert len(shares) == processes
        assert sum(shares) == pytest.approx(whole, rel=1e-3)  # the shards add up to the whole
        assert max(shares) <= whole / processes * 1.02, (layout, shares)
