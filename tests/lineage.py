"""What the tests that run whole experiments check of their checkpoints' lineage."""

from __future__ import annotations

from assets.resources import CrucibleResource
from training.policy.checkpoint import verify_checkpoint
from training.rl.settings import GRPOConfig

# A tiny policy rarely gets a reward spread, so the default trainer would take no optimizer step and
# every checkpoint would be its parent, one hash: a wrong parent would go unseen. Zero-advantage
# samples kept, and weight decay, move every step.
EVERY_STEP_MOVES = GRPOConfig(zero_variance_groups="keep", skip_zero_advantage=False, weight_decay=0.1, epochs=1)


def assert_one_lineage(crucible: CrucibleResource, name: str, iterations: int) -> None:
    """Every iteration's samples come from the previous checkpoint (each row says so, and its
    checkpoint's lineage), and every checkpoint's parent is the previous checkpoint, as each is on
    disk now; and no two checkpoints are alike, without which a wrong parent would go unseen."""
    store = crucible.store()
    hashes = [verify_checkpoint(crucible.checkpoint_dir(name, number))["content_hash"] for number in range(iterations + 1)]
    assert len(set(hashes)) == iterations + 1, hashes
    for number in range(1, iterations + 1):
        parent = hashes[number - 1]
        samples = store.read_partition("trajectories", name, number).select(
            ["policy_version", "policy_iteration", "staleness"]).to_pylist()
        [row] = store.read_partition("checkpoints", name, number).to_pylist()
        sampler = {"policy_version": parent, "policy_iteration": number - 1, "staleness": 0}
        assert all(sample == sampler for sample in samples) and row["parent_hash"] == parent, f"iteration {number}"
        assert row["samplers"] == [{"iteration": number - 1, "content_hash": parent}], f"iteration {number}"
        assert row["content_hash"] == hashes[number]
