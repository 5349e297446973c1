"""The pipeline schedule as a Gantt chart: pipeline ranks by time, one bar per F / B / W block.

Bars are exactly the blocks of the schedule model's ScheduleResult (the events the estimate used),
coloured by kind (lighter for later virtual stages) and labelled by micro-batch where the label fits. Long schedules get a second
panel zoomed on the warm-up, where the micro-batch labels are readable.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from meshplan.cost_models.pipeline import Block, ScheduleResult  # noqa: E402

KIND_COLOURS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868"}
KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight grad"}
FULL_GID = "gantt-full"
ZOOM_GID = "gantt-zoom"
MIN_LABEL_FRACTION = 1 / 60  # a block gets its micro-batch label when at least this share of the x range
ZOOM_BLOCKS_PER_RANK = 24


def lighten(colour: str, chunk: int) -> tuple[float, float, float]:
    """The kind's colour, lighter for each later virtual stage (chunk) of a rank."""
    r, g, b = to_rgb(colour)
    mix = min(0.55, 0.35 * chunk)
    return (r + (1 - r) * mix, g + (1 - g) * mix, b + (1 - b) * mix)


def draw_blocks(ax: Axes, blocks: list[Block], pp: int, x_range: float) -> None:
    """One bar per block (y = rank), one collection per (rank, kind); micro-batch numbers on wide bars."""
    for kind, colour in KIND_COLOURS.items():
        for rank in range(pp):
            mine = [b for b in blocks if b.kind == kind and b.rank == rank]
            if not mine:
                continue
            coll = ax.broken_barh([(b.start, b.end - b.start) for b in mine], (rank - 0.4, 0.8),
                                  facecolors=[lighten(colour, b.stage // pp) for b in mine],
                                  edgecolor="white", linewidth=0.3)
            coll.set_gid(f"{kind}:{rank}")
        if any(b.kind == kind for b in blocks):
            ax.bar([0], [0], width=0, color=colour, label=KIND_NAMES[kind])  # legend entry only
    for b in blocks:
        if b.end - b.start >= MIN_LABEL_FRACTION * x_range:
            ax.text((b.start + b.end) / 2, b.rank, str(b.microbatch), ha="center", va="center",
                    fontsize=6, color="white", clip_on=True)


def drawn_blocks(ax: Axes) -> list[tuple[int, str, float, float]]:
    """(rank, kind, start, end) of every bar drawn on a Gantt axes, read back from its collections."""
    out = []
    for coll in ax.collections:
        kind, rank = coll.get_gid().split(":")
        for path in coll.get_paths():
            xs = path.vertices[:, 0]
            out.append((int(rank), kind, float(xs.min()), float(xs.max())))
    return out


def zoom_end(result: ScheduleResult) -> float | None:
    """End of the warm-up window (None when the whole schedule is already readable)."""
    per_rank = len(result.blocks) / max(result.pp, 1)
    if per_rank <= ZOOM_BLOCKS_PER_RANK:
        return None
    first = sorted((b for b in result.blocks if b.rank == result.pp - 1), key=lambda b: b.start)
    return first[min(len(first), ZOOM_BLOCKS_PER_RANK) - 1].end


def gantt_figure(result: ScheduleResult, title: str) -> Figure:
    end = zoom_end(result)
    panels = 1 if end is None else 2
    height = 0.9 + 0.32 * result.pp
    fig, axes = plt.subplots(panels, 1, figsize=(11, panels * height + 0.8), squeeze=False)
    full = axes[0][0]
    full.set_gid(FULL_GID)
    draw_blocks(full, result.blocks, result.pp, result.makespan)
    full.set_xlim(0, result.makespan)
    full.set_title(f"{title}: {result.schedule}, pp={result.pp}, v={result.virtual_stages}, "
                   f"{result.n_microbatches} micro-batches, bubble {100 * result.bubble_fraction:.1f}%"
                   + (" (lighter: later virtual stage)" if result.virtual_stages > 1 else ""), fontsize=9)
    if end is not None:
        zoom = axes[1][0]
        zoom.set_gid(ZOOM_GID)
        draw_blocks(zoom, [b for b in result.blocks if b.start < end], result.pp, end)
        zoom.set_xlim(0, end)
        zoom.set_title(f"warm-up, first {end:.4g} s (labels: micro-batch)", fontsize=9)
    for row in axes:
        ax = row[0]
        ax.set_yticks(range(result.pp), [f"rank {r}" for r in range(result.pp)])
        ax.set_ylim(result.pp - 0.5, -0.5)
        ax.set_xlabel("seconds")
    full.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
