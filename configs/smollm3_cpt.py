# SmolLM3-3B continual pre-training with sliding-window attention (Table 6, last row; Tables 1,
# 7-10, 12): from the released weights, at 4096 tokens, on DCLM-Edu, 1B tokens in batches of 1M,
# LR 2e-5, SWU (10% warm-up, then constant). The rows:
# configs/smollm3_{wd,no_wd,pn_d,pl_d,vpad,attn_dropout}.py.
# "SW": the RoPE layers attend to a sliding window, the NoPE layers (every 4th) stay global, so
# that long-range retrieval has a path that never sees an unseen relative position. (transformers'
# own use_sliding_window does the opposite: it windows the NoPE layers.) Guessed, as the paper does
# not say: the window (2048 keys, the current one included), the starting checkpoint (the 4K one,
# before long-context training: Table 1's "Orig." scores 0 at 8K), WD 0.1, AdamW betas.
#   python data/dclm_edu/prepare.py --tokenizer=hf --tokenizer_path=weights/SmolLM3-3B-Base \
#       --eot='<|end_of_text|>' --out_dir=data/dclm_edu/smollm3 --max_tokens=1e9
#   torchrun --standalone --nproc_per_node=8 train.py configs/smollm3_pl_d.py
# a transformers SmolLM3 folder: config.json, safetensors, tokenizer.json
init_from = 'weights/SmolLM3-3B-Base'
data_dir = 'data/dclm_edu/smollm3'
window = [2048, 2048, 2048, 0] * 9  # SmolLM3's layers go RoPE, RoPE, RoPE, NoPE

block_size = 4096
batch_size = 4  # per GPU: 8 GPUs x 8 micro-steps x 4 x 4096 = 1,048,576 tokens per step
tokens_per_batch = 1_048_576
max_tokens = 1e9  # 953 steps
learning_rate = 2e-5
min_lr = 2e-5
schedule = 'constant'
warmup_frac = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
weight_decay = 0.0
dropout_type = 'none'
dropout = 0.0

parallel = 'fsdp'  # 3B with AdamW is ~49 GB of weights, gradients and moments: shard them
activation_checkpointing = True
log_interval = 1
eval_interval = 100
# Table 12's averages of the last K = 10, 20, 30 checkpoints 10 steps apart, summed as the run goes
# (float32, sharded like the weights) and written at the end: avg{K}_{first}-{last}.pt
average_last = [10, 20, 30]
average_interval = 10
ckpt_interval = 100  # for resume alone: each checkpoint is 12 GB (float32), its optimizer state 24
keep_last = 1
eval_iters = 16
eval_lengths = [4096, 8192, 16384]
eval_windows = 8
