"""HDF5 CSR segment store (mvdb.storage): not built yet, see issue #3."""
