"""Each figure shows what it claims: its drawn data is read back from the matplotlib artists."""

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from meshplan.reports import gantt, plots
from meshplan.reports.inputs import load_input, load_inputs
from report_fixtures import candidates_frame


@pytest.fixture
def configs(plan_files):
    return load_inputs(plan_files)


def test_gantt_bars_are_the_schedule_events(configs):
    for config in configs:
        if config.schedule is None:
            assert config.plan.parallel.pp == 1
            continue
        fig = gantt.gantt_figure(config.schedule, config.name)
        full = next(ax for ax in fig.axes if ax.get_gid() == gantt.FULL_GID)
        drawn = sorted(gantt.drawn_blocks(full))
        events = sorted((b.rank, b.kind, b.start, b.end) for b in config.schedule.blocks)
        assert len(drawn) == len(events) > 0
        for d, e in zip(drawn, events):
            assert d[:2] == e[:2]
            assert d[2:] == pytest.approx(e[2:], rel=1e-12, abs=1e-12)
        assert full.get_xlim() == pytest.approx((0.0, config.schedule.makespan))
        plt.close(fig)


def test_gantt_zoom_labels_micro_batches(configs):
    config = next(c for c in configs if c.plan.parallel.pp_schedule == "Interleaved1F1B")
    result = config.schedule
    end = gantt.zoom_end(result)
    assert end is not None  # 16 micro-batches x 2 virtual stages x F/B: too many to label in full view
    fig = gantt.gantt_figure(result, config.name)
    zoom = next(ax for ax in fig.axes if ax.get_gid() == gantt.ZOOM_GID)
    shown = [b for b in result.blocks if b.start < end]
    drawn = sorted(gantt.drawn_blocks(zoom))
    wanted_blocks = sorted((b.rank, b.kind, b.start, b.end) for b in shown)
    assert [d[:2] for d in drawn] == [w[:2] for w in wanted_blocks]
    assert [d[2:] for d in drawn] == [pytest.approx(w[2:]) for w in wanted_blocks]
    labels = sorted((round(t.get_position()[0], 9), int(t.get_text())) for t in zoom.texts)
    wanted = sorted((round((b.start + b.end) / 2, 9), b.microbatch) for b in shown
                    if b.end - b.start >= gantt.MIN_LABEL_FRACTION * end)
    assert labels == wanted and len(labels) > 0
    plt.close(fig)


def test_time_breakdown_stacks_sum_to_step_time(configs):
    fig = plots.time_breakdown_figure(configs)
    ax = fig.axes[0]
    assert ax.get_gid() == plots.TIME_GID
    containers = ax.containers
    assert [c.patches[0].get_gid() for c in containers] == list(configs[0].estimate.time_s)
    for i, config in enumerate(configs):
        widths = {c.patches[i].get_gid(): c.patches[i].get_width() for c in containers}
        assert widths == pytest.approx(config.estimate.time_s)
        assert sum(widths.values()) == pytest.approx(config.estimate.step_time_s, rel=1e-9)
        # segments are contiguous: each starts where the previous ended
        lefts = [c.patches[i].get_x() for c in containers]
        ends = [0.0] + [c.patches[i].get_x() + c.patches[i].get_width() for c in containers][:-1]
        assert lefts == pytest.approx(ends)
    plt.close(fig)


def test_memory_bars_sum_to_each_ranks_peak(configs):
    fig = plots.memory_figure(configs)
    for ax, config in zip(fig.axes, configs):
        assert ax.get_gid() == f"{plots.MEMORY_GID}:{config.name}"
        ranks = config.estimate.per_rank_memory_gib
        tops = [0.0] * len(ranks)
        for container in ax.containers:
            for r, patch in enumerate(container.patches):
                assert patch.get_y() == pytest.approx(tops[r])
                tops[r] += patch.get_height()
        assert tops == pytest.approx([r["total"] for r in ranks])
        assert max(tops) == pytest.approx(config.estimate.peak_memory_gib)
        usable = [ln for ln in ax.lines if ln.get_gid() == plots.USABLE_GID]
        assert len(usable) == 1 and usable[0].get_ydata()[0] == pytest.approx(config.estimate.usable_memory_gib)
    plt.close(fig)


