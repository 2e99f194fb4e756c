"""HELMET's recall category: HELMET's strings, the JSON KV object and its fit to the length, the
wrapping of ruler.py's MK-2/MK-3/MV, HELMET's scoring, the table, and tools/eval_helmet.py end to
end."""

import json
import math
import os
import random
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch

import checkpoint
from tools import helmet
import ruler
from model import Transformer, TransformerConfig
from tokens import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BYTE = Tokenizer({'kind': 'byte'})
DATA = ruler.Data(say=lambda *a: None)

# recorded from HELMET's data.py (load_ruler, load_json_kv) and configs/recall*.yaml
HELMET_SINGLE = ("A special magic {type_needle_v} is hidden within the following text. Make sure "
                 "to memorize it. I will quiz you about the {type_needle_v} afterwards.\n"
                 "{context}\n"
                 "What is the special magic {type_needle_v} for {query} mentioned in the provided "
                 "text?")
HELMET_SINGLE_SYSTEM = ("The special magic {type_needle_v} for {query} mentioned in the provided "
                        "text is")
HELMET_MULTI = ("Some special magic {type_needle_v} are hidden within the following text. Make "
                "sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n"
                "{context}\n"
                "What are all the special magic {type_needle_v} for {query} mentioned in the "
                "provided text?")
HELMET_MULTI_SYSTEM = ("The special magic {type_needle_v} for {query} mentioned in the provided "
                       "text are")
HELMET_KV = ("{context}\n\nExtract the value corresponding to the specified key in the JSON object "
             "below.\n\n{demos}Key: {question}")
HELMET_KV_SYSTEM = "Corresponding value:"
HELMET_KV_DEMO = "Key: {key}\nCorresponding value:{value}"


def test_templates_and_settings_are_helmets():
    assert helmet.RULER_TEMPLATES == {'single': (HELMET_SINGLE, HELMET_SINGLE_SYSTEM),
                                      'multi': (HELMET_MULTI, HELMET_MULTI_SYSTEM)}
    assert (helmet.JSON_KV_TEMPLATE == (HELMET_KV, HELMET_KV_SYSTEM)
            and helmet.JSON_KV_DEMO == HELMET_KV_DEMO)
    assert helmet.JSON_KV_HEADER == "JSON data:\n"  # Lost in the Middle's kv_retrieval.prompt
    assert {t: g for t, (_, g) in helmet.TASKS.items()} == {
        'ruler_niah_mk_2': 50, 'ruler_niah_mk_3': 100, 'ruler_niah_mv': 50, 'json_kv': 100}
    assert [r for r, _ in helmet.TASKS.values()] == ['niah_multikey_2', 'niah_multikey_3',
                                                     'niah_multivalue', None]
    assert (helmet.LENGTHS == [8192, 16384, 32768, 65536, 131072] and helmet.SAMPLES == 100
            and helmet.SHOTS == 2)
    assert [helmet.templates(t) for t in helmet.TASKS] == (
        [(HELMET_SINGLE, HELMET_SINGLE_SYSTEM)] * 2
        + [(HELMET_MULTI, HELMET_MULTI_SYSTEM), (HELMET_KV, HELMET_KV_SYSTEM)])
    # a base model's prompt: user template, a newline, the system template
    fields = {'type_needle_v': 'number', 'context': 'CTX', 'query': 'blue-sky'}
    assert helmet.format_prompt('ruler_niah_mk_2', fields) == (
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards.\nCTX\nWhat is the special magic number "
        "for blue-sky mentioned in the provided text?\n"
        "The special magic number for blue-sky mentioned in the provided text is")
    assert helmet.format_prompt('json_kv', {'context': 'C', 'demos': 'D\n\n', 'question': 'k'}) == (
        "C\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n"
        "D\n\nKey: k\nCorresponding value:")


def test_json_object_is_lost_in_the_middles():
    # recorded from nelson-liu/lost-in-the-middle tests/test_prompting.py
    records = [("test key1", "test value1"), ("test key2", "test value2"),
               ("test key3", "test value3")]
    assert helmet.json_object(records) == ('{"test key1": "test value1",\n'
                                           ' "test key2": "test value2",\n'
                                           ' "test key3": "test value3"}')


