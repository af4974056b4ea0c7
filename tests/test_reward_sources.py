"""reward.sources: trained, pretrained, function and combined rewards behind one interface.

Everything is offline and tiny: sequence-classification models are built from a config with random
weights and saved with their tokenizer; reward functions live in tests/reward_fixtures/verifiers.py.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import shutil
import statistics
import sys
from pathlib import Path

import pytest
import torch

from rsft.errors import ConfigError, InputError, MissingInput
from rsft.models import build_byte_tokenizer
from reward.sources import (
    Combination,
    FunctionReward,
    PretrainedReward,
    RewardSource,
    TrainedReward,
    checked_scores,
    combine,
)
from reward.specs import open_source

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "reward_fixtures"
VERIFIERS = "tests/reward_fixtures/verifiers.py"

PROMPTS = ["What is 2+2?", "Name a colour.", "Say hi", "Count to three", "Why?"]
COMPLETIONS = ["4", "A deep shade of blue, like the sea at night.", "hi there", "one two three", ""]


def tiny_llama(tokenizer, num_labels=1, seed=0):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=32, max_position_embeddings=2048,
                         num_labels=num_labels, pad_token_id=tokenizer.pad_token_id)
    return LlamaForSequenceClassification(config).eval()


def save(model, tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Folders: `chat` (byte tokenizer with a ChatML template), `plain` (the same model and tokenizer
    without a template), `bert` (a WordPiece text-pair model), `heads` (three labels)."""
    root = tmp_path_factory.mktemp("reward_models")
    chat_tokenizer = build_byte_tokenizer()
    model = tiny_llama(chat_tokenizer)
    folders = {"chat": save(model, chat_tokenizer, root / "chat")}
    plain_tokenizer = build_byte_tokenizer()
    plain_tokenizer.chat_template = None
    folders["plain"] = save(model, plain_tokenizer, root / "plain")
    folders["heads"] = save(tiny_llama(chat_tokenizer, num_labels=3, seed=1), chat_tokenizer, root / "heads")

    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    vocab = root / "vocab.txt"
    characters = "abcdefghijklmnopqrstuvwxyz0123456789.,?!+"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *characters,
                                *(f"##{c}" for c in characters)]))
    bert_tokenizer = BertTokenizer(str(vocab), model_max_length=64)
    torch.manual_seed(2)
    bert = BertForSequenceClassification(BertConfig(vocab_size=len(bert_tokenizer), hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32,
                                                    max_position_embeddings=64, num_labels=1)).eval()
    folders["bert"] = save(bert, bert_tokenizer, root / "bert")
    return folders


