"""Import a user's causal LM as an experiment's base policy.

The source is what users have: a Hugging Face directory; a hub id, resolved through the local
Hugging Face cache and downloaded where the network allows (huggingface_hub's own rules:
`HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE`); or a GGUF file as llama.cpp and Ollama keep them,
dequantised once (training/policy/gguf.py; the manifest names the file, its sha256 and its
quantisation). It is checked before anything is written, and each problem is one sentence:
not a causal LM, no loadable tokenizer, a template that cannot render a conversation or no stop
token (training/policy/chat.py), embeddings smaller than the tokenizer, a context shorter than
the experiment's budget. A model without a chat template (a base model) is prompted with a
completion template (training/policy/completion.py), which the checkpoint then carries.

What is written is the source as it is, plus Crucible's manifest: the weights in their own
dtype and shards, the tokenizer files and chat template byte for byte, the generation config
(made from config.json where the source has none); with a completion template, that template and
its stop strings in their place. The one file Crucible may change is
config.json, which gets the keys transformers 4.57 needs beside those transformers 5 wrote
(`portable_config`). Weights saved only as PyTorch pickles are loaded once and written as
safetensors, in their own dtype.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Literal

from huggingface_hub import constants as hub_constants
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from training.policy.chat import ChatFormat, ChatFormatError, generation_config_of
from training.policy.checkpoint import (
    MANIFEST_FILE,
    TOKENIZER_FILES,
    copy_tokenizer_files,
    portable_config,
    sha256_file,
    write_checkpoint_dir,
)
from training.policy.completion import BUILT_IN, DEFAULT, CompletionTemplate, write_completion_format
from training.policy.gguf import GGUFError, dequantised, is_gguf
from training.policy.model import quiet_loading

_WEIGHTS, _WEIGHT_INDEX = "model.safetensors", "model.safetensors.index.json"
_CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")  # the classes AutoModelForCausalLM loads
PromptFormat = Literal["chat", "completion"]
NO_CHAT_TEMPLATE = "the model has no chat template (a base model), so it is prompted with a completion template"


class ModelImportError(ValueError):
    """The source is not a model Crucible can post-train; the message says why in one sentence."""


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def resolve_source(source: str) -> Path:
    """The Hugging Face directory `source` names: a local directory, a GGUF file (dequantised
    once), or a hub id (from the local cache, else downloaded)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path.resolve()
    if is_gguf(path):
        if not path.is_file():
            raise ModelImportError(f"base_model {source!r}: no such GGUF file")
        try:
            return dequantised(path.resolve())
        except GGUFError as error:
            raise ModelImportError(str(error)) from None
    return _hub_snapshot(source)


# What a causal LM's directory needs; a repository's other copies (GGUF, ONNX, pickles beside
# safetensors, original/ checkpoints) are left on the hub.
_HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.tiktoken", "*.txt"]


def _hub_snapshot(repo_id: str) -> Path:
    """`repo_id`'s files from the local cache, else downloaded (pickled weights only where the
    repository has no safetensors)."""
    try:
        directory = Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES))
        if not _weights(directory):
            directory = Path(snapshot_download(repo_id, allow_patterns=[*_HUB_FILES, "pytorch_model*.bin"]))
        return directory
    except HFValidationError:
        raise ModelImportError(f"base_model {repo_id!r} is neither a directory, a .gguf file nor a hub id "
                               "(owner/name)") from None
    except LocalEntryNotFoundError:
        raise ModelImportError(f"base_model {repo_id!r} is not in the local Hugging Face cache "
                               f"({hub_constants.HF_HUB_CACHE}) and cannot be downloaded "
                               f"{'with HF_HUB_OFFLINE set' if hub_constants.is_offline_mode() else 'from ' + hub_constants.ENDPOINT}"
                               ": `hf download` it where the network allows, or give its directory") from None
    except (HfHubHTTPError, OSError) as error:
        raise ModelImportError(f"base_model {repo_id!r} cannot be downloaded from {hub_constants.ENDPOINT} "
                               f"({_first_line(error)})") from None


