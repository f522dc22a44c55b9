"""Crash-safe HDF5 segment store (mvdb.storage): CSR-packed float16 / int8 documents, stable ids.

    from mvdb.storage import Store
    with Store("my.mvdb", dim=128) as st:
        ids = st.add([doc0, doc1], metadata=[{"lang": "en"}, None])
        packed = st.gather(ids)          # tokens / offsets / scales, in request order
"""

from mvdb.storage.store import Packed, Snapshot, Store, VerifyReport, recover, verify

__all__ = ["Packed", "Snapshot", "Store", "VerifyReport", "recover", "verify"]
