"""Tiles of the relayout sketch (`tuning.space`, `space_rules.Relayout`) that grouped
convolutions constrain.

A grouped convolution (`workloads.conv2d_grouped`) reads its input channel as
``f // group * cig + rc``: with the accumulator's output channels innermost and vectorised, the
input element is one broadcast per vector when the vector's lanes lie in one group. The
vectorizer keeps a load's index a broadcast only where the simplifier shows every lane has the
same quotient: for a vector of exactly one group (``(k * g + i) // g``), and for whole vectors
that divide the group (``(k * v + i) // g == k // (g / v)`` for lanes ``i < v``). So the
innermost output-channel tile of a grouped relayout is the group (up to 32 channels) or one
of `space_rules.group_vectors` (a wider group), whatever the draw or the mutation gave; the
outer levels are drawn over what is left.
"""

from __future__ import annotations

from typing import Any

from .space_rules import LAYOUT_BLOCK_MAX, Relayout, group_vectors, sample_tile, vector_max


def layout_tile(builder: Any, key: str, extent: int, levels: int, last: bool,
                rel: Relayout | None) -> tuple[int, ...]:
    """Tile knob ``key`` of an accumulator axis of ``extent`` in the relayout sketch (``last``:
    the output-channel axis, vectorised): a block of at most `LAYOUT_BLOCK_MAX` pixels, or
    at most `vector_max` channels -- for a grouped convolution, exactly its group's channels
    innermost, or whole vectors dividing a wider group (``builder`` is `tuning.space`'s
    instantiation: its ``tile`` knob, the value recorded as used)."""
    if not last:
        return builder.tile(key, extent, levels, max_inner=LAYOUT_BLOCK_MAX)  # type: ignore[no-any-return]
    v: tuple[int, ...] = builder.tile(key, extent, levels, max_inner=vector_max(rel), vector=True)
    g = rel.group if rel is not None else None
    if g is None or v[-1] in group_vectors(g) or extent % g:
        return v
    w = vector_max(rel)
    v = (*sample_tile(extent // w, levels - 1, builder._draw(key)), w)
    builder.used[key] = v
    return v
