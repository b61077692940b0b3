#!/usr/bin/env bash
# The SAM toolchain on template.yaml, as the project standards ask: `sam validate --lint`, then
# `sam build` into a throw-away directory, then a check that the build holds the CoreLayer (with
# the engram_memory package) and every function folder.
#
# The SAM CLI lives in its own venv (.venv-sam/, git-ignored; created on first use, reused after)
# so it never touches the project venv. Only the install talks to the network (PyPI), and `sam
# build` fetches the layer's dependencies from PyPI; the CLI's telemetry and its weekly PyPI
# version check are switched off, AWS credentials are dummies and the instance metadata service
# is disabled, so nothing reaches AWS.
#
# `sam build` needs python3.12 (the functions' runtime) on PATH: found with `command -v
# python3.12` or under `$(pyenv root)/versions/3.12.*/bin`; when there is none the build is
# skipped with the reason, validate still runs.
#
# Usage: bash scripts/sam_check.sh   (or: make sam-check)
# scripts/cloud_check.sh also sets SAM_TEMPLATE (another template file in the repository root),
# SAM_BUILD_DIR (keep the build there) and SAM_SKIP_VALIDATE=1 (build only).
set -euo pipefail
cd "$(dirname "$0")/.."

SAM_CLI_VERSION="1.170.0"
SAM_VENV="${SAM_VENV:-.venv-sam}"
SAM_TEMPLATE="${SAM_TEMPLATE:-template.yaml}"
INSTALL_TIMEOUT_S=900
VALIDATE_TIMEOUT_S=180
BUILD_TIMEOUT_S=900

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "  ok   $*"; }
fail() { failed=$((failed + 1)); echo "  FAIL $*"; }
finish() {
  echo "sam-check: ${passed} passed, ${failed} failed"
  [[ "$failed" -eq 0 ]]
}

work_dir="$(mktemp -d "${TMPDIR:-/tmp}/sam-check.XXXXXX")"
trap 'rm -rf "$work_dir"' EXIT

# --- the SAM CLI, in its own venv --------------------------------------------------------------
sam_bin="$SAM_VENV/bin/sam"  # relative to the repository root
# Installed now or reused, the CLI counts as one check (a total that does not depend on the
# machine being warm).
if [[ -x "$sam_bin" ]] && "$sam_bin" --version 2>/dev/null | grep -qF "version ${SAM_CLI_VERSION}"; then
  pass "aws-sam-cli==${SAM_CLI_VERSION}: reusing $SAM_VENV"
else
  echo "sam-check: installing aws-sam-cli==${SAM_CLI_VERSION} into $SAM_VENV"
  base_python="$(command -v python3 || true)"
  if [[ -z "$base_python" ]]; then
    echo "sam-check: no python3 on PATH, cannot create $SAM_VENV"
    fail "install aws-sam-cli"
    finish
    exit 1
  fi
  rm -rf "$SAM_VENV"
  "$base_python" -m venv "$SAM_VENV"
  if timeout "$INSTALL_TIMEOUT_S" "$SAM_VENV/bin/python" -m pip install --quiet \
    --disable-pip-version-check "aws-sam-cli==${SAM_CLI_VERSION}"; then
    pass "install aws-sam-cli==${SAM_CLI_VERSION}"
  else
    fail "install aws-sam-cli==${SAM_CLI_VERSION} (pip failed or timed out after ${INSTALL_TIMEOUT_S}s)"
    rm -rf "$SAM_VENV"
    finish
    exit 1
  fi
fi

# --- an offline, credential-free environment for the CLI ----------------------------------------
sam_app_dir="$SAM_VENV/sam-app-dir"
mkdir -p "$sam_app_dir"
# The CLI's own state: telemetry off, and the last version check "now" (no PyPI call).
printf '{"telemetryEnabled": false, "lastVersionCheck": %s}\n' "$(date +%s)" \
  >"$sam_app_dir/metadata.json"
