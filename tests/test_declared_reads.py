"""What a stage reads is what it declares (rsft.stages): every stage runs on the tiny models with a config
that records each key its plan and build read, and a key its declaration does not name fails the test.
A key read but not declared escapes the pre-flight checks and, worse, the fingerprint: an artifact made
from another value of it would be reused silently."""

from __future__ import annotations

import copy
from contextlib import contextmanager
from types import SimpleNamespace

from omegaconf import DictConfig, OmegaConf, open_dict

import rsft.runner
from rsft import stages
from rsft.run import run_stage

RESOLVER = "rsft_recorded"
LOOP = ["stage=loop", "loop.rounds=2", "reward=tiny", "prefs.num_prompts=4", "prefs.num_samples=3",
        "prefs.max_new_tokens=8", "data.eval_limit=2", "eval.num_samples=2", "select.drop_truncated=false",
        "device=cpu", "loop.refresh_reward=true", "loop.dpo=true", "dpo.min_margin=0", "draft=distilled",
        "distill.num_layers=1", "distill.epochs=1", "distill.eval_prompts=2",
        "distill.eval_samples=2", "refresh.samples_per_prompt=2"]


class ReadRecorder:
    """A config whose every leaf is an interpolation of a resolver that notes the key and returns its value;
    reads count while a stage's plan, build or run is on the stack (the innermost stage gets them)."""

    def __init__(self):
        self.values: dict[str, object] = {}
        self.active: list[str | None] = []  # None: the runner's own work
        self.read: dict[str, set[str]] = {}
        OmegaConf.register_new_resolver(RESOLVER, self._resolve, replace=True)

    def _resolve(self, key: str):
        if self.active and self.active[-1] is not None:
            self.read.setdefault(self.active[-1], set()).add(key)
        return copy.deepcopy(self.values[key])

    def wrap(self, cfg: DictConfig) -> DictConfig:
        plain = OmegaConf.to_container(cfg, resolve=True)
        recorded = copy.deepcopy(cfg)
        with open_dict(recorded):
            for key, value in _leaves(plain):
                self.values[key] = value
                OmegaConf.update(recorded, key, f"${{{RESOLVER}:{key}}}", merge=False)
        return recorded

    @contextmanager
    def reading_as(self, name: str | None):
        self.active.append(name)
        try:
            yield
        finally:
            self.active.pop()

    def undeclared(self) -> dict[str, list[str]]:
        """Per stage, the keys read that its declaration (reads, uses, EVERY_STAGE) does not cover."""
        out = {}
        for name, keys in self.read.items():
            declared = stages.declared_keys(stages.get(name))
            missing = sorted(k for k in keys if not any(k == d or k.startswith(d + ".") for d in declared))
            if missing:
                out[name] = missing
        return out


def _leaves(value, prefix=""):
    if isinstance(value, dict) and value:
        for key, inner in value.items():
            yield from _leaves(inner, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def record_stage_reads(monkeypatch) -> ReadRecorder:
    recorder = ReadRecorder()
    real_module = rsft.runner.module

    def recorded_module(stage):
        real = real_module(stage)

        def traced(function):
            def call(*args, **kwargs):
                with recorder.reading_as(stage.name):
                    return function(*args, **kwargs)
            return call

        return SimpleNamespace(**{name: traced(getattr(real, name)) for name in ("plan", "build", "run")
                                  if hasattr(real, name)})

    real_run = rsft.runner.run

    def runner_run(*args, **kwargs):  # the runner's own reads (fingerprint, config record) belong to no stage
        with recorder.reading_as(None):
            return real_run(*args, **kwargs)

    monkeypatch.setattr(rsft.runner, "module", recorded_module)
    monkeypatch.setattr(rsft.runner, "run", runner_run)
    return recorder


def test_every_stage_reads_only_what_it_declares(make_cfg, monkeypatch):
    """One loop runs every stage (prefs, reward, eval, sample, labels, refresh, score, select, sft, dpo,
    draft); then stage=draft and stage=eval with a judge alone, and stage=online (n-gram draft, pruning, replay,
    evaluation) on the loop's reward model."""
    recorder = record_stage_reads(monkeypatch)
    run_stage(recorder.wrap(make_cfg(*LOOP, "run_name=reads")))
    run_stage(recorder.wrap(make_cfg(*LOOP, "run_name=reads", "stage=eval", "round=1", "eval.judge=reads",
                                            "overwrite=true")))
    run_stage(recorder.wrap(make_cfg(*LOOP, "run_name=reads", "stage=online", "draft=ngram", "online.minibatches=2",
                                            "online.prompts_per_batch=2", "online.eval_every=1", "online.replay=1",
                                            "sample.prune.at=[4]", "sample.prune.share=0.5")))
    assert set(recorder.read) >= {s.name for s in stages.STAGES}, set(recorder.read)
    undeclared = recorder.undeclared()
    assert not undeclared, "read but not declared in rsft.stages: " + "; ".join(
        f"stage={name}: {', '.join(keys)}" for name, keys in undeclared.items())


def test_the_check_fails_when_a_read_is_left_out_of_a_declaration(make_cfg, monkeypatch):
    """Remove one declared key (select.k, inside the select group) and the same run is caught."""
    recorder = record_stage_reads(monkeypatch)
    select = stages.get("select")
    narrowed = stages.Stage(**{**select.__dict__, "reads": ("seed", "round", "data.system_prompt",
                                                           *(f"select.{k}" for k in ("strategy", "pool_rounds",
                                                                                     "pairs", "drop_empty",
                                                                                     "drop_truncated", "dedupe")))})
    monkeypatch.setitem(stages.BY_NAME, "select", narrowed)
    cfg = make_cfg(*LOOP[:1], "loop.rounds=1", *LOOP[2:10], "loop.refresh_reward=false", "run_name=narrow")
    run_stage(recorder.wrap(cfg))
    assert "select.k" in recorder.undeclared().get("select", [])
