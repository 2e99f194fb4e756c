"""
nanoGPT's "poor man's configurator", made strict. A script defines its defaults as module
globals, then calls

    globals().update(configure(globals(), sys.argv[1:]))

Arguments without '--' are config files (plain Python, executed in order); '--key=value'
overrides follow (value parsed as a Python literal, else taken as a string). Unlike nanoGPT:
an unknown key, in a file or on the command line, is an error that names it; a value of the
wrong type is an error (an int is fine for a float, a tuple for a list); a global annotated with
a type (`window: int | list = 0`) accepts exactly that type, and one annotated with a Literal
(`schedule: Literal['wsd', 'cosine'] = 'wsd'`) exactly those values; `limits` gives numeric ranges
(`{'samples': (1, None)}`). A config file may import another
(`from configs.scratch import *`). `--help` lists the keys, their defaults and comments.
UPPER_CASE globals are constants, never keys.
"""

import ast
import difflib
import os
import re
import sys
import types
import typing

CONFIG_TYPES = (int, float, bool, str, list, tuple, type(None))


def config_keys(namespace):
    """The config keys of a script: its public globals of plain types, but not its constants
    (UPPER_CASE names such as PROJECTIONS: the code's, not the user's)."""
    return {k: v for k, v in namespace.items()
            if not k.startswith('_') and not k.isupper() and isinstance(v, CONFIG_TYPES)}


def _fits(value, t):
    if t is float:
        return type(value) in (int, float)
    if t in (list, tuple):
        return type(value) in (list, tuple)
    if typing.get_origin(t) in (list, tuple):  # list[int]: every element an int
        return type(value) in (list, tuple) and all(_fits(v, typing.get_args(t)[0]) for v in value)
    return type(value) is t


def check(key, value, default, annotation=None, where='command line'):
    """Raise SystemExit with a clear message if value does not fit the key's type (or allowed
    values)."""
    if typing.get_origin(annotation) is typing.Literal:
        if value in typing.get_args(annotation) and type(value) is type(default):
            return value
        raise SystemExit(f"config error ({where}): {key} must be one of "
                         f"{list(typing.get_args(annotation))}, got {value!r}")
    if annotation is not None:  # a type, or a union of types (int | list[int] | None)
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        allowed = typing.get_args(annotation) if union else (annotation,)
    elif default is None:  # no type to check against
        return value
    else:
        allowed = (type(default),)
    if any(_fits(value, t) for t in allowed):
        return value
    names = ' or '.join(str(t) if typing.get_origin(t) else getattr(t, '__name__', str(t))
                        for t in allowed)
    raise SystemExit(f"config error ({where}): {key} must be {names}, got {value!r} "
                     f"({type(value).__name__})")


def _unknown(key, known, where):
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return SystemExit(f"config error ({where}): unknown config key {key!r}{hint}")


def comments(path):
    """{key: its comment} from the lines `key = default  # comment` (or `key: type = ...`) of a
    source file: what --help prints beside each key. The first such line of a key: the config
    block's, not a later reassignment's (train.py sets n_layer again per model)."""
    with open(path, encoding='utf-8') as f:
        lines = f.read().splitlines()
    pattern = re.compile(r"^\s*([A-Za-z]\w*)\s*(?::[^=]+)?=.*?\s#\s*(.*)$")
    notes = {}
    for m in filter(None, map(pattern.match, lines)):
        notes.setdefault(m.group(1), m.group(2))
    return notes


def print_help(namespace, sources=()):
    """Every key of the script with its default and its comment (from the script's source and
    `sources`, e.g. the model files whose config fields train.py takes as keys), then exit."""
    script = namespace.get('__file__', sys.argv[0])
    notes = {}
    for path in (*sources, script):
        notes.update(comments(path))
    name = os.path.relpath(script)  # a tool in a folder runs as a module: python -m tools.x
    name = f"-m {name[:-3].replace(os.sep, '.')}" if os.sep in name else name
    print(f"usage: python {name} [config.py ...] [--key=value ...]\n\n"
          f"config files (plain Python) first, then --key=value (a Python literal, else a "
          f"string); the keys:")
    for key, value in config_keys(namespace).items():
        print(f"  --{key}={value!r}" + (f"  # {notes[key]}" if key in notes else ''))
    raise SystemExit(0)


def configure(namespace, argv, lenient_files=False, given=None, help_sources=(), limits=None):
    """Resolve the config: the script's defaults, then config files, then --key=value. -> dict
    lenient_files: skip the keys of config files that this script does not have (a bench or an
    eval reading a training config); unknown keys on the command line are still errors.
    given: a set that receives the keys a file or the command line set (to a default or not).
    --help (or -h) prints every key with its default and comment and exits; help_sources: other
    files that describe some of the keys. limits: the allowed ranges of numeric keys
    (check_limits)."""
    if '--help' in argv or '-h' in argv:
        print_help(namespace, help_sources)
    given = set() if given is None else given
    config = config_keys(namespace)
    annotations = namespace.get('__annotations__', {})
    for arg in argv:
        if not arg.startswith('--'):  # a config file
            try:
                with open(arg) as f:
                    source = f.read()
            except OSError as e:
                raise SystemExit(f"config error: cannot read config file {arg}: {e.strerror}")
            scope = {'__file__': arg}
            try:
                exec(compile(source, arg, 'exec'), scope)
            except SyntaxError as e:
                raise SystemExit(f"config error: {arg}, line {e.lineno}: {e.msg}") from None
            except Exception as e:  # a config file is plain Python: where it failed, in one line
                raise SystemExit(f"config error: {arg} stops with {type(e).__name__}: {e}") \
                    from None
            for key, value in scope.items():
                code = (types.ModuleType, types.FunctionType, type)
                if key.startswith('_') or isinstance(value, code):
                    continue
                if key not in config:
                    if lenient_files:
                        continue
                    raise _unknown(key, config, arg)
                config[key] = check(key, value, namespace[key], annotations.get(key), arg)
                given.add(key)
        else:
            key, eq, text = arg[2:].partition('=')
            if not eq:
                raise SystemExit(f"config error: expected --key=value, got {arg!r}")
            if key not in config:
                raise _unknown(key, config, 'command line')
            try:
                value = ast.literal_eval(text)
            except (SyntaxError, ValueError):
                value = text  # a bare string
            config[key] = check(key, value, namespace[key], annotations.get(key))
            given.add(key)
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}
    check_limits(config, limits or {})
    return config


