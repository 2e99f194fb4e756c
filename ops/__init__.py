"""
The attention operator of model.py, apart from the model that calls it: ops/attention.py chooses
how attention is computed (SDPA, FlexAttention, softmax or alpha-entmax written out), and
ops/attention_triton.py holds the fused Triton kernels it calls on CUDA.
"""
