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

Which policy: round r's draft imitates the policy that round r + 1 samples from (round r's SFT
output, written to round_XX/draft); before any SFT (`round=-1`, or when no policy of the round
exists) it imitates the initial policy and is written to runs/<run>/draft.
It reports held-out loss and acceptance rate (the verifier's exact acceptance, measured by
speculative sampling of held-out prompts) against an untrained draft of the same shape.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from datasets import concatenate_datasets, load_from_disk
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM

from rsft.data import chat_text
from rsft.models import eos_token_ids, load_causal_lm, load_saved_causal_lm, resolve_device
from rsft.paths import RunPaths, atomic_artifact, is_complete, should_skip
from rsft.sampling.drafts import ModelDraft
from rsft.sampling.sampler import Sampler, SamplingSettings
from rsft.tracking import Tracker

log = logging.getLogger(__name__)

HEAD_FILE = "draft_head.json"


def build_draft_model(policy, num_layers: int, head_token_ids: list[int], seed: int):
    """A `num_layers`-layer copy of the policy's architecture: policy embeddings, restricted head."""
    config = copy.deepcopy(policy.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    config.tie_word_embeddings = False
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    torch.random.set_rng_state(state)
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(policy.get_input_embeddings().weight)
        draft.model.norm.weight.copy_(policy.model.norm.weight)
        # a shallow sub-network of the policy to start from: its first layers and its last one
        source_layers = list(range(num_layers - 1)) + [policy.config.num_hidden_layers - 1]
        for mine, theirs in zip(draft.model.layers, source_layers):
            mine.load_state_dict(policy.model.layers[theirs].state_dict())
        restrict_head(draft, head_token_ids, policy.get_output_embeddings().weight)
    return draft


def restrict_head(model, head_token_ids: list[int], full_weight: torch.Tensor | None = None) -> None:
    """Replace the output layer by one over `head_token_ids` only (rows of `full_weight` if given)."""
    hidden = model.config.hidden_size
    head = torch.nn.Linear(hidden, len(head_token_ids), bias=False)
    if full_weight is not None:
        with torch.no_grad():
            head.weight.copy_(full_weight[torch.tensor(head_token_ids)])
    model.lm_head = head
    model.config.tie_word_embeddings = False


def load_draft(path, device):
    """A saved distilled draft with its restricted head: (model, tokenizer, head token ids)."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    path = Path(path)
    head_ids = json.loads((path / HEAD_FILE).read_text())["head_token_ids"]
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
    restrict_head(model, head_ids)
    model.load_state_dict(load_file(str(path / "model.safetensors")))
    tokenizer = AutoTokenizer.from_pretrained(path)
    log.info("loaded draft %s (%d parameters, head of %d tokens)", path, model.num_parameters(), len(head_ids))
    return model.to(device).eval(), tokenizer, head_ids


def _teacher_and_data(cfg: DictConfig, paths: RunPaths, device):
    """The policy the draft must imitate, and the token sequences to imitate it on."""
    round_idx = int(cfg.round)
    if round_idx >= 0 and is_complete(paths.policy(round_idx)):
        teacher, tokenizer = load_saved_causal_lm(paths.policy(round_idx), device)
        teacher_name = str(paths.policy(round_idx))
    else:
        teacher, tokenizer = load_causal_lm(cfg.policy, cfg.paths.cache_dir, device)
        teacher_name = str(cfg.policy.name_or_path)
    sources = [p for p in (paths.samples(max(round_idx, 0)), paths.selected(max(round_idx, 0))) if is_complete(p)]
    if not sources:
        raise FileNotFoundError(f"stage=draft trains on the policy's samples, but {paths.samples(max(round_idx, 0))} "
                                f"does not exist; run `python -m rsft.run stage=sample round={max(round_idx, 0)}` first")
    rows = concatenate_datasets([load_from_disk(str(p)).select_columns(["prompt", "completion_ids"]) for p in sources])
    sequences = []
    for prompt, completion in zip(rows["prompt"], rows["completion_ids"]):
        prefix = tokenizer(chat_text(tokenizer, prompt, cfg.data.get("system_prompt")), add_special_tokens=False)["input_ids"]
        sequences.append((prefix, list(completion) + [tokenizer.eos_token_id]))
    log.info("draft: imitating %s on %d completions from %s", teacher_name, len(sequences), [str(s) for s in sources])
    return teacher, tokenizer, sequences, teacher_name


def draft_output(cfg: DictConfig, paths: RunPaths):
    """round_XX/draft when round r's policy exists (it drafts for round r + 1), else runs/<run>/draft."""
    round_idx = int(cfg.round)
    return paths.round_draft(round_idx) if round_idx >= 0 and is_complete(paths.policy(round_idx)) else paths.draft


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


@torch.no_grad()
def measure_acceptance(policy, draft_model, head_ids, prompt_ids, eos_ids, cfg: DictConfig, gamma: int) -> dict:
    """Speculative sampling of held-out prompts: the verifier's acceptance statistics."""
    settings = SamplingSettings(max_new_tokens=int(cfg.sample.max_new_tokens), temperature=float(cfg.sample.temperature),
                                top_k=int(cfg.sample.top_k), top_p=float(cfg.sample.top_p),
                                batch_rows=int(cfg.sample.batch_rows), gamma=gamma, adaptive=False)
    sampler = Sampler(policy, settings, eos_ids,
                      draft=ModelDraft(draft_model, head_token_ids=head_ids))
    sampler.generate(prompt_ids, int(cfg.draft_model.eval_samples), seed=12345, progress=False)
    return sampler.stats.summary()


def run(cfg: DictConfig, tracker: Tracker | None = None):
    paths = RunPaths(cfg.paths.run_dir)
    dcfg = cfg.draft_model
    device = resolve_device(cfg.device)
    out = draft_output(cfg, paths)
    if should_skip(out, cfg.overwrite, "draft"):
        return out
    teacher, tokenizer, sequences, teacher_name = _teacher_and_data(cfg, paths, device)
    rng = random.Random(int(cfg.seed))
    rng.shuffle(sequences)
    n_heldout = max(1, int(len(sequences) * float(dcfg.heldout_fraction)))
    heldout, train = sequences[:n_heldout], sequences[n_heldout:]
    counts: dict[int, int] = {}
    for _, completion in train:
        for t in completion:
            counts[t] = counts.get(t, 0) + 1
    head = sorted(counts, key=lambda t: -counts[t])[: int(dcfg.head_tokens)]
    head_ids = sorted(set(head) | {tokenizer.eos_token_id})
    head_tensor = torch.tensor(head_ids, device=device)
    draft = build_draft_model(teacher, int(dcfg.num_layers), head_ids, int(cfg.seed)).to(device)
    untrained = copy.deepcopy(draft).eval()  # the same draft before training, for the acceptance baseline
    teacher.eval()

    def heldout_loss(model) -> float:
        model.eval()
        with torch.no_grad():
            losses = [float(distillation_loss(model, teacher, *b, head_tensor, bool(dcfg.distill)))
                      for b in _batches(heldout, int(dcfg.batch_size), random.Random(0), tokenizer.pad_token_id)]
        return sum(losses) / len(losses)

    before = heldout_loss(draft)
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=float(dcfg.learning_rate),
                                  weight_decay=0.0)
    steps = int(dcfg.epochs) * math.ceil(len(train) / int(dcfg.batch_size))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / max(steps, 1))
    started = time.perf_counter()
    losses = []
    with tqdm(total=steps, desc="distilling draft", unit="step") as bar:
        for _ in range(int(dcfg.epochs)):
            draft.train()
            for batch in _batches(train, int(dcfg.batch_size), rng, tokenizer.pad_token_id):
                loss = distillation_loss(draft, teacher, *(t.to(device) for t in batch), head_tensor, bool(dcfg.distill))
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
                optimizer.step()
                schedule.step()
                losses.append(loss.item())
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
    train_seconds = time.perf_counter() - started
    after = heldout_loss(draft)
    draft.eval()
    prompts = sorted({tuple(p) for p, _ in heldout})[: int(dcfg.eval_prompts)]
    gamma = int(dcfg.eval_gamma)
    eos_ids = eos_token_ids(teacher, tokenizer)
    accept_trained = measure_acceptance(teacher, draft, head_ids, [list(p) for p in prompts], eos_ids, cfg, gamma)
    accept_untrained = measure_acceptance(teacher, untrained, head_ids, [list(p) for p in prompts], eos_ids, cfg, gamma)
    metrics = {
        "teacher": teacher_name, "train_sequences": len(train), "heldout_sequences": len(heldout),
        "num_layers": int(dcfg.num_layers), "head_tokens": len(head_ids),
        "parameters": draft.num_parameters(), "policy_parameters": teacher.num_parameters(),
        "heldout_loss_before": round(before, 4), "heldout_loss_after": round(after, 4),
        "train_seconds": round(train_seconds, 1), "eval_gamma": gamma,
        "acceptance_rate": accept_trained["acceptance_rate"], "alpha": accept_trained["alpha"],
        "acceptance_per_position": accept_trained["acceptance_per_position"],
        "tokens_per_target_forward": accept_trained["tokens_per_target_forward"],
        "untrained_acceptance_rate": accept_untrained["acceptance_rate"],
    }
    log.info("draft: held-out loss %.3f -> %.3f, acceptance %.3f (untrained %.3f)", before, after,
             metrics["acceptance_rate"] or 0, metrics["untrained_acceptance_rate"] or 0)
    with atomic_artifact(out, {"stage": "draft", "round": int(cfg.round), "metrics": metrics,
                               "config": OmegaConf.to_container(cfg, resolve=True)}) as tmp:
        draft.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / HEAD_FILE).write_text(json.dumps({"head_token_ids": head_ids}))
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
    own = tracker is None
    tracker = tracker or Tracker(cfg, "draft")
    tracker.log({f"draft/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))},
                step=max(int(cfg.round), 0))
    if own:
        tracker.finish()
    return out
