"""stage=online on the tiny models (issue 34): the policy learns while it samples. It writes its artifact
(the policy, the kept completions, per-mini-batch metrics, eval snapshots); a run killed mid-stage and run
again ends bit for bit as an uninterrupted run, having redone at most online.checkpoint_every mini-batches;
bad settings are refused naming the setting. The round loop is untouched (test_loop, test_rounds)."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import load_from_disk
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

import rsft.data
import rsft.online
from rsft.errors import ConfigError
from rsft.paths import RunPaths
from rsft.run import run_stage
from rsft.store import read_meta
from tests.conftest import REPO, write_artifact

VERIFIERS = REPO / "tests" / "reward_fixtures" / "verifiers.py"
ONLINE = ["stage=online", "device=cpu", "reward_source=function", f"reward_source.spec={VERIFIERS}:length",
          "online.prompts_per_batch=2", "sample.num_samples=3", "online.steps_per_batch=2", "online.batch_size=2",
          "online.learning_rate=1e-3", "select.drop_truncated=false", "online.eval_every=0"]


def _weights(path) -> list[torch.Tensor]:
    """The weights of a save_pretrained folder (online/policy: inside the artifact, not one of its own)."""
    return [p.detach().clone() for p in AutoModelForCausalLM.from_pretrained(path).parameters()]


def _without_time(minibatches: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k not in ("seconds", "wall_seconds", "phase_seconds")} for m in minibatches]


def killed_in_minibatch_3(monkeypatch) -> list[int]:
    """The first run stops (KeyboardInterrupt) as it starts mini-batch 3 (index); the list records every mini-batch
    each run began, so a rerun shows what it redid."""
    real, ran = rsft.online.run_minibatch, []

    def dying(ctx, stream, progress, batch):
        ran.append(batch)
        if batch == 3 and len(ran) == 4:
            raise KeyboardInterrupt("killed")
        return real(ctx, stream, progress, batch)

    monkeypatch.setattr(rsft.online, "run_minibatch", dying)
    return ran


def test_online_writes_the_policy_kept_rows_metrics_and_eval_snapshots(make_cfg):
    cfg = make_cfg(*ONLINE, "online.minibatches=3", "online.mode=full", "online.replay=2", "online.eval_every=2",
                   "data.eval_limit=2", "eval.num_samples=2", "online.dpo_weight=0.5",
                   f"eval.judge=function:{VERIFIERS}:count_a")
    out = run_stage(cfg).path
    assert out == RunPaths(cfg.paths.run_dir).online
    # the final policy is a save_pretrained folder, changed by training
    trained, initial = _weights(out / "policy"), None
    from rsft.models import load_policy

    initial = [p.detach() for p in load_policy(cfg, None, torch.device("cpu"))[0].parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(trained, initial))
    metrics = json.loads((out / "metrics.json").read_text())
    batches = metrics["minibatches"]
    assert [m["batch"] for m in batches] == [0, 1, 2]
    for m in batches:
        assert m["completions"] == 2 * 3 and m["tokens"] > 0 and m["steps"] == 2 and m["loss"] > 0
        assert {"reward_mean", "kept_reward_mean", "gold_mean", "kept_gold_mean", "wall_seconds"} <= set(m)
    # x values of the results comparison: cumulative completions and tokens sampled, rising every mini-batch
    assert [m["completions_sampled"] for m in batches] == [6, 12, 18]
    tokens = [m["tokens_sampled"] for m in batches]
    assert tokens == [sum(m["tokens"] for m in batches[:i + 1]) for i in range(3)] and tokens == sorted(set(tokens))
    assert batches[1]["replayed"] == 2 and batches[0]["replayed"] == 0
    # the DPO term: the first step's policy is the reference, so its loss is log 2 (a margin of 0)
    assert all(m["dpo_pairs"] >= 1 and m["dpo_loss"] > 0 for m in batches)
    # eval snapshots before the first mini-batch, every 2 and after the last, each with gold and its x values
    assert [e["batch"] for e in metrics["evals"]] == [0, 2, 3]
    assert [e["tokens_sampled"] for e in metrics["evals"]] == [0, tokens[1], tokens[2]]
    assert all("gold_mean" in e["metrics"] for e in metrics["evals"])
    assert "vs_initial" in metrics["evals"][-1]["metrics"]
    last = load_from_disk(str(out / "evals" / "batch_0003"))
    assert len(last) == 2 * 2
    # eval.judge scores the snapshots beside the reward: the judge's column and its mean in the metrics
    assert last["judge"] == [float(c.count("a")) for c in last["completion"]]
    assert metrics["evals"][-1]["metrics"]["judge_mean"] == pytest.approx(sum(last["judge"]) / 4)
    kept = load_from_disk(str(out / "kept"))
    assert len(kept) == sum(m["kept"] for m in batches) and set(kept["round"]) <= {0, 1, 2}
    assert kept["reward"] == [float(len(c)) for c in kept["completion"]]
    meta = read_meta(out)
    assert meta["stats"]["completions_sampled"] == 18 and meta["stats"]["steps"] == 6
    assert not any(p.name.startswith(".online") for p in out.parent.iterdir())  # the checkpoints are gone


@pytest.mark.parametrize("rotate, rows", [(True, [0, 1, 2, 3, 4, 5]), (False, [0, 1, 2, 0, 1, 2])])
def test_the_stream_is_the_prompts_the_rounds_would_see(make_cfg, rotate, rows):
    """With data.rotate the whole train split in order (the rounds take its next data.limit rows each round);
    without it the first data.limit rows, again and again (every round takes the same ones)."""
    cfg = make_cfg(*ONLINE, "data.limit=3", f"data.rotate={str(rotate).lower()}")
    stream = rsft.data.prompt_stream(cfg.data)
    every = rsft.data.load_prompts(OmegaConf.merge(cfg.data, {"limit": None, "rotate": False}), "train")
    taken = [list(rsft.data.minibatch_prompts(stream, b, 2)["prompt_id"]) for b in range(3)]
    assert sum(taken, []) == [every["prompt_id"][i] for i in rows]


def test_a_killed_run_resumes_bit_identical_and_redoes_at_most_checkpoint_every_minibatches(make_cfg, monkeypatch):
    """LoRA (the default) with replay and the DPO term: the adapter, AdamW and the schedule come back from the
    checkpoint after mini-batch 2, the kill falls in mini-batch 4 (index 3), and the rerun samples only mini-batches
    2 and 3 (indices) again."""
    settings = [*ONLINE, "online.minibatches=4", "online.checkpoint_every=2", "online.replay=1",
                "online.lr_scheduler=linear", "online.warmup_steps=1", "online.learning_rate=1e-2",
                "online.dpo_weight=0.5"]
    whole = run_stage(make_cfg(*settings, "run_name=whole")).path

    ran = killed_in_minibatch_3(monkeypatch)
    killed = make_cfg(*settings, "run_name=killed")
    with pytest.raises(KeyboardInterrupt):
        run_stage(killed)
    torch.manual_seed(12345)  # the rerun must not depend on what the process's RNGs did in between
    resumed = run_stage(killed).path
    assert ran == [0, 1, 2, 3, 2, 3]
    a, b = (json.loads((p / "metrics.json").read_text()) for p in (whole, resumed))
    assert _without_time(a["minibatches"]) == _without_time(b["minibatches"])
    kept_a, kept_b = (load_from_disk(str(p / "kept")) for p in (whole, resumed))
    for column in ("prompt_id", "sample_idx", "completion_ids", "seed", "reward", "round"):
        assert kept_a[column] == kept_b[column], column
    worst = max(float((p - q).abs().max()) for p, q in zip(_weights(whole / "policy"), _weights(resumed / "policy")))
    assert worst == 0.0, f"the resumed policy differs from the uninterrupted one's by up to {worst}"


REFRESH = ["stage=online", "device=cpu", "reward=tiny", "reward.epochs=1", "prefs.num_prompts=4",
           "prefs.num_samples=3", "prefs.max_new_tokens=8", "data.limit=6", "data.rotate=true",
           "online.prompts_per_batch=2", "sample.num_samples=3", "online.steps_per_batch=2", "online.batch_size=2",
           "online.learning_rate=1e-3", "select.drop_truncated=false", "online.eval_every=0",
           "online.minibatches=4", "online.refresh_every=2", "online.checkpoint_every=1"]


def test_reward_refresh_every_r_minibatches_scores_with_the_retrained_model_and_resumes_bit_identical(
        make_cfg, monkeypatch):
    """online.refresh_every=2 over 4 mini-batches: refreshes before scoring mini-batches 1 and 3, each on the labels
    of the two mini-batches before it pooled with the initial ones; the kept rows of mini-batch 1 on are scored by
    the refreshed model, and the last one is written as online/reward. A run killed in mini-batch 3 (after the
    checkpoint of mini-batch 2, past the first refresh) resumes with the refreshed model and ends bit for bit as
    the uninterrupted run."""
    for stage in ("stage=prefs", "stage=reward"):
        run_stage(make_cfg(*REFRESH, stage, "run_name=whole"))
        run_stage(make_cfg(*REFRESH, stage, "run_name=killed"))
    whole = run_stage(make_cfg(*REFRESH, "run_name=whole")).path
    metrics = json.loads((whole / "metrics.json").read_text())
    refreshes = metrics["refreshes"]
    assert [(r["refresh"], r["batch"], r["mini-batches"]) for r in refreshes] == [(1, 1, [0, 1]), (2, 3, [2, 3])]
    initial_pairs = len(load_from_disk(str(RunPaths(whole.parent).prefs))["train"])
    assert refreshes[0]["train_pairs"] > initial_pairs and refreshes[1]["train_pairs"] > refreshes[0]["train_pairs"]
    assert [m["reward_model"] for m in metrics["minibatches"]] == [0, 1, 1, 2]
    # the kept rows of mini-batch 3 carry the last refreshed model's scores, which online/reward reproduces
    kept = load_from_disk(str(whole / "kept")).filter(lambda r: r["round"] == 3)
    again = rsft.online.reward_service.trained_reward(whole / "reward", torch.device("cpu"))
    rescored = rsft.online.reward_service.score_rows(again, kept["prompt"], kept["completion"],
                                             kept.remove_columns(["prompt", "completion"]).to_list(), progress=False)
    assert rescored == pytest.approx(kept["reward"], abs=1e-5)
    original = rsft.online.reward_service.trained_reward(RunPaths(whole.parent).reward, torch.device("cpu"))
    first = rsft.online.reward_service.score_rows(original, kept["prompt"], kept["completion"],
                                           kept.remove_columns(["prompt", "completion"]).to_list(), progress=False)
    assert first != pytest.approx(kept["reward"], abs=1e-5)  # not the run's reward/: the refresh changed the scores

    ran = killed_in_minibatch_3(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run_stage(make_cfg(*REFRESH, "run_name=killed"))
    resumed = run_stage(make_cfg(*REFRESH, "run_name=killed")).path
    assert ran == [0, 1, 2, 3, 3]
    again = json.loads((resumed / "metrics.json").read_text())
    assert _without_time(again["minibatches"]) == _without_time(metrics["minibatches"])
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in again["refreshes"]] == \
        [{k: v for k, v in r.items() if k != "seconds"} for r in refreshes]
    assert load_from_disk(str(resumed / "kept"))["reward"] == load_from_disk(str(whole / "kept"))["reward"]
    worst = max(float((p - q).abs().max()) for p, q in zip(_weights(whole / "policy"), _weights(resumed / "policy")))
    assert worst == 0.0


@pytest.mark.parametrize("override, named", [
    ("online.refresh_every=2 data=checkable", "online.refresh_every=2"),
    ("online.refresh_every=2 refresh.pairs=labels", "refresh.pairs=labels"),
    ("online.refresh_every=-1", "online.refresh_every=-1"),
    ("online.minibatches=0", "online.minibatches=0"),
    ("online.mode=half", "online.mode='half'"),
    ("online.lr_scheduler=sometimes", "online.lr_scheduler='sometimes'"),
    ("online.replay=-1", "online.replay=-1"),
    ("online.dpo_beta=0", "online.dpo_beta=0"),
    ("sample.num_samples=auto", "sample.num_samples=auto"),
    ("draft=distilled", "draft=distilled"),
    ("sample.strategy=greedy", "sample.strategy=greedy"),
])
def test_bad_settings_are_refused_naming_the_setting(make_cfg, override, named):
    with pytest.raises(ConfigError, match=named.replace("[", r"\[")):
        run_stage(make_cfg(*ONLINE, *override.split()))


def test_two_processes_train_data_parallel_as_one_process_and_a_killed_rank_resumes_bit_identical(make_cfg, tmp_path):
    """torchrun, 2 CPU processes (gloo, device=cpu: on a machine with one GPU two GPU processes are refused,
    test_distributed.py::test_more_processes_than_gpus_is_refused_before_the_process_group_starts). Each samples its share of a mini-batch and all get every row, so the
    completions are one process's; with the gradients summed over the processes the steps are one process's (to
    float rounding: the sums' order differs). Process 1 is killed (SIGKILL) as it starts mini-batch 3, after the
    checkpoint of mini-batch 2; the same command resumes there and ends bit for bit as an uninterrupted
    2-process run."""
    from tests.test_distributed import launch

    settings = [*ONLINE, "online.minibatches=3", "online.mode=full", "online.checkpoint_every=1", "threads=1",
                "online.dpo_weight=0.5"]
    died = launch(tmp_path, [[*settings, "run_name=killed"]], kill={"rank": 1, "online_batch": 2})
    assert died.returncode != 0
    done = launch(tmp_path, [[*settings, "run_name=killed"], [*settings, "run_name=whole"]])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming after mini-batch 1" in done.stderr
    killed, whole = (RunPaths(tmp_path / "runs" / name).online for name in ("killed", "whole"))
    one = run_stage(make_cfg(*settings, "run_name=one")).path
    assert read_meta(killed)["stats"]["world_size"] == 2
    kept = {p: load_from_disk(str(p / "kept")) for p in (one, killed, whole)}
    assert kept[one]["completion_ids"] == kept[killed]["completion_ids"] == kept[whole]["completion_ids"]
    assert kept[one]["reward"] == kept[killed]["reward"] == kept[whole]["reward"]
    a, b, c = (json.loads((p / "metrics.json").read_text())["minibatches"] for p in (one, killed, whole))
    assert _without_time(b) == _without_time(c)
    for key in ("loss", "dpo_loss"):
        assert [m[key] for m in a] == pytest.approx([m[key] for m in b], rel=1e-5), key
    assert all(torch.equal(p, q) for p, q in zip(_weights(killed / "policy"), _weights(whole / "policy")))
    worst = max(float((p - q).abs().max()) for p, q in zip(_weights(one / "policy"), _weights(killed / "policy")))
    assert worst < 1e-5


def test_online_vs_rounds_pairs_each_snapshot_with_the_rounds_last_evaluation(tmp_path, capsys):
    """scripts/online_vs_rounds.py on hand-written artifacts: the rounds' tokens add up, each online snapshot is
    paired with the last round's evaluation by (prompt_id, sample_idx), the plot is drawn."""
    import importlib.util

    from datasets import Dataset

    from rsft.store import atomic_artifact

    def evaluation(gold):
        return [{"prompt_id": f"p{p}", "sample_idx": s, "gold": gold + 0.01 * p} for p in range(4) for s in range(2)]

    loop, online = RunPaths(tmp_path / "loop"), RunPaths(tmp_path / "online")
    # every artifact states its build seconds, so no printed share depends on how fast this machine wrote them
    write_artifact(loop.initial_eval, {"stage": "eval", "build_seconds": 0.0}, evaluation(0.5))
    for r in range(2):
        write_artifact(loop.samples(r), {"stage": "sample", "build_seconds": 5.0,
                                         "sampling": {"tokens": 1000, "num_completions": 100}})
        write_artifact(loop.policy(r), {"stage": "sft", "build_seconds": 15.0})
        write_artifact(loop.eval(r), {"stage": "eval", "build_seconds": 0.0}, evaluation(0.6 + 0.1 * r))
    snapshots = [{"batch": b, "tokens_sampled": 500 * b, "completions_sampled": 50 * b, "wall_seconds": 10.0 * b}
                 for b in (0, 2)]
    files = {"metrics.json": json.dumps({"minibatches": [], "evals": snapshots})}
    with atomic_artifact(online.online, {"stage": "online", "build_seconds": 0.0}) as tmp:
        for (name, text) in files.items():
            (tmp / name).write_text(text)
        for b, gold in ((0, 0.5), (2, 0.75)):
            Dataset.from_list(evaluation(gold)).save_to_disk(str(tmp / "evals" / f"batch_{b:04d}"))
    spec = importlib.util.spec_from_file_location("online_vs_rounds", REPO / "scripts" / "online_vs_rounds.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main([str(loop.root), str(online.root), "--plot", str(tmp_path / "plot.png")])
    out = capsys.readouterr().out
    assert "| round 1 | 2000 | 200 | 40 |" in out
    lines = [line for line in out.splitlines() if line.startswith(f"| {online.online} | after 2 mini-batches")]
    assert "| 0.50 | 0.50 |" in lines[-1] and "+0.050 [+0.050, +0.050]" in lines[-1]  # tokens, then wall share
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_a_minibatch_larger_than_the_prompt_stream_is_refused(make_cfg):
    """online.prompts_per_batch above the stream's prompts would put a prompt in one mini-batch twice (its 2K
    completions competing under one id): refused, naming the setting and the count."""
    cfg = make_cfg(*ONLINE, "data.limit=3", "data.rotate=false")
    stream = rsft.data.prompt_stream(cfg.data)
    assert len(rsft.data.minibatch_prompts(stream, 1, 3)) == 3  # every prompt once: allowed
    with pytest.raises(ConfigError, match="online.prompts_per_batch=4: more than the 3 train prompts"):
        rsft.data.minibatch_prompts(stream, 0, 4)


def test_online_sft_loss_is_the_loss_trls_sft_trainer_takes_on_the_same_examples(tmp_path):
    """One SFT objective (issue 46): online's step (rsft.policy_training.sft_loss) takes on a batch of stage=sft's
    examples (cut_examples) the very loss TRL's SFTTrainer computes for stage=sft on them: the model's causal-LM
    loss over the completion tokens, divided by the batch's token count."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from rsft.models import build_byte_tokenizer, build_tiny_causal_lm
    from rsft.policy_training import completion_tokens, cut_examples, padded, sft_loss, token_nll

    tokenizer = build_byte_tokenizer()
    model = build_tiny_causal_lm({"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                                  "num_key_value_heads": 1, "intermediate_size": 32, "seed": 3}, len(tokenizer),
                                 tokenizer)
    rows = Dataset.from_dict({"prompt": ["Say hi.", "Name a colour, please."], "completion": ["Hi there!", "Blue"],
                              "finish_reason": ["stop", "length"]})  # the second is cut: no end of turn
    examples = cut_examples(rows, tokenizer, None)
    batch = [{"input_ids": e["input_ids"], "completion_mask": e["completion_mask"]} for e in examples.to_list()]
    total = completion_tokens(batch)
    trainer = SFTTrainer(model=model, train_dataset=examples, processing_class=tokenizer,
                         args=SFTConfig(output_dir=str(tmp_path), completion_only_loss=True, packing=False,
                                        use_cpu=True, report_to=[], per_device_train_batch_size=2, max_length=512))
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])  # as it trains
    assert torch.equal(inputs["labels"][:, 1:] != -100, padded(batch, tokenizer.pad_token_id, "cpu")[2][:, 1:])
    model.eval()  # no dropout in either: the same forward
    with torch.no_grad():
        theirs = trainer.compute_loss(model, inputs, num_items_in_batch=torch.tensor(total))
        ours = sft_loss(model, batch, tokenizer.pad_token_id, torch.device("cpu"), total)
        by_example = token_nll(model, batch, tokenizer.pad_token_id, torch.device("cpu")).sum() / total
    assert float(ours) == pytest.approx(float(theirs), rel=1e-5)
    assert float(ours) == pytest.approx(float(by_example), rel=1e-5)  # the DPO term's per-example sums agree


def test_one_minibatch_over_a_rounds_prompts_keeps_the_rounds_rows_and_trains_its_sft_loss_curve(make_cfg, monkeypatch):
    """One pipeline (issue 46): online with one mini-batch holding round 0's prompts, sampled with round 0's seed,
    no refresh and sft's optimiser settings keeps the very rows stage=select keeps, and its steps take the very
    losses TRL's SFTTrainer logs for stage=sft (the same examples in the same order, the same LoRA start, AdamW,
    schedule and clipping), within float tolerance."""
    from rsft.generation import round_seed

    common = ["device=cpu", "reward_source=function", f"reward_source.spec={VERIFIERS}:length", "data.limit=4",
              "sample.num_samples=3", "select.drop_truncated=false"]
    training = {"learning_rate": 5e-3, "lr_scheduler": "linear", "warmup_steps": 1, "weight_decay": 0.0,
                "max_grad_norm": 1.0, "max_length": 256, "batch_size": 2, "mode": "lora", "lora.r": 4,
                "lora.alpha": 8, "lora.dropout": 0.0}
    sft = [f"sft.{k}={v}" for k, v in training.items()]
    for stage in ("sample", "score", "select"):
        run_stage(make_cfg(*common, f"stage={stage}", "round=0"))
    rounds = make_cfg(*common, *sft, "stage=sft", "round=0", "sft.epochs=2", "sft.grad_accum=1", "sft.logging_steps=1",
                      "sft.checkpoint_steps=0")
    paths = RunPaths(rounds.paths.run_dir)
    selected = load_from_disk(str(paths.selected(0)))
    steps = 2 * -(-len(selected) // 2)  # two epochs of batches of 2, the last one of an epoch shorter
    run_stage(rounds)
    curve = [h["loss"] for h in read_meta(paths.policy(0))["loss_history"] if "loss" in h]
    assert len(curve) == steps

    monkeypatch.setattr(rsft.online, "minibatch_seed", round_seed)  # round 0's samples: the same completion seeds
    online = make_cfg(*common, *[f"online.{k}={v}" for k, v in training.items()], "stage=online", "online.minibatches=1",
                      "online.prompts_per_batch=4", f"online.steps_per_batch={steps}", "online.eval_every=0",
                      "online.refresh_every=0", "online.replay=0", "online.dpo_weight=0", "online.checkpoint_every=0")
    out = run_stage(online).path
    kept = load_from_disk(str(out / "kept"))
    columns = ("prompt_id", "sample_idx", "completion", "reward")
    assert sorted(zip(*[kept[c] for c in columns])) == sorted(zip(*[selected[c] for c in columns]))
    ours = json.loads((out / "metrics.json").read_text())["minibatches"][0]["step_losses"]
    assert ours == pytest.approx(curve, rel=1e-4, abs=1e-5)
    assert len(set(round(x, 3) for x in curve)) > 1  # the curve moves: the weights trained between the steps


def test_online_dpo_term_is_the_loss_trls_dpo_trainer_takes_on_the_same_pairs(tmp_path):
    """One DPO objective (issue 46): online's DPO term (rsft.policy_training.dpo_loss_sum over the pairs, divided by
    their count) takes on the token rows TRL's DPOTrainer collates for stage=dpo the very loss DPOTrainer computes:
    its default sigmoid loss against a frozen reference, log-probabilities summed over each completion."""
    import copy

    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from rsft.models import build_byte_tokenizer, build_tiny_causal_lm
    from rsft.policy_training import Pairs, dpo_loss_sum, token_nll

    tokenizer = build_byte_tokenizer()
    model = build_tiny_causal_lm({"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                                  "num_key_value_heads": 1, "intermediate_size": 32, "seed": 5}, len(tokenizer),
                                 tokenizer)
    reference = build_tiny_causal_lm({"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                                      "num_key_value_heads": 1, "intermediate_size": 32, "seed": 6}, len(tokenizer),
                                     tokenizer).eval()  # another model: the margin is not zero
    pairs = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Say hi."}],
                                          [{"role": "user", "content": "Name a colour."}]],
                               "chosen": [[{"role": "assistant", "content": "Hi there!"}],
                                          [{"role": "assistant", "content": "Blue"}]],
                               "rejected": [[{"role": "assistant", "content": "No."}],
                                            [{"role": "assistant", "content": "A long answer about colours"}]]})
    beta = 0.3
    trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(reference), train_dataset=pairs, processing_class=tokenizer,
                         args=DPOConfig(output_dir=str(tmp_path), beta=beta, use_cpu=True, report_to=[],
                                        per_device_train_batch_size=2, max_length=512))
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    rows = [{"input_ids": ids[mask.bool()].tolist(), "completion_mask": done[mask.bool()].tolist()}
            for ids, mask, done in zip(inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"])]
    chosen, rejected = rows[:2], rows[2:]  # the collated batch is [chosen; rejected]
    assert all(sum(r["completion_mask"]) > 0 for r in rows)
    model.eval()
    pad, cpu = tokenizer.pad_token_id, torch.device("cpu")
    with torch.no_grad():
        theirs = trainer.compute_loss(model, inputs)
        frozen = trainer.ref_model  # the copy as DPOTrainer set it up (its forward differs from `reference` in float)
        terms = Pairs(chosen, rejected, -token_nll(frozen, chosen, pad, cpu), -token_nll(frozen, rejected, pad, cpu),
                      beta, 1.0)
        ours = dpo_loss_sum(model, terms, pad, cpu) / len(chosen)
    assert float(theirs) != pytest.approx(float(torch.log(torch.tensor(2.0))), abs=1e-4)  # a margin, not log 2
    assert float(ours) == pytest.approx(float(theirs), rel=1e-5)


def test_the_steps_walk_epochs_of_seeded_permutations_with_a_shorter_last_step():
    """trainer_batches: 5 examples, 2 a step: each epoch is a permutation (seed + epoch) cut into 2, 2, 1; the
    next epoch follows; the same seed gives the same walk and another seed another."""
    from rsft.policy_training import trainer_batches

    walk = trainer_batches(5, 2, 5, seed=7)
    assert [len(step) for step in walk] == [2, 2, 1, 2, 2]
    first = torch.randperm(5, generator=torch.Generator().manual_seed(7)).tolist()
    second = torch.randperm(5, generator=torch.Generator().manual_seed(8)).tolist()
    assert walk[:3] == [first[:2], first[2:4], first[4:]] and walk[3:] == [second[:2], second[2:4]]
    assert trainer_batches(5, 2, 5, seed=7) == walk and trainer_batches(5, 2, 5, seed=9) != walk
    bigger = trainer_batches(3, 8, 2, seed=0)  # a step larger than the examples takes the whole epoch
    assert [sorted(step) for step in bigger] == [[0, 1, 2], [0, 1, 2]]


def online_step_fixture():
    """(tokenizer, two rendered examples, their padded ids, attention and loss mask, a tiny policy's builder) for
    the tests of online's training step."""
    from datasets import Dataset

    from rsft.models import build_byte_tokenizer, build_tiny_causal_lm
    from rsft.policy_training import cut_examples, padded

    tokenizer = build_byte_tokenizer()
    rows = Dataset.from_dict({"prompt": ["Say hi.", "Name a colour."], "completion": ["Hi there!", "Blue, or red"],
                              "finish_reason": ["stop", "stop"]})
    batch = [{"input_ids": e["input_ids"], "completion_mask": e["completion_mask"]}
             for e in cut_examples(rows, tokenizer, None).to_list()]

    def tiny():
        return build_tiny_causal_lm({"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                                     "num_key_value_heads": 1, "intermediate_size": 32, "seed": 4}, len(tokenizer),
                                    tokenizer)

    return tokenizer, batch, padded(batch, tokenizer.pad_token_id, torch.device("cpu")), tiny


@pytest.mark.parametrize("mode, rate", [("lora", 3e-2), ("full", 3e-3)])
def test_online_kl_starts_at_plain_sfts_loss_and_keeps_the_policy_nearer_where_it_started(mode, rate):
    """online.kl (issue 48): the first step's SFT loss is plain SFT's and its KL 0 (the policy is still the initial
    one), and after the same steps on the same examples the policy with the term is nearer the initial policy, by
    KL(initial || policy) on the completion tokens, than the one without it; LoRA's reference is the adapter off,
    full training's a frozen copy."""
    from rsft.policy_training import OnlinePolicy, forward_kl_sum, train_step

    tokenizer, batch, (ids, attention, loss_mask), tiny = online_step_fixture()
    pad, cpu = tokenizer.pad_token_id, torch.device("cpu")

    def trained(kl):
        model, initial = tiny(), tiny().eval()
        online = OmegaConf.create({"mode": mode, "lora": {"r": 4, "alpha": 8, "dropout": 0.0,
                                                          "target_modules": "all-linear"},
                                   "learning_rate": rate, "weight_decay": 0.0, "lr_scheduler": "constant",
                                   "warmup_steps": 0, "dpo_weight": 0.0, "kl": kl})
        torch.manual_seed(0)  # LoRA's A matrices: the same start for both
        policy = OnlinePolicy.build(model, online, cpu, total_steps=8)
        steps = [train_step(policy, batch, pad, 1.0, None, kl) for _ in range(8)]
        with torch.no_grad():
            moved = forward_kl_sum(policy.model(input_ids=ids, attention_mask=attention).logits[:, :-1],
                                   initial(input_ids=ids, attention_mask=attention).logits[:, :-1],
                                   loss_mask[:, 1:].float()) / loss_mask[:, 1:].sum()
        return steps, float(moved)

    plain, plain_moved = trained(0.0)
    anchored, anchored_moved = trained(5.0)
    assert anchored[0][0] == pytest.approx(plain[0][0], rel=1e-5)  # the first step: plain SFT's loss
    assert plain[0][2] is None and anchored[0][2] == pytest.approx(0.0, abs=1e-6)
    assert anchored[-1][2] > 0
    assert 0 < anchored_moved < plain_moved


def test_online_gem_steps_take_gems_loss_and_leave_the_policy_wider_than_cross_entropy():
    """online.loss=gem (issue 48): a step's loss is GEM's on the step's completion tokens (gem_token_losses, summed
    and divided by the tokens as the cross-entropy is), with or without online.kl; over the same steps the policy
    keeps a wider distribution over the answers' positions than cross-entropy's steps leave."""
    from rsft.policy_training import OnlinePolicy, completion_tokens, gem_token_losses, sft_loss_and_kl, train_step

    tokenizer, batch, (ids, attention, loss_mask), tiny = online_step_fixture()
    pad, cpu = tokenizer.pad_token_id, torch.device("cpu")
    targets = ids[:, 1:].masked_fill(~loss_mask[:, 1:], -100)

    def policy_of(kl=0.0):
        model = tiny()
        online = OmegaConf.create({"mode": "full", "learning_rate": 3e-2, "weight_decay": 0.0,
                                   "lr_scheduler": "constant", "warmup_steps": 0, "dpo_weight": 0.0, "kl": kl})
        return OnlinePolicy.build(model, online, cpu, total_steps=8)

    policy, total = policy_of(kl=1.0), completion_tokens(batch)  # kl > 0 keeps a frozen reference
    with torch.no_grad():
        expected = gem_token_losses(policy.model(input_ids=ids, attention_mask=attention).logits[:, :-1], targets,
                                    0.7).sum() / total
        gem, none = sft_loss_and_kl(policy, batch, pad, total, kl=False, gem_beta=0.7)
        _, divergence = sft_loss_and_kl(policy, batch, pad, total, gem_beta=0.7)
    assert float(gem) == pytest.approx(float(expected), rel=1e-5) and none is None
    assert float(divergence) == pytest.approx(0.0, abs=1e-5)  # the policy is still the initial one
    assert train_step(policy, batch, pad, 1.0, None, 0.0, 0.7)[0] == pytest.approx(float(expected), rel=1e-5)

    def entropy_after(gem_beta):
        trained = policy_of()
        for _ in range(8):
            train_step(trained, batch, pad, 1.0, None, 0.0, gem_beta)
        with torch.no_grad():
            log_p = torch.log_softmax(trained.model(input_ids=ids, attention_mask=attention).logits[:, :-1], -1)
        return float(((-(log_p.exp() * log_p).sum(-1)) * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum())

    assert entropy_after(0.7) > entropy_after(None)


def test_a_weighted_step_counts_each_examples_tokens_its_weight_times_and_pushes_a_negative_one_down():
    """select.weight and select.strategy=advantage online (issue 48): a step's loss is the sum over completion
    tokens of each example's cross-entropy times its weight, divided by the step's tokens (stage=sft's weighting);
    steps on a right answer weighted +1 and a wrong one weighted -1 raise the wrong one's loss, where plain steps
    on both lower it."""
    from rsft.policy_training import OnlinePolicy, completion_tokens, online_examples, token_nll, train_step

    tokenizer, batch, _, tiny = online_step_fixture()
    pad, cpu = tokenizer.pad_token_id, torch.device("cpu")

    def policy():
        online = OmegaConf.create({"mode": "full", "learning_rate": 1e-2, "weight_decay": 0.0,
                                   "lr_scheduler": "constant", "warmup_steps": 0, "dpo_weight": 0.0, "kl": 0.0})
        return OnlinePolicy.build(tiny(), online, cpu, total_steps=6)

    weighted = [{**batch[0], "weight": 2.0}, {**batch[1], "weight": -0.5}]
    fresh = policy()
    with torch.no_grad():
        nll = token_nll(fresh.model, batch, pad, cpu)
    expected = float(2.0 * nll[0] - 0.5 * nll[1]) / completion_tokens(batch)
    assert train_step(fresh, weighted, pad, 1.0)[0] == pytest.approx(expected, rel=1e-5)

    def wrong_answer_loss_after(examples):
        trained = policy()
        for _ in range(6):
            train_step(trained, examples, pad, 1.0)
        with torch.no_grad():
            return float(token_nll(trained.model, batch[1:], pad, cpu)[0])

    rows = [{"prompt": "Say hi.", "completion": "Hi", "finish_reason": "stop", "weight": -0.5},
            {"prompt": "Say hi.", "completion": "Hello", "finish_reason": "stop"}]
    carried = online_examples(rows, tokenizer, None, 512)  # a kept row's weight reaches its example
    assert carried[0]["weight"] == -0.5 and "weight" not in carried[1]
    start = float(nll[1])
    assert wrong_answer_loss_after([{**batch[0], "weight": 1.0}, {**batch[1], "weight": -1.0}]) > start
    assert wrong_answer_loss_after(batch) < start


def test_online_with_advantage_keeps_each_prompts_answers_weighted_to_sum_to_zero_and_steps_on_them(make_cfg):
    """select.strategy=advantage online: each mini-batch keeps every answer whose reward differs from its prompt's
    mean, weighted by the difference (the wrong ones below 0, each prompt's weights summing to 0), and takes its
    steps on them; select.weight=rarity online weighs its rows too."""
    cfg = make_cfg(*ONLINE, "online.minibatches=2", "online.batch_size=6", "select.strategy=advantage",
                   "run_name=advantage")
    out = run_stage(cfg).path
    kept = load_from_disk(str(out / "kept")).to_list()
    assert kept and any(r["weight"] < 0 for r in kept) and any(r["weight"] > 0 for r in kept)
    by_prompt: dict = {}
    for r in kept:
        by_prompt.setdefault((r["round"], r["prompt_id"]), []).append(r)
    for rows in by_prompt.values():
        assert sum(r["weight"] for r in rows) == pytest.approx(0.0, abs=1e-9)
        mean = sum(r["reward"] for r in rows) / len(rows)  # length rewards: every sample differs, all are kept
        assert all((r["weight"] > 0) == (r["reward"] > mean) for r in rows)
    minibatches = json.loads((out / "metrics.json").read_text())["minibatches"]
    assert [m["steps"] for m in minibatches] == [2, 2]
    rarity = run_stage(make_cfg(*ONLINE, "online.minibatches=1", "select.k=2", "select.weight=rarity",
                                "run_name=rarity")).path
    assert all(r["weight"] > 0 for r in load_from_disk(str(rarity / "kept")).to_list())


def test_advantage_share_scales_a_minibatchs_weights_by_the_share_of_its_prompts_not_tied(make_cfg):
    """online.advantage_share (issue 48, GRPO's loss averaged over every sampled completion): mini-batch 0 keeps the
    same rows as without it, each weight times (prompts that kept any) / (prompts in the mini-batch); the setting is
    refused without select.strategy=advantage."""
    from rsft.preflight import check_config

    base = [*ONLINE, "online.minibatches=1", "online.batch_size=6", "select.strategy=advantage"]
    plain = load_from_disk(str(run_stage(make_cfg(*base, "run_name=plain")).path / "kept")).to_list()
    shared = load_from_disk(str(run_stage(make_cfg(*base, "online.advantage_share=true",
                                                   "run_name=shared")).path / "kept")).to_list()
    share = len({r["prompt_id"] for r in plain}) / 2
    assert [(r["prompt_id"], r["completion"]) for r in shared] == [(r["prompt_id"], r["completion"]) for r in plain]
    assert [r["weight"] for r in shared] == pytest.approx([r["weight"] * share for r in plain])
    assert rsft.online.shared_weights([{"prompt_id": "a", "weight": 0.5}], 4) == [{"prompt_id": "a", "weight": 0.125}]
    with pytest.raises(ConfigError, match="online.advantage_share=true scales select.strategy=advantage's weights"):
        check_config(make_cfg(*ONLINE, "online.advantage_share=true"))


def test_a_tempered_step_takes_its_loss_on_the_logits_divided_by_the_sampling_temperature(make_cfg):
    """online.tempered_loss (issue 48): a step's loss is each completion token's cross-entropy under the policy's
    logits divided by sample.temperature, the distribution the answers were drawn from (TRL's GRPOTrainer's
    log-probabilities), weights as before; at temperature 1 it is the plain step's. Refused with greedy decoding;
    out of the fingerprints while off."""
    from rsft.errors import ConfigError
    from rsft.policy_training import OnlinePolicy, completion_tokens, loss_temperature, padded, train_step
    from rsft.preflight import check_config
    from rsft.stages import WHILE_OFF

    tokenizer, batch, _, tiny = online_step_fixture()
    pad, cpu = tokenizer.pad_token_id, torch.device("cpu")
    online = OmegaConf.create({"mode": "full", "learning_rate": 1e-2, "weight_decay": 0.0, "lr_scheduler": "constant",
                               "warmup_steps": 0, "dpo_weight": 0.0, "kl": 0.0})
    weighted = [{**batch[0], "weight": 1.5}, {**batch[1], "weight": -0.5}]
    for temperature in (0.7, 1.0):
        policy = OnlinePolicy.build(tiny(), online, cpu, total_steps=1)
        ids, attention, mask = padded(weighted, pad, cpu)
        with torch.no_grad():
            logits = policy.model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / temperature
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none") * mask[:, 1:]
        expected = float((nll.sum(dim=1) * torch.tensor([1.5, -0.5])).sum()) / completion_tokens(weighted)
        assert train_step(policy, weighted, pad, 1.0, temperature=temperature)[0] == pytest.approx(expected, rel=1e-5)
    on = ("stage=online", "online.tempered_loss=true")
    assert loss_temperature(make_cfg(*on, "sample.temperature=0.7"), "online") == 0.7
    assert loss_temperature(make_cfg("stage=online", "sample.temperature=0.7"), "online") == 1.0
    # the rounds' SFT reads its own switches: sft.tempered_loss, else sft.loss_temperature; online reads neither
    own = make_cfg("stage=online", "sample.temperature=0.7", "sft.loss_temperature=0.8")
    assert (loss_temperature(own, "sft"), loss_temperature(own, "online")) == (0.8, 1.0)
    assert loss_temperature(make_cfg(*on, "sample.temperature=0.7"), "sft") == 1.0
    assert loss_temperature(make_cfg("stage=sft", "sft.tempered_loss=true", "sample.temperature=0.6"), "sft") == 0.6
    with pytest.raises(ConfigError, match=r"online.tempered_loss=true .*sample.strategy=greedy"):
        check_config(make_cfg(*on, "sample.strategy=greedy", "sample.num_samples=1", "select.pairs=false"))
    assert WHILE_OFF["online.tempered_loss"](make_cfg("stage=online"))
