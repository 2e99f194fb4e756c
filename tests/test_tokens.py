"""Tokenizers, the shard format, batches and long windows, and the Shakespeare data."""

import json
import re
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT
from tokens import TokenData, Tokenizer, batch_rng, read_shard, write_shard


def test_byte_tokenizer_round_trip():
    tok = Tokenizer({'kind': 'byte'})
    text = "To be, or not to be: that is the question. Ünïcödé ✓"
    assert tok.encode(text) == list(text.encode('utf-8'))
    assert tok.decode(tok.encode(text)) == text
    assert (tok.n_vocab, tok.eot) == (257, 256)


def test_gpt2_tokenizer_offline():
    tok = Tokenizer({'kind': 'gpt2'})  # from openai-whisper's copy of the ranks, no download
    # GPT-2's own ids
    assert tok.encode("Hello world") == [15496, 995] and tok.encode(" the") == [262]
    assert (tok.n_vocab, tok.eot) == (50257, 50256)
    assert tok.encode_batch(["Hello world", " the"]) == [[15496, 995], [262]]


def test_hf_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers, trainers, decoders
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(["the sky is blue and the grass is green"] * 20,
                           trainers.BpeTrainer(vocab_size=300, special_tokens=['<|end_of_text|>']))
    hf.save(str(tmp_path / 'tokenizer.json'))
    tok = Tokenizer({'kind': 'hf', 'path': str(tmp_path), 'eot': '<|end_of_text|>'})
    ids = tok.encode("the sky is green")
    assert tok.decode(ids) == "the sky is green" and len(ids) < len("the sky is green")
    assert tok.eot == 0 and tok.n_vocab == hf.get_vocab_size()
    with pytest.raises(ValueError, match="no token '<eos>'"):
        Tokenizer({'kind': 'hf', 'path': str(tmp_path), 'eot': '<eos>'})


@pytest.mark.parametrize('vocab,dtype', [(257, np.uint16), (65536, np.uint16), (128256, np.uint32)])
def test_shard_round_trip(tmp_path, vocab, dtype):
    tokens = np.random.default_rng(0).integers(0, vocab, size=1000)
    write_shard(str(tmp_path / 's.bin'), tokens, vocab)
    back = read_shard(str(tmp_path / 's.bin'))
    assert back.dtype == dtype and np.array_equal(back, tokens)
    assert os.path.getsize(tmp_path / 's.bin') == 64 + 1000 * np.dtype(dtype).itemsize
    with pytest.raises(ValueError, match=r'token ids must lie in \[0, 10\)'):
        write_shard(str(tmp_path / 't.bin'), [3, 10], 10)


def test_bad_shards_are_refused(tmp_path):
    (tmp_path / 'x.bin').write_bytes(b'\0' * 100)
    with pytest.raises(ValueError, match='not a token shard'):
        read_shard(str(tmp_path / 'x.bin'))
    write_shard(str(tmp_path / 'y.bin'), [1, 2], 10)
    raw = bytearray((tmp_path / 'y.bin').read_bytes())
    raw[8] = 9  # the version
    (tmp_path / 'y.bin').write_bytes(bytes(raw))
    with pytest.raises(ValueError, match='shard version 9'):
        read_shard(str(tmp_path / 'y.bin'))


@pytest.fixture
def docs_dir(tmp_path):
    """Documents of lengths 10, 300, 50, 700 (tokens 1..): eot = 0."""
    lengths = [10, 300, 50, 700]
    stream, t = [], 1
    for n in lengths:
        stream += list(range(t, t + n)) + [0]
        t += n
    write_shard(str(tmp_path / 'val.bin'), stream, 2000)
    (tmp_path / 'meta.json').write_text(json.dumps({'eot': 0, 'vocab_size': 2000,
                                                    'tokenizer': {'kind': 'x'}}))
    return tmp_path