def plain_transformers(folder: Path, prompt: str, completion: str, chat: bool, label: int = 0) -> float:
    """The reward as one would compute it by hand with transformers, one unpadded input at a time."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt},
                                              {"role": "assistant", "content": completion}], tokenize=False)
        encoded = tokenizer(text, add_special_tokens=False, return_tensors="pt")
    else:
        encoded = tokenizer(prompt, completion, return_tensors="pt")
    with torch.no_grad():
        return model(**encoded).logits[0, label].item()


# ---------------------------------------------------------------- pretrained


@pytest.mark.parametrize("name,chat", [("chat", True), ("plain", False), ("bert", False)])
def test_pretrained_scores_what_plain_transformers_gives(models, name, chat):
    source = PretrainedReward(str(models[name]))
    assert source.chat is chat
    scores = source.score(PROMPTS, COMPLETIONS, batch_size=2, progress=False)
    expected = [plain_transformers(models[name], p, c, chat) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert scores == pytest.approx(expected, abs=1e-6)
    assert source.truncated == 0 and source.scored == len(PROMPTS)


def test_the_two_renderings_differ_as_documented(models):
    chat, plain = PretrainedReward(str(models["chat"])), PretrainedReward(str(models["plain"]))
    tokenizer = chat.tokenizer
    rendered_chat = chat.render("hi", "yo")["input_ids"]
    assert tokenizer.decode(rendered_chat) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    assert plain.render("hi", "yo")["input_ids"] == tokenizer("hi", "yo")["input_ids"] == tokenizer("hiyo")["input_ids"]
    assert chat.score(["hi"], ["yo"], progress=False) != plain.score(["hi"], ["yo"], progress=False)
    # a text-pair tokenizer's segments reach the model
    bert = PretrainedReward(str(models["bert"]))
    assert bert.render("a b", "c d") == {"input_ids": [2, 5, 6, 3, 7, 8, 3], "token_type_ids": [0, 0, 0, 0, 1, 1, 1]}


def test_max_length_from_tokenizer_or_config_or_option(models):
    assert PretrainedReward(str(models["bert"])).max_length == 64  # the tokenizer's model_max_length
    assert PretrainedReward(str(models["chat"])).max_length == 2048  # unset tokenizer: max_position_embeddings
    assert PretrainedReward(str(models["chat"]), max_length=100).max_length == 100
    with pytest.raises(ConfigError, match="max_length"):
        PretrainedReward(str(models["chat"]), max_length=0)


def test_most_inputs_truncated_warns_with_the_count(models, caplog):
    source = PretrainedReward(str(models["chat"]), max_length=30)
    with caplog.at_level(logging.WARNING, logger="reward.sources"):
        scores = source.score(PROMPTS, COMPLETIONS, batch_size=2, progress=False)
    lengths = [len(source.render(p, c)["input_ids"]) for p, c in zip(PROMPTS, COMPLETIONS)]
    cut = sum(n > 30 for n in lengths)
    assert cut * 2 > len(PROMPTS) and source.truncated == cut
    assert f"{cut} of {len(PROMPTS)} inputs were longer than max_length=30" in caplog.text
    # a cut input is its first max_length tokens, scored as such
    long = max(range(len(PROMPTS)), key=lambda i: lengths[i])
    full = source.render(PROMPTS[long], COMPLETIONS[long])["input_ids"]
    with torch.no_grad():
        expected = source.model(input_ids=torch.tensor([full[:30]])).logits[0, 0].item()
    assert scores[long] == pytest.approx(expected, abs=1e-6)

    caplog.clear()
    source = PretrainedReward(str(models["chat"]), max_length=40)
    with caplog.at_level(logging.WARNING, logger="reward.sources"):
        source.score(PROMPTS, COMPLETIONS, progress=False)
    assert 0 < source.truncated * 2 <= len(PROMPTS) and "were longer" not in caplog.text  # a minority: no warning


def test_multi_head_needs_a_head(models):
    with pytest.raises(ConfigError) as refused:
        PretrainedReward(str(models["heads"]))
    message = str(refused.value)
    assert str(models["heads"]) in message and "num_labels=3" in message and "head=<0..2>" in message
    with pytest.raises(ConfigError, match="head=3 is not one of its 3 output heads"):
        PretrainedReward(str(models["heads"]), head=3)
    source = PretrainedReward(str(models["heads"]), head=1)
    scores = source.score(PROMPTS, COMPLETIONS, progress=False)
    expected = [plain_transformers(models["heads"], p, c, True, label=1) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert scores == pytest.approx(expected, abs=1e-6)
    assert source.identity()["head"] == 1


def test_shards_together_score_what_one_process_does(models):
    source = PretrainedReward(str(models["chat"]))
    whole = source.score(PROMPTS, COMPLETIONS, batch_size=2, progress=False)
    parts = [source.score(PROMPTS, COMPLETIONS, batch_size=2, progress=False, shard=(i, 2)) for i in range(2)]
    assert all(sum(part[i] is not None for part in parts) == 1 for i in range(len(PROMPTS)))
    assert [next(part[i] for part in parts if part[i] is not None) for i in range(len(PROMPTS))] == whole


def test_calibration_sets_the_scale(models):
    source = PretrainedReward(str(models["chat"]))
    assert source.calibration is None and (source.mean, source.std) == (0.0, 1.0)
    raw = source.score(PROMPTS, COMPLETIONS, progress=False)
    assert source.normalise(raw) == raw
    record = source.calibrate(PROMPTS, COMPLETIONS, source="five test rows")
    mean, std = statistics.fmean(raw), statistics.pstdev(raw)
    assert record == source.calibration == {"rows": 5, "mean": pytest.approx(mean), "std": pytest.approx(std),
                                            "source": "five test rows"}
    assert source.normalise(raw + [None]) == pytest.approx([(r - mean) / std for r in raw] + [None])


def test_calibration_refuses_a_set_it_cannot_scale_by():
    source = FunctionReward(f"{VERIFIERS}:constant")
    with pytest.raises(InputError, match="all 5 scores are 3"):
        source.calibrate(PROMPTS, COMPLETIONS, source="constant rows")
    with pytest.raises(InputError, match="at least two"):
        FunctionReward(f"{VERIFIERS}:none_when_empty").calibrate(["p"], [""], source="one row")


def test_pretrained_identity_follows_the_weights(models, tmp_path):
    folder = Path(shutil.copytree(models["chat"], tmp_path / "copy"))
    first = PretrainedReward(str(folder)).identity()
    assert first["kind"] == "pretrained" and first["head"] is None and "model.safetensors" in first["files"]
    assert PretrainedReward(str(folder)).identity() == first
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    with torch.no_grad():
        model.score.weight.add_(1.0)
    model.save_pretrained(folder)
    assert PretrainedReward(str(folder)).identity() != first


def test_pretrained_missing_model_or_tokenizer(models, tmp_path):
    with pytest.raises((MissingInput, InputError), match="pretrained reward model"):
        PretrainedReward(str(tmp_path / "nowhere-such-model"))
    (tmp_path / "weights_only").mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(models["chat"] / name, tmp_path / "weights_only" / name)
    with pytest.raises(InputError, match="tokenizer"):
        PretrainedReward(str(tmp_path / "weights_only"))


def without_weights(folder: Path, *keys: str) -> Path:
    """The checkpoint at `folder` rewritten without the weights `keys` (a folder whose head was lost)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    for key in keys:
        del weights[key]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_pretrained_refuses_a_checkpoint_without_its_scoring_head(models, tmp_path):
    """transformers would start the missing head at random (its load report says `score.weight | MISSING`) and
    every score would be noise: refused, naming the folder, the weights and what to do."""
    folder = without_weights(Path(shutil.copytree(models["chat"], tmp_path / "headless")), "score.weight")
    for open_it in (lambda: PretrainedReward(str(folder)), lambda: open_source(str(folder)),
                    lambda: open_source(f"pretrained:{folder}", head=0)):
        with pytest.raises(InputError) as refused:
            open_it()
        message = str(refused.value)
        assert str(folder) in message and "score.weight" in message and "at random" in message
        assert "complete checkpoint" in message and "\n" not in message
    # any other weight lost is refused too
    body = without_weights(Path(shutil.copytree(models["chat"], tmp_path / "bodyless")),
                           "model.layers.0.mlp.up_proj.weight")
    with pytest.raises(InputError, match=r"lacks 1 weight\(s\).*model\.layers\.0\.mlp\.up_proj\.weight"):
        PretrainedReward(str(body))


