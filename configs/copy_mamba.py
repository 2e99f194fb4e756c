# CPU scale: a small Mamba2 learns to copy sources of 5-10 symbols in about two minutes, and
# the table shows its exact-match accuracy falling off beyond the training lengths (up to 16x).
#   python train.py configs/copy_mamba.py
# The same task for the NAPE transformer:
#   --model_type=transformer --n_head=4 --out_dir=out/copy_transformer
model_type = 'mamba2'
task = 'copy'
out_dir = 'out/copy_mamba'
device = 'cpu'
task_vocab = 16  # 12 symbols and the 4 specials
task_min_len = 5
task_max_len = 10

n_layer = 2
n_embd = 128
d_state = 32
headdim = 32  # 8 heads
chunk_size = 32

batch_size = 64
tokens_per_batch = 64 * 22  # sequences padded to 2 * 10 + 2
max_tokens = 1500 * 64 * 22  # 1500 steps
learning_rate = 3e-3
min_lr = 0.0
schedule = 'cosine'
warmup_frac = 0.05
weight_decay = 0.0
dropout_type = 'none'
dropout = 0.0

log_interval = 100
eval_interval = 500
ckpt_interval = 500
eval_iters = 8
eval_lengths = [10, 12, 14, 16, 20, 40, 80, 160]  # up to 16x the longest training source
task_eval_samples = 200
