"""Cost of the two thread-safe ways to share the Snowball stemmer (issue 13, item 1).

    python -m bench.lexical_threads [--threads N] [--calls N] [--rounds N]

The analyzer runs on the search and admission hot path from the server's worker threads, and a
Snowball stemmer object is not thread-safe. This times ``analyze``-sized stemming calls (one
sentence's worth of words) made from ``--threads`` threads through

- ``per_thread``: a stemmer per thread (``threading.local``), what ``engine.lexical`` does;
- ``locked``: one shared stemmer behind a ``threading.Lock``;

interleaving the two for ``--rounds`` rounds and reporting the best round of each in
microseconds per call (the best round is the one least disturbed by other load on the machine).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable

from snowballstemmer import stemmer

WORDS = [
    "painters",
    "painting",
    "generously",
    "relational",
    "conditional",
    "rationalizations",
    "hopefulness",
    "connections",
    "organizations",
    "abilities",
    "happily",
    "nationalism",
]

StemWords = Callable[[list[str]], list[str]]


def per_thread() -> StemWords:
    local = threading.local()

    def stem(words: list[str]) -> list[str]:
        own: StemWords | None = getattr(local, "stem", None)
        if own is None:
            own = local.stem = stemmer("english").stemWords
        return own(words)

    return stem


def locked() -> StemWords:
    lock = threading.Lock()
    shared: StemWords = stemmer("english").stemWords

    def stem(words: list[str]) -> list[str]:
        with lock:
            return shared(words)

    return stem


def time_one(stem: StemWords, threads: int, calls: int) -> float:
    """Microseconds per call, ``calls`` calls spread over ``threads`` threads."""
    per = max(1, calls // threads)
    start = threading.Barrier(threads + 1)

    def work() -> None:
        start.wait()
        for _ in range(per):
            stem(WORDS)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    start.wait()
    for worker in workers:
        worker.join()
    return (time.perf_counter() - began) / (per * threads) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--calls", type=int, default=3200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, factory in (("per_thread", per_thread), ("locked", locked)):
            for threads in (1, args.threads):
                key = f"{name}_{threads}_threads_us_per_call"
                took = time_one(factory(), threads, args.calls)
                best[key] = min(best.get(key, took), took)
    print(json.dumps({"words_per_call": len(WORDS), **{k: round(v, 1) for k, v in best.items()}}))


if __name__ == "__main__":
    main()
