"""
Released weights, in and out: Hugging Face repo ids (org/name[@revision]) resolved through the
hub's cache; SmolLM3 folders in the Hugging Face layout, read and written (tools/export_hf.py,
lm-eval); state-spaces' and transformers' Mamba2 folders read, and a Mamba2 handed to
transformers.
Not our own checkpoints (ckpt_*.pt, their atomic writes, the model registry): checkpoint.py.
"""

import json
import os
import pickle
import re
import shutil

import torch

from model import Transformer, TransformerConfig
from tokens import EOT, eos_token

HUB_ID = re.compile(r'[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?')


def hub_id(path):
    """Whether path reads as a Hugging Face repo id (org/name[@revision]) rather than a local
    path."""
    return not os.path.exists(path) and bool(HUB_ID.fullmatch(path)) and not path.endswith('.pt')


def local(path):
    """A local path as it is; a Hugging Face repo id (HuggingFaceTB/SmolLM3-3B,
    state-spaces/mamba2-1.3b, optionally @revision) as the folder of its files in the hub's
    cache, downloaded the first time (huggingface_hub: its cache, HF_HUB_OFFLINE=1 honoured)."""
    if not hub_id(path):
        return path
    repo, _, revision = path.partition('@')
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(repo, revision=revision or None,
                                 allow_patterns=['*.json', '*.safetensors', '*.bin', '*.txt',
                                                 '*.model'])
    except Exception as e:
        # offline and not cached, no such repo, no huggingface_hub: say what to do
        raise ValueError(f"{path} is no local file or folder, and the hub's copy is not at hand "
                         f"({type(e).__name__}): download it once online (huggingface-cli "
                         f"download {repo}{f' --revision {revision}' if revision else ''}), or "
                         f"give a local folder") from None


