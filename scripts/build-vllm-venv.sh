#!/usr/bin/env bash
# Build (or reuse) one virtual environment per vLLM version for `flightcheck vllm`.
#
#   scripts/build-vllm-venv.sh VERSION [DIR]
#
# vLLM's own requirements pin a CUDA build of torch (and xformers, ...), which
# cannot be installed on a CPU-only machine, so vLLM cannot be a pip extra of
# flightcheck. Instead this script installs, into DIR:
#   1. torch 2.13.0 (the CPU wheel; vLLM 0.8.x pins 2.6.0 and 0.33.0 pins
#      2.14.0, but the scheduler only needs torch to import),
#   2. vllm==VERSION and triton 3.9.0 without their dependencies (the real
#      triton is needed: without it torch.compile fails while vLLM imports),
#   3. the pure-Python import chain pinned in flightcheck/vllm/pins/, the
#      file the release table names (flightcheck/vllm/versions.py:
#      vllm-0.8-cpu.txt for 0.8.x, vllm-0.33-0.34-cpu.txt for 0.33.0 and
#      0.34.0: 91 pins, numpy below 2.4 for mistral_common), also without
#      dependencies,
# then checks that vLLM's V1 scheduler imports and reports VERSION.
#
# DIR defaults to $FLIGHTCHECK_VLLM_CACHE/vllm-VERSION, where
# FLIGHTCHECK_VLLM_CACHE defaults to ${XDG_CACHE_HOME:-~/.cache}/flightcheck:
# outside the clone, so that a second clone or a second CI run reuses it. A
# venv that is present and healthy (its stamp matches this script's inputs and
# the import check passes) is reused as it is; anything else there is rebuilt.
# The python that builds the venv is $FLIGHTCHECK_VLLM_PYTHON, else python3.
#
# Exit codes: 0 the venv is ready (its python's path is printed last),
# 1 the build or the import check failed, 2 bad arguments.
set -euo pipefail

usage() { echo "usage: $0 VERSION [DIR]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
version=$1
root=$(cd "$(dirname "$0")/.." && pwd)
# The release table says which pins file a version takes (exit 2: not a
# supported release; it says which are).
pins_name=$(python3 "$root/flightcheck/vllm/versions.py" pins "$version") || exit 2
pins="$root/flightcheck/vllm/pins/$pins_name"
[ -f "$pins" ] || { echo "missing pins file $pins" >&2; exit 1; }
home=${HOME:-$(cd ~ && pwd)}     # as Python's expanduser does when HOME is unset
cache=${FLIGHTCHECK_VLLM_CACHE:-${XDG_CACHE_HOME:-$home/.cache}/flightcheck}
dir=${2:-$cache/vllm-$version}
builder=${FLIGHTCHECK_VLLM_PYTHON:-python3}
torch_version=2.13.0
triton_version=3.9.0

# The stamp names everything the venv was built from; a change to any of them
# (a new pin, another torch) makes the cached venv stale.
stamp_text="vllm=$version torch=$torch_version triton=$triton_version pins=$(sha256sum "$pins" | cut -d' ' -f1)"
stamp="$dir/.flightcheck-stamp"

import_check() {
  # vLLM reads these at import: V1 engine, no logging setup of its own, no hub.
  VLLM_USE_V1=1 VLLM_CONFIGURE_LOGGING=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    "$dir/bin/python" - "$version" <<'EOF'
import sys
import vllm
import vllm.v1.core.sched.scheduler  # noqa: F401  the class the recorder subclasses
import vllm.v1.core.kv_cache_utils  # noqa: F401
if sys.argv[1].split(".")[:2] != ["0", "8"]:
    # 0.33 and later: the async recorder's base class and the engine core whose
    # step_with_batch_queue the replay copies must import too.
    import vllm.v1.core.sched.async_scheduler  # noqa: F401
    import vllm.v1.engine.core  # noqa: F401
if vllm.__version__ != sys.argv[1]:
    sys.exit(f"vllm reports {vllm.__version__}, expected {sys.argv[1]}")
EOF
}

if [ -x "$dir/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_text" ]; then
  if import_check >/dev/null 2>&1; then
    echo "vLLM $version venv at $dir is present and healthy: reused" >&2
    echo "$dir/bin/python"
    exit 0
  fi
  echo "vLLM $version venv at $dir fails its import check: rebuilding" >&2
fi

rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
echo "building the vLLM $version venv at $dir (about 2 minutes)" >&2
"$builder" -m venv "$dir"
pip=("$dir/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "torch==$torch_version"
"${pip[@]}" --no-deps "vllm==$version" "triton==$triton_version"
"${pip[@]}" --no-deps -r "$pins"

# vLLM's compiled extension (vllm._C) cannot load without CUDA: it logs a
# warning, which is expected; the scheduler does not use it.
if ! import_check; then
  echo "vLLM $version venv at $dir: import check failed" >&2
  exit 1
fi
echo "$stamp_text" >"$stamp"
echo "vLLM $version venv ready at $dir" >&2
echo "$dir/bin/python"
