#!/usr/bin/env bash
# The reference Odoo 19 addon `vworkspace` (odoo/addons/vworkspace) against a REAL Odoo 19
# server (docs/connectivity/odoo-addon.md).
#
#   hack/odoo.sh deps          Debian's packages Odoo 19 needs (only the missing ones)
#   hack/odoo.sh db-up         Debian's PostgreSQL 15 running, role `odoo` (password, CREATEDB) and
#                              the OS user's role for the Unix socket (peer authentication, CREATEDB)
#   hack/odoo.sh db-kill       SIGKILLs PostgreSQL's postmaster (a crash: `just chaos`); db-up
#                              starts it again, with crash recovery
#   hack/odoo.sh test          a fresh database, the addon installed with its tests; fails on any failure
#   hack/odoo.sh init DB       a fresh database DB with base, rpc, web and vworkspace
#   hack/odoo.sh serve DB PORT [ODOO-BIN ARGS]
#                              Odoo on 127.0.0.1:PORT serving only DB (foreground; exec: the
#                              process is odoo-bin itself, so a signal to it stops Odoo)
#   hack/odoo.sh admin-key DB  prints a new rpc API key of `admin` (1 day), for JSON-2 as admin
#   hack/odoo.sh update DB     the vworkspace addon of DB updated (`-u vworkspace`) to this checkout's
#   hack/odoo.sh cluster DB NAME [KEY...]
#                              creates the vworkspace.cluster NAME (its bot user; an active record of
#                              that name is reused, keeping its binding) and prints one
#                              JSON line {"id", "name", "bot", "keys": {KEY: key}}; KEY is
#                              `rpc` (a valid key), `expired` (scope rpc, expired an hour ago),
#                              `expires-in:N` (scope rpc, valid for N seconds) or `scope:S`
#                              (valid, of scope S)
#   hack/odoo.sh drop DB       drops DB (open connections closed)
#
# Settings: VWS_ODOO_SRC (Odoo 19.0's source; default <repo>/../shared/odoo-19 where it exists),
# VWS_ODOO_DB_USER / VWS_ODOO_DB_PASSWORD (odoo / odoo), VWS_ODOO_DB_HOST (127.0.0.1),
# VWS_ODOO_DB_SOCKET=1 (PostgreSQL over its Unix socket /var/run/postgresql as the role of the
# OS user, peer authentication, no password: what works inside the local cluster's network
# namespace, where the host's TCP 127.0.0.1 is not reachable; db-up creates that role),
# VWS_ODOO_LOG_DIR (<repo>/target/odoo), VWS_ODOO_SERVE_LOG (serve's log file; default
# <log dir>/serve-DB.log, empty: stderr), VWS_ODOO_CLOCK_OFFSET (seconds: Odoo's clock shifted,
# e.g. -7200 for a server two hours late; with freezegun). Odoo's own log goes to a file there;
# on a failure its tail is printed.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HACK_DIR/.." && pwd)"
PY=/usr/bin/python3 # Debian's: a pyenv or virtualenv python3 first on PATH lacks Debian's packages
TCP_USER="${VWS_ODOO_DB_USER:-odoo}"
TCP_PASSWORD="${VWS_ODOO_DB_PASSWORD:-odoo}"
TCP_HOST="${VWS_ODOO_DB_HOST:-127.0.0.1}"
DB_USER="$TCP_USER" DB_PASSWORD="$TCP_PASSWORD" DB_HOST="$TCP_HOST"
SOCKET_USER="$(id -un)"
if [[ -n ${VWS_ODOO_DB_SOCKET:-} ]]; then
  # Unix socket, peer authentication: the role is the OS user's, without a password.
  DB_HOST="" DB_USER="$SOCKET_USER" DB_PASSWORD=""
fi
LOG_DIR="${VWS_ODOO_LOG_DIR:-$REPO_ROOT/target/odoo}"
PG_VERSION=15

# Exactly the list of /work/shared/odoo-19/README.md (debian/control's Depends), plus PostgreSQL,
# plus the browser the demo drives.
DEB_PACKAGES=(
  postgresql postgresql-client python3-babel python3-cbor2 python3-chardet
  python3-cryptography python3-dateutil python3-docutils python3-freezegun python3-geoip2
  python3-gevent python3-greenlet python3-idna python3-pil python3-jinja2 python3-libsass
  python3-lxml python3-magic python3-markupsafe python3-num2words python3-ofxparse python3-openpyxl
  python3-passlib python3-polib python3-psutil python3-psycopg2 python3-openssl python3-pypdf2
  python3-rjsmin python3-qrcode python3-renderpm python3-reportlab python3-requests python3-stdnum
  python3-tz python3-urllib3 python3-vobject python3-werkzeug python3-xlsxwriter python3-xlrd
  python3-zeep python3-asn1crypto
  # `just demo`'s check of what a person sees in Odoo's web client (hack/odoo_browser.py).
  chromium python3-websocket
)

