"""Data parallel training under torchrun on the CPU (gloo): two ranks given the same global
batch take the same step as one rank, with DDP and with FSDP2, and only rank 0 writes; the
warm-up too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train_ranks import samples
from training.optim.distributed import Ranks
from training.optim.saving import OPTIMIZER_FILE
from training.policy.checkpoint import read_manifest, verify_checkpoint
from training.policy.model import build_base_policy, load_policy
from training.policy.settings import PolicyConfig
from training.rl.forward import Forward
from training.rl.settings import GRPOConfig
from training.rl.trainer import TrainSample, _minibatches

ROOT = Path(__file__).resolve().parent.parent
TINY = PolicyConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128,
                    max_position_embeddings=256, seed=0)  # fmt: skip
# Two optimizer steps over micro-batches small enough that each rank gets several, unevenly.
SETTINGS = dict(lr=1e-3, lr_warmup_steps=0, epochs=1, minibatch_size=12, micro_batch_tokens=60, threads=2)
# Three warm-up steps of 8 demonstrations, each step in several passes that two ranks share unevenly.
WARMUP = dict(lr=1e-3, warmup_steps=0, steps=3, batch_size=8, micro_batch_tokens=60, threads=2)


def torchrun(ranks: int, policy: Path, out: Path, kind: str = "grpo", **settings) -> dict:
    defaults = SETTINGS if kind == "grpo" else WARMUP
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               str(ROOT / "tests" / "train_ranks.py"), str(policy), str(out), json.dumps(defaults | settings), kind]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_base_policy(tmp_path_factory.mktemp("base") / "policy", TINY)


@pytest.fixture(scope="module")
def one_rank(base, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "policy"
    return out, torchrun(1, base, out)


def max_weight_difference(a: Path, b: Path) -> float:
    first, second = load_policy(a)[0].state_dict(), load_policy(b)[0].state_dict()
    return max(float((first[name] - second[name]).abs().max()) for name in first)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_take_the_same_step_as_one(parallel, base, one_rank, tmp_path):
    out = tmp_path / "policy"
    metrics = torchrun(2, base, out, parallel=parallel)
    reference, expected = one_rank  # FSDP runs whole rows: against one rank that does too
    if parallel == "fsdp":
        reference = tmp_path / "one"
        expected = torchrun(1, base, reference, parallel=parallel)
    assert metrics["optimizer_steps"] == expected["optimizer_steps"] == 2
    assert metrics["loss"] == pytest.approx(expected["loss"], rel=1e-4, abs=1e-6)
    assert metrics["tokens"] == expected["tokens"]  # the same micro-batches, shared out
    assert metrics["final_kl"] == pytest.approx(expected["final_kl"], rel=1e-3, abs=1e-7)
    assert max_weight_difference(out, base) > 1e-4  # the step moved the weights...
    assert max_weight_difference(out, reference) < 1e-5  # ...and both ways to the same place
    manifest = verify_checkpoint(out)
    assert (manifest["world_size"], manifest["device"], manifest["parallel"]) == (2, "cpu", parallel)
    assert not list(tmp_path.glob(".*"))  # one writer: no second temporary or progress file left behind


def test_two_ranks_warm_up_as_one_does(base, tmp_path):
    """The warm-up runs the RL step's loop (whose FSDP path the tests above take): shared out
    over DDP ranks, it takes the same steps."""
    one = torchrun(1, base, tmp_path / "one", "sft")
    two = torchrun(2, base, tmp_path / "two", "sft")
    assert two["steps"] == one["steps"] == 3 and two["tokens"] == one["tokens"]
    assert two["final_loss"] == pytest.approx(one["final_loss"], rel=1e-4)
    assert max_weight_difference(tmp_path / "two", base) > 1e-4
    assert max_weight_difference(tmp_path / "two", tmp_path / "one") < 1e-5
    assert verify_checkpoint(tmp_path / "two")["world_size"] == 2


def test_the_optimizer_state_of_a_sharded_step_carries_into_an_unsharded_one(base, one_rank, tmp_path):
    """Optimizer moments are saved by parameter name, unsharded: the next step loads them on any
    number of ranks and with either wrapping."""
    sharded = tmp_path / "sharded"
    torchrun(2, base, sharded, parallel="fsdp")
    assert (sharded / OPTIMIZER_FILE).is_file()
    after_sharded = torchrun(1, sharded, tmp_path / "next-1")
    after_plain = torchrun(1, one_rank[0], tmp_path / "next-2")
    assert after_sharded["loss"] == pytest.approx(after_plain["loss"], rel=1e-4, abs=1e-6)
    assert max_weight_difference(tmp_path / "next-1", tmp_path / "next-2") < 1e-5
    assert read_manifest(tmp_path / "next-1")["global_step"] == 4


def test_a_rank_with_fewer_micro_batches_pads_with_uncounted_passes():
    """Three micro-batches over two ranks: rank 1 runs its one and a padding pass that weighs 0,
    so both ranks run two forward and backward passes (DDP and FSDP need as many on each)."""
    batch = [TrainSample([5] * (i + 2), [6, 7], [-1.0, -1.0], 0.0, "g") for i in range(3)]  # lengths rise with i
    shares = [Forward(0, micro_batch_tokens=1, temperature=1.0, ranks=Ranks(rank, 2)).share(batch, [0, 1, 2])
              for rank in (0, 1)]
    assert [[(m.rows, m.counted) for m in share] for share in shares] == [
        [([0], True), ([2], True)], [([1], True), ([0], False)]]


def test_the_test_batch_leaves_a_rank_short_in_every_step():
    """The step tests above give the ranks unequal micro-batch counts in both optimizer steps, so
    their equality covers the padding passes, and micro-batches with a shared prefix."""
    forward = Forward(pad_id=0, micro_batch_tokens=SETTINGS["micro_batch_tokens"], temperature=1.0,
                      share_prefixes=True)
    steps = _minibatches(len(samples()), GRPOConfig(**SETTINGS))
    micro_batches = [forward.micro_batches(samples(), rows) for rows in steps]
    assert [len(micro) % 2 for micro in micro_batches] == [1, 1]
    assert any(m.batch.shared_prefix for micro in micro_batches for m in micro)  # the ranks run shared prefixes
