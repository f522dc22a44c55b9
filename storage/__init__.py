"""Crash-safe HDF5 segment store (mvdb.storage): CSR-packed float16 / int8 documents, stable ids.

    from mvdb.storage import Store
    with Store("my.mvdb", dim=128) as st:
        ids = st.add([doc0, doc1], metadata=[{"lang": "en"}, None])
        packed = st.gather(ids)          # tokens / offsets / scales, in request order
"""

from mvdb.storage.packed import Packed
from mvdb.storage.repair import VerifyReport, recover, verify
from mvdb.storage.snapshot import Snapshot
from mvdb.storage.store import Store

__all__ = ["Packed", "Snapshot", "Store", "VerifyReport", "recover", "verify"]
