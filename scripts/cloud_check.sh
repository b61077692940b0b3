#!/usr/bin/env bash
# The cloud gate: checks the ARTIFACT CloudFormation and Lambda receive, not the source tree.
#
#  1. template: samtranslator expands template.yaml as `sam package` + the SAM transform hand it
#     to CloudFormation; cfn-lint on that translated template: no error, no dependency cycle
#     (E3004) — scripts/cloud_template.py lint;
#  2. scanners: checkov on the translated template, then cfn-guard with the AWS Control Tower
#     proactive controls' rules (the npm package @cdklabs/cdk-validator-cfnguard, pinned in
#     scripts/cloud_template.py, installed into .cfn-guard/ on first use: needs npm) and the
#     well-architected rule sets vendored in infra/guard-rules/; every
#     finding must be listed with its reason in infra/accepted-findings.yaml, and an
#     acceptance that matches no finding fails too — scripts/cloud_template.py scan, guard;
#  3. build: scripts/sam_check.sh (sam validate --lint, sam build for arm64 as deployed), the
#     built sizes per function and layer against Lambda's 250 MB unzipped limit, and — on a host
#     that is not arm64 — a second sam build of the same template for the host's architecture
#     (same requirements, same packaging; only the platform of the binary wheels differs), which
#     is what the next step can execute;
#  4. run: every function of the template from its build folder + the built layer, in
#     `python3.12 -I -S` workers, boto3/botocore from a separate runtime directory, against moto
#     running out of process; each function's events/ samples, then the end-to-end MCP flow with
#     the state machines executed on moto, then the operator's `engram-memory admin --stack`
#     commands and its smoke command (the project venv's CLI, made when missing) through an
#     HTTPS stand-in of the HTTP API — scripts/cloud_run (a package run as a folder); then
#     tests/infra, the stack's rules read on the translated template per parameter set and on
#     the account stack (with the project venv).
#
# The tools (cfn-lint, samtranslator, checkov, moto server, pyjwt) live in .venv-cloud/ (pinned in
# scripts/cloud-tools.txt and, every dependency, scripts/cloud-tools.constraints.txt; created on
# first use, reused while those files are unchanged); the SAM CLI
# in .venv-sam/ (scripts/sam_check.sh). Neither is the project venv, and no handler ever sees one.
#
# Usage: bash scripts/cloud_check.sh   (or: make cloud-check)
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS_VENV="${CLOUD_TOOLS_VENV:-.venv-cloud}"
TOOLS_FILE="scripts/cloud-tools.txt"
TOOLS_CONSTRAINTS="scripts/cloud-tools.constraints.txt"
# The runtime's boto3/botocore, as /var/runtime provides them to a python3.12 function.
LAMBDA_RUNTIME_BOTO3="boto3==1.40.4"
INSTALL_TIMEOUT_S=1200
LAMBDA_UNZIPPED_LIMIT_MB=250

gate_start=$SECONDS
passed=0
failed=0
pass() { passed=$((passed + 1)); echo "  ok   $*"; }
fail() { failed=$((failed + 1)); echo "  FAIL $*"; }
finish() {
  echo "cloud-check: ${passed} passed, ${failed} failed ($((SECONDS - gate_start))s)"
  [[ "$failed" -eq 0 ]]
}
# Runs a step whose own output is ok/FAIL lines; counts them into this gate's totals.
counted() {
  local log="$work_dir/step.log" status=0
  "$@" 2>&1 | tee "$log" || status=$?
  passed=$((passed + $(grep -c '^  ok ' "$log" || true)))
  failed=$((failed + $(grep -c '^  FAIL ' "$log" || true)))
  if [[ "$status" -ne 0 ]] && ! grep -q '^  FAIL ' "$log"; then
    fail "$1 $2 exited $status without a FAIL line"
  fi
}

