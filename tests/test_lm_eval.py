"""tools/lengthgen.py: lm-eval's three requests answered by our models (a NAPE transformer and
Mamba2) equal a direct computation with the model: loglikelihoods from log_softmax of its logits,
rolling loglikelihoods from its per-token losses, generation from model.generate cut at the stop
string. Then through lm-eval's evaluator on local task files (JSONL in tmp_path, offline), by the
registered name and by the script."""

import glob
import json
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

lm_eval = pytest.importorskip('lm_eval')

import checkpoint  # noqa: E402
from conftest import ROOT, run_script  # noqa: E402
from tools import lengthgen  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402
from mamba import Mamba2, Mamba2Config  # noqa: E402
from model import Transformer, TransformerConfig  # noqa: E402
from tokens import Tokenizer  # noqa: E402

BYTE = Tokenizer({'kind': 'byte'})
MODELS = {'transformer': (Transformer, TransformerConfig, dict(n_head=4, block_size=64)),
          'mamba2': (Mamba2, Mamba2Config, dict(d_state=8, headdim=16, chunk_size=16))}
QUESTION = 'Question: is the sky blue?\nAnswer:'
TOL = dict(abs=1e-5, rel=1e-7)  # float32 logits: sums of a few hundred nats agree to ~1e-5


def save_lively(path, kind='transformer'):
    """A tiny random checkpoint (byte tokenizer, trained length 64) whose greedy text varies: its
    head reads only printable ASCII and newline, the other weights are scaled up (a plain random
    init repeats one character)."""
    torch.manual_seed(0)
    cls, config_cls, extra = MODELS[kind]
    model = cls(config_cls(vocab_size=257, n_layer=2, n_embd=32, tie_embeddings=False, **extra))
    with torch.no_grad():
        rows = [10] + list(range(32, 127))
        head = torch.zeros_like(model.lm_head.weight)
        head[rows] = torch.randn(len(rows), head.size(1)) * 0.3
        model.lm_head.weight.copy_(head)
        for name, p in model.named_parameters():
            if p.dim() == 2 and not name.startswith('lm_head'):
                p.mul_(5)
    checkpoint.save({'model': model.state_dict(), 'model_type': kind,
                     'model_args': asdict(model.config), 'tokenizer': {'kind': 'byte'}, 'step': 7,
                     'config': {'block_size': 64}}, str(path))
    return str(path)


def direct_loglikelihood(model, context, continuation, max_length=64):
    """lm-eval's split (the context's trailing spaces go to the continuation; an empty context is
    end-of-text), then log_softmax of the model's full logits over the continuation's tokens."""
    n = len(context) - len(context.rstrip())
    context, continuation = context[:len(context) - n], context[len(context) - n:] + continuation
    return direct_logprob(model, BYTE.encode(context) or [BYTE.eot], BYTE.encode(continuation),
                          max_length)


def direct_logprob(model, ctx, cont, max_length=64):
    seq = torch.tensor([(ctx + cont)[-(max_length + 1):]])
    with torch.no_grad():
        logits = model(seq[:, :-1], seq[:, 1:])[0][0, -len(cont):]  # (len(cont), V)
    lp, target = F.log_softmax(logits.double(), dim=-1), torch.tensor(cont)
    return lp[torch.arange(len(cont)), target].sum().item(), bool((lp.argmax(-1) == target).all())


def direct_generation(model, context, until, max_new_tokens):
    ids = BYTE.encode(context) or [BYTE.eot]
    out = model.generate(torch.tensor([ids]), max_new_tokens,
                         eos_id=BYTE.eot)[0, len(ids):].tolist()
    text = BYTE.decode(out[:out.index(BYTE.eot)] if BYTE.eot in out else out)
    for u in until:
        text = text.split(u)[0]
    return text


def requests(kind, *args):
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


