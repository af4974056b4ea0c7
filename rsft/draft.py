"""stage=draft: a draft trained on the policy's own samples: a distilled small model, or a feature draft.

    python -m rsft.run stage=draft [round=0]                  # then: stage=sample draft=distilled
    python -m rsft.run stage=draft draft=feature [round=0]    # then: stage=sample draft=feature

Which one: `draft=feature` trains the feature draft (below, `train_feature_draft`); any other
draft setting trains the distilled small model (conf/distill).

SmolLM2-135M-Instruct has no smaller sibling with its tokenizer, and SFT moves the policy every
round, so rsft grows its own draft: the policy's architecture with only `distill.num_layers`
layers, starting as a shallow sub-network of the policy (its embeddings, its first layers and its
last layer, its final norm), trained to imitate the policy on completions the policy sampled (the
round's samples, plus the kept set).

- Loss: forward KL(p_policy || q_draft) on completion tokens, with the policy's full next-token
  distributions computed on the fly (distillation; affordable here because the samples are short
  and a teacher forward is one pass per batch). `distill.distill=false` trains plain
  next-token cross-entropy on the sampled tokens instead.
- Vocabulary head: a draft may put zero probability on tokens (q(x) = 0 only means x is never
  proposed; the verifier stays exact), so the draft's output layer is restricted to the
  `head_tokens` most frequent tokens of the training completions (plus EOS). On a CPU the
  full 49k-row head would be most of the draft's cost.

Why a hand-written loop: TRL's distillation trainer (GKD) samples from the student during
training and works on chat datasets; here the data are fixed token ids with a completion mask and
the teacher is a frozen model in memory: a 30-line loop is simpler than bending it.

Which policy (rsft.paths.RunPaths.draft_teacher / draft_output): round r's draft imitates the
policy that round r + 1 samples from (round r's SFT output, written to round_XX/draft); before any
SFT (`round=-1`, or when no policy of the round exists) it imitates the initial policy and is
written to runs/<run>/draft.
It reports held-out loss and acceptance rate (the verifier's exact acceptance, measured by
speculative sampling of held-out prompts) against an untrained draft of the same shape.

The feature draft (EAGLE, rsft.sampling.feature_model; settings draft.train): one decoder layer
over [the policy's last-layer feature at t - 1; the embedding of token t], predicting the
policy's feature at t, read by the policy's own (frozen) output head restricted to the frequent
tokens. Trained on the same sequences, with the policy's features computed once (one policy pass
over the data, kept in memory: ~2 KB per token for SmolLM2) and each epoch running only the draft:
loss = KL(p_policy || q_draft) on the head + feature_weight * smooth L1(predicted, policy feature),
EAGLE's two terms, at every position of the training sequences, prompts included: the draft
learns the policy's step (h_{t-1}, x_t) -> h_t, which is the same computation on a prompt token,
and the round's samples are small, so scoring the prompts too gives the draft more of the policy's
steps to learn from (with more epochs, it raised the acceptance). The held-out KL is measured on
completion positions only, where the draft is used.
Options (draft.train): `unroll_steps` trains draft positions 2+ on the draft's own predicted
features (HASS's training-time drafting, FeatureDraftModel.unrolled); `kl_temperature` tempers both
sides of the KL; `more_samples` adds earlier rounds' samples and the prefs stage's completions to
the training set (the held-out set stays the round's own samples). `more_samples` is on by default
(more of the policy's text is what raised the acceptance, at more training time); `unroll_steps`
and `kl_temperature` stay off (both measured worse).
Measured acceptance and costs: docs/benchmarks.md#training-the-feature-draft.
Saved as a folder of its own weights only (config.json, feature_draft.safetensors,
draft_head.json, the tokenizer); the embeddings and head are the policy's when it is loaded
(rsft.models.load_feature_draft), which is why it is refreshed with every round's policy.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import random
import time

import torch
import torch.nn.functional as F
from datasets import concatenate_datasets
from omegaconf import DictConfig
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM

from rsft.data import prompt_room, prompt_token_ids
from rsft.errors import MissingInput
from rsft.generation import sampling_settings
from rsft.models import (
    DRAFT_HEAD_FILE,
    FEATURE_DRAFT_WEIGHTS,
    eos_token_ids,
    load_policy,
    resolve_device,
    restrict_head,
    seeded,
)
from rsft.paths import RunPaths
from rsft.runner import Built, Job, Plan
from rsft.sampling.proposers import FeatureDraft, ModelDraft
from rsft.sampling.feature_model import FeatureDraftModel, feature_draft_config
from rsft.sampling.batched import Sampler
from rsft.store import is_complete, load_dataset_artifact
from rsft.checkpoints import LoopCheckpoints

log = logging.getLogger(__name__)


def build_draft_model(policy, num_layers: int, head_token_ids: list[int], seed: int):
    """A `num_layers`-layer copy of the policy's architecture: policy embeddings, restricted head."""
    config = copy.deepcopy(policy.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    config.tie_word_embeddings = False
    with seeded(seed):
        draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(policy.get_input_embeddings().weight)
        draft.model.norm.weight.copy_(policy.model.norm.weight)
        # a shallow sub-network of the policy to start from: its first layers and its last one
        source_layers = list(range(num_layers - 1)) + [policy.config.num_hidden_layers - 1]
        for mine, theirs in zip(draft.model.layers, source_layers):
            mine.load_state_dict(policy.model.layers[theirs].state_dict())
        restrict_head(draft, head_token_ids, policy.get_output_embeddings().weight)
    return draft


def training_sources(cfg: DictConfig, paths: RunPaths) -> list:
    """The samples (and kept set) of round max(r, 0): what the draft imitates the policy on."""
    data_round = max(cfg.round, 0)
    sources = [p for p in (paths.samples(data_round), paths.selected(data_round)) if is_complete(p)]
    if not sources:
        raise MissingInput(f"stage=draft trains on the policy's samples, but {paths.samples(data_round)} "
                                f"does not exist; run `python -m rsft.run stage=sample round={data_round}` first")
    return sources


def extra_feature_sources(cfg: DictConfig, paths: RunPaths) -> list:
    """With draft.train.more_samples: every earlier round's samples and the prefs stage's completions
    (the initial policy's), the other sequences of the policy's family at hand (training only)."""
    if not cfg.draft.train.get("more_samples"):
        return []
    earlier = [paths.samples(r) for r in range(max(cfg.round, 0))]
    return [p for p in (*earlier, paths.prefs) if is_complete(p)]


def extra_sequences(tokenizer, cfg: DictConfig, teacher_config, sources: list) -> list:
    """(prompt ids, completion ids + EOS) of each distinct completion of `sources`: sample artifacts
    (completion_ids) or the prefs DatasetDict (chosen / rejected texts, tokenized again)."""
    room = prompt_room(teacher_config, cfg.sample.max_new_tokens)
    texts, sequences = set(), []
    for path in sources:
        data = load_dataset_artifact(path)
        if hasattr(data, "values"):  # prefs: pairs of completion texts
            pairs = concatenate_datasets(list(data.values()))
            rows = [(prompt, tokenizer(side, add_special_tokens=False)["input_ids"])
                    for prompt, *sides in zip(pairs["prompt"], pairs["chosen"], pairs["rejected"]) for side in sides]
        else:
            rows = list(zip(data["prompt"], data["completion_ids"]))
        for prompt, completion in rows:
            if (prompt, tuple(completion)) in texts:
                continue
            texts.add((prompt, tuple(completion)))
            prefix, _ = prompt_token_ids(tokenizer, prompt, cfg.data.get("system_prompt"), room)
            sequences.append((prefix, list(completion) + [tokenizer.eos_token_id]))
    return sequences


def _teacher_and_data(cfg: DictConfig, teacher_path, sources: list, device):
    """The policy the draft must imitate (the configured one for None), and the token sequences to imitate it on."""
    teacher, tokenizer, teacher_name = load_policy(cfg, teacher_path, device)
    rows = concatenate_datasets([load_dataset_artifact(p).select_columns(["prompt", "completion_ids"])
                                 for p in sources])
    sequences = []
    for prompt, completion in zip(rows["prompt"], rows["completion_ids"]):
        prefix, _ = prompt_token_ids(tokenizer, prompt, cfg.data.get("system_prompt"),
                                     prompt_room(teacher.config, cfg.sample.max_new_tokens))
        sequences.append((prefix, list(completion) + [tokenizer.eos_token_id]))
    log.info("draft: imitating %s on %d completions from %s", teacher_name, len(sequences), [str(s) for s in sources])
    return teacher, tokenizer, sequences, teacher_name


def _batches(sequences, batch_size: int, rng: random.Random, pad_id: int):
    order = list(range(len(sequences)))
    rng.shuffle(order)
    for start in range(0, len(order), batch_size):
        chunk = [sequences[i] for i in order[start:start + batch_size]]
        width = max(len(p) + len(c) for p, c in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)  # [batch, width] right-padded
        attention = torch.zeros(len(chunk), width, dtype=torch.long)
        target_mask = torch.zeros(len(chunk), width, dtype=torch.bool)  # positions whose NEXT token is a completion token
        for i, (p, c) in enumerate(chunk):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            attention[i, :len(p) + len(c)] = 1
            target_mask[i, len(p) - 1:len(p) + len(c) - 1] = True
        yield ids, attention, target_mask


def distillation_loss(draft, teacher, ids, attention, target_mask, head_ids: torch.Tensor, distill: bool):
    """Mean over completion positions of KL(p_teacher || q_draft) (or CE on the sampled tokens).

    The draft's distribution lives on `head_ids`; teacher mass outside it is unreachable for the
    draft, so the KL is taken against the teacher renormalised on the head (the constant it drops
    does not depend on the draft).
    """
    student = draft(input_ids=ids, attention_mask=attention).logits[target_mask]  # [tokens, head]
    log_q = F.log_softmax(student.float(), dim=-1)
    if distill:
        with torch.no_grad():
            teacher_logits = teacher(input_ids=ids, attention_mask=attention).logits[target_mask]  # [tokens, vocab]
            p = F.softmax(teacher_logits[:, head_ids].float(), dim=-1)  # [tokens, head]
        return -(p * log_q).sum(-1).mean() + (p * p.clamp_min(1e-12).log()).sum(-1).mean()
    position_of = torch.full((int(head_ids.max()) + 1,), 0, dtype=torch.long)
    position_of[head_ids] = torch.arange(len(head_ids))
    next_tokens = torch.roll(ids, -1, dims=1)[target_mask]  # [tokens]
    in_head = torch.isin(next_tokens, head_ids)
    return -log_q[in_head].gather(1, position_of[next_tokens[in_head]][:, None]).mean()


def frequent_tokens(sequences, count: int, eos_id: int) -> list[int]:
    """The `count` most frequent completion tokens (plus EOS), sorted: the draft's output layer."""
    counts: dict[int, int] = {}
    for _, completion in sequences:
        for t in completion:
            counts[t] = counts.get(t, 0) + 1
    head = sorted(counts, key=lambda t: -counts[t])[:count]
    return sorted(set(head) | {eos_id})


@dataclasses.dataclass
class Trained:
    """What a hand-written training loop carries from step to step, and so what its checkpoint holds."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    rng: random.Random  # shuffles each epoch's batches


def resumable_epochs(epochs: int, steps: int, batches, step, trained: Trained, checkpoints: LoopCheckpoints | None,
                     every: int, desc: str) -> None:
    """Run `step(batch)` over `epochs` epochs of `batches()` (a fresh, shuffled iterator per epoch), saving a
    checkpoint every `every` steps (0: none) and first resuming from the newest complete one.

    A checkpoint holds the model, optimizer and scheduler states, torch's RNG state, the batch order's RNG
    state at the start of the epoch and how many of its batches are done: the resumed run rebuilds that
    epoch's order and skips the batches done, so it takes the same steps as an uninterrupted run (on CPU,
    bit for bit). Written by hand because the drafts' loops are (see train_draft)."""
    state = checkpoints.load() if checkpoints is not None else None
    first_epoch, skip, done = 0, 0, 0
    if state is not None:
        trained.model.load_state_dict(state["model"])
        trained.optimizer.load_state_dict(state["optimizer"])
        trained.schedule.load_state_dict(state["schedule"])
        trained.rng.setstate(state["epoch_rng"])
        torch.set_rng_state(state["torch_rng"])
        first_epoch, skip, done = state["epoch"], state["batch"], state["step"]
        log.info("draft: resuming at step %d of %d (epoch %d, batch %d)", done, steps, first_epoch + 1, skip)
    with tqdm(total=steps, initial=done, desc=desc, unit="step") as bar:
        for epoch in range(first_epoch, epochs):
            epoch_rng = trained.rng.getstate()
            trained.model.train()
            for index, batch in enumerate(batches()):
                if epoch == first_epoch and index < skip:
                    continue
                bar.set_postfix(**step(batch))
                bar.update(1)
                done += 1
                if checkpoints is not None and every > 0 and done % every == 0 and done < steps:
                    checkpoints.save(done, {"model": trained.model.state_dict(),
                                            "optimizer": trained.optimizer.state_dict(),
                                            "schedule": trained.schedule.state_dict(), "epoch_rng": epoch_rng,
                                            "torch_rng": torch.get_rng_state(), "epoch": epoch, "batch": index + 1,
                                            "step": done})


