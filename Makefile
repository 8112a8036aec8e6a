# Conveniences; README's two commands need none of this.
.PHONY: test bench
test:
	bash scripts/test.sh
bench:
	@for b in bench/*.py; do .venv/bin/python $$b || python3 $$b || exit 1; done
