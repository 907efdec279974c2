"""Packed rows: a batch's sequences laid end to end in as few rows as fit, instead of one row each padded to the
longest. Pure functions on token ids and lengths; `training/batch.py` runs the model over the rows.

Attention stays within each sequence because the position ids restart at 0 at every sequence's first token and
the model gets no attention mask: transformers (5.x, `masking_utils.find_packed_sequence_indices`) then reads each
row's sequence boundaries from the position ids and builds a block-diagonal causal mask, for sdpa and eager
attention alike, one row or many (tests/test_packing.py checks that a sequence's neighbours in its row change
none of its outputs). A row's tail after its last sequence continues that sequence's positions: the tail comes
after every real token, so under causal attention no real token sees it, whatever its ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedRows:
    input_ids: torch.Tensor     # [R, C] the sequences end to end; each row's tail (after its last sequence) is filler
    position_ids: torch.Tensor  # [R, C] 0, 1, ... within each sequence; the tail continues its row's last sequence
    row: torch.Tensor           # [B] the row that holds sequence b
    offset: torch.Tensor        # [B] the column of sequence b's first token in its row
    lengths: torch.Tensor       # [B] tokens of sequence b


def assign_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: sequences longest first (ties by index), each into the first row with room for it,
    else a new row. Returns each row's sequence indices in the order they are laid out. `capacity`: tokens per row,
    at least the longest sequence."""
    if any(n < 1 for n in lengths):
        raise ValueError(f"sequence lengths {lengths}: every sequence needs at least one token")
    if lengths and capacity < max(lengths):
        raise ValueError(f"row capacity {capacity} tokens is below the longest sequence ({max(lengths)} tokens)")
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = next((r for r, room in enumerate(free) if room >= lengths[i]), None)
        if r is None:
            rows.append([])
            free.append(capacity)
            r = len(rows) - 1
        rows[r].append(i)
        free[r] -= lengths[i]
    return rows


def pack_rows(input_ids: torch.Tensor, lengths: torch.Tensor, capacity: int | None = None,
              filler_id: int = 0) -> PackedRows:
    """The first lengths[b] ids of each row b of `input_ids` [B, L] (right-padded) packed into rows of at most
    `capacity` tokens (None: the longest sequence, so packed rows are never longer than padded ones). Rows are as
    long as the fullest one; `filler_id` fills the tails (any id in the vocabulary: no real token attends to it)."""
    lens = [int(n) for n in lengths]
    if len(lens) != input_ids.shape[0]:
        raise ValueError(f"{len(lens)} lengths for {input_ids.shape[0]} sequences")
    if lens and max(lens) > input_ids.shape[1]:
        raise ValueError(f"a sequence of {max(lens)} tokens in input ids of width {input_ids.shape[1]}")
    layout = assign_rows(lens, capacity if capacity is not None else max(lens, default=1))
    width = max((sum(lens[i] for i in seqs) for seqs in layout), default=1)
    ids = torch.full((len(layout), width), filler_id, dtype=input_ids.dtype)
    positions = torch.zeros((len(layout), width), dtype=torch.long)
    row = torch.zeros(len(lens), dtype=torch.long)
    offset = torch.zeros(len(lens), dtype=torch.long)
    for r, seqs in enumerate(layout):
        col = 0
        for i in seqs:
            n = lens[i]
            ids[r, col:col + n] = input_ids[i, :n]
            positions[r, col:col + n] = torch.arange(n)
            row[i], offset[i] = r, col
            col += n
        positions[r, col:] = positions[r, col - 1] + 1 + torch.arange(width - col)
    return PackedRows(ids, positions, row, offset, torch.tensor(lens, dtype=torch.long))


def at_packed_completion_positions(per_position: torch.Tensor, rows: PackedRows, starts: torch.Tensor,
                                   completion_width: int, where: torch.Tensor | None = None) -> torch.Tensor:
    """[R, C, D] outputs over packed rows -> [B, T, D] at the positions that predict each completion token: for
    sequence b, token j of its completion (which begins at index starts[b] of the sequence) is predicted at
    column offset[b] + starts[b] - 1 + j of its row; the layout `batch.at_completion_positions` gives for padded
    rows. Columns past a sequence's end (completion padding, masked out by the caller) read its last token, never
    a neighbour. T = `completion_width`. `where` ([B, T] bool): only those positions, [N, D] in row-major order."""
    if bool((starts < 1).any()):
        raise ValueError("every sequence needs at least one prompt token: the first completion token is predicted "
                         "from the position before it")
    R, C, D = per_position.shape
    j = torch.arange(completion_width).unsqueeze(0)
    within = torch.minimum(starts.unsqueeze(1) - 1 + j, (rows.lengths - 1).unsqueeze(1))
    flat = (rows.row * C + rows.offset).unsqueeze(1) + within
    return per_position.reshape(R * C, D)[flat if where is None else flat[where]]
