"""stage=sft on the tiny policy: the policy moves toward the selected completions, is saved with its
tokenizer, and the next round samples from it; LoRA is merged; an empty selection is an error."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset, load_from_disk

from rsft.models import load_policy, load_saved_causal_lm
from rsft.paths import RunPaths
from rsft.store import atomic_artifact, read_meta
from rsft.errors import ArtifactError
from rsft.run import run_stage
from rsft.sft import conversational_examples, cut_examples

COMPLETION = "Bees make honey."


def write_selected(cfg, n=4, round_idx=0, finish_reason=None):
    rows = [{"prompt_id": f"p{i}", "prompt": f"Tell me about bees, {i}.", "completion": COMPLETION, "reward": 1.0,
             **({"finish_reason": finish_reason} if finish_reason else {})} for i in range(n)]
    with atomic_artifact(RunPaths(cfg.paths.run_dir).selected(round_idx), {"stage": "select"}) as tmp:
        Dataset.from_list(rows).save_to_disk(str(tmp))


def completion_nll(model, tokenizer, prompt: str) -> float:
    """Mean NLL of COMPLETION (+ end of turn) after the chat-formatted prompt."""
    messages = [{"role": "user", "content": prompt}]
    prefix = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(prefix + COMPLETION + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    labels = torch.tensor([[-100] * len(prefix_ids) + full_ids[len(prefix_ids):]])
    with torch.no_grad():
        return float(model(torch.tensor([full_ids]), labels=labels).loss)


def test_conversational_prompt_completion_format():
    ds = conversational_examples(Dataset.from_list([{"prompt": "hi", "completion": "hello"}]), "sys")
    assert ds[0]["prompt"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert ds[0]["completion"] == [{"role": "assistant", "content": "hello"}]


def test_full_sft_changes_every_parameter_and_next_round_samples_from_it(make_cfg):
    cfg = make_cfg("stage=sft", "sft.learning_rate=3e-3", "sft.epochs=3", "device=cpu")
    write_selected(cfg)
    before, tokenizer, _ = load_policy(cfg, None, torch.device("cpu"))
    out = run_stage(cfg).path
    after, saved_tokenizer = load_saved_causal_lm(out, torch.device("cpu"))
    assert saved_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert saved_tokenizer.chat_template == tokenizer.chat_template
    old = dict(before.named_parameters())
    for name, param in after.named_parameters():
        assert not torch.equal(param, old[name]), f"{name} did not change"
    prompt = "Tell me about bees, 0."
    assert completion_nll(after, tokenizer, prompt) < completion_nll(before, tokenizer, prompt) - 0.5
    meta = read_meta(out)
    assert meta["stats"]["steps"] == 3 and meta["stats"]["loss_last"] < meta["stats"]["loss_first"]
    assert len(meta["loss_history"]) >= 3

    samples = load_from_disk(str(run_stage(make_cfg("stage=sample", "round=1")).path))
    assert set(samples["policy"]) == {str(out)}
    assert set(samples["round"]) == {1}


def test_lora_is_merged_into_a_plain_folder(make_cfg):
    cfg = make_cfg("stage=sft", "sft.mode=lora", "sft.learning_rate=1e-2", "device=cpu")
    write_selected(cfg)
    before, _, _ = load_policy(cfg, None, torch.device("cpu"))
    out = run_stage(cfg).path
    assert not (out / "adapter_config.json").exists()
    after, _ = load_saved_causal_lm(out, torch.device("cpu"))
    assert type(after) is type(before)
    old = dict(before.named_parameters())
    changed = {n for n, p in after.named_parameters() if not torch.equal(p, old[n])}
    assert "model.layers.0.self_attn.q_proj.weight" in changed and "model.embed_tokens.weight" not in changed


def test_empty_selection_is_an_error_before_training(make_cfg):
    cfg = make_cfg("stage=sft")
    with atomic_artifact(RunPaths(cfg.paths.run_dir).selected(0), {"stage": "select"}) as tmp:
        Dataset.from_dict({"prompt": [], "completion": []}).save_to_disk(str(tmp), num_shards=1)
    with pytest.raises(ValueError, match="no selected completions"):
        run_stage(cfg)
    with pytest.raises(FileNotFoundError, match="stage=select round=1"):
        run_stage(make_cfg("stage=sft", "round=1"))


@pytest.mark.parametrize("init", ["initial", "previous"])
def test_sft_init_picks_the_starting_policy(make_cfg, init):
    cfg0 = make_cfg("stage=sft", "sft.learning_rate=3e-3", "device=cpu")
    write_selected(cfg0)
    first = run_stage(cfg0).path
    cfg1 = make_cfg("stage=sft", "round=1", f"sft.init={init}", "sft.learning_rate=3e-3", "device=cpu")
    write_selected(cfg1, round_idx=1)
    meta = read_meta(run_stage(cfg1).path)
    expected = str(first) if init == "previous" else str(cfg1.policy.name_or_path)
    assert meta["trained_from"] == expected
    with pytest.raises(ValueError, match="sft.init='latest'"):
        run_stage(make_cfg("stage=sft", "round=1", "sft.init=latest", "overwrite=true"))


def test_sft_killed_mid_way_resumes_from_its_last_checkpoint(make_cfg, monkeypatch):
    """8 steps, a checkpoint every 3: killed in step 5, the rerun trains steps 4-8 only (work counted, not timed),
    and ends where an uninterrupted run ends. The checkpoints go once the policy is saved."""
    from transformers import Trainer

    real_step, steps = Trainer.training_step, []

    def counting(self, *args, **kwargs):
        steps.append(self.state.global_step + 1)
        if kill_at and len(steps) == kill_at:
            raise KeyboardInterrupt("killed")
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "training_step", counting)
    settings = ["stage=sft", "sft.learning_rate=3e-3", "sft.epochs=2", "sft.batch_size=2", "sft.checkpoint_steps=3",
                "device=cpu"]
    kill_at = 0
    straight_cfg = make_cfg(*settings, "run_name=straight")
    write_selected(straight_cfg, n=8)
    straight = run_stage(straight_cfg).path
    assert steps == list(range(1, 9))
    steps.clear()
    kill_at = 5
    cfg = make_cfg(*settings, "run_name=killed")
    write_selected(cfg, n=8)
    with pytest.raises(KeyboardInterrupt):
        run_stage(cfg)
    out = RunPaths.from_config(cfg).policy(0)
    assert not out.exists() and list(out.parent.glob(".policy.checkpoints/*/checkpoint-3"))
    steps.clear()
    kill_at = 0
    run_stage(cfg)
    assert steps == [4, 5, 6, 7, 8]  # at most one checkpoint interval (3 steps) of work was done twice
    assert not list(out.parent.glob(".policy.checkpoints"))
    a, _ = load_saved_causal_lm(straight, torch.device("cpu"))
    b, _ = load_saved_causal_lm(out, torch.device("cpu"))
    worst = max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))
    assert worst < 1e-5, f"resumed weights differ from an uninterrupted run's by up to {worst}"
    assert_same_losses(read_meta(out), read_meta(straight))


def assert_same_losses(resumed: dict, straight: dict) -> None:
    """A resumed run's meta.json records every step's loss (those before the kill from the checkpoint) and
    the same training loss as an uninterrupted run."""
    logged = [h["step"] for h in resumed["loss_history"] if "loss" in h]
    assert logged == [h["step"] for h in straight["loss_history"] if "loss" in h] == list(range(1, 9))
    for key in ("train_loss", "loss_first", "loss_last"):
        assert resumed["stats"][key] == pytest.approx(straight["stats"][key], abs=1e-4), key


def test_sft_whose_save_failed_resumes_at_its_last_step_with_its_losses(make_cfg, monkeypatch):
    """The policy's save fails (a full disk) after the last step: the rerun trains no step (the trainer's
    checkpoint of the last step is kept), and its meta.json still has the run's losses, not 0."""
    from transformers import Trainer

    import rsft.sft as sft

    settings = ["stage=sft", "sft.learning_rate=3e-3", "sft.epochs=2", "sft.batch_size=2", "sft.checkpoint_steps=3",
                "device=cpu"]
    straight_cfg = make_cfg(*settings, "run_name=straight")
    write_selected(straight_cfg, n=8)
    straight = run_stage(straight_cfg).path
    cfg = make_cfg(*settings, "run_name=full-disk")
    write_selected(cfg, n=8)
    real_writer = sft.policy_writer

    def full_disk(*args, **kwargs):
        def write(folder):
            raise OSError(28, "No space left on device")
        return write

    monkeypatch.setattr(sft, "policy_writer", full_disk)
    with pytest.raises(ArtifactError, match="no space left on device"):
        run_stage(cfg)
    monkeypatch.setattr(sft, "policy_writer", real_writer)
    real_step, steps = Trainer.training_step, []
    monkeypatch.setattr(Trainer, "training_step", lambda self, *a, **k: steps.append(1) or real_step(self, *a, **k))
    out = run_stage(cfg).path
    assert steps == []
    assert_same_losses(read_meta(out), read_meta(straight))