def test_documents_and_long_windows(docs_dir):
    data = TokenData(str(docs_dir), 'val')
    assert [b - a for _, a, b in data.doc_spans()] == [10, 300, 50, 700]
    w = data.long_windows(99, 20)
    # first windows of the two documents longer than 99 tokens, then their next windows; none
    # crosses a document
    starts = [int(x[0]) for x in w]
    assert starts == [11, 361, 111, 461, 211, 561, 661, 761, 861, 961] and w.shape == (10, 100)
    assert [int(x[0]) for x in data.long_windows(99, 3)] == [11, 361, 111]
    # document starts only
    assert [int(x[0]) for x in data.long_windows(99, 20, per_document=1)] == [11, 361]
    assert all(torch.equal(x, torch.arange(x[0], x[0] + 100)) for x in w)
    assert data.long_windows(800, 4) is None


def test_batches_are_windows_determined_by_the_rng(docs_dir):
    data = TokenData(str(docs_dir), 'val')
    x, y = data.batch(6, 16, batch_rng(1, 2, 3))
    assert x.shape == y.shape == (6, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    x2, _ = data.batch(6, 16, batch_rng(1, 2, 3))
    x3, _ = data.batch(6, 16, batch_rng(1, 2, 4))
    assert torch.equal(x, x2) and not torch.equal(x, x3)


def test_missing_data_names_the_prepare_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r'python .*data/shakespeare/prepare.py '
                                                r'--tokenizer=byte --out_dir=\S*byte_x`'):
        TokenData(os.path.join(ROOT, 'data', 'shakespeare', 'byte_missing_here', '..', 'byte_x'),
                  'train', 0, 40e9)
    # a streamed corpus: the run's tokens, as the README's command (its default is the whole corpus)
    dclm = os.path.join(ROOT, 'data', 'dclm_edu', 'gpt2')
    if not os.path.exists(dclm):  # (not where DCLM-Edu is prepared)
        with pytest.raises(FileNotFoundError, match=r'python .*data/dclm_edu/prepare.py '
                                                    r'--tokenizer=gpt2 --max_tokens=40e9`'):
            TokenData(dclm, 'train', 0, 40e9)


