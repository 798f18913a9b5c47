"""The shared engine: PostgreSQL through psycopg 3 (the ``authsvc[postgres]`` extra).

store.py is the admin side (writes, migrations, export/import) with the engine's dialect,
reader.py the web process's read path, schema.py the migrations and grants. This package
imports nothing: the web process loads reader.py without the writer.
"""