work_dir="$(mktemp -d "${TMPDIR:-/tmp}/cloud-check.XXXXXX")"
host_template=".cloud-check.template.yaml"
trap 'rm -rf "$work_dir" "$host_template"' EXIT

# --- the tool venv ---------------------------------------------------------------------------------
stamp="$(cat "$TOOLS_FILE" "$TOOLS_CONSTRAINTS" | sha256sum | cut -c1-16)-$(echo "$LAMBDA_RUNTIME_BOTO3" | sha256sum | cut -c1-8)"
# Ready tools count as one check whether they were installed now or reused: the gate's total
# is then the same on a fresh machine and on a warm one (it used to be 2 higher on the first run).
if [[ -f "$TOOLS_VENV/.stamp" && "$(cat "$TOOLS_VENV/.stamp")" == "$stamp" ]]; then
  pass "the gate's tools: reusing $TOOLS_VENV (stamp $stamp)"
else
  echo "cloud-check: installing the tools of $TOOLS_FILE into $TOOLS_VENV"
  start=$SECONDS
  rm -rf "$TOOLS_VENV"
  python3 -m venv "$TOOLS_VENV"
  if timeout "$INSTALL_TIMEOUT_S" "$TOOLS_VENV/bin/python" -m pip install --quiet \
    --disable-pip-version-check -r "$TOOLS_FILE" -c "$TOOLS_CONSTRAINTS" &&
    timeout "$INSTALL_TIMEOUT_S" "$TOOLS_VENV/bin/python" -m pip install --quiet \
      --disable-pip-version-check --no-warn-conflicts --target "$TOOLS_VENV/lambda-runtime" \
      "$LAMBDA_RUNTIME_BOTO3"; then
    echo "$stamp" >"$TOOLS_VENV/.stamp"
    pass "install the gate's tools ($((SECONDS - start))s)"
  else
    fail "install the gate's tools (pip failed or timed out after ${INSTALL_TIMEOUT_S}s)"
    rm -rf "$TOOLS_VENV"
    finish
    exit 1
  fi
fi
tools_python="$TOOLS_VENV/bin/python"
export AWS_ACCESS_KEY_ID="cloud-check" AWS_SECRET_ACCESS_KEY="cloud-check"
export AWS_DEFAULT_REGION="us-east-1" AWS_EC2_METADATA_DISABLED=true
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
unset AWS_SESSION_TOKEN AWS_PROFILE AWS_DEFAULT_PROFILE

# --- 1. the translated template: cfn-lint, no cycle -----------------------------------------------
echo "cloud-check: [1/4] template.yaml translated by samtranslator, then cfn-lint"
start=$SECONDS
counted "$tools_python" scripts/cloud_template.py lint --out "$work_dir/translated.json"
echo "cloud-check: [1/4] $((SECONDS - start))s"

# --- 2. checkov and cfn-guard, against the accepted findings --------------------------------------
echo "cloud-check: [2/4] checkov, then cfn-guard (Control Tower, well-architected), on the translated template"
start=$SECONDS
counted "$tools_python" scripts/cloud_template.py scan
counted "$tools_python" scripts/cloud_template.py guard
echo "cloud-check: [2/4] $((SECONDS - start))s"