@pytest.mark.parametrize('kind', ['transformer', 'mamba2'])
def test_requests_equal_a_direct_computation(tmp_path, kind):
    path = save_lively(tmp_path / 'ckpt_000007.pt', kind)
    lm = lengthgen.LengthGenLM(path, device='cpu', batch_size=3)
    model = checkpoint.load_model(path)[0]
    assert lm.max_length == 64  # the trained length, from the checkpoint's config
    greedy = direct_generation(model, 'the grass is', [], 5)
    pairs = [(QUESTION, ' yes'), (QUESTION + ' ', 'no'), ('', 'the grass is green'),
             ('the grass is', greedy),
             ('a long context, longer than the 64 tokens of one pass: ' * 3,
              ' so it is cut from the left'),
             ('x', 'y')]
    got = lm.loglikelihood(requests('loglikelihood', *pairs))
    want = [direct_loglikelihood(model, c, t) for c, t in pairs]
    for (g, g_greedy), (w, w_greedy) in zip(got, want):
        assert g == pytest.approx(w, **TOL) and g_greedy == w_greedy
    assert got[3][1] and not got[0][1]  # the model's own continuation is greedy, ' yes' is not

    # rolling: one text within a window, one of three (the last reaching back for a full context)
    short, long = ('the grass is green and the sky is blue',
                   'the grass is green and the sky is blue. ' * 4)
    got = lm.loglikelihood_rolling(requests('loglikelihood_rolling', (short,), (long,)))
    seq = torch.tensor([[BYTE.eot] + BYTE.encode(short)])
    assert got[0] == pytest.approx(
        -model.position_losses(seq[:, :-1], seq[:, 1:]).double().sum().item(), **TOL)
    want = 0.0
    for ctx, pred in map(make_disjoint_window,
                         get_rolling_token_windows(BYTE.encode(long), BYTE.eot, 64, 1)):
        want += direct_logprob(model, ctx, pred)[0]
    assert 2 * 64 < len(BYTE.encode(long)) < 3 * 64 and got[1] == pytest.approx(want, **TOL)
    # with max_length past the text, one pass through the cache: the sum of the per-token losses
    one = lengthgen.LengthGenLM(path, device='cpu', max_length=256, chunk_size=48)
    seq = torch.tensor([[BYTE.eot] + BYTE.encode(long)])
    assert one.loglikelihood_rolling(requests('loglikelihood_rolling', (long,)))[0] == \
        pytest.approx(-model.position_losses(seq[:, :-1], seq[:, 1:]).double().sum().item(), **TOL)

    # generation: greedy, stopped at a string from the middle of the free-running text, or at
    # max_gen_toks
    free = direct_generation(model, QUESTION, [], 30)
    stop = free[6:8]
    assert len(free.split(stop)[0]) < len(free) - 2  # the stop string cuts the text
    got = lm.generate_until(requests('generate_until',
                                     (QUESTION, {'until': [stop], 'max_gen_toks': 30}),
                                     (QUESTION, {'until': '\x01', 'max_gen_toks': 9}),
                                     ('', {'until': [stop], 'max_new_tokens': 12})))
    assert got == [direct_generation(model, QUESTION, [stop], 30),
                   direct_generation(model, QUESTION, [], 9),
                   direct_generation(model, '', [stop], 12)]
    assert got[0] == free.split(stop)[0] and len(got[1]) == 9
    steps, hidden = [], lm.model.hidden  # and the stop string ends the decoding, not only the text
    lm.model.hidden = lambda *a: steps.append(1) or hidden(*a)
    lm.generate_until(requests('generate_until', (QUESTION, {'until': [stop], 'max_gen_toks': 30})))
    # the prefill, then one per token up to the stop
    assert len(steps) <= 1 + len(free.split(stop)[0]) + len(stop)


