"""The evaluation report: success rates by task kind, and the table the demo prints."""

from __future__ import annotations

from forge_bridge.app.tasks import ALL_KINDS, KINDS_ORDER, Task


def rates(tasks: list[Task], passed: list[bool]) -> dict[str, float]:
    """"all" and each kind present -> the share of its tasks that passed."""
    out = {"all": sum(passed) / max(len(passed), 1)}
    for kind in ALL_KINDS:
        picked = [p for t, p in zip(tasks, passed) if t.kind == kind]
        if picked:
            out[kind] = sum(picked) / len(picked)
    return out


def print_table(results: dict[str, dict], timings: dict[str, float], held_out: list[Task],
                on_validation: dict[str, dict] | None = None) -> None:
    """The held-out success table by phase and kind, the validation scores, and the wall time."""
    counts = {k: sum(t.kind == k for t in held_out) for k in KINDS_ORDER}
    print(f"\nheld-out success rate, greedy ({len(held_out)} tasks)")
    header = f"{'':<20}" + "".join(f"{name:>10}" for name in results)
    print(header)
    for row in ("all",) + KINDS_ORDER:
        label = row if row == "all" else f"{row} ({counts[row]})"
        print(f"{label:<20}" + "".join(f"{results[name].get(row, 0.0) * 100:>9.0f}%" for name in results))
    if on_validation:
        print("validation tasks, where the settings were chosen: "
              + ", ".join(f"{name} {r['all'] * 100:.0f}%" for name, r in on_validation.items()))
    print("\nwall time per phase")
    for name, seconds in timings.items():
        print(f"  {name:<14}{seconds:>8.1f} s")
    print(f"  {'total':<14}{sum(timings.values()):>8.1f} s")


__all__ = ["print_table", "rates"]
