"""Tiles of the relayout sketch (`tuning.space`, `space_rules.Relayout`) that grouped
convolutions constrain.

A grouped convolution (`workloads.conv2d_grouped`) reads its input channel as
``f // group * cig + rc``: with the accumulator's output channels innermost and vectorised, the
input element is one broadcast per vector when the vector's lanes lie in one group. The
vectorizer keeps a load's index a broadcast only where the simplifier shows every lane has the
same quotient, which it does for a vector of exactly one group (``(k * g + i) // g``), not for
a narrower one (``(k * v + i) // g``: it would need ``k``'s residue). So the innermost
output-channel tile of a grouped relayout is the group, whatever the draw or the mutation
gave; the outer levels are drawn over the groups.
"""

from __future__ import annotations

from typing import Any

from .space_rules import LAYOUT_BLOCK_MAX, Relayout, sample_tile, vector_max


def layout_tile(builder: Any, key: str, extent: int, levels: int, last: bool,
                rel: Relayout | None) -> tuple[int, ...]:
    """Tile knob ``key`` of an accumulator axis of ``extent`` in the relayout sketch (``last``:
    the output-channel axis, vectorised): a block of at most `LAYOUT_BLOCK_MAX` pixels, or
    at most `vector_max` channels -- for a grouped convolution, exactly its group's channels
    innermost (``builder`` is `tuning.space`'s instantiation: its ``tile`` knob, the value
    recorded as used)."""
    if not last:
        return builder.tile(key, extent, levels, max_inner=LAYOUT_BLOCK_MAX)  # type: ignore[no-any-return]
    v: tuple[int, ...] = builder.tile(key, extent, levels, max_inner=vector_max(rel), vector=True)
    g = rel.group if rel is not None else None
    if g is None or v[-1] == g or extent % g:
        return v
    v = (*sample_tile(extent // g, levels - 1, builder._draw(key)), g)
    builder.used[key] = v
    return v
