#!/usr/bin/env bash
# Installs packages into a virtual environment: `pip install ARGS...`, done by uv where it can be.
#
# Usage: tools/pip_install.sh PYTHON ARGS...     (PYTHON: the venv's interpreter; ARGS as for pip install)
#
# uv installs the same resolution as pip, faster: a clean `make install` of '.[test,interop,aot]' took
# 85 s alone with uv on this 2-core machine, and 132-154 s in CI's install step beside the beam install,
# against 155-165 s with pip (cold caches, bytecode compiled both; uv's time moves with the index's
# answers). uv is itself installed into the venv from the package index (`pip install uv`, one 18 MB
# wheel). uv does not read pip's configuration, so the find-links, index URLs, constraint files and
# certificate file pip is configured with (pip.conf or PIP_* variables: `pip config list`) are passed to
# it, and `--index-strategy unsafe-best-match` picks versions across them as pip does (e.g. a local torch
# `+cpu` wheel over the index's default build). Bytecode is compiled at install, as pip does: a process
# that may not write .pyc files (PYTHONDONTWRITEBYTECODE) would otherwise compile TensorFlow's modules at
# every start.
#
# COMPILE_BYTECODE=0 leaves bytecode to the first process that imports each module (CI: of the 20,000
# files compiled in 56 s a training process imports ~4,300, ~11 s of compile); it is ignored, after one
# NOTICE, where PYTHONDONTWRITEBYTECODE is set, since no process would then write any.
#
# INSTALLER=pip uses pip only. If uv cannot be installed, or its install fails, the same install runs
# with pip, after one NOTICE line saying so (the outcome is pip's).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 PYTHON ARGS..." >&2
  exit 2
fi
py=$1
shift

with_pip() { "$py" -m pip install "$@"; }

if [[ "${INSTALLER:-uv}" == pip ]]; then
  with_pip "$@"
  exit
fi
if ! "$py" -m uv --version >/dev/null 2>&1 && ! "$py" -m pip install -q uv; then
  echo "NOTICE: uv could not be installed into $py's environment; installing with pip" >&2
  with_pip "$@"
  exit
fi

# pip's configured package sources and constraint files as uv flags, one value per line ("--find-links\nPATH
# ..."), and its certificate file as SSL_CERT_FILE=PATH (uv's variable, unless already set).
mapfile -t settings < <("$py" -m pip config list 2>/dev/null | "$py" -c '
import shlex, sys
flags = {"find-links": "--find-links", "extra-index-url": "--extra-index-url", "index-url": "--index-url",
         "constraint": "--constraint", "cert": "SSL_CERT_FILE"}
seen = set()
for line in sys.stdin:
  key, _, value = line.strip().partition("=")
  flag = flags.get(key.rpartition(".")[2])
  for v in shlex.split(value)[0].split() if flag and value else ():
    if (flag, v) not in seen:
      seen.add((flag, v))
      print(f"{flag}={v}" if flag == "SSL_CERT_FILE" else f"{flag}\n{v}")
')
sources=()
for setting in "${settings[@]}"; do
  if [[ "$setting" == SSL_CERT_FILE=* ]]; then
    [[ -n "${SSL_CERT_FILE:-}" ]] || export SSL_CERT_FILE="${setting#SSL_CERT_FILE=}"
  else
    sources+=("$setting")
  fi
done
compile=(--compile-bytecode)
if [[ "${COMPILE_BYTECODE:-1}" == 0 ]]; then
  if [[ -n "${PYTHONDONTWRITEBYTECODE:-}" ]]; then
    echo "NOTICE: COMPILE_BYTECODE=0 ignored: PYTHONDONTWRITEBYTECODE is set, so no process would write bytecode" >&2
  else
    compile=()
  fi
fi
if ! "$py" -m uv pip install --python "$py" "${compile[@]}" --index-strategy unsafe-best-match \
    "${sources[@]}" "$@"; then
  echo "NOTICE: uv pip install failed (above); installing with pip" >&2
  with_pip "$@"
fi
