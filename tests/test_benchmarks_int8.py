"""The pure parts of benchmarks/int8_inference.py and benchmarks/int8_models.py (nothing timed): the CPU's int8
instruction sets from /proc/cpuinfo's flags, the middle round's rate, the neighbours an embedding keeps, the goals
read off the figures and the report, the student of every other layer, the SST-2 subset; and the peer environments'
script refuses a peer it does not know before it does anything."""
import json
import subprocess

import numpy as np
import pytest
import torch

from benchmarks.int8_inference import goal_lines, isa_line, neighbour_overlap, report_markdown, sequences_per_second
from benchmarks.int8_models import every_other_layer, sst2_subset
from helpers import GLUE_EXCERPTS, REPO_ROOT

EPYC_FLAGS = "flags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni avx512vl\n"


def test_the_isa_line_names_vnni_where_the_cpu_has_it():
    assert isa_line(EPYC_FLAGS) == "avx2, avx512f, avx512_bf16, avx512_vnni; VNNI"
    assert isa_line("flags\t\t: fpu sse avx2\n") == "avx2; no VNNI (int8 products without vpdpbusd)"
    assert isa_line("flags\t\t: avx2 amx_int8 amx_bf16 avx512_vnni_x\n").endswith("amx_int8, amx_bf16; VNNI")


def test_the_rate_is_the_middle_round_s():
    assert sequences_per_second(32, [1.0, 0.5, 4.0]) == 32.0  # 1.0 s is the middle of the three rounds
    assert sequences_per_second(1, [0.02, 0.01]) == 50.0  # the upper of two: a round that really ran


def test_neighbour_overlap_counts_the_nearest_rows_kept():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(30, 8))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    assert neighbour_overlap(vectors, vectors, k=5) == 1.0
    shuffled = vectors[rng.permutation(30)]  # other rows' neighbours: about k/29 of them by chance
    assert neighbour_overlap(vectors, shuffled, k=5) < 0.5
    # one row moved far: it leaves every other row's list where it stood, and its own list changes
    moved = vectors.copy()
    moved[0] = -moved[0]
    assert 0.5 < neighbour_overlap(vectors, moved, k=5) < 1.0


def fabricated_results(int8_rate: float, int8_accuracy: float) -> dict:
    speed = {"pytorch fp32": {"1": 20.0, "32": 30.0}, "ours fp32": {"1": 40.0, "32": 50.0},
             "ours int8": {"1": int8_rate, "32": 2 * int8_rate}, "optimum int8": {"1": 80.0, "32": 90.0},
             "optimum int8_per_channel": {"1": 64.0, "32": 100.0}}
    return {"date": "2026-11-29", "host": "AMD EPYC (native bf16); fp32 and int8; torch 2.13.0+cpu", "threads": 2,
            "isa": "avx512_vnni; VNNI", "versions": {"torch": "2.13.0+cpu"}, "rounds": 3,
            "what_else_ran": {"start": {"loadavg": ["1.0", "1.0", "1.0"]}, "end": {"loadavg": ["2.0", "1.0", "1.0"]}},
            "speed": {"teacher": speed}, "peers_skipped": {"openvino": "no .venv-openvino"},
            "accuracy": [{"model": "teacher", "task": "SST-2", "ours fp32": 86.0, "ours int8": int8_accuracy,
                          "optimum int8": 85.5}]}


def test_the_goals_are_read_off_the_figures():
    # The goal's peer is Optimum at our accuracy (per-channel); its per-tensor default is reported beside.
    met = goal_lines(fabricated_results(int8_rate=80.0, int8_accuracy=85.5))
    assert met == ["- teacher, batch 1: int8 2.00x fp32 (goal 1.7x): met",
                   "- teacher, batch 1: ours int8 1.00x Optimum's per-tensor int8 (informative: Optimum's default, "
                   "not our accuracy)",
                   "- teacher, batch 1: ours int8 1.25x Optimum's per-channel int8, the accuracy ours keeps (goal at "
                   "least 1x): met",
                   "- teacher, batch 32: int8 3.20x fp32 (goal 1.7x): met",
                   "- teacher, batch 32: ours int8 1.78x Optimum's per-tensor int8 (informative: Optimum's default, "
                   "not our accuracy)",
                   "- teacher, batch 32: ours int8 1.60x Optimum's per-channel int8, the accuracy ours keeps (goal at "
                   "least 1x): met",
                   "- teacher, SST-2: +0.50 points lost (goal at most 1): met"]
    missed = goal_lines(fabricated_results(int8_rate=60.0, int8_accuracy=84.0))
    assert "- teacher, batch 1: int8 1.50x fp32 (goal 1.7x): not met" in missed
    assert ("- teacher, batch 1: ours int8 0.94x Optimum's per-channel int8, the accuracy ours keeps (goal at least "
            "1x): not met") in missed
    assert "- teacher, SST-2: +2.00 points lost (goal at most 1): not met" in missed