def save_language_model(folder: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_byte_tokenizer()
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=32, max_position_embeddings=128,
                         pad_token_id=tokenizer.pad_token_id)
    return save(LlamaForCausalLM(config), tokenizer, folder)


def test_pretrained_refuses_a_language_model_as_such(tmp_path):
    """A causal LM's folder loads as a 2-label classifier under a random head: refused as a language model
    before any head= advice, with head= given too, and with what to do instead."""
    folder = save_language_model(tmp_path / "lm")
    for options in ({}, {"head": 0}, {"head": 1}):
        with pytest.raises(InputError) as refused:
            open_source(f"pretrained:{folder}", **options)
        message = str(refused.value)
        assert "LlamaForCausalLM, a language model, not a reward (sequence-classification) model" in message
        assert str(folder) in message and "head=<" not in message
        assert f"stage=reward reward=hf reward.backbone.name_or_path={folder}" in message
    # a checkpoint that names no architecture and has no classification head is a language model's too
    import json

    config = json.loads((folder / "config.json").read_text())
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="a model without a classification head, a language model"):
        PretrainedReward(str(folder))


@pytest.mark.parametrize("file,damage,named", [
    ("model.safetensors", lambda b: b[:len(b) // 2], "not a complete safetensors file"),
    ("model.safetensors", lambda b: b[:5], "not a complete safetensors file"),
    ("config.json", lambda b: b[:40], "not valid JSON"),
    ("tokenizer.json", lambda b: b[:100], "not valid JSON"),
    ("tokenizer_config.json", lambda b: b[:30], "not valid JSON"),
])
def test_a_damaged_file_of_a_reward_folder_is_named_not_a_traceback(models, tmp_path, file, damage, named):
    folder = Path(shutil.copytree(models["chat"], tmp_path / "damaged"))
    (folder / file).write_bytes(damage((folder / file).read_bytes()))
    with pytest.raises(InputError) as refused:
        open_source(str(folder) if file != "config.json" else f"pretrained:{folder}")
    message = str(refused.value)
    assert f"{folder / file} is damaged: {named}" in message and "save the model" in message
    assert "\n" not in message


def test_a_trained_reward_folder_is_loaded_whole_or_refused(tmp_path):
    from reward.backbone import load_trained_reward_model
    from reward.trained import load_scorer, save_reward_model

    tokenizer = build_byte_tokenizer()
    folder = tmp_path / "reward"
    save_reward_model(tiny_llama(tokenizer), tokenizer, folder, {"mean": 0.0, "std": 1.0, "max_length": 64})
    assert load_scorer(folder).score(PROMPTS[:1], COMPLETIONS[:1], progress=False)
    without_weights(folder, "score.weight")
    for load in (load_scorer, load_trained_reward_model):
        with pytest.raises(InputError, match=f"trained reward model {folder}: .*score.weight"):
            load(folder)
    (folder / "model.safetensors").write_bytes(b"\0" * 4)
    with pytest.raises(InputError, match="model.safetensors is damaged"):
        TrainedReward(folder)


# ---------------------------------------------------------------- trained


def test_trained_frames_prompts_and_records_its_files(tmp_path):
    from reward.trained import HH_PROMPT, load_scorer, save_reward_model

    tokenizer = build_byte_tokenizer()
    folder = tmp_path / "reward"
    save_reward_model(tiny_llama(tokenizer), tokenizer, folder,
                      {"mean": 0.5, "std": 2.0, "max_length": 64, "prompt_template": HH_PROMPT})
    source = open_source(str(folder))
    assert isinstance(source, TrainedReward) and (source.mean, source.std) == (0.5, 2.0)
    scorer = load_scorer(folder)
    expected = scorer.score([HH_PROMPT.format(prompt=p) for p in PROMPTS], COMPLETIONS, progress=False)
    assert source.score(PROMPTS, COMPLETIONS, progress=False) == expected
    assert source.score(PROMPTS, COMPLETIONS, batch_size=2, progress=False, shard=(1, 2)) == \
        scorer.score(scorer.as_trained(PROMPTS), COMPLETIONS, batch_size=2, progress=False, shard=(1, 2))
    identity = source.identity()
    assert identity["kind"] == "trained" and "reward_stats.json" in identity["files"]
    assert isinstance(open_source(f"trained:{folder}"), TrainedReward)
    with torch.no_grad():  # a damaged model: its scores are refused, naming it, before any stage uses them
        source.scorer.model.score.weight.fill_(float("nan"))
    with pytest.raises(InputError, match=r"trained reward .*reward: row \d+: returned nan; expected a finite float"):
        source.score(PROMPTS, COMPLETIONS, progress=False)


# ---------------------------------------------------------------- function


@pytest.fixture
def at_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(FIXTURES))


def test_function_forms_and_columns(at_repo):
    from_module = open_source("function:verifiers:exact_match")
    from_path = open_source(f"function:{VERIFIERS}:exact_match")
    rows = [{"prompt": p, "reference": ref, "id": i} for i, (p, ref) in enumerate(zip(PROMPTS, ["4", "red", None, "x", ""]))]
    for source in (from_module, from_path):
        assert isinstance(source, FunctionReward)
        assert source.score(PROMPTS, COMPLETIONS, rows, batch_size=2, progress=False) == [1.0, 0.0, None, 0.0, 1.0]
        assert source.unscorable == 1
    # every extra column reaches a function that takes **columns, in batches, prompt/completion not among them
    import verifiers

    verifiers.SEEN.clear()
    length = FunctionReward("verifiers:length")
    assert length.score(PROMPTS, COMPLETIONS, rows, batch_size=3, progress=False) == [float(len(c)) for c in COMPLETIONS]
    assert [sorted(call) for call in verifiers.SEEN] == [["completions", "id", "prompts", "reference"]] * 2
    assert verifiers.SEEN[1] == {"prompts": PROMPTS[3:], "completions": COMPLETIONS[3:], "reference": ["x", ""],
                                 "id": [3, 4]}


def test_function_wanting_a_column_the_rows_lack(at_repo):
    with pytest.raises(InputError, match=r"wants the column\(s\) \['reference'\]"):
        FunctionReward("verifiers:exact_match").score(PROMPTS, COMPLETIONS, [{"id": 1}] * 5, progress=False)


def test_unscorable_rows_are_counted_and_warned_about(at_repo, caplog):
    source = FunctionReward("verifiers:none_when_empty")
    with caplog.at_level(logging.WARNING, logger="reward.sources"):
        assert source.score(PROMPTS, COMPLETIONS, progress=False) == [1.0, 1.0, 1.0, 1.0, None]
    assert source.unscorable == 1 and "1 of 5 rows not scorable" in caplog.text
    # shards: rows i, i + n, ...
    assert source.score(PROMPTS, COMPLETIONS, progress=False, shard=(1, 2)) == [None, 1.0, None, 1.0, None]
    assert source.unscorable == 0


@pytest.mark.parametrize("function,pattern", [
    ("raises", r"raised on the batch of 2 rows from row 2: RuntimeError: the verifier broke"),
    ("nan_on_three", r"row 3: returned nan"),
    ("huge_on_three", r"row 3: returned a number beyond a float's range \(about 1.8e308\); expected a finite float"),
    ("string_on_three", r"row 3: returned 'high' \(str\)"),
    ("one_short", r"returned 1 values for the 2 rows from row 2"),
])
def test_bad_function_outputs_name_the_function_and_the_row(at_repo, function, pattern):
    spec = f"{VERIFIERS}:{function}"
    with pytest.raises(InputError, match=pattern) as refused:
        FunctionReward(spec).score(PROMPTS, COMPLETIONS, batch_size=2, progress=False)
    assert spec in str(refused.value)
    if function == "raises":
        assert isinstance(refused.value.__cause__, RuntimeError)


@pytest.mark.parametrize("spec,pattern", [
    ("no_such_module_here:score", "no module 'no_such_module_here'"),
    ("verifiers:missing", "has no 'missing'"),
    ("verifiers:NOT_A_FUNCTION", "is a int, not a function"),
    ("tests/reward_fixtures/absent.py:score", "no file"),
    ("verifiers", "expected function:<module>:<function>"),
])
def test_missing_module_or_function(at_repo, spec, pattern):
    with pytest.raises(ConfigError, match=pattern):
        FunctionReward(spec)


def test_function_identity_follows_its_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIXTURES / "verifiers.py", tmp_path / "mine.py")
    first = open_source("function:mine.py:count_a").identity()
    assert first["kind"] == "function" and first["spec"] == "mine.py:count_a" and first["qualname"] == "count_a"
    assert first["file"]["size"] == (tmp_path / "mine.py").stat().st_size
    assert open_source("function:mine.py:count_a").identity() == first
    (tmp_path / "mine.py").write_text((tmp_path / "mine.py").read_text().replace('c.count("a")', 'c.count("b")'))
    changed = open_source("function:mine.py:count_a")
    assert changed.identity() != first
    assert changed.score(["p"], ["abb"], progress=False) == [2.0]  # the new file was imported, not a cached one


