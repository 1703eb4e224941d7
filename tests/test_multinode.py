"""Multi-node pre-training (issue 14, item 5): two torchrun "nodes" on this machine, joined by the c10d rendezvous
on 127.0.0.1, train exactly like one process with the same global batch, and a resume that changes the world size
(2 ranks -> 1, 1 -> 2) continues the same sample stream. Self-contained: tiny random shards and a tiny model,
dropout off and fp32, so that the only differences between layouts are fp32 summation orders.

Every run goes through tests/pretraining_spy.py (run_pretraining.py with its loss function recording the input_ids
of each micro-batch), so what each rank trained on is compared sample by sample with the stream order's pure
functions (sample_order.py, no loader code) and between layouts, and the first step's loss is recomputed here
from those samples and a freshly built model."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from bertrecipe.model.bert import BertConfig, BertForPreTraining
from bertrecipe.pretraining import sample_order
from bertrecipe.pretraining.shard_schema import inspect_shard
from bertrecipe.training.metric_logger import read_log
from helpers import REPO_ROOT, held_ports

VOCAB, SEQ, PREDS = 128, 16, 3
SIZES = (18, 21)  # 39 samples an epoch: steps straddle files, blocks and the epoch boundary
CHUNK_ROWS = 5  # HDF5 chunks of 5 rows: the stream's blocks (sample_order.py), several per shard
SEED = 42  # run_pretraining's default --seed
STEPS, SPLIT = 8, 3  # 64 samples: the stream goes into its second epoch; resumes start after step 3
GLOBAL_BATCH, MICRO = 8, 4  # samples a step in every layout; micro-batch of the uninterrupted runs
CONFIG = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 64, "max_position_embeddings": 32, "type_vocab_size": 2, "hidden_act": "gelu",
          "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "initializer_range": 0.02}
# Processes and per-process flags giving 8 samples an optimizer step.
ONE, TWO, TWO_ACCUMULATING = "1_process", "2_nodes", "2_nodes_accumulating"
LAYOUTS = {ONE: (1, ["--train_batch_size", 8, "--gradient_accumulation_steps", 2]),  # 2 micro-batches of 4
           TWO: (2, ["--train_batch_size", 4, "--gradient_accumulation_steps", 1]),  # 1 of 4 per rank
           TWO_ACCUMULATING: (2, ["--train_batch_size", 4, "--gradient_accumulation_steps", 2])}  # 2 of 2 per rank
# GLOO_SOCKET_IFNAME: gloo's sockets on the loopback interface only (else it picks the hostname's address).
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
TIMEOUT = 120  # seconds for any launch; a healthy one takes under 15 s here

# The layouts compute the same fp32 numbers and differ only in how they combine them. With micro-batches of 4
# everywhere, gradients are g0/2 + g1/2 in one process and (g0 + g1)/2 over two ranks: halving is exact in binary
# floating point, so the weights come out bit for bit equal (measured: 0). With micro-batches of 2 after a resume,
# the matmuls sum over the batch in another order (measured: 1e-8 on the weights). The logged step loss is an fp32
# sum of halves in one process and a float64 mean of the ranks' fp32 losses over two: 9e-8 relative at most.
# 1e-6 is 10x above all of these, and far below what one sample swapped for another does to a step's loss at
# this model's initialisation (1.5e-3 relative here; checked below to exceed 10x the tolerance).
LOSS_RTOL = 1e-6
WEIGHT_ATOL = 1e-6


def shard_arrays(n, seed):
    """What create_pretraining_data writes: random ids in the vocab (each row unique, so a row names its sample),
    two segments, positions 1..PREDS masked."""
    rng = np.random.default_rng(seed)
    segment_ids = np.zeros((n, SEQ), np.int8)
    segment_ids[:, SEQ // 2:] = 1
    return {"input_ids": rng.integers(5, VOCAB, (n, SEQ)).astype(np.int32),
            "input_mask": np.ones((n, SEQ), np.int8),
            "segment_ids": segment_ids,
            "masked_lm_positions": np.tile(np.arange(1, PREDS + 1, dtype=np.int32), (n, 1)),
            "masked_lm_ids": rng.integers(5, VOCAB, (n, PREDS)).astype(np.int32),
            "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8)}


class Workspace:
    def __init__(self, root):
        self.root = root
        self.data = root / "data"
        self.data.mkdir()
        self.names = [f"tiny_training_{i}.hdf5" for i in range(len(SIZES))]  # sorted: the stream's file indices
        self.arrays = {}
        for i, (name, size) in enumerate(zip(self.names, SIZES, strict=True)):
            self.arrays[name] = shard_arrays(size, seed=i)
            with h5py.File(self.data / name, "w") as f:
                for key, value in self.arrays[name].items():
                    f.create_dataset(key, data=value, chunks=(CHUNK_ROWS, *value.shape[1:]))
        self.config = root / "bert_config.json"
        self.config.write_text(json.dumps(CONFIG))
        self.sample_of_row = {tuple(row): (name, i) for name in self.names
                              for i, row in enumerate(self.arrays[name]["input_ids"].tolist())}
        assert len(self.sample_of_row) == sum(SIZES)  # no two samples alike

    def planned_steps(self, lanes, first, last):
        """Per step in [first, last), the (file, row) of its samples in micro-batch order, from the stream order's
        pure functions (sample_order.py; no loader code): step s takes lane indices [s*G/C, (s+1)*G/C) of every
        lane, lane after lane; a lane index is a row of the portion (a block's run within the lane) holding it,
        in the portion's shuffled order."""
        shards = [inspect_shard(self.data / name, VOCAB, CONFIG["max_position_embeddings"]) for name in self.names]
        assert [s.block_rows for s in shards] == [CHUNK_ROWS] * len(shards)
        stream = sample_order.StreamOrder([s.num_samples for s in shards], [s.block_rows for s in shards], SEED, lanes)
        per_lane = GLOBAL_BATCH // lanes
        steps = []
        for step in range(first, last):
            samples = []
            for lane in range(lanes):
                wanted = range(step * per_lane, (step + 1) * per_lane)
                for portion in sample_order.lane_portion_stream(stream, lane, wanted.start):
                    begins, order = portion.lane_index, stream.portion_order(portion)
                    samples += [(self.names[portion.file], portion.start + int(order[i - begins]))
                                for i in wanted if begins <= i < begins + len(order)]
                    if begins + len(order) >= wanted.stop:
                        break
            steps.append(samples)
        return steps

    def flags(self, out, *extra):
        return ["--input_dir", str(self.data), "--config_file", str(self.config), "--output_dir", str(out),
                "--max_seq_length", str(SEQ), "--max_predictions_per_seq", str(PREDS), "--learning_rate", "1e-2",
                "--warmup_proportion", "0.25", "--max_steps", str(STEPS), "--num_steps_per_checkpoint", str(SPLIT),
                "--do_train", "--disable_progress_bar", "--json-summary", str(out / "log.json"), *map(str, extra)]


def train(ws, out, layout, *extra):
    """The spy-wrapped run_pretraining.py in one plain process, or as two torchrun nodes of one process each."""
    nodes, layout_flags = LAYOUTS[layout]
    spy = out / "spy"
    spy.mkdir(parents=True)
    env = {**ENV, "SPY_DIR": str(spy)}
    script = [str(REPO_ROOT / "tests" / "pretraining_spy.py"), *ws.flags(out, *layout_flags, *extra)]
    if nodes == 1:
        result = subprocess.run([sys.executable, *script], env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert result.returncode == 0, result.stderr[-3000:]
        return spy
    with held_ports() as [port]:  # until the host node's rendezvous store listens on it
        return launch_nodes(nodes, port, script, env, out, spy)


def launch_nodes(nodes, port, script, env, out, spy):
    run_id = uuid.uuid4().hex
    launchers, logs = [], []
    for node in range(nodes):
        # The node given is_host=true hosts the rendezvous store; --local-addr makes rank 0's node advertise
        # 127.0.0.1 (not the hostname) as MASTER_ADDR. With c10d, --node_rank is ignored: the rendezvous assigns
        # the ranks, so global rank 0 may be on either node.
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node_rank", str(node),
                   "--nproc_per_node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                   "--rdzv-id", run_id, "--rdzv-conf", f"is_host={str(node == 0).lower()}",
                   "--local-addr", "127.0.0.1", *script]
        logs.append(out / f"node{node}.log")
        with logs[-1].open("w") as log:
            launchers.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
    deadline = time.monotonic() + TIMEOUT
    # Until both end, or one fails (its peer would then wait for it in the rendezvous or a collective).
    while (any(p.poll() is None for p in launchers) and not any(p.poll() for p in launchers)
           and time.monotonic() < deadline):
        time.sleep(0.2)
    stop(launchers, spy)
    failed = [f"node {node} (exit {launcher.returncode}):\n{log.read_text()[-2000:]}"
              for node, (launcher, log) in enumerate(zip(launchers, logs, strict=True)) if launcher.returncode]
    assert not failed, "\n".join(failed)
    return spy


def stop(launchers, spy):
    """Ends the launchers still running and their workers. torchrun ends its workers (in sessions of their own)
    on SIGTERM; a worker it leaves behind is killed by the pid it recorded (pretraining_spy.py)."""
    alive = [p for p in launchers if p.poll() is None]
    for launcher in alive:
        os.killpg(launcher.pid, signal.SIGTERM)
    for launcher in alive:
        try:
            launcher.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    for record in spy.glob("pid*"):
        pid = int(record.read_text())
        try:
            if b"pretraining_spy.py" in Path(f"/proc/{pid}/cmdline").read_bytes():  # still that worker
                os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            pass


def consumed(ws, spy):
    """Per optimizer step, the (file, row) of every sample trained on, in the order of the step's micro-batches:
    rank r trains micro-batches [r*A, (r+1)*A) of a step (A = accumulation; sample_order.py)."""
    ranks = sorted(spy.glob("rank*.jsonl"))
    world_size = len(ranks)
    steps = {}
    for path in ranks:
        rank = int(path.stem[4:])
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert {line["world_size"] for line in lines} == {world_size}
        micro = len(lines[0]["input_ids"])
        accumulation = GLOBAL_BATCH // micro // world_size
        for j, line in enumerate(lines):
            assert len(line["input_ids"]) == micro
            k = rank * accumulation + j % accumulation
            steps.setdefault(j // accumulation, {})[k] = [ws.sample_of_row[tuple(row)] for row in line["input_ids"]]
    return [[sample for k in sorted(steps[s]) for sample in steps[s][k]] for s in sorted(steps)]


def step_losses(out):
    return {r["step"][1]: r["data"]["step_loss"] for r in read_log(out / "log.json")
            if r["type"] == "LOG" and isinstance(r["step"], list) and r["step"] and "step_loss" in r["data"]}


def weights(path):
    return torch.load(path, weights_only=True)["model"]


def assert_weights_close(a, b):
    assert a.keys() == b.keys()
    difference = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert difference < WEIGHT_ATOL, difference


def reference_loss(ws, samples):
    """The first step's loss computed here: the model run_pretraining builds on rank 0 (seed 42; DDP hands rank 0's
    weights to the others) on the given samples, as the mean of the losses of micro-batches of MICRO."""
    torch.manual_seed(SEED)
    model = BertForPreTraining(BertConfig.from_dict(CONFIG))
    losses = []
    for start in range(0, len(samples), MICRO):
        rows = [ws.arrays[name] for name, _ in samples[start:start + MICRO]]
        index = [i for _, i in samples[start:start + MICRO]]
        pick = {key: torch.tensor(np.stack([a[key][i] for a, i in zip(rows, index, strict=True)]).astype(np.int64))
                for key in ("input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_ids",
                            "next_sentence_labels")}
        labels = torch.full((len(index), SEQ), -1, dtype=torch.int64)
        labels.scatter_(1, pick["masked_lm_positions"], pick["masked_lm_ids"])
        with torch.no_grad():
            output = model(pick["input_ids"], pick["segment_ids"], pick["input_mask"], masked_lm_labels=labels,
                           next_sentence_labels=pick["next_sentence_labels"])
        losses.append(float(output.loss))
    return sum(losses) / len(losses)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("multinode"))


@pytest.fixture(scope="module")
def uninterrupted(ws):
    """Two nodes and one process trained for STEPS steps, checkpoints after 3 and 6: {layout: output folder}."""
    runs = {}
    for layout in (TWO, ONE):
        runs[layout] = ws.root / f"straight_{layout}"
        train(ws, runs[layout], layout)
    return runs


@pytest.mark.slow
def test_two_nodes_train_like_one_process_with_the_same_global_batch(ws, uninterrupted):
    two, one = uninterrupted[TWO], uninterrupted[ONE]
    # The same samples each step, micro-batch by micro-batch, in both layouts; both ranks trained (each step's
    # 8 samples are made of rank 0's 4 and rank 1's 4).
    lanes = torch.load(one / f"ckpt_{STEPS}.pt", weights_only=True)["data"]["lanes"]
    assert torch.load(two / f"ckpt_{STEPS}.pt", weights_only=True)["data"]["lanes"] == lanes
    steps = ws.planned_steps(lanes, 0, STEPS)
    assert len(list((two / "spy").glob("rank*.jsonl"))) == 2
    assert consumed(ws, one / "spy") == steps
    assert consumed(ws, two / "spy") == steps
    # The plan is a stream (checked without it): no sample twice within the steps of the first epoch (4 steps of
    # its 39 samples), so the equalities above are not those of a constant or repeating batch.
    assert len(steps) == STEPS
    first_epoch = [sample for step in steps[:sum(SIZES) // GLOBAL_BATCH] for sample in step]
    assert len(set(first_epoch)) == len(first_epoch)

    # The loss curves agree, and the first step's loss is the one computed here on the expected samples.
    losses_two, losses_one = step_losses(two), step_losses(one)
    assert sorted(losses_two) == sorted(losses_one) == list(range(1, STEPS + 1))
    for step in losses_one:
        assert losses_two[step] == pytest.approx(losses_one[step], rel=LOSS_RTOL), step
    first = reference_loss(ws, steps[0])
    assert losses_two[1] == pytest.approx(first, rel=LOSS_RTOL)
    assert losses_one[1] == pytest.approx(first, rel=LOSS_RTOL)
    # The tolerance tells samples apart: one sample replaced (by one of the next step) moves the loss far beyond it.
    swapped = steps[0][:-1] + steps[1][:1]
    assert abs(reference_loss(ws, swapped) - first) > 10 * LOSS_RTOL * first

    # Training moved the weights, and both layouts end with the same ones.
    final_two, final_one = weights(two / f"ckpt_{STEPS}.pt"), weights(one / f"ckpt_{STEPS}.pt")
    assert_weights_close(final_two, final_one)
    start = weights(two / f"ckpt_{SPLIT}.pt")
    assert max(float((final_two[k] - start[k]).abs().max()) for k in start) > 100 * WEIGHT_ATOL

    # A fresh multi-node run gives every rank its own dropout stream (seed + global rank), on either node.
    states = torch.load(two / f"ckpt_{STEPS}.pt", weights_only=True)["rng_per_rank"]
    assert len(states) == 2 and not torch.equal(states[0]["torch"], states[1]["torch"])


@pytest.fixture(scope="module")
def resumed(ws, uninterrupted):
    """resumed(before, after): the uninterrupted `before` run continued from its step-SPLIT checkpoint (copied to a
    new folder, as after a crash there) in layout `after`; each resume runs once for the module."""
    done = {}

    def get(before, after):
        if (before, after) not in done:
            out = ws.root / f"resumed_{before}_to_{after}"
            out.mkdir()
            shutil.copy(uninterrupted[before] / f"ckpt_{SPLIT}.pt", out)
            # With a DataLoader worker on the way to two ranks: what it reads must not depend on that either.
            train(ws, out, after, "--resume_from_checkpoint", *(["--num_workers", 1] if after != ONE else []))
            done[before, after] = out
        return done[before, after]

    return get


# 1 -> 2 also changes the micro-batch (4 -> 2) and has each rank accumulate: rank r takes micro-batches 2r, 2r+1.
@pytest.mark.parametrize("before, after", [(TWO, ONE), (ONE, TWO_ACCUMULATING)])
@pytest.mark.slow
def test_resume_on_another_world_size_continues_the_same_sample_stream(ws, uninterrupted, resumed, before, after):
    out = resumed(before, after)
    # Steps SPLIT+1.. take exactly the samples the plan gives them, which both uninterrupted runs took there,
    # micro-batch by micro-batch: none repeated, skipped or moved to another step.
    lanes = torch.load(out / f"ckpt_{STEPS}.pt", weights_only=True)["data"]["lanes"]
    assert consumed(ws, out / "spy") == ws.planned_steps(lanes, SPLIT, STEPS)
    for run in uninterrupted.values():
        assert consumed(ws, out / "spy") == consumed(ws, run / "spy")[SPLIT:], run.name
    # The loss curve goes on as in both uninterrupted runs (one of each world size), and so do the weights.
    losses = step_losses(out)
    assert sorted(losses) == list(range(SPLIT + 1, STEPS + 1))
    for run in uninterrupted.values():
        reference = step_losses(run)
        for step in losses:
            assert losses[step] == pytest.approx(reference[step], rel=LOSS_RTOL), (run.name, step)
        assert_weights_close(weights(out / f"ckpt_{STEPS}.pt"), weights(run / f"ckpt_{STEPS}.pt"))
    assert torch.load(out / f"ckpt_{STEPS}.pt", weights_only=True)["data"]["stream_position"] == STEPS * GLOBAL_BATCH


@pytest.mark.slow
def test_ranks_added_by_a_resume_draw_their_own_dropout_streams(resumed):
    out = resumed(ONE, TWO_ACCUMULATING)
    states = torch.load(out / f"ckpt_{STEPS}.pt", weights_only=True)["rng_per_rank"]
    assert len(states) == 2
    assert not torch.equal(states[0]["torch"], states[1]["torch"])
