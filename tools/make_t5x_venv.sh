#!/usr/bin/env bash
# Makes TARGET_VENV: an environment with real t5x (+ airio, jestimator) layered
# over BASE_VENV, which it never modifies.
#
# Usage: tools/make_t5x_venv.sh BASE_VENV TARGET_VENV VENDOR_DIR
#
# t5x is not on PyPI; VENDOR_DIR holds its source snapshots and install_t5x.sh
# (see its README.md). TARGET_VENV is made with BASE_VENV's interpreter, and a
# .pth file in its site-packages adds BASE_VENV's site-packages after its own
# (site.addsitedir, so BASE_VENV's .pth files run too: the editable
# flax_xalign install). install_t5x.sh then installs with --no-deps into
# TARGET_VENV only; what it installs there takes precedence, everything else
# (jax, flax, seqio, tensorflow, flax_xalign) comes from BASE_VENV.
#
# Exit status: 0 when TARGET_VENV has t5x (made now or already up to date);
# also 0 when VENDOR_DIR is absent, after printing a line starting with
# "SKIP t5x:" and making nothing, so a caller tests
# "[ -f TARGET_VENV/.t5x-ready ]" before running the t5x tests. Anything else
# (a missing BASE_VENV, a failed install) exits non-zero.
set -euo pipefail

if [[ $# != 3 ]]; then
  echo "usage: $0 BASE_VENV TARGET_VENV VENDOR_DIR" >&2
  exit 2
fi
base=$1
target=$2
vendor=$3
ready="$target/.t5x-ready"

if [[ ! -f "$vendor/install_t5x.sh" ]]; then
  echo "SKIP t5x: no t5x sources at $vendor (install_t5x.sh missing); $target not made, the real-t5x tests are skipped"
  rm -f "$ready"
  exit 0
fi
if [[ ! -x "$base/bin/python" ]]; then
  echo "error: $base/bin/python not found; make the base environment first (make install)" >&2
  exit 1
fi

# The stamp names what the environment was made from: a new snapshot or
# another base environment remakes it.
base_abs=$(cd "$base" && pwd)
stamp=$(cd "$vendor" && { echo "$base_abs"; sha1sum install_t5x.sh ./*.tar.gz; } | sha1sum | cut -c1-12)
if [[ -f "$ready" && "$(cat "$ready")" == "$stamp" ]]; then
  echo "$target is up to date (t5x from $vendor over $base_abs)"
  exit 0
fi
rm -f "$ready"

# `python -m venv` run by a venv's interpreter makes a venv of the same base
# interpreter, so both have one Python version and one site-packages layout.
if [[ ! -x "$target/bin/python" ]]; then
  "$base/bin/python" -m venv "$target"
fi
purelib='import sysconfig; print(sysconfig.get_path("purelib"))'
base_site=$("$base/bin/python" -c "$purelib")
target_site=$("$target/bin/python" -c "$purelib")
if [[ "$base_site" == "$target_site" ]]; then
  echo "error: $target and $base share site-packages ($base_site); pick another TARGET_VENV" >&2
  exit 1
fi
printf "import site; site.addsitedir(%s)\n" "'$base_site'" >"$target_site/_flax_xalign_base_venv.pth"
"$target/bin/python" -c 'import flax_xalign, jax, seqio' || {
  echo "error: $target does not see $base's packages through $target_site/_flax_xalign_base_venv.pth" >&2
  exit 1
}

PIP_DISABLE_PIP_VERSION_CHECK=1 bash "$vendor/install_t5x.sh" "$target/bin/python"
"$target/bin/python" - "$target_site" <<'EOF'
import os, sys
import flax_xalign, t5x
here = os.path.realpath(sys.argv[1])
assert os.path.realpath(t5x.__file__).startswith(here), f"t5x imported from {t5x.__file__}, not {here}"
print(f"t5x from {os.path.dirname(t5x.__file__)}, flax_xalign from {os.path.dirname(flax_xalign.__file__)}")
EOF
echo "$stamp" >"$ready"
echo "$target is ready: $target/bin/python -m pytest -m t5x tests/interop/test_t5x_real.py"