def end_of_turn_nll(model, tokenizer, prompt: str) -> float:
    """-log P(the end-of-turn token right after COMPLETION)."""
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": COMPLETION}]
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    answer_end = full.rfind(COMPLETION) + len(COMPLETION)
    ids = tokenizer(full[:answer_end], add_special_tokens=False)["input_ids"]
    end = tokenizer(full[answer_end:], add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    return float(-torch.log_softmax(logits, -1)[end])


def test_cut_examples_render_complete_rows_as_trl_and_cut_rows_without_the_end_of_turn(make_cfg):
    _, tokenizer, _ = load_policy(make_cfg("stage=sft"), None, torch.device("cpu"))
    rows = Dataset.from_list([{"prompt": "hi", "completion": "hello there", "finish_reason": "eos"},
                              {"prompt": "hi", "completion": "hello there", "finish_reason": "length"}])
    whole, cut = cut_examples(rows, tokenizer, "sys")
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    prompt_ids = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False)["input_ids"]
    full = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": "hello there"}], tokenize=False)
    assert whole["input_ids"] == tokenizer(full, add_special_tokens=False)["input_ids"]
    assert whole["completion_mask"] == [0] * len(prompt_ids) + [1] * (len(whole["input_ids"]) - len(prompt_ids))
    assert whole["input_ids"][:len(cut["input_ids"])] == cut["input_ids"] and len(cut["input_ids"]) < len(whole["input_ids"])
    assert tokenizer.decode(cut["input_ids"]).endswith("hello there")
    assert sum(cut["completion_mask"]) == len(cut["input_ids"]) - len(prompt_ids)


