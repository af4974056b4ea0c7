"""Reward sources: every reward rsft can score with, behind one interface.

    source = open_source(spec, ...)                       # rsft.reward_service builds it from the config
    raw = source.score(prompts, completions, rows)        # one float (or None: not scorable) per row
    z = source.normalise(raw)                             # on the scale thresholds and combinations use

A source scores a policy's prompt as the user wrote it (the `prompt` column) and the completion text;
`rows` carries each prompt row's other columns (a reference answer, a task id) for sources that
check against them. None means "not scorable" (a verifier that cannot parse the answer): it is counted
and never silently turned into a number; stages decide what a None means (score keeps it as a
missing reward, select never keeps such a row).

`identity()` is what an artifact scored with the source records in its fingerprint: the content of
what scores (file digests of a model folder, a function's source file digest and qualified name, a
server's URL and declared model and revision), never only a name.

The kinds: `trained` (rsft's own Bradley-Terry model, reward.trained), and those of the modules that
register themselves in SOURCES (pretrained, function, http, combination).

reward.specs.open_source turns a spec string (`function:tasks.py:check`, a folder, a URL) into a source.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import itertools
import logging
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from reward.refusals import ConfigError, InputError
from reward.digests import file_digest, user_files_digest

log = logging.getLogger(__name__)

# kind -> factory(target, **options) -> RewardSource; modules that define a kind register it here
SOURCES: dict[str, Callable[..., RewardSource]] = {}



def register(kind: str):
    """Class decorator: `kind` is opened by this class (SOURCES[kind] = cls)."""
    def add(cls):
        SOURCES[kind] = cls
        return cls
    return add


class RewardSource:
    """The interface every reward source implements (see the module docstring).

    score(prompts, completions, rows=None, batch_size=32, progress=True, shard=(0, 1)):
        one raw score (float, or None: not scorable) per (prompt, completion), in input order. `rows`
        (one dict per row, or None) carries each row's other columns. shard=(i, n): this process's share
        of the work when n processes score the same rows together; it returns None for every row outside
        its share, so that the n answers, merged row by row, are exactly the answer of one process.
        Sources that score in length-sorted batches share batches (batches i, i + n, ... of the sorted
        order, as reward.trained.RewardScorer does); the others share rows i, i + n, ...
    normalise(raw): (raw - mean) / std, None kept.
    calibrate(prompts, completions, source): mean and std from the scores of a stated set of rows.
    identity(): what an artifact scored with the source records (module docstring).
    components(): a combination's parts' raw scores of the last call.
    """

    kind = "abstract"
    mean: float = 0.0  # normalise: (raw - mean) / std
    std: float = 1.0
    calibration: dict[str, Any] | None = None  # {"rows", "mean", "std", "source"} once calibrate() ran

    def score(self, prompts: list[str], completions: list[str], rows: list[dict] | None = None,
              batch_size: int = 32, progress: bool = True, shard: tuple[int, int] = (0, 1)) -> list[float | None]:
        raise NotImplementedError

    def normalise(self, raw: list[float | None]) -> list[float | None]:
        return [None if r is None else (r - self.mean) / self.std for r in raw]

    def identity(self) -> dict[str, Any]:
        raise NotImplementedError

    def components(self) -> dict[str, list[float | None]]:
        """Each component's raw scores of the last score() call, by name (a combination's parts); {} otherwise."""
        return {}

    def calibrate(self, prompts: list[str], completions: list[str], source: str = "",
                  rows: list[dict] | None = None, batch_size: int = 32, progress: bool = False) -> dict[str, Any]:
        """Set mean and std (normalise's scale) from this source's scores of a stated calibration set,
        and record it: calibration = {"rows": scored rows, "mean", "std", "source": `source`, a description
        of the set}. Rows scored None are left out. Refused (InputError): fewer than two scored rows, or
        the same score for all of them (a zero std cannot normalise)."""
        scores = [s for s in self.score(prompts, completions, rows, batch_size, progress) if s is not None]
        where = f"{self.kind} reward calibration on {source or 'the given rows'}"
        if len(scores) < 2:
            raise InputError(f"{where}: {len(scores)} of {len(list(completions))} rows scored; at least two are "
                             f"needed for a mean and a standard deviation")
        mean, std = statistics.fmean(scores), statistics.pstdev(scores)
        if not std > 1e-6:
            raise InputError(f"{where}: all {len(scores)} scores are {mean:.6g} (std {std:.3g}); normalising "
                             f"needs rows the reward tells apart: use a more varied calibration set")
        self.mean, self.std = mean, std
        self.calibration = {"rows": len(scores), "mean": mean, "std": std, "source": source}
        return self.calibration


def checked_scores(values, expected: int, source: str, row_ids: Sequence[int] | None = None) -> list[float | None]:
    """A source's answer for `expected` rows as floats or None, refusing anything else (InputError naming
    `source` and the row): a string, a NaN or infinity (an integer too large for a float counts as one), a
    bool, or the wrong number of values.
    `row_ids`: the rows' numbers to name in a refusal (default 0, 1, ...: the position in `values`)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise InputError(f"{source}: returned {type(values).__name__}; expected a list of {expected} floats or None")
    values = list(values)
    if len(values) != expected:
        rows = f"the {expected} rows from row {row_ids[0]}" if row_ids else f"{expected} rows"
        raise InputError(f"{source}: returned {len(values)} values for {rows}; expected one per row")
    out: list[float | None] = []
    for i, value in enumerate(values):
        row = row_ids[i] if row_ids is not None else i
        if value is None:
            out.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
            raise InputError(f"{source}: row {row}: returned {value!r} ({type(value).__name__}); expected a float or "
                             f"None (not scorable)")
        try:
            number = float(value)
        except OverflowError:  # an int past a float's range (10**400): not quoted, its repr may be thousands of digits
            raise InputError(f"{source}: row {row}: returned a number beyond a float's range (about 1.8e308); "
                             f"expected a finite float, or None (not scorable)") from None
        if not math.isfinite(number):
            raise InputError(f"{source}: row {row}: returned {number}; expected a finite float, or None (not scorable)")
        out.append(number)
    return out


