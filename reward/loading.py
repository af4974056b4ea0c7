"""Loading a transformers model or tokenizer from a folder or a hub id, its failures as rsft's errors, and the
pieces every tiny test model shares (a seeded initialisation, a byte-level tokenizer with a ChatML template).

It sits in reward/ (a leaf that imports nothing from rsft/) because reward models, judges and reward backbones
load through it; rsft.models loads policies and drafts through the same functions, so a damaged file is
refused alike whichever model it belongs to.
"""

from __future__ import annotations

import json
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from reward.refusals import InputError, MissingInput

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block (weight initialisation, which reads torch's global RNG) under `seed`, then
    restore the global RNG state, also when the block raises: same seed, same weights, and no
    caller's randomness disturbed."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


# -- loading a transformers folder or hub id: its failures as rsft's errors ----------------------------------
#
# Every model and tokenizer rsft loads from a folder or a hub id goes through load_pretrained / load_tokenizer
# (policies, drafts, reward models, judges): a damaged file (a truncated model.safetensors, a config.json cut
# short) is an InputError naming the file, not a SafetensorError traceback, and weights the checkpoint lacks
# are refused unless the caller adds them on purpose (a reward backbone's new head). transformers would start
# them at random and say so only in a load report.

# the suffixes of the architectures that predict tokens (a language model), not a class or a score
LANGUAGE_MODEL_ARCHITECTURES = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration")


def _local_folder(source) -> Path | None:
    folder = Path(str(source)).expanduser()
    return folder if folder.is_dir() else None


def damaged_file(folder: str | Path) -> tuple[Path, str] | None:
    """(the first file of a model folder that is not what its name says, why), or None: a .json file that is
    not JSON, a .safetensors file whose header or length is wrong (a truncated download or copy), a
    pytorch_model*.bin file that is not a complete zip archive (torch.save's format). Only the headers and the
    zip's end record are read."""
    from safetensors import safe_open

    folder = Path(folder)
    for file in sorted(folder.glob("*.json")):
        try:
            json.loads(file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
            return file, f"not valid JSON ({error})"
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except Exception as error:  # SafetensorError (header too small, file not fully covered), OSError
            return file, f"not a complete safetensors file ({error})"
    for file in sorted(folder.glob("pytorch_model*.bin")):
        if not zipfile.is_zipfile(file):
            return file, "not a complete torch checkpoint (no zip archive's end record)"
    return None


def load_refusal(error: Exception, source, what: str, expected: str, hint: str) -> Exception | None:
    """The refusal for `error` raised while loading `what` from `source` (a folder or a hub id), or None when
    it is not a loading failure rsft can explain (a bug: the caller re-raises it)."""
    from safetensors import SafetensorError

    folder = _local_folder(source)
    reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}"
    if folder is None:
        if isinstance(error, OSError):
            return MissingInput(f"{what}: {source!r} is not a folder here, and not loadable as a hub id (offline, a "
                                f"typo, or a gated model?): {reason}")
        if isinstance(error, ValueError):  # fetched, and not what transformers can load as this class
            return InputError(f"{what}: the hub model {source!r} is not a loadable {expected} ({reason})")
        return None
    found = damaged_file(folder)
    if found is not None:
        file, why = found
        return InputError(f"{what}: {file} is damaged: {why}; a truncated download or copy? Copy or save the "
                          f"model into {folder} again (save_pretrained writes every file)")
    if isinstance(error, (OSError, ValueError, SafetensorError)):
        return InputError(f"{what}: {folder} holds no loadable {expected} ({reason}); {hint}")
    return None


def load_pretrained(auto_class, source, what: str, *, expected: str = "model", new_weights: bool = False,
                    **kwargs):
    """(model, the weights transformers started at random) of `auto_class.from_pretrained(source, **kwargs)`
    (source: a folder or a hub id; `what` names it in messages, e.g. "pretrained reward model 'x'").

    Refused: a damaged file (InputError naming the file), a folder without a loadable model (InputError),
    a hub id that cannot be fetched (MissingInput); and, unless new_weights=True (a caller that adds weights
    on purpose and trains them, like a reward backbone's new head), any weight the checkpoint lacks or holds
    in another shape (transformers' load report calls them MISSING / MISMATCHED): InputError naming them."""
    try:
        model, info = auto_class.from_pretrained(source, output_loading_info=True, **kwargs)
    except Exception as error:
        refusal = load_refusal(error, source, what, expected, "expected a save_pretrained folder: config.json "
                                "and the weights (model.safetensors)")
        if refusal is None:
            raise
        raise refusal from error
    fresh = sorted(set(info.get("missing_keys", ())) | {key[0] for key in info.get("mismatched_keys", ())})
    if fresh and not new_weights:
        raise InputError(f"{what}: {_local_folder(source) or source} lacks {len(fresh)} weight(s) the model needs "
                         f"({_shown(fresh)}), which transformers would start at random; use the complete checkpoint "
                         f"(the folder save_pretrained wrote from the trained model), not one with parts missing")
    return model, fresh


def _shown(keys: list[str], most: int = 5) -> str:
    return ", ".join(keys[:most]) + (f" and {len(keys) - most} more" if len(keys) > most else "")


def load_tokenizer(source, what: str):
    """AutoTokenizer.from_pretrained(source), its failures refused as load_pretrained refuses a model's."""
    try:
        return AutoTokenizer.from_pretrained(source)
    except Exception as error:
        refusal = load_refusal(error, source, what, "tokenizer", "save the model's tokenizer in the same folder "
                                "(tokenizer.save_pretrained)")
        if refusal is None:
            raise
        raise refusal from error


def load_reward_classifier(source, what: str, **kwargs):
    """A reward model used as it is (a pretrained reward, a trained one, a judge): an
    AutoModelForSequenceClassification whose every weight, its scoring head included, is in the checkpoint.

    A language model's folder (architectures ...ForCausalLM, ...LMHeadModel, or a checkpoint without the
    classification head) is refused as such: transformers would load its body under a head started at random,
    and every score would be noise. Other missing weights are refused as load_pretrained refuses them."""
    from transformers import AutoModelForSequenceClassification

    model, fresh = load_pretrained(AutoModelForSequenceClassification, source, what,
                                   expected="sequence-classification model", new_weights=True, **kwargs)
    where = _local_folder(source) or source
    architectures = [str(a) for a in (getattr(model.config, "architectures", None) or [])]
    classifier = any(a.endswith("ForSequenceClassification") for a in architectures)
    language_model = any(a.endswith(LANGUAGE_MODEL_ARCHITECTURES) for a in architectures) and not classifier
    prefix = f"{model.base_model_prefix}."
    head = [key for key in fresh if not key.startswith(prefix)]
    if language_model or (head and not classifier):
        named = f"a {', '.join(architectures)}" if architectures else "a model without a classification head"
        raise InputError(f"{what}: {where} holds {named}, a language model, not a reward (sequence-classification) "
                         f"model: its checkpoint has no trained scoring head ({_shown(head) or 'none'} would start "
                         f"at random); use a reward model's folder (architectures ...ForSequenceClassification), "
                         f"train one on your pairs from this model (`python -m rsft.run stage=reward reward=hf "
                         f"reward.backbone.name_or_path={where}`), or score with a function or http reward")
    if fresh:
        raise InputError(f"{what}: {where} lacks {len(fresh)} weight(s) the model needs ({_shown(fresh)}), which "
                         f"transformers would start at random, so its scores would be noise; use the complete "
                         f"checkpoint (the folder save_pretrained wrote from the trained reward model)")
    return model


def build_byte_tokenizer() -> PreTrainedTokenizerBase:
    """A real (byte-level, merge-free) tokenizer with ChatML specials: 256 bytes + 3 specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(byte_alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    tokenizer.add_special_tokens(
        {"eos_token": "<|im_end|>", "bos_token": "<|im_start|>", "pad_token": "<|pad|>"}
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
