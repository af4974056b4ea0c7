"""Preference data in, one normalised shape out: rows of prompt, chosen, rejected, label_prob (text).

`label_prob` (LABEL_COLUMN) is the soft label P(chosen beats rejected) in [0, 1]; a dataset without
the configured label column gets hard labels, 1.0 (chosen won). Accepted inputs (`reward.data`):

- `format: preference`: TRL's preference format with an explicit prompt: `prompt`/`chosen`/`rejected`
  as plain text, or conversational (lists of {role, content} messages: the prompt's messages, the
  replies' assistant messages). TRL's implicit-prompt conversational form (no `prompt`; `chosen` and
  `rejected` share every message but the last) is split like HH-RLHF.
- `format: hh_rlhf`: Anthropic HH-RLHF raw transcripts (`chosen`/`rejected`, "\n\nHuman: ...
  \n\nAssistant: ..." sharing every turn but the last): the shared part up to and including the last
  "\n\nAssistant:" is the prompt, the two last replies are the completions.
- sources: a local JSONL / JSON / parquet file (optionally .gz), a `datasets.save_to_disk` folder
  (a DatasetDict: `split`), or a hub dataset name (needs network or a warm cache).

Conversations are flattened to text ("Role: content" turns) since the reward model reads text
(reward.encoding). Bad rows stop here with the source, the row and the column named.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
from pathlib import Path

from datasets import Dataset
from omegaconf import DictConfig

from reward.refusals import ConfigError, InputError, MissingInput, RsftError
from reward.tables import looks_local, read_table

log = logging.getLogger(__name__)

LABEL_COLUMN = "label_prob"
ASSISTANT_TURN = "\n\nAssistant:"


def pair_files(cfg: DictConfig) -> list[str]:
    """The user's local pair files or folders (reward.data.path / eval_path) that a reward model is
    trained from, for its fingerprint; a hub name is not a file. A missing local path is an error."""
    files = []
    for setting in ("path", "eval_path"):
        path = cfg.get(setting)
        if path is None:
            continue
        if Path(str(path)).expanduser().exists():
            files.append(str(path))
        elif looks_local(str(path)):
            raise MissingInput(f"reward.data.{setting}={path!r}: no such file or folder")
    return files


def load_raw(cfg: DictConfig, setting: str = "reward.data.path") -> tuple[Dataset, str]:
    """The user's rows as stored (`path`: a file, a datasets folder or a hub name with `split` and
    optionally `data_dir`, e.g. Anthropic/hh-rlhf + harmless-base); `setting` names it in errors."""
    return read_table(setting, cfg.path, "preference pairs, one per row", split=cfg.split, data_dir=cfg.get("data_dir"))


def messages_to_text(messages) -> str:
    """A message list as text: a lone user message is its content, longer ones "Role: content" turns."""
    if not isinstance(messages, list):  # text already (anything else is reported by check_pairs)
        return messages
    if len(messages) == 1 and messages[0]["role"] in ("user", "assistant"):
        return messages[0]["content"]
    return "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)


def split_hh_transcript(chosen: str, rejected: str) -> tuple[str, str, str]:
    """(prompt, chosen reply, rejected reply) from two HH-RLHF transcripts sharing all but the last turn."""
    cut = chosen.rfind(ASSISTANT_TURN)
    if cut >= 0 and rejected.startswith(chosen[:cut + len(ASSISTANT_TURN)]):
        end = cut + len(ASSISTANT_TURN)
    else:  # the transcripts differ before the last turn (rare): split at the last shared assistant turn
        common = 0
        while common < min(len(chosen), len(rejected)) and chosen[common] == rejected[common]:
            common += 1
        cut = chosen.rfind(ASSISTANT_TURN, 0, common)  # the last assistant turn wholly inside the shared prefix
        if cut < 0:
            raise ValueError("the two transcripts share no assistant turn")
        end = cut + len(ASSISTANT_TURN)
    return chosen[:end].lstrip("\n"), chosen[end:].strip(), rejected[end:].strip()


def _require(ds: Dataset, columns: list[str], source: str, hint: str = "") -> None:
    for column in columns:
        if column not in ds.column_names:
            raise InputError(f"{source}: missing column {column!r} (row 0 onwards); its columns are "
                             f"{ds.column_names}{hint}")


def _label(value, source: str, row: int, column: str) -> float:
    """A soft label as a float (a missing one is NaN, refused with the row below); text that is not a number
    is named with its file, row and column, as an out-of-range label is."""
    if value is None:
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"{source}, row {row}, column {column!r}: soft label {value!r:.40} is not a number; "
                         f"expected P(chosen beats rejected) in [0, 1]") from None


def to_preference_pairs(ds: Dataset, data_format: str, label_column: str, source: str) -> Dataset:
    """Normalise `ds` to prompt/chosen/rejected (text) + label_prob, then validate every row."""
    if len(ds) == 0:
        raise InputError(f"{source} has no rows; expected preference pairs")
    _require(ds, ["chosen", "rejected"], source)
    labels = ([_label(v, source, row, label_column) for row, v in enumerate(ds[label_column])]
              if label_column in ds.column_names else [1.0] * len(ds))
    rows = []
    for row, example in enumerate(ds):
        try:
            if data_format == "hh_rlhf" or ("prompt" not in example and isinstance(example["chosen"], list)):
                for column in ("chosen", "rejected"):  # a null (or a key missing from the line: datasets fills it)
                    if not isinstance(example[column], (str, list)):
                        raise InputError(f"{source}, row {row}, column {column!r}: expected a transcript (text) or a "
                                         f"list of messages, got {example[column]!r:.80}")
                if isinstance(example["chosen"], list):
                    prompt, chosen, rejected = example["chosen"][:-1], example["chosen"][-1:], example["rejected"][-1:]
                    if example["rejected"][:-1] != prompt:
                        raise ValueError("chosen and rejected conversations differ before their last message")
                    prompt, chosen, rejected = map(messages_to_text, (prompt, chosen, rejected))
                else:
                    prompt, chosen, rejected = split_hh_transcript(example["chosen"], example["rejected"])
            elif data_format == "preference":
                _require(ds, ["prompt"], source, "; for HH-RLHF transcripts use reward.data.format=hh_rlhf")
                prompt, chosen, rejected = (messages_to_text(example[c]) for c in ("prompt", "chosen", "rejected"))
            else:
                raise ConfigError(f"reward.data.format={data_format!r}: expected preference or hh_rlhf")
        except (ValueError, TypeError, KeyError, IndexError) as err:
            if isinstance(err, RsftError):  # a missing column or a bad setting: not this row's fault
                raise
            raise InputError(f"{source}, row {row}: cannot read the pair ({err})") from err
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected, LABEL_COLUMN: labels[row]})
    check_pairs(rows, source, label_column)  # before Arrow sees them: a column of text and ints is its TypeError
    return Dataset.from_list(rows)


def check_pairs(pairs: Dataset | list[dict], source: str, label_column: str = LABEL_COLUMN) -> None:
    """Every row (of a Dataset or a list of row dicts): text (may be empty) in prompt/chosen/rejected,
    chosen != rejected, a label in [0, 1] (not NaN)."""
    if len(pairs) == 0:
        raise InputError(f"{source}: no preference pairs left (after loading and limits)")
    for row, example in enumerate(pairs):
        for column in ("prompt", "chosen", "rejected"):
            value = example[column]
            if not isinstance(value, str):  # an empty reply is data (HH-RLHF has a few preferred ones)
                raise InputError(f"{source}, row {row}, column {column!r}: expected text, got {value!r:.80}")
        if example["chosen"] == example["rejected"]:
            raise InputError(f"{source}, row {row}: columns 'chosen' and 'rejected' are identical "
                             f"({example['chosen']!r:.60})")
        label = example[LABEL_COLUMN]
        if label is None or math.isnan(label) or not 0.0 <= label <= 1.0:
            raise InputError(f"{source}, row {row}, column {label_column!r}: soft label {label} is not in [0, 1]")


PART_BY = ("prompt", "row")


def partition(pairs: Dataset, parts: int, part: int, by: str, seed: int, source: str) -> Dataset:
    """One of `parts` disjoint, seeded parts of the pairs (reward.data.parts / part / part_by / part_seed).

    by="prompt": the distinct prompts are shuffled with the seed and dealt round-robin to the parts, so
    every pair of a prompt lands in the same part (a judge never sees a prompt the proxy was trained
    on); by="row": the rows themselves are shuffled and dealt. The same data and seed always give the
    same parts, and the parts of one seed are disjoint and cover every pair.
    """
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ConfigError(f"reward.data.parts={parts!r}: expected a positive integer (1 = all pairs)")
    if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < parts:
        raise ConfigError(f"reward.data.part={part!r}: expected an integer in [0, {parts - 1}] "
                          f"(reward.data.parts={parts})")
    if by not in PART_BY:
        raise ConfigError(f"reward.data.part_by={by!r}: expected one of {', '.join(PART_BY)}")
    if parts == 1:
        return pairs
    rng = random.Random(seed)
    if by == "row":
        order = list(range(len(pairs)))
        rng.shuffle(order)
        rows = sorted(order[part::parts])
    else:
        prompts = sorted(set(pairs["prompt"]))
        rng.shuffle(prompts)
        mine = set(prompts[part::parts])
        rows = [i for i, p in enumerate(pairs["prompt"]) if p in mine]
    if not rows:
        raise ConfigError(f"{source}: part {part} of {parts} (by {by}) holds no pairs; use fewer reward.data.parts")
    log.info("%s: part %d of %d by %s (seed %d): %d of %d pairs", source, part, parts, by, seed, len(rows), len(pairs))
    return pairs.select(rows)


def pair_hash(prompt: str, chosen: str, rejected: str) -> str:
    """A pair's identity (what two reward models trained on overlapping data share)."""
    return hashlib.sha256("\x1f".join((prompt, chosen, rejected)).encode()).hexdigest()[:16]


def pair_hashes(pairs: Dataset) -> list[str]:
    return sorted({pair_hash(p, c, r) for p, c, r in zip(pairs["prompt"], pairs["chosen"], pairs["rejected"])})
