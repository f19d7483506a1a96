"""How an error ends a step: the one place that decides what a retry can fix.

- A refusal of the data path (training/iteration's `Refused`), or a write a full disk refuses,
  fails the step with its one sentence and is not retried: the same inputs meet the same refusal.
- A storage root that does not answer (an S3 server restarting, a network cut) is asked again up
  to STORAGE_RETRIES times, STORAGE_RETRY_WAIT_S apart, within the run: whether the store said so
  itself, or another error (DuckDB's, a client library's) came while the root did not answer. If
  it still does not answer, the step fails with the sentence that names the root, and `crucible
  run` resumes the experiment once it is back. What was published before stays: a manifest is
  one PUT, whole or absent.
- Anything else is the asset's own (a RetryPolicy where it declares one).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from dagster import Failure, RetryRequested

from datastore.store import DatasetStore, StorageFull, StorageUnreachable
from training.iteration.context import Refused
from training.policy.checkpoint import CheckpointSpaceError

STORAGE_RETRIES = 3
STORAGE_RETRY_WAIT_S = 20


@contextmanager
def failure_policy(storage: DatasetStore) -> Iterator[None]:
    """Apply the module's rules to what the body raises; `storage` is the root the step uses."""
    try:
        yield
    except (Failure, RetryRequested):
        raise
    except (Refused, StorageFull, CheckpointSpaceError) as refusal:
        raise Failure(str(refusal), allow_retries=False) from None
    except StorageUnreachable as outage:
        _ask_again(outage)
    except Exception as error:
        outage = storage.unreachable()
        if outage is None:
            raise
        _ask_again(outage, error)


def _ask_again(outage: StorageUnreachable, error: Exception | None = None) -> NoReturn:
    """Retry the step; once the retries are spent, its failure is this sentence (the cause), which
    names the step's own `error` (Dagster records a retry's cause, not what lies under it)."""
    met = ""
    if error is not None:
        first_line = (str(error).strip().splitlines() or [""])[0]
        met = f" (the step met {type(error).__name__}: {first_line})"
    told = Failure(f"{outage} (a step asks again up to {STORAGE_RETRIES} times, {STORAGE_RETRY_WAIT_S} s apart, "
                   f"before it fails): once it answers, `crucible run` resumes the experiment where it stopped{met}")
    raise RetryRequested(max_retries=STORAGE_RETRIES, seconds_to_wait=STORAGE_RETRY_WAIT_S) from told
