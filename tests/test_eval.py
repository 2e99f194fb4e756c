"""ruler.py's NIAH prompts and metrics, its NIAH-1 harness (with a test double for the
model), eval_loss.py against a direct full-sequence computation, the attention-entropy probe,
and their errors."""

import json
import os
import random
from statistics import mean
import re
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

import checkpoint
import ruler
from conftest import ROOT, run_script
from measures import attention_entropy
from mamba import Mamba2, Mamba2Config
from model import Transformer, TransformerConfig
from tokens import TokenData, Tokenizer

BYTE = Tokenizer({'kind': 'byte'})
DATA = ruler.Data()


@pytest.mark.parametrize('kind,length', [('byte', 1024), ('byte', 4096), ('gpt2', 2048)])
def test_niah_1_prompt_has_rulers_strings_and_fits(kind, length):
    tok = Tokenizer({'kind': kind})
    text, answers = ruler.prompt('niah_single_1', tok, length, 'niah/0', 42, DATA, {})
    key = re.search(r'What is the special magic number for (\S+) mentioned', text).group(1)
    assert re.fullmatch(r'[a-z]+(-[a-z]+)*-[a-zA-Z]+', key) and re.fullmatch(r'\d{7}', answers[0])
    head = ("A special magic number is hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the number afterwards.\n")
    tail = (f"\nWhat is the special magic number for {key} mentioned in the provided text? "
            f"The special magic number for {key} mentioned in the provided text is")
    assert text.startswith(head) and text.endswith(tail)
    lines = text[len(head):-len(tail)].split('\n')
    assert lines.count(f"One of the special magic numbers for {key} is: {answers[0]}.") == 1
    assert all(line == ruler.NOISE for line in lines if not line.startswith('One of'))
    n = len(tok.encode(text)) + 128
    assert n <= length  # fits, with the 128 tokens to generate
    # and fills it, to within a line and a longer key
    assert n + len(tok.encode('\n' + ruler.NOISE)) + 10 > length
    # a function of the seed and id
    assert ruler.prompt('niah_single_1', tok, length, 'niah/0', 42, DATA, {}) == (text, answers)
    assert ruler.prompt('niah_single_1', tok, length, 'niah/1', 42, DATA, {}) != (text, answers)


def test_needle_depth():
    lines = ruler.prompt('niah_single_1', BYTE, 4096, 'd', 42, DATA, {}, depth=0)[0].split('\n')
    assert lines[1].startswith('One of the special magic')
    lines = ruler.prompt('niah_single_1', BYTE, 4096, 'd', 42, DATA, {}, depth=100)[0].split('\n')
    assert lines[-2].startswith('One of the special magic')
    lines = ruler.prompt('niah_single_1', BYTE, 4096, 'd', 42, DATA, {}, depth=50)[0].split('\n')
    at = next(i for i, line in enumerate(lines) if line.startswith('One of'))
    assert abs(at / len(lines) - 0.5) < 0.05


def test_multi_needle_wording():
    text, answers = ruler.niah(30, random.Random(0), DATA, num_needle_k=4, num_needle_v=1,
                               num_needle_q=2)
    assert (text.startswith("Some special magic numbers are hidden")
            and " are all the special magic numbers for " in text)
    assert (', and ' in text and len(answers) == 2
            and text.endswith("mentioned in the provided text are"))


def test_too_short_a_length_is_refused():
    with pytest.raises(ValueError, match='too few for this task'):
        ruler.prompt('niah_single_1', BYTE, 300, 'x', 42, DATA, {})


def test_rulers_metrics():
    assert ruler.string_match_all("The numbers are 123 and 456.", ['123', '456']) == 1.0
    assert ruler.string_match_all("only 123", ['123', '456']) == 0.5  # partial
    assert ruler.string_match_all("ABC-def", ['abc-DEF']) == 1.0  # case-insensitive
    assert ruler.string_match_all("", ['123']) == 0.0  # empty
    assert (ruler.string_match_part("only 456", ['123', '456']) == 1.0
            and ruler.string_match_part("none", ['1']) == 0.0)
    assert ruler.postprocess("  12\x0034\t5 \n") == "12\n34\n5"
    assert ruler.score([1.0, 0.5, 0.0]) == 50.0 and ruler.score([1 / 3]) == 33.33


