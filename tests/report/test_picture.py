"""The picture of a plan reads like its report: nodes named on the x axis, the y axis in
the unit of the title's step time, and bars that add up to that step time."""

import pytest

import autopar
from autopar.report.format import fmt_seconds


@pytest.fixture(scope="module")
def plan():
    model, inputs = autopar.zoo.get("gpt")
    return autopar.plan(model, inputs, autopar.Cluster(devices=8))


def test_x_axis_names_the_nodes_and_y_axis_is_in_the_titles_unit(plan):
    import matplotlib.pyplot as plt

    from autopar.report.picture import figure

    fig = figure(plan)
    try:
        ax = fig.axes[0]
        title = fig._suptitle.get_text()
        number, unit = fmt_seconds(plan.cost).split()
        assert f"{number} {unit} per step" in title and "faster than data parallel" in title
        assert f"({unit}," in ax.get_ylabel()
        names = [t.get_text() for t in ax.get_xticklabels()]
        assert len(names) == len(plan.rows)  # every node named (a small model)
        assert "blocks.0.fc1 linear" in names and "cross_entropy" in names and "tok" in names
        # the bars (compute, then communication stacked on it) add up to the title's step time
        heights = sum(p.get_height() for p in ax.patches)
        scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]
        assert heights * scale == pytest.approx(sum(r.compute + r.comm for r in plan.rows), rel=1e-9)
        assert heights * scale == pytest.approx(plan.cost, rel=1e-6)
    finally:
        plt.close(fig)


def test_a_plan_that_splits_nothing_says_so_in_its_title(tmp_path):
    import matplotlib.pyplot as plt

    from autopar.report.picture import figure

    model, inputs = autopar.zoo.get("mlp")
    fig = figure(autopar.plan(model, inputs, autopar.Cluster(devices=4)))
    try:
        assert "no parallelism: every device runs the whole model" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
