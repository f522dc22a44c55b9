"""Test support: seeded synthetic corpora (``mvdb.testing.synthetic``) shared by the tests and the
benchmarks. Not part of the public API."""
