"""Every reward source wherever rsft uses a reward (issue 32): stage=score, select (a verifier's None is
never kept, a threshold keeps only correct answers), pruning and adaptive K, eval's proxy and judge,
fingerprints by content, and a loop that needs no trained reward model."""

from __future__ import annotations

import threading

import pytest
import torch
from datasets import load_from_disk

from rsft.errors import StaleArtifact
from rsft.paths import RunPaths
from rsft.run import run_stage
from rsft.store import is_complete, read_meta
from tests.conftest import REPO

VERIFIERS = REPO / "tests" / "reward_fixtures" / "verifiers.py"
FUNCTION = ["reward_source=function", f"reward_source.spec={VERIFIERS}:count_a"]
BUDGET = ["sample.num_samples=4", "sample.max_new_tokens=8", "sample.prune.at=[3]", "sample.prune.share=0.5",
          "sample.adaptive_k.k0=2", "sample.adaptive_k.mean=3", "sample.shard_prompts=2"]


def test_score_with_a_function_reward_needs_no_trained_model_and_records_the_function(make_cfg):
    run_stage(make_cfg("stage=sample"))
    out = run_stage(make_cfg("stage=score", *FUNCTION)).path
    scored = load_from_disk(str(out))
    assert scored["reward"] == [float(c.count("a")) for c in scored["completion"]]
    assert scored["reward_normalised"] == scored["reward"]  # not calibrated: the raw value
    assert set(scored["reward_model"]) == {f"function:{VERIFIERS}:count_a"}
    sources = read_meta(out)["fingerprint"]["sources"]
    assert sources["reward_source"]["kind"] == "function" and sources["reward_source"]["qualname"] == "count_a"
    assert not is_complete(RunPaths(out.parent.parent).reward)  # no prefs, no reward stage


def test_a_changed_function_file_makes_the_scores_stale(make_cfg, tmp_path):
    module = tmp_path / "check.py"
    module.write_text("def score(prompts, completions):\n    return [1.0] * len(completions)\n")
    run_stage(make_cfg("stage=sample"))
    spec = ["reward_source=function", f"reward_source.spec={module}:score"]
    run_stage(make_cfg("stage=score", *spec))
    module.write_text("def score(prompts, completions):\n    return [2.0] * len(completions)\n")
    with pytest.raises(StaleArtifact, match="reward source reward_source"):
        run_stage(make_cfg("stage=score", *spec))