def test_pareto_frontier_is_the_feasible_non_dominated_set():
    frame = candidates_frame()
    front = plots.pareto_frontier(frame)
    feasible = frame[frame["fits"]]
    assert len(front) >= 1 and front["fits"].all()
    for _, p in feasible.iterrows():
        dominated = ((feasible["tokens_per_s_per_gpu"] >= p["tokens_per_s_per_gpu"])
                     & (feasible["peak_memory_gib"] <= p["peak_memory_gib"])
                     & ((feasible["tokens_per_s_per_gpu"] > p["tokens_per_s_per_gpu"])
                        | (feasible["peak_memory_gib"] < p["peak_memory_gib"]))).any()
        on_front = ((front["tokens_per_s_per_gpu"] == p["tokens_per_s_per_gpu"])
                    & (front["peak_memory_gib"] == p["peak_memory_gib"])).any()
        assert on_front == (not dominated)


def test_search_figure_marks_frontier_and_chosen(search_output):
    config = load_input(search_output[0])
    assert config.kind == "search"
    fig = plots.search_figure(config)
    ax = fig.axes[0]
    front = plots.pareto_frontier(config.candidates)
    line = next(ln for ln in ax.lines if ln.get_gid() == plots.FRONTIER_GID)
    assert list(line.get_xdata()) == pytest.approx(list(front["peak_memory_gib"]))
    assert list(line.get_ydata()) == pytest.approx(list(front["tokens_per_s_per_gpu"]))
    chosen = next(ln for ln in ax.lines if ln.get_gid() == plots.CHOSEN_GID)
    assert (chosen.get_xdata()[0], chosen.get_ydata()[0]) == pytest.approx(
        (config.estimate.peak_memory_gib, config.estimate.tokens_per_s_per_gpu))
    points = {c.get_gid(): len(c.get_offsets()) for c in ax.collections}
    assert points == {"feasible": int(config.candidates["fits"].sum()), "infeasible": int((~config.candidates["fits"]).sum())}
    plt.close(fig)


def test_run_figure_plots_the_metrics(run_dir: Path):
    config = load_input(run_dir)
    fig = plots.run_figure(config)
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.lines}
    m = config.run.metrics
    assert list(lines["loss"].get_xdata()) == list(m["step"])
    assert list(lines["loss"].get_ydata()) == pytest.approx(list(m["loss"]))
    assert list(lines["throughput"].get_ydata()) == pytest.approx(list(m["tokens_per_s_per_gpu"]))
    assert lines["predicted-throughput"].get_ydata()[0] == pytest.approx(1000.0)
    plt.close(fig)


def _legends(fig):
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


@pytest.mark.parametrize("n_configs", [1, 3])
def test_legends_lie_inside_the_figure(configs, n_configs):
    """A one-plan memory figure is narrow: its legend used to be clipped ("le (78.5 GiB)")."""
    chosen = configs[:n_configs]
    for make in (plots.memory_figure, plots.time_breakdown_figure):
        fig = make(chosen)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legends = _legends(fig)
        assert legends, make.__name__
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert box.x0 >= -1 and box.y0 >= -1, (make.__name__, box)
            assert box.x1 <= fig.bbox.x1 + 1 and box.y1 <= fig.bbox.y1 + 1, (make.__name__, box, fig.bbox)
        plt.close(fig)


def test_search_figure_counts_what_the_search_rejected_for_memory(search_output):
    plan_path, _ = search_output
    config = load_input(plan_path)
    config.search_counts = {"space": 50_000, "rejected_for_memory": 46_550}
    fig = plots.search_figure(config)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    over = next(t for t in labels if t.startswith("does not fit"))
    assert "46,550 more rejected by the search" in over
    assert "of 50,000 plans searched" in ax.get_title()
    plt.close(fig)


def test_metrics_table_gives_each_plan_its_band(configs):
    """The report shows the estimate's band: it brackets the predicted step time."""
    from meshplan.reports.tables import metrics_table

    table = metrics_table(configs)
    for c in configs:
        low, high = (float(x) for x in table.loc["step time band (s)", c.name].split(" to "))
        # the table prints 4 significant digits: rounding keeps order, so the step rounded alike lies between
        assert low <= float(f"{c.estimate.step_time_s:.4g}") <= high
        assert table.loc["extrapolated", c.name]
