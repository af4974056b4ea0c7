"""Scoring completions with a trained reward model (used by stage=score, and to evaluate training).

    scorer = load_scorer("runs/demo/reward", device="cpu")
    raw = scorer.score(prompts, completions)      # one float per (prompt, completion), input order
    z = scorer.normalise(raw)                     # (raw - mean) / std of the training responses

Inputs are built by reward.encoding.encode_pair, the function training uses. Batches are formed
from inputs sorted by length (longest first) so each batch pads little; results are put back in
input order. The saved folder holds the model and tokenizer (save_pretrained) and STATS_FILE:
the reward mean and std over the training responses, and the max_length the model was trained with.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from reward.encoding import encode_pair, pad_right
from reward.backbone import reward_forward
from reward.refusals import MissingInput
from reward.loading import load_reward_classifier, load_tokenizer

STATS_FILE = "reward_stats.json"
PLAIN_PROMPT = "{prompt}"
HH_PROMPT = "Human: {prompt}\n\nAssistant:"  # how reward.formats splits an HH-RLHF transcript's prompt


def prompt_template(data_format: str) -> str:
    """How a reward model trained on `data_format` pairs reads a policy's prompt: the HH-RLHF split keeps
    the "Human: ...\n\nAssistant:" frame in every training prompt, so a bare user prompt is framed the
    same way when a model trained on it scores sampled completions; other formats read the prompt as is."""
    return HH_PROMPT if data_format == "hh_rlhf" else PLAIN_PROMPT


class RewardScorer:
    def __init__(self, model, tokenizer, max_length: int, mean: float = 0.0, std: float = 1.0,
                 device: str | torch.device = "cpu", template: str = PLAIN_PROMPT):
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.mean = float(mean)
        self.std = float(std)
        self.device = torch.device(device)
        self.template = template

    def as_trained(self, prompts) -> list[str]:
        """A policy's prompts framed as this model's training prompts were (prompt_template)."""
        return [self.template.format(prompt=p) for p in prompts]

    @torch.no_grad()
    def score(self, prompts: list[str], completions: list[str], batch_size: int = 32,
              progress: bool = True, shard: tuple[int, int] = (0, 1)) -> list[float | None]:
        """Raw rewards, one per (prompt, completion), in input order.

        shard=(i, n): score only batches i, i + n, ... of the length-sorted order (None elsewhere), so
        that n processes together score exactly the batches, and get exactly the numbers, of one."""
        prompts, completions = list(prompts), list(completions)  # datasets columns are not lists
        if len(prompts) != len(completions):
            raise ValueError(f"score: {len(prompts)} prompts but {len(completions)} completions")
        inputs = [encode_pair(self.tokenizer, p, c, self.max_length)[0] for p, c in zip(prompts, completions)]
        order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i]))
        rewards: list[float | None] = [None] * len(inputs)
        index, count = shard
        starts = list(range(0, len(order), batch_size))[index::count]
        for start in tqdm(starts, desc="scoring", unit="batch", disable=not progress):
            rows = order[start:start + batch_size]
            input_ids, attention_mask = pad_right([inputs[i] for i in rows], self.tokenizer.pad_token_id)
            batch_rewards = reward_forward(self.model, input_ids.to(self.device), attention_mask.to(self.device))
            for i, r in zip(rows, batch_rewards.float().tolist()):
                rewards[i] = r
        return rewards

    def normalise(self, raw: list[float]) -> list[float]:
        """(raw - mean) / std with the statistics stored at training time."""
        return [(r - self.mean) / self.std for r in raw]


def save_reward_model(model, tokenizer, folder: str | Path, stats: dict) -> None:
    """save_pretrained model + tokenizer and STATS_FILE (mean, std, max_length, ...) into `folder`."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (Path(folder) / STATS_FILE).write_text(json.dumps(stats, indent=2))


def load_scorer(path: str | Path, device: str | torch.device = "cpu") -> RewardScorer:
    """A RewardScorer for a reward-model folder written by stage=reward (save_reward_model)."""
    path = Path(path)
    stats_file = path / STATS_FILE
    if not stats_file.is_file():
        raise MissingInput(f"{path} is not a trained reward model (no {STATS_FILE}); run "
                           f"`python -m rsft.run stage=reward` first")
    stats = json.loads(stats_file.read_text())
    what = f"trained reward model {path}"
    tokenizer = load_tokenizer(path, what)
    model = load_reward_classifier(path, what, dtype=torch.float32)  # damaged files, missing weights: refused
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return RewardScorer(model, tokenizer, stats["max_length"], stats["mean"], stats["std"], device,
                        stats.get("prompt_template", PLAIN_PROMPT))


def pairwise_accuracy(r_chosen: list[float], r_rejected: list[float], label_prob: list[float]) -> tuple[float, int]:
    """(accuracy, pairs counted): how often r(chosen) > r(rejected) agrees with label_prob > 0.5.

    Pairs labelled exactly 0.5 (ties) carry no direction and are left out.
    """
    counted = [(rc > rr) == (p > 0.5) for rc, rr, p in zip(r_chosen, r_rejected, label_prob) if p != 0.5]
    return sum(counted) / max(len(counted), 1), len(counted)


def score_pairs(scorer: RewardScorer, pairs, batch_size: int = 32, progress: bool = False):
    """(rewards of the chosen replies, rewards of the rejected replies) of a prompt/chosen/rejected dataset."""
    n = len(pairs)
    rewards = scorer.score(list(pairs["prompt"]) * 2, list(pairs["chosen"]) + list(pairs["rejected"]),
                           batch_size=batch_size, progress=progress)
    return rewards[:n], rewards[n:]
