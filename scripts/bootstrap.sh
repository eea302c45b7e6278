# Sourced by scripts/demo and scripts/test: a venv with this project installed, on a fresh
# Debian 12 machine as root. Idempotent; prints one line per step it takes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SLURM_GPU_VENV:-$ROOT/.venv}"
export DEBIAN_FRONTEND=noninteractive

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: apt-get install ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

if ! command -v python3 >/dev/null 2>&1; then apt_install python3; fi
# The NVML stand-in tests compile tiny libnvidia-ml.so.1 libraries (tests/nvml_standin/).
if ! command -v gcc >/dev/null 2>&1; then apt_install gcc libc6-dev; fi
# promtool checks the shipped alert rules; the lab runs node_exporter and Prometheus (Debian's).
if ! command -v promtool >/dev/null 2>&1; then apt_install prometheus prometheus-node-exporter; fi
# scripts/build-packages and tests/test_packages.py: Debian's rpmbuild (rpm; rpm2archive in
# rpm2cpio), lintian, and systemd-analyze / systemd-tmpfiles (systemd).
if ! command -v rpmbuild >/dev/null 2>&1 || ! command -v rpm2archive >/dev/null 2>&1; then apt_install rpm rpm2cpio; fi
if ! command -v lintian >/dev/null 2>&1; then apt_install lintian; fi
if ! command -v systemd-analyze >/dev/null 2>&1 || ! command -v systemd-tmpfiles >/dev/null 2>&1; then apt_install systemd; fi
# The test command opens the summary's HTML report in a real browser.
if [ "${SLURM_GPU_BOOTSTRAP_BROWSER:-0}" = 1 ] && ! command -v chromium >/dev/null 2>&1; then apt_install chromium; fi
if [ ! -x "$VENV/bin/python" ]; then
  if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
    rm -rf "$VENV"
    apt_install python3-venv python3-pip
    python3 -m venv "$VENV"
  fi
  echo "bootstrap: created $VENV"
fi
# Editable: the lab's hooks then run the working tree's code. Fast when nothing changed.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test]"
# The oldest nvidia-ml-py setup.cfg allows, beside the venv's newest: the stand-in tests run
# the probe under both.
PYNVML_FLOOR="$(sed -n 's/^ *nvidia-ml-py>=\([0-9.]*\).*/\1/p' "$ROOT/setup.cfg")"
if [ -n "$PYNVML_FLOOR" ] && ! ls "$ROOT/.pynvml-floor/nvidia_ml_py-$PYNVML_FLOOR".*.dist-info >/dev/null 2>&1; then
  echo "bootstrap: nvidia-ml-py $PYNVML_FLOOR.* into .pynvml-floor"
  rm -rf "$ROOT/.pynvml-floor"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --target "$ROOT/.pynvml-floor" \
      "nvidia-ml-py==$PYNVML_FLOOR.*"
fi
export PATH="$VENV/bin:$PATH"
