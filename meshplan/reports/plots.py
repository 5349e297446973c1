"""Figures (matplotlib, Agg): step-time breakdown, memory per pipeline rank, planner search, run curves.

Every figure is drawn from the estimate, the candidates table or the run metrics directly, so the
bars and points are the numbers in the tables; tests read them back from the artists.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from meshplan.reports.inputs import Config  # noqa: E402

PALETTE = plt.get_cmap("tab20").colors
TIME_GID = "time-breakdown"
MEMORY_GID = "memory"
USABLE_GID = "usable-memory"
FRONTIER_GID = "pareto-frontier"
CHOSEN_GID = "chosen"


def colour_for(key: str, keys: list[str]) -> tuple:
    return PALETTE[keys.index(key) % len(PALETTE)]


def ordered_keys(dicts: list[dict], skip: tuple[str, ...] = ()) -> list[str]:
    """Keys in first-seen order across dicts."""
    out: list[str] = []
    for d in dicts:
        out += [k for k in d if k not in out and k not in skip]
    return out


def time_breakdown_figure(configs: list[Config]) -> Figure:
    """One horizontal stacked bar per configuration: the estimate's time_s parts, summing to the step time."""
    configs = [c for c in configs if c.estimate is not None]
    keys = ordered_keys([c.estimate.time_s for c in configs])
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(configs)))
    ax.set_gid(TIME_GID)
    lefts = [0.0] * len(configs)
    for key in keys:
        widths = [c.estimate.time_s.get(key, 0.0) for c in configs]
        label = key if any(widths) else None
        ax.barh(range(len(configs)), widths, left=lefts, color=colour_for(key, keys), label=label, gid=key)
        lefts = [l + w for l, w in zip(lefts, widths)]
    for i, c in enumerate(configs):
        ax.text(lefts[i], i, f" {c.estimate.step_time_s:.4g} s", va="center", fontsize=8)
    ax.set_yticks(range(len(configs)), [c.name for c in configs])
    ax.invert_yaxis()
    ax.set_xlabel("seconds per optimizer step (critical pipeline rank)")
    ax.set_title("Step-time breakdown")
    ax.set_xlim(0, max(lefts, default=1.0) * 1.15 or 1.0)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def memory_figure(configs: list[Config]) -> Figure:
    """One panel per configuration: stacked memory parts per pipeline rank, with the usable memory line."""
    configs = [c for c in configs if c.estimate is not None]
    ranks_by_config = [c.estimate.per_rank_memory_gib for c in configs]
    keys = ordered_keys([r for ranks in ranks_by_config for r in ranks], skip=("pp_rank", "total"))
    fig, axes = plt.subplots(1, len(configs), figsize=(max(4.5, 3.6 * len(configs)), 4.2), sharey=True, squeeze=False)
    for ax, config, ranks in zip(axes[0], configs, ranks_by_config):
        ax.set_gid(f"{MEMORY_GID}:{config.name}")
        x = [int(r["pp_rank"]) for r in ranks]
        bottoms = [0.0] * len(ranks)
        for key in keys:
            heights = [r.get(key, 0.0) for r in ranks]
            label = key if any(heights) else None
            ax.bar(x, heights, bottom=bottoms, color=colour_for(key, keys), label=label, gid=key)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        usable = config.estimate.usable_memory_gib
        ax.axhline(usable, color="crimson", linestyle="--", linewidth=1.2, gid=USABLE_GID,
                   label=f"usable ({usable:.4g} GiB)")
        ax.set_title(f"{config.name}\npeak {config.estimate.peak_memory_gib:.4g} GiB", fontsize=9)
        ax.set_xlabel("pipeline rank")
        ax.set_xticks(x)
    axes[0][0].set_ylabel("GiB per GPU")
    handles, labels = axes[0][0].get_legend_handles_labels()
    legend_height = figure_legend_below(fig, handles, labels)
    fig.suptitle("Peak memory per pipeline rank")
    fig.tight_layout(rect=(0, legend_height, 1, 1))
    return fig


