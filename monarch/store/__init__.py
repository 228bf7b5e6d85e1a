"""A dataset kept in a key-value store (the Redis protocol) or an S3 bucket, served as files under a mount path.

``url.py`` (where the store is, its credentials, never printed), ``manifest.py`` (the list of
files the store holds, from which the snapshot is built without listing the store),
``load.py`` (``monarch store put`` and ``monarch store ls``), ``check.py`` (each store a
configuration names answers and holds a manifest, checked at start), ``report.py`` (the report's
``store`` figures), ``s3.py`` (an S3 bucket: its URL, the AWS conventions, the client; its
listing is the manifest), ``s3_inventory.py`` (or its S3 Inventory report, read instead of a
listing). The daemon's side, the source the stager copies from, is
``monarch/node/stage/store_source.py``. docs/store.md says how to use it.
"""