die() { echo "hack/odoo.sh: $*" >&2; exit 1; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
as_root() { if [[ $(id -u) == 0 ]]; then "$@"; else sudo "$@"; fi; }
as_postgres() { as_root runuser -u postgres -- "$@"; }

odoo_src() {
  local src="${VWS_ODOO_SRC:-}"
  if [[ -z $src && -d $REPO_ROOT/../shared/odoo-19 ]]; then src="$REPO_ROOT/../shared/odoo-19"; fi
  if [[ -z $src || ! -f $src/odoo-bin ]]; then
    die "no Odoo 19 source: set VWS_ODOO_SRC to an Odoo 19.0 tree${src:+ ($src has no odoo-bin)}; on a machine with internet access \`git clone --depth 1 -b 19.0 https://github.com/odoo/odoo\` works"
  fi
  (cd "$src" && pwd)
}

addons_path() {
  local odoo="$1" path="$1/odoo/addons,$1/addons"
  # The trimmed tree of shared/ has addons-stubs/ (base's module list needs them); a full clone does not.
  if [[ -d $odoo/addons-stubs ]]; then path+=",$odoo/addons-stubs"; fi
  echo "$path,$REPO_ROOT/odoo/addons"
}

db_args() { # odoo-bin's connection flags (none for the socket's defaults)
  if [[ -n $DB_HOST ]]; then printf '%s\n' "--db_host=$DB_HOST"; fi
  printf '%s\n' "--db_user=$DB_USER"
  if [[ -n $DB_PASSWORD ]]; then printf '%s\n' "--db_password=$DB_PASSWORD"; fi
}

# odoo-bin under freezegun (one of Odoo's own Debian dependencies), its clock shifted by
# VWS_ODOO_CLOCK_OFFSET seconds and ticking: Odoo's datetime and time say "now + offset".
# logging's converter is put back (freezegun's fake_localtime, bound as a method of the
# Formatter class, breaks every log line).
CLOCK_SHIFT_PY='
import datetime, logging, os, runpy, sys, time
real_localtime = time.localtime
import freezegun
offset = float(os.environ["VWS_ODOO_CLOCK_OFFSET"])
freezegun.freeze_time(datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset), tick=True).start()
logging.Formatter.converter = staticmethod(real_localtime)
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
'

odoo_bin() { # [exec] [COMMAND] DB, then more odoo-bin arguments
  local odoo run="" command=() db dbflags shift_clock=()
  if [[ $1 == exec ]]; then run=exec; shift; fi
  if [[ $1 == shell ]]; then command=(shell); shift; fi
  db="$1"; shift
  odoo="$(odoo_src)"
  mapfile -t dbflags < <(db_args)
  if [[ -n ${VWS_ODOO_CLOCK_OFFSET:-} ]]; then shift_clock=(-c "$CLOCK_SHIFT_PY"); fi
  # odoo-bin prints its warning about root before its log file is open: not on the terminal.
  $run "$PY" "${shift_clock[@]}" "$odoo/odoo-bin" --addons-path="$(addons_path "$odoo")" "${command[@]}" -d "$db" \
    "${dbflags[@]}" "$@" \
    2> >(grep --line-buffered -v "^Running as user .root. is a security risk" >&2)
}

pg_conn() { # psql/dropdb connection flags
  if [[ -n $DB_HOST ]]; then printf '%s\n' -h "$DB_HOST"; fi
  printf '%s\n' -U "$DB_USER"
}

drop_db() {
  local conn; mapfile -t conn < <(pg_conn)
  PGPASSWORD="$DB_PASSWORD" dropdb "${conn[@]}" --if-exists --force "$1"
}

