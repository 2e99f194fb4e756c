"""SmolLM3 through model.py: parity with transformers' SmolLM3 on a tiny random model loaded from
one saved folder (sharded safetensors), sliding windows both ways, the export round trip, the
3B parameter count, and the errors; tools/export_hf.py on a small-vocabulary checkpoint (its token
ids inside the vocabulary, equal logits in transformers) and its refusal of what SmolLM3 cannot
hold."""

import json
import os
import re
import shutil

import pytest
import torch

import checkpoint
from model import Transformer, TransformerConfig
from weights import save_smollm3, smollm3_args

transformers = pytest.importorskip('transformers')
TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, no_rope_layers=[1, 1, 1, 0],
            rope_parameters={'rope_theta': 5e6, 'rope_type': 'default'}, rms_norm_eps=1e-6,
            tie_word_embeddings=True, max_position_embeddings=4096, bos_token_id=0, eos_token_id=0,
            pad_token_id=0)


def write_tokenizer(folder, extra=0):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = (pre_tokenizers.ByteLevel(add_prefix_space=False),
                                      decoders.ByteLevel())
    tok.train_from_iterator(
        ["the grass is green and the sky is blue"] * 20,
        trainers.BpeTrainer(vocab_size=280, special_tokens=['<|end_of_text|>'],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_tokens([f'<extra_{i}>' for i in range(extra)])
    tok.save(os.path.join(folder, 'tokenizer.json'))
    with open(os.path.join(folder, 'tokenizer_config.json'), 'w') as f:
        json.dump({'eos_token': '<|end_of_text|>'}, f)


def hf_folder(folder, **changes):
    """A random tiny SmolLM3 saved by transformers in shards, with a tokenizer."""
    torch.manual_seed(0)
    hf = transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(**{**TINY, **changes})).eval()
    with torch.no_grad():  # transformers initialises the norms to 1: make them count
        for name, p in hf.named_parameters():
            if 'norm' in name:
                p.uniform_(0.5, 1.5)
    hf.save_pretrained(folder, max_shard_size='40KB', safe_serialization=True)
    write_tokenizer(folder)
    return hf


@pytest.mark.parametrize('windows,expected', [
    ({}, [0, 0, 0, 0]),  # no sliding windows
    (dict(layer_types=['sliding_attention'] * 3 + ['full_attention'], sliding_window=8,
          use_sliding_window=True),
     [8, 8, 8, 0]),  # the RoPE layers slide (our default for the paper's SW)
    # transformers' own rule: the NoPE layers slide
    (dict(sliding_window=8, use_sliding_window=True), [0, 0, 0, 8]),
], ids=['full', 'rope-layers-slide', 'transformers-rule'])
def test_logits_equal_transformers_smollm3(tmp_path, windows, expected):
    hf = hf_folder(str(tmp_path / 'hf'), **windows)
    # sharded
    assert len([f for f in os.listdir(tmp_path / 'hf') if f.endswith('.safetensors')]) > 1
    ours, tok, _ = checkpoint.load_model(str(tmp_path / 'hf'))
    assert ours.config.layer_windows() == expected
    assert (ours.config.layer_pos_encodings() == ['rope', 'rope', 'rope', 'nope']
            and ours.config.rope_theta == 5e6)
    assert tok.eot == tok.hf.token_to_id('<|end_of_text|>')
    idx = torch.randint(0, 300, (2, 40))
    with torch.no_grad():
        diff = (ours(idx, idx)[0] - hf(idx).logits).abs().max().item()
    assert diff <= 1e-4


def test_export_round_trip(tmp_path):
    hf_folder(str(tmp_path / 'hf'), layer_types=['sliding_attention'] * 3 + ['full_attention'],
              sliding_window=8, use_sliding_window=True)
    ours, _, _ = checkpoint.load_model(str(tmp_path / 'hf'))
    save_smollm3(ours, str(tmp_path / 'out'), source_dir=str(tmp_path / 'hf'), shard_bytes=30_000,
                 dtype=torch.float32)
    back, tok, _ = checkpoint.load_model(str(tmp_path / 'out'))
    a, b = ours.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # exact
    assert (back.config.layer_windows() == [8, 8, 8, 0]
            and os.path.exists(tmp_path / 'out' / 'model.safetensors.index.json'))
    # what lm-eval does
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / 'out')).eval()
    idx = torch.randint(0, 300, (1, 30))
    with torch.no_grad():
        assert (reloaded(idx).logits - ours(idx, idx)[0]).abs().max().item() <= 1e-4
    assert (transformers.PreTrainedTokenizerFast(
                tokenizer_file=str(tmp_path / 'out' / 'tokenizer.json')).encode('the sky')
            == tok.encode('the sky'))