def test_an_edited_helper_module_makes_the_scores_stale_and_overwrite_rescores(make_cfg, tmp_path, monkeypatch):
    """A function reward's fingerprint digests the local modules it imports, not its own file only: an edited
    helper beside it makes the next run refuse the old scores as stale (naming the reward source), and
    overwrite=true scores again with the new helper."""
    import sys

    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m rsft.run` run from the folder puts it on sys.path
    monkeypatch.delitem(sys.modules, "stage_helper", raising=False)
    (tmp_path / "stage_helper.py").write_text("POINTS = 1.0\n")
    module = tmp_path / "graded.py"
    module.write_text("from stage_helper import POINTS\n\n"
                      "def score(prompts, completions):\n    return [POINTS] * len(completions)\n")
    run_stage(make_cfg("stage=sample"))
    spec = ["reward_source=function", f"reward_source.spec={module}:score"]
    first = run_stage(make_cfg("stage=score", *spec)).path
    assert set(load_from_disk(str(first))["reward"]) == {1.0}
    imports = read_meta(first)["fingerprint"]["sources"]["reward_source"]["imports"]
    assert list(imports) == ["stage_helper.py"]  # which files were digested, in the artifact's meta.json
    assert run_stage(make_cfg("stage=score", *spec)).path == first  # unchanged: reused
    (tmp_path / "stage_helper.py").write_text("POINTS = 2.0\n")
    with pytest.raises(StaleArtifact, match="reward source reward_source"):
        run_stage(make_cfg("stage=score", *spec))
    again = run_stage(make_cfg("stage=score", *spec, "overwrite=true")).path
    assert set(load_from_disk(str(again))["reward"]) == {2.0}
    assert read_meta(again)["fingerprint"]["sources"]["reward_source"]["imports"] != imports


@pytest.mark.parametrize("damage", ["truncated weights", "causal LM", "no head"])
def test_a_broken_pretrained_reward_is_one_line_before_any_work(make_cfg, tmp_path, damage):
    """The pre-flight opens a pretrained reward: a truncated model.safetensors, a language model's folder and a
    checkpoint without its head are refused there, as rsft's errors naming the folder, not as a traceback."""
    from rsft.preflight import check_config
    from rsft.errors import InputError

    folder = save_tiny_classifier(tmp_path / "classifier")
    if damage == "truncated weights":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "no head":
        from safetensors.torch import load_file, save_file

        state = load_file(str(folder / "model.safetensors"))
        del state["score.weight"]
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        from transformers import LlamaForCausalLM

        causal = LlamaForCausalLM.from_pretrained(folder)
        for name in folder.iterdir():
            name.unlink()
        causal.save_pretrained(folder)
        from rsft.models import build_byte_tokenizer

        build_byte_tokenizer().save_pretrained(folder)
    expected = {"truncated weights": f"{folder / 'model.safetensors'} is damaged",
                "causal LM": "a language model, not a reward", "no head": "score.weight"}[damage]
    with pytest.raises(InputError) as refused:
        check_config(make_cfg("stage=score", "reward_source=pretrained", f"reward_source.spec={folder}"))
    message = str(refused.value)
    assert message.startswith("reward_source=pretrained: pretrained reward model") and expected in message
    assert "\n" not in message and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("overrides, setting", [
    (["reward_source=http", "reward_source.spec='http://[::1'"], "reward_source.spec"),
    (["reward_source=http", "reward_source.spec=localhost:8000"], "reward_source.spec"),
    (["reward_source=combination", "+reward_source.components.remote.source='http://127.0.0.1:port/score'"],
     "reward_source.components.remote.source"),
])
def test_a_malformed_server_url_is_a_config_error_naming_its_setting_before_any_work(make_cfg, tmp_path, overrides,
                                                                                      setting):
    """Not a ValueError from urllib's parser at pre-flight, and not a server retried at that address."""
    from rsft.errors import ConfigError
    from rsft.preflight import check_config

    with pytest.raises(ConfigError) as refused:
        check_config(make_cfg("stage=score", *overrides))
    message = str(refused.value)
    assert message.startswith(f"{setting}=") and "expected an http:// or https:// address" in message
    assert "\n" not in message and not (tmp_path / "runs").exists()


def test_a_verifier_none_is_never_kept_and_a_threshold_keeps_only_correct_answers(make_cfg, tmp_path):
    module = tmp_path / "verify.py"
    module.write_text("def check(prompts, completions):\n"
                      "    return [None if i % 3 == 0 else float(i % 2) for i in range(len(completions))]\n")
    spec = ["reward_source=function", f"reward_source.spec={module}:check"]
    run_stage(make_cfg("stage=sample"))
    scored = load_from_disk(str(run_stage(make_cfg("stage=score", *spec)).path))
    assert sum(r is None for r in scored["reward"]) == 3
    assert read_meta(run_stage(make_cfg("stage=score", *spec)).path)["counts"]["unscorable"] == 3
    cfg = make_cfg("stage=select", *spec, "select.strategy=threshold", "select.threshold=1.0", "select.k=9",
                   "select.drop_truncated=false", "select.pairs=false")
    selected = load_from_disk(str(run_stage(cfg).path))
    assert len(selected) > 0 and set(selected["reward"]) == {1.0}  # only "correct" answers, never a None
    assert read_meta(run_stage(cfg).path)["counts"]["dropped_unscorable"] == 3


@pytest.fixture
def count_a_server():
    """count_a served over loopback by rsft.serve_reward, for the http source."""
    from reward.specs import open_source
    from reward.server import make_server

    server = make_server(open_source(f"function:{VERIFIERS}:count_a"), "127.0.0.1", 0, "count_a", "test")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("kind", ["function", "columns", "combination", "pretrained", "http"])
def test_pruning_and_adaptive_k_spend_with_any_reward_source(make_cfg, kind, tmp_path, count_a_server):
    """`columns`: a function that reads the prompt rows' own columns (the demo's task) while pruning."""
    (tmp_path / "by_task.py").write_text("def score(prompts, completions, task, finish_reason):\n"
                                         "    assert set(finish_reason) <= {None, 'eos', 'length'}\n"
                                         "    return [float(len(t['topic']) + len(c)) for t, c in zip(task, completions)]\n")
    source = {
        "function": FUNCTION,
        "columns": ["reward_source=function", f"reward_source.spec={tmp_path / 'by_task.py'}:score"],
        "combination": ["reward_source=combination", "reward_source.combine=mean",
                        f"+reward_source.components={{a: {{source: 'function:{VERIFIERS}:count_a', weight: 1}}, "
                        f"b: {{source: 'function:{VERIFIERS}:length', weight: 2}}}}"],
        "pretrained": ["reward_source=pretrained", f"reward_source.spec={tmp_path / 'classifier'}"],
        "http": ["reward_source=http", f"reward_source.spec={count_a_server}"],
    }[kind]
    if kind == "pretrained":
        save_tiny_classifier(tmp_path / "classifier")
    out = run_stage(make_cfg("stage=sample", *BUDGET, *source)).path
    samples, meta = load_from_disk(str(out)), read_meta(out)
    assert meta["sampling"]["adaptive"]["first_pass_per_prompt"] == 2
    assert "pruned" in meta["sampling"] and "reward_source" in str(meta["fingerprint"]["sources"])
    assert len(samples) >= 3 * 2
    scored = load_from_disk(str(run_stage(make_cfg("stage=score", *BUDGET, *source)).path))
    if kind == "combination":  # every component's score beside the total
        assert {"reward_a", "reward_b"} <= set(scored.column_names)
        a, b = scored["reward_a"], scored["reward_b"]
        assert scored["reward"] == pytest.approx([(x + 2 * y) / 3 for x, y in zip(a, b)])


def save_tiny_classifier(folder, num_labels: int = 1):
    """A tiny random sequence-classification model with a byte tokenizer and no chat template."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rsft.models import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, num_labels=num_labels,
                         pad_token_id=tokenizer.pad_token_id, max_position_embeddings=128)
    LlamaForSequenceClassification(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_pretrained_model_is_the_proxy_and_the_judge_of_eval(make_cfg, tmp_path):
    model = save_tiny_classifier(tmp_path / "classifier")
    cfg = make_cfg("stage=eval", "eval.policy=initial", "reward_source=pretrained", f"reward_source.spec={model}",
                   f"eval.judge={model}", "data.eval_limit=2", "eval.num_samples=2")
    out = run_stage(cfg).path
    evaluated = load_from_disk(str(out))
    assert evaluated["reward"] == pytest.approx(evaluated["judge"])  # the same model, as proxy and as judge
    sources = read_meta(out)["fingerprint"]["sources"]
    assert sources["reward_source"]["kind"] == "pretrained" and sources["judge"]["kind"] == "pretrained"


def test_the_http_source_scores_what_the_source_gives_in_process(make_cfg):
    from reward.specs import open_source
    from reward.server import make_server

    source = open_source(f"function:{VERIFIERS}:count_a")
    server = make_server(source, "127.0.0.1", 0, "count_a", "test")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        run_stage(make_cfg("stage=sample"))
        url = f"http://127.0.0.1:{server.server_address[1]}"
        scored = load_from_disk(str(run_stage(make_cfg("stage=score", "reward_source=http",
                                                       f"reward_source.spec={url}", "reward_source.batch_size=4"))
                                    .path))
    finally:
        server.shutdown()
        server.server_close()
    assert scored["reward"] == source.score(scored["prompt"], scored["completion"])


def test_a_loop_with_a_function_reward_runs_no_prefs_or_reward_stage(make_cfg):
    cfg = make_cfg("stage=loop", "loop.rounds=1", "loop.eval=false", "select.drop_truncated=false", *FUNCTION,
                   "run_name=verified")
    paths = RunPaths(run_stage(cfg).path)
    assert is_complete(paths.policy(0)) and not paths.prefs.exists() and not paths.reward.exists()
    assert not paths.round_reward(0).exists()  # loop.refresh_reward=auto: nothing trained to refresh


def test_min_reward_keeps_a_prompts_best_only_when_the_verifier_passes_it_and_random_ignores_it(make_cfg, tmp_path):
    module = tmp_path / "verify.py"
    module.write_text("def check(prompts, completions):\n"
                      "    return [float(i % 4 == 1) for i in range(len(completions))]\n")
    spec = ["reward_source=function", f"reward_source.spec={module}:check", "select.drop_truncated=false",
            "select.pairs=false"]
    run_stage(make_cfg("stage=sample"))
    scored = load_from_disk(str(run_stage(make_cfg("stage=score", *spec)).path))
    passed = {p for p, r in zip(scored["prompt_id"], scored["reward"]) if r == 1.0}
    best = load_from_disk(str(run_stage(make_cfg("stage=select", *spec, "select.min_reward=1.0")).path))
    assert set(best["prompt_id"]) == passed and set(best["reward"]) == {1.0}
    cfg = make_cfg("stage=select", *spec, "select.min_reward=1.0", "select.strategy=random", "overwrite=true")
    random = load_from_disk(str(run_stage(cfg).path))
    assert len(random) == len(set(scored["prompt_id"]))  # one per prompt, passed or not
