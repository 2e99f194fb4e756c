"""
Checkpoints: written atomically, read with weights_only=True, and one loader that every eval
script uses to turn a checkpoint (or a folder of released weights) into a model plus its tokenizer.

A checkpoint is out_dir/ckpt_{step:06d}.pt = {model (state dict, clean keys), model_type,
model_args, tokenizer (spec), step, config (the whole resolved config)}; every saved step is
kept (checkpoint averaging needs the last K). The optimizer state of the two newest steps lives
beside them in optim_{step:06d}.pt, for resume (the older one if the newer cannot be read).

Released weights come in and go out here too (at the end): SmolLM3 folders in the Hugging Face
layout, read and written (export_hf.py, lm-eval); state-spaces' and transformers' Mamba2 folders
read, and a Mamba2 handed to transformers.
"""

import errno
import fcntl
import glob
import json
import os
import pickle
import re
import shutil

import torch

from mamba import Mamba2, Mamba2Config
from model import Transformer, TransformerConfig
from tokens import EOT, Tokenizer

MODELS = {'transformer': (Transformer, TransformerConfig), 'mamba2': (Mamba2, Mamba2Config)}


def fsync(path):
    """Flush a file or a folder (its entries: a rename into it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(obj, path):
    """torch.save to a temporary file, on the disk before it is renamed into place and the rename
    on the disk before this returns: a crash, of the process or of the machine, leaves either the
    old file or the new one, whole. A failed write leaves no temporary file behind; a full disk is
    an OSError that names the path and the bytes it needs."""
    tmp = path + '.tmp'
    try:
        with open(tmp, 'wb') as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:  # torch.save reports a full disk as a RuntimeError of its writer
        if os.path.exists(tmp):
            os.remove(tmp)
        need, free = tensor_bytes(obj), shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        if getattr(e, 'errno', None) in (errno.ENOSPC, errno.EDQUOT) or isinstance(e, RuntimeError) and free < need:
            raise OSError(errno.ENOSPC, f"the disk is full: {path} needs about {need:,} bytes, {free:,} are free") from None
        raise
    os.replace(tmp, path)
    fsync(os.path.dirname(os.path.abspath(path)))


def tensor_bytes(obj):
    """The bytes of the tensors in a nested dict / list / tuple (about what torch.save writes)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(map(tensor_bytes, obj.values()))
    return sum(map(tensor_bytes, obj)) if isinstance(obj, (list, tuple)) else 0


def replace_folder(tmp, path):
    """Put the complete folder tmp at path, its files on the disk first; an old folder at path
    goes only once tmp is in place."""
    path = path.rstrip('/')
    for root, _, files in os.walk(tmp):
        for name in files:
            fsync(os.path.join(root, name))
        fsync(root)
    if os.path.exists(path):
        os.replace(path, path + '.old')
        os.replace(tmp, path)
        shutil.rmtree(path + '.old')
    else:
        os.replace(tmp, path)
    fsync(os.path.dirname(os.path.abspath(path)))


