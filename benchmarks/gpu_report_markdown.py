"""The GPU report's JSON (gpu_report.py) as Markdown: a header naming the device, driver, torch and precisions,
the goals, one table with a row per measurement (or the error that took its place), and with --profile where
the time of our step goes."""
from __future__ import annotations

from typing import Any, Callable

COLUMNS = ["section", "measurement", "precision", "ours", "peer", "ours / peer", "of GEMM peak (ours / peer)",
           "peak memory GiB (ours / peer)", "goals, notes"]
GOALS = ("Goals: ours at least 1.5x transformers on the same GPU at seq 128 and 512; at least 1,400 sequences/s at "
         "seq 128 on one H100 and at least 45 % of the measured bf16 GEMM peak; the whole loop within 5 % of the "
         "model step. Published figures to beat: NVIDIA's 2022 recipe, 574 sequences/s per A100-80GB at seq 128 "
         "and 207 at seq 512 with AMP; MLPerf's H100 BERT, about 970 packed sequences/s per GPU.")
PEERS = ("Ours: BertForPreTraining + LAMB ({lamb}) for pre-training, BertForQuestionAnswering + AdamW for SQuAD. "
         "Peers: transformers' BertForPreTraining + AdamW (model steps), transformers' BertForQuestionAnswering + "
         "AdamW (SQuAD), our model step alone on the loop's first batches (loop).")


def rate(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:,.0f} seq/s" if value >= 100 else f"{value:.3g} seq/s"


def pair(row: dict[str, Any], key: str, fmt: Callable[[float], str]) -> str:
    """'ours / peer' of row[ours_<key>] and row[peer_<key>], blank where neither was measured."""
    ours, peer = row.get(f"ours_{key}"), row.get(f"peer_{key}")
    if ours is None and peer is None:
        return ""
    return " / ".join(fmt(v) if v is not None else "-" for v in (ours, peer))


def ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else ""


def goal_state(goal: dict[str, Any]) -> str:
    """met, **NOT met** (measured and missed), or not measured (why): a goal whose measurement did not run (the
    peer not installed, a failed step) was not missed."""
    if goal.get("met") is None:
        return f"not measured ({goal.get('not_measured') or 'no number'})"
    return "met" if goal["met"] else "**NOT met**"


def goals_text(row: dict[str, Any]) -> str:
    return "; ".join(f"{g['goal']}: {goal_state(g)}" for g in row.get("goals", []))


def notes(row: dict[str, Any], *keys: str) -> str:
    """The row's goals and the error lines under `keys` (an error line stands where its number would be), each
    error line once: a goal not measured may quote it already."""
    goals = goals_text(row)
    parts = [goals] if goals else []
    parts += [f"{key.replace('_error', '').replace('error', '').strip('_') or 'error'}: {row[key]}"
              for key in keys if row.get(key) and str(row[key]) not in goals]
    return "; ".join(parts).replace("|", "\\|")


def cuda_tests_row(row: dict[str, Any]) -> list[str]:
    if "passed" not in row:
        return ["cuda tests", "pytest -m cuda", "", "", "", "", "", "", notes(row, "error")]
    counts = (f"{row['passed']} passed, {row['failed']} failed, {row['skipped']} skipped, {row['errors']} errors "
              "(collection errors included)")
    problems = "; ".join(row.get("problems", [])[:3])
    verdict = "all pass: " + ("**NOT met**" if row["failed"] else "met" if row["passed"] else "none ran")
    return ["cuda tests", "pytest -m cuda", "", counts, "", "", "", "", "; ".join(filter(None, [verdict, problems]))]


def gemm_row(row: dict[str, Any]) -> list[str]:
    if "gflops" not in row:
        return ["GEMM peak", "", row.get("precision", ""), "", "", "", "", "", notes(row, "error")]
    shape = row["shape"] + (" (the peak)" if row.get("best") else "")
    speed = f"{row['gflops'] / 1e3:,.1f} TFLOP/s" if row["gflops"] >= 1e3 else f"{row['gflops']:.3g} GFLOP/s"
    return ["GEMM peak", f"matmul {shape}", row["precision"], speed, "", "", "", "", ""]


def step_row(row: dict[str, Any]) -> list[str]:
    compiled = ", torch.compile" if row.get("compiled") else ""
    what = f"pre-training step, seq {row['seq']}, batch {row.get('batch', '?')}{compiled}"
    return ["model step", what, row.get("precision", ""), rate(row.get("ours_seq_per_s")),
            rate(row.get("peer_seq_per_s")), ratio(row.get("speedup")), pair(row, "of_peak", lambda v: f"{v:.0%}"),
            pair(row, "peak_memory_gib", lambda v: f"{v:.1f}"), notes(row, "ours_error", "peer_error", "error")]


def max_batch_row(row: dict[str, Any]) -> list[str]:
    stops = "; ".join(f"{name}: {row[f'{name}_stopped_by']}" for name in ("ours", "peer")
                      if row.get(f"{name}_stopped_by"))
    return ["largest micro-batch", f"pre-training step, seq {row['seq']}", row.get("precision", ""),
            str(row.get("ours_largest_micro_batch", "")), str(row.get("peer_largest_micro_batch", "")),
            ratio(row.get("ratio")), "", "", "; ".join(filter(None, [stops, notes(row, "ours_error", "peer_error")]))]


