#!/usr/bin/env bash
# A private PostgreSQL server for the tests of the Postgres store backend (koder-store's tests
# and the daemon's store test read its URL from KODER_TEST_PG_URL; see scripts/test.sh).
#
# Installs Debian's `postgresql` when no server binaries are present, then makes sure one
# cluster of the project's own runs: data under $KODER_TEST_PG_DIR (default
# /var/cache/koder-sandbox-test/pg), listening on 127.0.0.1:$KODER_TEST_PG_PORT (default 55432,
# away from a system cluster's 5432) and on a unix socket in that directory, trust
# authentication for local connections only. Idempotent: a running cluster is left alone, a
# stopped one is started, a missing one is created. Databases that test runs left behind
# (`koder_test_*`, e.g. after a panic) are dropped. The last line printed is the URL.
set -euo pipefail

PG_DIR=${KODER_TEST_PG_DIR:-/var/cache/koder-sandbox-test/pg}
PG_PORT=${KODER_TEST_PG_PORT:-55432}
DATA=$PG_DIR/data

bindir() {
  # The newest installed major version.
  find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/initdb' 2>/dev/null |
    sort -V | tail -n 1 | xargs -r dirname
}

BIN=$(bindir)
if [ -z "$BIN" ]; then
  echo "setup-postgres: installing Debian's postgresql" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2
  BIN=$(bindir)
fi
[ -n "$BIN" ] || { echo "setup-postgres: no PostgreSQL server binaries" >&2; exit 1; }

# The server refuses to run as root: as root, the cluster belongs to the `postgres` account.
if [ "$(id -u)" = 0 ]; then
  OWNER=postgres
  as_owner() { runuser -u "$OWNER" -- "$@"; }
else
  OWNER=$(id -un)
  as_owner() { "$@"; }
fi

mkdir -p "$PG_DIR"
chown "$OWNER" "$PG_DIR"
chmod 0700 "$PG_DIR"

if [ ! -s "$DATA/PG_VERSION" ]; then
  rm -rf "$DATA"
  as_owner "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --no-locale >&2
  cat >>"$DATA/postgresql.conf" <<EOF
# koder-sandbox test cluster
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_DIR'
max_connections = 300
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
  # Trust, but only over the socket and loopback.
  cat >"$DATA/pg_hba.conf" <<EOF
local all all trust
host  all all 127.0.0.1/32 trust
EOF
fi

if ! as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  as_owner "$BIN/pg_ctl" -D "$DATA" -l "$PG_DIR/server.log" -w -t 60 start >&2
fi

PSQL=("$BIN/psql" -h "$PG_DIR" -p "$PG_PORT" -U postgres -d postgres -X -q -v ON_ERROR_STOP=1)
for _ in $(seq 50); do
  "$BIN/pg_isready" -h "$PG_DIR" -p "$PG_PORT" -q && break
  sleep 0.2
done
leftover=$(as_owner "${PSQL[@]}" -At -c \
  "SELECT datname FROM pg_database WHERE datname LIKE 'koder\_test\_%'")
for db in $leftover; do
  as_owner "${PSQL[@]}" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >&2
done

echo "postgres://postgres@127.0.0.1:$PG_PORT/postgres"
