#!/usr/bin/env bash
# Create bench/.venv-ref: the reference package gradientmail 0.0.2 (it needs Python >= 3.12)
# and numpy, installed from PyPI. Nothing is downloaded when the benchmark runs.
#
#   bash bench/setup_reference.sh            # uses $PYTHON312, python3.12, or a pyenv 3.12
#   PYTHON312=/path/to/python3.12 bash bench/setup_reference.sh
#
# bench/compare.py runs the reference side under this venv; when it is missing or broken the
# comparison says why and prints gm's figures alone.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-ref"

find_python() {
    local candidate
    for candidate in "${PYTHON312:-}" python3.12 python3.13 \
        "$HOME"/.pyenv/versions/3.12*/bin/python /root/.pyenv/versions/3.12*/bin/python; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

if ! python="$(find_python)"; then
    echo "setup_reference: no Python >= 3.12 found (set PYTHON312=/path/to/python3.12)" >&2
    exit 1
fi

echo "setup_reference: $("$python" --version) at $python -> $venv"
"$python" -m venv "$venv"
# The reference's framework backends (torch, MLX) are optional extras: the benchmark drives it
# through a small numpy adapter (bench/reference/numpy_adapter.py), so neither is installed.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "gradientmail==0.0.2" "numpy>=1.26"
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
import sys

print(
    "setup_reference: ok:",
    f"python {sys.version.split()[0]},",
    f"gradientmail {md.version('gradientmail')},",
    f"numpy {md.version('numpy')},",
    f"safetensors {md.version('safetensors')}",
)
PY
