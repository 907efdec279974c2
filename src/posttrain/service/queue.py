"""The per-model request queue of the Tinker-compatible service: each model's requests run in `seq_id` order, and
a retried submit of the same (model_id, seq_id) is the same request, run once.

The SDK numbers a training client's requests 1, 2, 3, ... (seq_id = its request counter + 1) and sends each after
the previous submit returned, so they normally arrive in order; a retry after a lost answer arrives twice. A gap
(a seq_id that never comes, e.g. an id the client reserved and did not send) would stall the model forever, so a
request waiting behind a gap for `gap_wait_s` seconds runs anyway, lowest seq_id first.

Pure bookkeeping: no threads, no I/O. The caller hands what `submit` and `ready` return to its one worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def request_id_of(model_id: str, seq_id: int) -> str:
    return f"{model_id}#{seq_id}"


@dataclass
class _ModelLine:
    next_seq: int = 1
    waiting: dict[int, tuple[str, Any, float]] = field(default_factory=dict)  # seq_id -> (request_id, job, since)


class SeqQueue:
    def __init__(self, gap_wait_s: float = 2.0):
        self.gap_wait_s = gap_wait_s
        self._lines: dict[str, _ModelLine] = {}
        self._seen: set[str] = set()

    def submit(self, model_id: str, seq_id: int, job: Any, now: float) -> tuple[str, bool]:
        """Registers `job` as request (model_id, seq_id). Returns (request_id, new): new is False for a duplicate,
        whose job is dropped (the first one's answer is the answer)."""
        rid = request_id_of(model_id, seq_id)
        if rid in self._seen:
            return rid, False
        self._seen.add(rid)
        self._lines.setdefault(model_id, _ModelLine()).waiting[seq_id] = (rid, job, now)
        return rid, True

    def ready(self, now: float) -> list[tuple[str, Any]]:
        """The (request_id, job) pairs that may run now, in the order to run them: per model, every request whose
        seq_id is the next expected one, and behind a gap older than gap_wait_s the lowest waiting one."""
        out: list[tuple[str, Any]] = []
        for line in self._lines.values():
            while line.waiting:
                if line.next_seq not in line.waiting:
                    lowest = min(line.waiting)
                    if lowest < line.next_seq or now - line.waiting[lowest][2] >= self.gap_wait_s:
                        line.next_seq = lowest
                    else:
                        break
                rid, job, _ = line.waiting.pop(line.next_seq)
                out.append((rid, job))
                line.next_seq += 1
        return out

    def forget_model(self, model_id: str) -> None:
        """Drops a freed model's waiting requests; its request ids stay seen (a late retry is still a duplicate)."""
        self._lines.pop(model_id, None)

    def waiting_count(self) -> int:
        return sum(len(line.waiting) for line in self._lines.values())