def train_draft(draft, teacher, train, heldout, head_ids: list[int], dcfg: DictConfig, pad_id: int,
                rng: random.Random, device, checkpoints: LoopCheckpoints | None = None) -> dict:
    """Train `draft` in place (AdamW, linear decay, clipped gradients); held-out loss before and after.
    checkpoints: where to save every distill.checkpoint_steps steps and resume from (None: not resumable)."""
    head_tensor = torch.tensor(head_ids, device=device)
    distill, batch_size = bool(dcfg.distill), dcfg.batch_size

    def heldout_loss() -> float:
        draft.eval()
        with torch.no_grad():
            losses = [float(distillation_loss(draft, teacher, *(t.to(device) for t in b), head_tensor, distill))
                      for b in _batches(heldout, batch_size, random.Random(0), pad_id)]
        return sum(losses) / len(losses)

    before = heldout_loss()
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=dcfg.learning_rate,
                                  weight_decay=dcfg.weight_decay)
    steps = dcfg.epochs * math.ceil(len(train) / batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / max(steps, 1))

    def step(batch) -> dict:
        loss = distillation_loss(draft, teacher, *(t.to(device) for t in batch), head_tensor, distill)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), dcfg.max_grad_norm)
        optimizer.step()
        schedule.step()
        return {"loss": f"{loss.item():.3f}"}

    started = time.perf_counter()
    resumable_epochs(dcfg.epochs, steps, lambda: _batches(train, batch_size, rng, pad_id), step,
                     Trained(draft, optimizer, schedule, rng), checkpoints, int(dcfg.get("checkpoint_steps") or 0),
                     "distilling draft")
    train_seconds = time.perf_counter() - started
    after = heldout_loss()
    draft.eval()
    return {"heldout_loss_before": round(before, 4), "heldout_loss_after": round(after, 4),
            "train_seconds": round(train_seconds, 1)}