def load_folder(path):
    """A folder of released weights (transformers' SmolLM3; state-spaces' or transformers'
    Mamba2) as a checkpoint dict: model, model_type, model_args, tokenizer (None if the folder has
    no tokenizer.json), step."""
    config = os.path.join(path, 'config.json')
    if not os.path.exists(config):
        raise ValueError(f"{path} is a folder without config.json: not a SmolLM3 or Mamba2 "
                         f"checkpoint")
    with open(config) as f:
        try:
            kind = json.load(f)
        except ValueError as e:
            raise ValueError(f"{config} is not JSON ({e})") from None
    if not isinstance(kind, dict):
        raise ValueError(f"{config} is not a model config (a JSON object)")
    kind = ('mamba2' if 'd_model' in kind or kind.get('model_type') == 'mamba2'
            else kind.get('model_type'))
    if kind not in ('smollm3', 'mamba2'):
        raise ValueError(f"{path} holds a {kind!r} model: only SmolLM3 and Mamba2 folders load")
    try:
        args, state = (load_mamba2 if kind == 'mamba2' else load_smollm3)(path)
    except KeyError as e:
        raise ValueError(f"{config} lacks {e}: not a complete {kind} config") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:  # weights_only: no code
        raise ValueError(f"the weights of {path} cannot be read as tensors ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    tokenizer = None
    if os.path.exists(os.path.join(path, 'tokenizer.json')):
        # the eos token it names, if any
        eot = eos_token(path) or (EOT if kind == 'mamba2' else '<|end_of_text|>')
        tokenizer = {'kind': 'hf', 'path': os.path.abspath(os.path.join(path, 'tokenizer.json')),
                     'eot': eot}
    return {'model': state, 'model_type': 'mamba2' if kind == 'mamba2' else 'transformer',
            'model_args': args, 'tokenizer': tokenizer, 'step': 0}


# -----------------------------------------------------------------------------
# SmolLM3 folders in the Hugging Face layout (config.json, (sharded) safetensors, tokenizer files)

def hf_name(name):
    """Our parameter name -> transformers' SmolLM3 (Llama) name."""
    name = re.sub(r'^layers\.(\d+)\.norm1\.', r'model.layers.\1.input_layernorm.', name)
    name = re.sub(r'^layers\.(\d+)\.norm2\.', r'model.layers.\1.post_attention_layernorm.', name)
    name = re.sub(r'^layers\.(\d+)\.attn\.', r'model.layers.\1.self_attn.', name)
    name = re.sub(r'^layers\.(\d+)\.mlp\.', r'model.layers.\1.mlp.', name)
    return {'wte.weight': 'model.embed_tokens.weight',
            'norm_f.weight': 'model.norm.weight'}.get(name, name)


def smollm3_args(cfg):
    """transformers' SmolLM3 config (a dict) -> TransformerConfig arguments. The sliding windows
    come from `layer_types` when given, else by transformers' own rule (its NoPE layers slide)."""
    if cfg.get('model_type') != 'smollm3':
        raise ValueError(f"not a SmolLM3 checkpoint: its config.json has model_type "
                         f"{cfg.get('model_type')!r}")
    rope = cfg.get('rope_parameters') or {'rope_theta': cfg.get('rope_theta', 2e6),
                                          'rope_type': cfg.get('rope_scaling') or 'default'}
    if (rope.get('rope_type', 'default') != 'default' or cfg.get('hidden_act', 'silu') != 'silu'
            or cfg.get('mlp_bias')):
        raise ValueError(f"only default RoPE, SiLU and bias-free MLPs are supported, not {rope}, "
                         f"{cfg.get('hidden_act')}, mlp_bias={cfg.get('mlp_bias')}")
    L = cfg['num_hidden_layers']
    has_rope = cfg.get('no_rope_layers') or [
        int((i + 1) % cfg.get('no_rope_layer_interval', 4) != 0) for i in range(L)]
    # transformers: NoPE layers slide
    types = cfg.get('layer_types') or [
        'sliding_attention' if cfg.get('use_sliding_window') and cfg.get('sliding_window') and not r
        else 'full_attention' for r in has_rope]
    args = dict(vocab_size=cfg['vocab_size'], block_size=cfg.get('max_position_embeddings', 4096),
                n_layer=L, n_head=cfg['num_attention_heads'], n_kv_head=cfg['num_key_value_heads'],
                n_embd=cfg['hidden_size'],
                head_dim=cfg.get('head_dim') or cfg['hidden_size'] // cfg['num_attention_heads'],
                ffn_dim=cfg['intermediate_size'], mlp='swiglu', norm='rmsnorm',
                norm_eps=cfg['rms_norm_eps'], bias=cfg.get('attention_bias', False),
                tie_embeddings=cfg.get('tie_word_embeddings', True),
                pos_encoding=['rope' if r else 'nope' for r in has_rope],
                rope_theta=float(rope['rope_theta']),
                window=[cfg['sliding_window'] if t == 'sliding_attention' else 0 for t in types])
    return args


def load_smollm3(folder):
    """A Hugging Face SmolLM3 folder (config.json, model.safetensors or shards with their index)
    -> (TransformerConfig arguments, state dict)."""
    with open(os.path.join(folder, 'config.json')) as f:
        args = smollm3_args(json.load(f))
    from safetensors.torch import load_file
    index = os.path.join(folder, 'model.safetensors.index.json')
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)['weight_map'].values()))
    else:
        files = ['model.safetensors']
    missing = [f for f in files if not os.path.exists(os.path.join(folder, f))]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {len(missing)} of its {len(files)} weight files: "
                                f"{', '.join(missing[:3])}")
    theirs = {}
    for f in files:
        theirs.update(load_file(os.path.join(folder, f)))
    with torch.device('meta'):  # our names, without building the weights
        ours = {hf_name(k): k for k in Transformer(TransformerConfig(**args)).state_dict()}
    state = {ours[k]: v for k, v in theirs.items() if k in ours}
    if args['tie_embeddings']:  # the head is the embedding (and usually absent from the files)
        state['lm_head.weight'] = state['wte.weight']
    return args, state


