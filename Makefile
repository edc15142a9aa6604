# The two commands of the README. Both set up everything they need (scripts/setup-venvs.sh is idempotent).
.PHONY: demo test venvs

# Train a small model on 2 ranks through the embedded `local` site (no scheduler needed) and show its result.
demo:
	@scripts/setup-venvs.sh main
	.venv/bin/hpcvod submit --site local --tasks-per-node 2 --wait --show-output examples/demo_digits.py

# The whole test suite: unit, multi-rank under three MPI flavours, frameworks, and a real Slurm cluster that
# the test run starts and stops itself.
test:
	@scripts/setup-venvs.sh all
	.venv/bin/python -m pytest

venvs:
	@scripts/setup-venvs.sh all