def loop_row(row: dict[str, Any]) -> list[str]:
    tokens = f", {row['real_token_fraction']:.0%} tokens" if "real_token_fraction" in row else ""
    what = f"run_pretraining.py loop, seq {row['seq']}, batch {row.get('batch', '?')}{tokens}"
    return ["loop", what, row.get("precision", ""), rate(row.get("loop_seq_per_s")),
            rate(row.get("model_step_seq_per_s")), ratio(row.get("loop_over_model_step")), "", "",
            notes(row, "loop_error", "model_step_error", "error")]


def finetune_row(row: dict[str, Any]) -> list[str]:
    what = f"SQuAD {row['phase']}, seq {row['seq']}, batch {row['batch']}, full windows"
    return ["fine-tuning", what, row.get("precision", ""), rate(row.get("ours_seq_per_s")),
            rate(row.get("peer_seq_per_s")), ratio(row.get("speedup")), pair(row, "of_peak", lambda v: f"{v:.0%}"),
            "", notes(row, "error")]


def data_prep_row(row: dict[str, Any]) -> list[str]:
    if "stage" not in row:
        return ["data prep", "", "", "", "", "", "", "", notes(row, "error")]
    what = f"{row['stage']}, {row['processes']} processes, {row['size_gb']:g} GB"
    return ["data prep", what, "", f"{row['mb_per_s_per_process']:.2f} MB/s per process", "", "", "", "",
            f"{row['seconds']:.1f} s, peak RSS {row['tree_rss_mb']:.0f} MB"]


def sharding_row(row: dict[str, Any]) -> list[str]:
    if "layout" not in row:
        return ["sharding", "", "", "", "", "", "", "", notes(row, "error")]
    what = f"{row['layout']}: pre-training step, seq {row['seq']}, batch {row['batch']} a process"
    state = f"state {row['state_bytes_per_process_max'] / 2**30:.2f} GiB a process"
    peak = f"{row['peak_allocated_bytes_max'] / 2**30:.1f}" if "peak_allocated_bytes_max" in row else ""
    return ["sharding", what, "fp32", f"{row['step_seconds_max'] * 1000:.0f} ms a step", "", "", "", peak, state]


def profile_row(row: dict[str, Any]) -> list[str]:
    what = f"our step, seq {row['seq']}, batch {row['batch']}"
    found = f"{row['what']}: below" if "top" in row else ""
    return ["profile", what, row.get("precision", ""), "", "", "", "", "", found or notes(row, "error")]


ROWS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "cuda_tests": cuda_tests_row, "gemm_peak": gemm_row, "model_step": step_row, "max_micro_batch": max_batch_row,
    "loop": loop_row, "finetune": finetune_row, "sharding": sharding_row, "profile": profile_row,
    "compiled_step": step_row, "data_prep": data_prep_row}


def table(lines: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(cells) + " |" for cells in lines]


def section_lines(name: str, section: dict[str, Any]) -> list[list[str]]:
    blank = [""] * (len(COLUMNS) - 2)
    if "skipped" in section:
        return [[name, *blank, section["skipped"]]]
    lines = [ROWS[name](row) for row in section["rows"]]
    if "error" in section:
        lines.append([name, *blank, f"error: {section['error']}".replace("|", "\\|")])
    return lines or [[name, *blank, "no rows"]]


def profile_tables(section: dict[str, Any]) -> list[str]:
    out = []
    for row in section.get("rows", []):
        if "top" not in row:
            continue
        out += ["", f"### Where the time goes: seq {row['seq']}, batch {row['batch']}, {row['precision']} "
                f"({row['what']}, {row['total_ms_per_step']:.1f} ms a step)", "",
                "| kernel | calls a step | ms a step | share |", "|---|---|---|---|"]
        out += [f"| `{k['name'].replace('|', '/')}` | {k['calls_per_step']:g} | {k['ms_per_step']:.3f} | "
                f"{k['share']:.1%} |" for k in row["top"]]
    return out


def render(data: dict[str, Any]) -> str:
    h = data["header"]
    lines = [f"# GPU report: {h['device']}{' (--tiny)' if h['tiny'] else ''}", "",
             f"{h['date']}; driver {h['driver']}; CUDA {h['cuda']}; torch {h['torch']}; transformers "
             f"{h['transformers']}; Python {h['python']}; {h['cpus']} CPUs; {h['model']}; precision: model steps "
             f"{' and '.join(h['precisions']['model_step'])} autocast, GEMM peak "
             f"{', '.join(h['precisions']['gemm_peak'])}, the other rows {h['precisions']['others']}.", "",
             f"Command: `{h['command']}`", "", GOALS, "", PEERS.format(lamb=h["lamb"]), "",
             *table([COLUMNS, ["---"] * len(COLUMNS)])]
    for name, section in data["sections"].items():
        lines += table(section_lines(name, section))
    goals = [g for s in data["sections"].values() for r in s.get("rows", []) for g in r.get("goals", [])]
    missed = sum(g.get("met") is False for g in goals)  # a goal not measured is not a missed one
    profiled = any("top" in r for r in data["sections"].get("profile", {}).get("rows", []))
    if missed and not profiled:
        lines += ["", f"{missed} goal(s) not met: rerun with --profile for where the time of our step goes."]
    lines += profile_tables(data["sections"].get("profile", {}))
    return "\n".join(lines) + "\n"
