"""scripts/reward_levers.py on tiny random reward models: its numbers against hand computations."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch
from omegaconf import OmegaConf

from reward.formats import pair_hash
from reward.backbone import build_tiny_reward_model
from reward.trained import (
    HH_PROMPT,
    PLAIN_PROMPT,
    load_scorer,
    save_reward_model,
    score_pairs,
)
from rsft.models import build_byte_tokenizer
from rsft.store import atomic_artifact
from rsft.bt_fit import PAIR_HASHES_FILE
from tests.conftest import REPO, TINY_REWARD

# (question, chosen reply, rejected reply, label_prob): one tie (0.5, left out) and one reversed label
PAIRS = [("how do I bake bread", "mix flour and water", "no", 1.0),
         ("what is the sun", "a star", "a lamp in the sky, obviously", 1.0),
         ("name a river", "the Nile", "stone", 0.9),
         ("is snow cold", "yes, it is frozen water", "it is hot", 0.5),
         ("say hello", "hi", "hello there, friend", 0.2),
         ("count to three", "one two three", "four", 1.0),
         ("what colour is grass", "green", "purple with dots", 1.0)]


def load_script():
    spec = importlib.util.spec_from_file_location("reward_levers", REPO / "scripts" / "reward_levers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def levers():
    return load_script()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Three tiny reward models under <tmp>/runs/<name>/reward and an HH-RLHF transcript file (built once:
    only test_scores_are_cached_per_model_and_selection caches beside the models, the others elsewhere)."""
    torch.set_num_threads(1)
    tmp_path = tmp_path_factory.mktemp("levers")
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"chosen": f"\n\nHuman: {q}\n\nAssistant: {c}",
                                        "rejected": f"\n\nHuman: {q}\n\nAssistant: {r}", "label_prob": p}) + "\n"
                            for q, c, r, p in PAIRS))
    tokenizer = build_byte_tokenizer()
    stats = {"a": (0.0, 1.0, HH_PROMPT), "b": (0.3, 2.5, HH_PROMPT), "plain": (0.0, 1.0, PLAIN_PROMPT)}
    folders = {}
    for seed, (name, (mean, std, frame)) in enumerate(stats.items()):
        model = build_tiny_reward_model(OmegaConf.create({**TINY_REWARD, "seed": seed}), tokenizer).eval()
        folders[name] = tmp_path / "runs" / name / "reward"
        folders[name].parent.mkdir(parents=True)
        with atomic_artifact(folders[name], {"stage": "reward"}) as tmp:  # as stage=reward writes it
            save_reward_model(model, tokenizer, tmp, {"mean": mean, "std": std, "max_length": 64,
                                                      "prompt_template": frame})
            if name == "b":  # b was trained on two of the evaluated pairs
                trained = [pair_hash(f"Human: {q}\n\nAssistant:", c, r) for q, c, r, _ in PAIRS[:2]]
                (tmp / PAIR_HASHES_FILE).write_text(json.dumps({"train": trained, "heldout": []}))
    return data, folders, stats


def hand_scores(folder, data_pairs):
    """Raw rewards of the chosen and rejected replies, scored directly."""
    return score_pairs(load_scorer(folder, "cpu"), data_pairs)


def run(levers, data, *args):
    return levers.main(["--data", str(data), "--parts", "1", "--part", "0", "--threads", "1", "--device", "cpu",
                        *args])


