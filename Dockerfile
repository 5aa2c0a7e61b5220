# syntax=docker/dockerfile:1
# The ParallelJob operator image: `docker build -t paralleljob-operator:0.1.0 .` from the repository root.
#
# Two stages, after uv's multi-stage example: the builder installs the locked dependencies and the package into
# a virtual environment; the final stage copies only that environment onto a slim Python base and runs as a
# numeric non-root user, so Kubernetes can verify runAsNonRoot without a passwd lookup.
# The trainer has its own image (trainer-image/Dockerfile); this one carries neither torch nor DeepSpeed.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/paralleljob \
    PATH=/opt/paralleljob/bin:$PATH

RUN python -m venv "${VIRTUAL_ENV}"

WORKDIR /src

# Dependencies first, in their own layer: they change far less often than the code. Every distribution is
# pinned and hashed (scripts/lock-operator-deps.sh), and --no-deps makes pip install exactly the lock.
COPY requirements/operator.lock requirements/operator.lock
RUN pip install --require-hashes --no-deps -r requirements/operator.lock

# The package itself, built with the locked setuptools from above rather than an unpinned isolated one.
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY trainer-image/paralleljob_trainer/ trainer-image/paralleljob_trainer/
COPY trainer-image/paralleljob_contract/ trainer-image/paralleljob_contract/
RUN pip install --no-deps --no-build-isolation . \
    && pip uninstall --yes setuptools \
    && paralleljob --help >/dev/null

FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="paralleljob-operator" \
      org.opencontainers.image.description="Kubernetes operator for multi-node 3D-parallel DeepSpeed training" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/paralleljob \
    PATH=/opt/paralleljob/bin:$PATH

COPY --from=builder /opt/paralleljob /opt/paralleljob

# 65532 is the conventional "nonroot" uid of distroless images; the chart's securityContext uses the same ids.
USER 65532:65532

# kopf's liveness endpoint and the Prometheus metrics (the chart's defaults).
EXPOSE 8080 9090

ENTRYPOINT ["paralleljob", "operator"]
