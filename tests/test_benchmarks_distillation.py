"""The distillation benchmarks' own pure parts: the tables state the medians and the goals' arithmetic; the SQuAD
stages read the data they are given."""
from pathlib import Path

from benchmarks.distillation_sst2 import FIRST_STAGES, stage_suffix, table


def test_the_table_gives_each_seed_the_medians_the_share_and_the_distance():
    report = {"seeds": [1, 2, 3], "teacher": 0.9, "teacher_layers": 6, "student_layers": 3, "train_rows": "all",
              "host": "a CPU", "baseline": [0.80, 0.84, 0.82], "distilled": [0.88, 0.87, 0.86]}
    text = table(report)
    assert "| seed 2 | 84.00 | 87.00 |" in text and "| **median** | **82.00** | **87.00** |" in text
    assert "96.7 % of the teacher's accuracy (goal >= 97 %), +5.00 points against the baseline" in text


def test_a_stage_with_other_settings_than_the_first_benchmark_s_gets_a_folder_of_its_own():
    assert stage_suffix("heads", FIRST_STAGES["heads"]) == ""
    assert stage_suffix("heads", {"rate": "1e-4", "epochs": 1.0, "aug": True}) == "-heads-aug-e1-lr1e-4"
    assert stage_suffix("backbone", {**FIRST_STAGES["backbone"], "epochs": 2.5}) == "-backbone-e2.5-lr1e-4"


def test_the_squad_table_states_the_students_share_of_the_teachers_f1():
    from benchmarks.distillation_squad import table as squad_table
    report = {"teacher": {"exact_match": 60.0, "F1": 72.0, "train_minutes": 20.0},
              "distilled": {"exact_match": 55.0, "F1": 66.6, "train_minutes": 9.0},
              "baseline": {"exact_match": 50.0, "F1": 61.0, "train_minutes": 12.0}, "host": "a CPU", "settings": "s"}
    text = squad_table(report)
    assert "| teacher (6 layers) | 60.00 | 72.00 | 20.0 |" in text
    assert "| student (3 layers), fine-tuned | 50.00 | 61.00 | 12.0 |" in text
    assert "92.5 % of the teacher's F1 (goal >= 90 %)" in text
    general = squad_table({**report, "student_label": "4 x 192, general"})
    assert "| student (4 x 192, general), task-distilled | 55.00 | 66.60 | 9.0 (last stage) |" in general


def test_the_squad_split_trains_on_the_first_half_of_the_articles_and_scores_the_rest(tmp_path, monkeypatch):
    import json

    import benchmarks.distillation_squad as squad_benchmark
    shared = tmp_path / "shared"
    (shared / "squad").mkdir(parents=True)
    articles = [{"title": f"a{i}", "paragraphs": []} for i in range(48)]
    (shared / "squad" / "dev-v1.1.json").write_text(json.dumps({"version": "1.1", "data": articles}))
    monkeypatch.setattr(squad_benchmark, "SHARED", shared)
    folder = squad_benchmark.split_dev(tmp_path / "work")
    train = json.loads((folder / "train-v1.1.json").read_text())["data"]
    scored = json.loads((folder / "dev-v1.1.json").read_text())["data"]
    assert [a["title"] for a in train] == [f"a{i}" for i in range(24)]
    assert [a["title"] for a in scored] == [f"a{i}" for i in range(24, 48)]


def test_only_the_squad_stages_given_the_augmented_set_read_it_and_their_folders_say_so(tmp_path, monkeypatch):
    import json

    import benchmarks.distillation_squad as squad_benchmark
    commands = []

    def run(argv):  # each stage's command, and the log it would leave
        commands.append(argv)
        out = Path(argv[argv.index("--output_dir") + 1])
        out.mkdir(parents=True)
        record = {"step": [], "data": {"exact_match": 1.0, "F1": 2.0, "e2e_train_time": 60.0}}
        (out / "dllogger.json").write_text(f"DLLL {json.dumps(record)}\n")

    monkeypatch.setattr(squad_benchmark, "run", run)
    data, aug = tmp_path / "data", tmp_path / "data_aug4-question"
    squad_benchmark.distil(tmp_path, data, tmp_path / "teacher", tmp_path / "start", {"backbone": 1, "heads": 3},
                           {"backbone": "1e-4", "heads": "1e-4"}, [], ["backbone", "heads"], "g_", {"heads": aug})
    backbone, heads = commands
    assert backbone[backbone.index("--data_dir") + 1] == str(data) and "--aug_train" not in backbone
    assert heads[heads.index("--data_dir") + 1] == str(aug) and "--aug_train" in heads
    assert Path(backbone[backbone.index("--output_dir") + 1]).name == "g_distilled_backbone"
    assert Path(heads[heads.index("--output_dir") + 1]).name == "g_distilled-heads-aug4-question_heads"
    assert heads[heads.index("--student_model") + 1] == str(tmp_path / "g_distilled_backbone")
