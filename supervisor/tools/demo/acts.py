"""The demo's acts as it reports them: what each ended with against what the
story says it ends with, and the table of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Act:
    number: int
    label: str
    #: What the story says the act ends with.
    expected: dict[str, Any]
    job_id: int | None = None
    receipt_attempts: list[int] = field(default_factory=list)
    requests: int = 0
    sent: int = 0
    status: str = "-"
    attempt: int = 0
    #: (attempt, reason) of every "lost its lease" warning the workers logged for the job.
    lost: list[tuple[int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    logs: dict[str, str] = field(default_factory=dict)

    @property
    def rejections(self) -> list[int]:
        """The attempts whose completion the fence rejected."""
        return [attempt for attempt, reason in self.lost if reason == "fence_rejected"]

    def outcome(self) -> dict[str, Any]:
        return {"receipts": sorted(self.receipt_attempts), "requests": self.requests, "sent": self.sent,
                "status": self.status, "attempt": self.attempt, "lost": sorted(self.lost)}

    def mismatches(self) -> list[str]:
        got = self.outcome()
        out = [f"{key} {got[key]!r}, expected {want!r}" for key, want in self.expected.items() if got[key] != want]
        return self.problems + out

    def cells(self) -> list[str]:
        attempts = ",".join(map(str, self.receipt_attempts))
        word = "attempt" if len(self.receipt_attempts) == 1 else "attempts"
        receipts = f"{len(self.receipt_attempts)}" + (f" ({word} {attempts})" if attempts else "")
        rejected = ",".join(map(str, self.rejections))
        rejections = f"{len(self.rejections)}" + (f" (attempt {rejected})" if rejected else "")
        return [self.label, str(self.job_id if self.job_id is not None else "-"), receipts,
                str(self.requests), str(self.sent), f"{self.status}/{self.attempt}", rejections]


HEADERS = ["act", "job", "receipts rows", "email requests", "emails sent", "job status/attempt",
           "fence rejections"]


def table(acts: list[Act]) -> str:
    """The acts as columns separated by at least two spaces."""
    rows = [HEADERS] + [act.cells() for act in acts]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)
