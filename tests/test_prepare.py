"""The data preparation scripts on small local files, offline: DCLM-Edu's schema (byte tokenizer),
arXiv papers."""

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tokens import TokenData, Tokenizer  # noqa: E402

N_DOCS, VAL_DOCS, SHARD = 40, 5, 500


def make_docs():
    rng = np.random.default_rng(0)
    words = ['the', 'cell', 'divides', 'energy', 'photosynthesis', 'Ünïcödé', 'naïve', '数学', 'x²',
             'π≈3.14']
    return [f"doc {i}: " + ' '.join(rng.choice(words, size=rng.integers(5, 40))) + '.'
            for i in range(N_DOCS)]


def write_source(tmp_path, fmt, docs):
    rows = [{'text': t, 'id': f'doc-{i}', 'url': f'https://example.org/{i}', 'score': float(i % 5)}
            for i, t in enumerate(docs)]
    if fmt == 'parquet':
        path = tmp_path / 'part-0.parquet'
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path = tmp_path / f'part-0.{fmt}'
        lines = ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in rows).encode()
        path.write_bytes(gzip.compress(lines) if fmt.endswith('.gz') else lines)
    return str(path)


def run(source, out_dir, *extra):
    env = {**os.environ, 'HF_DATASETS_OFFLINE': '1', 'HF_HUB_OFFLINE': '1'}
    cmd = [sys.executable, 'data/dclm_edu/prepare.py', f'--source={source}', '--tokenizer=byte',
           f'--val_docs={VAL_DOCS}', f'--shard_tokens={SHARD}', f'--out_dir={out_dir}', *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def split_stream(data):
    return np.concatenate([np.asarray(s, dtype=np.int64) for s in data.shards])


def decode_docs(stream, tok):
    """The documents of a token stream that must end with eot."""
    assert stream[-1] == tok.eot
    ends = np.flatnonzero(stream == tok.eot)
    return [tok.decode(stream[a:b]) for a, b in zip(np.r_[0, ends[:-1] + 1], ends)]


@pytest.mark.parametrize('fmt', ['parquet', 'jsonl'])
def test_splits_shards_and_meta(tmp_path, fmt):
    docs = make_docs()
    out = tmp_path / 'out'
    r = run(write_source(tmp_path, fmt, docs), out)
    assert r.returncode == 0, r.stderr
    tok = Tokenizer({'kind': 'byte'})
    expected = {s: np.array([t for d in ds for t in tok.encode(d) + [tok.eot]])
                for s, ds in (('val', docs[:VAL_DOCS]), ('train', docs[VAL_DOCS:]))}

    val, train = TokenData(str(out), 'val'), TokenData(str(out), 'train')
    # exactly the first docs, in order
    assert decode_docs(split_stream(val), tok) == docs[:VAL_DOCS]
    assert decode_docs(split_stream(train), tok) == docs[VAL_DOCS:]  # the rest, in order, none lost
    for s, data in (('val', val), ('train', train)):
        assert np.array_equal(split_stream(data), expected[s])
        assert all(n == SHARD for n in data.sizes[:-1]) and 0 < data.sizes[-1] <= SHARD
    assert len(train.shards) >= 4
    files = sorted(os.listdir(out))
    assert files == ['meta.json', 'train_000000.bin',
                     *[f'train_{i:06d}.bin' for i in range(1, len(train.shards))],
                     *[f'val_{i:06d}.bin' for i in range(len(val.shards))]]

    meta = val.meta
    assert (meta['tokenizer'] == {'kind': 'byte'} and meta['vocab_size'] == 257
            and meta['eot'] == 256)
    assert meta['source'].endswith(fmt)
    for s, data, n in (('val', val, VAL_DOCS), ('train', train, N_DOCS - VAL_DOCS)):
        assert meta[s] == {'documents': n, 'tokens': len(expected[s]), 'shards': len(data.shards)}
    assert f"{len(expected['train']):,} tokens" in r.stdout


def test_max_tokens_stops_early(tmp_path):
    docs = make_docs()
    source = write_source(tmp_path, 'parquet', docs)
    r = run(source, tmp_path / 'out', '--max_tokens=1.2e3')
    assert r.returncode == 0, r.stderr
    tok = Tokenizer({'kind': 'byte'})
    full = np.array([t for d in docs[VAL_DOCS:] for t in tok.encode(d) + [tok.eot]])
    assert len(full) > 1200
    train = TokenData(str(tmp_path / 'out'), 'train')
    assert np.array_equal(split_stream(train), full[:1200])  # a prefix of the full train stream
    assert list(train.sizes) == [500, 500, 200]
    assert train.meta['train']['tokens'] == 1200 and train.meta['max_tokens'] == 1200
    assert train.meta['train']['documents'] < N_DOCS - VAL_DOCS
    assert train.meta['val']['documents'] == VAL_DOCS


def test_refuses_existing_shards_unless_overwrite(tmp_path):
    source = write_source(tmp_path, 'parquet', make_docs())
    out = tmp_path / 'out'
    assert run(source, out).returncode == 0
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}

    r = run(source, out, '--max_tokens=100')
    assert r.returncode != 0
    assert '--overwrite' in r.stderr and 'already holds' in r.stderr
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before  # untouched

    r = run(source, out, '--max_tokens=100', '--overwrite')
    assert r.returncode == 0, r.stderr
    after = sorted(os.listdir(out))
    # no stale train shards left
    assert [f for f in after if f.startswith('train')] == ['train_000000.bin']
    assert ([f for f in after if f.startswith('val')]
            == [f for f in sorted(before) if f.startswith('val')])
    assert len(TokenData(str(out), 'train')) == 100


