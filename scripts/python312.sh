# Sourced by scripts/sam_check.sh and scripts/cloud_check.sh: find python3.12 (the functions'
# runtime) on PATH, or the newest pyenv 3.12.x. Sets python312_dir (empty when there is none) and
# why_no_python312 (the reason, for the skip message).
python312_dir=""
why_no_python312=""
if candidate="$(command -v python3.12 2>/dev/null)" && "$candidate" -c 'import sys' >/dev/null 2>&1; then
  python312_dir="$(dirname "$candidate")"
else
  if [[ -n "${candidate:-}" ]]; then
    why_no_python312="'$candidate' is on PATH but does not run (a pyenv shim of an inactive version?)"
  else
    why_no_python312="no python3.12 on PATH"
  fi
  if command -v pyenv >/dev/null 2>&1; then
    pyenv_root="$(pyenv root)"
    for dir in $(printf "%s\n" "$pyenv_root"/versions/3.12.*/bin | sort -V -r); do
      if [[ -x "$dir/python3.12" ]] && "$dir/python3.12" -c 'import sys' >/dev/null 2>&1; then
        python312_dir="$dir"
        break
      fi
    done
    [[ -n "$python312_dir" ]] || why_no_python312+="; none under $pyenv_root/versions/3.12.*/bin"
  else
    why_no_python312+="; no pyenv either"
  fi
fi
