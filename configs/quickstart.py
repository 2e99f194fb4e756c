# CPU quick start: a small NAPE transformer with VPAD (p = 0.1, no weight decay) on byte-level
# Shakespeare, trained on 256-token windows and evaluated up to 8x that length (2048).
# About 5 minutes on 2 CPU cores:  python train.py configs/quickstart.py
out_dir = 'out/quickstart'
data_dir = 'data/shakespeare/byte'
device = 'cpu'

n_layer = 4
n_head = 4
n_embd = 128
pos_encoding = 'nape'
dropout_type = 'vpad'
dropout = 0.1
weight_decay = 0.0

block_size = 256
batch_size = 8  # 2 micro-steps per 4096-token step: 1 or 2 processes (torchrun) train alike
tokens_per_batch = 4096
max_tokens = 2_000_000
learning_rate = 2e-3
min_lr = 2e-4
schedule = 'wsd'
warmup_frac = 0.05
anneal_frac = 0.2

log_interval = 50
eval_interval = 100
ckpt_interval = 100
eval_iters = 20
eval_lengths = [256, 512, 1024, 2048]
eval_windows = 16