@torch.no_grad()
def measure_acceptance(policy, draft, prompt_ids, eos_ids, cfg: DictConfig, train: DictConfig) -> dict:
    """Speculative sampling of held-out prompts with `draft` (a ModelDraft or FeatureDraft) at the
    sample stage's settings and a fixed gamma (train.eval_gamma): the verifier's acceptance statistics."""
    settings = dataclasses.replace(sampling_settings(cfg.sample), gamma=train.eval_gamma, adaptive=False)
    sampler = Sampler(policy, settings, eos_ids, draft=draft)
    sampler.generate(prompt_ids, train.eval_samples, seed=train.eval_seed, progress=False)
    return sampler.stats.summary()


def trains_feature_draft(cfg: DictConfig) -> bool:
    return cfg.draft.kind == "feature"


def plan(cfg: DictConfig, paths: RunPaths) -> Plan:
    """The draft's training settings, the seed, the policy it imitates (configured or an artifact), the
    sequences it trains on, and the sampling settings its acceptance is measured at (rsft.stages)."""
    sources = training_sources(cfg, paths)
    extra = extra_feature_sources(cfg, paths) if trains_feature_draft(cfg) else []
    teacher_path = paths.draft_teacher(cfg.round)
    return Plan(outputs=[paths.draft_output(cfg.round)],
                inputs=[*sources, *extra, *([teacher_path] if teacher_path else [])],
                given={"sources": sources, "extra": extra, "teacher": teacher_path})


