"""stage=sample on the tiny policy: K completions per prompt, provenance, determinism, skip."""

from __future__ import annotations

import json

import pytest
from datasets import load_from_disk

from rsft.paths import RunPaths
from rsft.store import read_meta
from rsft.run import run_stage

PROVENANCE = {"prompt_id", "prompt", "sample_idx", "completion", "completion_ids", "num_tokens", "finish_reason",
              "seed", "round", "policy", "sampler", "num_drafted", "num_accepted", "num_target_forwards", "task"}


@pytest.mark.parametrize("draft", ["none", "ngram"])
def test_sample_writes_k_completions_per_prompt_with_provenance(make_cfg, draft):
    cfg = make_cfg("stage=sample", f"draft={draft}")
    out = run_stage(cfg).path
    ds = load_from_disk(str(out))
    assert PROVENANCE <= set(ds.column_names)
    assert len(ds) == 3 * 3
    for pid in set(ds["prompt_id"]):
        assert sorted(r["sample_idx"] for r in ds if r["prompt_id"] == pid) == [0, 1, 2]
    assert all(r["finish_reason"] in ("eos", "length") and r["num_tokens"] == len(r["completion_ids"]) for r in ds)
    assert json.loads(ds[0]["sampler"])["draft"] == draft
    meta = read_meta(out)
    assert meta["counts"]["rows"] == 9 and "tokens_per_second" in meta["sampling"]


def test_same_seed_same_samples_and_complete_artifact_skips(make_cfg, tmp_path):
    first = load_from_disk(str(run_stage(make_cfg("stage=sample", "run_name=a")).path))
    second = load_from_disk(str(run_stage(make_cfg("stage=sample", "run_name=b")).path))
    assert first["completion_ids"] == second["completion_ids"]
    other = load_from_disk(str(run_stage(make_cfg("stage=sample", "run_name=c", "seed=1")).path))
    assert other["completion_ids"] != first["completion_ids"]
    samples = RunPaths(f"{tmp_path}/runs/a").samples(0)
    stamp = read_meta(samples)["created_at"], (samples / "meta.json").stat().st_mtime
    run_stage(make_cfg("stage=sample", "run_name=a"))  # complete: skipped, untouched
    assert (read_meta(samples)["created_at"], (samples / "meta.json").stat().st_mtime) == stamp


def test_bad_sampler_settings_stop_before_work(make_cfg, tmp_path):
    with pytest.raises(ValueError, match="temperature"):
        run_stage(make_cfg("stage=sample", "sample.temperature=0"))
    with pytest.raises(ValueError, match="gamma"):
        run_stage(make_cfg("stage=sample", "draft=ngram", "draft.gamma=0"))
    with pytest.raises(FileNotFoundError, match="name_or_path"):
        run_stage(make_cfg("stage=sample", "policy=hf", f"policy.name_or_path={tmp_path}/no_model"))
    assert not (tmp_path / "runs" / "demo" / "round_00").exists()