def test_accuracy_ensemble_and_self_difference_match_hand_computations(levers, setup, tmp_path):
    data, folders, stats = setup
    out = run(levers, data, "--model", f"a={folders['a']}", "--model", f"same={folders['a']}",
              "--model", f"ab={folders['a']},{folders['b']}", "--out", str(tmp_path / "out.json"),
              "--cache-dir", str(tmp_path / "cache"))
    assert json.loads((tmp_path / "out.json").read_text())["models"].keys() == {"a", "same", "ab"}
    pairs = levers.select_pairs(data, 1, 0, 0, None)
    labels = list(pairs["label_prob"])
    assert out["pairs"] == len(PAIRS) and out["ties_left_out"] == 1 and out["baseline"] == "a"

    def accuracy(chosen, rejected):  # pairwise_accuracy's rule, written out: ties (0.5) left out
        right = [(c > r) == (p > 0.5) for c, r, p in zip(chosen, rejected, labels) if p != 0.5]
        return sum(right) / len(right)

    raw = {name: hand_scores(folders[name], pairs) for name in ("a", "b")}
    z = {name: [[(x - stats[name][0]) / stats[name][1] for x in side] for side in raw[name]] for name in raw}
    model_a = out["models"]["a"]
    assert model_a["accuracy"]["value"] == pytest.approx(accuracy(*raw["a"]))
    assert model_a["accuracy"]["pairs"] == len(PAIRS) - 1
    assert model_a["accuracy"]["low"] <= model_a["accuracy"]["value"] <= model_a["accuracy"]["high"]
    assert model_a["difference_vs_baseline"] is None

    ensemble = out["models"]["ab"]
    for side, rewards in enumerate((ensemble["rewards"]["chosen"], ensemble["rewards"]["rejected"])):
        assert rewards == pytest.approx([(x + y) / 2 for x, y in zip(z["a"][side], z["b"][side])], abs=1e-5)
    assert ensemble["accuracy"]["value"] == pytest.approx(accuracy(*[[(x + y) / 2 for x, y in zip(z["a"][s], z["b"][s])]
                                                                      for s in (0, 1)]))
    assert [m["trained_on_evaluated_pairs"] for m in ensemble["members"]] == [None, 2]  # a records no training pairs

    same = out["models"]["same"]["difference_vs_baseline"]
    assert (same["value"], same["low"], same["high"]) == (0.0, 0.0, 0.0)
    assert out["models"]["ab"]["difference_vs_baseline"]["value"] == pytest.approx(
        ensemble["accuracy"]["value"] - model_a["accuracy"]["value"])


def test_scores_are_cached_per_model_and_selection(levers, setup, monkeypatch):
    data, folders, _ = setup
    first = run(levers, data, "--model", f"a={folders['a']}")
    cache = folders["a"].parent / "reward_scores"
    assert len(list(cache.glob("*.json"))) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("scored again although the cache holds these pairs")

    monkeypatch.setattr(levers, "load_scorer", refuse)
    monkeypatch.setattr(levers, "RUNS_ROOT", folders["a"].parents[1])
    again = run(levers, data, "--model", "a=a")  # a run name, resolved under the runs root
    assert again["models"]["a"]["members"][0]["from_cache"]
    assert again["models"]["a"]["rewards"] == first["models"]["a"]["rewards"]
    monkeypatch.undo()
    fewer = run(levers, data, "--model", f"a={folders['a']}", "--limit", "3")
    assert fewer["pairs"] == 3 and not fewer["models"]["a"]["members"][0]["from_cache"]
    assert fewer["models"]["a"]["rewards"]["chosen"] == pytest.approx(first["models"]["a"]["rewards"]["chosen"][:3],
                                                                      abs=1e-5)
    assert len(list(cache.glob("*.json"))) == 2


@pytest.mark.parametrize("args, expected", [
    (["--model", "nonsense"], "expected NAME=PATH"),
    (["--model", "x=/no/such/folder"], "neither a reward-model folder"),
    (["--model", "x={a}", "--model", "x={b}"], "given twice"),
    (["--model", "x={a},{plain}"], "different prompt frames"),
    (["--model", "x={a},{a}"], "listed twice"),
    (["--model", "x={a}", "--baseline", "y"], "--baseline 'y'"),
])
def test_bad_arguments_are_named(levers, setup, capsys, args, expected):
    data, folders, _ = setup
    with pytest.raises(SystemExit) as stop:
        run(levers, data, *[a.format(**folders) for a in args])
    assert stop.value.code == 2
    assert expected in capsys.readouterr().err


def test_help(levers, capsys):
    with pytest.raises(SystemExit) as stop:
        levers.main(["--help"])
    assert stop.value.code == 0 and "usage:" in capsys.readouterr().out