def test_function_identity_follows_the_local_modules_it_imports(tmp_path, monkeypatch):
    """The modules beside a function's file that it imports, at any depth and wherever the import is (inside
    the function too), are digested and named in its identity; the standard library's, installed packages' and
    rsft's are not. An edited helper changes the identity, and the next load scores with the new helper."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("bonus_helpers", "task_rules", "task_rules.deep", "task_rules.deeper"):  # imported by this test
        monkeypatch.setitem(sys.modules, name, None)
        del sys.modules[name]
    (tmp_path / "tasks.py").write_text("import json, math\nimport numpy\n"
                                       "from reward.sources import checked_scores\n"
                                       "from bonus_helpers import bonus\n\n"
                                       "def score(prompts, completions):\n"
                                       "    from task_rules.deep import weight\n"
                                       "    return [bonus(c) * weight() for c in completions]\n")
    (tmp_path / "bonus_helpers.py").write_text("def bonus(c):\n    return float(len(c))\n")
    (tmp_path / "task_rules").mkdir()
    (tmp_path / "task_rules" / "__init__.py").write_text("")
    (tmp_path / "task_rules" / "deep.py").write_text("from .deeper import FACTOR\n\ndef weight():\n    return FACTOR\n")
    (tmp_path / "task_rules" / "deeper.py").write_text("FACTOR = 1.0\n")
    source = open_source("function:tasks.py:score")
    first = source.identity()
    assert sorted(first["imports"]) == ["bonus_helpers.py", "task_rules/__init__.py", "task_rules/deep.py",
                                        "task_rules/deeper.py"]
    assert source.imports == sorted(tmp_path / name for name in first["imports"])
    assert source.score(["p"], ["abc"], progress=False) == [3.0]
    assert open_source("function:tasks.py:score").identity() == first
    (tmp_path / "task_rules" / "deeper.py").write_text("FACTOR = 10.0\n")  # two imports away, relative
    changed = open_source("function:tasks.py:score")
    assert changed.identity()["imports"]["task_rules/deeper.py"] != first["imports"]["task_rules/deeper.py"]
    assert changed.identity()["file"] == first["file"]
    assert changed.score(["p"], ["abc"], progress=False) == [30.0]  # the edited module, imported again
    (tmp_path / "bonus_helpers.py").write_text("def bonus(c):\n    return 2.0\n")
    assert open_source("function:tasks.py:score").score(["p"], ["abc"], progress=False) == [20.0]


def test_a_function_without_local_imports_keeps_the_identity_it_had(tmp_path, monkeypatch):
    """No `imports` key where there is nothing to digest beside the file: artifacts scored before the key
    existed still match."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIXTURES / "verifiers.py", tmp_path / "mine.py")
    identity = open_source("function:mine.py:count_a").identity()
    assert set(identity) == {"kind", "spec", "qualname", "file"}