def _checked_inputs(prompts, completions, rows, shard) -> tuple[list[str], list[str], list[dict] | None]:
    """Lists of the columns (datasets columns are not lists), their lengths and the shard checked."""
    prompts, completions = list(prompts), list(completions)
    if len(prompts) != len(completions):
        raise ValueError(f"score: {len(prompts)} prompts but {len(completions)} completions")
    if rows is not None:
        rows = list(rows)
        if len(rows) != len(prompts):
            raise ValueError(f"score: {len(rows)} rows but {len(prompts)} prompts")
    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"score: shard={shard}: expected (i, n) with 0 <= i < n")
    return prompts, completions, rows


@register("trained")
class TrainedReward(RewardSource):
    """rsft's own Bradley-Terry model: a folder written by stage=reward (reward.trained.load_scorer).

    Callers pass the policy's prompts as written; score frames them as the model's training prompts were
    (scorer.as_trained). mean/std: the training responses' statistics stored in the folder."""

    kind = "trained"

    def __init__(self, folder: str | Path, device: str = "cpu", scorer=None):
        from reward.trained import load_scorer

        self.folder = Path(folder).expanduser()
        self.scorer = scorer if scorer is not None else load_scorer(self.folder, device)
        self.mean, self.std = float(self.scorer.mean), float(self.scorer.std)
        self._identity = {"kind": "trained", "files": user_files_digest(self.folder)}

    def score(self, prompts, completions, rows=None, batch_size=32, progress=True, shard=(0, 1)):
        prompts, completions, _ = _checked_inputs(prompts, completions, rows, shard)
        # a damaged model can give NaN: refused here, naming the model, before it reaches a selection or a mean
        return checked_scores(self.scorer.score(self.scorer.as_trained(prompts), completions, batch_size, progress,
                                                shard=tuple(shard)), len(prompts), f"trained reward {self.folder}")

    def identity(self):
        return dict(self._identity)