def check_limits(config, limits):
    """SystemExit naming the first key outside its limits: limits[key] = (low, high, *also), a
    number in [low, high] (None: unbounded) or one of `also` (a special value: 0 for 'the default',
    [] for 'none'); a list must not be empty (unless [] is in `also`), and each of its numbers lies
    in [low, high]."""
    for key, (low, high, *also) in limits.items():
        value = config[key]
        if any(value == a and type(value) is type(a) for a in also):
            continue
        bounds = ' and '.join(f"{op} {b}" for op, b in ((">=", low), ("<=", high)) if b is not None)
        bounds += ''.join(f" (or {a!r})" for a in also)
        if isinstance(value, list) and not value:
            raise SystemExit(f"config error: {key} must not be empty")
        for v in value if isinstance(value, list) else [value]:
            number = isinstance(v, (int, float))
            if number and not ((low is None or v >= low) and (high is None or v <= high)):
                what = f"each of {key}" if isinstance(value, list) else key
                raise SystemExit(f"config error: {what} must be {bounds}, got {value!r}")


# -----------------------------------------------------------------------------
# train.py's keys: their ranges, and the errors between them (the model's own keys are checked by
# its config class)

TRAIN_POSITIVE = ('log_interval', 'eval_interval', 'ckpt_interval', 'eval_iters', 'eval_windows',
                  'task_vocab', 'task_min_len', 'task_max_len', 'task_eval_samples',
                  'needle_value_len', 'needle_keys', 'task_offset', 'batch_size', 'block_size',
                  'tokens_per_batch', 'max_tokens', 'dry_run_gpus')
TRAIN_NOT_NEGATIVE = ('halt_at', 'skip_steps', 'train_tokens', 'weight_decay', 'grad_clip',
                      'spike_threshold', 'keep_last', 'average_interval')
TRAIN_LIMITS = {**{k: (1, None) for k in TRAIN_POSITIVE},
                **{k: (0, None) for k in TRAIN_NOT_NEGATIVE},
                'eval_lengths': (1, None, []), 'seed': (0, 2 ** 63 - 1), 'warmup_frac': (0, 1),
                'anneal_frac': (0, 1), 'beta1': (0, 0.999999), 'beta2': (0, 0.999999),
                'niah_mix': (0, 1), 'average_last': (1, None, [])}


def check_training(c):
    """train.py's config errors that need neither data nor a model, before anything is written."""
    check_limits(c, TRAIN_LIMITS)
    max_iters = int(c['max_tokens'] // c['tokens_per_batch'])
    every = c['average_interval'] or c['ckpt_interval']
    marks = max_iters // every + (max_iters % every > 0)  # averaging steps: each every-th, the last
    errors = [
        (not (0 < c['learning_rate'] < 3e38 and 0 <= c['min_lr'] < 3e38),  # AdamW's float32
         f"learning_rate and min_lr must be positive and finite in float32, got "
         f"{c['learning_rate']}, {c['min_lr']}"),
        (c['warmup_frac'] + c['anneal_frac'] * (c['schedule'] == 'wsd') > 1,
         f"warmup_frac ({c['warmup_frac']}) and anneal_frac ({c['anneal_frac']}) are fractions of "
         f"the run: warm-up plus anneal at most 1"),
        (c['dry_run'] and c['init_from'] == 'resume',
         "a dry run plans a new run, from scratch or for CPT: not init_from='resume'"),
        (c['skip_steps'] and c['init_from'] != 'resume',
         f"skip_steps ({c['skip_steps']}) skips batches of a resumed run: give --init_from=resume"),
        (c['task'] != 'lm' and c['niah_mix'],
         f"niah_mix ({c['niah_mix']}) mixes NIAH-1 into language: it needs task = 'lm'"),
        (c['task'] != 'lm' and c['task_min_len'] > c['task_max_len'],
         f"task_min_len ({c['task_min_len']}) is above task_max_len ({c['task_max_len']})"),
        (c['max_tokens'] < c['tokens_per_batch'],
         f"max_tokens ({c['max_tokens']:g}) is less than one step of tokens_per_batch "
         f"({c['tokens_per_batch']}): nothing to train"),
        (max(c['average_last'], default=0) > marks,
         f"average_last = {c['average_last']}, but the run has {marks} averaging steps (every "
         f"{every} of {max_iters}): lower average_interval or K"),
    ]
    for failed, message in errors:
        if failed:
            raise SystemExit(f"config error: {message}")