def test_checked_scores_names_rows():
    assert checked_scores([1, None, 2.5], 3, "f") == [1.0, None, 2.5]
    with pytest.raises(InputError, match="f: row 12: returned True"):
        checked_scores([1.0, True], 2, "f", row_ids=[10, 12])


@pytest.mark.parametrize("huge", [10 ** 400, -10 ** 400])
def test_an_integer_beyond_a_floats_range_is_refused_as_infinity_is(huge):
    """float(10**400) raises OverflowError; the refusal names the row, like inf's, without the 400 digits."""
    with pytest.raises(InputError, match=r"^f: row 12: returned a number beyond a float's range .*; expected a "
                                         r"finite float, or None \(not scorable\)$") as refused:
        checked_scores([1, huge], 2, "f", row_ids=[10, 12])
    assert "0" * 20 not in str(refused.value)


# ---------------------------------------------------------------- combination


class Fixed(RewardSource):
    """A source with given raw scores and scale."""

    kind = "fixed"

    def __init__(self, raw, mean, std, name):
        self.raw, self.mean, self.std, self.name = raw, mean, std, name

    def score(self, prompts, completions, rows=None, batch_size=32, progress=True, shard=(0, 1)):
        return [self.raw[c] for c in completions]

    def identity(self):
        return {"kind": "fixed", "name": self.name}


