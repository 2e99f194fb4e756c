# Mamba2-85M from scratch on the Pile (Table 6, second row): 12 layers, 768 wide, state 128,
# 24 heads of 64 (expand 2), context 1024, 25B tokens in batches of 512K, LR 1e-3, cosine with
# 10% warm-up to 1e-4, dropout p = 0.1. Guessed: pre-norm dropout (the placement the paper uses
# for Mamba2 in Table 5; try --dropout_type=pre_linear or vpad), no weight decay with dropout,
# the GPT-NeoX tokenizer (that of the released Mamba2 models), AdamW betas (0.9, 0.95).
# The Pile: stream a copy such as monology/pile-uncopyrighted with the generic streamer, e.g.
#   python data/dclm_edu/prepare.py --source=monology/pile-uncopyrighted --tokenizer=hf \
#       --tokenizer_path=path/to/gpt-neox/tokenizer.json --out_dir=data/pile/neox --max_tokens=25e9
# then:  torchrun --standalone --nproc_per_node=8 train.py configs/mamba2_85m.py
model_type = 'mamba2'
data_dir = 'data/pile/neox'
vocab_size = 50304  # GPT-NeoX's 50,277 tokens rounded up to a multiple of 64, as the data gives it
out_dir = 'out/mamba2_85m'

n_layer = 12
n_embd = 768
d_state = 128
headdim = 64
expand = 2
chunk_size = 256

block_size = 1024
batch_size = 32  # per GPU: 8 GPUs x 2 micro-steps x 32 x 1024 = 524,288 tokens per step
tokens_per_batch = 524_288
max_tokens = 25e9  # 47,684 steps
learning_rate = 1e-3
min_lr = 1e-4
schedule = 'cosine'
warmup_frac = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0

weight_decay = 0.0
dropout_type = 'pre_norm'
dropout = 0.1

log_interval = 10
eval_interval = 1000
ckpt_interval = 1000
eval_iters = 40
eval_lengths = [1024, 2048, 4096, 8192]
eval_windows = 32