INPUT_KEYS = ("input_ids", "token_type_ids")  # what a pretrained model reads of its tokenizer's encoding


@register("pretrained")
class PretrainedReward(RewardSource):
    """Any AutoModelForSequenceClassification (a folder or a hub id), used as it is, without training.

    Input: rendered as such models are trained. A tokenizer with a chat template renders the
    conversation [user: prompt, assistant: completion] with it (apply_chat_template, tokenize=False) and
    the text is tokenized without adding special tokens (the template holds them); a tokenizer without
    one reads the (prompt, completion) text pair, tokenizer(prompt, completion), its own special tokens
    and separators included. Inputs longer than max_length are cut at max_length tokens (the end of the
    completion is lost): `truncated` counts them in the last score call, and a warning names the count
    when more than half of the inputs were cut. max_length: the option, else the tokenizer's
    model_max_length when it is set (< 1e6), else the model's max_position_embeddings.

    Score: the logit of the model's only label (num_labels 1), or of `head` for a multi-head model
    (num_labels > 1, ArmoRM-style attribute heads), which must then be chosen. fp32, torch.no_grad,
    batches of inputs sorted by length (longest first), results in input order.

    Normalisation: mean 0, std 1 until calibrate() sets them from a stated set of rows (calibration).
    """

    kind = "pretrained"

    def __init__(self, name_or_path: str, device: str = "cpu", head: int | None = None,
                 max_length: int | None = None):
        import torch

        from reward.loading import load_reward_classifier, load_tokenizer

        self.name = str(name_or_path)
        folder = Path(self.name).expanduser()
        self.folder = folder if folder.is_dir() else None
        where = f"pretrained reward model {self.name!r}"
        source = str(self.folder) if self.folder else self.name
        # refused: a damaged file, a language model's folder, weights the checkpoint lacks (a random head)
        self.model = load_reward_classifier(source, where, dtype=torch.float32)
        self.tokenizer = load_tokenizer(source, where)
        self._pad(where)
        if str(device) == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model.to(self.device).eval()

        self.num_labels = int(self.model.config.num_labels)
        if self.num_labels > 1 and head is None:
            raise ConfigError(f"{where} has {self.num_labels} output heads (num_labels={self.num_labels}); choose "
                              f"the one to score with: set the reward source's option head=<0..{self.num_labels - 1}>")
        if head is not None and not (isinstance(head, int) and not isinstance(head, bool)
                                     and 0 <= head < self.num_labels):
            raise ConfigError(f"{where}: head={head!r} is not one of its {self.num_labels} output heads; set head to an "
                              f"integer in 0..{self.num_labels - 1}")
        self.head = head
        self.max_length = self._max_length(max_length, where)
        self.chat = bool(getattr(self.tokenizer, "chat_template", None))
        self.truncated = 0
        self.scored = 0
        self.calibration = None
        self.mean, self.std = 0.0, 1.0
        if self.folder is not None:
            self._identity = {"kind": "pretrained", "files": user_files_digest(self.folder), "head": head}
        else:
            self._identity = {"kind": "pretrained", "name": self.name,
                              "revision": getattr(self.model.config, "_commit_hash", None), "head": head}

    def _pad(self, where: str) -> None:
        """A pad token for batches: the tokenizer's, else its eos; the model reads the same one (a causal
        model pools at the last token that is not the pad token)."""
        if self.tokenizer.pad_token_id is None:
            if self.tokenizer.eos_token_id is None:
                raise InputError(f"{where}: its tokenizer has neither a pad nor an eos token, so inputs cannot be "
                                 f"batched; set a pad token in its tokenizer")
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id

    def _max_length(self, option: int | None, where: str) -> int:
        if option is not None:
            if isinstance(option, bool) or not isinstance(option, int) or option < 1:
                raise ConfigError(f"{where}: max_length={option!r}; expected a positive integer")
            return option
        tokenizer_limit = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < 1_000_000:
            return tokenizer_limit
        positions = getattr(self.model.config, "max_position_embeddings", None)
        if isinstance(positions, int) and positions > 0:
            return positions
        raise ConfigError(f"{where}: neither its tokenizer (model_max_length) nor its config "
                          f"(max_position_embeddings) states how long an input may be; set the option max_length")

    def render(self, prompt: str, completion: str, cut: bool = False) -> dict[str, list[int]]:
        """The model's input for one (prompt, completion): input_ids, and token_type_ids where the
        tokenizer gives them (a text pair's segments); cut to max_length when `cut`."""
        if self.chat:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}], tokenize=False)
            encoded = self.tokenizer(text, add_special_tokens=False)
            features = {k: list(encoded[k]) for k in INPUT_KEYS if k in encoded}
            return {k: v[:self.max_length] for k, v in features.items()} if cut else features
        # a text pair is cut as the tokenizer cuts it (longest first), its special tokens kept
        encoded = (self.tokenizer(prompt, completion, truncation=True, max_length=self.max_length) if cut
                   else self.tokenizer(prompt, completion))
        return {k: list(encoded[k]) for k in INPUT_KEYS if k in encoded}

    def score(self, prompts, completions, rows=None, batch_size=32, progress=True, shard=(0, 1)):
        import torch
        from tqdm.auto import tqdm

        prompts, completions, _ = _checked_inputs(prompts, completions, rows, shard)
        index, count = shard
        # the length order needs every input's length, so each process renders all and scores its batches
        inputs = [self.render(p, c) for p, c in zip(prompts, completions)]
        lengths = [len(x["input_ids"]) for x in inputs]
        order = sorted(range(len(inputs)), key=lambda i: -min(lengths[i], self.max_length))
        starts = list(range(0, len(order), batch_size))[index::count]
        scores: list[float | None] = [None] * len(inputs)
        truncated = scored = 0
        column = self.head if self.head is not None else 0
        pads = {"input_ids": self.tokenizer.pad_token_id,
                "token_type_ids": getattr(self.tokenizer, "pad_token_type_id", 0) or 0}
        with torch.no_grad():
            for start in tqdm(starts, desc="scoring", unit="batch", disable=not progress):
                batch = order[start:start + batch_size]
                features = []
                for i in batch:
                    cut = lengths[i] > self.max_length
                    features.append(self.render(prompts[i], completions[i], cut=True) if cut else inputs[i])
                    truncated += cut
                longest = max(len(x["input_ids"]) for x in features)
                tensors = {key: torch.full((len(batch), longest), pads[key], dtype=torch.long)  # [batch, longest]
                           for key in features[0]}
                tensors["attention_mask"] = torch.zeros((len(batch), longest), dtype=torch.long)  # [batch, longest]
                for row, x in enumerate(features):
                    for key, values in x.items():
                        tensors[key][row, :len(values)] = torch.tensor(values, dtype=torch.long)
                    tensors["attention_mask"][row, :len(x["input_ids"])] = 1
                logits = self.model(**{k: v.to(self.device) for k, v in tensors.items()}).logits  # [batch, labels]
                for i, value in zip(batch, logits[:, column].float().tolist()):
                    scores[i] = value
                scored += len(batch)
        self.truncated, self.scored = truncated, scored
        if truncated * 2 > scored:
            log.warning("reward source pretrained:%s: %d of %d inputs were longer than max_length=%d tokens and were "
                        "cut (the end of the completion is not scored); raise the option max_length if the model "
                        "reads longer inputs", self.name, truncated, scored, self.max_length)
        return checked_scores(scores, len(inputs), f"reward source pretrained:{self.name}")

    def identity(self):
        return dict(self._identity)