def build(cfg: DictConfig, job: Job) -> Built:
    """The hand-written training loops run in one process (rsft.stages: one_process); the others wait."""
    train = train_feature_draft if trains_feature_draft(cfg) else distil
    return train(cfg, job.plan.given, resolve_device(cfg.device), job.loop_checkpoints())


def _split(cfg: DictConfig, train: DictConfig, sequences: list) -> tuple[list, list]:
    """(held-out, train) sequences, shuffled with the run's seed."""
    sequences = list(sequences)
    random.Random(cfg.seed).shuffle(sequences)
    n_heldout = max(1, int(len(sequences) * train.heldout_fraction))
    return sequences[:n_heldout], sequences[n_heldout:]


def _heldout_prompts(heldout, train: DictConfig) -> list[list[int]]:
    return [list(p) for p in sorted({tuple(p) for p, _ in heldout})[: train.eval_prompts]]


def _built(cfg: DictConfig, kind: str, metrics: dict, write_files) -> Built:
    def write(tmp):
        write_files(tmp)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))

    meta = {"stage": "draft", "kind": kind, "round": cfg.round, "metrics": metrics}
    return Built([(meta, write)], {f"draft/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))},
                 step=max(cfg.round, 0))


def distil(cfg: DictConfig, given: dict, device, checkpoints: LoopCheckpoints | None = None) -> Built:
    """Train the draft on the policy's sequences (`given`: the plan's sources and teacher), measure its acceptance,
    write it to `out`."""
    dcfg = cfg.distill
    teacher, tokenizer, sequences, teacher_name = _teacher_and_data(cfg, given["teacher"], given["sources"], device)
    rng = random.Random(cfg.seed)
    rng.shuffle(sequences)
    n_heldout = max(1, int(len(sequences) * dcfg.heldout_fraction))
    heldout, train = sequences[:n_heldout], sequences[n_heldout:]
    head_ids = frequent_tokens(train, dcfg.head_tokens, tokenizer.eos_token_id)
    draft = build_draft_model(teacher, dcfg.num_layers, head_ids, cfg.seed).to(device)
    untrained = copy.deepcopy(draft).eval()  # the same draft before training, for the acceptance baseline
    teacher.eval()
    training = train_draft(draft, teacher, train, heldout, head_ids, dcfg, tokenizer.pad_token_id, rng, device,
                           checkpoints)

    prompts = _heldout_prompts(heldout, dcfg)
    eos_ids = eos_token_ids(teacher, tokenizer)
    accept_trained = measure_acceptance(teacher, ModelDraft(draft, head_token_ids=head_ids), prompts, eos_ids, cfg,
                                        dcfg)
    accept_untrained = measure_acceptance(teacher, ModelDraft(untrained, head_token_ids=head_ids), prompts, eos_ids,
                                          cfg, dcfg)
    metrics = {
        "kind": "distilled", "teacher": teacher_name, "train_sequences": len(train), "heldout_sequences": len(heldout),
        "num_layers": dcfg.num_layers, "head_tokens": len(head_ids),
        "parameters": draft.num_parameters(), "policy_parameters": teacher.num_parameters(),
        **training, **_acceptance_metrics(dcfg.eval_gamma, accept_trained, accept_untrained),
    }
    log.info("draft: held-out loss %.3f -> %.3f, acceptance %.3f (untrained %.3f)", metrics["heldout_loss_before"],
             metrics["heldout_loss_after"], metrics["acceptance_rate"] or 0, metrics["untrained_acceptance_rate"] or 0)

    def write_files(tmp):
        draft.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / DRAFT_HEAD_FILE).write_text(json.dumps({"head_token_ids": head_ids}))

    return _built(cfg, "distilled", metrics, write_files)


