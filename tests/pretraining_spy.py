"""run_pretraining.py with its loss (BertPretrainingCriterion) wrapped so that each process records, in order,
the input_ids of every micro-batch it trains on (one JSON line per micro-batch in $SPY_DIR/rank<RANK>.jsonl; its
pid in $SPY_DIR/pid<RANK>), then trains as usual.

The loss sees exactly what the model is fed, so the record shows what each rank consumed however the
loader is built. Launched like run_pretraining.py, with or without torchrun."""
import json
import os
from pathlib import Path

from bertrecipe.cli import run_pretraining
from bertrecipe.cli.command_line import run_cli
from bertrecipe.pretraining.data import BertPretrainingCriterion


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    record = Path(os.environ["SPY_DIR"]) / f"rank{rank}.jsonl"
    (record.parent / f"pid{rank}").write_text(str(os.getpid()))  # lets a test end a worker its launcher left
    real_loss = BertPretrainingCriterion.__call__

    def recording_loss(criterion, model, batch):
        line = {"world_size": int(os.environ.get("WORLD_SIZE", "1")), "input_ids": batch["input_ids"].tolist()}
        with record.open("a") as f:  # appended per micro-batch: a crash still leaves what was consumed
            f.write(json.dumps(line) + "\n")
        return real_loss(criterion, model, batch)

    BertPretrainingCriterion.__call__ = recording_loss
    run_cli(run_pretraining.main)


if __name__ == "__main__":
    main()