def write_tasks(folder, model):
    """Three local tasks over JSONL files (multiple choice, generation, rolling), their answers
    set from the model so that the scores are known: half the choices right, 2 of 3 generations."""
    folder.mkdir()
    docs = [{'question': f'Question: what is {w}?\nAnswer:', 'choices': ['green', 'blue', 'a sun']}
            for w in ('the grass', 'the sky', 'a hill', 'the sea')]
    for i, d in enumerate(docs):
        lls = [direct_loglikelihood(model, d['question'], ' ' + c)[0] for c in d['choices']]
        d['answer'] = lls.index(max(lls)) if i % 2 == 0 else lls.index(min(lls))
    prompts = ['the grass is', 'the sky is', 'a sun shines']
    gen = [{'prompt': p, 'target': direct_generation(model, p, ['\n\n'], 6) if i < 2 else 'nope'}
           for i, p in enumerate(prompts)]
    roll = [{'text': 'the grass is green and the sky is blue. ' * k} for k in (1, 3)]
    common = "test_split: test\ndataset_path: json\n"
    for name, rows, spec in (
            ('mc', docs, 'output_type: multiple_choice\ndoc_to_text: "{{question}}"\n'
                         'doc_to_choice: "{{choices}}"\n'
                         'doc_to_target: "{{answer}}"\nmetric_list:\n  - metric: acc\n'),
            ('gen', gen, 'output_type: generate_until\ndoc_to_text: "{{prompt}}"\n'
                         'doc_to_target: "{{target}}"\n'
                         'generation_kwargs:\n  until: ["\\n\\n"]\n'
                         '  max_gen_toks: 6\n  do_sample: false\n'
                         'metric_list:\n  - metric: exact_match\n'),
            ('roll', roll, 'output_type: loglikelihood_rolling\ndoc_to_text: ""\n'
                           'doc_to_target: "{{text}}"\n'
                           'metric_list:\n  - metric: byte_perplexity\n')):
        (folder / f'{name}.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
        (folder / f'tiny_{name}.yaml').write_text(
            f"task: tiny_{name}\n{common}dataset_kwargs:\n  data_files:\n"
            f"    test: {folder / f'{name}.jsonl'}\n"
            f"  cache_dir: {folder / 'cache'}\n{spec}")
    return roll


def test_greedy_until_ends_at_a_padding_id():
    """As ruler.predict: train.py pads the byte vocabulary (257) to 320 rows, and a weak model's
    argmax may be one of them, which no tokenizer decodes; the continuation ends there."""
    script = iter([52, 50, BYTE.n_vocab, 55])

    class Scripted:  # emits the script, one id a step
        def new_cache(self, length=0):
            return None

        def hidden(self, idx, cache):
            return torch.zeros(1, idx.size(1), 1)

        def lm_head(self, x):
            return F.one_hot(torch.tensor([next(script)]), 320).float()  # (1, V)
    assert lengthgen.greedy_until(Scripted(), BYTE, [1, 2], ['\n'], 8, 16, 'cpu') == '42'


def test_overrides_reach_the_scored_model(tmp_path):
    """overrides (model arguments no weight depends on: YaRN, the log-length temperature) change the
    model lm-eval scores: a rolling loglikelihood past the trained length equals that of the model
    loaded with them, and differs from the plain one's; an argument the model lacks is refused."""
    path = save_lively(tmp_path / 'ckpt_000007.pt')
    text = 'the grass is green and the sky is blue. ' * 4  # 160 bytes, past the trained 64
    seq = torch.tensor([[BYTE.eot] + BYTE.encode(text)])
    got = []
    for overrides in (None, {'attn_scale': 'log_length'}):
        lm = lengthgen.LengthGenLM(path, device='cpu', max_length=256, overrides=overrides)
        model = checkpoint.load_model(path, **(overrides or {}))[0]
        got.append(lm.loglikelihood_rolling(requests('loglikelihood_rolling', (text,)))[0])
        assert got[-1] == pytest.approx(
            -model.position_losses(seq[:, :-1], seq[:, 1:]).double().sum().item(), **TOL)
    assert abs(got[0] - got[1]) > 1e-3
    write_tasks(tmp_path / 'tasks', checkpoint.load_model(path)[0])
    code, said = run_script('tools/eval_lm.py', f'--ckpt={path}', '--tasks=tiny_mc', '--limit=1',
                            f'--include_path={tmp_path / "tasks"}',
                            "--overrides={'rope_scale': 4.0}")
    assert code == 1 and 'cannot load' in said and 'rope_scale' in said, said


def test_local_tasks_through_lm_eval_and_the_script(tmp_path):
    from lm_eval.tasks import TaskManager
    path = save_lively(tmp_path / 'ckpt_000007.pt')
    model = checkpoint.load_model(path)[0]
    roll = write_tasks(tmp_path / 'tasks', model)
    results = lm_eval.simple_evaluate(model='lengthgen', model_args={'ckpt': path, 'device': 'cpu'},
                                      batch_size=2,
                                      tasks=['tiny_mc', 'tiny_gen', 'tiny_roll'], log_samples=True,
                                      task_manager=TaskManager(include_path=str(tmp_path / 'tasks'),
                                                               include_defaults=False))
    r = results['results']
    assert (r['tiny_mc']['acc,none'] == 0.5
            and r['tiny_gen']['exact_match,none'] == pytest.approx(2 / 3))
    for s in results['samples']['tiny_mc']:  # every request lm-eval made, against the model itself
        for (context, continuation), resp in zip(s['arguments'], s['resps']):
            assert resp[0][0] == pytest.approx(
                direct_loglikelihood(model, context, continuation)[0], **TOL)
    lls = [lm.loglikelihood_rolling(requests('loglikelihood_rolling', (d['text'],)))[0]
           for lm in [lengthgen.LengthGenLM(path, device='cpu')] for d in roll]
    assert r['tiny_roll']['byte_perplexity,none'] == pytest.approx(
        torch.tensor(-sum(lls) / sum(len(d['text'].encode()) for d in roll)).exp().item(), rel=1e-5)
    assert results['config']['ckpt'] == path and results['config']['step'] == 7

    out = tmp_path / 'scores.json'
    p = subprocess.run([sys.executable, '-m', 'tools.eval_lm', f'--ckpt={path}',
                        "--tasks=['tiny_mc', 'tiny_gen']", f'--include_path={tmp_path / "tasks"}',
                        f'--out={out}', '--batch_size=3', '--limit=3'],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    saved = json.loads(out.read_text())
    assert (saved['ckpt'] == path
            and saved['results']['tiny_gen']['exact_match,none'] == pytest.approx(2 / 3))
    # the first 3 docs: right, wrong, right
    assert saved['results']['tiny_mc']['acc,none'] == pytest.approx(2 / 3)
    # lm-eval's table
    assert 'tiny_mc' in p.stdout and 'exact_match' in p.stdout and 'samples' not in saved
    manager = TaskManager(include_path=str(tmp_path / 'tasks'), include_defaults=False)
    assert (lengthgen.task_names('tiny_mc, tiny_gen', manager)
            == lengthgen.task_names(['tiny_mc', 'tiny_gen'], manager))
    with pytest.raises(SystemExit,
                       match=r"unknown lm-eval task\(s\): tiny_mx \(did you mean 'tiny_mc'\?\)"):
        lengthgen.task_names('tiny_mc,tiny_mx', manager)


def test_lm_eval_cli_after_importing_lengthgen(tmp_path):
    """lm-eval's own CLI finds the class by its registered name once lengthgen is imported (the
    route tools/lengthgen.py's docstring gives: lm-eval has no plugin mechanism for models)."""
    path = save_lively(tmp_path / 'ckpt_000007.pt')
    write_tasks(tmp_path / 'tasks', checkpoint.load_model(path)[0])
    cli = 'from tools import lengthgen; from lm_eval.__main__ import cli_evaluate; cli_evaluate()'
    p = subprocess.run([sys.executable, '-c', cli,
                        '--model', 'lengthgen', '--model_args', f'ckpt={path}', '--device', 'cpu',
                        '--tasks', 'tiny_gen', '--include_path', str(tmp_path / 'tasks'),
                        '--output_path', str(tmp_path / 'cli.json')],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    written, = glob.glob(str(tmp_path / 'cli_*.json'))  # lm-eval adds a time stamp to the name
    assert (json.loads(open(written).read())['results']['tiny_gen']['exact_match,none']
            == pytest.approx(2 / 3))