def test_combination_by_hand(at_repo):
    length = FunctionReward("verifiers:length")   # raw: len(completion)
    count_a = FunctionReward("verifiers:count_a")  # raw: how many "a"
    length.mean, length.std = 4.0, 2.0
    count_a.mean, count_a.std = 1.0, 0.5
    completions = ["aaaa", "bb", "abcdef"]  # length z: 0, -1, 1; count_a z: 6, -2, 0
    prompts = ["p"] * 3
    z_length, z_count = [0.0, -1.0, 1.0], [6.0, -2.0, 0.0]
    parts = {"length": (length, 1.0), "a": (count_a, 3.0)}
    summed = combine(parts, "sum")
    assert isinstance(summed, Combination)
    assert summed.score(prompts, completions, progress=False) == [x + 3 * y for x, y in zip(z_length, z_count)]
    assert summed.components() == {"length": [4.0, 2.0, 6.0], "a": [4.0, 0.0, 1.0]}
    assert combine(parts, "mean").score(prompts, completions, progress=False) == \
        [(x + 3 * y) / 4 for x, y in zip(z_length, z_count)]
    assert combine(parts, "min").score(prompts, completions, progress=False) == [0.0, -2.0, 0.0]
    assert (summed.mean, summed.std) == (0.0, 1.0)
    identity = summed.identity()
    assert identity["kind"] == "combination" and identity["mode"] == "sum"
    assert identity["components"]["a"]["weight"] == 3.0 and identity["components"]["a"]["qualname"] == "count_a"
    assert identity["components"]["length"]["std"] == 2.0


