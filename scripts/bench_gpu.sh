#!/bin/bash
# The performance suite on one GPU, one command (about 10-15 minutes on an H100/H200), after
# the self-check (python -m tools.gpu_check: correctness first, then speed, PASS/FAIL per line):
#   bash scripts/bench_gpu.sh 2>&1 | tee bench_gpu.log
# The paper's from-scratch transformer (24 layers x 768, NAPE, context 2048) with every regularizer,
# the same size as plain nanoGPT, Mamba2-85M at 1024, then prefill/decoding time and memory up to
# 64K tokens. bf16, torch.compile (FlexAttention carries NAPE's ALiBi heads and sliding windows),
# mamba-ssm kernels when installed (pip install mamba-ssm causal-conv1d --no-build-isolation).
# Prints tokens/s, MFU, the memory a step adds and Inductor's kernel count per variant: a dropout
# that fuses into its neighbours' kernels costs few extra kernels and little time.
set -e
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
gpu="--device=cuda --dtype=bfloat16 --vocab_size=50304 --steps=10 --rounds=2 --warmup=3"
python -m tools.bench configs/scratch.py $gpu --compile=True --batch_size=8
python -m tools.bench configs/scratch.py $gpu --compile=True --batch_size=8 --mode=nanogpt
python -m tools.bench configs/mamba2_85m.py $gpu --batch_size=16 \
    --variants="['none', 'pre_norm', 'pre_linear', 'vpad']"
python -m tools.bench configs/scratch.py --mode=context --device=cuda --dtype=bfloat16 \
    --vocab_size=50304 --context_lengths="[4096, 16384, 65536]" --context_window=2048 \
    --prefill_chunk=4096
