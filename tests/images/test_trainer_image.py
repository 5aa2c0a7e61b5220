"""The CPU flavour of the trainer image as `make images` built it (trainer-image/Dockerfile with the CPU build
arguments, scripts/build-images.sh): its user, its start on the read-only root the operator's pods give it, the
DeepSpeed ops built into it, and exactly its locked Python packages. Run by `make images-test`; its training run
on a cluster is tests/upstream/test_trainer_image.py."""

from __future__ import annotations

import pytest
import yaml

from tests.images.helpers import REPO, VERSION, InImage, frozen, locked

pytestmark = pytest.mark.trainer_image
# The emptyDirs the operator gives a trainer pod on a read-only root (operator/paralleljob/manifests/security.py).
SCRATCH = ("/tmp", "/home/trainer")


def test_the_user_is_numeric_non_root_and_the_charts_job_user(trainer_image: InImage) -> None:
    uid, gid = trainer_image.image.user_ids()
    assert trainer_image.image.user == f"{uid}:{gid}" and uid and uid > 0
    job_pods = yaml.safe_load((REPO / "charts" / "paralleljob-operator" / "values.yaml").read_text())["jobPods"]
    assert (job_pods["runAsUser"], job_pods["runAsGroup"]) == (uid, gid)


def test_the_trainer_starts_on_a_read_only_root_with_the_operators_scratch_folders(trainer_image: InImage) -> None:
    script = "import torch, deepspeed, paralleljob_trainer, paralleljob_contract; print(torch.__version__)"
    out = trainer_image.output(
        ["sh", "-c", f"python -m paralleljob_trainer --help >/dev/null && python -c '{script}'"], writable=SCRATCH
    )
    assert out.splitlines()[-1].startswith("2.13.0")  # after DeepSpeed's "Setting accelerator to CPU" warning
    refused = trainer_image.run(["touch", "/workspace/probe"], writable=SCRATCH)
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr


def test_deepspeeds_cpu_ops_are_built_in(trainer_image: InImage) -> None:
    """The shared-memory comm op (every CPU run) and CPU Adam, compiled at build time: the runtime image has no
    compiler, so an op left to JIT compilation would fail in a pod."""
    script = (
        "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder, CPUAdamBuilder\n"
        "for builder in (ShareMemCommBuilder(), CPUAdamBuilder()):\n"
        "    builder.load(verbose=False)\n"
        "print('loaded')\n"
    )
    assert trainer_image.output(["python", "-c", script], writable=SCRATCH).strip().endswith("loaded")
    assert trainer_image.output(["sh", "-c", "command -v g++ c++ cc || true"]).split() == []


def test_pip_freeze_in_the_image_is_the_two_locks(trainer_image: InImage) -> None:
    """The CPU torch base's lock, the trainer's lock, and the two distributions the image builds itself."""
    expected = locked(REPO / "requirements" / "torch-cpu.lock", REPO / "trainer-image" / "requirements.lock")
    expected |= {"deepspeed": "0.19.8", "paralleljob-trainer": VERSION}
    in_image = frozen(trainer_image.output(["python", "-m", "pip", "list", "--format=freeze"], writable=SCRATCH))
    # pip freeze names PyPI's torch by its local version; the lock pins the public one, which it satisfies.
    in_image["torch"] = in_image["torch"].split("+")[0]
    assert {name: in_image.get(name) for name in expected} == expected
    # Beyond the locks only the base's own packaging tools: Debian's python3-pip and python3-wheel, where
    # python:3.11-slim and the PyTorch images carry pip and wheel too.
    assert set(in_image) - set(expected) <= {"pip", "wheel"}, "a distribution the locks do not pin"
