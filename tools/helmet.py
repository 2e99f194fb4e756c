"""
HELMET's synthetic recall category (Yen et al. 2025, princeton-nlp/HELMET) offline: JSON KV and
RULER's MK-2 (niah_multikey_2), MK-3 (niah_multikey_3) and MV (niah_multivalue), prompted and
scored as HELMET does for a base model (no chat template), over ruler.py's generators and harness;
evaluate runs them for tools/eval_helmet.py.

Where each piece comes from in HELMET's repository:
- the tasks and their settings: configs/recall.yaml (131072 tokens) and configs/recall_short.yaml
  (8192, 16384, 32768, 65536): max_test_samples 100; generation_max_length 50 for MK-2 and MV,
  100 for MK-3 and JSON KV; shots 2 (JSON KV's demos; data.py gives RULER none);
  use_chat_template false. arguments.py: greedy (do_sample False), no stop at a newline
  (stop_newline False; the yaml's `stop_new_line` is no argument of it), so a generation ends at
  the end-of-text token or the limit (model_utils.py HFModel.generate).
- the prompts: data.py load_ruler (RULER's niah template, singular for one value) and
  load_json_kv (its template from Lost in the Middle's kv_retrieval.prompt, the demos). Without a
  chat template the prompt is prompt_template = user_template + "\n" + system_template, fed with
  the tokenizer's special tokens (a BOS where it has one; ruler.predict does the same), and a
  prompt longer than input_max_length - generation_max_length loses the end of its context
  (model_utils.py tokenize).
- the scoring: eval.py run_test prepends system_template to the output (no chat template), then
  data.py's post_process: ruler_recall for RULER, the fraction of the answers found as
  lower-cased substrings (no normalisation); substring_exact_match for JSON KV (utils.py
  calculate_metrics: normalize_answer, then the answer as a substring; the max of the output and
  of parse_output's line after "corresponding value:"). Each metric is the mean over samples x 100.
- the table: scripts/collect_results.py: a row per input length, the columns
  "<dataset> <metric>", and "Recall", the mean of the four.

The data: HELMET reads files it does not generate in its code
(data/ruler/<task>/validation_<L>.jsonl, made by RULER's generator, and
data/json_kv/test_k{105,220,440,900,1800}_dep6.jsonl); we make them:
- MK-2, MK-3, MV: ruler.prompt (RULER's needles, haystacks, and sizing: prompt plus RULER's 128
  tokens to generate fit the length, as RULER made HELMET's files), its prompt taken apart into
  context, query and needle type (singular for one value, "number" and "uuid", as RULER's niah.py
  makes it), and these put in HELMET's template; the result is RULER's prompt with the answer
  prefix on a line of its own;
- JSON KV: Lost in the Middle's key-value retrieval (nelson-liu/lost-in-the-middle, which data.py
  cites: scripts/make_kv_retrieval_data.py, src/lost_in_the_middle/prompting.py): random uuid4 keys
  and values, the object written `{"k": "v",\\n "k": "v"}` after "JSON data:\\n", one key asked.

Deliberate differences, and why:
- lengths are in our model's tokens, and JSON KV holds as many keys as fit the length with its
  100 tokens to generate (sized as ruler.fit does); HELMET's files hold fixed key counts (105 at
  8K ... 1800 at 128K) counted with Llama 2's tokenizer, which a byte or GPT-2 model does not use.
- HELMET's json_kv files are not in its code, so their layout is inferred: the fields (context,
  demos, question, answer, depth, num_kvs) from data.py and collect_results.py; the context as
  "JSON data:\\n" + Lost in the Middle's object (valid JSON: others' loaders of those files
  json.loads what follows its first line); the uuids bare in the question, demos and answer (as
  Lost in the Middle stores them; its own prompt quotes the key, HELMET's template does not); the
  asked key at one of 6 depths of the object, 0, 0.2, ..., 1 (the files' "dep6"), in turn by
  sample number; the 2 demos fresh uuid pairs. Scoring drops quotes and case, so only the
  prompt's look depends on these choices.
- samples come from our seed (HELMET takes 100 of each file's samples, shuffled with seed 42).
"""

import random
import re
import string

from tqdm import tqdm

import ruler

# HELMET dataset -> (ruler.py task, or None for JSON KV; generation_max_length), in
# configs/recall.yaml's order
TASKS = {
    'ruler_niah_mk_2': ('niah_multikey_2', 50),
    'ruler_niah_mk_3': ('niah_multikey_3', 100),
    'ruler_niah_mv': ('niah_multivalue', 50),
    'json_kv': (None, 100),
}
# scripts/collect_results.py dataset_to_metrics
METRICS = {'ruler_niah_mk_2': 'ruler_recall', 'ruler_niah_mk_3': 'ruler_recall',
           'ruler_niah_mv': 'ruler_recall', 'json_kv': 'substring_exact_match'}
