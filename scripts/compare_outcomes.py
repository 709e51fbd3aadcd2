"""Compare the per-test outcomes of two pytest runs from their JUnit XML files.

    python scripts/compare_outcomes.py BEFORE.xml AFTER.xml

Prints the outcome counts of each run and every test whose outcome differs (passed, failed, error, skipped,
xfailed; a test present in one run only is listed as "absent" in the other). Exit status 0 when every test
present in both runs has the same outcome and no test is in one run only, 1 otherwise. A refactor that claims
"behaviour does not change" is held to this.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def outcomes(path: str) -> dict[str, str]:
    """test id (classname::name) -> outcome."""
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = [child.tag for child in case]
        if "failure" in kinds:
            outcome = "failed"
        elif "error" in kinds:
            outcome = "error"
        elif "skipped" in kinds:
            skipped = case.find("skipped")
            outcome = "xfailed" if skipped is not None and skipped.get("type") == "pytest.xfail" else "skipped"
        else:
            outcome = "passed"
        found[test] = outcome
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    before, after = outcomes(argv[0]), outcomes(argv[1])
    for label, run in (("before", before), ("after", after)):
        counts = Counter(run.values())
        print(f"{label}: {len(run)} tests: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    changed = sorted(
        (test, before.get(test, "absent"), after.get(test, "absent"))
        for test in before.keys() | after.keys()
        if before.get(test) != after.get(test)
    )
    for test, then, now in changed:
        print(f"  {then:>8} -> {now:<8} {test}")
    print(f"{len(changed)} test(s) changed outcome" if changed else "every test has the same outcome")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