def test_draft_with_a_different_vocabulary_is_refused(make_cfg, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from rsft.models import build_byte_tokenizer

    other = tmp_path / "other_draft"
    tok = build_byte_tokenizer()
    tok.add_tokens(["<extra>"])
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(other)
    tok.save_pretrained(other)
    with pytest.raises(ValueError, match="cannot draft for this policy"):
        run_stage(make_cfg("stage=sample", "draft=model", f"draft.name_or_path={other}"))


class CountedSampling:
    """Sampler.generate, counted (`prompts`: how many prompts each call got) and killed with
    KeyboardInterrupt at call number `kill_at` (0: never): work is counted, never timed."""

    def __init__(self, monkeypatch, kill_at: int = 0):
        from rsft.sampling.batched import Sampler

        real_generate, self.prompts, self.kill_at = Sampler.generate, [], kill_at

        def counting(sampler, prompts, *args, **kwargs):
            self.prompts.append(len(prompts))
            if self.kill_at and len(self.prompts) == self.kill_at:
                raise KeyboardInterrupt("killed")
            return real_generate(sampler, prompts, *args, **kwargs)

        monkeypatch.setattr(Sampler, "generate", counting)


@pytest.mark.parametrize("stage,overrides,artifact", [
    ("sample", ["data.limit=6"], lambda p: p.samples(0)),
    ("eval", ["data.eval_limit=6", "eval.num_samples=2"], lambda p: p.initial_eval),
])
def test_a_sampling_stage_killed_mid_way_resumes_at_its_first_unfinished_shard(make_cfg, monkeypatch, tmp_path, stage,
                                                                               overrides, artifact):
    """6 prompts in shards of 2: a kill in the second shard redoes only that shard, and the artifact equals an
    uninterrupted run's row for row. The work is counted (prompts given to the sampler), not timed."""
    from fake_reward import install_fake_reward

    sampling = CountedSampling(monkeypatch)
    sampled = sampling.prompts
    settings = [f"stage={stage}", "sample.shard_prompts=2", "eval.policy=initial", *overrides]
    straight_cfg = make_cfg(*settings, "run_name=straight")
    install_fake_reward(monkeypatch, straight_cfg)
    straight = load_from_disk(str(run_stage(straight_cfg).path))
    assert sampled == [2, 2, 2]
    sampled.clear()
    sampling.kill_at = 2
    cfg = make_cfg(*settings, "run_name=killed")
    install_fake_reward(monkeypatch, cfg)
    with pytest.raises(KeyboardInterrupt):
        run_stage(cfg)
    paths = RunPaths.from_config(cfg)
    assert not artifact(paths).exists() and len(list(paths.root.rglob(".*.shards/*-rank0-*.json"))) == 1  # the shard (beside it: the machine record)
    sampling.kill_at = 0
    resumed = load_from_disk(str(run_stage(cfg).path))
    assert sampled == [2, 2, 2, 2]  # the first shard once, the killed one again, the third once
    assert resumed.to_list() == straight.to_list()
    meta = read_meta(artifact(paths))
    assert (meta.get("sampling") or meta["metrics"]["sampling"])["shards_resumed"] == 1
    assert not list(paths.root.rglob(".*.shards"))  # gone once the artifact is written


def test_shards_of_other_settings_are_never_reused(make_cfg, monkeypatch):
    sampling = CountedSampling(monkeypatch, kill_at=2)  # killed after one shard
    with pytest.raises(KeyboardInterrupt):
        run_stage(make_cfg("stage=sample", "data.limit=4", "sample.shard_prompts=2"))
    sampling.kill_at = 0
    other = load_from_disk(str(run_stage(make_cfg("stage=sample", "data.limit=4", "sample.shard_prompts=2",
                                                  "sample.temperature=0.9")).path))
    fresh = load_from_disk(str(run_stage(make_cfg("stage=sample", "data.limit=4", "sample.temperature=0.9",
                                                  "run_name=fresh")).path))
    assert other.to_list() == fresh.to_list() and read_meta(run_stage(make_cfg(
        "stage=sample", "data.limit=4", "sample.temperature=0.9", "sample.shard_prompts=2")).path)["sampling"][
        "shards_resumed"] == 0


BUDGET = ["data.limit=4", "sample.num_samples=6", "sample.max_new_tokens=8", "sample.prune.at=[2,4]",
          "sample.adaptive_k.k0=3", "sample.adaptive_k.mean=4.5"]


def test_pruning_and_adaptive_k_record_stopped_rows_and_spend_the_budget(make_cfg, monkeypatch):
    """Stopped rows stay in samples/ (their prefix and checkpoint) and never reach scored/ or selected/;
    adaptive K draws k0 per prompt, then the rest of budget x prompts where the reward model says."""
    from fake_reward import install_fake_reward

    cfg = make_cfg("stage=sample", *BUDGET)
    install_fake_reward(monkeypatch, cfg)
    samples = load_from_disk(str(run_stage(cfg).path))
    assert len(samples) == 18  # 4.5 x 4 prompts
    counts = {p: sum(1 for x in samples["prompt_id"] if x == p) for p in set(samples["prompt_id"])}
    assert min(counts.values()) >= 3 and max(counts.values()) <= 6
    for pid in counts:  # sample indices are contiguous: 0 .. count - 1
        assert sorted(r["sample_idx"] for r in samples if r["prompt_id"] == pid) == list(range(counts[pid]))
    pruned = [r for r in samples if r["finish_reason"] == "pruned"]
    assert pruned and all(r["pruned_at"] in (2, 4) and r["num_tokens"] >= r["pruned_at"] for r in pruned)
    assert all(r["pruned_at"] == 0 for r in samples if r["finish_reason"] != "pruned")
    meta = read_meta(RunPaths.from_config(cfg).samples(0))["sampling"]
    assert meta["pruned"] == len(pruned) == meta["prune_rows_stopped"] and meta["prune_prefixes_scored"] > 0
    assert meta["adaptive"]["second_pass_completions"] == 18 - 12
    assert json.loads(samples[0]["sampler"])["prune"]["at"] == [2, 4]

    scored = load_from_disk(str(run_stage(make_cfg("stage=score", *BUDGET)).path))
    assert len(scored) == 18 - len(pruned) and "pruned" not in scored["finish_reason"]
    selected = load_from_disk(str(run_stage(make_cfg("stage=select", *BUDGET)).path))
    assert "pruned" not in selected["finish_reason"]


def test_sampling_with_a_budget_resumes_mid_way_and_is_reproducible(make_cfg, monkeypatch):
    """A kill in adaptive K's second pass redoes only its unfinished shard; the artifact equals an
    uninterrupted run's. Pruning and adaptive K off leave the fingerprint as it was before they existed."""
    from fake_reward import install_fake_reward

    from rsft.runner import wanted_fingerprint

    sampling = CountedSampling(monkeypatch)
    sampled = sampling.prompts
    settings = ["stage=sample", "sample.shard_prompts=2", *BUDGET]
    straight_cfg = make_cfg(*settings, "run_name=straight")
    install_fake_reward(monkeypatch, straight_cfg)
    straight = load_from_disk(str(run_stage(straight_cfg).path))
    assert sampled == [2, 2, 2, 2]  # two shards per pass
    sampled.clear()
    sampling.kill_at = 4
    cfg = make_cfg(*settings, "run_name=killed")
    install_fake_reward(monkeypatch, cfg)
    with pytest.raises(KeyboardInterrupt):
        run_stage(cfg)
    sampling.kill_at = 0
    resumed = load_from_disk(str(run_stage(cfg).path))
    assert sampled == [2, 2, 2, 2, 2]  # after the kill only the second pass's last shard is sampled
    assert resumed.to_list() == straight.to_list()

    wanted = wanted_fingerprint(cfg)
    assert "sample.prune.at" in wanted["config"] and "reward" in wanted["inputs"]
    plain = wanted_fingerprint(make_cfg("stage=sample", "run_name=killed"))
    assert not any(k.startswith(("sample.prune", "sample.adaptive")) for k in plain["config"])
    assert "reward" not in plain["inputs"]


def test_a_completion_of_no_tokens_has_no_mean_entropy():
    """EOS drawn first leaves a completion of no tokens (EOS is not kept): its mean entropy is null, not 0.0,
    which would pull a policy's mean token entropy down for every empty answer."""
    from datasets import Dataset

    from rsft.generation import SampleColumns
    from rsft.sampling.batched import Completion

    class Decoder:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    prompts = Dataset.from_dict({"prompt_id": ["p"], "prompt": ["hi"]})
    columns = SampleColumns(prompts, Decoder(), {}, False, entropy=True)
    rows = columns.rows([Completion(0, 0, 1, [], "eos", entropy_sum=0.0),
                         Completion(0, 1, 2, [5, 6], "eos", entropy_sum=3.0)])
    assert [r["mean_entropy"] for r in rows] == [None, 1.5]