def save_smollm3(model, folder, source_dir=None, shard_bytes=5 * 2 ** 30, dtype=torch.bfloat16):
    """Write a model as a Hugging Face SmolLM3 folder (config.json, sharded safetensors with their
    index, and the tokenizer files and token ids of source_dir, the folder the weights came from),
    loadable by transformers and lm-eval; into folder (made if new)."""
    from safetensors.torch import save_file
    c = model.config
    pos, windows = c.layer_pos_encodings(), c.layer_windows()
    # everything transformers' SmolLM3 would silently compute differently (its attention is
    # softmax without a query scale; the scale's weights would be dropped as unexpected keys)
    problems = [what for what, bad in (
        (f"mlp={c.mlp!r}", c.mlp != 'swiglu'), (f"norm={c.norm!r}", c.norm != 'rmsnorm'),
        ('biases', c.bias),
        (f"pos_encoding {sorted(set(pos) - {'rope', 'nope'})}", set(pos) - {'rope', 'nope'}),
        (f"windows {sorted(set(windows) - {0})}", len(set(windows) - {0}) > 1),
        (f"attn_alpha={c.attn_alpha} (entmax)", c.attn_alpha != 1),
        (f"attn_scale={c.attn_scale!r}", c.attn_scale != 'none'))
        if bad]
    if problems:
        raise ValueError("SmolLM3's layout needs SwiGLU, RMSNorm, no biases, RoPE or NoPE layers, "
                         "one window size and softmax attention without a query scale; this model "
                         f"has {', '.join(problems)}")
    source = {}
    if source_dir and os.path.exists(os.path.join(source_dir, "config.json")):
        with open(os.path.join(source_dir, "config.json")) as f:
            source = json.load(f)

    def token_id(key):
        """The source's id if it names a token of this vocabulary, else None; always written, as
        transformers' defaults are the 3B vocabulary's ids and its pad_token_id becomes the
        embedding's padding_idx, which must lie inside the vocabulary. None it accepts: no padding
        row (ours has none); lm-eval's HF model pads with the tokenizer's own token."""
        def inside(i):
            return type(i) is int and 0 <= i < c.vocab_size
        v = source.get(key)
        if isinstance(v, list):  # several eos ids
            return [i for i in v if inside(i)] or None
        return v if inside(v) else None
    W = max(windows)
    cfg = {'architectures': ['SmolLM3ForCausalLM'], 'model_type': 'smollm3',
           'vocab_size': c.vocab_size, 'hidden_size': c.n_embd,
           'intermediate_size': c.ffn_dim or 4 * c.n_embd, 'num_hidden_layers': c.n_layer,
           'num_attention_heads': c.n_head, 'num_key_value_heads': c.n_kv_head or c.n_head,
           'head_dim': model.head_dim, 'hidden_act': 'silu', 'rms_norm_eps': c.norm_eps,
           'attention_bias': False, 'mlp_bias': False,
           'rope_parameters': {'rope_theta': c.rope_theta, 'rope_type': 'default'},
           'no_rope_layers': [int(p == 'rope') for p in pos], 'use_sliding_window': bool(W),
           'sliding_window': W or None,
           'layer_types': ['sliding_attention' if w else 'full_attention' for w in windows],
           'max_position_embeddings': source.get('max_position_embeddings', c.block_size),
           'tie_word_embeddings': c.tie_embeddings,
           'torch_dtype': str(dtype).removeprefix('torch.'),
           **{k: token_id(k) for k in ('bos_token_id', 'eos_token_id', 'pad_token_id')}}
    # tools/export_hf.py gives it a new temporary folder
    os.makedirs(folder, exist_ok=True)
    state = {hf_name(k): v.detach().to('cpu', dtype).contiguous()
             for k, v in model.state_dict().items()
             if not (c.tie_embeddings and k == 'lm_head.weight')}
    shards, size = [{}], 0
    for k, v in state.items():
        if size and size + v.numel() * v.element_size() > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += v.numel() * v.element_size()
    weight_map = {}
    for i, shard in enumerate(shards):
        name = (f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1
                else 'model.safetensors')
        save_file(shard, os.path.join(folder, name), metadata={'format': 'pt'})
        weight_map.update({k: name for k in shard})
    if len(shards) > 1:
        with open(os.path.join(folder, 'model.safetensors.index.json'), 'w') as f:
            json.dump({'metadata': {'total_size': sum(v.numel() * v.element_size()
                                                      for v in state.values())},
                       'weight_map': weight_map}, f, indent=2)
    with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(cfg, f, indent=2)
    for name in ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json',
                 'generation_config.json'):
        if source_dir and os.path.exists(os.path.join(source_dir, name)):
            shutil.copy(os.path.join(source_dir, name), folder)


# -----------------------------------------------------------------------------
# Mamba2 folders: state-spaces' (mamba_ssm) and transformers'; a Mamba2 handed to transformers