class Oracle:
    """A test double for the model: it finds the needle of the asked key in the prompt and
    answers its number (or a wrong one), then end-of-text."""

    def __init__(self, right=True):
        self.right, self.calls = right, 0

    def generate(self, idx, max_new_tokens, eos_id=None, chunk_size=1024):
        self.calls += 1
        text = BYTE.decode(idx[0].tolist())
        key = re.findall(r'(?:special magic|The magic) number for (\S+) (?:mentioned|is$)',
                         text)[-1]
        value = (re.search(rf'for {re.escape(key)} is:? (\d+)\.', text).group(1) if self.right
                 else '0000000')
        return torch.cat([idx, torch.tensor([BYTE.encode(f" {value}.") + [BYTE.eot]])], dim=1)


def test_harness_scores_100_for_the_needle_and_0_without(tmp_path):
    lengths, depths = [1024, 2048], [0, 100]
    right = ruler.evaluate_niah(Oracle(), BYTE, ruler.Results(str(tmp_path / 'a.jsonl')), lengths,
                                3, depths, 1)
    assert right == {'niah_1': {1024: 100.0, 2048: 100.0},
                     'depth_x_length': {0: {1024: 100.0, 2048: 100.0},
                                        100: {1024: 100.0, 2048: 100.0}}}
    wrong = ruler.evaluate_niah(Oracle(right=False), BYTE, ruler.Results(str(tmp_path / 'b.jsonl')),
                                lengths, 3)
    assert wrong['niah_1'] == {1024: 0.0, 2048: 0.0}
    # resumable: a second run over the same file asks the model nothing
    again = Oracle(right=False)
    assert ruler.evaluate_niah(again, BYTE, ruler.Results(str(tmp_path / 'a.jsonl')), lengths, 3,
                               depths, 1) == right
    assert again.calls == 0
    rows = [json.loads(line) for line in open(tmp_path / 'a.jsonl')][1:]  # after the settings line
    assert len(rows) == 10 and rows[0]['prediction'] == rows[0]['answers'][0] + '.'
    # the short form (ruler.py)
    for oracle, score in ((Oracle(), 100.0), (Oracle(right=False), 0.0)):
        short = ruler.evaluate_niah(oracle, BYTE, ruler.Results(str(tmp_path / f'{score}.jsonl')),
                                    [256, 512], 3, task='niah_single_1_short')
        assert short['niah_1'] == {256: score, 512: score} and oracle.calls == 6


@pytest.mark.parametrize('make', [
    lambda: Transformer(TransformerConfig(vocab_size=257, n_layer=2, n_head=4, n_embd=32)),
    lambda: Mamba2(Mamba2Config(vocab_size=257, n_layer=2, n_embd=32, d_state=8, headdim=16,
                                chunk_size=16)),
])
def test_chunked_prefill_answers_equal_plain_ones(make):
    torch.manual_seed(0)
    model = make().eval()
    text, _ = ruler.prompt('niah_single_1', BYTE, 1024, 'x', 42, DATA, {})
    assert (ruler.predict(model, BYTE, text, 24, 'cpu', chunk_size=37)
            == ruler.predict(model, BYTE, text, 24, 'cpu', chunk_size=4096))


def save_tiny(path, data_dir, **changes):
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=257, n_layer=2, n_head=4, n_embd=32, block_size=32,
                               **changes)
    checkpoint.save({'model': Transformer(config).state_dict(), 'model_type': 'transformer',
                     'model_args': asdict(config), 'tokenizer': {'kind': 'byte'}, 'step': 7,
                     'config': {'block_size': 32, 'data_dir': data_dir}}, str(path))
    return str(path)


