"""tools/pip_install.sh (make install's installer): what it asks uv and pip to do, against a stand-in interpreter.

The stand-in (`fake_python`) answers `-m pip config list` with a fixed configuration,
records every `-m uv ...` and `-m pip ...` call in a log (failing the ones the test says to fail) and the
SSL_CERT_FILE uv's install gets,
and runs `-c` code with the real interpreter (the script parses pip's configuration with it). Nothing is
installed.
"""

import os
import pathlib
import shlex
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "pip_install.sh"

PIP_CONFIG = """\
:env:.cert='/etc/ssl/certs/ca.crt'
:env:.find-links='/opt/wheels'
global.constraint='/etc/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/more/simple'
global.find-links='/opt/wheels'
"""


def _fake_python(tmp_path: pathlib.Path, *, fail: tuple[str, ...] = ()) -> pathlib.Path:
  log = tmp_path / "calls.log"
  fake = tmp_path / "python"
  fake.write_text(f"""#!/usr/bin/env bash
if [[ "$1" == -c ]]; then exec {shlex.quote(sys.executable)} "$@"; fi
printf '%s\\n' "$*" >> {shlex.quote(str(log))}
[[ "$*" != "-m uv pip install"* ]] || printf '%s' "${{SSL_CERT_FILE-unset}}" > {shlex.quote(str(tmp_path / "cert"))}
case "$*" in
  "-m pip config list") printf %s {shlex.quote(PIP_CONFIG)} ;;
esac
for prefix in {" ".join(shlex.quote(f) for f in fail)}; do [[ "$*" == "$prefix"* ]] && exit 3; done
exit 0
""")
  fake.chmod(0o755)
  return fake


def _run(tmp_path, *args, fail=(), **env):
  tmp_path.mkdir(exist_ok=True)
  fake = _fake_python(tmp_path, fail=fail)
  environ = {k: v for k, v in os.environ.items()
             if k not in ("SSL_CERT_FILE", "PIP_CERT", "INSTALLER", "COMPILE_BYTECODE")}
  environ.update(env)
  done = subprocess.run(["bash", str(SCRIPT), str(fake), *args], capture_output=True, text=True, env=environ,
                        timeout=60, check=False)
  calls = (tmp_path / "calls.log").read_text().splitlines()
  return done, calls


@pytest.mark.subprocess
def test_uv_gets_pips_sources_constraints_and_the_arguments(tmp_path):
  done, calls = _run(tmp_path, "-e", ".[test]")
  assert done.returncode == 0, done.stderr
  assert (tmp_path / "cert").read_text() == "/etc/ssl/certs/ca.crt"  # pip's `cert`, as uv's SSL_CERT_FILE.
  install = [c for c in calls if c.startswith("-m uv pip install")]
  assert install == [
      f"-m uv pip install --python {tmp_path / 'python'} --compile-bytecode --index-strategy unsafe-best-match "
      "--find-links /opt/wheels --constraint /etc/pip/constraints.txt "
      "--extra-index-url file:///opt/pypi/simple --extra-index-url file:///opt/more/simple -e .[test]"]
  assert not any(c.startswith("-m pip install") for c in calls), calls


@pytest.mark.subprocess
def test_compile_bytecode_0_leaves_bytecode_to_the_importers_unless_none_may_write_it(tmp_path):
  done, calls = _run(tmp_path, "pytest", COMPILE_BYTECODE="0", PYTHONDONTWRITEBYTECODE="")
  assert done.returncode == 0, done.stderr
  install = [c for c in calls if c.startswith("-m uv pip install")]
  assert len(install) == 1 and "--compile-bytecode" not in install[0] and install[0].endswith(" pytest")
  done, calls = _run(tmp_path / "dont_write", "pytest", COMPILE_BYTECODE="0", PYTHONDONTWRITEBYTECODE="1")
  assert done.returncode == 0, done.stderr
  assert [c for c in calls if c.startswith("-m uv pip install")][0].startswith(
      f"-m uv pip install --python {tmp_path / 'dont_write' / 'python'} --compile-bytecode ")
  assert "NOTICE: COMPILE_BYTECODE=0 ignored: PYTHONDONTWRITEBYTECODE is set" in done.stderr


@pytest.mark.subprocess
def test_installer_pip_uses_pip_only(tmp_path):
  done, calls = _run(tmp_path, "-e", ".[test]", INSTALLER="pip")
  assert done.returncode == 0, done.stderr
  assert calls == ["-m pip install -e .[test]"]


@pytest.mark.subprocess
def test_a_failed_uv_install_falls_back_to_pip_after_one_notice(tmp_path):
  done, calls = _run(tmp_path, "pytest", fail=("-m uv pip install",))
  assert done.returncode == 0, done.stderr
  assert calls[-1] == "-m pip install pytest"
  assert [l for l in done.stderr.splitlines() if l.startswith("NOTICE")] == [
      "NOTICE: uv pip install failed (above); installing with pip"]


@pytest.mark.subprocess
def test_uv_missing_is_installed_first_and_unavailable_means_pip(tmp_path):
  done, calls = _run(tmp_path, "pytest", fail=("-m uv --version",))
  assert done.returncode == 0, done.stderr
  assert calls[:2] == ["-m uv --version", "-m pip install -q uv"] and calls[-1].startswith("-m uv pip install")
  done, calls = _run(tmp_path / "none", "pytest", fail=("-m uv --version", "-m pip install -q uv"))
  assert done.returncode == 0, done.stderr
  assert calls == ["-m uv --version", "-m pip install -q uv", "-m pip install pytest"]
  assert "NOTICE: uv could not be installed" in done.stderr
