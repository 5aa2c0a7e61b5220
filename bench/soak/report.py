"""The soak's printed report: jobs by kind and outcome, faults by kind, every invariant violation with its job
and time, and the operator's memory over time. Pure; called by `run`, recorded in docs/operator.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from bench.soak.invariants import Sample, Violation


def table(title: str, rows: Mapping[str, Mapping[str, int]]) -> list[str]:
    columns = sorted({column for row in rows.values() for column in row})
    lines = [f"{title}:", "  " + " ".join(f"{c:>12}" for c in ["kind", *columns, "total"])]
    for kind, row in sorted(rows.items()):
        cells = [f"{row.get(c, 0):>12}" for c in columns]
        lines.append("  " + " ".join([f"{kind:>12}", *cells, f"{sum(row.values()):>12}"]))
    return lines


def memory(samples: list[Sample], every: float = 60.0) -> list[str]:
    """One sample a minute (the first at or after each mark)."""
    lines = ["operator memory over time:", "   minute  jobs done  RSS MiB  API connections"]
    mark = 0.0
    for sample in samples:
        if sample.at >= mark:
            lines.append(
                f"  {sample.at / 60:7.1f} {sample.jobs_done:10d} {sample.rss_mib:8.0f} {sample.connections:16d}"
            )
            mark = sample.at - sample.at % every + every
    return lines


def render(
    *,
    seed: int,
    minutes: float,
    jobs: Mapping[str, Mapping[str, int]],
    faults: Mapping[str, Mapping[str, int]],
    violations: list[Violation],
    samples: list[Sample],
) -> str:
    injected = sum(row.get("injected", 0) for row in faults.values())
    kinds = sum(1 for row in faults.values() if row.get("injected"))
    lines = [
        f"soak: seed {seed}, {minutes:g} minutes",
        f"faults injected: {injected} of {kinds} kinds; invariant violations: {len(violations)}",
        *table("jobs (outcome when the soak ended)", jobs),
        *table("faults", faults),
        "invariant violations:" if violations else "invariant violations: none",
        *(
            f"  {v.at:7.1f} s  {v.invariant}  {v.job or '-'}  {v.detail}"
            for v in sorted(violations, key=lambda v: v.at)
        ),
        *memory(samples),
    ]
    return "\n".join(lines)