def run(script, *args):  # a tool runs as a module: python -m tools.<name>
    command = ['-m', script[:-3].replace('/', '.')] if script.startswith('tools/') else [script]
    return subprocess.run([sys.executable, *command, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_eval_loss_equals_a_full_sequence_computation(tiny_data, tmp_path):
    ckpt = save_tiny(tmp_path / 'ckpt_000007.pt', tiny_data)
    r = run('eval_loss.py', f'--ckpt={ckpt}', '--max_length=128', '--smooth=8', '--chunk_size=24')
    assert r.returncode == 0, r.stderr
    result = json.load(open(tmp_path / 'ckpt_000007_loss.json'))
    got = result['checkpoints'][ckpt]
    windows = TokenData(tiny_data, 'val').long_windows(128, 16, per_document=1)
    model = checkpoint.load_model(ckpt)[0]
    with torch.no_grad():
        direct = torch.stack([F.cross_entropy(model(w[None, :-1], w[None, 1:])[0][0], w[1:],
                                              reduction='none')
                              for w in windows])
    assert result['documents'] == len(windows) == 4 and result['asked'] == 16
    # fewer windows than --docs asks (16): said, with what later windows would give
    later = len(TokenData(tiny_data, 'val').long_windows(128, 16))
    assert later > 4 and (f"asked for 16 windows of 129 tokens; {tiny_data} (val) has 4 at 1 per "
                          f"document: evaluating 4 (--windows_per_doc=16 takes later windows "
                          f"too: {later})") in r.stdout
    torch.testing.assert_close(torch.tensor(got['curve']), direct.mean(0), atol=1e-5, rtol=1e-5)
    assert (list(got['bands']) == ['<=1x', '1-2x', '2-4x']
            and got['bands']['<=1x'] == pytest.approx(direct.mean(0)[:32].mean().item(), abs=1e-5))
    # trailing window of 8
    assert got['smoothed'][10] == pytest.approx(direct.mean(0)[3:11].mean().item(), abs=1e-5)
    assert os.path.exists(tmp_path / 'ckpt_000007_loss.png') and '<=1x' in r.stdout
    # the bands also in positions, as train.py's table: 0-32, 32-64, 64-128
    assert r.stdout.split('\npositions')[1].split('\n')[0].split() == ['0-32', '32-64', '64-128']
    # rows with labels: a label per checkpoint, in the table and the JSON; else refused at once
    other = save_tiny(tmp_path / 'other.pt', tiny_data, dropout=0.1)
    r = run('eval_loss.py', f"--ckpt=['{ckpt}', '{other}']", "--labels=['a', 'b']",
            '--max_length=128', f'--out={tmp_path}/two', '--smooth=8')
    rows = json.load(open(tmp_path / 'two.json'))['checkpoints']
    assert r.returncode == 0 and '\nb ' in r.stdout, r.stderr
    assert [rows[p]['label'] for p in (ckpt, other)] == ['a', 'b']
    assert rows[ckpt]['curve'] == pytest.approx(got['curve'], abs=1e-5)
    r = run('eval_loss.py', f"--ckpt=['{ckpt}', '{ckpt}']", "--labels=['a']", f'--out={tmp_path}/3')
    assert r.returncode != 0 and 'give one per checkpoint' in r.stderr
    assert not os.path.exists(f'{tmp_path}/3.json')


def test_eval_loss_with_yarn_at_evaluation(tiny_data, tmp_path):
    """--overrides sets model arguments no weight depends on: YaRN on a RoPE checkpoint gives the
    curve of the model loaded with it (and not the plain model's); an argument the model lacks is
    refused."""
    ckpt = save_tiny(tmp_path / 'rope.pt', tiny_data, pos_encoding='rope')
    r = run('eval_loss.py', f'--ckpt={ckpt}', '--max_length=128', '--smooth=8',
            "--overrides={'rope_scaling': 'yarn', 'rope_factor': 4.0}")
    assert r.returncode == 0, r.stderr
    got = torch.tensor(json.load(open(tmp_path / 'rope_loss.json'))['checkpoints'][ckpt]['curve'])
    windows = TokenData(tiny_data, 'val').long_windows(128, 16, per_document=1)
    for kw, equal in (({'rope_scaling': 'yarn', 'rope_factor': 4.0}, True), ({}, False)):
        model = checkpoint.load_model(ckpt, **kw)[0]
        with torch.no_grad():
            direct = torch.stack([F.cross_entropy(model(w[None, :-1], w[None, 1:])[0][0], w[1:],
                                                  reduction='none')
                                  for w in windows]).mean(0)
        assert torch.allclose(got, direct, atol=1e-5, rtol=1e-5) == equal
    r = run('eval_loss.py', f'--ckpt={ckpt}', '--max_length=128', "--overrides={'rope_scale': 4.0}",
            '--overwrite=True')
    assert (r.returncode != 0 and "cannot load" in r.stderr and "'rope_scale'" in r.stderr
            and 'Traceback' not in r.stderr)


def test_eval_errors(tiny_data, tmp_path):
    """Each refused in one line (in this process: a refusal needs no process of its own)."""
    ckpt = save_tiny(tmp_path / 'a.pt', tiny_data)
    r = run_script('eval_loss.py', f'--ckpt={ckpt}', '--max_length=100000')
    assert r[0] != 0 and 'no document in' in r[1] and 'the longest has' in r[1]
    learned = save_tiny(tmp_path / 'b.pt', tiny_data, pos_encoding='learned')
    r = run_script('eval_loss.py', f'--ckpt={learned}', '--max_length=64')
    assert r[0] != 0 and 'learned absolute positions for 32 tokens: it cannot take 64' in r[1]
    r = run_script('eval_niah.py', f'--ckpt={learned}', '--lengths=[1024]')
    assert r[0] != 0 and 'learned absolute positions for 32 tokens: it cannot take 1024' in r[1]
    r = run_script('eval_niah.py', f'--ckpt={ckpt}', '--lengths=[512]', '--depths=[]')
    assert r[0] != 0 and 'too few for this task' in r[1] and 'Traceback' not in r[1]
    r = run_script('eval_niah.py', f'--ckpt={ckpt}', '--lengths=[1024, 512]', '--depths=[]',
                   '--samples=1')
    assert r[0] != 0 and 'too few for this task' in r[1]  # said before 1024 runs a sample:
    assert (not os.path.exists(tmp_path / 'a_niah.jsonl')
            or not open(tmp_path / 'a_niah.jsonl').read())
    ckpt_gpt2 = checkpoint.load(ckpt)
    ckpt_gpt2['tokenizer'] = {'kind': 'gpt2'}
    checkpoint.save(ckpt_gpt2, str(tmp_path / 'c.pt'))
    r = run_script('eval_loss.py', f'--ckpt={tmp_path / "c.pt"}', '--max_length=64')
    assert (r[0] != 0
            and "its tokenizer has 50257 tokens, more than the model's vocabulary of 257" in r[1])
    ckpt_gpt2['tokenizer'] = {'kind': 'symbols', 'n_vocab': 200, 'eot': 3}
    checkpoint.save(ckpt_gpt2, str(tmp_path / 'd.pt'))
    r = run_script('eval_loss.py', f'--ckpt={tmp_path / "d.pt"}', '--max_length=64')
    assert r[0] != 0 and 'is tokenized with' in r[1]
    weights = tmp_path / 'mamba-no-tokenizer'
    weights.mkdir()
    m = Mamba2(Mamba2Config(vocab_size=32, n_layer=1, n_embd=32, d_state=8, headdim=16))
    torch.save({'backbone.' + k: v for k, v in m.state_dict().items()},
               weights / 'pytorch_model.bin')
    (weights / 'config.json').write_text(json.dumps({
        'd_model': 32, 'n_layer': 1, 'vocab_size': 32,
        'ssm_cfg': {'layer': 'Mamba2', 'd_state': 8, 'headdim': 16}}))
    r = run_script('eval_niah.py', f'--ckpt={weights}', '--lengths=[1024]')
    assert r[0] != 0 and 'has no tokenizer' in r[1]


def test_niah_table_has_a_row_per_checkpoint_and_reads_scored_rows_back(tiny_data, tmp_path,
                                                                        capsys):
    """eval_niah.py with several checkpoints: one table, a row each (SW: a --window view of one
    checkpoint; K=2: an average), the training length marked, as markdown and JSON; a row that an
    earlier run scored is read back, its samples not run again."""
    for d in ('orig', 'cpt'):
        (tmp_path / d).mkdir()
    orig = save_tiny(tmp_path / 'orig' / 'ckpt_000007.pt', tiny_data)
    cpt = save_tiny(tmp_path / 'cpt' / 'avg2_000005-000007.pt', tiny_data, dropout=0.1)
    ckpt = checkpoint.load(cpt)
    checkpoint.save({**ckpt, 'averaged_steps': [5, 7], 'averaged_from': []}, cpt)
    args = ['--task=niah_single_1_short', '--lengths=[256, 512]', '--samples=2', '--depths=[]']
    assert run_script('eval_niah.py', f'--ckpt={orig}', *args) == (0, '')
    scored = (tmp_path / 'orig' / 'ckpt_000007_niah.jsonl').read_text()
    written = os.stat(tmp_path / 'orig' / 'ckpt_000007_niah.jsonl').st_mtime_ns
    capsys.readouterr()
    assert run_script('eval_niah.py', f"--ckpt=['{orig}', '{orig}', '{cpt}']", '--sw=[1]',
                      '--window=8', '--train_length=256', *args) == (0, '')
    printed = capsys.readouterr().out
    # read back, not run
    assert (tmp_path / 'orig' / 'ckpt_000007_niah.jsonl').read_text() == scored
    assert os.stat(tmp_path / 'orig' / 'ckpt_000007_niah.jsonl').st_mtime_ns == written
    table = json.load(open(tmp_path / 'orig' / 'ckpt_000007_niah_table.json'))
    assert [r['label'] for r in table['rows']] == ['orig', 'orig SW', 'cpt K=2']
    assert [r['window'] for r in table['rows']] == [None, 8, None] and table['train_length'] == 256
    for r, out in zip(table['rows'], ('ckpt_000007_niah', 'ckpt_000007_sw_niah')):
        assert r['score'] == json.load(open(tmp_path / 'orig' / f'{out}.json'))['niah_1']
    md = (tmp_path / 'orig' / 'ckpt_000007_niah_table.md').read_text().splitlines()
    assert md[2] == '| row | 256* | 512 |' and md[-1].startswith('| cpt K=2 | ')
    assert 'orig SW' in printed and '256*' in printed and 'the training length' in printed
    r = run_script('eval_niah.py', f"--ckpt=['{orig}', '{cpt}']", "--labels=['one']", *args)
    assert r[0] != 0 and 'a label per row' in r[1]


@pytest.mark.parametrize('script,args,message', [
    ('tools/probe_variance.py', ['--dropout=1.0'], 'dropout must be below 1'),
    ('tools/probe_variance.py', ['--length=-5'], 'length >= 0 (0: the training length)'),
    ('average_ckpts.py', ['--ckpt_dir=out', '--last=-3'], 'last must be >= 0'),
])
def test_script_inputs_out_of_range_stop_at_once(monkeypatch, tmp_path, script, args, message):
    """Refused in one line before any checkpoint is read (the checkpoint named does not even
    exist)."""
    import runpy
    monkeypatch.setattr('sys.argv', ([script, f'--ckpt={tmp_path}/absent.pt', *args]
                                     if 'probe' in script else [script, *args]))
    with pytest.raises(SystemExit, match=re.escape(message)):
        runpy.run_path(os.path.join(ROOT, script), run_name='__main__')


def test_eval_ruler_script(tiny_data, tmp_path):
    ckpt = save_tiny(tmp_path / 'ckpt_000007.pt', tiny_data)
    r = run('eval_ruler.py', f'--ckpt={ckpt}', "--tasks=['niah_single_1', 'fwe', 'vt']",
            '--lengths=[1024, 2048]', '--samples=1')
    assert r.returncode == 0, r.stderr
    summary = json.load(open(tmp_path / 'ckpt_000007_ruler.json'))
    assert (set(summary['scores']) == {'niah_single_1', 'fwe', 'vt'}
            and summary['too_short'].keys() == {'vt/1024'})
    assert summary['tasks_averaged'] == {'1024': 2, '2048': 3} and 'average' in r.stdout
    assert len(open(tmp_path / 'ckpt_000007_ruler.jsonl').readlines()) == 1 + 5  # settings, samples
    r = run('eval_ruler.py', f'--ckpt={ckpt}', '--tasks=niah_single_7')
    assert r.returncode != 0 and "unknown RULER task 'niah_single_7'" in r.stderr
    # a table: that row read back, a view of it added
    scored = open(tmp_path / 'ckpt_000007_ruler.jsonl').read()
    r = run('eval_ruler.py', f"--ckpt=['{ckpt}', '{ckpt}']", '--sw=[1]', '--window=8',
            "--labels=['Orig.', 'SW']", "--tasks=['niah_single_1', 'fwe', 'vt']",
            '--lengths=[1024, 2048]', '--samples=1', f'--table={tmp_path}/t')
    assert r.returncode == 0, r.stderr
    assert open(tmp_path / 'ckpt_000007_ruler.jsonl').read() == scored
    table = json.load(open(tmp_path / 't.json'))
    assert [(x['label'], x['window']) for x in table['rows']] == [('Orig.', None), ('SW', 8)]
    assert table['rows'][0]['score'] == summary['average'] and table['train_length'] == 32
    md = (tmp_path / 't.md').read_text().splitlines()
    # the title says what each average is over: vt needs more than 1K
    assert md[2] == '| row | 1K | 2K |' and 'tasks averaged: 2 of 3 at 1K, 3 of 3 at 2K' in md[0]


def test_probe_variance_script(tiny_data, tmp_path):
    # 2 layers
    ckpt = save_tiny(tmp_path / 'ckpt_000007.pt', tiny_data, dropout_type='pre_linear', dropout=0.2)
    r = run('tools/probe_variance.py', f'--ckpt={ckpt}', '--batch_size=4')
    assert r.returncode == 0, r.stderr
    got = json.loads((tmp_path / 'ckpt_000007_probe_pre_linear.json').read_text())
    assert got['p'] == 0.2 and got['paper'] == [0.29, 0.37] and len(got['matrices']) == 2 * 6
    layers = got['layers']
    assert ((got['first_half'], got['second_half'])
            == (layers['0']['rel_err'], layers['1']['rel_err']))
    assert layers['0']['rel_err'] == pytest.approx(mean(abs(m['rel_err']) for m in got['matrices']
                                                        if m['layer'] == 0))
    assert [d['cosine'] for d in got['pre_norm_drift']][0] == pytest.approx(1.0)
    assert (os.path.exists(tmp_path / 'ckpt_000007_probe_pre_linear.png')
            and 'first / second half' in r.stdout)
    r = run('tools/probe_variance.py', f'--ckpt={save_tiny(tmp_path / "none.pt", tiny_data)}')
    assert r.returncode != 0 and 'give --dropout_type=pre_linear or vpad' in r.stderr


@pytest.mark.parametrize('pos, window, kv', [('nope', 0, None), (['rope', 'nope'], [8, 0], 2),
                                             ('nape', 0, None)])
def test_attention_entropy_runs_the_models_own_attention(pos, window, kv):
    """While it records, the model computes what it computes without the probe (NoPE, a windowed
    RoPE layer with GQA, NAPE's ALiBi heads), and no hook stays afterwards."""
    torch.manual_seed(0)
    net = Transformer(TransformerConfig(vocab_size=64, n_layer=2, n_head=4, n_kv_head=kv, n_embd=32,
                                        pos_encoding=pos, window=window)).eval()
    windows = torch.randint(0, 64, (2, 301))
    seen = []
    net.norm_f.register_forward_hook(lambda m, x, y: seen.append(y))
    entropy = attention_entropy(net, windows)
    assert entropy.shape == (2, 4, 300) and len(seen) == 2
    for w, h in zip(windows, seen):
        assert torch.allclose(h, net.hidden(w[None, :-1]), atol=1e-5)
    assert all(block.attn.record is None for block in net.layers)


def test_attention_entropy_of_uniform_attention_is_log_of_the_visible_keys(monkeypatch):
    """Zero queries attend uniformly: entropy log(t + 1) at query t with full attention,
    log(min(t + 1, W)) in a window of W keys; 600 positions in slices of 100 queries, so that their
    order is checked."""
    from ops import attention
    monkeypatch.setattr(attention, 'SCORE_ENTRIES', 100 * 2 * 600)  # rows of B x H x Tk scores
    net = Transformer(TransformerConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=16,
                                        pos_encoding=['rope', 'nope'], window=[5, 0])).eval()
    for block in net.layers:
        torch.nn.init.zeros_(block.attn.q_proj.weight)
    entropy = attention_entropy(net, torch.randint(0, 64, (3, 601)))  # (L, H, 600)
    t = torch.arange(600, dtype=torch.float32)
    assert torch.allclose(entropy[0], torch.log((t + 1).clamp(max=5)).expand(2, -1), atol=1e-5)
    assert torch.allclose(entropy[1], torch.log(t + 1).expand(2, -1), atol=1e-5)