def test_sft_on_cut_answers_does_not_teach_the_stop_a_finished_one_teaches(make_cfg):
    nll = {}
    for reason in ("eos", "length"):
        cfg = make_cfg("stage=sft", "sft.learning_rate=1e-2", "sft.epochs=4", "device=cpu", f"run_name=sft-{reason}")
        write_selected(cfg, finish_reason=reason)
        out = run_stage(cfg).path
        after, tokenizer = load_saved_causal_lm(out, torch.device("cpu"))
        nll[reason] = end_of_turn_nll(after, tokenizer, "Tell me about bees, 0.")
        assert read_meta(out)["stats"]["truncated_examples"] == (4 if reason == "length" else 0)
    before, tokenizer, _ = load_policy(make_cfg("stage=sft"), None, torch.device("cpu"))
    initial = end_of_turn_nll(before, tokenizer, "Tell me about bees, 0.")
    assert nll["eos"] < initial - 0.5  # learnt to stop there
    assert nll["length"] > nll["eos"] + 1.0  # trained on the same text, cut: no stop learnt


def start_divergence(before, after, tokenizer, prompt: str) -> float:
    """Mean KL(before || after) of the next-token distributions over the completion's positions."""
    from rsft.policy_training import forward_kl_sum

    prefix = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
    start = len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    ids = torch.tensor([tokenizer(prefix + COMPLETION + tokenizer.eos_token, add_special_tokens=False)["input_ids"]])
    mask = torch.zeros(ids.shape[1])
    mask[start - 1:-1] = 1.0
    with torch.no_grad():
        return float(forward_kl_sum(after(ids).logits[0], before(ids).logits[0], mask)) / float(mask.sum())


