"""benchmarks/distillation_sst2.py's own pure parts: the table states the medians and the goals' arithmetic."""
from benchmarks.distillation_sst2 import table


def test_the_table_gives_each_seed_the_medians_the_share_and_the_distance():
    report = {"seeds": [1, 2, 3], "teacher": 0.9, "teacher_layers": 6, "student_layers": 3, "train_rows": "all",
              "host": "a CPU", "baseline": [0.80, 0.84, 0.82], "distilled": [0.88, 0.87, 0.86]}
    text = table(report)
    assert "| seed 2 | 84.00 | 87.00 |" in text and "| **median** | **82.00** | **87.00** |" in text
    assert "96.7 % of the teacher's accuracy (goal >= 97 %), +5.00 points against the baseline" in text