LENGTHS = [8192, 16384, 32768, 65536, 131072]  # recall_short.yaml, then recall.yaml
SAMPLES = 100  # max_test_samples
SHOTS = 2  # JSON KV's demos

# data.py load_ruler: (user_template, system_template); 'multi' for niah_mv and niah_mq, 'single'
# for the other niah
RULER_TEMPLATES = {
    'single': ("A special magic {type_needle_v} is hidden within the following text. Make sure to memorize it. "
               "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
               "What is the special magic {type_needle_v} for {query} mentioned in the provided text?",
               "The special magic {type_needle_v} for {query} mentioned in the provided text is"),
    'multi': ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
              "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
              "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?",
              "The special magic {type_needle_v} for {query} mentioned in the provided text are"),
}
# data.py load_json_kv
JSON_KV_TEMPLATE = ("{context}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n"
                    "{demos}Key: {question}",
                    "Corresponding value:")
JSON_KV_DEMO = "Key: {key}\nCorresponding value:{value}"
JSON_KV_HEADER = "JSON data:\n"  # Lost in the Middle's kv_retrieval.prompt, before the object
JSON_KV_DEPTHS = [i / 5 for i in range(6)]  # "dep6": where the asked key sits in the object


def templates(task):
    """(user_template, system_template) of a task."""
    if task == 'json_kv':
        return JSON_KV_TEMPLATE
    return RULER_TEMPLATES['multi' if ('niah_mv' in task or 'niah_mq' in task) else 'single']


def format_prompt(task, fields):
    """A base model's prompt: user_template + "\\n" + system_template, filled (model_utils.py
    tokenize)."""
    user, system = templates(task)
    return (user + "\n" + system).format(**fields)


# -----------------------------------------------------------------------------
# RULER's MK-2, MK-3, MV: ruler.py's prompt taken apart, for HELMET's template

# ruler.niah's prompt: RULER's template (made singular for one value) and answer prefix, filled.
# (Taken apart because ruler.niah returns only the finished text; were it to return its fields too,
# this would go.)
RULER_PROMPT = re.compile(
    r"(?:A|Some) special magic (?P<type_needle_v>\w+) (?:is|are) hidden within the following "
    r"text\. Make sure to memorize it\. "
    r"I will quiz you about the (?P=type_needle_v) afterwards\.\n(?P<context>.*)\n"
    r"What (?:is|are all) the special magic (?P=type_needle_v) for (?P<query>.+?) "
    r"mentioned in the provided text\? "
    r"The special magic (?P=type_needle_v) for (?P=query) mentioned in the provided text "
    r"(?:is|are)", re.S)


def ruler_fields(text):
    """ruler.niah's prompt -> {type_needle_v, context, query}: the fields of RULER's files that
    HELMET's template takes (its context is everything between the template's two halves)."""
    m = RULER_PROMPT.fullmatch(text)
    if m is None:
        raise ValueError("ruler.py's niah prompt no longer has RULER's template and answer prefix: "
                         "update helmet.RULER_PROMPT to take it apart")
    return m.groupdict()


# -----------------------------------------------------------------------------
# JSON KV

def json_object(records):
    """Lost in the Middle's JSON text of (key, value) records: one record a line, valid JSON."""
    return ''.join(('{' if i == 0 else ' ') + f'"{k}": "{v}"'
                   + (',\n' if i < len(records) - 1 else '}')
                   for i, (k, v) in enumerate(records))


def json_kv(num_kvs, rng, depth=0.0, shots=SHOTS):
    """A JSON KV sample of num_kvs random uuid pairs, the asked key at `depth` (0..1) of the
    object -> HELMET's fields {context, question, answer, demos, depth, num_kvs}."""
    records, keys = [], set()
    # distinct keys: the asked one is in the object once, and in no demo
    while len(records) < num_kvs + shots:
        key = ruler.random_value('uuids', rng, None)
        if key not in keys:
            keys.add(key)
            records.append((key, ruler.random_value('uuids', rng, None)))
    records, demos = records[:num_kvs], records[num_kvs:]
    key, value = records[round(depth * (num_kvs - 1))]
    demo_text = ("\n\n".join(JSON_KV_DEMO.format(key=k, value=" " + v) for k, v in demos)
                 + ("\n\n" if shots > 0 else ""))
    return {'context': JSON_KV_HEADER + json_object(records), 'question': key, 'answer': [value],
            'demos': demo_text, 'depth': depth, 'num_kvs': num_kvs}


def special_tokens(tokenizer):
    """How many tokens the tokenizer adds to a prompt (a BOS where it uses one): HELMET counts them
    (model_utils.py tokenize), and ruler.predict feeds them."""
    return len(tokenizer.encode_prompt('x')) - len(tokenizer.encode('x'))


