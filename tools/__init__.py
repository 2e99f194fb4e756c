"""
The tools around the paper's scripts, each run from the repository's root as a module:

    python -m tools.study           # the seeded small-scale study (docs/study.md)
    python -m tools.gpu_check       # the GPU self-check; tools.bench: throughput side by side
    python -m tools.eval_helmet     # HELMET's recall; tools.eval_lm: lm-eval on any checkpoint
    python -m tools.probe_variance  # Figure 3's variance mismatch
    python -m tools.export_hf       # a checkpoint as a Hugging Face folder

They import the root's libraries; no root file imports from here.
"""
