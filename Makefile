# Conveniences; README's two commands need none of this.
PY ?= $(shell [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)
.PHONY: test bench
test:
	bash scripts/test.sh
bench:
	@for b in bench/[!_]*.py; do $(PY) $$b || exit 1; done
