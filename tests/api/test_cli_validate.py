"""`paralleljob validate` as a user runs it: examples, stdin, multi-document files and broken input."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import yaml

from paralleljob.cli import main
from tests.api.jobs import job

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_cli(capsys, *args: str) -> tuple[int, list[str]]:
    code = main(["validate", *args])
    return code, capsys.readouterr().out.splitlines()


def test_the_175b_example_is_valid_with_a_summary_line(capsys) -> None:
    code, lines = run_cli(capsys, str(ROOT / "examples/gpt-175b-64xa100.yaml"))
    assert code == 0
    assert "layout 8x4x2 (PP x TP x DP), 64 GPUs" in lines[0]


def test_the_zero2_pipeline_example_is_rejected_and_still_reports_dp_32_and_256_gpus(capsys) -> None:
    path = str(ROOT / "examples/deepspeed-zero2-pipeline.yaml")
    code, lines = run_cli(capsys, path)
    assert code == 1
    assert any(
        line.startswith(f"{path}: spec.deepspeed.zero_optimization.stage: ") and "incompatible with pipeline" in line
        for line in lines
    )
    assert any("derived DP 32" in line and "256 GPUs" in line for line in lines)


def test_the_quickstart_is_valid(capsys) -> None:
    code, lines = run_cli(capsys, str(ROOT / "examples/quickstart.yaml"))
    assert code == 0 and "2 nodes x 4 GPUs" in lines[0]


def test_problems_print_one_per_line_as_file_path_message(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(job(spec__model__layers=1, spec__model__hiddenSize=500)))
    code, lines = run_cli(capsys, str(bad))
    assert code == 1
    assert f"{bad}: spec.model.layers: 1 layers cannot fill 2 pipeline stages" in "\n".join(lines)
    assert any(line.startswith(f"{bad}: spec.model.hiddenSize: ") for line in lines)


def test_warnings_are_marked_and_do_not_fail(tmp_path, capsys) -> None:
    path = tmp_path / "uneven.yaml"
    path.write_text(yaml.safe_dump(job(spec__model__layers=7)))
    code, lines = run_cli(capsys, str(path))
    assert code == 0
    assert any(": spec.model.layers: warning: " in line for line in lines)


def test_multi_document_files_report_each_job(tmp_path, capsys) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([job(), job(metadata__name="second", spec__model__layers=1)]))
    code, lines = run_cli(capsys, str(path))
    assert code == 1
    assert any("(document 1)" in line and "valid" in line for line in lines)
    assert any("(document 2)" in line and "spec.model.layers" in line for line in lines)


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("spec: [unclosed", "(yaml): line 1"),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {}",
            "kind: is 'Pod': this is a v1 Pod, not a ParallelJob",
        ),
        ("apiVersion: paralleljob.io/v2\nkind: ParallelJob\nmetadata: {name: x}\nspec: {}", "apiVersion"),
        ("apiVersion: paralleljob.io/v1alpha1\nkind: ParallelJob\nmetadata: {name: x}\n", "spec: is missing"),
        ("- just\n- a list", "not a mapping"),
        ("", "contains no document"),
    ],
    ids=["malformed-yaml", "wrong-kind", "wrong-api-version", "missing-spec", "not-a-mapping", "empty"],
)
def test_broken_input_gives_one_line_and_no_traceback(tmp_path, text: str, phrase: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "paralleljob", "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    assert phrase in proc.stdout
    assert len(proc.stdout.strip().splitlines()) == 1


def test_stdin_is_read_for_dash() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "paralleljob", "validate", "-"],
        input=yaml.safe_dump(job()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.startswith("-: gpt-small: valid")


def test_a_missing_file_is_a_one_line_error(capsys) -> None:
    code, lines = run_cli(capsys, "/nonexistent/job.yaml")
    assert code == 1 and lines == [
        "/nonexistent/job.yaml: (file): cannot be read: No such file or directory; check the path."
    ]


def test_a_job_with_a_gpu_budget_is_valid_and_says_its_layout_is_chosen_at_admission(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    budget = tmp_path / "budget.yaml"
    budget.write_text(
        """
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {name: gpt-budget}
spec:
  parallelism: {gpus: 64, tensor: 4}
  model: {layers: 96, hiddenSize: 12288, attentionHeads: 96, sequenceLength: 2048, vocabSize: 51200}
  deepspeed: {train_batch_size: 1536}
  training: {steps: 10}
  checkpoint: {intervalSteps: 5, volume: {persistentVolumeClaim: {claimName: ckpt}}}
"""
    )
    assert main(["validate", str(budget)]) == 0
    out = capsys.readouterr().out
    assert "valid, a budget of 64 GPUs; the layout" in out
    assert "will be chosen at admission on the cluster's free nodes, keeping tensor 4" in out
