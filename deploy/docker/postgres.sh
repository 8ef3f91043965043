#!/bin/sh
# Debian's PostgreSQL for a Compose deployment: initialized on first start in /data,
# reachable with a password from the Compose network.
set -e
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
BIN=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
as_postgres() { runuser -u postgres -- "$@"; }
mkdir -p /data && chown postgres:postgres /data && chmod 700 /data
if [ ! -f /data/PG_VERSION ]; then
    echo "$POSTGRES_PASSWORD" > /tmp/pw && chown postgres /tmp/pw
    as_postgres "$BIN/initdb" -D /data -U aenv --pwfile /tmp/pw --auth scram-sha-256 -E UTF8
    rm -f /tmp/pw
    echo "host all all 0.0.0.0/0 scram-sha-256" >> /data/pg_hba.conf
    as_postgres "$BIN/pg_ctl" start -w -D /data -o "-c listen_addresses='' -k /tmp"
    PGPASSWORD="$POSTGRES_PASSWORD" as_postgres "$BIN/psql" -h /tmp -U aenv -d postgres \
        -c "CREATE DATABASE aenv"
    as_postgres "$BIN/pg_ctl" stop -w -D /data
fi
exec runuser -u postgres -- "$BIN/postgres" -D /data -c listen_addresses='*' -k /tmp
