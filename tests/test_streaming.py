"""Rows streamed through files (issue 33): sample, score and select never hold every row, and what they write
is what Dataset.from_list over all rows would write, whatever the shard and chunk sizes."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset, load_from_disk
from fake_reward import install_fake_reward

from rsft.rows import ArtifactRows, RowWriter, in_tables, save_dataset, write_rows
from rsft.run import run_stage

# parts whose types differ where one inference over all rows would unify them: a column None in the first part
# and float later, a list empty then of ints, a struct field None then a string
ROWS = [{"a": i, "b": None if i < 5 else i * 1.5, "c": [] if i < 3 else [i, i], "s": f"x{i}",
         "d": {"k": None if i < 4 else "v"}} for i in range(12)]
PARTS = [ROWS[0:3], ROWS[3:5], ROWS[5:12]]


def saved(folder):
    state = json.loads((folder / "state.json").read_text())
    state.pop("_fingerprint")  # random for every dataset made in memory
    return load_from_disk(str(folder)), state, json.loads((folder / "dataset_info.json").read_text())


def test_rows_written_in_parts_are_what_from_list_over_all_rows_saves(tmp_path):
    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "whole"))
    write_rows(tmp_path / "parts", PARTS)
    (whole, whole_state, whole_info), (parts, parts_state, parts_info) = saved(tmp_path / "whole"), saved(
        tmp_path / "parts")
    assert parts.features == whole.features and parts.to_list() == whole.to_list() == ROWS
    assert parts_state == whole_state and parts_info == whole_info
    assert not (tmp_path / "parts" / ".parts").exists()
    in_memory = write_rows(None, PARTS)
    assert in_memory.features == whole.features and in_memory.to_list() == ROWS


def test_rows_split_over_files_as_save_to_disk_splits_them(tmp_path):
    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "whole"), num_shards=5)
    write_rows(tmp_path / "parts", PARTS, num_shards=5)
    for name in json.loads((tmp_path / "whole" / "state.json").read_text())["_data_files"]:
        a = Dataset.from_file(str(tmp_path / "whole" / name["filename"]))
        b = Dataset.from_file(str(tmp_path / "parts" / name["filename"]))
        assert a.to_list() == b.to_list()


def test_a_writer_without_rows_is_a_bug_not_an_empty_dataset(tmp_path):
    with pytest.raises(ValueError, match="no rows"):
        RowWriter(tmp_path / "x").close()


def test_artifact_rows_reads_in_batches_and_takes_rows_by_position_over_folders(tmp_path):
    first, second = ROWS[:7], [dict(r, a=r["a"] + 100) for r in ROWS]
    Dataset.from_list(first).save_to_disk(str(tmp_path / "one"), max_shard_size=200)  # several files
    Dataset.from_list(second).save_to_disk(str(tmp_path / "two"))
    rows = ArtifactRows([tmp_path / "one", tmp_path / "two"])
    everything = first + second
    assert [r for batch in rows.batches() for r in batch.to_pylist()] == everything and len(rows) == 19
    positions = [18, 0, 7, 6, 3, 7]
    assert rows.take(positions) == [everything[p] for p in positions]
    assert [t.num_rows for t in in_tables(rows.batches(), 4)] == [4, 4, 4, 4, 3]
    assert [t.num_rows for t in in_tables(rows.batches(), 0)] == [19]


def test_a_loaded_folder_is_copied_and_a_changed_dataset_saved(tmp_path, monkeypatch):
    write_rows(tmp_path / "rows", PARTS)
    ds = load_from_disk(str(tmp_path / "rows"))
    saves = []
    real = Dataset.save_to_disk
    monkeypatch.setattr(Dataset, "save_to_disk", lambda self, path, **kw: (saves.append(path), real(self, path, **kw)))
    save_dataset(ds, tmp_path / "copy")
    assert saves == [] and load_from_disk(str(tmp_path / "copy")).to_list() == ROWS
    save_dataset(ds.add_column("z", list(range(12))), tmp_path / "changed")
    assert saves == [str(tmp_path / "changed")] and load_from_disk(str(tmp_path / "changed"))["z"] == list(range(12))


def from_list_sizes(monkeypatch) -> list[int]:
    """Dataset.from_list, recording how many sample rows each call got (the most held at once)."""
    sizes, real = [], Dataset.from_list.__func__

    def recording(cls, mapping, *args, **kwargs):
        if mapping and "completion" in mapping[0]:  # not the demo prompts' own from_list
            sizes.append(len(mapping))
        return real(cls, mapping, *args, **kwargs)

    monkeypatch.setattr(Dataset, "from_list", classmethod(recording))
    return sizes


def test_samples_are_assembled_a_shard_at_a_time_and_equal_one_shard_of_everything(make_cfg, monkeypatch):
    """5 prompts x 3 in shards of 2 prompts: rows are typed 6 at a time, never all 15, and the dataset equals the
    one sampled as one shard, and the one sampled without a store (in memory, as the scripts do)."""
    from rsft.generation import sample_dataset, sampling_settings
    from rsft.models import load_policy

    sizes = from_list_sizes(monkeypatch)
    sharded = load_from_disk(str(run_stage(make_cfg("stage=sample", "data.limit=5", "sample.shard_prompts=2")).path))
    assert max(sizes) == 6 and len(sharded) == 15
    whole_cfg = make_cfg("stage=sample", "data.limit=5", "sample.shard_prompts=0", "run_name=whole")
    whole = load_from_disk(str(run_stage(whole_cfg).path))
    assert sharded.features == whole.features and sharded.to_list() == whole.to_list()

    from rsft.data import load_prompts
    from rsft.generation import round_seed

    model, tokenizer, _ = load_policy(whole_cfg, None, torch.device("cpu"))
    provenance = {k: sharded[0][k] for k in ("round", "policy", "sampler")}
    in_memory, _ = sample_dataset(model, tokenizer, None, load_prompts(whole_cfg.data, "train"),
                                  sampling_settings(whole_cfg.sample, whole_cfg.draft), 3,
                                  round_seed(whole_cfg.seed, 0), None, provenance, progress=False, shard_prompts=2)
    assert in_memory.features == whole.features and in_memory.to_list() == whole.to_list()


def test_score_and_select_read_rows_a_chunk_at_a_time_and_write_the_same_whatever_the_chunk(make_cfg, monkeypatch):
    """score and select never turn a whole dataset into Python rows (Dataset.to_list is not called); select
    fetched 3 rows at a time writes what it writes fetching everything at once, with and without the levers."""
    import rsft.select

    run_stage(make_cfg("stage=sample", "data.limit=4", "sample.max_new_tokens=12"))
    score_cfg = make_cfg("stage=score", "reward.score_shard_rows=5")
    install_fake_reward(monkeypatch, score_cfg)

    def refused(self, *args, **kwargs):
        raise AssertionError("a whole dataset was turned into Python rows")

    monkeypatch.setattr(Dataset, "to_list", refused)
    run_stage(score_cfg)
    for levers in ([], ["select.max_opening_share=0.5", "select.diversity=0.5", "select.k=2"]):
        written = {}
        for chunk_rows in (3, 4096):
            monkeypatch.setattr(rsft.select.PromptGroups, "chunk_rows", chunk_rows)
            out = run_stage(make_cfg("stage=select", "select.drop_truncated=false", "select.pairs=true",
                                     "overwrite=true", *levers)).path
            written[chunk_rows] = [Dataset.from_file(str(f))[:] for folder in (out, out.parent / "pairs")
                                   for f in sorted(folder.glob("*.arrow"))]
        assert written[3] == written[4096] and written[3][0]["rank"]
