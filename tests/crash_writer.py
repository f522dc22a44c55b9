"""Crash-test writer: runs planned operations on a store, journaling each one that returned.

    python tests/crash_writer.py DB SEED JOURNAL [database | codes]

With ``database``, the operations go through ``mvdb.open`` with an IVF index that retrains
after almost every add (RETRAIN_GROWTH 1.05), so kills land in retrains too; with ``codes``, the
same with the compressed tier (residency="host"), so kills land in code rebuilds.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from crash_plan import plan, run  # noqa: E402

from mvdb.storage import Store  # noqa: E402


def main(db: str, seed: int, journal: str, kind: str = "store") -> None:
    if kind in ("database", "codes"):
        import mvdb
        from mvdb.engine import ivf

        ivf.RETRAIN_GROWTH = 1.05
        # "codes": the compressed tier too (residency="host"), rebuilt with every retrain; 32 lists:
        # enough for the index's choice of documents to decide the checker's searches
        store = mvdb.open(db, dim=16, index="ivf", nlist=32, device="cpu", progress=False,
                          residency="host" if kind == "codes" else "auto")
        ops = plan(seed, store.store.ids(), store.store.manifest["next_id"])
    else:
        store = Store(db, dim=16)
        ops = plan(seed, store.ids(), store.manifest["next_id"])
    with open(journal, "a") as j:
        j.write("ready\n")
        j.flush()
        for i, op in enumerate(ops):
            run(store, op)
            j.write(f"{i}\n")
            j.flush()
            os.fsync(j.fileno())
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], *sys.argv[4:])
