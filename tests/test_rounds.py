"""Rounds that keep improving on tiny models: fresh prompts every round (data.rotate), a
reward model retrained on each round's labels that scores that round (loop.refresh_reward), DPO on the
rejected samples after SFT (loop.dpo), and a 3-round loop with all three killed mid-round that resumes
to the same artifacts."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset, load_from_disk
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import rsft.bt_fit
from reward.trained import load_scorer
from rsft.data import load_prompts, rotation_rows
from rsft.demo_prompts import build_demo_prompts
from rsft.errors import ConfigError, StaleArtifact
from rsft.models import load_causal_lm, load_saved_causal_lm
from rsft.paths import RunPaths
from rsft.store import atomic_artifact, is_complete, read_meta
from rsft.run import run_stage
from tests.conftest import compose_cfg

# ---- data.rotate ----


def test_rotation_takes_every_train_prompt_once_before_repeating_and_never_a_held_out_one():
    assert rotation_rows(10, 4, 0) == [0, 1, 2, 3] and rotation_rows(10, 4, 2) == [8, 9, 0, 1]
    data = OmegaConf.create({"kind": "demo", "split": "train", "eval_split": "test", "prompt_column": "prompt",
                             "id_column": "prompt_id", "limit": 24, "eval_limit": None, "system_prompt": None,
                             "rotate": True})
    train_size = len(build_demo_prompts("train"))  # 320
    held_out = set(load_prompts(data, "eval")["prompt_id"])
    seen: list[str] = []
    for r in range(train_size // 24 + 2):  # past the end of the split: it wraps once
        ids = load_prompts(data, "train", r)["prompt_id"]
        assert len(ids) == 24 and not set(ids) & held_out
        seen += ids
        assert len(set(seen)) == min(len(seen), train_size), f"round {r} repeated a prompt before the split was used up"
    assert len(set(seen)) == train_size
    fixed = OmegaConf.merge(data, {"rotate": False})
    assert load_prompts(fixed, "train", 5)["prompt_id"] == load_prompts(data, "train", 0)["prompt_id"]


def test_rotated_samples_differ_by_round_and_the_switch_is_part_of_their_fingerprint(make_cfg):
    write_policy(make_cfg("stage=sft"))  # round 1 samples from round 0's policy
    first = load_from_disk(str(run_stage(make_cfg("stage=sample", "data.rotate=true", "round=0")).path))
    second = load_from_disk(str(run_stage(make_cfg("stage=sample", "data.rotate=true", "round=1")).path))
    assert not set(first["prompt_id"]) & set(second["prompt_id"])
    with pytest.raises(StaleArtifact, match=r"data\.rotate: True -> False"):
        run_stage(make_cfg("stage=sample", "round=1"))
    assert make_cfg("stage=sample", "data.rotate=no").data.rotate is False  # a typed bool: 'no' is false
    with pytest.raises(ConfigCompositionException, match=r"data\.rotate=maybe"):
        make_cfg("stage=sample", "data.rotate=maybe")


def test_refresh_reward_auto_is_on_only_where_the_rounds_samples_can_be_labelled(make_cfg, tmp_path):
    """The shipped default (loop.refresh_reward=auto) refreshes on the demo task and with the user's
    refresh.pairs, and stays off for a random baseline and for the user's prompts without labels,
    where an explicit true is refused before any work."""
    from rsft.preflight import check_config
    from rsft.config import refresh_reward_on
    from rsft.loop import round_stages

    assert compose_cfg(tmp_path, "stage=loop", tiny=False).loop.refresh_reward == "auto"
    demo = make_cfg("stage=loop", "loop.refresh_reward=auto")
    assert refresh_reward_on(demo) and round_stages(demo) == ["sample", "labels", "refresh", "score", "select", "sft"]
    random = make_cfg("stage=loop", "loop.refresh_reward=auto", "select.strategy=random")
    assert not refresh_reward_on(random) and "refresh" not in round_stages(random)
    prompts, held_out = tmp_path / "prompts.jsonl", tmp_path / "held_out.jsonl"
    prompts.write_text('{"prompt": "Say hi."}\n')
    held_out.write_text('{"prompt": "Say bye."}\n')
    local = ["stage=loop", "data=local", f"data.path={prompts}", f"data.eval_path={held_out}", "loop.reward_from=base"]
    check_config(make_cfg(*local, "loop.refresh_reward=auto"))  # no labels: off, not an error
    assert not RunPaths.from_config(make_cfg(*local, "loop.refresh_reward=auto")).refresh_reward
    assert refresh_reward_on(make_cfg(*local, "loop.refresh_reward=auto", f"refresh.pairs={tmp_path}"))
    with pytest.raises(ConfigError, match=r"loop\.refresh_reward=true with data\.kind=local needs your labelled"):
        check_config(make_cfg(*local, "loop.refresh_reward=true"))
    with pytest.raises(ConfigError, match=r"loop\.refresh_reward='sometimes': expected true, false or auto"):
        check_config(make_cfg("stage=loop", "loop.refresh_reward=sometimes"))


# ---- stage=dpo ----

CHOSEN, REJECTED = "Bees make honey.", "zzzz qqqq zzzz"


def write_policy(cfg) -> RunPaths:
    """round_00/policy: the tiny policy, as if SFT had saved it."""
    paths = RunPaths.from_config(cfg)
    model, tokenizer = load_causal_lm(cfg.policy, cfg.paths.cache_dir, torch.device("cpu"))
    with atomic_artifact(paths.policy(0), {"stage": "sft", "round": 0}) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return paths


def write_sft_policy_and_pairs(cfg, margins):
    """round_00/policy and round_00/pairs with these reward gaps (chosen - rejected, normalised)."""
    paths = write_policy(cfg)
    rows = [{"prompt_id": f"p{i}", "prompt": [{"role": "user", "content": f"Tell me about bees, {i}."}],
             "chosen": [{"role": "assistant", "content": CHOSEN}],
             "rejected": [{"role": "assistant", "content": REJECTED}],
             "chosen_reward": 1.0, "rejected_reward": 1.0 - m,
             "chosen_reward_normalised": 0.5, "rejected_reward_normalised": 0.5 - m} for i, m in enumerate(margins)]
    with atomic_artifact(paths.pairs(0), {"stage": "select (pairs)"}) as tmp:
        Dataset.from_list(rows).save_to_disk(str(tmp))
    return paths


def preference_margin(model, tokenizer) -> float:
    """log p(CHOSEN) - log p(REJECTED) after a chat-formatted prompt."""
    prefix = tokenizer.apply_chat_template([{"role": "user", "content": "Tell me about bees, 0."}], tokenize=False,
                                           add_generation_prompt=True)
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]

    def logp(text):
        ids = tokenizer(prefix + text + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)  # [seq - 1, vocab]
        targets = torch.tensor(ids[1:])  # [seq - 1]
        return float(logits[torch.arange(len(targets)), targets][len(prefix_ids) - 1:].sum())

    return logp(CHOSEN) - logp(REJECTED)


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_dpo_moves_the_sft_policy_toward_the_chosen_and_writes_a_loadable_policy(make_cfg, mode):
    cfg = make_cfg("stage=dpo", "loop.dpo=true", f"dpo.mode={mode}", "dpo.learning_rate=5e-3", "dpo.epochs=3",
                   "dpo.min_margin=0.5", "device=cpu")
    paths = write_sft_policy_and_pairs(cfg, margins=[1.0, 1.0, 1.0, 1.0, 0.1])  # the last gap is too small
    before, tokenizer = load_saved_causal_lm(paths.policy(0), torch.device("cpu"))
    out = run_stage(cfg).path
    assert out == paths.dpo_policy(0) == paths.sampling_policy(1) == paths.eval_policy(0)
    after, saved_tokenizer = load_saved_causal_lm(out, torch.device("cpu"))
    assert type(after) is type(before) and not (out / "adapter_config.json").exists()
    assert saved_tokenizer.get_vocab() == tokenizer.get_vocab()
    old = dict(before.named_parameters())
    changed = {n for n, p in after.named_parameters() if not torch.equal(p, old[n])}
    assert "model.layers.0.self_attn.q_proj.weight" in changed
    assert preference_margin(after, tokenizer) > preference_margin(before, tokenizer) + 1.0
    meta = read_meta(out)
    assert meta["stats"]["pairs"] == 4 and meta["stats"]["pairs_skipped_by_margin"] == 1
    assert meta["reference"] == meta["trained_from"] == str(paths.policy(0))


def test_dpo_refuses_when_every_pair_is_below_the_margin_or_the_loop_has_no_pairs(make_cfg):
    cfg = make_cfg("stage=dpo", "loop.dpo=true", "dpo.min_margin=5", "device=cpu")
    write_sft_policy_and_pairs(cfg, margins=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"dpo\.min_margin=5"):
        run_stage(cfg)
    with pytest.raises(ConfigError, match=r"select\.pairs=true"):
        run_stage(make_cfg("stage=loop", "loop.dpo=true", "select.pairs=false"))
    with pytest.raises(ValueError, match=r"loop\.dpo=true"):
        run_stage(make_cfg("stage=dpo"))


# ---- a 3-round loop with every lever: refreshed reward models, rotation, DPO ----

LOOP = ["stage=loop", "loop.rounds=3", "reward=tiny", "reward.epochs=1", "prefs.num_prompts=4", "prefs.num_samples=3",
        "prefs.max_new_tokens=8", "data.eval_limit=2", "eval.num_samples=2", "sft.learning_rate=1e-3",
        "select.drop_truncated=false", "device=cpu", "loop.refresh_reward=true", "refresh.samples_per_prompt=3",
        "data.rotate=true", "loop.dpo=true", "dpo.min_margin=0.0", "dpo.epochs=1"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The 3-round loop run straight through (shared by the tests below)."""
    root = tmp_path_factory.mktemp("rounds")
    cfg = compose_cfg(root, *LOOP, "run_name=straight")
    run_stage(cfg)
    return RunPaths.from_config(cfg), root