@pytest.mark.parametrize("mode,rate", [("lora", "1e-2"), ("full", "3e-3")])
def test_sft_kl_starts_at_plain_sfts_loss_and_keeps_the_policy_nearer_where_it_started(make_cfg, mode, rate):
    """sft.kl (issue 48): its first step is plain SFT's (the policy is still the reference, so the KL term is 0),
    and at the same steps it ends nearer the policy it started from than plain SFT."""
    common = ("stage=sft", f"sft.mode={mode}", f"sft.learning_rate={rate}", "sft.epochs=3", "device=cpu")
    plain_cfg, kl_cfg = make_cfg(*common, "run_name=plain"), make_cfg(*common, "run_name=kl", "sft.kl=2.0")
    write_selected(plain_cfg)
    write_selected(kl_cfg)
    plain, anchored = run_stage(plain_cfg).path, run_stage(kl_cfg).path
    plain_meta, kl_meta = read_meta(plain), read_meta(anchored)
    assert kl_meta["stats"]["loss_first"] == pytest.approx(plain_meta["stats"]["loss_first"], rel=1e-4)
    assert kl_meta["stats"]["kl_first"] == pytest.approx(0.0, abs=1e-6) and kl_meta["stats"]["kl_last"] > 0
    assert plain_meta["stats"].get("kl_first") is None and kl_meta["settings"]["kl"] == 2.0
    before, tokenizer, _ = load_policy(plain_cfg, None, torch.device("cpu"))
    prompt = "Tell me about bees, 0."
    moved = {name: start_divergence(before, load_saved_causal_lm(path, torch.device("cpu"))[0], tokenizer, prompt)
             for name, path in (("plain", plain), ("kl", anchored))}
    assert 0 < moved["kl"] < moved["plain"]


def write_weighted(cfg, rows):
    with atomic_artifact(RunPaths(cfg.paths.run_dir).selected(0), {"stage": "select"}) as tmp:
        Dataset.from_list(rows).save_to_disk(str(tmp))