def test_shakespeare_prepare(tmp_path):
    r = subprocess.run([sys.executable, 'data/shakespeare/prepare.py', '--tokenizer=byte',
                        f'--out_dir={tmp_path}'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    train, val = TokenData(str(tmp_path), 'train'), TokenData(str(tmp_path), 'val')
    tok = Tokenizer(train.meta['tokenizer'])
    val_docs = [tok.decode(np.asarray(val.shards[0][a:b])) for _, a, b in val.doc_spans()]
    train_docs = [tok.decode(np.asarray(train.shards[0][a:b])) for _, a, b in train.doc_spans()]
    assert [d.split('\n')[0] for d in val_docs] == ['HAMLET, PRINCE OF DENMARK', 'MACBETH',
                                                    'THE LIFE AND DEATH OF KING RICHARD III',
                                                    'TWELFTH NIGHT; OR, WHAT YOU WILL']
    assert len(train_docs) == 38 and not set(train_docs) & set(val_docs)  # whole plays held out
    assert max(len(d) for d in val_docs) == 175659  # Richard III, for the long-context evals


def test_a_limit_keeps_the_first_tokens_across_shards(tmp_path):
    """TokenData(limit=N) (train.py's train_tokens): the first N tokens, in shard order."""
    tokens = np.arange(300) % 250
    write_shard(str(tmp_path / 'train_000.bin'), tokens[:200].tolist(), 256)
    write_shard(str(tmp_path / 'train_001.bin'), tokens[200:].tolist(), 256)
    (tmp_path / 'meta.json').write_text(json.dumps({'tokenizer': {'kind': 'byte'},
                                                    'vocab_size': 256, 'eot': 255}))
    for limit, sizes in ((0, [200, 100]), (150, [150]), (250, [200, 50]), (1000, [200, 100])):
        data = TokenData(str(tmp_path), 'train', limit)
        assert [len(s) for s in data.shards] == sizes and data.sizes.tolist() == sizes
        assert np.array_equal(np.concatenate(data.shards), tokens[:sum(sizes)])
    x, y = TokenData(str(tmp_path), 'train', 150).batch(64, 20, np.random.default_rng(0))
    # windows only from the first 150 tokens
    assert x.max() < 150 and torch.equal(x[:, 1:], y[:, :-1])


@pytest.mark.parametrize('task, T, needle, prefix', [
    ('niah_single_1', 1024, r'special magic numbers for (.+?) is: (\d{7})\.',
     'The special magic number for {} mentioned in the provided text is'),
    ('niah_single_1_short', 256, r'The magic number for (.+?) is (\d{7})\.',
     'The magic number for {} is')])
def test_niah_mixture_puts_the_loss_on_the_answer_alone(tmp_path, task, T, needle, prefix):
    """NIAH-1 documents among language windows: a document's targets are its answer and eot
    only, predicted from the token before each; its number is the needle's (read from the text);
    every other row is the language's own window, whole."""
    from conftest import byte_dataset
    from ruler import NiahMixture
    data = TokenData(byte_dataset(tmp_path / 'byte', 4, 1, 600), 'train')
    tok = Tokenizer(data.meta['tokenizer'])
    mix = NiahMixture(data, 0.5, tok, [T // 2 + T // 4, T * 7 // 8, T], seed=1, task=task)
    x, y = mix.batch(32, T, batch_rng(1, 0, 0))
    language_x, language_y = data.batch(32, T, batch_rng(1, 0, 0))
    sizes = []
    for i in range(32):
        text = tok.decode([t for t in x[i].tolist() if t != tok.eot])
        if 'magic number' not in text:  # a language row, as TokenData draws it
            assert torch.equal(x[i], language_x[i]) and torch.equal(y[i], language_y[i])
            continue
        value = re.search(needle, text)
        assert value and text.rstrip('.').endswith(prefix.format(value[1]) + ' ' + value[2])
        scored = torch.nonzero(y[i] != -1).flatten()
        answer = tok.encode(f' {value[2]}.') + [tok.eot]
        assert y[i, scored].tolist() == answer  # the answer and eot, nothing else
        assert scored.tolist() == list(range(scored[0], scored[0] + len(answer)))
        # each from the token before
        assert torch.equal(x[i, scored[0] + 1:scored[-1] + 1], y[i, scored[:-1]])
        assert tok.decode(x[i, :scored[0] + 1].tolist()).endswith(prefix.format(value[1]))
        sizes.append(int(scored[-1]) + 2)  # the document's tokens: its eot is the last target
    assert 8 <= len(sizes) <= 24 and max(sizes) <= T and len(set(sizes)) > 1  # about half of 32


def test_continued_pretraining_takes_no_niah_from_its_source(tiny_data, tmp_path):
    """Phase 1 trains on the mixture; a CPT run from it trains on language alone unless it asks:
    niah_mix is data, not architecture, so it is not taken from the checkpoint."""
    from conftest import CPT, TINY, run_train
    big = ['--block_size=256', '--tokens_per_batch=512', '--max_tokens=1024', '--eval_lengths=[]',
           '--batch_size=2', '--eval_interval=100', '--niah_task=niah_single_1_short']
    from conftest import byte_dataset
    data = byte_dataset(tmp_path / 'long' / 'byte', 4, 2, 600)
    r = run_train(*TINY, f'--data_dir={data}', '--niah_mix=0.5', f'--out_dir={tmp_path}/short')
    assert r.returncode and "too short for its template" in r.stderr  # 32 tokens
    assert not os.path.exists(tmp_path / 'short')  # refused before anything is written
    r = run_train(*TINY, *big, f'--data_dir={data}', '--niah_mix=0.5', f'--out_dir={tmp_path}/p1')
    assert r.returncode == 0, r.stderr[-2000:]
    assert '50% of the sequences are NIAH-1 documents' in r.stdout
    ckpt = sorted(os.listdir(tmp_path / 'p1'))
    source = str(tmp_path / 'p1' / [c for c in ckpt if c.startswith('ckpt_')][-1])
    r = run_train(*CPT, *big, f'--data_dir={data}', f'--init_from={source}',
                  f'--out_dir={tmp_path}/cpt')
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'NIAH-1' not in r.stdout
    cpt = sorted(c for c in os.listdir(tmp_path / 'cpt') if c.startswith('ckpt_'))[-1]
    assert torch.load(tmp_path / 'cpt' / cpt, weights_only=True)['config']['niah_mix'] == 0.0
