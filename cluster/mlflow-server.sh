#!/usr/bin/env bash
# MLflow tracking server for vacsr sweeps: a database backend (runs, params, metrics) and a shared
# artifact store that the server proxies (--serve-artifacts), so Ray workers need only the server's
# URL and never the bucket's credentials.
#
#   MLFLOW_BACKEND_STORE_URI=postgresql://mlflow@db:5432/mlflow \
#   MLFLOW_ARTIFACTS_DESTINATION=s3://my-bucket/mlflow cluster/mlflow-server.sh
#
# It listens on 127.0.0.1 unless MLFLOW_HOST says otherwise; reaching it from other machines means
# choosing MLFLOW_HOST (and MLFLOW_ALLOWED_HOSTS) on purpose, behind a network you trust or a proxy
# with authentication. Database passwords belong in ~/.pgpass or the environment, not in this file.
set -euo pipefail

backend="${MLFLOW_BACKEND_STORE_URI:?set MLFLOW_BACKEND_STORE_URI, e.g. postgresql://user@host/db or sqlite:////abs/mlflow.db}"
artifacts="${MLFLOW_ARTIFACTS_DESTINATION:?set MLFLOW_ARTIFACTS_DESTINATION, e.g. s3://bucket/mlflow or /shared/mlflow-artifacts}"
host="${MLFLOW_HOST:-127.0.0.1}"
port="${MLFLOW_PORT:-5000}"
mlflow="${MLFLOW_BIN:-mlflow}"
# MLflow's job runner (GenAI evaluation jobs, periodic tasks) starts four more Python processes
# that vacsr never uses: off unless the environment turns it on
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"

# `postgresql://` names no driver, and SQLAlchemy's default for it is psycopg2: where only psycopg 3
# is installed (vacsr's cluster extra), the URL names it
python="$(dirname "$(command -v "$mlflow")")/python"
if [[ "$backend" =~ ^postgres(ql)?:// ]] && ! "$python" -c 'import psycopg2' 2>/dev/null \
    && "$python" -c 'import psycopg' 2>/dev/null; then
  backend="postgresql+psycopg://${backend#*://}"
fi

args=(server --backend-store-uri "$backend" --artifacts-destination "$artifacts" --serve-artifacts
      --host "$host" --port "$port" --workers "${MLFLOW_WORKERS:-2}")
if [[ -n "${MLFLOW_ALLOWED_HOSTS:-}" ]]; then
  args+=(--allowed-hosts "$MLFLOW_ALLOWED_HOSTS")
fi
echo "mlflow server: backend ${backend%%://*}://..., artifacts $artifacts, listening on $host:$port" >&2
exec "$mlflow" "${args[@]}"
