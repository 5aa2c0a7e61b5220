"""The operator image as `make images-operator` built it (scripts/build-images.sh, from ./Dockerfile): what a
platform team checks before letting it run. Its run on a cluster, from the chart, is the whole-product test's
(tests/upstream/test_whole_product.py)."""

from __future__ import annotations

import yaml

from tests.images.helpers import REPO, VERSION, InImage, frozen, locked

CHART_VALUES = REPO / "charts" / "paralleljob-operator" / "values.yaml"
# Compilers, linkers and build drivers: a final image that carries one was built in the wrong stage.
BUILD_TOOLS = ("gcc", "cc", "c++", "g++", "clang", "ld", "as", "make", "cmake", "ninja", "nvcc")


def test_the_user_is_numeric_non_root_and_the_charts(operator_image: InImage) -> None:
    uid, gid = operator_image.image.user_ids()
    assert operator_image.image.user == f"{uid}:{gid}", "a numeric USER, so runAsNonRoot is checked without passwd"
    assert uid and uid > 0 and gid and gid > 0
    context = yaml.safe_load(CHART_VALUES.read_text())["podSecurityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid)
    assert operator_image.output(["id", "-u"]).strip() == str(uid)


def test_the_operator_starts_on_a_read_only_root_with_only_the_charts_tmp_writable(operator_image: InImage) -> None:
    """`paralleljob operator` imports everything it runs with (kopf, the kubernetes client, the handlers) and
    parses its flags, as uid 65532, with the root read-only and an emptyDir at /tmp (the chart's only one)."""
    out = operator_image.output(
        ["sh", "-c", "paralleljob operator --help >/dev/null && python -c 'import paralleljob.handlers' && echo ok"],
        writable=("/tmp",),
    )
    assert out.strip() == "ok"
    refused = operator_image.run(["touch", "/opt/paralleljob/probe"], writable=("/tmp",))
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr


def test_no_build_tools_in_the_final_image(operator_image: InImage) -> None:
    found = operator_image.output(["sh", "-c", f"for t in {' '.join(BUILD_TOOLS)}; do command -v $t; done; true"])
    assert found.split() == []
    packages = frozen(operator_image.output(["python", "-m", "pip", "list", "--format=freeze"]))
    assert {"setuptools", "wheel"}.isdisjoint(packages), "the builder's build backend left in the final image"


def test_pip_freeze_in_the_image_is_the_lock(operator_image: InImage) -> None:
    """Exactly the hashed lock and the package itself (and the virtual environment's own pip); setuptools, the
    lock's build backend, is uninstalled by the builder once the package is built."""
    expected = locked(REPO / "requirements" / "operator.lock")
    expected.pop("setuptools")
    expected["paralleljob"] = VERSION
    in_image = frozen(operator_image.output(["python", "-m", "pip", "list", "--format=freeze"], writable=("/tmp",)))
    assert in_image.pop("pip", None) is not None
    assert in_image == expected


def test_the_operator_runs_as_a_uid_without_a_passwd_entry(operator_image: InImage) -> None:
    """The image's user, 65532, has no /etc/passwd entry (none is needed for runAsNonRoot). kopf named the operator
    user@host by looking the user up, and the operator exited with `getpwuid(): uid not found: 65532` at once; it
    now names itself. Against an API server that is not there, it keeps trying until `timeout` stops it."""
    kubeconfig = (
        "apiVersion: v1\\nkind: Config\\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\\n"
        "users: [{name: u, user: {token: t}}]\\ncontexts: [{name: x, context: {cluster: c, user: u}}]\\n"
        "current-context: x\\n"
    )
    command = (
        f"printf '{kubeconfig}' > /tmp/kubeconfig && "
        "timeout 15 paralleljob operator --all-namespaces --kubeconfig /tmp/kubeconfig --liveness= "
        "--metrics-port 0 --log-format plain --admission-lock=none"
    )
    done = operator_image.run(["sh", "-c", command], writable=("/tmp",))
    assert "getpwuid" not in done.stdout + done.stderr, done.stderr[-2000:]
    assert done.returncode == 124, f"the operator stopped by itself ({done.returncode}): {done.stderr[-2000:]}"