def load(path, device='cpu'):
    """Memory-mapped: processes that read one checkpoint share its pages. Only tensors and plain
    data come back (weights_only); anything else is refused, a ValueError that says so."""
    try:
        return torch.load(path, map_location=device, weights_only=True, mmap=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as e:
        raise ValueError(f"{path} is not a checkpoint written by torch.save, or it was cut short ({e})") from None


def steps(out_dir, prefix='ckpt', ext='.pt'):
    """Sorted steps of the {prefix}_{step:06d}{ext} files (or folders) in out_dir."""
    found = (re.fullmatch(rf'{prefix}_(\d+){re.escape(ext)}', os.path.basename(p))
             for p in glob.glob(os.path.join(out_dir, f'{prefix}_*{ext}')))
    return sorted(int(m.group(1)) for m in found if m)


def pairs(out_dir):
    """Sorted steps that have both a checkpoint and its optimizer state: the ones a run can resume from."""
    return sorted(set(steps(out_dir)) & set(steps(out_dir, 'optim')))


def step_path(out_dir, step, prefix='ckpt', ext='.pt'):
    return os.path.join(out_dir, f'{prefix}_{step:06d}{ext}')


def clean(out_dir):
    """Remove the temporary files of checkpoints whose write was interrupted (kill -9) from out_dir
    -> their names. Only a run that holds out_dir's lock may call it."""
    stale = sorted(glob.glob(os.path.join(out_dir, 'ckpt_*.tmp')) + glob.glob(os.path.join(out_dir, 'optim_*.tmp')))
    for path in stale:
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    return [os.path.basename(p) for p in stale]


def lock(out_dir):
    """An advisory lock on out_dir, held until the process ends (kill -9 included): one writer per
    run folder. -> the open lock file, to be kept; SystemExit naming the holder's pid if another
    process has it."""
    f = open(os.path.join(out_dir, 'lock'), 'a+')
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or 'unknown'
        raise SystemExit(f"{out_dir} is in use by another run (pid {holder}): wait for it to end, or stop it "
                         f"(kill {holder}), before writing to this folder") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def build_model(model_type, args):
    if model_type not in MODELS:
        raise ValueError(f"unknown model_type {model_type!r}; choose one of {list(MODELS)}")
    cls, config_cls = MODELS[model_type]
    return cls(config_cls(**args))


HUB_ID = re.compile(r'[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?')


def hub_id(path):
    """Whether path reads as a Hugging Face repo id (org/name[@revision]) rather than a local path."""
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
                                 allow_patterns=['*.json', '*.safetensors', '*.bin', '*.txt', '*.model'])
    except Exception as e:  # offline and not cached, no such repo, no huggingface_hub: say what to do
        raise ValueError(f"{path} is no local file or folder, and the hub's copy is not at hand ({type(e).__name__}): "
                         f"download it once online (huggingface-cli download {repo}"
                         f"{f' --revision {revision}' if revision else ''}), or give a local folder") from None


def load_any(path):
    """A checkpoint file, or a folder of released weights (transformers' SmolLM3; state-spaces'
    or transformers' Mamba2; or their Hugging Face repo id, see local), as a checkpoint dict:
    model, model_type, model_args, tokenizer (None if the folder has no tokenizer.json), step."""
    path = local(path)
    if not os.path.isdir(path):
        ckpt = load(path)
        if not isinstance(ckpt, dict) or 'model' not in ckpt or 'model_type' not in ckpt:
            what = ("an optimizer state (optim_*.pt): give the ckpt_*.pt beside it" if isinstance(ckpt, dict)
                    and 'optimizer' in ckpt else "not a model checkpoint of this repository (ckpt_*.pt)")
            raise ValueError(f"{path} is {what}")
        return ckpt
    config = os.path.join(path, 'config.json')
    if not os.path.exists(config):
        raise ValueError(f"{path} is a folder without config.json: not a SmolLM3 or Mamba2 checkpoint")
    with open(config) as f:
        kind = json.load(f)
    kind = 'mamba2' if 'd_model' in kind or kind.get('model_type') == 'mamba2' else kind.get('model_type')
    if kind not in ('smollm3', 'mamba2'):
        raise ValueError(f"{path} holds a {kind!r} model: only SmolLM3 and Mamba2 folders load")
    args, state = (load_mamba2 if kind == 'mamba2' else load_smollm3)(path)
    tokenizer = None
    if os.path.exists(os.path.join(path, 'tokenizer.json')):
        eot = EOT if kind == 'mamba2' else '<|end_of_text|>'
        if os.path.exists(os.path.join(path, 'tokenizer_config.json')):  # the eos token it names, if any
            with open(os.path.join(path, 'tokenizer_config.json')) as f:
                eos = json.load(f).get('eos_token') or eot
            eot = eos['content'] if isinstance(eos, dict) else eos
        tokenizer = {'kind': 'hf', 'path': os.path.abspath(os.path.join(path, 'tokenizer.json')), 'eot': eot}
    return {'model': state, 'model_type': 'mamba2' if kind == 'mamba2' else 'transformer', 'model_args': args,
            'tokenizer': tokenizer, 'step': 0}