def test_smollm3_3b_on_meta():
    """The released SmolLM3-3B shape: 3.08B parameters with tied embeddings (the model card's
    3.08B)."""
    config = transformers.SmolLM3Config(rope_parameters={'rope_theta': 5e6, 'rope_type': 'default'})
    args = smollm3_args(config.to_dict())
    with torch.device('meta'):
        ours = Transformer(TransformerConfig(**args))
        theirs = transformers.SmolLM3ForCausalLM(config)
    n = ours.num_params(non_embedding=False)
    assert n == sum(p.numel() for p in theirs.parameters())
    assert n == pytest.approx(3.08e9, abs=0.05e9)
    assert ((args['n_head'], args['n_kv_head'], args['head_dim'], args['ffn_dim'], args['norm_eps'])
            == (16, 4, 128, 11008, 1e-6))
    assert args['pos_encoding'] == ['rope', 'rope', 'rope', 'nope'] * 9


def test_errors(tmp_path):
    hf_folder(str(tmp_path / 'hf'))
    llama = tmp_path / 'llama'
    shutil.copytree(tmp_path / 'hf', llama)
    cfg = json.loads((llama / 'config.json').read_text())
    (llama / 'config.json').write_text(json.dumps({**cfg, 'model_type': 'llama'}))
    with pytest.raises(ValueError,
                       match="holds a 'llama' model: only SmolLM3 and Mamba2 folders load"):
        checkpoint.load_model(str(llama))
    with pytest.raises(ValueError, match='without config.json'):
        checkpoint.load_model(str(tmp_path))
    broken = tmp_path / 'broken'
    shutil.copytree(tmp_path / 'hf', broken)
    os.remove(broken / sorted(f for f in os.listdir(broken) if f.endswith('.safetensors'))[-1])
    with pytest.raises(ValueError, match='lacks 1 of its'):  # load_for_eval: a one-line SystemExit
        checkpoint.load_model(str(broken))
    big = tmp_path / 'bigtok'
    shutil.copytree(tmp_path / 'hf', big)
    write_tokenizer(str(big), extra=40)  # more tokens than the vocabulary of 300
    with pytest.raises(ValueError, match="more than the model's vocabulary of 300: "
                                         "not the model's own tokenizer"):
        checkpoint.load_model(str(big))
    with pytest.raises(ValueError, match="SmolLM3's layout needs SwiGLU"):
        save_smollm3(Transformer(TransformerConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=32)),
                     str(tmp_path / 'x'))


def cpt_setup(tmp_path):
    """A tiny SmolLM3 folder, data tokenized by its tokenizer, and the arguments of a CPT run of
    it with sliding windows on the RoPE layers and pre-linear dropout (as
    configs/smollm3_pl_d.py)."""
    from conftest import CPT
    from tokens import Tokenizer, write_shard
    folder, data = tmp_path / 'hf', tmp_path / 'data' / 'x' / 'smollm3'
    hf_folder(str(folder))
    tok = Tokenizer({'kind': 'hf', 'path': str(folder / 'tokenizer.json'),
                     'eot': '<|end_of_text|>'})
    data.mkdir(parents=True)
    text = "the grass is green and the sky is blue while the sun shines. " * 30
    for split in ('train', 'val'):
        write_shard(str(data / f'{split}.bin'), (tok.encode(text) + [tok.eot]) * 4, 300)
    (data / 'meta.json').write_text(json.dumps({'tokenizer': tok.spec, 'vocab_size': 300,
                                                'eot': tok.eot}))
    return folder, [*CPT, f'--data_dir={data}', f'--init_from={folder}', '--window=[8, 8, 8, 0]',
                    '--dropout_type=pre_linear', '--dropout=0.1', '--weight_decay=0.0',
                    '--eval_lengths=[]', '--schedule=constant', '--learning_rate=1e-3']


