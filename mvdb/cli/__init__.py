"""The ``mvdb`` command line: a thin click group over the Python API.

``group`` holds the group and the options the commands share, ``arguments`` the DB and ids
arguments; each other module holds the commands of one job.
"""

from mvdb.cli import demo, documents, ingest, maintenance, query, serve
from mvdb.cli.group import main

for _command in (ingest.ingest, query.search, query.explain, documents.get, documents.delete, documents.export,
                 maintenance.info, maintenance.verify, maintenance.compact, maintenance.recover,
                 maintenance.warmup, serve.serve, demo.demo):
    main.add_command(_command)

__all__ = ["main"]
