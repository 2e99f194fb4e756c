# SmolLM3-3B CPT with sliding windows: attention dropout on the attention probabilities
# (Tables 9, 10); p not given, 0.1 guessed. On a GPU in bf16 the global (causal) layers run
# FlashAttention-2 at 26/256 = 0.1016, the rate it realises exactly (attention.flash_dropout).
from configs.smollm3_cpt import *  # noqa: F401,F403

out_dir = 'out/smollm3_attn_dropout'
attn_dropout = 0.1