def check_source(directory: Path, context_tokens: int, completion: CompletionTemplate | None = None) -> ChatFormat:
    """The source's chat format (`completion`'s, where given, instead of its own template), once
    it is known to be a causal LM Crucible can drive with a context of `context_tokens`."""
    try:
        config = AutoConfig.from_pretrained(directory)
    except (OSError, ValueError, KeyError) as error:
        raise ModelImportError(f"{directory}: config.json cannot be read as a Hugging Face model config "
                               f"({_first_line(error)})") from None
    architectures = config.architectures or []
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (
            architectures and not any(name.endswith(_CAUSAL_HEADS) for name in architectures)):
        named = ", ".join(architectures) or "no architecture named"
        raise ModelImportError(f"{directory}: a {config.model_type!r} model ({named}) is not a causal language model "
                               "that transformers can load with AutoModelForCausalLM")
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ModelImportError(f"{directory}: no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, …)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError, KeyError) as error:
        raise ModelImportError(f"{directory}: the tokenizer cannot be loaded ({_first_line(error)})") from None
    generation_config = generation_config_of(directory)
    if completion is not None:
        tokenizer.chat_template, generation_config.stop_strings = completion.jinja, list(completion.stop_strings)
    try:
        chat = ChatFormat.of(tokenizer, generation_config)
    except ChatFormatError as error:
        raise ModelImportError(f"{directory}: {error}") from None
    vocabulary = getattr(config.get_text_config(), "vocab_size", None)
    if vocabulary is not None and vocabulary < len(tokenizer):
        raise ModelImportError(f"{directory}: the embeddings cover {vocabulary} tokens, fewer than the tokenizer's "
                           f"{len(tokenizer)}")
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if positions is not None and positions < context_tokens:
        raise ModelImportError(f"{directory}: the model's context is {positions} tokens, shorter than the experiment's "
                           f"budget of {context_tokens} (episode_max_tokens)")
    if not _weights(directory) and not list(directory.glob("pytorch_model*.bin")):
        raise ModelImportError(f"{directory}: no weights ({_WEIGHTS}, its shards with {_WEIGHT_INDEX}, or "
                               "pytorch_model*.bin)")
    return chat


def checked_source(source: str, context_tokens: int, prompt_format: PromptFormat | None = None,
                   completion: CompletionTemplate = BUILT_IN[DEFAULT]) -> tuple[Path, PromptFormat]:
    """The directory `source` names and the prompt format it gets (`import_model`), once it is
    checked (`check_source`)."""
    directory = resolve_source(source)
    chosen = prompt_format or ("chat" if _has_chat_template(directory) else "completion")
    check_source(directory, context_tokens, completion if chosen == "completion" else None)
    return directory, chosen


def import_model(source: str, out_dir: str | Path, context_tokens: int, prompt_format: PromptFormat | None = None,
                 completion: CompletionTemplate = BUILT_IN[DEFAULT]) -> Path:
    """Check `source` and write it as a Crucible checkpoint at `out_dir` (atomically), prompted
    with its chat template or `completion` as `prompt_format` says (None: the chat template where
    the source has one, else `completion`; the manifest says which, and why)."""
    directory, chosen = checked_source(source, context_tokens, prompt_format, completion)
    source_files = {p.name: sha256_file(p) for p in sorted(directory.iterdir()) if p.is_file()}

    def write(tmp: Path) -> None:
        _copy_weights(directory, tmp)
        shutil.copyfile(directory / "config.json", tmp / "config.json")
        portable_config(tmp / "config.json")
        if (directory / "generation_config.json").is_file():
            shutil.copyfile(directory / "generation_config.json", tmp / "generation_config.json")
        else:
            generation_config_of(directory).save_pretrained(tmp)
        copy_tokenizer_files(directory, tmp)
        if chosen == "completion":
            write_completion_format(tmp, completion)

    prompted = {"prompt_format": chosen}
    if chosen == "completion":
        prompted |= {"completion_template": completion.name, "stop_strings": list(completion.stop_strings)}
        if prompt_format is None:
            prompted["prompt_format_reason"] = NO_CHAT_TEMPLATE
    manifest = {"kind": "imported", "source": source, "source_dir": str(directory), "source_files": source_files,
                **_dequantised_from(directory), **prompted}
    return write_checkpoint_dir(out_dir, write, manifest)


def prompted_model(source: str, prompt_format: PromptFormat | None, completion: CompletionTemplate,
                   context_tokens: int) -> Path:
    """A directory that samples `source` with the prompt format chosen as `import_model` chooses
    it: the source's own where that is its chat template, else an import with `completion`,
    made once and cached under the Hugging Face home (`$HF_HOME/crucible/prompted/<hash>`)."""
    directory = resolve_source(source)
    if (prompt_format or ("chat" if _has_chat_template(directory) else "completion")) == "chat":
        return directory
    key = json.dumps([str(directory), completion.jinja, completion.stop_strings, context_tokens])
    out = Path(hub_constants.HF_HOME) / "crucible" / "prompted" / hashlib.sha256(key.encode()).hexdigest()[:16]
    if not (out / MANIFEST_FILE).is_file():
        import_model(str(directory), out, context_tokens, "completion", completion)
    return out


def _has_chat_template(directory: Path) -> bool:
    try:
        return bool(AutoTokenizer.from_pretrained(directory).chat_template)
    except (OSError, ValueError, KeyError):
        return False  # check_source says why the tokenizer cannot be loaded


def _dequantised_from(directory: Path) -> dict:
    """The GGUF file a dequantised directory was made from: its path, sha256 and quantisation."""
    manifest = directory / MANIFEST_FILE
    if not manifest.is_file():
        return {}
    made = json.loads(manifest.read_text())
    if made.get("kind") != "dequantised":
        return {}
    return {"gguf": {key: made[key] for key in ("source", "source_sha256", "quantization")}}


def _weights(directory: Path) -> list[Path]:
    """The safetensors files transformers loads: model.safetensors, or the shards its index names
    (not a repository's other copies, such as Mistral's consolidated.safetensors)."""
    if (directory / _WEIGHT_INDEX).is_file():
        shards = json.loads((directory / _WEIGHT_INDEX).read_text())["weight_map"].values()
        return [directory / _WEIGHT_INDEX, *(directory / name for name in sorted(set(shards)))]
    return [directory / _WEIGHTS] if (directory / _WEIGHTS).is_file() else []


def _copy_weights(directory: Path, tmp: Path) -> None:
    """The safetensors weights (and shard index) as they are; pickled weights converted once
    (config.json and generation_config.json, which that also writes, are replaced after)."""
    weights = _weights(directory)
    if not weights:
        with quiet_loading():
            AutoModelForCausalLM.from_pretrained(directory, dtype="auto").save_pretrained(tmp)
    for path in weights:
        shutil.copyfile(path, tmp / path.name)