def reward_weights(path) -> dict[str, torch.Tensor]:
    return dict(load_scorer(path).model.named_parameters())


def test_each_round_is_scored_by_its_own_refreshed_reward_model_and_eval_by_the_first(straight):
    paths, _ = straight
    judges = [paths.reward] + [paths.round_reward(r) for r in range(3)]
    for older, newer in zip(judges, judges[1:]):  # every refresh changed the model
        a, b = reward_weights(older), reward_weights(newer)
        assert any(not torch.equal(a[n], b[n]) for n in a), (older, newer)
    for r in range(3):
        scored = load_from_disk(str(paths.scored(r)))
        assert set(scored["reward_model"]) == {f"round_{r:02d}/reward"}
        assert f"round_{r:02d}/reward" in read_meta(paths.scored(r))["fingerprint"]["inputs"]
        # the recorded scores are that model's: rescoring with it gives them back, the previous round's does not
        mine = load_scorer(paths.round_reward(r)).score(scored["prompt"], scored["completion"], progress=False)
        assert mine == pytest.approx(scored["reward"], abs=1e-5)
        previous = load_scorer(judges[r]).score(scored["prompt"], scored["completion"], progress=False)
        assert previous != pytest.approx(scored["reward"], abs=1e-5)
        # the refreshed model trained on the initial labels and every round's so far
        metrics = json.loads((paths.round_reward(r) / "metrics.json").read_text())
        labels = [read_meta(paths.round_prefs(q))["counts"]["train_pairs"] for q in range(r + 1)]
        assert metrics["train_pairs"] == read_meta(paths.prefs)["counts"]["train_pairs"] + sum(labels)
        assert metrics["continued_from"] == str(judges[r])  # refresh.init=previous: the model that scored round r - 1
        # eval judged with the run's first reward model in every round, and the policy DPO wrote
        assert set(read_meta(paths.eval(r))["fingerprint"]["inputs"]) >= {"reward", f"round_{r:02d}/dpo"}
    # fresh prompts every round, and round r + 1 sampled from round r's DPO policy
    ids = [set(load_from_disk(str(paths.samples(r)))["prompt_id"]) for r in range(3)]
    assert not (ids[0] & ids[1] or ids[1] & ids[2] or ids[0] & ids[2])
    assert set(load_from_disk(str(paths.samples(1)))["policy"]) == {str(paths.dpo_policy(0))}