def _acceptance_metrics(gamma: int, trained: dict, untrained: dict) -> dict:
    return {"eval_gamma": gamma, "acceptance_rate": trained["acceptance_rate"], "alpha": trained["alpha"],
            "acceptance_per_position": trained["acceptance_per_position"],
            "tokens_per_target_forward": trained["tokens_per_target_forward"],
            "untrained_acceptance_rate": untrained["acceptance_rate"],
            "untrained_acceptance_per_position": untrained["acceptance_per_position"]}


# ---- the feature draft ----

@torch.no_grad()
def policy_features(policy, sequences, batch_size: int, pad_id: int, device) -> list[torch.Tensor]:
    """The policy's last-layer features (its final norm's output) of each sequence -> [len, hidden] each."""
    out = []
    for start in tqdm(range(0, len(sequences), batch_size), desc="policy features", unit="batch"):
        chunk = sequences[start:start + batch_size]
        width = max(len(p) + len(c) for p, c in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)  # [batch, width] right-padded
        attention = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, (p, c) in enumerate(chunk):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            attention[i, :len(p) + len(c)] = 1
        hidden = policy.get_decoder()(input_ids=ids.to(device), attention_mask=attention.to(device)).last_hidden_state
        out.extend(hidden[i, :len(p) + len(c)].float().cpu() for i, (p, c) in enumerate(chunk))
    return out


