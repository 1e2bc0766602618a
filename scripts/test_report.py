"""What a test run's per-test reports (tests/conftest.py, PYTEST_REPORT_DIR) say: counts, each failure's last
lines, and the slowest tests with the seconds each file took in all.
    python scripts/test_report.py FOLDER [--slowest N]
"""

import argparse
import collections
import json
import pathlib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("--slowest", type=int, default=15)
    args = parser.parse_args()
    lines = [json.loads(line) for f in sorted(args.folder.glob("tests-*.jsonl")) for line in f.read_text().splitlines()]
    if not lines:
        print(f"no reports in {args.folder}")
        return
    counted = [line for line in lines if line["when"] == "call" or line["outcome"] != "passed"]
    outcomes = collections.Counter(line["outcome"] for line in counted)
    print("outcomes:", ", ".join(f"{n} {outcome}" for outcome, n in outcomes.most_common()))
    for line in lines:
        if line["outcome"] == "failed":
            why = line["why"].strip().splitlines()
            print(f"\nFAILED ({line['when']}) {line['test']}\n    " + "\n    ".join(why[-12:]))
    calls = [line for line in lines if line["when"] == "call"]
    print(f"\nslowest {args.slowest} tests (s):")
    for line in sorted(calls, key=lambda line: -line["s"])[: args.slowest]:
        print(f"  {line['s']:7.1f}  {line['test']}")
    by_file = collections.Counter()
    for line in calls:
        by_file[line["test"].split("::")[0]] += line["s"]
    print(f"\nseconds by file (sum over workers; {sum(by_file.values()):.0f} s in all):")
    for name, seconds in by_file.most_common(12):
        print(f"  {seconds:7.1f}  {name}")


if __name__ == "__main__":
    main()