def parts(text):
    """A JSON KV prompt -> (the object, its JSON text, the asked key, the demos' (key, value))."""
    head, rest = text.split(
        "\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n")
    assert head.startswith("JSON data:\n") and rest.endswith("\nCorresponding value:")
    blocks = rest.split("\n\n")
    demos = [tuple(b.removeprefix("Key: ").split("\nCorresponding value: ")) for b in blocks[:-1]]
    key = blocks[-1].removeprefix("Key: ").removesuffix("\nCorresponding value:")
    body = head.removeprefix("JSON data:\n")
    return json.loads(body), body, key, demos


@pytest.mark.parametrize('index', range(6))
def test_json_kv_prompt_is_valid_json_with_the_key_once(index):
    fields, text = helmet.sample('json_kv', BYTE, 2048, f'json_kv/2048/{index}', 42, DATA, {},
                                 index=index)
    obj, body, key, demos = parts(text)
    assert len(obj) == fields['num_kvs'] > 10 and body.count(key) == 1 and key == fields['question']
    assert fields['answer'] == [obj[key]] and len(obj[key]) == 36
    n = fields['num_kvs']
    assert (list(obj).index(key) == round(helmet.JSON_KV_DEPTHS[index] * (n - 1))
            and fields['depth'] == index / 5)
    assert len(demos) == 2 and all(len(k) == len(v) == 36 and k not in obj for k, v in demos)


@pytest.mark.parametrize('length', [1024, 4096])
def test_json_kv_fills_the_length_with_the_byte_tokenizer(length):
    fields, text = helmet.sample('json_kv', BYTE, length, 'x', 42, DATA, {})
    n = len(BYTE.encode(text)) + 100
    assert n <= length  # fits with the 100 tokens to generate
    # uuids are 36 bytes: lengths are exact
    more = helmet.json_kv(fields['num_kvs'] + 1, random.Random(0))
    # and one key more would not
    assert len(BYTE.encode(helmet.format_prompt('json_kv', more))) + 100 > length
    # the same sample again
    assert helmet.sample('json_kv', BYTE, length, 'x', 42, DATA, {})[1] == text


@pytest.mark.parametrize('task,kind', [('ruler_niah_mk_2', 'number'), ('ruler_niah_mk_3', 'uuid'),
                                       ('ruler_niah_mv', 'numbers')])
def test_ruler_tasks_are_rulers_prompts_in_helmets_template(task, kind):
    L = 2048
    fields, text = helmet.sample(task, BYTE, L, f'{task}/{L}/0', 42, DATA, {})
    rtext, answers = ruler.prompt(helmet.TASKS[task][0], BYTE, L, f'{task}/{L}/0', 42, DATA, {})
    assert fields['answer'] == answers and fields['type_needle_v'] == kind
    assert (len(answers) == (4 if task == 'ruler_niah_mv' else 1)
            and all(a in fields['context'] for a in answers))
    # RULER's prompt, except that HELMET puts the answer prefix on a line of its own
    cut = rtext.rindex(" The special magic")
    assert text == rtext[:cut] + "\n" + rtext[cut + 1:]
    assert len(BYTE.encode(text)) + helmet.TASKS[task][1] <= L
    with pytest.raises(ValueError, match='no longer has RULER'):
        helmet.ruler_fields(text)  # HELMET's own prompt is not ruler.py's


def test_a_long_prompt_loses_the_end_of_its_context():
    fields = {'type_needle_v': 'number', 'context': 'abcdefghij' * 50, 'query': 'k'}
    short = helmet.truncate('ruler_niah_mk_2', fields, BYTE, 400)
    assert len(BYTE.encode(helmet.format_prompt('ruler_niah_mk_2', short))) == 400 - 50
    assert fields['context'].startswith(short['context']) and len(short['context']) < 500
    assert helmet.truncate('ruler_niah_mk_2', fields, BYTE, 4000) is fields
    with pytest.raises(ValueError, match='too few for ruler_niah_mk_2'):
        helmet.truncate('ruler_niah_mk_2', fields, BYTE, 100)


UUID = '9f6d5626-9ec2-439f-924d-d8f326a8da64'


