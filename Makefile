# The two commands of the README. Each installs what it needs.
.PHONY: demo test acceptance unit lint bench services-up services-down

demo:            ## the reference orders app end to end, on real Kafka
	scripts/demo

test:            ## the whole test suite (unit + integration on real services), lint and types
	scripts/test

acceptance:      ## whole deployments under production-sized load, one at a time (after make test in CI)
	scripts/acceptance

unit:
	scripts/bootstrap && .venv/bin/python -m pytest tests/unit -q

lint:            ## ruff, formatting, mypy strict, and the import layers (import-linter)
	scripts/bootstrap && .venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy \
	  && .venv/bin/lint-imports

bench:
	scripts/bench

services-up:
	scripts/services up

services-down:
	scripts/services down