def figure_legend_below(fig: Figure, handles: list, labels: list[str], max_columns: int = 5) -> float:
    """A figure legend under the panels with as many columns as fit the figure's width (a one-panel
    figure is narrow); returns the share of the figure's height it takes."""
    renderer = fig.canvas.get_renderer()
    for ncol in range(min(max_columns, len(labels)), 0, -1):
        legend = fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
        box = legend.get_window_extent(renderer)
        if box.width <= fig.bbox.width * 0.98 or ncol == 1:
            return box.height / fig.bbox.height + 0.02
        legend.remove()
    return 0.0


def pareto_frontier(frame: pd.DataFrame) -> pd.DataFrame:
    """Feasible candidates no other feasible candidate beats on both throughput (higher) and memory (lower)."""
    feasible = frame[frame["fits"]].sort_values(["peak_memory_gib", "tokens_per_s_per_gpu"], ascending=[True, False])
    keep, best = [], float("-inf")
    for idx, row in feasible.iterrows():
        if row["tokens_per_s_per_gpu"] > best:
            keep.append(idx)
            best = row["tokens_per_s_per_gpu"]
    return feasible.loc[keep]


def search_figure(config: Config) -> Figure:
    """The planner's candidates: throughput against peak memory, frontier and chosen plan marked."""
    frame = config.candidates
    fig, ax = plt.subplots(figsize=(8, 5))
    fits, over = frame[frame["fits"]], frame[~frame["fits"]]
    counts = config.search_counts or {}
    more = counts.get("rejected_for_memory")
    over_label = f"does not fit ({len(over):,} scored" + (f"; {more:,} more rejected by the search)" if more else ")")
    ax.scatter(over["peak_memory_gib"], over["tokens_per_s_per_gpu"], s=10, color="lightgrey", label=over_label, gid="infeasible")
    ax.scatter(fits["peak_memory_gib"], fits["tokens_per_s_per_gpu"], s=12, color="tab:blue", alpha=0.6, label=f"fits ({len(fits)})", gid="feasible")
    front = pareto_frontier(frame)
    ax.plot(front["peak_memory_gib"], front["tokens_per_s_per_gpu"], "-o", color="tab:orange", markersize=4, drawstyle="steps-post", label="Pareto frontier", gid=FRONTIER_GID)
    est = config.estimate
    ax.plot([est.peak_memory_gib], [est.tokens_per_s_per_gpu], marker="*", markersize=16, color="crimson", linestyle="none", label=f"chosen: {config.name}", gid=CHOSEN_GID)
    ax.axvline(est.usable_memory_gib, color="crimson", linestyle="--", linewidth=1, label="usable memory")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens/s per GPU")
    space = counts.get("space")
    ax.set_title(f"Planner search: {len(frame):,} candidates scored exactly"
                 + (f" of {space:,} plans searched" if space else ""))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def run_figure(config: Config) -> Figure:
    """Loss and throughput over steps of a run, with the predicted throughput as a line."""
    m = config.run.metrics
    fig, (ax_loss, ax_tput) = plt.subplots(1, 2, figsize=(10, 3.8))
    if "loss" in m:
        ax_loss.plot(m["step"], m["loss"], marker=".", gid="loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("Loss")
    if "tokens_per_s_per_gpu" in m:
        ax_tput.plot(m["step"], m["tokens_per_s_per_gpu"], marker=".", label="measured", gid="throughput")
    predicted = config.run.predicted.get("tokens_per_s_per_gpu")
    if isinstance(predicted, (int, float)):
        ax_tput.axhline(predicted, color="crimson", linestyle="--", label="predicted", gid="predicted-throughput")
    ax_tput.set_xlabel("step")
    ax_tput.set_ylabel("tokens/s per GPU")
    ax_tput.set_title("Throughput")
    ax_tput.legend(fontsize=8)
    fig.suptitle(config.name)
    fig.tight_layout()
    return fig


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    """PNG bytes of a figure; the figure is closed."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return buf.getvalue()