def _feature_batches(examples, batch_size: int, rng: random.Random | None, whole_sequence: bool):
    """examples: (prompt, completion, features [len, hidden]) -> right-padded batches of
    ids [batch, width], the features of t - 1 at entry t [batch, width, hidden] (zeros at t = 0),
    the policy's features [batch, width, hidden], and the positions scored: those whose next token
    is a completion token, or with whole_sequence every position that has a next token."""
    order = list(range(len(examples)))
    if rng is not None:
        rng.shuffle(order)
    for start in range(0, len(order), batch_size):
        chunk = [examples[i] for i in order[start:start + batch_size]]
        width = max(len(p) + len(c) for p, c, _ in chunk)
        hidden = chunk[0][2].shape[1]
        ids = torch.zeros(len(chunk), width, dtype=torch.long)  # [batch, width]
        features = torch.zeros(len(chunk), width, hidden)  # [batch, width, hidden] policy feature at t
        target_mask = torch.zeros(len(chunk), width, dtype=torch.bool)  # [batch, width]
        for i, (p, c, f) in enumerate(chunk):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            features[i, :len(p) + len(c)] = f
            target_mask[i, 0 if whole_sequence else len(p) - 1:len(p) + len(c) - 1] = True
        previous = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], 1)  # [batch, width, hidden]
        yield ids, previous, features, target_mask


def feature_draft_loss(draft: FeatureDraftModel, ids, previous, features, target_mask, feature_weight: float,
                       steps: int = 1, temperature: float = 1.0):
    """KL(p_policy || q_draft) on the draft's head (p renormalised there, as for the distilled draft)
    plus feature_weight x smooth L1 between the predicted and the policy's features, at the scored
    positions (target_mask), averaged over draft positions 1..steps (FeatureDraftModel.unrolled:
    positions 2+ read the draft's own predicted features, as when it drafts). p comes from the
    policy's own head on its features; both sides are tempered by `temperature` (the sampler's:
    acceptance is sum min(p, q) of the tempered distributions). -> (loss, KL of each position)."""
    predictions = draft.unrolled(ids, previous, steps) if steps > 1 else [draft(ids, previous, logits_to_keep=1).features]
    loss, kls = 0.0, []
    for k, predicted in enumerate(predictions):
        mask = target_mask.clone()
        mask[:, :k] = False  # position k + 1 needs a true entry k positions back
        predicted, true = predicted[mask], features[mask]  # [tokens, hidden]
        log_q = F.log_softmax(draft.lm_head(predicted).float() / temperature, dim=-1)  # [tokens, head]
        with torch.no_grad():
            p = F.softmax(draft.lm_head(true).float() / temperature, dim=-1)  # [tokens, head]
        kl = (p * (p.clamp_min(1e-12).log() - log_q)).sum(-1).mean()
        loss = loss + (kl + feature_weight * F.smooth_l1_loss(predicted, true)) / len(predictions)
        kls.append(kl)
    return loss, kls


def build_feature_draft(policy, num_layers: int, head_token_ids: list[int] | None, seed: int) -> FeatureDraftModel:
    """A fresh feature draft for `policy` (same seed, same weights): its final norm starts as the policy's."""
    with seeded(seed):
        draft = FeatureDraftModel(feature_draft_config(policy.config, num_layers),
                                  policy.get_input_embeddings().weight, policy.get_output_embeddings().weight,
                                  head_token_ids)
    with torch.no_grad():
        draft.norm.weight.copy_(policy.get_decoder().norm.weight)
    return draft.to(policy.device)


