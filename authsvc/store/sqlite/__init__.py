"""The embedded engine: one SQLite file in WAL mode.

store.py is the admin side (migrations, writes, backup, export/import), reader.py the web
process's read path, url.py the ``sqlite://`` URL, errors.py sqlite3's errors as the store's.
This package imports nothing: the web process loads reader.py without the writer.
"""
