"""Resume time at another pipeline x tensor layout against a resume at the layout saved at, on CPU.

    .venv/bin/python -m bench.trainer_relayout [--zero 0|1] [--rounds 2] [--folder DIR]

A GPT of about 40M parameters (8 layers, hidden 512, vocabulary 16384; fp32, AdamW) trains 2 steps at
PP2 x TP2 x DP1 saving at step 2; then each target layout resumes from that checkpoint (read-only, as
spec.checkpoint.resumeFrom) and trains one step: the same layout (DeepSpeed's own load), and PP1 x TP4 and
PP4 x TP1 (the re-cut, `paralleljob_trainer.recut`). Prints, from rank 0's `resume` metrics line, the time to
load the checkpoint into the built engine (`load_s`), and the whole resumed run's wall time, each the best of
`--rounds`; and the ratio to the same-layout resume.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common
from testcluster import trainer_harness as harness

MODEL = {"layers": 8, "hiddenSize": 512, "attentionHeads": 8, "sequenceLength": 128, "vocabSize": 16384}
SAVED = (2, 2, 1)
TARGETS = [(2, 2, 1), (1, 4, 1), (4, 1, 1)]


def _document(layout: tuple[int, int, int], steps: int, zero: int) -> dict[str, Any]:
    pp, tp, dp = layout
    document = common.job_document(
        pp, tp, dp, {**MODEL, "precision": "fp32"}, steps=steps, batch=4, micro=1, data={"source": "synthetic"}
    )
    document["spec"]["checkpoint"] = {"intervalSteps": 2}
    if zero:
        document["deepspeed"]["zero_optimization"] = {"stage": zero}
    return document


def _run(folder: Path, layout: tuple[int, int, int], steps: int, zero: int, resume_from: Path | None) -> dict:
    job = harness.write_job(folder, _document(layout, steps, zero))
    gang = harness.Gang()
    extra = {"PARALLELJOB_RESUME_FROM": str(resume_from)} if resume_from else {}
    started = time.perf_counter()
    nproc = layout[0] * layout[1] * layout[2]
    gang.start(job, folder / "out", nproc=nproc, checkpoint_dir=folder / "ckpt", extra_env=extra)
    result = gang.wait(timeout=3600)
    wall = time.perf_counter() - started
    assert result.returncodes == [0], result.logs[0][-3000:]
    resumes = harness.records(folder / "out", "resume")
    return {"wall_s": wall, "load_s": resumes[-1]["load_s"] if resumes else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zero", type=int, choices=(0, 1), default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--folder", type=Path, help="where the checkpoints go (default: a temporary folder)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="relayout-bench-", dir=args.folder))
    try:
        _run(folder / "saved", SAVED, 2, args.zero, None)
        checkpoints = folder / "saved" / "ckpt"
        found: dict[tuple[int, int, int], dict[str, float]] = {}
        for round_ in range(args.rounds):
            for layout in TARGETS:
                measured = _run(
                    folder / f"resume-{round_}-{'x'.join(map(str, layout))}", layout, 3, args.zero, checkpoints
                )
                best = found.setdefault(layout, measured)
                found[layout] = {key: min(best[key], measured[key]) for key in measured}
        same = found[SAVED]
        print(f"ZeRO {args.zero}; checkpoint saved at PP{SAVED[0]}xTP{SAVED[1]}xDP{SAVED[2]}; best of {args.rounds}")
        for (pp, tp, dp), measured in found.items():
            print(
                f"resume at PP{pp}xTP{tp}xDP{dp}: load {measured['load_s']:6.2f} s "
                f"({measured['load_s'] / same['load_s']:4.2f}x)  whole run {measured['wall_s']:6.1f} s "
                f"({measured['wall_s'] / same['wall_s']:4.2f}x)"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
