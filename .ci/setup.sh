#!/usr/bin/env bash
# Installs what texelflow needs and skips what is already there, so `make test` and `make demo`
# work on a fresh Debian machine (as root) and cost about a second when nothing is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

missing=()
command -v glslc >/dev/null 2>&1 || missing+=(glslc)
command -v spirv-val >/dev/null 2>&1 || missing+=(spirv-tools)
ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1' || missing+=(libvulkan1)
compgen -G '/usr/share/vulkan/icd.d/lvp_icd*.json' >/dev/null || missing+=(mesa-vulkan-drivers)
command -v dot >/dev/null 2>&1 || missing+=(graphviz)
command -v "$PY" >/dev/null 2>&1 || missing+=(python3 python3-pip python3-venv)
if ((${#missing[@]})); then
  echo "setup: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Reinstall the package (editable, with test extras) when pyproject.toml changed, when another
# checkout owns the editable install, or when a pinned dependency is missing.
mkdir -p .stamps
want="$(sha256sum pyproject.toml | cut -c1-16) $(pwd -P)"
if [[ "$(cat .stamps/pip 2>/dev/null)" != "$want" ]] || ! "$PY" - <<'PYEOF' 2>/dev/null
import importlib.metadata as md
import pathlib
import texelflow
import texelflow.codegen
import texelflow.runtime
here = pathlib.Path.cwd().resolve()
assert pathlib.Path(texelflow.__file__).resolve().parent == here / "texelflow"
# the subpackages come through the editable install's mapping, not the working folder
assert pathlib.Path(texelflow.runtime.__file__).resolve().parent == here / "runtime"
assert md.version("torch").split("+")[0] == "2.13.0"
for name in ("pytest", "xdist", "hypothesis", "vulkan", "yaml", "jinja2", "numpy", "rich", "scipy", "torchao"):
    __import__(name)
PYEOF
then
  echo "setup: pip install -e .[test] (torch==2.13.0)"
  PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install -q --disable-pip-version-check -e ".[test]"
  echo "$want" > .stamps/pip
fi
