# CPU scale: NIAH-1 in symbols (tasks.Needle): a small NAPE transformer learns to find a 4-symbol
# value after a key hidden at a random depth in a haystack of 32-64 symbols, and is scored by
# exact match up to 16x that length. About 3 minutes on 2 CPU cores:
#   python train.py configs/needle.py
# It learns the lookup suddenly, after 500 to over 800 steps depending on the seed (4 layers take
# longer than 2); with 800 steps a third of the study's runs had not learned it.
task = 'needle'
out_dir = 'out/needle'
device = 'cpu'
task_vocab = 16  # 12 symbols and the 4 specials
task_min_len = 32
task_max_len = 64
needle_value_len = 4

n_layer = 2
n_head = 4
n_embd = 128
pos_encoding = 'nape'
dropout_type = 'none'
dropout = 0.0
weight_decay = 0.1

batch_size = 32
tokens_per_batch = 32 * 64
max_tokens = 1600 * 32 * 64  # 1600 steps
learning_rate = 3e-3
min_lr = 2e-4
schedule = 'wsd'
warmup_frac = 0.05
anneal_frac = 0.2

log_interval = 50
eval_interval = 400
ckpt_interval = 400
eval_iters = 8
eval_lengths = [64, 128, 256, 512, 1024]  # up to 16x the longest training sequence
task_eval_samples = 200