def train_feature_draft(cfg: DictConfig, given: dict, device, checkpoints: LoopCheckpoints | None = None) -> Built:
    """Train a feature draft for the round's policy on its sequences (`given`: the plan's sources, extra sources and
    teacher), measure its acceptance, write it."""
    train = cfg.draft.train
    policy, tokenizer, sequences, teacher_name = _teacher_and_data(cfg, given["teacher"], given["sources"], device)
    policy.eval().requires_grad_(False)
    heldout, training_set = _split(cfg, train, sequences)
    held_keys = {(tuple(p), tuple(c)) for p, c in heldout}  # the held-out sequences stay out of training
    training_set += [s for s in extra_sequences(tokenizer, cfg, policy.config, given["extra"])
                     if (tuple(s[0]), tuple(s[1])) not in held_keys]
    head_ids = (frequent_tokens(training_set, train.head_tokens, tokenizer.eos_token_id)
                if train.head_tokens > 0 else None)
    draft = build_feature_draft(policy, train.num_layers, head_ids, cfg.seed)
    untrained = copy.deepcopy(draft).eval()  # the same draft before training, for the acceptance baseline
    batch_size, weight = train.batch_size, train.feature_weight
    unroll, temperature = train.unroll_steps, train.kl_temperature
    started = time.perf_counter()
    examples = [(p, c, f) for (p, c), f in zip(training_set, policy_features(policy, training_set, batch_size,
                                                                            tokenizer.pad_token_id, device))]
    held = [(p, c, f) for (p, c), f in zip(heldout, policy_features(policy, heldout, batch_size,
                                                                    tokenizer.pad_token_id, device))]
    feature_seconds = time.perf_counter() - started

    def heldout_kl() -> float:
        draft.eval()
        with torch.no_grad():
            kls = [float(feature_draft_loss(draft, *(t.to(device) for t in b), weight, temperature=temperature)[1][0])
                   for b in _feature_batches(held, batch_size, None, whole_sequence=False)]
        return sum(kls) / len(kls)

    before = heldout_kl()
    parameters = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=train.learning_rate, weight_decay=train.weight_decay)
    steps = train.epochs * math.ceil(len(examples) / batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / max(steps, 1))
    rng = random.Random(cfg.seed)

    def step(batch) -> dict:
        loss, kls = feature_draft_loss(draft, *(t.to(device) for t in batch), weight, unroll, temperature)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, train.max_grad_norm)
        optimizer.step()
        schedule.step()
        return {"loss": f"{loss.item():.3f}", "kl": f"{kls[0].item():.3f}"}

    started = time.perf_counter()
    resumable_epochs(train.epochs, steps, lambda: _feature_batches(examples, batch_size, rng, whole_sequence=True),
                     step, Trained(draft, optimizer, schedule, rng), checkpoints,
                     int(train.get("checkpoint_steps") or 0), "training feature draft")
    train_seconds = time.perf_counter() - started
    after = heldout_kl()
    draft.eval()

    prompts = _heldout_prompts(heldout, train)
    eos_ids = eos_token_ids(policy, tokenizer)
    accept_trained = measure_acceptance(policy, FeatureDraft(draft), prompts, eos_ids, cfg, train)
    accept_untrained = measure_acceptance(policy, FeatureDraft(untrained), prompts, eos_ids, cfg, train)
    metrics = {
        "kind": "feature", "teacher": teacher_name, "train_sequences": len(examples), "heldout_sequences": len(held),
        "num_layers": train.num_layers, "head_tokens": len(head_ids) if head_ids else policy.config.vocab_size,
        "parameters": sum(p.numel() for p in parameters), "policy_parameters": policy.num_parameters(),
        "heldout_kl_before": round(before, 4), "heldout_kl_after": round(after, 4),
        "feature_seconds": round(feature_seconds, 1), "train_seconds": round(train_seconds, 1),
        **_acceptance_metrics(train.eval_gamma, accept_trained, accept_untrained),
    }
    log.info("draft: feature draft, held-out KL %.3f -> %.3f, acceptance %.3f (untrained %.3f)", before, after,
             metrics["acceptance_rate"] or 0, metrics["untrained_acceptance_rate"] or 0)

    def write_files(tmp):
        from safetensors.torch import save_file

        draft.config.save_pretrained(tmp)
        save_file({k: v.contiguous().cpu() for k, v in draft.saved_state_dict().items()}, str(tmp / FEATURE_DRAFT_WEIGHTS))
        (tmp / DRAFT_HEAD_FILE).write_text(json.dumps({"head_token_ids": head_ids}))
        tokenizer.save_pretrained(tmp)

    return _built(cfg, "feature", metrics, write_files)