_MODULE_NUMBER = itertools.count()


# -- a function reward's own modules: what its fingerprint digests beside its file ------------------------------


@functools.lru_cache(maxsize=1)
def _environment_folders() -> tuple[Path, ...]:
    """The folders whose modules are the environment's, not the user's: the standard library, site-packages
    (where pip installs), and rsft's own packages (the pipeline's code, installed editable or not)."""
    import site
    import sysconfig

    here = Path(__file__).resolve()
    folders = {Path(p).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")
               if (p := sysconfig.get_paths().get(key))}
    folders |= {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()] if p}
    return tuple(sorted(folders | {here.parent, here.parents[1] / "reward"}))


def _users(file: Path) -> bool:
    """Whether a module file is the user's (not the standard library's, an installed package's or rsft's)."""
    return not any(file.is_relative_to(folder) for folder in _environment_folders())


def _module_files(name: str, search: list[str]) -> list[Path]:
    """The source files importing dotted module `name` runs, found on `search` (sys.path's order) without
    importing anything: each package's __init__.py on the way, then the module's file. [] when the top-level
    name is not found there (a builtin, a missing module)."""
    import importlib.machinery

    files: list[Path] = []
    locations = search
    for depth, part in enumerate(name.split(".")):
        try:
            spec = importlib.machinery.PathFinder.find_spec(part, locations)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return files if depth else []
        if spec.origin and spec.origin.endswith(".py"):
            files.append(Path(spec.origin).resolve())
        if not spec.submodule_search_locations:
            break
        locations = list(spec.submodule_search_locations)
    return files