def mamba2_args(cfg, folder=''):
    """A Mamba2 config.json, mamba_ssm's or transformers' (a dict) -> Mamba2Config arguments."""
    if 'd_model' in cfg:  # mamba_ssm
        ssm = cfg.get('ssm_cfg', {})
        if (ssm.get('layer', 'Mamba2') != 'Mamba2' or cfg.get('d_intermediate', 0)
                or cfg.get('attn_layer_idx')):
            raise ValueError(f"{folder} is not a pure Mamba2 model (ssm_cfg {ssm}); only those "
                             f"load")
        multiple = cfg.get('pad_vocab_size_multiple', 16)
        args = dict(vocab_size=-(-cfg['vocab_size'] // multiple) * multiple, n_layer=cfg['n_layer'],
                    n_embd=cfg['d_model'], d_state=ssm.get('d_state', 128),
                    d_conv=ssm.get('d_conv', 4), expand=ssm.get('expand', 2),
                    headdim=ssm.get('headdim', 64), ngroups=ssm.get('ngroups', 1),
                    chunk_size=ssm.get('chunk_size', 256),
                    tie_embeddings=cfg.get('tie_embeddings', True))
    else:  # transformers' Mamba2Config
        args = dict(vocab_size=cfg['vocab_size'], n_layer=cfg['num_hidden_layers'],
                    n_embd=cfg['hidden_size'], d_state=cfg['state_size'],
                    d_conv=cfg['conv_kernel'], expand=cfg['expand'], headdim=cfg['head_dim'],
                    ngroups=cfg['n_groups'], chunk_size=cfg['chunk_size'],
                    norm_eps=cfg['layer_norm_epsilon'], bias=cfg['use_bias'],
                    conv_bias=cfg['use_conv_bias'], tie_embeddings=cfg['tie_word_embeddings'])
    return args


# the config.json of the released models the paper continues, as far as the shape goes: what a
# dry run plans (train.py --dry_run) before their folders are there
RELEASED = {
    'SmolLM3-3B': dict(model_type='smollm3', vocab_size=128256, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=4, hidden_size=2048,
                       intermediate_size=11008, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       no_rope_layer_interval=4, rope_parameters={'rope_theta': 5e6}),
    'mamba2-1.3b': dict(d_model=2048, n_layer=48, vocab_size=50277, ssm_cfg={'layer': 'Mamba2'},
                        pad_vocab_size_multiple=16, tie_embeddings=True),
}


def folder_shape(path):
    """A folder of released weights -> (model_type, model arguments) from its config.json alone,
    or, while the folder is not there, from the release its name begins with (RELEASED)."""
    config = os.path.join(path, 'config.json')
    if os.path.exists(config):
        with open(config) as f:
            cfg = json.load(f)
    else:
        name = next((n for n in RELEASED if os.path.basename(path.rstrip('/')).startswith(n)), None)
        if name is None:
            raise SystemExit(f"{path} has no config.json, and is none of the releases a dry run "
                             f"knows ({', '.join(RELEASED)}): put the model's files there")
        cfg = RELEASED[name]
    if 'd_model' in cfg or cfg.get('model_type') == 'mamba2':
        return 'mamba2', mamba2_args(cfg, path)
    return 'transformer', smollm3_args(cfg)


def load_mamba2(folder):
    """A state-spaces/mamba2-* folder (mamba_ssm's config.json and pytorch_model.bin), or a
    transformers Mamba2 folder (config.json, model.safetensors) -> (Mamba2Config args, state
    dict)."""
    with open(os.path.join(folder, 'config.json')) as f:
        args = mamba2_args(json.load(f), folder)
    path = os.path.join(folder, 'model.safetensors')
    if os.path.exists(path):
        from safetensors.torch import load_file
        raw = load_file(path)
    else:
        raw = torch.load(os.path.join(folder, 'pytorch_model.bin'), map_location='cpu',
                         weights_only=True)
    state = {k.removeprefix('backbone.').replace('embeddings.', 'embedding.'): v
             for k, v in raw.items()}
    if args['tie_embeddings']:  # the head may be missing from the file, or a copy of the embedding
        state['lm_head.weight'] = state['embedding.weight']
    return args, state


def to_transformers(model):
    """The same model as transformers' Mamba2ForCausalLM (for lm-eval, and the tests'
    reference)."""
    import transformers
    c = model.config
    hf = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        vocab_size=c.vocab_size, hidden_size=c.n_embd, num_hidden_layers=c.n_layer,
        state_size=c.d_state, expand=c.expand, head_dim=c.headdim, num_heads=c.nheads,
        n_groups=c.ngroups, conv_kernel=c.d_conv, chunk_size=c.chunk_size, use_bias=c.bias,
        use_conv_bias=c.conv_bias, layer_norm_epsilon=c.norm_eps,
        tie_word_embeddings=c.tie_embeddings, time_step_limit=(0.0, float('inf'))))
    state = {('' if k.startswith('lm_head') else 'backbone.')
             + k.replace('embedding.', 'embeddings.'): v for k, v in model.state_dict().items()}
    hf.load_state_dict(state)
    return hf.to(next(model.parameters()).device)
