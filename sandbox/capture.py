"""What is kept of a command's output: an excerpt of each stream and the total size."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OutputCapture:
    """The first `keep` bytes of one stream, and how many bytes it produced in all."""

    name: str  # "stdout" or "stderr"
    keep: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.keep - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)
