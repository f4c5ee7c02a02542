"""A per-device timeline of many jobs: text for terminals and reports, and a picture.

Rows are plain ``(device, start, end, label)`` tuples, so any schedule can be drawn; the planner
turns its schedule into rows. Text: one line per device, each column a slice of the makespan,
the letter of the job running there ('.' idle).
"""

from __future__ import annotations

import string

Row = tuple[int, float, float, str]
LETTERS = string.ascii_uppercase + string.ascii_lowercase + string.digits


def letters(labels: list[str]) -> dict[str, str]:
    """A letter per distinct label, in order of first appearance."""
    out: dict[str, str] = {}
    for label in labels:
        if label not in out:
            out[label] = LETTERS[len(out) % len(LETTERS)]
    return out


def text(rows: list[Row], devices: int, width: int = 72) -> str:
    span = max((r[2] for r in rows), default=0.0) or 1.0
    key = letters([r[3] for r in sorted(rows, key=lambda r: (r[1], r[0]))])
    lines = []
    for d in range(devices):
        cells = ["."] * width
        for dev, start, end, label in rows:
            if dev != d:
                continue
            a = int(start / span * width)
            b = max(a + 1, int(round(end / span * width)))
            for c in range(a, min(b, width)):
                cells[c] = key[label]
        lines.append(f"device {d:>2} |{''.join(cells)}|")
    legend = ", ".join(f"{v}={k}" for k, v in key.items())
    return "\n".join(lines + [f"{'':>10}0{'':>{width - 1}}{span:.4g} s", f"jobs: {legend}"])


def draw(rows: list[Row], devices: int, path: str, title: str = "") -> None:
    """The timeline as a picture (format from the file name: .svg, .png, .pdf)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = letters([r[3] for r in sorted(rows, key=lambda r: (r[1], r[0]))])
    colours = plt.get_cmap("tab20")
    index = {label: i for i, label in enumerate(key)}
    fig, ax = plt.subplots(figsize=(10, 0.45 * devices + 1.5))
    for dev, start, end, label in rows:
        ax.broken_barh([(start, end - start)], (dev - 0.4, 0.8), facecolors=colours(index[label] % 20),
                       edgecolor="black", linewidth=0.3)
        if end - start > 0.04 * max(r[2] for r in rows):
            ax.text((start + end) / 2, dev, key[label], ha="center", va="center", fontsize=7)
    ax.set_yticks(range(devices))
    ax.set_yticklabels([f"device {d}" for d in range(devices)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(title, fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(index[k] % 20)) for k in key]
    ax.legend(handles, [f"{v} {k}" for k, v in key.items()], fontsize=6, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