def test_common_pile_arxiv_keeps_long_papers_whole(tmp_path):
    lengths = [50, 120, 30, 300, 101, 99, 150]
    rows = [{'text': f"paper {i} " + 'x' * (n - len(f"paper {i} ")), 'id': str(i)}
            for i, n in enumerate(lengths)]
    src = tmp_path / 'arxiv.jsonl'
    src.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    out = tmp_path / 'out'
    cmd = [sys.executable, 'data/common_pile_arxiv/prepare.py', f'--source={src}',
           '--tokenizer=byte', f'--out_dir={out}']
    env = {**os.environ, 'HF_DATASETS_OFFLINE': '1', 'HF_HUB_OFFLINE': '1'}
    r = subprocess.run(cmd + ['--min_tokens=100', '--docs=3', '--batch_docs=2'], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    val = TokenData(str(out), 'val')
    docs = [Tokenizer({'kind': 'byte'}).decode(np.asarray(val.shards[0][a:b]))
            for _, a, b in val.doc_spans()]
    # the first three of at least 100 tokens, whole, in order
    assert docs == [rows[i]['text'] for i in (1, 3, 4)]
    assert (val.meta['min_tokens'] == 100 and val.meta['val']['documents'] == 3
            and len(val.shards) == 1)
    r = subprocess.run(cmd + ['--min_tokens=1000', '--overwrite'], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0 and 'lower --min_tokens' in r.stderr


def test_ruler_essays_in_rulers_order(tmp_path):
    """data/ruler/prepare.py builds RULER's PaulGrahamEssays.json: the .txt essays first, then the
    pages' <font> text through html2text, each group sorted by name, concatenated as they are;
    and RULER's English words only with their SHA-256 (here on file:// URLs)."""
    import hashlib
    src = tmp_path / 'src'
    src.mkdir()
    (src / 'zeta.txt').write_text('Zeta ends without a newline.')
    (src / 'alpha.txt').write_text('Alpha essay.\n')
    page = ('<html><body><p>menu</p><font size="2">Beta <b>page</b> text.<br><br>'
            'Second paragraph.</font></body></html>')
    (src / 'beta.html').write_text(page)
    (src / 'aaa.html').write_text(page.replace('Beta', 'Aaa'))
    urls = [f"file://{src / n}" for n in ('zeta.txt', 'beta.html', 'alpha.txt', 'aaa.html')]
    (tmp_path / 'urls.txt').write_text('\n'.join(urls) + '\n')
    words = json.dumps({'0': 'apple', '1': 'banana'}).encode()
    (src / 'words.json').write_bytes(words)
    out = tmp_path / 'out'
    cmd = [sys.executable, 'data/ruler/prepare.py', f'--urls={tmp_path / "urls.txt"}',
           f'--out_dir={out}', f'--words_url=file://{src / "words.json"}']
    r = subprocess.run([*cmd, f'--words_sha256={hashlib.sha256(words).hexdigest()}'], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = json.loads((out / 'essays.json').read_text())['text']
    import html2text
    from bs4 import BeautifulSoup
    h = html2text.HTML2Text()
    h.ignore_images, h.ignore_tables, h.escape_all, h.reference_links, h.mark_code = (
        True, True, True, False, False)
    pages = [h.handle(str(BeautifulSoup(page.replace('Beta', w), 'html.parser').find('font')))
             for w in ('Aaa', 'Beta')]
    assert text == 'Alpha essay.\nZeta ends without a newline.' + ''.join(pages)
    assert 'menu' not in text and 'Aaa **page** text.' in text  # the <font> element alone
    assert json.loads((out / 'english_words.json').read_text()) == {'0': 'apple', '1': 'banana'}
    (out / 'essays.json').unlink()
    bad = subprocess.run([*cmd, '--words_sha256=0'], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and 'SHA-256 differs' in bad.stderr
    (tmp_path / 'urls.txt').write_text('\n'.join(urls + [f"file://{src / 'missing.txt'}"]))
    gone = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert (gone.returncode != 0 and 'nothing written' in gone.stderr
            and not (out / 'essays.json').exists())


def test_hf_tokenizer_takes_the_eot_its_folder_names(tmp_path):
    """--tokenizer=hf without --eot: the eos_token of the tokenizer_config.json beside
    tokenizer.json (as weights.py loads a released model's tokenizer), so that the data and the
    CPT source agree on the token that ends a document."""
    from tokenizers import Tokenizer as HF, models, pre_tokenizers
    vocab = {w: i for i, w in enumerate(['<unk>', '<|end_of_text|>', '<|endoftext|>'] + sorted(
        {w for d in make_docs() for w in d.replace(':', ' ').replace('.', ' ').split()}))}
    hf = HF(models.WordLevel(vocab, unk_token='<unk>'))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / 'weights'
    folder.mkdir()
    hf.save(str(folder / 'tokenizer.json'))
    (folder / 'tokenizer_config.json').write_text(json.dumps({'eos_token': '<|end_of_text|>'}))
    source = write_source(tmp_path, 'jsonl', make_docs())
    cmd = [sys.executable, 'data/dclm_edu/prepare.py', f'--source={source}', '--tokenizer=hf',
           f'--tokenizer_path={folder}', f'--val_docs={VAL_DOCS}', f'--out_dir={tmp_path / "d"}']
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / 'd' / 'meta.json').read_text())
    assert meta['tokenizer']['eot'] == '<|end_of_text|>' and meta['eot'] == 1


@pytest.mark.parametrize('config, data, command', [
    ('smollm3_pl_d', 'smollm3', '--tokenizer=hf --tokenizer_path=weights/SmolLM3-3B-Base '
                                '--out_dir=data/dclm_edu/smollm3 --max_tokens=1e9'),
    ('mamba2_1b3_pn_d', 'neox', '--tokenizer=hf --tokenizer_path=weights/mamba2-1.3b '
                                '--out_dir=data/dclm_edu/neox --max_tokens=1e9'),
    ('wd', 'gpt2', '--tokenizer=gpt2 --max_tokens=40e9')])
def test_missing_data_names_the_command_the_config_needs(config, data, command):
    """A CPT config's data is in its source's tokenizer: the hint names it (it said
    --tokenizer=byte for SmolLM3's data, neox for Mamba2's, before)."""
    from conftest import run_train
    if os.path.exists(os.path.join(ROOT, 'data', 'dclm_edu', data)):
        pytest.skip('the data is prepared here')
    command = f'python data/dclm_edu/prepare.py {command}'
    r = run_train(f'configs/{config}.py', '--device=cpu')
    assert r.returncode == 1 and f'run `{command}` first' in r.stderr


def test_your_own_text_trains_the_quick_start(tmp_path):
    """data/text/prepare.py on any text: documents cut where --doc_sep says, the last ones held
    out, shards TokenData reads back to the same text; then the quick-start config trains on it
    (two steps here), and a missing folder's error names this command."""
    from conftest import run_train
    from tokens import TokenData
    text = '\n\n\n'.join(f"document {i}: " + 'the quick brown fox jumps. ' * (20 + i)
                         for i in range(10))
    (tmp_path / 'mine.txt').write_text(text)
    out = tmp_path / 'byte'
    r = subprocess.run([sys.executable, 'data/text/prepare.py', f'--input={tmp_path}/mine.txt',
                        r'--doc_sep=\n\n\n', f'--out_dir={out}'], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / 'meta.json').read_text())
    assert meta['train']['documents'] == 9 and meta['val']['documents'] == 1
    val, tok = TokenData(str(out), 'val'), Tokenizer(meta['tokenizer'])
    assert tok.decode([int(t) for t in val.shards[0][:-1]]) == text.split('\n\n\n')[-1].strip()
    r = run_train('configs/quickstart.py', f'--data_dir={out}', f'--out_dir={tmp_path}/run',
                  '--max_tokens=8192', '--eval_lengths=[256]', '--eval_iters=1',
                  '--eval_windows=1', '--block_size=64', '--eval_interval=100')
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_train('configs/quickstart.py', f'--data_dir={tmp_path}/none/byte')
    assert (f'run `python data/text/prepare.py --input=<your text file> --tokenizer=byte '
            f'--out_dir={tmp_path}/none/byte` first') in r.stderr
    r = subprocess.run([sys.executable, 'data/text/prepare.py', f'--input={tmp_path}/no.txt'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and 'no such file' in r.stderr