def test_select_ranks_a_prompt_only_among_scores_of_one_reward_model():
    from rsft.best_of_k import survivors

    settings = OmegaConf.create({"drop_empty": True, "drop_truncated": True, "dedupe": True})

    def row(round_idx, sample_idx, reward, model):
        return {"round": round_idx, "sample_idx": sample_idx, "reward": reward, "completion": f"c{round_idx}{sample_idx}",
                "finish_reason": "eos", "reward_model": model}

    # round 0's 9.0 was given by another reward model: not comparable with round 1's scores
    candidates = [row(0, 0, 9.0, "round_00/reward"), row(1, 0, 1.0, "round_01/reward"), row(1, 1, 2.0, "round_01/reward")]
    ranked, dropped = survivors(candidates, settings)
    assert [c["completion"] for c in ranked] == ["c11", "c10"] and dropped["other_reward_model"] == 1
    same = [dict(c, reward_model="reward") for c in candidates]  # one reward model for every round: all compete
    assert survivors(same, settings)[0][0]["completion"] == "c00"


def test_users_without_simulated_labels_must_name_their_round_pairs(make_cfg, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("a cat", "a dog")))
    local = ["stage=loop", "data=local", f"data.path={prompts}", f"data.eval_path={prompts}",
             f"reward.data.path={tmp_path}/pairs.jsonl", "loop.refresh_reward=true"]
    with pytest.raises(ConfigError, match=r"refresh\.pairs=<a folder with round_00\.jsonl"):
        run_stage(make_cfg(*local))
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / "round_01.jsonl").write_text(json.dumps({"prompt": "a cat", "chosen": "purr", "rejected": "no"}) + "\n")
    refresh = ["stage=refresh", *local[1:], f"refresh.pairs={labels}", "refresh.init=scratch", "reward=tiny",
               "reward.epochs=1", "device=cpu"]
    with pytest.raises(FileNotFoundError, match=r"refresh\.pairs=.*labels.*no labelled pairs of round 0.*round_00\.jsonl"):
        run_stage(make_cfg(*refresh, "round=0"))

    def pairs(path, words):
        path.write_text("".join(json.dumps({"prompt": f"say {w}", "chosen": f"{w} {w}", "rejected": "no"}) + "\n"
                                for w in words))

    pairs(tmp_path / "pairs.jsonl", ["sun", "moon", "tree", "river", "sea", "sky"])
    pairs(labels / "round_00.jsonl", ["cat", "dog", "owl", "bee"])
    paths = RunPaths.from_config(make_cfg(*refresh))
    out = run_stage(make_cfg(*refresh, "round=0")).path
    assert out == paths.round_reward(0) == paths.scoring_reward(0)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_pairs"] == 5 + 3  # 6 user pairs less 1 held out, 4 of round 0 less 1
    assert read_meta(paths.round_prefs(0))["labels"].endswith("round_00.jsonl")
    # every round file a loop will read is found and read before it does any work
    loop = [*local, f"refresh.pairs={labels}", "reward=tiny", "loop.rounds=3", "run_name=rounds"]
    (labels / "round_01.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"refresh\.pairs=.*round_01\.jsonl.* is empty"):
        run_stage(make_cfg(*loop))
    pairs(labels / "round_01.jsonl", ["fox", "elk"])
    with pytest.raises(FileNotFoundError, match=r"no labelled pairs of round 2"):
        run_stage(make_cfg(*loop))
    assert not RunPaths.from_config(make_cfg(*loop)).root.exists() or not any(
        RunPaths.from_config(make_cfg(*loop)).root.glob("*/meta.json"))  # nothing was built


def test_a_three_round_loop_killed_mid_round_resumes_to_the_same_artifacts(straight, monkeypatch):
    paths, root = straight
    real_train = rsft.bt_fit.train_and_measure

    def killed_in_round_1(cfg, *args, **kwargs):  # after round 1's labels were written, before its reward model
        if int(cfg.round) == 1:
            raise RuntimeError("killed")
        return real_train(cfg, *args, **kwargs)

    monkeypatch.setattr(rsft.bt_fit, "train_and_measure", killed_in_round_1)
    with pytest.raises(RuntimeError, match="killed"):
        run_stage(compose_cfg(root, *LOOP, "run_name=crashed"))
    crashed = RunPaths(root / "runs" / "crashed", root / "runs", refresh_reward=True, dpo=True)
    assert is_complete(crashed.dpo_policy(0)) and is_complete(crashed.round_prefs(1))
    assert not crashed.round_reward(1).exists()
    stamp = (crashed.round_prefs(1) / "meta.json").stat().st_mtime
    monkeypatch.setattr(rsft.bt_fit, "train_and_measure", real_train)
    run_stage(compose_cfg(root, *LOOP, "run_name=crashed"))
    assert (crashed.round_prefs(1) / "meta.json").stat().st_mtime == stamp  # resumed, not redone

    for r in range(3):
        for artifact in ("samples", "round_prefs", "scored", "selected", "pairs", "eval"):
            a, b = (load_from_disk(str(getattr(run, artifact)(r))) for run in (paths, crashed))
            if artifact == "round_prefs":
                a, b = a["train"], b["train"]
            columns = [c for c in a.column_names if c != "policy"]  # the policy path names the run
            assert a.select_columns(columns).to_list() == b.select_columns(columns).to_list(), (r, artifact)
        for folder in ("round_reward", "policy", "dpo_policy"):
            a, b = (read_meta(getattr(run, folder)(r))["files"] for run in (paths, crashed))
            weights = [name for name in a if name.endswith(".safetensors")]
            assert weights and [a[n] for n in weights] == [b[n] for n in weights], (r, folder)  # size and CRC-32
