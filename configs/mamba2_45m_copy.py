# Mamba2-45M from scratch on the Copy task (Table 6, third row): 12 layers, 768 wide, state 128,
# 24 heads of 64, source lengths 50-100, 0.3B tokens in batches of about 19K, LR 1e-3, cosine
# with 5% warm-up to 0, dropout p = 0.1. Sequences {bos} src {sep} src {eos} (tasks.py), the
# loss on the copy only. 128 sequences of on average 153 tokens make the 19.6K tokens of a step,
# so 0.3B tokens are about 15.3K steps; padded to the longest sequence (202), a step holds 25,856
# token slots. Guessed: a vocabulary of 32 symbols (the ASEntmax Copy task's), pre-norm dropout,
# no weight decay. Test lengths 1x-16x the longest training source.
#   python train.py configs/mamba2_45m_copy.py            (one GPU)
model_type = 'mamba2'
task = 'copy'
out_dir = 'out/mamba2_45m_copy'
task_vocab = 32
task_min_len = 50
task_max_len = 100

n_layer = 12
n_embd = 768
d_state = 128
headdim = 64
expand = 2
chunk_size = 256

batch_size = 128
tokens_per_batch = 128 * 202
max_tokens = 15_300 * 128 * 202
learning_rate = 1e-3
min_lr = 0.0
schedule = 'cosine'
warmup_frac = 0.05
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0

weight_decay = 0.0
dropout_type = 'pre_norm'
dropout = 0.1

log_interval = 50
eval_interval = 1000
ckpt_interval = 1000
eval_iters = 20
eval_lengths = [100, 200, 400, 800, 1600]
task_eval_samples = 1000