def test_weighted_sft_with_every_weight_one_is_plain_sft_and_a_weight_steers_what_it_learns(make_cfg):
    """select.weight (issue 48): a selected set's `weight` column reaches the loss through TRL's column filter and
    collator. Every weight 1 gives plain SFT's loss; weight 2 on one text and 0 on the other teaches the first more
    and the second less than plain SFT at the same steps, and a negative weight on the second
    (select.strategy=advantage's wrong answers) pushes it down further than a weight of 0."""
    common = ("stage=sft", "sft.learning_rate=3e-3", "sft.epochs=3", "device=cpu")
    other = "Wasps sting people."
    rows = lambda w_bees, w_wasps: [  # noqa: E731
        {"prompt_id": f"p{i}", "prompt": f"Tell me about bees, {i}.", "completion": text, "reward": 1.0, "weight": w}
        for i in range(4) for text, w in ((COMPLETION, w_bees), (other, w_wasps))]
    cfgs = {name: make_cfg(*common, f"run_name={name}") for name in ("plain", "ones", "steered", "pushed")}
    write_weighted(cfgs["plain"], [{k: v for k, v in r.items() if k != "weight"} for r in rows(1.0, 1.0)])
    write_weighted(cfgs["ones"], rows(1.0, 1.0))
    write_weighted(cfgs["steered"], rows(2.0, 0.0))
    write_weighted(cfgs["pushed"], rows(2.0, -1.0))
    out = {name: run_stage(cfg).path for name, cfg in cfgs.items()}
    meta = {name: read_meta(path) for name, path in out.items()}
    assert meta["ones"]["stats"]["loss_first"] == pytest.approx(meta["plain"]["stats"]["loss_first"], rel=1e-4)
    assert meta["ones"]["stats"]["loss_last"] == pytest.approx(meta["plain"]["stats"]["loss_last"], rel=1e-3)
    _, tokenizer, _ = load_policy(cfgs["plain"], None, torch.device("cpu"))
    prompt = "Tell me about bees, 0."

    def nll(name, text):
        model = load_saved_causal_lm(out[name], torch.device("cpu"))[0]
        messages = [{"role": "user", "content": prompt}]
        prefix = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        start = len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
        ids = tokenizer(prefix + text + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            return float(model(torch.tensor([ids]), labels=torch.tensor([[-100] * start + ids[start:]])).loss)

    assert nll("steered", COMPLETION) < nll("plain", COMPLETION)
    assert nll("steered", other) > nll("plain", other)
    assert nll("pushed", other) > nll("steered", other)


@pytest.mark.parametrize("weight,expected", [(-1.0, "no row's `weight` is positive"), (float("nan"), "finite number"),
                                             (0.0, "no row's `weight` is positive")])
def test_a_bad_loss_weight_is_refused_naming_the_row_and_the_file(make_cfg, weight, expected):
    cfg = make_cfg("stage=sft", "device=cpu")
    write_weighted(cfg, [{"prompt_id": "p0", "prompt": "hi", "completion": COMPLETION, "reward": 1.0,
                          "weight": weight}])
    with pytest.raises(Exception) as error:
        run_stage(cfg)
    assert expected in str(error.value) and "selected" in str(error.value)


def test_gem_losses_gradient_is_the_sharpened_policy_minus_the_target_and_beta_one_is_cross_entropys():
    """sft.loss=gem (issue 48): the per-position loss's gradient in the logits is softmax(logits / beta) minus the
    target's one-hot, nothing outside the completion (-100); at beta = 1 it is cross-entropy's gradient."""
    from rsft.policy_training import gem_token_losses

    generator = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 5, 11, generator=generator)).requires_grad_(True)
    targets = torch.randint(0, 11, (2, 5), generator=generator)
    targets[0, :2] = -100
    mask = (targets != -100).float()[..., None]
    onehot = torch.nn.functional.one_hot(targets.clamp(min=0), 11).float()
    for beta in (0.7, 0.3):
        (grad,) = torch.autograd.grad(gem_token_losses(logits, targets, beta).sum(), logits)
        assert torch.allclose(grad, (torch.softmax(logits.detach() / beta, -1) - onehot) * mask, atol=1e-6)
    losses = gem_token_losses(logits, targets, 1.0)
    assert bool((losses[0, :2] == 0).all())
    (grad,) = torch.autograd.grad(losses.sum(), logits)
    cross_entropy = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100,
                                                      reduction="sum")
    (expected,) = torch.autograd.grad(cross_entropy, logits)
    assert torch.allclose(grad, expected, atol=1e-6)