def test_a_speed_goal_reads_each_round_s_own_ratio():
    """Rounds at two machine speeds: the middle rates come from different rounds and say ours is slower (90 against
    100), where every round timed ours 1.05x Optimum's."""
    results = fabricated_results(int8_rate=80.0, int8_accuracy=85.5)
    rounds = [(1 / 90, 1 / 95), (1 / 100, 1 / 105), (1 / 150, 1 / 157.5)]  # seconds a batch: Optimum's, ours
    results["speed_rounds"] = [{"teacher": {"optimum int8_per_channel": {"1": peer, "32": peer},
                                            "ours int8": {"1": ours, "32": ours}, "ours fp32": {"1": 1.0, "32": 1.0},
                                            "optimum int8": {"1": peer, "32": peer}}} for peer, ours in rounds]
    results["speed"]["teacher"]["ours int8"] = {"1": 90.0, "32": 90.0}
    results["speed"]["teacher"]["optimum int8_per_channel"] = {"1": 100.0, "32": 100.0}
    assert ("- teacher, batch 1: ours int8 1.05x Optimum's per-channel int8, the accuracy ours keeps (goal at least "
            "1x): met") in goal_lines(results)


def test_the_report_names_the_machine_and_puts_every_engine_in_its_tables():
    text = report_markdown(fabricated_results(int8_rate=80.0, int8_accuracy=85.5))
    assert "AMD EPYC (native bf16); fp32 and int8; torch 2.13.0+cpu; 2 threads; ISA: avx512_vnni; VNNI" in text
    assert "| teacher | ours int8 | 80.0 | 160.0 | 2.00x | 3.20x |" in text
    assert "| teacher | optimum int8 | 80.0 | 90.0 | 2.00x | 1.80x |" in text
    assert text.index("| teacher | optimum int8 |") < text.index("| teacher | optimum int8_per_channel |")
    assert "| model | task | ours fp32 | ours int8 | optimum int8 |" in text
    assert "| teacher | SST-2 | 86.00 | 85.50 | 85.50 |" in text
    assert "Peer openvino not run: no .venv-openvino" in text
    assert text.index("| teacher | pytorch fp32 |") < text.index("| teacher | ours fp32 |")  # the engines' order


def test_the_student_keeps_every_other_layer_renumbered(tiny_bert, tmp_path):
    import transformers
    from safetensors.torch import load_file

    student = every_other_layer(tiny_bert, tmp_path / "student")
    config = json.loads((student / "config.json").read_text())
    assert config["num_hidden_layers"] == 1  # of the tiny BERT's 2: layer 0
    teacher_weights, student_weights = load_file(str(tiny_bert / "model.safetensors")), \
        load_file(str(student / "model.safetensors"))
    assert not [name for name in student_weights if "layer.1." in name]
    for name, tensor in student_weights.items():
        assert torch.equal(tensor, teacher_weights[name]), name  # layer 0 stays layer 0; embeddings, pooler equal
    assert len(student_weights) == len(teacher_weights) - sum("layer.1." in name for name in teacher_weights)
    model = transformers.BertModel.from_pretrained(student)  # transformers reads it, nothing missing
    assert model.config.num_hidden_layers == 1
    assert (student / "vocab.txt").read_bytes() == (tiny_bert / "vocab.txt").read_bytes()


def test_the_sst2_subset_keeps_the_header_and_the_first_rows(tmp_path):
    subset = sst2_subset(GLUE_EXCERPTS / "SST-2", tmp_path / "sst2", 5)
    source = (GLUE_EXCERPTS / "SST-2" / "train.tsv").read_text().splitlines(keepends=True)
    assert (subset / "train.tsv").read_text() == "".join(source[:6])
    assert (subset / "dev.tsv").read_bytes() == (GLUE_EXCERPTS / "SST-2" / "dev.tsv").read_bytes()


def test_the_peer_environments_script_refuses_an_unknown_peer_before_anything(tmp_path):
    script = REPO_ROOT / "benchmarks" / "peer_envs" / "make_peer_envs.sh"
    done = subprocess.run(["bash", str(script), "optimum", "tensorrt"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "make_peer_envs.sh: unknown peer 'tensorrt' (optimum or openvino)"


@pytest.mark.parametrize("name", ["optimum.txt", "openvino.txt"])
def test_every_peer_requirement_is_pinned(name):
    lines = [line.split("#")[0].strip() for line in
             (REPO_ROOT / "benchmarks" / "peer_envs" / name).read_text().splitlines()]
    pins = [line for line in lines if line]
    assert pins and all("==" in pin for pin in pins)
    assert any(pin.startswith("transformers==") for pin in pins)  # the reason it has an environment of its own
