"""Memory per cached TeamSpace: the watch controller's three caches filled with N TeamSpaces, their
namespaces and quotas, measured with tracemalloc, with the slim records (records.py) and with the
whole objects the caches kept before.

    python3 bench/cache_memory.py [--sizes 1000,10000] [--json PATH]

The objects are copies of real ones (bench/samples/objects.jsonl: a TeamSpace, its namespace and
its quota as a test host's API server listed them, managedFields included), each with its own
name, uid and resourceVersion, served in pages of 500 and decoded from JSON text as the API's
answers are (json.loads per page), so their strings are as many and as long as a real list's.
What is measured is what stays allocated once the caches hold them (the decoded pages are
garbage by then). RSS of the controller on a real host is in docs/benchmark.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
import uuid
from pathlib import Path

from cnpa_controller import cache, records
from cnpa_controller.cache import Caches

SAMPLES = Path(__file__).resolve().parent / "samples" / "objects.jsonl"
PAGE = 500


def templates() -> dict[str, dict]:
    objs = [json.loads(line) for line in SAMPLES.read_text().splitlines() if line.strip()]
    return {o["kind"]: o for o in objs}


def text_of(template: dict, name: str, i: int) -> str:
    """The JSON text of one object like template, for TeamSpace `name`."""
    text = json.dumps(template)
    old = template["metadata"].get("labels", {}).get("platform.labhub.io/teamspace") \
        or template["metadata"]["name"]
    text = text.replace(old, name)
    text = text.replace(template["metadata"]["uid"], str(uuid.UUID(int=i << 8 | hash(
        template["kind"]) & 0xFF)))
    return text.replace(f'"resourceVersion": "{template["metadata"]["resourceVersion"]}"',
                        f'"resourceVersion": "{1000 + i}"')


class PagedApi:
    """Answers a cache's paged lists with the objects' JSON, decoded per page as Api does."""

    def __init__(self, n: int) -> None:
        t = templates()
        self.n = n
        self.kinds = {"teamspaces": t["TeamSpace"], "namespaces": t["Namespace"],
                      "resourcequotas": t["ResourceQuota"]}

    def request(self, method, path, *, query=None, timeout=None, **kw):
        template = self.kinds[path.rsplit("/", 1)[-1]]
        start = int(query.get("continue") or 0)
        end = min(self.n, start + PAGE)
        items = ",".join(text_of(template, f"bench-{i:05d}", i) for i in range(start, end))
        meta = {"resourceVersion": str(1000 + self.n)}
        if end < self.n:
            meta["continue"] = str(end)
        return json.loads(f'{{"metadata": {json.dumps(meta)}, "items": [{items}]}}')


def measure(n: int, slim: bool) -> float:
    """Bytes per TeamSpace that the three filled caches keep."""
    keep = records.record_of
    if not slim:
        cache.records.record_of = lambda obj: obj   # what the caches kept before records.py
    try:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        caches = Caches(PagedApi(n), lambda name: None, page_size=PAGE)
        for informer in caches.all:
            informer.relist()
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        assert all(len(informer) == n for informer in caches.all)
        held = sum(s.size_diff for s in after.compare_to(before, "filename"))
        return held / n
    finally:
        cache.records.record_of = keep


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    rows = []
    print("| TeamSpaces | whole objects, KiB per TeamSpace | slim records, KiB per TeamSpace | ratio |")
    print("| ---: | ---: | ---: | ---: |")
    for n in (int(s) for s in args.sizes.split(",")):
        whole, slim = measure(n, slim=False), measure(n, slim=True)
        rows.append({"teamspaces": n, "whole_bytes": round(whole), "slim_bytes": round(slim)})
        print(f"| {n:,} | {whole / 1024:.1f} | {slim / 1024:.1f} | {slim / whole:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