def test_a_none_in_any_component_makes_the_row_none(at_repo):
    both = combine({"ok": (FunctionReward("verifiers:count_a"), 1.0),
                    "maybe": (FunctionReward("verifiers:none_when_empty"), 1.0)}, "sum")
    assert both.score(["p", "p"], ["a", ""], progress=False) == [2.0, None]
    assert both.components() == {"ok": [1.0, 0.0], "maybe": [1.0, None]} and both.unscorable == 1


def test_a_mean_never_reverses_the_ranking_of_its_weighted_sum():
    """A mean is the weighted sum over a positive number: the same order of rows. Weights summing below 0 would
    divide by a negative number and put the worst row first, so they are refused; a penalty (a negative weight)
    with a positive sum is a mean like any other."""
    a = Fixed({"x": 1.0, "y": 2.0, "z": 3.0}, 0.0, 1.0, "a")
    b = Fixed({"x": 3.0, "y": 1.0, "z": 0.0}, 0.0, 1.0, "b")
    rows = ["x", "y", "z"]
    parts = {"a": (a, 2.0), "b": (b, -1.0)}  # sum 1: a mean
    summed = combine(parts, "sum").score(["p"] * 3, rows, progress=False)
    mean = combine(parts, "mean").score(["p"] * 3, rows, progress=False)
    assert mean == summed == [-1.0, 3.0, 6.0]
    order = sorted(range(3), key=lambda i: summed[i])
    assert sorted(range(3), key=lambda i: mean[i]) == order
    # weights -2 and 1: the weighted sum ranks x best; divided by the sum, -1, the mean would rank x worst
    assert combine({"a": (a, -2.0), "b": (b, 1.0)}, "sum").score(["p"] * 3, rows, progress=False) == [1.0, -3.0, -6.0]
    with pytest.raises(ConfigError, match="sum to -1"):
        combine({"a": (a, -2.0), "b": (b, 1.0)}, "mean")


