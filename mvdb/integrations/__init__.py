"""Adapters that let other libraries use mvdb (PyLate)."""