def load_model(path, device='cpu', **overrides):
    """Any checkpoint file or weights folder -> (model in eval mode, tokenizer or None, checkpoint
    dict). `overrides` replace model arguments that do not change the weights (e.g. window)."""
    ckpt = load_any(path)
    model = build_model(ckpt['model_type'], {**ckpt['model_args'], **overrides})
    model.load_state_dict(ckpt['model'])
    tokenizer = Tokenizer(ckpt['tokenizer']) if ckpt['tokenizer'] else None
    if tokenizer and tokenizer.n_vocab > model.config.vocab_size:
        raise ValueError(f"its tokenizer has {tokenizer.n_vocab} tokens, more than the model's vocabulary "
                         f"of {model.config.vocab_size}: not the model's own tokenizer")
    return model.to(device).eval(), tokenizer, ckpt


def load_for_eval(path, device, purpose, window=None):
    """load_model for an eval script: a clear message (SystemExit) when the checkpoint cannot be
    read or has no tokenizer (`purpose` needs the model's own). window: replaces the model's
    sliding windows (an int for every layer, or a list), e.g. the paper's "SW" without CPT."""
    try:
        model, tokenizer, ckpt = load_model(path, device, **({} if window is None else {'window': window}))
    except (OSError, RuntimeError, ValueError) as e:
        raise SystemExit(f"cannot load {path}: {e}")
    if tokenizer is None:
        raise SystemExit(f"{path} has no tokenizer (tokenizer.json): {purpose} needs the model's own tokenizer")
    return model, tokenizer, ckpt


def check_length(model, length, path):
    """SystemExit if the model cannot take `length` tokens: learned absolute positions stop at block_size."""
    c = model.config
    if getattr(c, 'pos_encoding', None) == 'learned' and length > c.block_size:
        raise SystemExit(f"{path} has learned absolute positions for {c.block_size} tokens: it cannot take {length}")


# -----------------------------------------------------------------------------
# released weights, in and out: SmolLM3 folders in the Hugging Face layout (config.json, (sharded)
# safetensors, tokenizer files); state-spaces' and transformers' Mamba2 folders

def hf_name(name):
    """Our parameter name -> transformers' SmolLM3 (Llama) name."""
    name = re.sub(r'^layers\.(\d+)\.norm1\.', r'model.layers.\1.input_layernorm.', name)
    name = re.sub(r'^layers\.(\d+)\.norm2\.', r'model.layers.\1.post_attention_layernorm.', name)
    name = re.sub(r'^layers\.(\d+)\.attn\.', r'model.layers.\1.self_attn.', name)
    name = re.sub(r'^layers\.(\d+)\.mlp\.', r'model.layers.\1.mlp.', name)
    return {'wte.weight': 'model.embed_tokens.weight', 'norm_f.weight': 'model.norm.weight'}.get(name, name)


