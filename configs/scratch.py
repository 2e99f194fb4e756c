# The paper's from-scratch transformer (Table 6, first row): 24 layers, 768 wide, FFN 3072,
# 12 heads, NAPE, context 2048, DCLM-Edu, 40B tokens in batches of 512K, LR 6e-4, SWUA
# (2.5% warm-up, the last 20% annealed to 6e-5). The variants import this file and set only
# their regularizer: configs/{wd,no_wd,pn_d,pl_d,vpad}.py. Not stated in the paper, guessed:
# GELU MLP and RMSNorm, tied embeddings, GPT-2 tokenizer, AdamW betas (0.9, 0.95), WD 0.1.
# For 8 GPUs:  torchrun --standalone --nproc_per_node=8 train.py configs/vpad.py
# python data/dclm_edu/prepare.py --tokenizer=gpt2 --max_tokens=40e9
data_dir = 'data/dclm_edu/gpt2'

n_layer = 24
n_head = 12
n_embd = 768
ffn_dim = 3072
mlp = 'gelu'
norm = 'rmsnorm'
pos_encoding = 'nape'  # first 6 heads ALiBi (slopes 1, 1/2, ..., 1/6), last 6 NoPE

block_size = 2048
batch_size = 16  # per GPU: 8 GPUs x 2 micro-steps x 16 x 2048 = 524,288 tokens per step
tokens_per_batch = 524_288
max_tokens = 40e9  # 76,293 steps
learning_rate = 6e-4
min_lr = 6e-5
schedule = 'wsd'
warmup_frac = 0.025
anneal_frac = 0.2
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0

weight_decay = 0.1
dropout_type = 'none'
dropout = 0.0

log_interval = 10
eval_interval = 1000
ckpt_interval = 1000  # 77 checkpoints; average the last K = 10, 20, 30 with average_ckpts.py
eval_iters = 40
eval_lengths = [2048, 4096, 8192]
eval_windows = 32
