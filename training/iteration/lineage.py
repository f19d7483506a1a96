"""Which checkpoint an iteration may use: each one verified by its content hash against what its
training step recorded (the `checkpoints` dataset), and on one lineage from the base policy."""

from __future__ import annotations

from dataclasses import dataclass

from training.iteration.context import Checkpoint, Environment, Refused, SamplingPolicy
from training.policy.checkpoint import CheckpointError, verify_checkpoint


@dataclass(frozen=True)
class Checkpoints:
    """An experiment's checkpoints (0: its base policy) and their training steps' records."""

    env: Environment
    experiment: str

    def sampled_by(self, number: int, max_staleness: int = 0) -> SamplingPolicy:
        """The checkpoint iteration `number` samples from: the newest of `number`-1-k … `number`-1
        (k: `max_staleness`) whose training step has ended (the oldest is always taken, else
        refused), refused as `usable` says. With k = 0, checkpoint `number` - 1."""
        oldest = max(0, number - 1 - max_staleness)
        candidate = next(candidate for candidate in range(number - 1, oldest - 1, -1)
                         if candidate == oldest or self.has_record(candidate))
        return self.sampling(number, candidate)

    def sampling(self, number: int, iteration: int) -> SamplingPolicy:
        """Checkpoint `iteration` as iteration `number`'s sampler, refused as `usable` says."""
        return SamplingPolicy(iteration, self.usable(iteration, f"iteration {number} samples from", rerun_through=number))

    def trained_from(self, number: int) -> Checkpoint:
        """The checkpoint iteration `number`'s training step starts from: `number` - 1, refused as
        `usable` says."""
        return self.usable(number - 1, f"iteration {number} trains from", rerun_through=number)

    def usable(self, iteration: int, use: str, rerun_through: int) -> Checkpoint:
        """Checkpoint `iteration` (directory, content hash), refused unless it is what its training
        step recorded, its lineage holds and its blocking stability checks passed (the refusals ask
        for the iterations up to `rerun_through` again)."""
        policy_dir, content_hash = self.verified(iteration, use)
        record = self.trained(iteration, content_hash, f"{use} it")
        self.lineage_holds(iteration, rerun_through=rerun_through)
        if record and record["blocked"]:
            failed = [m for m in record["monitor_messages"] if ": error: " in m]
            raise Refused(f"{use} checkpoint {iteration}, which failed its stability checks ({'; '.join(failed)}). "
                          f"Change the settings and materialize iteration {iteration} again.")
        return policy_dir, content_hash

    def has_record(self, iteration: int) -> bool:
        """Whether checkpoint `iteration`'s training step has ended (the base policy has none)."""
        return self.env.store().has_partition("checkpoints", self.experiment, iteration)

    def verified(self, iteration: int, use: str) -> Checkpoint:
        """Checkpoint `iteration` (0: the base policy), verified, and its content hash."""
        directory = self.env.checkpoint_dir(self.experiment, iteration)
        try:
            return directory, verify_checkpoint(directory)["content_hash"]
        except CheckpointError as error:
            raise Refused(f"{use} checkpoint {iteration}, which is not usable: {error}. Materialize iteration "
                          f"{iteration} (or the experiment's base_policy) first.") from None

    def lineage_holds(self, last: int, rerun_through: int) -> None:
        """Refused unless every training step up to checkpoint `last` started from the checkpoint
        before it as that one now is (its recorded hash; the base policy's on disk): a re-run of an
        earlier iteration, or a rebuilt base policy, leaves the later checkpoints on another
        lineage, and sampling from or evaluating them would mix the two. The refusal asks for the
        iterations up to `rerun_through` again."""
        _, expected = self.verified(0, f"checkpoint {last} descends from")
        for iteration in range(1, last + 1):
            record = self.record(iteration, f"checkpoint {last} descends from it")
            if record["parent_hash"] != expected:
                raise Refused(f"checkpoint {iteration} was trained from checkpoint {iteration - 1} as it was "
                              f"({str(record['parent_hash'])[:12]}), which has since been replaced ({expected[:12]}): "
                              f"materialize iterations {iteration} to {rerun_through} again, in order.")
            expected = record["content_hash"]

    def record(self, iteration: int, use: str) -> dict:
        """The `checkpoints` row of `iteration`'s training step."""
        store = self.env.store()
        if not store.has_partition("checkpoints", self.experiment, iteration):
            raise Refused(f"checkpoint {iteration} has no record of the training step that made it (its "
                          f"stability checks never ran), and {use}: materialize iteration {iteration}'s checkpoint "
                          "again.")
        [record] = store.read_partition("checkpoints", self.experiment, iteration).to_pylist()
        return record

    def trained(self, iteration: int, content_hash: str, use: str) -> dict | None:
        """The `checkpoints` row of `iteration`'s training step (None for the base policy),
        refused unless it names the checkpoint `content_hash` that is on disk now."""
        if iteration == 0:
            return None
        record = self.record(iteration, use)
        if record["content_hash"] != content_hash:
            raise Refused(f"checkpoint {iteration} on disk is {content_hash[:12]}, not {str(record['content_hash'])[:12]} "
                          f"that iteration {iteration}'s training step recorded (another run, or a failed attempt, "
                          f"replaced it), and {use}: materialize iteration {iteration}'s checkpoint again.")
        return record

    def hash_as_trained_from(self, iteration: int) -> str:
        """The content hash checkpoint `iteration` had when the next training step started from
        it, as that step recorded it: on a lineage `lineage_holds` has checked, the checkpoint as
        it is now, read without hashing its weights again."""
        return self.record(iteration + 1, f"checkpoint {iteration + 1} descends from it")["parent_hash"]

    def recorded_hash(self, iteration: int) -> str | None:
        """The content hash `iteration`'s last training step recorded, if it has one."""
        store = self.env.store()
        if not store.has_partition("checkpoints", self.experiment, iteration):
            return None
        files = store.partition_files("checkpoints", self.experiment, iteration)
        return store.read_files("checkpoints", files, ["content_hash"])["content_hash"][0].as_py()

    def trained_on(self, iteration: int) -> list[str]:
        """The trajectory files checkpoint `iteration` was trained on, by its lineage ([] before
        its training step): a re-run of the iteration's sampling must keep them."""
        store = self.env.store()
        if not store.has_partition("checkpoints", self.experiment, iteration):
            return []
        return store.read_partition("checkpoints", self.experiment, iteration)["trajectories"].to_pylist()[0] or []

    def later_trained(self, iteration: int) -> list[int]:
        """The iterations after `iteration` that have a training step on record: a re-run of it
        leaves them on a lineage whose start it replaced."""
        return [number for number in self.env.store().iterations("checkpoints", self.experiment) if number > iteration]

    def history(self, before: int) -> list[dict]:
        """The `checkpoints` rows of the iterations before `before`, oldest first."""
        store = self.env.store()
        return [store.read_partition("checkpoints", self.experiment, earlier).to_pylist()[0]
                for earlier in range(1, before) if store.has_partition("checkpoints", self.experiment, earlier)]