# The role of the OS user for the Unix socket (peer authentication, so no password), with
# CREATEDB: Odoo started inside a network namespace reaches PostgreSQL only through the socket.
# Starts nothing: PostgreSQL must be running (db-up, outside any network namespace).
ensure_socket_role() {
  as_postgres pg_isready -q || die "PostgreSQL is not running: run hack/odoo.sh db-up outside the cluster's network namespace"
  if [[ $(as_postgres psql -qtAc "SELECT 1 FROM pg_roles WHERE rolname = '$SOCKET_USER'") != 1 ]]; then
    as_postgres psql -q -v ON_ERROR_STOP=1 -c "CREATE ROLE \"$SOCKET_USER\" LOGIN CREATEDB"
    echo "db-up: role $SOCKET_USER created (Unix socket, peer authentication)" >&2
  fi
  psql -d postgres -qtAc 'SELECT 1' >/dev/null || die "cannot log in as $SOCKET_USER over the Unix socket"
}

show_log_tail() {
  echo "--- last 80 lines of $1 ---" >&2
  tail -n 80 "$1" >&2 || true
}

cmd_deps() {
  local missing=() p
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    echo "deps: all ${#DEB_PACKAGES[@]} Debian packages are installed"
    return
  fi
  echo "deps: installing ${missing[*]}"
  "$HACK_DIR/apt-install.sh" "${missing[@]}"
}

cmd_db_up() {
  command -v pg_lsclusters >/dev/null || die "PostgreSQL is not installed: run hack/odoo.sh deps"
  if ! pg_lsclusters -h | awk -v v="$PG_VERSION" '$1 == v && $2 == "main"' | grep -q .; then
    as_root pg_createcluster "$PG_VERSION" main >/dev/null
  fi
  if ! pg_lsclusters -h | awk -v v="$PG_VERSION" '$1 == v && $2 == "main" && $4 == "online"' | grep -q .; then
    as_root pg_ctlcluster "$PG_VERSION" main start
  fi
  local i
  for i in $(seq 1 30); do
    as_postgres pg_isready -q && break
    sleep 0.5
  done
  as_postgres pg_isready -q || die "PostgreSQL $PG_VERSION did not come up (pg_lsclusters: $(pg_lsclusters -h))"
  if [[ $(as_postgres psql -qtAc "SELECT 1 FROM pg_roles WHERE rolname = '$TCP_USER'") != 1 ]]; then
    as_postgres psql -q -v ON_ERROR_STOP=1 -c "CREATE ROLE \"$TCP_USER\" LOGIN CREATEDB PASSWORD '$TCP_PASSWORD'"
    echo "db-up: role $TCP_USER created"
  fi
  ensure_socket_role
  if [[ -z ${VWS_ODOO_DB_SOCKET:-} ]]; then
    PGPASSWORD="$TCP_PASSWORD" psql -h "$TCP_HOST" -U "$TCP_USER" -d postgres -qtAc 'SELECT 1' >/dev/null ||
      die "cannot log in as $TCP_USER on $TCP_HOST"
  fi
  echo "db-up: PostgreSQL $PG_VERSION is running, role $TCP_USER (password) on $TCP_HOST, role $SOCKET_USER over the Unix socket"
}

cmd_db_kill() {
  local datadir pid i
  datadir=$(pg_lsclusters -h | awk -v v="$PG_VERSION" '$1 == v && $2 == "main" { print $6 }')
  [[ -n $datadir ]] || die "no PostgreSQL $PG_VERSION cluster main (pg_lsclusters)"
  pid=$(as_root head -1 "$datadir/postmaster.pid" 2>/dev/null) || die "PostgreSQL is not running (no $datadir/postmaster.pid)"
  as_root kill -KILL "$pid" 2>/dev/null || die "PostgreSQL's postmaster $pid is not running"
  for i in $(seq 1 50); do
    as_root kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "db-kill: PostgreSQL $PG_VERSION's postmaster (pid $pid) killed"
}

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# odoo-bin on DB with MODULES installed (creating the database if it does not exist), its log in LOG.
install_db() { # DB MODULES LOG, then more odoo-bin arguments
  local db="$1" modules="$2" log="$3"; shift 3
  mkdir -p "$(dirname "$log")"
  : >"$log"
  if ! odoo_bin "$db" -i "$modules" --stop-after-init --without-demo \
    --http-interface=127.0.0.1 --http-port="$(free_port)" --logfile="$log" "$@"; then
    show_log_tail "$log"
    return 1
  fi
}

cmd_init() {
  local db="${1:?usage: hack/odoo.sh init DB}" t log="$LOG_DIR/init-$1.log"
  odoo_src >/dev/null
  if [[ -n ${VWS_ODOO_DB_SOCKET:-} ]]; then ensure_socket_role; fi
  t=$(now)
  drop_db "$db"
  echo "init: database $db dropped if it existed ($(took "$t"))"
  t=$(now)
  install_db "$db" base,rpc,web,vworkspace "$log" || die "init of $db failed (log: $log)"
  echo "init: database $db created with base, rpc, web and vworkspace in $(took "$t") (log: $log)"
}

