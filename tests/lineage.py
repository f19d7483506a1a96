"""What the tests that run whole experiments check of their checkpoints' lineage."""

from __future__ import annotations

from assets.resources import CrucibleResource
from training.policy.checkpoint import verify_checkpoint
from training.rl.settings import GRPOConfig

# A tiny policy rarely gets a reward spread, so the default trainer would take no optimizer step and
# every checkpoint would be its parent, one hash: a wrong parent would go unseen. Zero-advantage
# samples kept, and weight decay, move every step.
EVERY_STEP_MOVES = GRPOConfig(zero_variance_groups="keep", skip_zero_advantage=False, weight_decay=0.1, epochs=1)


def assert_one_lineage(crucible: CrucibleResource, name: str, iterations: int, max_staleness: int = 0) -> list[int]:
    """Every iteration's samples come from a checkpoint within its bound (checkpoint N-1 with
    max_staleness 0; one of N-1-k … N-1 with k): each row says which and how stale, and its
    checkpoint's lineage names it; every checkpoint's parent is the previous checkpoint, as each is
    on disk now; and no two checkpoints are alike, without which a wrong parent would go unseen.
    The staleness each iteration sampled at, in order."""
    store = crucible.store()
    hashes = [verify_checkpoint(crucible.checkpoint_dir(name, number))["content_hash"] for number in range(iterations + 1)]
    assert len(set(hashes)) == iterations + 1, hashes
    staleness = []
    for number in range(1, iterations + 1):
        samples = store.read_partition("trajectories", name, number).select(
            ["policy_version", "policy_iteration", "staleness"]).to_pylist()
        [row] = store.read_partition("checkpoints", name, number).to_pylist()
        [sampled_by] = {sample["policy_iteration"] for sample in samples}  # one sampler per iteration
        assert max(0, number - 1 - max_staleness) <= sampled_by <= number - 1, f"iteration {number}"
        sampler = {"policy_version": hashes[sampled_by], "policy_iteration": sampled_by,
                   "staleness": number - 1 - sampled_by}
        assert all(sample == sampler for sample in samples), f"iteration {number}"
        assert row["parent_hash"] == hashes[number - 1], f"iteration {number}"
        assert row["samplers"] == [{"iteration": sampled_by, "content_hash": hashes[sampled_by]}], f"iteration {number}"
        assert row["content_hash"] == hashes[number]
        staleness.append(sampler["staleness"])
    return staleness