def test_scoring_is_helmets():
    assert helmet.normalize_answer("The  Quick, brown-fox!\nAn apple") == "quick brownfox apple"
    sem = helmet.substring_exact_match
    # case and punctuation normalised away
    assert sem(f"Corresponding value: {UUID.upper()}\nKey:", [UUID]) == 1.0
    assert sem(UUID.replace('-', ''), [UUID]) == 1.0  # HELMET's normalisation drops the hyphens
    assert sem(f"the value is {UUID}, I think", UUID) == 1.0  # a substring, not an exact match
    assert sem(UUID[:-1], [UUID]) == 0.0 and sem("", [UUID]) == 0.0
    assert sem("in paris", [["Rome"], ["Paris"]]) == 1.0  # a list of lists of answers
    assert helmet.parse_output("Corresponding value: abc\nKey: d", "corresponding value:") == "abc"
    assert helmet.parse_output("  first line\nsecond") == "first line"
    assert helmet.parse_output("Answer: Answer: x") == "x"
    kv = {'answer': [UUID]}
    assert (helmet.score('json_kv', kv, f" {UUID}\n\nKey: 1")
            == (1.0, f"Corresponding value: {UUID}\n\nKey: 1"))
    assert helmet.score('json_kv', kv, " 0f6d5626")[0] == 0.0
    # RULER's tasks: the fraction of the answers found, lower-cased substrings, no other
    # normalisation
    mv = {'type_needle_v': 'numbers', 'query': 'blue-sky',
          'answer': ['1234567', '2345678', '3456789', '4567890']}
    value, prediction = helmet.score('ruler_niah_mv', mv, " 1234567, 2345678 and 345")
    assert value == 0.5 and prediction == (
        "The special magic numbers for blue-sky mentioned in the provided text are "
        "1234567, 2345678 and 345")
    mk3 = {'type_needle_v': 'uuid', 'query': 'k', 'answer': [UUID]}
    assert helmet.score('ruler_niah_mk_3', mk3, ' ' + UUID.upper())[0] == 1.0
    # unlike JSON KV's metric
    assert helmet.score('ruler_niah_mk_3', mk3, ' ' + UUID.replace('-', ''))[0] == 0.0
    assert helmet.score('ruler_niah_mk_2', {'type_needle_v': 'number', 'query': 'k',
                                            'answer': ['1234567']}, '')[0] == 0.0


def test_table_has_helmets_layout():
    nan = float('nan')
    scores = {'ruler_niah_mk_2': {8192: 100.0, 16384: 50.0},
              'ruler_niah_mk_3': {8192: 0.0, 16384: nan},
              'ruler_niah_mv': {8192: 25.0, 16384: 25.0}, 'json_kv': {8192: 75.0, 16384: 0.0}}
    # the tasks that ran
    assert helmet.recall(scores, 8192) == 50.0 and helmet.recall(scores, 16384) == 25.0
    lines = helmet.table(scores, [8192, 16384], 'ckpt_000100.pt').split('\n')
    assert lines[0].split() == ['input_max_length', 'model', 'ruler_niah_mk_2', 'ruler_recall',
                                'ruler_niah_mk_3', 'ruler_recall', 'ruler_niah_mv', 'ruler_recall',
                                'json_kv', 'substring_exact_match', 'Recall']
    assert lines[1].split() == ['8192', 'ckpt_000100.pt', '100.00', '0.00', '25.00', '75.00',
                                '50.00']
    assert lines[2].split() == ['16384', 'ckpt_000100.pt', '50.00', '-', '25.00', '0.00', '25.00']
    assert math.isnan(helmet.mean100([])) and helmet.mean100([1.0, 0.0, 0.5]) == 50.0


class Knower:
    """A test double: it continues every prompt with its reference answers (or says nothing)."""

    def __init__(self, answers, silent=False):
        self.answers, self.silent, self.limits = answers, silent, {}

    def generate(self, idx, max_new_tokens, eos_id=None, chunk_size=1024):
        text = BYTE.decode(idx[0].tolist())
        self.limits[text] = max_new_tokens
        reply = '' if self.silent else ' ' + ', '.join(self.answers[text]) + '.'
        return torch.cat([idx, torch.tensor([BYTE.encode(reply)[:max_new_tokens] + [BYTE.eot]])],
                         dim=1)


