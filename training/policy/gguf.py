"""A GGUF file, as llama.cpp and Ollama users have it, dequantised once into a Hugging Face directory.

transformers' GGUF loader reads the architecture, the weights (dequantised to float32), the
tokenizer and its chat template from the file; the result is written as a checkpoint directory
(training/policy/checkpoint.py) whose manifest names the source file, its sha256 and its
quantisation. Weights stay float32: the values the quantised file holds, which bf16 would round
again. The directory is cached under the Hugging Face home (`$HF_HOME/crucible/gguf/<sha256>`),
so a file is dequantised once however many experiments or evaluations use it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from huggingface_hub import constants as hub_constants
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.policy.checkpoint import CheckpointError, sha256_file, verify_checkpoint, write_checkpoint_dir
from training.policy.model import quiet_loading


class GGUFError(ValueError):
    """The file cannot be read as a model; the message says why in one sentence."""


def is_gguf(path: Path) -> bool:
    return path.suffix.lower() == ".gguf"


def quantization(path: Path) -> str:
    """The file's quantisation as llama.cpp names it (Q4_1, Q8_0, F16, …)."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as error:
        raise GGUFError(f"{path}: not a GGUF file ({error})") from None
    field = reader.fields.get("general.file_type")
    if field is None:
        return "unknown"
    file_type = int(field.parts[field.data[0]][0])
    try:
        return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"file type {file_type}"


def dequantised(path: Path, cache: Path | None = None) -> Path:
    """The Hugging Face directory of the GGUF file `path`, made on first use."""
    digest = sha256_file(path)
    out = (cache or Path(hub_constants.HF_HOME) / "crucible" / "gguf") / digest[:16]
    with contextlib.suppress(CheckpointError):
        verify_checkpoint(out)
        return out
    kind = quantization(path)
    with quiet_loading():
        try:
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
        except (ValueError, KeyError, OSError, RuntimeError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise GGUFError(f"{path}: transformers cannot load this GGUF file as a causal LM ({reason})") from None
    # The loader marks the model as GGUF-quantised, which save_pretrained refuses; its weights
    # are plain float32 tensors by now.
    model.hf_quantizer = None
    vars(model.config).pop("quantization_config", None)
    model.config.architectures = [type(model).__name__]

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    manifest = {"kind": "dequantised", "source": str(path), "source_sha256": digest, "quantization": kind}
    return write_checkpoint_dir(out, write, manifest)