def test_continued_pretraining_and_export(tmp_path):
    """train.py from a SmolLM3 folder on data tokenized by the folder's tokenizer; then
    tools/export_hf.py for lm-eval."""
    from conftest import ROOT, read_log, run_train
    folder, args = cpt_setup(tmp_path)
    out = tmp_path / 'cpt'
    r = run_train(*args, f'--out_dir={out}')
    assert r.returncode == 0, r.stderr
    ckpt = checkpoint.load(checkpoint.step_path(str(out), 8))
    assert ckpt['model_args']['window'] == [8, 8, 8, 0] and ckpt['model_args']['n_embd'] == 64
    assert (ckpt['model_args']['dropout_type'] == 'pre_linear'
            and ckpt['config']['init_from'] == str(folder))
    # the stored config: the model trained
    assert ckpt['config']['n_embd'] == 64 and ckpt['cpt_from'] == str(folder)
    losses = [x['loss'] for x in read_log(str(out))]
    assert losses[-1] < losses[0]
    import subprocess
    import sys
    r = subprocess.run([sys.executable, '-m', 'tools.export_hf',
                        f'--ckpt={checkpoint.step_path(str(out), 8)}',
                        f'--out={tmp_path / "export"}', '--dtype=float32'],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(tmp_path / 'export' / 'tokenizer.json')  # from the run's init_from
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / 'export')).eval()
    assert exported.config.layer_types == ['sliding_attention'] * 3 + ['full_attention']
    ours = checkpoint.load_model(checkpoint.step_path(str(out), 8))[0]
    idx = torch.randint(0, 300, (1, 40))
    with torch.no_grad():
        assert (exported(idx).logits - ours(idx, idx)[0]).abs().max().item() <= 1e-4


def test_continued_pretraining_resumes_with_its_own_command(tmp_path):
    """An interrupted CPT run goes on with the same command plus --init_from=resume, loss for loss
    equal to a run that was never interrupted (the architecture comes from the checkpoint, as at
    the start)."""
    from conftest import read_log, run_script, run_train
    _, args = cpt_setup(tmp_path)
    straight = run_train(*args, f'--out_dir={tmp_path / "straight"}')
    assert straight.returncode == 0, straight.stderr
    first = run_train(*args, f'--out_dir={tmp_path / "cut"}', '--halt_at=4')
    assert first.returncode == 0, first.stderr
    second = run_train(*args, f'--out_dir={tmp_path / "cut"}', '--init_from=resume')
    assert second.returncode == 0, second.stderr
    assert 'resuming' in second.stdout
    cut = [(x['iter'], x['loss']) for x in read_log(str(tmp_path / 'cut'))]
    assert cut == [(x['iter'], x['loss']) for x in read_log(str(tmp_path / 'straight'))]
    # a model key that CPT cannot change is refused on resume too, by name
    code, said = run_script('train.py', *args, f'--out_dir={tmp_path / "cut"}',
                            '--init_from=resume', '--n_layer=3')
    assert code != 0 and 'sets n_layer = 3 (the checkpoint has 4)' in said


