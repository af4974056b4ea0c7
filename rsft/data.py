"""Prompt sets: the built-in demo prompts, local files and folders, hub datasets.

Every loader returns a `datasets.Dataset` with at least `prompt_id` (str) and `prompt` (str); other
columns (the demo task's `task` constraints, say) are kept. Bad input stops here, before any model
is loaded, with a message naming the setting, the file and what was expected.
"""

from __future__ import annotations

import logging
from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from omegaconf import DictConfig

log = logging.getLogger(__name__)

LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _load_local(path_setting: str, path: str, split: str) -> Dataset:
    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(f"{path_setting}={path!r}: no such file or folder; expected a JSONL, JSON, "
                                f"parquet or CSV file, or a datasets.save_to_disk folder")
    if file.is_dir():
        loaded = load_from_disk(str(file))
        if isinstance(loaded, DatasetDict):
            if split not in loaded:
                raise KeyError(f"{path_setting}={path!r} holds splits {list(loaded)}, not {split!r} (data.split)")
            loaded = loaded[split]
        return loaded
    builder = LOCAL_FORMATS.get(file.suffix)
    if builder is None:
        raise ValueError(f"{path_setting}={path!r}: unknown file type {file.suffix!r}; expected one of "
                         f"{sorted(LOCAL_FORMATS)} or a datasets folder")
    if file.stat().st_size == 0:
        raise ValueError(f"{path_setting}={path!r} is empty; expected one prompt per row")
    return load_dataset(builder, data_files=str(file), split="train")


def _normalise(ds: Dataset, cfg: DictConfig, source: str, limit: int | None) -> Dataset:
    if len(ds) == 0:
        raise ValueError(f"{source} has no rows; expected at least one prompt")
    column = cfg.prompt_column
    if column not in ds.column_names:
        raise KeyError(f"data.prompt_column={column!r} is not a column of {source}; "
                       f"its columns are {ds.column_names}")
    for row, value in enumerate(ds[column]):
        if not isinstance(value, str) or not value.strip():
            raise TypeError(f"{source}, row {row}, column {column!r}: expected a non-empty string prompt, "
                            f"got {value!r:.80}")
    if limit is not None:
        ds = ds.select(range(min(int(limit), len(ds))))
    if column != "prompt":
        ds = ds.remove_columns([c for c in ("prompt",) if c in ds.column_names]).rename_column(column, "prompt")
    id_column = cfg.get("id_column")
    if id_column and id_column != "prompt_id":
        if id_column not in ds.column_names:
            raise KeyError(f"data.id_column={id_column!r} is not a column of {source}; columns: {ds.column_names}")
        ds = ds.map(lambda r: {"prompt_id": str(r[id_column])})
    elif "prompt_id" not in ds.column_names or not id_column:
        ds = ds.map(lambda _, i: {"prompt_id": f"p{i:06d}"}, with_indices=True)
    ids = ds["prompt_id"]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{source}: prompt ids (data.id_column={id_column!r}) are not unique")
    return ds


def load_prompts(cfg: DictConfig, which: str = "train") -> Dataset:
    """The prompt set for sampling (`which="train"`) or for held-out evaluation (`which="eval"`)."""
    if which not in ("train", "eval"):
        raise ValueError(f"which={which!r}: expected train or eval")
    split = cfg.split if which == "train" else cfg.eval_split
    limit = cfg.limit if which == "train" else cfg.get("eval_limit")
    if cfg.kind == "demo":
        from rsft.demo_prompts import build_demo_prompts

        ds, source = Dataset.from_list(build_demo_prompts(split)), f"demo prompts (split {split})"
    elif cfg.kind == "local":
        path = cfg.path if which == "train" else cfg.get("eval_path")
        setting = "data.path" if which == "train" else "data.eval_path"
        if path is None:
            raise ValueError(f"{setting} is not set; held-out evaluation needs its own prompt file")
        ds, source = _load_local(setting, path, split), f"{setting}={path!r}"
    elif cfg.kind == "hub":
        if split is None:
            raise ValueError(f"data.{'split' if which == 'train' else 'eval_split'} is not set for hub dataset {cfg.name}")
        ds = load_dataset(cfg.name, cfg.get("config_name"), split=split)
        source = f"hub dataset {cfg.name} (split {split})"
    else:
        raise ValueError(f"data.kind={cfg.kind!r}: expected demo, local or hub")
    ds = _normalise(ds, cfg, source, limit)
    log.info("loaded %d prompts from %s", len(ds), source)
    return ds


def chat_text(tokenizer, prompt: str, system_prompt: str | None = None) -> str:
    """The prompt as the policy sees it: its chat template with the assistant turn opened."""
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": prompt}
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