def json_kv_sample(tokenizer, length, id, seed, sizes, depth):
    """JSON KV at `length` tokens: as many keys as fit with the tokens to generate and the
    tokenizer's special tokens (fitted once per length, cached in `sizes`), fewer while this sample
    overflows; so HELMET's truncation never cuts the object. Depends on (seed, id, depth) alone."""
    ttg = TASKS['json_kv'][1] + special_tokens(tokenizer)
    if ('json_kv', length) not in sizes:
        fit_rng = random.Random(f"{seed}/fit/json_kv/{length}")
        sizes[('json_kv', length)] = ruler.fit(
            lambda n: (format_prompt('json_kv', json_kv(n, fit_rng, depth)), None),
            tokenizer, length, ttg, minimum=2)
    n = sizes[('json_kv', length)]
    while True:
        fields = json_kv(n, random.Random(f"{seed}/json_kv/{id}"), depth)
        if len(tokenizer.encode(format_prompt('json_kv', fields))) + ttg <= length or n == 2:
            return fields
        n -= 1


# -----------------------------------------------------------------------------
# a sample of any task

def missing(task, data):
    """Why the task cannot run here (the essay haystack of MV, MK-2's word lists), or None."""
    return data.missing(TASKS[task][0]) if TASKS[task][0] else None


def truncate(task, fields, tokenizer, length):
    """HELMET's fit to the input length: a prompt (with its special tokens) longer than
    length - generation_max_length loses that many tokens from the end of its context
    (model_utils.py tokenize) -> fields."""
    budget = length - TASKS[task][1]
    over = len(tokenizer.encode_prompt(format_prompt(task, fields))) - budget
    if over <= 0:
        return fields
    context = tokenizer.encode(fields['context'])
    if over >= len(context):
        raise ValueError(f"{length} tokens are too few for {task}: its prompt without context and "
                         f"{TASKS[task][1]} tokens to generate do not fit")
    return {**fields, 'context': tokenizer.decode(context[:-over])}


def sample(task, tokenizer, length, id, seed, data, sizes, index=0):
    """Sample `id` of a task at `length` tokens (prompt plus tokens to generate) -> (fields,
    prompt text). fields holds the template's fields and 'answer' (a list). ValueError: the length
    is too short for the task."""
    if task not in TASKS:
        raise ValueError(f"unknown HELMET recall task {task!r}: the tasks are {', '.join(TASKS)}")
    if task == 'json_kv':
        fields = json_kv_sample(tokenizer, length, id, seed, sizes,
                                JSON_KV_DEPTHS[index % len(JSON_KV_DEPTHS)])
    else:
        text, answers = ruler.prompt(TASKS[task][0], tokenizer, length, id, seed, data, sizes)
        fields = {**ruler_fields(text), 'answer': answers}
    fields = truncate(task, fields, tokenizer, length)
    return fields, format_prompt(task, fields)


# -----------------------------------------------------------------------------
# HELMET's scoring (utils.py, data.py post_process, eval.py)

PUNCTUATION = set(string.punctuation)


def normalize_answer(s):
    """utils.py (SQuAD's): lower case, no punctuation, no articles, single spaces."""
    s = ''.join(ch for ch in s.lower() if ch not in PUNCTUATION)
    return ' '.join(re.sub(r'\b(a|an|the)\b', ' ', s).split())


def answer_list(answers):
    """A string, a list, or a list of lists of answers -> a flat list
    (drqa_metric_max_over_ground_truths)."""
    if isinstance(answers, str):
        return [answers]
    return ([a for group in answers for a in group] if isinstance(answers[0], list)
            else list(answers))


def substring_exact_match(prediction, answers):
    """1 if any normalised answer is a substring of the normalised prediction, else 0."""
    return float(any(normalize_answer(a) in normalize_answer(prediction)
                     for a in answer_list(answers)))


def parse_output(output, prefix="Answer:"):
    """utils.py: the rest of the line after the prefix (case-insensitive), else the first line;
    the prefix stripped once more if repeated."""
    for pattern in (re.compile(f"(?:{prefix})(.*)(?:\n|$)", flags=re.IGNORECASE),
                    re.compile(r"(?:^)(.*)(?:\n|$)")):
        m = pattern.search(output)
        if m is not None:
            return re.sub(f'^{re.escape(prefix)}', '', m[1].strip(), flags=re.IGNORECASE).strip()
    return None


def ruler_recall(prediction, answers):
    """data.py load_ruler's post_process: the fraction of the answers that are lower-cased
    substrings of the prediction (the same rule as RULER's string_match_all)."""
    return ruler.string_match_all(prediction, answers)