# --- 3. sam build (as deployed, arm64; and for this host), sizes ----------------------------------
echo "cloud-check: [3/4] sam validate, sam build"
start=$SECONDS
# shellcheck source=scripts/python312.sh
source scripts/python312.sh
deployed_build="$work_dir/build-arm64"
counted env SAM_BUILD_DIR="$deployed_build" bash scripts/sam_check.sh
if [[ -d "$deployed_build" ]]; then
  echo "cloud-check: built sizes (unzipped, du -sm, rounded up; du -sk in brackets) as deployed (arm64):"
  layer_mb="$(du -sm "$deployed_build/CoreLayer" | cut -f1)"
  for dir in "$deployed_build"/*/; do
    name="$(basename "$dir")"
    size="$(du -sm "$dir" | cut -f1)"
    size_kb="$(du -sk "$dir" | cut -f1)"
    if [[ "$name" == CoreLayer ]]; then
      echo "       ${name}: ${size} MB [${size_kb} KB]"
    else
      total=$((size + layer_mb))
      echo "       ${name}: ${size} MB [${size_kb} KB] (+ CoreLayer = ${total} MB)"
      if [[ "$total" -lt "$LAMBDA_UNZIPPED_LIMIT_MB" ]]; then
        pass "$name + CoreLayer unzipped ${total} MB < ${LAMBDA_UNZIPPED_LIMIT_MB} MB"
      else
        fail "$name + CoreLayer unzipped ${total} MB >= ${LAMBDA_UNZIPPED_LIMIT_MB} MB"
      fi
    fi
  done
fi
host_arch="$(uname -m)"
run_build=""
if [[ -z "$python312_dir" ]]; then
  fail "no python3.12 to build and run the functions: ${why_no_python312}"
elif [[ "$host_arch" == aarch64 || "$host_arch" == arm64 ]]; then
  run_build="$deployed_build"
else
  # The same template for this host's architecture: only Architectures/BuildArchitecture change.
  sed -E 's/^( *(- |BuildArchitecture: ))arm64$/\1x86_64/' template.yaml >"$host_template"
  if grep -qE '(^| )arm64$' "$host_template"; then
    fail "the host-architecture copy of template.yaml still names arm64"
  else
    host_build="$work_dir/build-$host_arch"
    counted env SAM_TEMPLATE="$host_template" SAM_BUILD_DIR="$host_build" SAM_SKIP_VALIDATE=1 \
      bash scripts/sam_check.sh
    [[ -d "$host_build" ]] && run_build="$host_build"
  fi
fi
echo "cloud-check: [3/4] $((SECONDS - start))s"

# --- 4. every handler from the build, then the end-to-end flow, against moto -------------------
echo "cloud-check: [4/4] the built functions on python3.12 -I -S against moto (out of process)"
start=$SECONDS
if [[ -n "$run_build" ]]; then
  counted "$tools_python" scripts/cloud_run --build-dir "$run_build" \
    --python312 "$python312_dir/python3.12" --runtime-dir "$TOOLS_VENV/lambda-runtime" \
    --logs "${CLOUD_CHECK_LOGS:-$work_dir/logs}"
  # The cloud benchmarks on this build (Lambda init beside the bare Powertools anchor, warm calls
  # with moto's time taken out), briefly: the README's test run has no build to run them on.
  if [[ -x .venv/bin/pytest ]]; then
    if ENGRAM_SAM_BUILD="$run_build" ENGRAM_LAMBDA_RUNTIME="$TOOLS_VENV/lambda-runtime" \
      .venv/bin/python -m pytest -q -p no:cacheprovider tests/bench/test_cloud_built_bench.py; then
      pass "bench.cold_imports and bench.lambda_warm --built on the build"
    else
      fail "bench.cold_imports and bench.lambda_warm --built on the build (tests/bench/test_cloud_built_bench.py)"
    fi
  else
    echo "  (the cloud benchmarks on the build need the project venv with its dev extra: run ./test first)"
  fi
else
  fail "no build to run the functions from"
fi
# The stack's rules read on the translated template for each parameter set they name (a shared
# domain refused without its security role, the account stack's log policy and web ACL, the
# secrets' keys, policies and rotation, the aliases and their rollback alarms, the alarms'
# runbooks, the quota table): what no run on moto can show.
if [[ -x .venv/bin/pytest ]]; then
  if .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 tests/infra; then
    pass "tests/infra: the stack's rules on the translated template and the account stack"
  else
    fail "tests/infra: the stack's rules on the translated template and the account stack"
  fi
else
  echo "  (the stack's rules in tests/infra need the project venv with its dev extra: run ./test first)"
fi
echo "cloud-check: [4/4] $((SECONDS - start))s"

finish