def save_ckpt(path, **changes):
    """A tiny from-scratch transformer checkpoint with the byte tokenizer: SmolLM3-shaped by default
    (SwiGLU, RMSNorm, GQA, three RoPE layers and a NoPE one), its norms randomised."""
    from dataclasses import asdict
    torch.manual_seed(0)
    config = TransformerConfig(**{**dict(vocab_size=257, n_layer=4, n_head=4, n_kv_head=2,
                                         n_embd=32, mlp='swiglu',
                                         pos_encoding=['rope', 'rope', 'rope', 'nope'],
                                         window=[8, 8, 8, 0], rope_theta=5e5, norm_eps=1e-6),
                                  **changes})
    model = Transformer(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'norm' in name:
                p.uniform_(0.5, 1.5)
    checkpoint.save({'model': model.state_dict(), 'model_type': 'transformer',
                     'model_args': asdict(config), 'tokenizer': {'kind': 'byte'}, 'step': 3,
                     'config': {}}, str(path))
    return str(path)


def run_export(*args):
    import subprocess
    import sys
    from conftest import ROOT
    return subprocess.run([sys.executable, '-m', 'tools.export_hf', *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_export_of_a_small_vocabulary_loads_in_transformers(tmp_path):
    """transformers' SmolLM3 defaults are the 3B model's token ids (pad 128004), and it makes
    pad_token_id the embedding's padding_idx: without ids of its own, a 257-token export failed
    from_pretrained with "Padding_idx must be within num_embeddings"."""
    path = save_ckpt(tmp_path / 'ckpt_000003.pt')
    r = run_export(f'--ckpt={path}', f'--out={tmp_path / "export"}', '--dtype=float32')
    assert r.returncode == 0, r.stderr
    assert 'no source folder (none)' in r.stdout
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / 'export')).eval()
    ours = checkpoint.load_model(path)[0]
    idx = torch.randint(0, 257, (2, 40))
    with torch.no_grad():
        assert (hf(idx).logits - ours(idx, idx)[0]).abs().max().item() <= 1e-4
    cfg = json.loads((tmp_path / 'export' / 'config.json').read_text())
    assert (cfg['vocab_size'] == 257
            and {k: cfg.get(k, 'absent') for k in ('bos_token_id', 'eos_token_id', 'pad_token_id')}
                == {'bos_token_id': None, 'eos_token_id': None, 'pad_token_id': None})
    assert (hf.model.embed_tokens.padding_idx is None
            and hf.config.layer_types == ['sliding_attention'] * 3 + ['full_attention'])
    # a source's ids are kept where they name tokens of this vocabulary, and dropped where they
    # do not
    source = tmp_path / 'source'
    source.mkdir()
    (source / 'config.json').write_text(json.dumps({'bos_token_id': 256,
                                                    'eos_token_id': [256, 128001],
                                                    'pad_token_id': 128004}))
    save_smollm3(ours, str(tmp_path / 'again'), source_dir=str(source), dtype=torch.float32)
    cfg = json.loads((tmp_path / 'again' / 'config.json').read_text())
    assert (cfg['bos_token_id'], cfg['eos_token_id'], cfg['pad_token_id']) == (256, [256], None)
    transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / 'again'))


def test_export_refuses_what_smollm3_cannot_hold(tmp_path):
    """A NAPE checkpoint (the paper's own models) is refused in one line that points at
    tools/eval_lm.py, before anything is written; and every other difference is named."""
    nape = save_ckpt(tmp_path / 'nape.pt', pos_encoding='nape', window=0)
    r = run_export(f'--ckpt={nape}', f'--out={tmp_path / "export"}')
    assert (r.returncode != 0 and 'Traceback' not in r.stderr
            and len(r.stderr.strip().splitlines()) == 1)
    assert (f"cannot export {nape}: SmolLM3's layout needs" in r.stderr
            and "this model has pos_encoding ['nape']" in r.stderr)
    assert (f'python -m tools.eval_lm --ckpt={nape}' in r.stderr
            and not os.path.exists(tmp_path / 'export'))
    for changes, named in [(dict(attn_alpha=1.5), 'attn_alpha=1.5 (entmax)'),
                           (dict(attn_alpha=1.5, attn_scale='adaptive', pos_encoding='rope'),
                            "attn_scale='adaptive'"),
                           (dict(pos_encoding='learned'), "pos_encoding ['learned']"),
                           (dict(pos_encoding='alibi', norm='layernorm', mlp='gelu'),
                            "mlp='gelu', norm='layernorm'"),
                           (dict(window=[8, 16, 8, 0]), 'windows [8, 16]')]:
        model = checkpoint.load_model(save_ckpt(tmp_path / 'x.pt', **changes))[0]
        with pytest.raises(ValueError, match=re.escape(named)):
            save_smollm3(model, str(tmp_path / 'x'))
        assert not os.path.exists(tmp_path / 'x') and not os.path.exists(tmp_path / 'x.tmp')
