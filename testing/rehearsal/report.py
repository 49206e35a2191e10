"""The rehearsal's report: a summary in Markdown, the figures as JSON, and a plot of the daemon's resources."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write(result: dict[str, Any], directory: str | Path) -> Path:
    """Write report.md, report.json and (with matplotlib, the `bench` extra) resources.png; the Markdown's path."""
    d = Path(directory)
    (d / "report.json").write_text(json.dumps(result, indent=1))
    plan, samples = result["plan"], result["samples"]
    lines = [
        f"# Rehearsal: seed {plan['seed']}, {plan['duration']:.0f} s of faults and traffic",
        "",
        f"**{'PASS' if not result['problems'] else 'FAIL'}**: {len(result['problems'])} problems.",
        "",
        "| | |",
        "|---|---|",
        f"| faults injected | {', '.join(f'{k} {v}' for k, v in sorted(result['faults'].items())) or 'none'} |",
        f"| messages acknowledged | {result['acknowledged']} |",
        f"| rows in Parquet | {result['rows']} |",
        f"| journals | {result['journals']} |",
        f"| streaming runs, archive runs, retention runs | {result['spark_runs']}, {result['archive_runs']}, "
        f"{result['retention_runs']} |",
        f"| segments deleted by retention (producer, hub) | {result['deleted_segments']['producer']}, "
        f"{result['deleted_segments']['hub']} |",
        f"| every journal at the hub, after the faults stopped | {result['caught_up_seconds']} s |",
        f"| append to hub (s) | {_q(result['append_to_hub'])} |",
        f"| append to Parquet (s) | {_q(result['append_to_parquet'])} |",
    ]
    if samples:
        half = samples[len(samples) // 2 :]
        lines += ["", "The daemon's resources (first sample, peak of the first half, peak of the second half):", "",
                  "| | first | peak, 1st half | peak, 2nd half |", "|---|---|---|---|"]  # fmt: skip
        first_half = samples[: max(1, len(samples) // 2)]
        for key in ("journals", "rss_kib", "files", "threads", "watches"):
            lines.append(f"| {key} | {samples[0][key]} | {max(s[key] for s in first_half)} | "
                         f"{max(s[key] for s in half)} |")  # fmt: skip
    if result["problems"]:
        lines += ["", "## Problems", ""] + [f"- {p}" for p in result["problems"][:200]]
    md = d / "report.md"
    md.write_text("\n".join(lines) + "\n")
    _plot(samples, d / "resources.png")
    return md


def _q(q: dict[str, Any]) -> str:
    return "no samples" if not q.get("n") else f"p50 {q['p50']}, p99 {q['p99']}, max {q['max']} ({q['n']} messages)"


def _plot(samples: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if not samples:
        return
    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
    for ax, (key, label) in zip(axes, (("rss_kib", "RSS (KiB)"), ("files", "open files"), ("threads", "threads"),
                                       ("journals", "journals at the hub")), strict=True):  # fmt: skip
        ax.plot(t, [s[key] for s in samples])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("minutes")
    fig.suptitle("sej-hub under the rehearsal")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
