# CPU scale: fixed-offset retrieval (tasks.Offset, docs/methods.md): after a source of 32-64 random
# symbols, answer the 4 symbols that stand 8 positions before each answer token, and be scored by
# exact match on sources up to 16x the longest trained. A rule of relative position: RoPE can learn
# it once for every length, absolute positions learn it per position.
#   python train.py configs/offset.py
task = 'offset'
out_dir = 'out/offset'
device = 'cpu'
task_vocab = 16  # 12 symbols and the 4 specials
task_min_len = 32
task_max_len = 64
task_offset = 8
needle_value_len = 4  # the answer's length

n_layer = 2
n_head = 4
n_embd = 128
pos_encoding = 'rope'
dropout_type = 'none'
dropout = 0.0
weight_decay = 0.0

batch_size = 32
tokens_per_batch = 32 * 70  # sequences padded to 64 + 4 + 2 inputs
max_tokens = 1000 * 32 * 70  # 1000 steps
learning_rate = 1e-3  # 3e-3 diverged (RoPE, seed 1)
min_lr = 1e-4
schedule = 'wsd'
warmup_frac = 0.05
anneal_frac = 0.2

log_interval = 50
eval_interval = 250
ckpt_interval = 250
eval_iters = 8
eval_lengths = [64, 128, 256, 512, 1024]  # sources up to 16x the longest trained
task_eval_samples = 200
