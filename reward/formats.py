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

import logging
import math
from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from omegaconf import DictConfig

from rsft.data import check_jsonl

log = logging.getLogger(__name__)

LABEL_COLUMN = "label_prob"
ASSISTANT_TURN = "\n\nAssistant:"
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def _looks_local(path: str) -> bool:
    """A path, not a hub name: it starts like one or ends in a known file suffix."""
    file = Path(path).expanduser()
    suffix = file.suffixes[-2] if file.suffix == ".gz" and len(file.suffixes) > 1 else file.suffix
    return path.startswith((".", "/", "~")) or suffix in FILE_BUILDERS


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
        elif _looks_local(str(path)):
            raise FileNotFoundError(f"reward.data.{setting}={path!r}: no such file or folder")
    return files


def load_raw(cfg: DictConfig, setting: str = "reward.data.path") -> tuple[Dataset, str]:
    """The user's rows as stored (`reward.data.path`, or the setting named: a file, a datasets folder
    or a hub name)."""
    path = str(cfg.path)
    file = Path(path).expanduser()
    source = f"{setting}={path!r}"
    if file.is_dir():
        loaded = load_from_disk(str(file))
        if isinstance(loaded, DatasetDict):
            if cfg.split not in loaded:
                raise KeyError(f"{source} holds splits {list(loaded)}, not {cfg.split!r} (reward.data.split)")
            loaded = loaded[cfg.split]
        return loaded, source
    suffix = file.suffixes[-2] if file.suffix == ".gz" and len(file.suffixes) > 1 else file.suffix
    if file.exists():
        if suffix not in FILE_BUILDERS:
            raise ValueError(f"{source}: unknown file type {suffix!r}; expected {sorted(FILE_BUILDERS)} (optionally "
                             f".gz) or a datasets folder")
        if file.suffix == ".jsonl":  # a bad line is named by its number, not by datasets' generation error
            check_jsonl(setting, path, file)
        return load_dataset(FILE_BUILDERS[suffix], data_files=str(file), split="train"), source
    if _looks_local(path):
        raise FileNotFoundError(f"{source}: no such file or folder")
    return load_dataset(path, split=cfg.split), f"hub dataset {path} (split {cfg.split})"


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
        cut = chosen.rfind(ASSISTANT_TURN, 0, common - len(ASSISTANT_TURN) + 1)
        if cut < 0:
            raise ValueError("the two transcripts share no assistant turn")
        end = cut + len(ASSISTANT_TURN)
    return chosen[:end].lstrip("\n"), chosen[end:].strip(), rejected[end:].strip()


def _require(ds: Dataset, columns: list[str], source: str, hint: str = "") -> None:
    for column in columns:
        if column not in ds.column_names:
            raise KeyError(f"{source}: missing column {column!r} (row 0 onwards); its columns are "
                           f"{ds.column_names}{hint}")


def to_preference_pairs(ds: Dataset, data_format: str, label_column: str, source: str) -> Dataset:
    """Normalise `ds` to prompt/chosen/rejected (text) + label_prob, then validate every row."""
    if len(ds) == 0:
        raise ValueError(f"{source} has no rows; expected preference pairs")
    _require(ds, ["chosen", "rejected"], source)
    labels = ([float(v) if v is not None else float("nan") for v in ds[label_column]]
              if label_column in ds.column_names else [1.0] * len(ds))
    rows = []
    for row, example in enumerate(ds):
        try:
            if data_format == "hh_rlhf" or ("prompt" not in example and isinstance(example["chosen"], list)):
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
                raise ValueError(f"reward.data.format={data_format!r}: expected preference or hh_rlhf")
        except (ValueError, TypeError, KeyError, IndexError) as err:
            if isinstance(err, KeyError) and "missing column" in str(err):
                raise
            raise ValueError(f"{source}, row {row}: cannot read the pair ({err})") from err
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected, LABEL_COLUMN: labels[row]})
    pairs = Dataset.from_list(rows)
    check_pairs(pairs, source, label_column)
    return pairs


def check_pairs(pairs: Dataset, source: str, label_column: str = LABEL_COLUMN) -> None:
    """Every row: text (may be empty) in prompt/chosen/rejected, chosen != rejected, a label in [0, 1] (not NaN)."""
    if len(pairs) == 0:
        raise ValueError(f"{source}: no preference pairs left (after loading and limits)")
    for row, example in enumerate(pairs):
        for column in ("prompt", "chosen", "rejected"):
            value = example[column]
            if not isinstance(value, str):  # an empty reply is data (HH-RLHF has a few preferred ones)
                raise ValueError(f"{source}, row {row}, column {column!r}: expected text, got {value!r:.80}")
        if example["chosen"] == example["rejected"]:
            raise ValueError(f"{source}, row {row}: columns 'chosen' and 'rejected' are identical ({example['chosen']!r:.60})")
        label = example[LABEL_COLUMN]
        if label is None or math.isnan(label) or not 0.0 <= label <= 1.0:
            raise ValueError(f"{source}, row {row}, column {label_column!r}: soft label {label} is not in [0, 1]")