cmd_update() {
  local db="${1:?usage: hack/odoo.sh update DB}" t log="$LOG_DIR/update-$1.log"
  odoo_src >/dev/null
  if [[ -n ${VWS_ODOO_DB_SOCKET:-} ]]; then ensure_socket_role; fi
  t=$(now)
  mkdir -p "$LOG_DIR"
  : >"$log"
  if ! odoo_bin "$db" -u vworkspace --stop-after-init --http-interface=127.0.0.1 --http-port="$(free_port)" \
    --logfile="$log"; then
    show_log_tail "$log"
    die "update of vworkspace in $db failed (log: $log)"
  fi
  echo "update: vworkspace updated in $db in $(took "$t") (log: $log)"
}

cmd_test() {
  local db="${VWS_ODOO_TEST_DB:-vws_test}" t t0 log="$LOG_DIR/test.log" rc=0
  odoo_src >/dev/null
  t0=$(now)
  t=$(now)
  drop_db "$db"
  echo "test: old database $db dropped ($(took "$t"))"
  # Two runs: with --test-enable, odoo-bin imports the tests of every module it installs, and
  # those of web import http_routing's, which the trimmed Odoo of shared/ does not ship.
  t=$(now)
  install_db "$db" base,rpc,web "$LOG_DIR/test-init.log" || die "creating $db failed (log: $LOG_DIR/test-init.log)"
  echo "test: database $db created with base, rpc and web: $(took "$t") (log: $LOG_DIR/test-init.log)"
  t=$(now)
  install_db "$db" vworkspace "$log" --test-enable --test-tags /vworkspace || rc=$?
  echo "test: vworkspace installed and its tests run: $(took "$t") (log: $log)"
  # Odoo's own account of its steps (timestamps of its log).
  "$PY" - "$log" <<'EOF' || true
import re, sys
from datetime import datetime
lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
def at(pattern):
    for line in lines:
        if re.search(pattern, line):
            return datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S"), line
    return None, None
vws, _ = at(r"Loading module vworkspace \(")
at_install, _ = at(r"odoo\.addons\.vworkspace\.tests\.")
loaded, _ = at(r"Modules loaded\.")
post, post_line = at(r"post-tests in")
if vws and at_install:
    print(f"test:   vworkspace installed (tables, data, views): {(at_install - vws).total_seconds():.0f} s (Odoo's log)")
if at_install and loaded:
    print(f"test:   at_install tests: {(loaded - at_install).total_seconds():.0f} s (Odoo's log)")
if post_line:
    print("test:   " + re.sub(r"^.*?(\d+ post-tests in [0-9.]+s).*$", r"\1", post_line) + " (Odoo's log)")
EOF
  local summary failed=0 errors=0 total=0
  summary=$(grep -E 'odoo\.tests\.result: .*[0-9]+ failed, [0-9]+ error\(s\) of [0-9]+ tests' "$log" | tail -n 1 || true)
  if [[ $summary =~ ([0-9]+)\ failed,\ ([0-9]+)\ error\(s\)\ of\ ([0-9]+)\ tests ]]; then
    failed=${BASH_REMATCH[1]} errors=${BASH_REMATCH[2]} total=${BASH_REMATCH[3]}
  fi
  local passed=$((total - failed - errors))
  if ((passed < 0)); then passed=0; fi
  # odoo-bin's exit code and its summary line decide (an ERROR line alone does not: Odoo logs the
  # serialisation failure it then retries as "ERROR ... bad query", and the concurrency test makes one).
  if ((rc != 0 || failed + errors > 0 || total == 0)); then
    grep -E ' (ERROR|CRITICAL) \S+ odoo\.(addons\.vworkspace|tests|modules)' "$log" | head -n 40 >&2 || true
    show_log_tail "$log"
    echo "test: total $(took "$t0")"
    echo "odoo: $passed passed, $((failed + errors > 0 ? failed + errors : 1)) failed"
    die "the vworkspace tests failed (odoo-bin exit $rc; ${summary:-no test summary in the log}; log: $log)"
  fi
  echo "test: total $(took "$t0")"
  echo "odoo: $passed passed, 0 failed"
  if [[ -z ${VWS_ODOO_KEEP_DB:-} ]]; then drop_db "$db"; fi
}