def score(task, fields, output):
    """A sample's metric and the text scored: the system template (which a base model continues)
    followed by the model's output, as eval.py."""
    prediction = templates(task)[1].format(**fields) + output
    if task == 'json_kv':  # the max over the output and its parsed line
        return max(substring_exact_match(prediction, fields['answer']),
                   substring_exact_match(parse_output(prediction, "corresponding value:"),
                                         fields['answer'])), prediction
    return ruler_recall(prediction, fields['answer']), prediction


def mean100(scores):
    """HELMET's averaged metric: the mean over samples x 100 (nan for none)."""
    return 100 * sum(scores) / len(scores) if scores else float('nan')


def recall(scores, length):
    """The category average at a length: the mean of the tasks' metrics that ran (collect_results.py
    custom_avgs "Recall"; pandas' mean skips a missing one)."""
    done = [row[length] for row in scores.values() if row[length] == row[length]]
    return sum(done) / len(done) if done else float('nan')


def table(scores, lengths, model):
    """HELMET's collect_results.py layout: a row per input length and model, a column per
    "<dataset> <metric>" (configs/recall.yaml's order), then "Recall"; '-' for what did not run."""
    names = [t for t in TASKS if t in scores]
    columns = ['input_max_length', 'model'] + [f"{t} {METRICS[t]}" for t in names] + ['Recall']
    width = [max(len(c), 8) for c in columns]
    width[1] = max(width[1], len(model))
    lines = ['  '.join(c.rjust(w) if i != 1 else c.ljust(w)
                       for i, (c, w) in enumerate(zip(columns, width)))]
    for L in lengths:
        cells = [str(L), model] + [f"{v:.2f}" if v == v else '-'
                                   for v in [scores[t][L] for t in names] + [recall(scores, L)]]
        lines.append('  '.join(c.rjust(w) if i != 1 else c.ljust(w)
                               for i, (c, w) in enumerate(zip(cells, width))))
    return '\n'.join(lines)


# -----------------------------------------------------------------------------
# the evaluation (tools/eval_helmet.py)

def evaluate(model, tokenizer, results, tasks, lengths, samples, seed, data, device='cpu',
             chunk_size=1024, autocast=None, say=print):
    """Run every sample not yet in results (a ruler.Results) -> {'scores': {task: {length: metric
    x100}} (nan where it did not run), 'recall': {length: the mean over the tasks that ran},
    'tasks_averaged', 'empty': {task: {length: empty outputs}}, 'skipped': {task: why the data is
    missing}, 'too_short': {task/length: why}, 'stand_in_haystack': {task: what its essay is
    instead}}."""
    sizes = {}
    ran, skipped, too_short, jobs = ruler.plan(
        tasks, lengths, samples, lambda t: missing(t, data),
        lambda t, L: sample(t, tokenizer, L, 'check', seed, data, sizes), say)
    for task, L, i in tqdm(jobs, desc='HELMET recall', unit='sample'):
        id = f"{task}/{L}/{i}"
        if id in results:
            continue
        fields, text = sample(task, tokenizer, L, id, seed, data, sizes, index=i)
        output = ruler.predict(model, tokenizer, text, TASKS[task][1], device, chunk_size, autocast)
        value, prediction = score(task, fields, output)
        results.add({'id': id, 'task': task, 'length': L, 'tokens': len(tokenizer.encode(text)),
                     'depth': fields.get('depth'), 'answers': fields['answer'], 'output': output,
                     'prediction': prediction, 'score': value})
    rows = [r for r in results.rows.values() if r['task'] in ran and r['length'] in lengths]

    def cell(t, L):
        return [r for r in rows
                if r['task'] == t and r['length'] == L and int(r['id'].rsplit('/', 1)[1]) < samples]
    scores = {t: {L: mean100([r['score'] for r in cell(t, L)]) for L in lengths} for t in ran}
    return {'scores': scores, 'recall': {L: recall(scores, L) for L in lengths},
            'tasks_averaged': {L: sum((t, L) not in too_short for t in ran) for L in lengths},
            'empty': {t: {L: sum(r['output'].strip() == '' for r in cell(t, L)) for L in lengths}
                      for t in ran},
            'skipped': skipped, 'too_short': {f"{t}/{L}": why for (t, L), why in too_short.items()},
            'stand_in_haystack': {t: data.stand_in for t in ran if data.stand_in and on_essay(t)}}


def on_essay(task):
    """Whether the task's haystack is RULER's essay (MV)."""
    return bool(TASKS[task][0]) and ruler.on_essay(TASKS[task][0])


def task_list(tasks):
    names = list(TASKS) if tasks == 'recall' else [tasks] if isinstance(tasks, str) else list(tasks)
    if not names:
        raise SystemExit("config error: tasks must not be empty")
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise SystemExit(f"unknown HELMET recall task {unknown[0]!r}: "
                         f"the tasks are {', '.join(TASKS)}, or 'recall' for all four")
    return names
