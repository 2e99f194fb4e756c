# Mamba2-1.3B continued pre-training (Table 5), from the released state-spaces/mamba2-1.3b
# (trained on the Pile at 2048 tokens). The paper gives no hyper-parameters for this run; these
# follow its SmolLM3 CPT recipe (Table 6): 1B tokens in batches of 1M, LR 2e-5, SWU (10% warm-up,
# then constant), on DCLM-Edu tokenized with the model's own tokenizer (GPT-NeoX), at the model's
# training length. The rows: configs/mamba2_1b3_{wd,no_wd,pn_d}.py.
# Put the released files (config.json, pytorch_model.bin) and GPT-NeoX's tokenizer.json in one
# folder:
#   python data/dclm_edu/prepare.py --tokenizer=hf --tokenizer_path=weights/mamba2-1.3b \
#       --out_dir=data/dclm_edu/neox --max_tokens=1e9
#   torchrun --standalone --nproc_per_node=8 train.py configs/mamba2_1b3_pn_d.py
init_from = 'weights/mamba2-1.3b'
data_dir = 'data/dclm_edu/neox'

block_size = 2048
# per GPU: 8 GPUs x 16 micro-steps x 4 x 2048 = 1,048,576 tokens per step (at 8 a sequence,
# hardware.py's estimate is 81-83 GB: more than an H100's 80)
batch_size = 4
tokens_per_batch = 1_048_576
max_tokens = 1e9  # 953 steps
learning_rate = 2e-5
min_lr = 2e-5
schedule = 'constant'
warmup_frac = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0

log_interval = 10
eval_interval = 100
ckpt_interval = 50  # 19 checkpoints, for averaging the last K
eval_iters = 40
eval_lengths = [2048, 4096, 8192, 16384]
eval_windows = 16