def test_harness(tmp_path):
    tasks, lengths = list(helmet.TASKS), [1024]
    answers, task_of = {}, {}
    for t in tasks:
        for i in range(2):
            fields, text = helmet.sample(t, BYTE, 1024, f"{t}/1024/{i}", 42, DATA, {}, index=i)
            answers[text], task_of[text] = fields['answer'], t
    results, knower = ruler.Results(str(tmp_path / 'a.jsonl')), Knower(answers)
    r = helmet.evaluate(knower, BYTE, results, tasks, lengths, 2, 42, DATA, say=lambda *a: None)
    assert r['scores'] == {t: {1024: 100.0} for t in tasks} and r['recall'] == {1024: 100.0}
    # HELMET's tokens to generate
    assert knower.limits == {text: helmet.TASKS[t][1] for text, t in task_of.items()}
    assert (len(results.rows) == 8
            and {row['depth'] for row in results.rows.values()} == {None, 0.0, 0.2})
    silent = helmet.evaluate(Knower(answers, silent=True), BYTE,
                             ruler.Results(str(tmp_path / 'b.jsonl')), tasks, lengths, 2, 42, DATA,
                             say=lambda *a: None)
    assert silent['recall'] == {1024: 0.0} and silent['empty']['json_kv'] == {1024: 2}
    said = []
    short = helmet.evaluate(Knower(answers), BYTE, ruler.Results(str(tmp_path / 'c.jsonl')),
                            ['json_kv'], [200, 1024], 1, 42, DATA, say=said.append)
    assert (short['too_short'].keys() == {'json_kv/200'}
            and any('not run: json_kv at 200' in s for s in said))
    assert math.isnan(short['recall'][200]) and short['recall'][1024] == 100.0
    with pytest.raises(SystemExit, match="unknown HELMET recall task 'niah_multikey_2'"):
        helmet.task_list(['json_kv', 'niah_multikey_2'])
    assert (helmet.task_list('recall') == list(helmet.TASKS)
            and helmet.task_list('json_kv') == ['json_kv'])


def test_eval_helmet_script(tmp_path):
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=257, n_layer=2, n_head=4, n_embd=32, block_size=32)
    ckpt = str(tmp_path / 'ckpt_000007.pt')
    checkpoint.save({'model': Transformer(config).state_dict(), 'model_type': 'transformer',
                     'model_args': asdict(config), 'tokenizer': {'kind': 'byte'}, 'step': 7,
                     'config': {'block_size': 32}}, ckpt)
    r = subprocess.run([sys.executable, '-m', 'tools.eval_helmet', f'--ckpt={ckpt}',
                        '--lengths=[1024]', '--samples=1'],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.split('\n') if line.startswith('input_max_length'))
    assert header.split()[-1] == 'Recall' and 'json_kv substring_exact_match' in header
    assert any(line.split()[:2] == ['1024', 'ckpt_000007.pt'] for line in r.stdout.split('\n'))
    summary = json.load(open(tmp_path / 'ckpt_000007_helmet.json'))
    assert summary['tasks'] == list(helmet.TASKS) and set(summary['scores']) == set(helmet.TASKS)
    assert summary['step'] == 7 and '1024' in summary['recall']
    rows = [json.loads(line) for line in open(tmp_path / 'ckpt_000007_helmet.jsonl')][1:]
    assert sorted(row['id'] for row in rows) == sorted(f"{t}/1024/0" for t in helmet.TASKS)
    # a table: the row scored above read back (its samples not run again), and a windowed view
    scored = (tmp_path / 'ckpt_000007_helmet.jsonl').read_text()
    written = os.stat(tmp_path / 'ckpt_000007_helmet.jsonl').st_mtime_ns
    r = subprocess.run([sys.executable, '-m', 'tools.eval_helmet', f"--ckpt=['{ckpt}', '{ckpt}']",
                        '--sw=[1]', '--window=8', "--labels=['full', 'SW']", '--lengths=[1024]',
                        '--samples=1'],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / 'ckpt_000007_helmet.jsonl').read_text() == scored
    assert os.stat(tmp_path / 'ckpt_000007_helmet.jsonl').st_mtime_ns == written  # not rewritten
    table = json.load(open(tmp_path / 'ckpt_000007_helmet_table.json'))
    assert [(row['label'], row['window']) for row in table['rows']] == [('full', None), ('SW', 8)]
    for row, out in zip(table['rows'], ('ckpt_000007_helmet', 'ckpt_000007_sw_helmet')):
        assert row['score'] == json.load(open(tmp_path / f'{out}.json'))['recall']
    assert '| row | 1K |' in (tmp_path / 'ckpt_000007_helmet_table.md').read_text()
