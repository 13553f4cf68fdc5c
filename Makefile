# The two commands of the README: `make demo` and `make test`. Both set up
# what is missing first (Debian packages, .venv, containerd stubs).
.PHONY: setup demo test lint unit up down bench

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/corral demo

test: setup
	bash scripts/test.sh

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy --check-untyped-defs

unit: setup
	.venv/bin/pytest -q -n auto tests/unit

up: setup
	.venv/bin/corral up

down:
	.venv/bin/corral down

bench: up  # every mode measures the running stack
	.venv/bin/corral bench
