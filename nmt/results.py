"""Render `results/*.json` (written by `nmt experiment`) into the README's results table.

    python -m nmt.results [--results results] [--readme README.md]
    python -m nmt.results --print [--results results]     # the table on standard output, no file written

The table sits between the markers `<!-- results:start -->` and `<!-- results:end -->`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

START, END = "<!-- results:start -->", "<!-- results:end -->"


FIELDS = ("experiment", "direction", "model", "parameters", "steps", "train_seconds", "tokens_per_s", "hardware",
          "stopped_by", "test")
"""What the table reads of each results file."""


def load_results(directory: str | Path) -> list[dict[str, Any]]:
    """The results files of `directory`, in name order.

    Raises:
        SystemExit: naming a file that is not one `nmt experiment` writes (damaged, or another tool's).
    """
    results = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
            problem = _problem(result)
        except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            problem = f"{type(err).__name__}: {err}"
        if problem:
            raise SystemExit(f"{path}: not a results file of nmt experiment ({problem}); move it out of {directory}, "
                             "or run its experiment again")
        results.append(result)
    return results


def _problem(result: Any) -> str | None:
    """What keeps `result` from being a row of the table, or None."""
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    if not isinstance(result, dict):
        return f"a JSON {type(result).__name__}, not an object"
    if missing := [key for key in FIELDS if key not in result]:
        return f"no {', '.join(missing)}"
    if not (number(result["parameters"]) and number(result["train_seconds"]) and isinstance(result["test"], dict)):
        return "parameters and train_seconds must be numbers, test a mapping of test sets"
    for name, scores in result["test"].items():
        by_length = scores.get("by_length", [{}]) if isinstance(scores, dict) else None
        if not (isinstance(scores, dict) and number(scores.get("bleu")) and number(scores.get("chrf"))
                and isinstance(by_length, list) and by_length and isinstance(by_length[-1], dict)
                and (by_length[-1].get("bleu") is None or number(by_length[-1]["bleu"]))):
            return f"test set {name!r} lacks the numbers bleu, chrf and by_length"
    return None


def results_table(results: list[dict[str, Any]]) -> str:
    """One row per experiment and test set: BLEU, chrF, BLEU on the longest third, cost, hardware;
    then, for each experiment run with `--set` overrides (a shorter time budget, say), those overrides,
    named with the hardware where one experiment has results from more than one run (`results/NAME.*.json`).
    """
    lines = [
        "| experiment | direction | model | params | test set | BLEU | chrF | BLEU, longest third | steps | training time | tokens/s | hardware | stopped by |",
        "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in results:
        for set_name, s in r["test"].items():
            long = s.get("by_length", [{}])[-1].get("bleu")
            long = "" if long is None else f"{long:.1f}"
            minutes = f"{r['train_seconds'] / 60:.1f} min"
            lines.append(
                f"| {r['experiment']} | {r['direction']} | {r['model']} | {r['parameters'] / 1e6:.1f}M | {set_name} "
                f"| {s['bleu']:.1f} | {s['chrf']:.1f} | {long} | {r['steps']} | {minutes} | {r['tokens_per_s'] or ''} "
                f"| {r['hardware']} | {r['stopped_by']} |"
            )
    names = [r["experiment"] for r in results]
    changed = []
    for r in (r for r in results if r.get("overrides")):
        run = f"`{r['experiment']}`" + (f" ({r['hardware']})" if names.count(r["experiment"]) > 1 else "")
        changed.append(f"- {run}: `{' '.join(r['overrides'])}`")
    if changed:
        lines += ["", "Settings changed from the config file on the command line:", "", *changed]
    return "\n".join(lines)


def update_readme(readme: str | Path, table: str) -> bool:
    """Replace the text between the markers; returns whether the file changed."""
    path = Path(readme)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SystemExit(f"{path}: not found; give --readme FILE (a file with the markers {START} and {END}), "
                         "or --print to print the table") from None
    if START not in text or END not in text:
        raise SystemExit(f"{path}: markers {START} and {END} not found")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{table}\n{END}{tail}"
    path.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results", help="folder of the NAME.json files `nmt experiment` wrote")
    ap.add_argument("--readme", default="README.md", help="file whose table between the markers is replaced")
    ap.add_argument("--print", action="store_true", help="print the table instead of writing it into --readme")
    args = ap.parse_args(argv)
    results = load_results(args.results)
    if not results:  # rendering nothing would wipe the README's table
        raise SystemExit(f"{args.results}: no results (*.json) there; run `nmt experiment CONFIG` first, or give "
                         "--results DIR (where `nmt experiment --results DIR` wrote them)")
    if args.print:
        print(results_table(results))
        return
    changed = update_readme(args.readme, results_table(results))
    print(f"{args.readme}: {len(results)} experiments, {'updated' if changed else 'unchanged'}")


if __name__ == "__main__":
    main()