cmd_serve() {
  local db="${1:?usage: hack/odoo.sh serve DB PORT}" port="${2:?usage: hack/odoo.sh serve DB PORT}"
  shift 2
  local log="${VWS_ODOO_SERVE_LOG-$LOG_DIR/serve-$db.log}" logfile=()
  if [[ -n $log ]]; then logfile=(--logfile="$log"); fi
  mkdir -p "$LOG_DIR"
  echo "serve: http://127.0.0.1:$port/odoo (database $db only; log: ${log:-stderr})" >&2
  # exec: this process becomes odoo-bin, so whoever started it stops Odoo with one signal.
  odoo_bin exec "$db" --db-filter="^${db}\$" --http-interface=127.0.0.1 --http-port="$port" \
    "${logfile[@]}" "$@"
}

# Python run by `odoo-bin shell` on DB with `env` (superuser); its stdout is printed, Odoo's own
# log goes to LOG_DIR/shell-DB.log. The script reads its arguments from the environment.
odoo_shell() { # DB SCRIPT
  local db="$1" script="$2" log="$LOG_DIR/shell-$1.log"
  mkdir -p "$LOG_DIR"
  if ! odoo_bin shell "$db" --no-http --max-cron-threads=0 --log-level=warn --logfile="$log" <<<"$script"; then
    show_log_tail "$log"
    die "odoo-bin shell on $db failed (log: $log)"
  fi
}

cmd_admin_key() {
  local db="${1:?usage: hack/odoo.sh admin-key DB}"
  odoo_shell "$db" '
from datetime import timedelta
from odoo import fields
admin = env.ref("base.user_admin")
key = env["res.users.apikeys"].with_user(admin).sudo()._generate(
    "rpc", "vworkspace e2e admin", fields.Datetime.now() + timedelta(days=1))
env.cr.commit()
print(key)
'
}

cmd_cluster() {
  local db="${1:?usage: hack/odoo.sh cluster DB NAME [KEY...]}" name="${2:?usage: hack/odoo.sh cluster DB NAME [KEY...]}"
  shift 2
  VWS_SHELL_NAME="$name" VWS_SHELL_KEYS="$*" odoo_shell "$db" '
import json, os
from datetime import timedelta
from odoo import fields
name, wanted = os.environ["VWS_SHELL_NAME"], os.environ["VWS_SHELL_KEYS"].split()
clusters = env["vworkspace.cluster"].sudo()
cluster = clusters.search([("name", "=", name)], limit=1) or clusters.create({"name": name})
bot_keys = env["res.users.apikeys"].with_user(cluster.bot_user_id).sudo()
now = fields.Datetime.now()
keys = {}
for spec in wanted:
    if spec == "rpc":
        keys[spec] = cluster._generate_api_key(days=1)
    elif spec == "expired":
        # sudo: _check_expiration_date is skipped, so an expiry in the past is accepted.
        keys[spec] = bot_keys._generate("rpc", "%s: expired key" % name, now - timedelta(hours=1))
    elif spec.startswith("expires-in:") and spec[11:].isdigit():
        keys[spec] = bot_keys._generate("rpc", "%s: key for %s s" % (name, spec[11:]), now + timedelta(seconds=int(spec[11:])))
    elif spec.startswith("scope:") and len(spec) > 6:
        keys[spec] = bot_keys._generate(spec[6:], "%s: key of scope %s" % (name, spec[6:]), now + timedelta(days=1))
    else:
        raise SystemExit("unknown key %r: rpc, expired, expires-in:SECONDS or scope:S" % spec)
env.cr.commit()
print(json.dumps({"id": cluster.id, "name": cluster.name, "bot": cluster.bot_user_id.login, "keys": keys}))
'
}

cmd_drop() {
  local db="${1:?usage: hack/odoo.sh drop DB}"
  drop_db "$db"
  echo "drop: database $db dropped if it existed"
}

case "${1:-}" in
  deps) cmd_deps ;;
  db-up) cmd_db_up ;;
  db-kill) cmd_db_kill ;;
  test) cmd_test ;;
  init) shift; cmd_init "$@" ;;
  update) shift; cmd_update "$@" ;;
  serve) shift; cmd_serve "$@" ;;
  admin-key) shift; cmd_admin_key "$@" ;;
  cluster) shift; cmd_cluster "$@" ;;
  drop) shift; cmd_drop "$@" ;;
  *)
    sed -n '2,/^set -euo pipefail/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
    [[ -z ${1:-} ]] || exit 2
    ;;
esac