def _imported_names(file: Path) -> list[tuple[int, str]]:
    """(level, dotted name) of every import in `file`, inside functions and conditions too (ast, not
    importing): `import a.b` -> (0, "a.b"); `from .c import d` -> (1, "c.d") and (1, "c")."""
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
    except (SyntaxError, UnicodeDecodeError, ValueError):  # it cannot be imported either: the import says so
        return []
    names: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend((0, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            names.append((node.level, base))
            # `from package import name`: name may be a submodule (its file runs) or an attribute (not found)
            names.extend((node.level, f"{base}.{alias.name}" if base else alias.name)
                         for alias in node.names if alias.name != "*")
    return [(level, name) for level, name in names if name or level]


def local_imports(*roots: Path) -> list[Path]:
    """Every local module the files `roots` import, at any depth: imports are read with ast (an import inside
    a function counts, a name built at run time, importlib.import_module(x), does not), found on sys.path as
    Python would find them (relative imports beside the importing file), and kept when they are the user's:
    a .py file outside the standard library, site-packages and rsft's own packages (_environment_folders).
    The roots themselves are left out; sorted."""
    search = [str(Path(p or ".").resolve()) for p in sys.path]
    roots = tuple(Path(r).resolve() for r in roots)
    found: set[Path] = set()
    todo = list(roots)
    seen = set(roots)
    while todo:
        file = todo.pop()
        for level, name in _imported_names(file):
            if level:  # relative to the importing file's package
                base = file.parent
                for _ in range(level - 1):
                    base = base.parent
                files = _module_files(name, [str(base)]) if name else \
                    [f for f in [base / "__init__.py"] if f.is_file()]
            else:
                if name.partition(".")[0] in sys.builtin_module_names:
                    continue
                files = _module_files(name, search)
            for candidate in files:
                if candidate in seen or not _users(candidate):
                    continue
                seen.add(candidate)
                found.add(candidate)
                todo.append(candidate)
    return sorted(found - set(roots))


def _digest_key(file: Path, home: Path | None) -> str:
    """How a digested file is named in the identity: its path below the function file's folder (the same
    wherever the project is copied), else its absolute path."""
    if home is not None and file.is_relative_to(home):
        return file.relative_to(home).as_posix()
    return str(file)


# local module files -> their digest when a function reward last imported them (this process): when one of
# a function's modules changed since, all of them are imported again (a module that did `from changed import x`
# holds the old x), so that the code that scores is the code digested
_IMPORTED_DIGESTS: dict[Path, dict] = {}


def _forget_changed_modules(files: set[Path]) -> None:
    if not any(f in _IMPORTED_DIGESTS and f.is_file() and file_digest(f) != _IMPORTED_DIGESTS[f] for f in files):
        return
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and Path(origin).resolve() in files:
            del sys.modules[name]


def _load_function(spec: str) -> tuple[Callable, Path | None, Any]:
    """(the callable, the file it was imported from (a path spec), the module) for module:function or
    path.py:function; ConfigError when the module, file or function is not there."""
    target, _, name = spec.rpartition(":")
    expected = "expected function:<module>:<function> or function:<path/to/file.py>:<function>"
    if not target or not name:
        raise ConfigError(f"function reward {spec!r}: {expected}")
    is_path = target.endswith(".py") or "/" in target or "\\" in target
    if is_path:
        file = Path(target).expanduser().resolve()
        if not file.is_file():
            raise ConfigError(f"function reward {spec!r}: no file {file} (a relative path is read from the current "
                              f"directory, {Path.cwd()}); {expected}")
        _forget_changed_modules(set(local_imports(file)))
        module_name = f"_rsft_reward_function_{next(_MODULE_NUMBER)}_{file.stem}"
        module_spec = importlib.util.spec_from_file_location(module_name, file)
        if module_spec is None or module_spec.loader is None:
            raise ConfigError(f"function reward {spec!r}: {file} cannot be imported as a Python module; {expected}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module  # dataclasses, pickling and typing look their module up here
        try:
            module_spec.loader.exec_module(module)
        except Exception as error:
            sys.modules.pop(module_name, None)
            raise InputError(f"function reward {spec!r}: importing {file} failed: {type(error).__name__}: "
                             f"{error}") from error
    else:
        file = None
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as error:
            if error.name and (target == error.name or target.startswith(error.name + ".")):
                raise ConfigError(f"function reward {spec!r}: no module {target!r} on the Python path "
                                  f"(sys.path); {expected}") from error
            raise InputError(f"function reward {spec!r}: importing {target} failed: {error}") from error
        except Exception as error:
            raise InputError(f"function reward {spec!r}: importing {target} failed: {type(error).__name__}: "
                             f"{error}") from error
    fn = module
    for part in name.split("."):  # Class.method is found too
        if not hasattr(fn, part):
            raise ConfigError(f"function reward {spec!r}: {target} has no {name!r}; expected a function "
                              f"fn(prompts, completions, **columns) -> one float or None per row")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ConfigError(f"function reward {spec!r}: {target}:{name} is a {type(fn).__name__}, not a function")
    return fn, file, module


def _source_file(fn: Callable, module) -> Path | None:
    for candidate in (inspect.unwrap(fn), module):
        try:
            found = inspect.getsourcefile(candidate)
        except TypeError:
            found = None
        if found and Path(found).is_file():
            return Path(found)
    return None


@register("function")
class FunctionReward(RewardSource):
    """A Python callable: `module:function` (importable) or `path/to/file.py:function` (a file, relative
    to the current directory or absolute, imported under a name of its own).

    Called with batches of rows (input order; with shard=(i, n) rows i, i + n, ...):

        fn(prompts: list[str], completions: list[str], **columns) -> one float or None per row

    columns: one list per other column of `rows` (every key of the row dicts but prompt and completion;
    a row without the key gives None). A function that takes **kwargs gets them all; one that does not
    gets only those it names as parameters, so a prompt file's unrelated columns (an id) do not break it.

    Refused (InputError naming `path:function` and the row): an exception inside the function (the first
    row of its batch is named; RSFT_TRACEBACK=1 shows where it was raised), or an answer that is not one
    float or None per row (checked_scores). None is "not scorable": `unscorable` counts them in the last
    score call, and a warning names the count. mean 0 and std 1 unless calibrate() sets them.
    """

    kind = "function"

    def __init__(self, spec: str):
        self.spec = spec
        self.fn, self.file, module = _load_function(spec)
        self.name = spec  # path:function or module:function, as the user wrote it
        self.unscorable = 0
        self.calibration = None
        self.mean, self.std = 0.0, 1.0
        parameters = self._parameters()
        self.takes_all = parameters is None or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                                   for p in parameters.values())
        self.parameters = {} if parameters is None else parameters
        source_file = _source_file(self.fn, module)
        self._identity = {"kind": "function", "spec": spec,
                          "qualname": getattr(self.fn, "__qualname__", type(self.fn).__qualname__),
                          "file": file_digest(source_file) if source_file else None}
        # the local modules it imports (and its module's file, where the function came from elsewhere): an
        # edited helper beside it changes the identity, so scores made with the old one are stale
        source = Path(source_file).resolve() if source_file else None
        module_file = Path(module.__file__).resolve() if getattr(module, "__file__", None) else None
        roots = [f for f in (source, module_file) if f is not None]
        own_module = {module_file} if module_file not in (None, source) and _users(module_file) else set()
        self.imports = sorted(own_module | set(local_imports(*roots)))  # the files digested beside `file`
        for imported in self.imports:
            _IMPORTED_DIGESTS[imported] = file_digest(imported)
        if self.imports:  # absent when there are none: identities recorded before it existed still match
            home = roots[0].parent
            self._identity["imports"] = {_digest_key(f, home): _IMPORTED_DIGESTS[f] for f in self.imports}

    def _parameters(self):
        try:
            return dict(inspect.signature(self.fn).parameters)
        except (TypeError, ValueError):  # a builtin without a signature: pass every column
            return None

    def _columns(self, rows: list[dict] | None) -> dict[str, list]:
        """The extra columns the function gets, one list per column over all rows."""
        names = [] if rows is None else list(dict.fromkeys(k for row in rows for k in row
                                                             if k not in ("prompt", "completion")))
        if not self.takes_all:
            positional = list(self.parameters.values())[2:]  # after prompts and completions
            wanted = [p for p in positional if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                          inspect.Parameter.KEYWORD_ONLY)]
            missing = [p.name for p in wanted if p.default is inspect.Parameter.empty and p.name not in names]
            if missing:
                raise InputError(f"function reward {self.name}: wants the column(s) {missing}, but the rows have "
                                 f"{names or 'no other columns than prompt and completion'}")
            taken = {p.name for p in wanted}
            names = [name for name in names if name in taken]
        return {name: [row.get(name) for row in rows] for name in names}

    def score(self, prompts, completions, rows=None, batch_size=32, progress=True, shard=(0, 1)):
        from tqdm.auto import tqdm

        prompts, completions, rows = _checked_inputs(prompts, completions, rows, shard)
        index, count = shard
        mine = list(range(len(prompts)))[index::count]
        columns = self._columns(rows)
        scores: list[float | None] = [None] * len(prompts)
        unscorable = 0
        starts = range(0, len(mine), max(int(batch_size), 1))
        for start in tqdm(starts, desc="scoring", unit="batch", disable=not progress):
            batch = mine[start:start + batch_size]
            try:
                values = self.fn([prompts[i] for i in batch], [completions[i] for i in batch],
                                 **{name: [values[i] for i in batch] for name, values in columns.items()})
            except Exception as error:
                raise InputError(f"function reward {self.name}: raised on the batch of {len(batch)} rows from row "
                                 f"{batch[0]}: {type(error).__name__}: {error}") from error
            for i, value in zip(batch, checked_scores(values, len(batch), f"function reward {self.name}", batch)):
                scores[i] = value
                unscorable += value is None
        self.unscorable = unscorable
        if unscorable:
            log.warning("function reward %s: %d of %d rows not scorable (None)", self.name, unscorable, len(mine))
        return scores

    def identity(self):
        return dict(self._identity)


COMBINATION_MODES = ("sum", "mean", "min")


@register("combination")
class Combination(RewardSource):
    """Several sources scored together: each component's raw scores are normalised by the component
    (its normalise: trained statistics, a calibration), then combined per row:

        sum:  sum of weight * z
        mean: sum of weight * z / sum of weights (the weights must sum to a positive number: a negative sum
              would reverse the ranking of the weighted sum)
        min:  the smallest z over the components (the weights are ignored)

    A row that any component scores None is None. components() gives each component's raw scores of
    the last call (stage=score keeps them as columns). The combined score is already on a normalised
    scale: mean 0, std 1 (calibrate() may still rescale it). With shard=(i, n) the combination scores
    rows i, i + n, ... with every component, so that all its components score the same rows.
    """

    kind = "combination"

    def __init__(self, components: dict[str, tuple[RewardSource, float]], mode: str = "sum"):
        if mode not in COMBINATION_MODES:
            raise ConfigError(f"reward combination mode={mode!r}; expected one of {', '.join(COMBINATION_MODES)}")
        if not components:
            raise ConfigError("reward combination: no components; name at least one reward source")
        self.parts: dict[str, tuple[RewardSource, float]] = {}
        for name, (source, weight) in components.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise ConfigError(f"reward combination component {name!r}: weight={weight!r}; expected a finite number")
            self.parts[str(name)] = (source, float(weight))
        total = sum(w for _, w in self.parts.values())
        if mode == "mean" and not total > 0:
            # the mean divides the weighted sum by the weights' sum: by 0 it is undefined, by a negative sum it
            # reverses the ranking of the weighted sum it claims to average
            weights = ", ".join(f"{name}: {w:g}" for name, (_, w) in self.parts.items())
            raise ConfigError(f"reward combination mode=mean: the weights ({weights}) sum to {total:g}, and a mean "
                              f"divides by their sum (0: undefined; below 0: the ranking reversed); make the "
                              f"weights sum to a positive number, or use mode=sum")
        self.mode = mode
        self.mean, self.std = 0.0, 1.0
        self.calibration = None
        self.unscorable = 0
        self._last: dict[str, list[float | None]] = {}

    def score(self, prompts, completions, rows=None, batch_size=32, progress=True, shard=(0, 1)):
        prompts, completions, rows = _checked_inputs(prompts, completions, rows, shard)
        index, count = shard
        mine = list(range(len(prompts)))[index::count]
        sub_rows = None if rows is None else [rows[i] for i in mine]
        normalised: dict[str, list[float | None]] = {}
        self._last = {}
        for name, (source, _) in self.parts.items():
            raw = source.score([prompts[i] for i in mine], [completions[i] for i in mine], sub_rows,
                               batch_size, progress)
            full: list[float | None] = [None] * len(prompts)
            for i, r in zip(mine, raw):
                full[i] = r
            self._last[name] = full
            normalised[name] = source.normalise(raw)
        total_weight = sum(w for _, w in self.parts.values())
        scores: list[float | None] = [None] * len(prompts)
        for position, i in enumerate(mine):
            z = {name: normalised[name][position] for name in self.parts}
            if any(v is None for v in z.values()):
                continue
            if self.mode == "min":
                scores[i] = min(z.values())
            else:
                combined = sum(w * z[name] for name, (_, w) in self.parts.items())
                scores[i] = combined / total_weight if self.mode == "mean" else combined
        self.unscorable = sum(scores[i] is None for i in mine)
        return scores

    def components(self):
        return {name: list(values) for name, values in self._last.items()}

    def identity(self):
        return {"kind": "combination", "mode": self.mode,
                "components": {name: {"weight": weight, "mean": source.mean, "std": source.std, **source.identity()}
                               for name, (source, weight) in self.parts.items()}}


def combine(components: dict[str, tuple[RewardSource, float]], mode: str = "sum") -> Combination:
    """A Combination of named (source, weight) components; mode sum | mean | min (Combination)."""
    return Combination(components, mode)






