#!/usr/bin/env bash
# The pgfence benchmark: one command, every number side by side on the local
# PostgreSQL (127.0.0.1:5432, user postgres).  See bench/README.md.
#
#   bench/run.sh               # the full run (about 33 minutes on 2 cores)
#   bench/run.sh --quick       # a smoke run: small N, one run each
#   bench/run.sh --only soak   # the soak section (opt-in: about 85 minutes; --quick: about 6)
#   bench/run.sh --help
#
# It makes bench/.venv (pgqueuer, procrastinate, Celery, Dramatiq, py-spy: never in the
# project's own environment) and uses the project's .venv for pgfence itself,
# creating it if it is missing (with the embedded PostgreSQL the soak section runs on).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
PY=${PYTHON:-python3}

# The help needs nothing installed: the command line is declared in
# bench/options.py, standard library only.
for arg in "$@"; do
  case $arg in -h|--help) exec "$PY" "$here/options.py" --help;; esac
done

if [ ! -x "$here/.venv/bin/python" ] || ! cmp -s "$here/requirements.txt" "$here/.venv/requirements.txt"; then
  echo "bench: installing bench/.venv from bench/requirements.txt" >&2
  "$PY" -m venv "$here/.venv"
  "$here/.venv/bin/pip" install --quiet -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$here/.venv/requirements.txt"
fi
if [ ! -x "$root/.venv/bin/pgfence" ]; then
  echo "bench: installing pgfence into .venv" >&2
  "$PY" -m venv "$root/.venv"
  "$root/.venv/bin/pip" install --quiet -e "$root[embedded]"
fi
export PGFENCE_BENCH_PROJECT_PYTHON="$root/.venv/bin/python"
exec "$here/.venv/bin/python" "$here/run.py" "$@"
