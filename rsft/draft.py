"""stage=draft: a small draft model distilled from the policy on the policy's own samples.

    python -m rsft.run stage=draft [round=0]        # then: stage=sample draft=distilled

SmolLM2-135M-Instruct has no smaller sibling with its tokenizer, and SFT moves the policy every
round, so rsft grows its own draft: the policy's architecture with only `draft_model.num_layers`
layers, starting as a shallow sub-network of the policy (its embeddings, its first layers and its
last layer, its final norm), trained to imitate the policy on completions the policy sampled (the
round's samples, plus the kept set).

- Loss: forward KL(p_policy || q_draft) on completion tokens, with the policy's full next-token
  distributions computed on the fly (distillation; affordable here because the samples are short
  and a teacher forward is one pass per batch). `draft_model.distill=false` trains plain
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
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM

from rsft import distributed
from rsft.data import context_budget, prompt_token_ids
from rsft.models import DRAFT_HEAD_FILE, eos_token_ids, load_policy, resolve_device, restrict_head, seeded
from rsft.eval import SAMPLING_KEYS
from rsft.paths import RunPaths, atomic_artifact, fingerprint, is_complete, load_dataset_artifact, should_skip
from rsft.sample import sampling_settings
from rsft.sampling.drafts import ModelDraft
from rsft.sampling.sampler import Sampler
from rsft.tracking import Tracker, stage_tracker

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
    data_round = max(int(cfg.round), 0)
    sources = [p for p in (paths.samples(data_round), paths.selected(data_round)) if is_complete(p)]
    if not sources:
        raise FileNotFoundError(f"stage=draft trains on the policy's samples, but {paths.samples(data_round)} "
                                f"does not exist; run `python -m rsft.run stage=sample round={data_round}` first")
    return sources


def _teacher_and_data(cfg: DictConfig, paths: RunPaths, sources: list, device):
    """The policy the draft must imitate, and the token sequences to imitate it on."""
    teacher, tokenizer, teacher_name = load_policy(cfg, paths.draft_teacher(int(cfg.round)), device)
    rows = concatenate_datasets([load_dataset_artifact(p).select_columns(["prompt", "completion_ids"])
                                 for p in sources])
    sequences = []
    for prompt, completion in zip(rows["prompt"], rows["completion_ids"]):
        prefix, _ = prompt_token_ids(tokenizer, prompt, cfg.data.get("system_prompt"),
                                     context_budget(teacher.config, int(cfg.sample.max_new_tokens)))
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


def train_draft(draft, teacher, train, heldout, head_ids: list[int], dcfg: DictConfig, pad_id: int,
                rng: random.Random, device) -> dict:
    """Train `draft` in place (AdamW, linear decay, clipped gradients); held-out loss before and after."""
    head_tensor = torch.tensor(head_ids, device=device)
    distill, batch_size = bool(dcfg.distill), int(dcfg.batch_size)

    def heldout_loss() -> float:
        draft.eval()
        with torch.no_grad():
            losses = [float(distillation_loss(draft, teacher, *(t.to(device) for t in b), head_tensor, distill))
                      for b in _batches(heldout, batch_size, random.Random(0), pad_id)]
        return sum(losses) / len(losses)

    before = heldout_loss()
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=float(dcfg.learning_rate),
                                  weight_decay=float(dcfg.weight_decay))
    steps = int(dcfg.epochs) * math.ceil(len(train) / batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / max(steps, 1))
    started = time.perf_counter()
    with tqdm(total=steps, desc="distilling draft", unit="step") as bar:
        for _ in range(int(dcfg.epochs)):
            draft.train()
            for batch in _batches(train, batch_size, rng, pad_id):
                loss = distillation_loss(draft, teacher, *(t.to(device) for t in batch), head_tensor, distill)
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(draft.parameters(), float(dcfg.max_grad_norm))
                optimizer.step()
                schedule.step()
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
    train_seconds = time.perf_counter() - started
    after = heldout_loss()
    draft.eval()
    return {"heldout_loss_before": round(before, 4), "heldout_loss_after": round(after, 4),
            "train_seconds": round(train_seconds, 1)}


@torch.no_grad()
def measure_acceptance(policy, draft_model, head_ids, prompt_ids, eos_ids, cfg: DictConfig, gamma: int) -> dict:
    """Speculative sampling of held-out prompts (the sample stage's settings at a fixed gamma): the
    verifier's acceptance statistics."""
    settings = dataclasses.replace(sampling_settings(cfg.sample), gamma=gamma, adaptive=False)
    sampler = Sampler(policy, settings, eos_ids, draft=ModelDraft(draft_model, head_token_ids=head_ids))
    sampler.generate(prompt_ids, int(cfg.draft_model.eval_samples), seed=int(cfg.draft_model.eval_seed),
                     progress=False)
    return sampler.stats.summary()


def run(cfg: DictConfig, tracker: Tracker | None = None):
    paths = RunPaths.from_config(cfg)
    device = resolve_device(cfg.device)
    out = paths.draft_output(int(cfg.round))
    sources = training_sources(cfg, paths)
    teacher_path = paths.draft_teacher(int(cfg.round))
    # fingerprint: the draft settings, the seed, the policy it imitates (configured or an artifact),
    # the sequences it trains on, and the sampling settings its acceptance is measured at
    made = fingerprint(cfg, ("seed", "round", "draft_model", "policy", "data.system_prompt", *SAMPLING_KEYS,
                             "sample.batch_rows"), [*sources, *([teacher_path] if teacher_path else [])])
    if should_skip(out, cfg.overwrite, "draft", made):
        return out
    if distributed.is_main():  # the hand-written distillation loop runs in one process; the others wait
        distil(cfg, paths, sources, out, made, device, tracker)
    distributed.barrier()
    return out


def distil(cfg: DictConfig, paths: RunPaths, sources: list, out, made: dict, device, tracker: Tracker | None):
    """Train the draft on the policy's sequences, measure its acceptance, write it to `out`."""
    dcfg = cfg.draft_model
    teacher, tokenizer, sequences, teacher_name = _teacher_and_data(cfg, paths, sources, device)
    rng = random.Random(int(cfg.seed))
    rng.shuffle(sequences)
    n_heldout = max(1, int(len(sequences) * float(dcfg.heldout_fraction)))
    heldout, train = sequences[:n_heldout], sequences[n_heldout:]
    head_ids = frequent_tokens(train, int(dcfg.head_tokens), tokenizer.eos_token_id)
    draft = build_draft_model(teacher, int(dcfg.num_layers), head_ids, int(cfg.seed)).to(device)
    untrained = copy.deepcopy(draft).eval()  # the same draft before training, for the acceptance baseline
    teacher.eval()
    training = train_draft(draft, teacher, train, heldout, head_ids, dcfg, tokenizer.pad_token_id, rng, device)

    prompts = [list(p) for p in sorted({tuple(p) for p, _ in heldout})[: int(dcfg.eval_prompts)]]
    gamma = int(dcfg.eval_gamma)
    eos_ids = eos_token_ids(teacher, tokenizer)
    accept_trained = measure_acceptance(teacher, draft, head_ids, prompts, eos_ids, cfg, gamma)
    accept_untrained = measure_acceptance(teacher, untrained, head_ids, prompts, eos_ids, cfg, gamma)
    metrics = {
        "teacher": teacher_name, "train_sequences": len(train), "heldout_sequences": len(heldout),
        "num_layers": int(dcfg.num_layers), "head_tokens": len(head_ids),
        "parameters": draft.num_parameters(), "policy_parameters": teacher.num_parameters(),
        **training, "eval_gamma": gamma,
        "acceptance_rate": accept_trained["acceptance_rate"], "alpha": accept_trained["alpha"],
        "acceptance_per_position": accept_trained["acceptance_per_position"],
        "tokens_per_target_forward": accept_trained["tokens_per_target_forward"],
        "untrained_acceptance_rate": accept_untrained["acceptance_rate"],
    }
    log.info("draft: held-out loss %.3f -> %.3f, acceptance %.3f (untrained %.3f)", metrics["heldout_loss_before"],
             metrics["heldout_loss_after"], metrics["acceptance_rate"] or 0, metrics["untrained_acceptance_rate"] or 0)
    with atomic_artifact(out, {"stage": "draft", "round": int(cfg.round), "metrics": metrics,
                               "config": OmegaConf.to_container(cfg, resolve=True)}, made) as tmp:
        draft.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / DRAFT_HEAD_FILE).write_text(json.dumps({"head_token_ids": head_ids}))
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
    with stage_tracker(cfg, "draft", tracker) as tracker:
        tracker.log({f"draft/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))},
                    step=max(int(cfg.round), 0))
