#!/usr/bin/env bash
# Make sure the servers the tests need are up: Redis on 127.0.0.1:6379, PostgreSQL on
# 127.0.0.1:5432 (trust auth, database "test") and RabbitMQ on 127.0.0.1:5672 (guest/guest, for
# the priority tests), and that Debian's Chromium is there for the run pages' browser tests.
# Starts what is not running; installs what is missing (Debian packages, as root). Idempotent:
# running it twice changes nothing.
set -euo pipefail

REDIS_PORT=${RATCHET_TEST_REDIS_PORT:-6379}
PG_PORT=${RATCHET_TEST_PG_PORT:-5432}
PG_DATA=${RATCHET_TEST_PG_DATA:-/var/tmp/ratchet-pg}

say() { echo "services: $*"; }
apt_ready=""
need_pkg() {  # need_pkg COMMAND PACKAGE...
  command -v "$1" >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] || { say "$1 is missing and this is not root: install ${*:2}"; exit 1; }
  if [ -z "$apt_ready" ]; then apt-get update -qq >/dev/null; apt_ready=1; fi
  say "installing ${*:2}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${@:2}" >/dev/null
}
wait_for() {  # wait_for SECONDS COMMAND...
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

# --- Redis -------------------------------------------------------------------------------
redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping | grep -q PONG; }
need_pkg redis-cli redis-server redis-tools
if ! redis_up; then
  need_pkg redis-server redis-server
  say "starting redis on 127.0.0.1:$REDIS_PORT"
  mkdir -p /var/tmp/ratchet-redis
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
    --dir /var/tmp/ratchet-redis --logfile /var/tmp/ratchet-redis/redis.log
  wait_for 20 redis_up || { say "redis did not start"; exit 1; }
fi
say "redis ok on 127.0.0.1:$REDIS_PORT"

# --- PostgreSQL --------------------------------------------------------------------------
pg_up() { psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -Atc 'select 1' | grep -q 1; }
need_pkg psql postgresql postgresql-client
if ! pg_up; then
  need_pkg pg_ctlcluster postgresql
  if ls /etc/postgresql/*/main >/dev/null 2>&1; then
    ver=$(ls /etc/postgresql | sort -V | tail -n 1)
    say "starting the system cluster $ver/main"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start >/dev/null 2>&1 || true
  fi
  if ! wait_for 15 pg_up; then
    # No usable cluster with trust auth on this port: make a private one.
    bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    say "creating a private cluster in $PG_DATA on port $PG_PORT"
    id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql postgres
    if [ ! -f "$PG_DATA/PG_VERSION" ]; then
      mkdir -p "$PG_DATA" && chown postgres "$PG_DATA"
      runuser -u postgres -- "$bindir/initdb" -D "$PG_DATA" -A trust -U postgres >/dev/null
    fi
    runuser -u postgres -- "$bindir/pg_ctl" -D "$PG_DATA" -l "$PG_DATA/log" \
      -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1" start >/dev/null
    wait_for 30 pg_up || { say "postgresql did not start; see $PG_DATA/log"; exit 1; }
  fi
fi
if ! psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -Atc "select 1 from pg_database where datname='test'" | grep -q 1; then
  psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -qc 'create database test'
fi
say "postgresql ok on 127.0.0.1:$PG_PORT (database test)"

# --- RabbitMQ ----------------------------------------------------------------------------
amqp_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }
if ! amqp_up; then
  need_pkg rabbitmq-server rabbitmq-server
  say "starting rabbitmq on 127.0.0.1:5672"
  rabbitmq-server -detached >/dev/null 2>&1 || true
  wait_for 90 amqp_up || { say "rabbitmq did not start"; exit 1; }
fi
say "rabbitmq ok on 127.0.0.1:5672"

# --- Chromium ----------------------------------------------------------------------------
# The run pages' browser tests (tests/integration/test_ui.py) and benchmark (bench/page.py)
# drive Debian's chromium through Playwright: never a browser Playwright downloads itself.
if [ ! -x /usr/bin/chromium ]; then
  [ "$(id -u)" = 0 ] || { say "chromium is missing and this is not root: install chromium chromium-driver"; exit 1; }
  if [ -z "$apt_ready" ]; then apt-get update -qq >/dev/null; apt_ready=1; fi
  say "installing chromium chromium-driver"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
say "chromium ok: $(/usr/bin/chromium --version 2>/dev/null | head -n 1)"

# --- promtool ----------------------------------------------------------------------------
# tests/integration/test_prometheus_metrics.py checks /metrics with `promtool check metrics`,
# from Debian's prometheus package (the server is not started: only its tool is used).
if ! command -v promtool >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { say "promtool is missing and this is not root: install prometheus"; exit 1; }
  if [ -z "$apt_ready" ]; then apt-get update -qq >/dev/null; apt_ready=1; fi
  say "installing prometheus (for promtool)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
say "promtool ok: $(promtool --version 2>&1 | head -n 1)"
