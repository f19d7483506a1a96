"""Progress counts become log lines only when they say something new (training/progress.py)."""

from __future__ import annotations

from training.progress import ProgressLines


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def reporter(every_s: float = 5.0) -> tuple[ProgressLines, list[str], Clock]:
    lines, clock = [], Clock()
    return ProgressLines(lines.append, "episodes: {done}/{total} ended", every_s, clock), lines, clock


def test_a_count_reported_again_unchanged_prints_no_second_line():
    progress, lines, clock = reporter()
    for _ in range(3):
        progress(0, 1024)
        clock.now += 10
    assert lines == ["episodes: 0/1024 ended"]


def test_changes_within_the_interval_wait_for_it():
    progress, lines, clock = reporter(every_s=5)
    for done in range(0, 40, 4):  # a change every second
        progress(done, 100)
        clock.now += 1
    assert lines == ["episodes: 0/100 ended", "episodes: 20/100 ended"]


def test_the_final_count_prints_at_once_and_only_once():
    progress, lines, _ = reporter(every_s=5)
    progress(1, 2)
    progress(2, 2)
    progress(2, 2)
    assert lines == ["episodes: 1/2 ended", "episodes: 2/2 ended"]
