"""The three figures of a bench run (matplotlib, Agg canvas, no pyplot state).

* accuracy_vs_speedup.png: one point per task and method: wall-clock speedup
  against the first method listed (x) and the task score (y).
* confidence_vs_stability.png: the paper's Figure 1c: generated tokens in
  three classes of first-step confidence s_i = c_i(0) (>0.50, 0.25-0.50,
  <0.25) against the local step at which they were committed; the commit
  step stands in for the stabilisation step.
* steps_saved_per_block.png: the paper's Figure 1b: T - mean steps per block
  index, T the maximum steps per block, over the blocks actually decoded.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

MARKERS = "osD^v<>pPX*h"


def _figure(width=7.5, height=4.8) -> Figure:
    fig = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def _caption(fig: Figure, text: str) -> None:
    fig.text(0.01, 0.01, text, fontsize=7.5, ha="left", va="bottom", wrap=True)


def accuracy_vs_speedup(path: Path, report: dict) -> None:
    results = report["results"]
    methods = report["settings"]["methods"]
    tasks = report["settings"]["tasks"]
    fig = _figure()
    ax = fig.add_axes((0.1, 0.2, 0.62, 0.7))
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    for row in results:
        if row["speedup"] is None or row["accuracy"] is None:
            continue
        marker = MARKERS[tasks.index(row["task"]) % len(MARKERS)]
        ax.scatter(
            row["speedup"],
            100 * row["accuracy"],
            color=colors[row["method"]],
            marker=marker,
            s=55,
            edgecolors="black",
            linewidths=0.4,
            zorder=3,
        )
    ax.set_xlabel(f"wall-clock speedup vs {methods[0]} (x)")
    ax.set_ylabel("score (%)")
    ax.set_ylim(-3, 103)
    ax.set_title("Accuracy vs speedup, per method")
    ax.grid(alpha=0.3)
    handles = [ax.scatter([], [], color=colors[m], marker="o", label=m) for m in methods]
    handles += [
        ax.scatter([], [], color="grey", marker=MARKERS[i % len(MARKERS)], label=t)
        for i, t in enumerate(tasks)
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7.5, frameon=False)
    s = report["settings"]
    _caption(
        fig,
        f"{s['model']} ({s['family']}, {s['device']}), gen_length {s['gen_length']}, block "
        f"{s['block_length']}, batch {s['batch_size']}; speedup = wall time of {methods[0]} / wall time "
        "of the method on the same examples, after a warm-up.",
    )
    fig.savefig(path)


def confidence_vs_stability(path: Path, report: dict, traces: dict) -> None:
    from caidllm.bench.summary import CONFIDENCE_BUCKETS

    methods = report["settings"]["methods"]
    fig = _figure()
    ax = fig.add_axes((0.1, 0.22, 0.86, 0.68))
    width = 0.8 / max(1, len(methods))
    for k, method in enumerate(methods):
        buckets = traces[method]["buckets"]
        means = [statistics.fmean(buckets[b]) if buckets[b] else 0.0 for b in CONFIDENCE_BUCKETS]
        spread = [statistics.pstdev(buckets[b]) if len(buckets[b]) > 1 else 0.0 for b in CONFIDENCE_BUCKETS]
        xs = [i + (k - (len(methods) - 1) / 2) * width for i in range(len(CONFIDENCE_BUCKETS))]
        bars = ax.bar(
            xs, means, width=width, yerr=spread, capsize=2, color=f"C{k % 10}", label=method, alpha=0.85
        )
        for bar, b in zip(bars, CONFIDENCE_BUCKETS):
            ax.annotate(
                f"n={len(buckets[b])}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=6,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_xticks(range(len(CONFIDENCE_BUCKETS)))
    ax.set_xticklabels([f"s_i {b}" if b[0] in "<>" else f"s_i in {b}" for b in CONFIDENCE_BUCKETS])
    ax.set_ylabel("commit step within the block (mean ± std)")
    _finish_bar_chart(
        fig,
        ax,
        path,
        "First-step confidence vs stabilisation step (cf. paper Fig. 1c)",
        "The commit step (local step t at which the token was committed) is used as the stabilisation "
        "step. s_i = c_i(0), the token's confidence at its block's first step. All tasks pooled; "
        "tokens filled by early stop are left out.",
    )


def steps_saved_per_block(path: Path, report: dict, traces: dict, T: dict) -> None:
    methods = report["settings"]["methods"]
    n_blocks = report["settings"]["gen_length"] // report["settings"]["block_length"]
    fig = _figure()
    ax = fig.add_axes((0.1, 0.22, 0.86, 0.68))
    width = 0.8 / max(1, len(methods))
    for k, method in enumerate(methods):
        steps = traces[method]["steps"]
        saved = []
        for b in range(n_blocks):
            # a method may lay fewer blocks (elastic)
            decoded = [s[b] for s in steps if b < len(s) and s[b] > 0]
            saved.append(T[method] - statistics.fmean(decoded) if decoded else 0.0)
        xs = [b + 1 + (k - (len(methods) - 1) / 2) * width for b in range(n_blocks)]
        ax.bar(xs, saved, width=width, color=f"C{k % 10}", label=f"{method} (T={T[method]})", alpha=0.85)
    ax.set_xticks(range(1, n_blocks + 1))
    ax.set_xlabel("block index")
    ax.set_ylabel("steps saved per block (T - mean steps)")
    _finish_bar_chart(
        fig,
        ax,
        path,
        "Steps saved per output block (cf. paper Fig. 1b)",
        "T = the maximum denoising steps per block of the method. Mean over the requests that "
        "decoded the block (blocks skipped by early stop are left out); all tasks pooled.",
    )


def _finish_bar_chart(fig, ax, path: Path, title: str, caption: str) -> None:
    """The shared tail of the two bar charts: axes from 0, title, legend, grid, caption, file."""
    ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1]))
    ax.set_title(title)
    ax.legend(fontsize=7.5, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    _caption(fig, caption)
    fig.savefig(path)


def write_all(out: Path, report: dict, traces: dict, T: dict) -> dict:
    files = {
        "accuracy_vs_speedup": "accuracy_vs_speedup.png",
        "confidence_vs_stability": "confidence_vs_stability.png",
        "steps_saved_per_block": "steps_saved_per_block.png",
    }
    accuracy_vs_speedup(out / files["accuracy_vs_speedup"], report)
    confidence_vs_stability(out / files["confidence_vs_stability"], report, traces)
    steps_saved_per_block(out / files["steps_saved_per_block"], report, traces, T)
    return files
