# Sourced by tools/demo.sh and tools/test.sh (not run on its own): picks the Python interpreter and
# installs what is missing, saying what it installs first.
PY=${PYTHON:-$(command -v python3 || command -v python)}
ME=${0##*/}
# Commands that pip installs (cmake, ninja) land in the interpreter's scripts folder, or the user
# one for `pip install --user`: look there too.
PATH="$("$PY" -c 'import os, sysconfig
print(sysconfig.get_path("scripts") + os.pathsep + sysconfig.get_path("scripts", os.name + "_user"))'):$PATH"

# need_python MODULE:PIP_SPEC ... : pip-installs every spec whose module does not import.
need_python() {
  local missing=() item
  for item in "$@"; do
    "$PY" -c "import ${item%%:*}" 2>/dev/null || missing+=("${item#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "$ME: installing missing Python packages: ${missing[*]}"
    "$PY" -m pip install "${missing[@]}"
  fi
}

# need_command COMMAND:PIP_SPEC ... : pip-installs every spec whose command is not on PATH.
need_command() {
  local missing=() item
  for item in "$@"; do
    command -v "${item%%:*}" >/dev/null || missing+=("${item#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "$ME: installing missing build tools: ${missing[*]}"
    "$PY" -m pip install "${missing[@]}"
  fi
}