def completion_entropy(model, tokenizer, prompt: str) -> float:
    """Mean entropy (nats) of the next-token distributions over COMPLETION's positions (and its end of turn)."""
    prefix = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
    start = len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    ids = torch.tensor([tokenizer(prefix + COMPLETION + tokenizer.eos_token, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        log_p = torch.log_softmax(model(ids).logits[0, start - 1:-1].float(), -1)
    return float(-(log_p.exp() * log_p).sum(-1).mean())


def test_sft_with_gem_learns_the_kept_answer_without_sharpening_onto_it_as_cross_entropy_does(make_cfg):
    """sft.loss=gem: at the same steps both losses teach the kept answer (its NLL falls by over a nat from the
    start's), and GEM leaves the policy's distribution over those positions wider than cross-entropy does; its
    settings are recorded."""
    common = ("stage=sft", "sft.mode=full", "sft.learning_rate=3e-2", "sft.epochs=8", "device=cpu")
    cfgs = {"ce": make_cfg(*common, "run_name=ce"), "gem": make_cfg(*common, "run_name=gem", "sft.loss=gem")}
    out = {}
    for name, cfg in cfgs.items():
        write_selected(cfg)
        out[name] = run_stage(cfg).path
    assert read_meta(out["gem"])["settings"]["loss"] == "gem" and read_meta(out["gem"])["settings"]["gem_beta"] == 0.7
    start, tokenizer, _ = load_policy(cfgs["ce"], None, torch.device("cpu"))
    prompt = "Tell me about bees, 0."
    trained = {name: load_saved_causal_lm(path, torch.device("cpu"))[0] for name, path in out.items()}
    nll = {name: completion_nll(model, tokenizer, prompt) for name, model in trained.items()}
    assert max(nll.values()) < completion_nll(start, tokenizer, prompt) - 1.0
    assert completion_entropy(trained["gem"], tokenizer, prompt) > completion_entropy(trained["ce"], tokenizer, prompt)


@pytest.mark.parametrize("overrides,expected", [(("sft.loss=focal",), "sft.loss"),
                                                (("sft.loss=gem", "sft.gem_beta=0"), "sft.gem_beta"),
                                                (("sft.loss=gem", "sft.gem_beta=1.5"), "sft.gem_beta"),
                                                (("sft.merge_weight=0",), "sft.merge_weight"),
                                                (("sft.merge_weight=1.5",), "sft.merge_weight"),
                                                (("sft.merge_weight=0.5", "sft.merge_at=1"), "sft.merge_at")])
def test_a_bad_sft_loss_setting_is_refused_naming_the_key(make_cfg, overrides, expected):
    from rsft.errors import ConfigError
    from rsft.preflight import check_config

    with pytest.raises(ConfigError, match=expected):
        check_config(make_cfg("stage=sft", *overrides))


def weights(path) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in load_saved_causal_lm(path, torch.device("cpu"))[0].named_parameters()}


@pytest.mark.parametrize("mode,rate", [("lora", "1e-2"), ("full", "3e-3")])
def test_wise_ft_saves_the_mix_of_the_fine_tuned_weights_and_those_at_the_earlier_step(make_cfg, mode, rate):
    """sft.merge_weight (issue 48, WiSE-FT): the saved policy is weight x the fine-tuned weights + (1 - weight) x
    those at sft.merge_at of the same run. One row a step at a constant rate: the plain run's step 1 is a 1-epoch
    run, and merge_at=0 takes the policy SFT starts from. With LoRA the mix is of the merged weights, not of the
    adapter's two factors, whose product is not linear."""
    common = ("stage=sft", f"sft.mode={mode}", f"sft.learning_rate={rate}", "device=cpu", "sft.batch_size=4")
    cfgs = {"plain": make_cfg(*common, "sft.epochs=3", "run_name=plain"),
            "one": make_cfg(*common, "sft.epochs=1", "run_name=one"),
            "early": make_cfg(*common, "sft.epochs=3", "run_name=early", "sft.merge_weight=0.5", "sft.merge_at=0.34"),
            "start": make_cfg(*common, "sft.epochs=3", "run_name=start", "sft.merge_weight=0.25")}
    out = {}
    for name, cfg in cfgs.items():
        write_selected(cfg)
        out[name] = run_stage(cfg).path
    start, _, _ = load_policy(cfgs["plain"], None, torch.device("cpu"))
    w = {name: weights(path) for name, path in out.items()}
    w0 = {n: p.detach() for n, p in start.named_parameters()}
    assert read_meta(out["early"])["stats"]["merge_step"] == 1 and read_meta(out["start"])["stats"]["merge_step"] == 0
    assert read_meta(out["plain"])["stats"].get("merge_step") is None
    moved = [n for n in w0 if not torch.equal(w["plain"][n], w0[n])]
    assert moved and all(not torch.equal(w["plain"][n], w["one"][n]) for n in moved)
    for n in w0:
        torch.testing.assert_close(w["early"][n], 0.5 * w["plain"][n] + 0.5 * w["one"][n], atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(w["start"][n], 0.25 * w["plain"][n] + 0.75 * w0[n], atol=2e-6, rtol=1e-5)


def test_wise_fts_earlier_weights_are_read_back_on_resume_and_a_resume_without_them_is_refused(tmp_path):
    """A run killed after sft.merge_at's step resumes with the copy written beside its checkpoints; with the copy
    gone it stops with a message, rather than merging with the resumed weights."""
    from types import SimpleNamespace

    from rsft.policy_training import EarlyWeights

    model = torch.nn.Linear(2, 2)
    path = tmp_path / "checkpoints" / "merge-early.pt"
    first = EarlyWeights(0.5, path)
    first.on_train_begin(None, SimpleNamespace(max_steps=4, global_step=0), None, model=model)
    assert first.step == 2 and first.weights is None
    first.on_step_end(None, SimpleNamespace(max_steps=4, global_step=2), None, model=model)
    taken = {n: p.clone() for n, p in first.weights.items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    resumed = EarlyWeights(0.5, path)
    resumed.on_train_begin(None, SimpleNamespace(max_steps=4, global_step=3), None, model=model)
    assert set(resumed.weights) == {"weight", "bias"}
    assert all(torch.equal(resumed.weights[n], taken[n]) for n in taken)
    path.unlink()
    with pytest.raises(RuntimeError, match="merge-early.pt is missing"):
        EarlyWeights(0.5, path).on_train_begin(None, SimpleNamespace(max_steps=4, global_step=3), None, model=model)


def tempered_nll(model, tokenizer, prompts: list[str], temperature: float) -> float:
    """COMPLETION's (+ end of turn) cross-entropy under the logits divided by `temperature`, the mean over every
    completion token of `prompts`."""
    total, count = 0.0, 0
    for prompt in prompts:
        prefix = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                               add_generation_prompt=True)
        start = len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
        text = prefix + COMPLETION + tokenizer.eos_token
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0, start - 1:-1].float() / temperature
        nll = torch.nn.functional.cross_entropy(logits, ids[0, start:], reduction="sum")
        total, count = total + float(nll), count + ids.shape[1] - start
    return total / count


def test_sft_tempered_loss_is_the_cross_entropy_of_the_logits_over_the_sampling_temperature(make_cfg):
    """sft.tempered_loss (issue 48): the loss is taken on the logits divided by sample.temperature, the distribution
    the kept answers were drawn from (TRL's GRPOTrainer's log-probabilities), so its first step's loss is the kept
    tokens' cross-entropy under the start policy's tempered logits; without it, under the raw logits; with
    sft.loss_temperature, under the logits divided by that. Refused with greedy decoding, and beside a
    loss_temperature of its own; sample.temperature enters the SFT fingerprint only while tempered_loss is on."""
    from rsft.errors import ConfigError
    from rsft.preflight import check_config
    from rsft.stages import command_reads

    common = ("stage=sft", "sft.learning_rate=3e-3", "sft.epochs=1", "device=cpu", "sample.temperature=0.5")
    cfgs = {"plain": make_cfg(*common, "run_name=plain"),
            "tempered": make_cfg(*common, "run_name=tempered", "sft.tempered_loss=true"),
            "own": make_cfg(*common, "run_name=own", "sft.loss_temperature=0.8")}
    first = {}
    for name, cfg in cfgs.items():
        write_selected(cfg)
        first[name] = read_meta(run_stage(cfg).path)["stats"]["loss_first"]
    start, tokenizer, _ = load_policy(cfgs["plain"], None, torch.device("cpu"))
    prompts = [f"Tell me about bees, {i}." for i in range(4)]
    assert first["plain"] == pytest.approx(tempered_nll(start, tokenizer, prompts, 1.0), rel=1e-3)
    assert first["tempered"] == pytest.approx(tempered_nll(start, tokenizer, prompts, 0.5), rel=1e-3)
    assert first["own"] == pytest.approx(tempered_nll(start, tokenizer, prompts, 0.8), rel=1e-3)
    with pytest.raises(ConfigError, match=r"sft.tempered_loss=true .*sample.strategy=greedy"):
        check_config(make_cfg("stage=sft", "sft.tempered_loss=true", "sample.strategy=greedy", "sample.num_samples=1",
                              "select.pairs=false"))
    assert command_reads("sft", cfgs["tempered"], "sample.temperature")
    assert not command_reads("sft", cfgs["plain"], "sample.temperature")
    assert not command_reads("sft", cfgs["own"], "sample.temperature")  # sft.loss_temperature is its own
    with pytest.raises(ConfigError, match=r"sft.tempered_loss=true .*sft.loss_temperature=0.8"):
        check_config(make_cfg("stage=sft", "sft.tempered_loss=true", "sft.loss_temperature=0.8"))
    with pytest.raises(ConfigError, match=r"sft.loss_temperature"):
        check_config(make_cfg("stage=sft", "sft.loss_temperature=0"))