def smollm3_args(cfg):
    """transformers' SmolLM3 config (a dict) -> TransformerConfig arguments. The sliding windows
    come from `layer_types` when given, else by transformers' own rule (its NoPE layers slide)."""
    if cfg.get('model_type') != 'smollm3':
        raise ValueError(f"not a SmolLM3 checkpoint: its config.json has model_type {cfg.get('model_type')!r}")
    rope = cfg.get('rope_parameters') or {'rope_theta': cfg.get('rope_theta', 2e6), 'rope_type': cfg.get('rope_scaling') or 'default'}
    if rope.get('rope_type', 'default') != 'default' or cfg.get('hidden_act', 'silu') != 'silu' or cfg.get('mlp_bias'):
        raise ValueError(f"only default RoPE, SiLU and bias-free MLPs are supported, not {rope}, "
                         f"{cfg.get('hidden_act')}, mlp_bias={cfg.get('mlp_bias')}")
    L = cfg['num_hidden_layers']
    has_rope = cfg.get('no_rope_layers') or [int((i + 1) % cfg.get('no_rope_layer_interval', 4) != 0) for i in range(L)]
    types = cfg.get('layer_types') or ['sliding_attention' if cfg.get('use_sliding_window') and cfg.get('sliding_window')
                                       and not r else 'full_attention' for r in has_rope]  # transformers: NoPE layers slide
    args = dict(vocab_size=cfg['vocab_size'], block_size=cfg.get('max_position_embeddings', 4096), n_layer=L,
                n_head=cfg['num_attention_heads'], n_kv_head=cfg['num_key_value_heads'], n_embd=cfg['hidden_size'],
                head_dim=cfg.get('head_dim') or cfg['hidden_size'] // cfg['num_attention_heads'],
                ffn_dim=cfg['intermediate_size'], mlp='swiglu', norm='rmsnorm', norm_eps=cfg['rms_norm_eps'],
                bias=cfg.get('attention_bias', False), tie_embeddings=cfg.get('tie_word_embeddings', True),
                pos_encoding=['rope' if r else 'nope' for r in has_rope], rope_theta=float(rope['rope_theta']),
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
        raise FileNotFoundError(f"{folder} lacks {len(missing)} of its {len(files)} weight files: {', '.join(missing[:3])}")
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
    loadable by transformers and lm-eval."""
    from safetensors.torch import save_file
    c = model.config
    pos, windows = c.layer_pos_encodings(), c.layer_windows()
    # everything transformers' SmolLM3 would silently compute differently (its attention is
    # softmax without a query scale; the scale's weights would be dropped as unexpected keys)
    problems = [what for what, bad in (
        (f"mlp={c.mlp!r}", c.mlp != 'swiglu'), (f"norm={c.norm!r}", c.norm != 'rmsnorm'), ('biases', c.bias),
        (f"pos_encoding {sorted(set(pos) - {'rope', 'nope'})}", set(pos) - {'rope', 'nope'}),
        (f"windows {sorted(set(windows) - {0})}", len(set(windows) - {0}) > 1),
        (f"attn_alpha={c.attn_alpha} (entmax)", c.attn_alpha != 1), (f"attn_scale={c.attn_scale!r}", c.attn_scale != 'none'))
        if bad]
    if problems:
        raise ValueError("SmolLM3's layout needs SwiGLU, RMSNorm, no biases, RoPE or NoPE layers, one window size and "
                         f"softmax attention without a query scale; this model has {', '.join(problems)}")
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
    cfg = {'architectures': ['SmolLM3ForCausalLM'], 'model_type': 'smollm3', 'vocab_size': c.vocab_size,
           'hidden_size': c.n_embd, 'intermediate_size': c.ffn_dim or 4 * c.n_embd, 'num_hidden_layers': c.n_layer,
           'num_attention_heads': c.n_head, 'num_key_value_heads': c.n_kv_head or c.n_head, 'head_dim': model.head_dim,
           'hidden_act': 'silu', 'rms_norm_eps': c.norm_eps, 'attention_bias': False, 'mlp_bias': False,
           'rope_parameters': {'rope_theta': c.rope_theta, 'rope_type': 'default'},
           'no_rope_layers': [int(p == 'rope') for p in pos], 'use_sliding_window': bool(W), 'sliding_window': W or None,
           'layer_types': ['sliding_attention' if w else 'full_attention' for w in windows],
           'max_position_embeddings': source.get('max_position_embeddings', c.block_size),
           'tie_word_embeddings': c.tie_embeddings, 'torch_dtype': str(dtype).removeprefix('torch.'),
           **{k: token_id(k) for k in ('bos_token_id', 'eos_token_id', 'pad_token_id')}}
    tmp = folder.rstrip('/') + '.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    state = {hf_name(k): v.detach().to('cpu', dtype).contiguous() for k, v in model.state_dict().items()
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
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else 'model.safetensors'
        save_file(shard, os.path.join(tmp, name), metadata={'format': 'pt'})
        weight_map.update({k: name for k in shard})
    if len(shards) > 1:
        with open(os.path.join(tmp, 'model.safetensors.index.json'), 'w') as f:
            json.dump({'metadata': {'total_size': sum(v.numel() * v.element_size() for v in state.values())},
                       'weight_map': weight_map}, f, indent=2)
    with open(os.path.join(tmp, 'config.json'), 'w') as f:
        json.dump(cfg, f, indent=2)
    for name in ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'generation_config.json'):
        if source_dir and os.path.exists(os.path.join(source_dir, name)):
            shutil.copy(os.path.join(source_dir, name), tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def load_mamba2(folder):
    """A state-spaces/mamba2-* folder (mamba_ssm's config.json and pytorch_model.bin), or a
    transformers Mamba2 folder (config.json, model.safetensors) -> (Mamba2Config args, state dict)."""
    with open(os.path.join(folder, 'config.json')) as f:
        cfg = json.load(f)
    if 'd_model' in cfg:  # mamba_ssm
        ssm = cfg.get('ssm_cfg', {})
        if ssm.get('layer', 'Mamba2') != 'Mamba2' or cfg.get('d_intermediate', 0) or cfg.get('attn_layer_idx'):
            raise ValueError(f"{folder} is not a pure Mamba2 model (ssm_cfg {ssm}); only those load")
        multiple = cfg.get('pad_vocab_size_multiple', 16)
        args = dict(vocab_size=-(-cfg['vocab_size'] // multiple) * multiple, n_layer=cfg['n_layer'], n_embd=cfg['d_model'],
                    d_state=ssm.get('d_state', 128), d_conv=ssm.get('d_conv', 4), expand=ssm.get('expand', 2),
                    headdim=ssm.get('headdim', 64), ngroups=ssm.get('ngroups', 1), chunk_size=ssm.get('chunk_size', 256),
                    tie_embeddings=cfg.get('tie_embeddings', True))
    else:  # transformers' Mamba2Config
        args = dict(vocab_size=cfg['vocab_size'], n_layer=cfg['num_hidden_layers'], n_embd=cfg['hidden_size'],
                    d_state=cfg['state_size'], d_conv=cfg['conv_kernel'], expand=cfg['expand'], headdim=cfg['head_dim'],
                    ngroups=cfg['n_groups'], chunk_size=cfg['chunk_size'], norm_eps=cfg['layer_norm_epsilon'],
                    bias=cfg['use_bias'], conv_bias=cfg['use_conv_bias'], tie_embeddings=cfg['tie_word_embeddings'])
    path = os.path.join(folder, 'model.safetensors')
    if os.path.exists(path):
        from safetensors.torch import load_file
        raw = load_file(path)
    else:
        raw = torch.load(os.path.join(folder, 'pytorch_model.bin'), map_location='cpu', weights_only=True)
    state = {k.removeprefix('backbone.').replace('embeddings.', 'embedding.'): v for k, v in raw.items()}
    if args['tie_embeddings']:  # the head may be missing from the file, or a copy of the embedding
        state['lm_head.weight'] = state['embedding.weight']
    return args, state


def to_transformers(model):
    """The same model as transformers' Mamba2ForCausalLM (for lm-eval, and the tests' reference)."""
    import transformers
    c = model.config
    hf = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        vocab_size=c.vocab_size, hidden_size=c.n_embd, num_hidden_layers=c.n_layer, state_size=c.d_state, expand=c.expand,
        head_dim=c.headdim, num_heads=c.nheads, n_groups=c.ngroups, conv_kernel=c.d_conv, chunk_size=c.chunk_size,
        use_bias=c.bias, use_conv_bias=c.conv_bias, layer_norm_epsilon=c.norm_eps, tie_word_embeddings=c.tie_embeddings,
        time_step_limit=(0.0, float('inf'))))
    state = {('' if k.startswith('lm_head') else 'backbone.') + k.replace('embedding.', 'embeddings.'): v
             for k, v in model.state_dict().items()}
    hf.load_state_dict(state)
    return hf.to(next(model.parameters()).device)
