"""benchmarks/distillation_sst2.py's own pure parts: the table states the medians and the goals' arithmetic."""
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
