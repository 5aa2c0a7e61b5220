"""Checkpoint save and resume time and size on CPU: the quickstart's model and a GPT of about 100M parameters.

    .venv/bin/python -m bench.trainer_checkpoint [--only quickstart|100m] [--folder DIR]

Each case trains 2 steps saving at both (fp32, AdamW: weights plus two moments per parameter), then resumes
from step 2 and trains one more. Prints, from the trainer's own metrics lines: the checkpoint's size, the
save time (DeepSpeed's writes with an fsync and a sha256 per file, the manifest, the rename and `latest`),
and on resume the time to choose and verify the checkpoint (every rank checks a share of the files'
sha256) and the time DeepSpeed takes to load it. The folder (default: a temporary one) is on this machine's
disk; a network volume is slower.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench import common
from testcluster import trainer_harness as harness

QUICKSTART = {"layers": 4, "hiddenSize": 64, "attentionHeads": 4, "sequenceLength": 64, "vocabSize": 256}
GPT_100M = {"layers": 12, "hiddenSize": 768, "attentionHeads": 12, "sequenceLength": 128, "vocabSize": 12288}
CASES: dict[str, tuple[dict[str, Any], tuple[int, int, int], int, int]] = {
    # model, (PP, TP, DP), global batch, micro-batch
    "quickstart": (QUICKSTART, (2, 2, 2), 32, 4),
    "100m": (GPT_100M, (2, 1, 1), 4, 2),
}


def _document(case: str, steps: int) -> dict[str, Any]:
    model, (pp, tp, dp), batch, micro = CASES[case]
    document = common.job_document(
        pp, tp, dp, {**model, "precision": "fp32"}, steps=steps, batch=batch, micro=micro, data={"source": "synthetic"}
    )
    document["spec"]["checkpoint"] = {"intervalSteps": 1}
    return document


def _run(folder: Path, case: str, steps: int) -> dict[str, Any]:
    _, (pp, tp, dp), _, _ = CASES[case]
    job = harness.write_job(folder / f"run-{steps}", _document(case, steps))
    gang = harness.Gang()
    gang.start(job, folder / f"run-{steps}" / "out", nproc=pp * tp * dp, checkpoint_dir=folder / "ckpt")
    result = gang.wait(timeout=3600)
    assert result.returncodes == [0], result.logs[0][-3000:]
    output = folder / f"run-{steps}" / "out"
    return {"checkpoints": harness.records(output, "checkpoint"), "resume": harness.records(output, "resume")}


def measure(case: str, folder: Path) -> None:
    _, (pp, tp, dp), _, _ = CASES[case]
    from paralleljob_contract.jobfile import parse_job_config
    from paralleljob_contract.model import parameter_count

    first = _run(folder, case, steps=2)
    resumed = _run(folder, case, steps=3)
    parameters = parameter_count(parse_job_config(_document(case, 2)).model.shape)
    saved = first["checkpoints"][-1]
    resume = resumed["resume"][-1]
    print(
        f"{case:10s} {parameters / 1e6:7.1f}M params  PP{pp}xTP{tp}xDP{dp}  checkpoint {saved['bytes'] / 2**20:8.1f} MiB"
        f"  save {saved['save_s']:6.2f} s  verify {resume['verify_s']:6.2f} s  load {resume['load_s']:6.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(CASES))
    parser.add_argument("--folder", type=Path, help="where the checkpoints go (default: a temporary folder)")
    args = parser.parse_args()
    for case in [args.only] if args.only else list(CASES):
        folder = Path(tempfile.mkdtemp(prefix=f"ckpt-bench-{case}-", dir=args.folder))
        try:
            measure(case, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