def test_combination_shards_give_every_component_the_same_rows():
    a = Fixed({"x": 1.0, "y": 2.0, "z": 3.0}, 0.0, 1.0, "a")
    b = Fixed({"x": 10.0, "y": 20.0, "z": 30.0}, 10.0, 10.0, "b")
    combo = combine({"a": (a, 1.0), "b": (b, 2.0)}, "sum")
    whole = combo.score(["p"] * 3, ["x", "y", "z"], progress=False)
    assert whole == [1.0, 4.0, 7.0]
    parts = [combo.score(["p"] * 3, ["x", "y", "z"], progress=False, shard=(i, 2)) for i in range(2)]
    assert parts == [[1.0, None, 7.0], [None, 4.0, None]]


def test_combination_refusals():
    a = Fixed({}, 0.0, 1.0, "a")
    with pytest.raises(ConfigError, match="mode='max'"):
        combine({"a": (a, 1.0)}, "max")
    with pytest.raises(ConfigError, match="no components"):
        combine({}, "sum")
    with pytest.raises(ConfigError, match=r"the weights \(a: 1, b: -1\) sum to 0"):
        combine({"a": (a, 1.0), "b": (a, -1.0)}, "mean")
    with pytest.raises(ConfigError, match="weights.*sum to -2.*ranking reversed.*mode=sum"):
        combine({"a": (a, 1.0), "b": (a, -3.0)}, "mean")
    with pytest.raises(ConfigError, match="weight=nan"):
        combine({"a": (a, math.nan)}, "sum")


# ---------------------------------------------------------------- open_source


def test_open_source_forms(models, at_repo, tmp_path):
    assert isinstance(open_source(str(models["chat"])), PretrainedReward)  # config.json, no reward_stats.json
    source = open_source(f"pretrained:{models['heads']}", head=2, max_length=50)
    assert (source.head, source.max_length) == (2, 50)
    assert isinstance(open_source(f"pretrained:{models['chat']}", head=None, max_length=None), PretrainedReward)
    with pytest.raises(ConfigError, match="head do not apply to a function source"):
        open_source("function:verifiers:count_a", head=1)
    with pytest.raises(ConfigError, match="trained:<folder>.*pretrained:<folder or hub id>.*function:"):
        open_source("bogus-reward")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="neither reward_stats.json"):
        open_source(str(tmp_path / "empty"))
    with pytest.raises(MissingInput, match="stage=reward"):
        open_source(f"trained:{tmp_path / 'empty'}")


def test_http_urls_go_to_rsft_reward_http():
    if importlib.util.find_spec("reward.http_client") is None:
        with pytest.raises(ConfigError, match="reward.http_client"):
            open_source("http://localhost:8000/score")
        return
    from reward.http_client import HttpReward, ServerUnreachable

    # a closed local port: the source is built (options passed through), and its first health check fails
    with pytest.raises(ServerUnreachable):
        open_source("http://127.0.0.1:9/", retries=0, timeout=0.5, sleep=lambda seconds: None, head=None)
    assert HttpReward.kind == "http"