export __SAM_CLI_APP_DIR="$PWD/$sam_app_dir"
export SAM_CLI_TELEMETRY=0
export AWS_ACCESS_KEY_ID="sam-check-dummy"
export AWS_SECRET_ACCESS_KEY="sam-check-dummy"
export AWS_DEFAULT_REGION="us-east-1"
export AWS_REGION="us-east-1"
export AWS_CONFIG_FILE=/dev/null
export AWS_SHARED_CREDENTIALS_FILE=/dev/null
export AWS_EC2_METADATA_DISABLED=true
unset AWS_SESSION_TOKEN AWS_PROFILE AWS_DEFAULT_PROFILE

# --- sam validate --lint -------------------------------------------------------------------------
if [[ "${SAM_SKIP_VALIDATE:-0}" != 1 ]]; then
  echo "sam-check: sam validate --lint"
  start=$SECONDS
  if timeout "$VALIDATE_TIMEOUT_S" "$sam_bin" validate --lint --region us-east-1 \
    --template-file "$SAM_TEMPLATE"; then
    pass "sam validate --lint ($((SECONDS - start))s)"
  else
    fail "sam validate --lint ($((SECONDS - start))s)"
  fi
fi

# --- python3.12 for sam build ---------------------------------------------------------------------
# shellcheck source=scripts/python312.sh
source scripts/python312.sh

# --- sam build into a temporary directory, then what it built ------------------------------------
if [[ -z "$python312_dir" ]]; then
  echo "sam-check: sam build SKIPPED — the functions' runtime is python3.12 and ${why_no_python312}."
  echo "sam-check: install Python 3.12 (or a pyenv 3.12.x) to check the build; validate ran anyway."
else
  echo "sam-check: sam build with $("$python312_dir/python3.12" --version) from $python312_dir"
  # SAM_BUILD_DIR keeps the build for the caller (scripts/cloud_check.sh); else a temporary one.
  build_dir="${SAM_BUILD_DIR:-$work_dir/build}"
  start=$SECONDS
  # Run from the temporary directory: sam build keeps its scratch .aws-sam/deps in the cwd.
  root="$PWD"
  if (cd "$work_dir" && PATH="$python312_dir:$PATH" timeout "$BUILD_TIMEOUT_S" "$root/$sam_bin" \
    build --template-file "$root/$SAM_TEMPLATE" --build-dir "$build_dir" \
    --cache-dir "$root/$SAM_VENV/build-cache" --cached --parallel); then
    pass "sam build ($((SECONDS - start))s)"
    # Every function and layer of the template has its folder; the layer holds engram_memory.
    if report="$("$SAM_VENV/bin/python" - "$build_dir" "$SAM_TEMPLATE" <<'PY'
import sys
from pathlib import Path

from cfnlint.decode.cfn_yaml import load

build = Path(sys.argv[1])
resources = load(sys.argv[2])["Resources"]
for name, resource in sorted(resources.items()):
    kind = resource.get("Type")
    if kind == "AWS::Serverless::Function":
        ok = (build / name / "app.py").is_file()
        print(f"{'ok' if ok else 'FAIL'} function {name}: {build.name}/{name}/app.py")
    elif kind == "AWS::Serverless::LayerVersion":
        package = build / name / "python" / "engram_memory"
        ok = (package / "__init__.py").is_file()
        extra = len(list((build / name / "python").glob("*.dist-info"))) if ok else 0
        print(
            f"{'ok' if ok else 'FAIL'} layer {name}: {build.name}/{name}/python/engram_memory"
            f" ({extra} dependency distributions next to it)"
        )
PY
    )"; then
      while IFS= read -r line; do
        case "$line" in
          ok\ *) pass "${line#ok }" ;;
          *) fail "${line#FAIL }" ;;
        esac
      done <<<"$report"
    else
      fail "reading the build output in $build_dir"
    fi
  else
    fail "sam build ($((SECONDS - start))s; timeout ${BUILD_TIMEOUT_S}s)"
  fi
fi

finish
