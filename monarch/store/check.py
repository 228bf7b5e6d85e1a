"""Each store a configuration names answers and holds a manifest, checked before anything
starts (``monarch run`` and ``monarch check-config``)."""

from __future__ import annotations

from typing import Mapping

from monarch.store import client as store_client
from monarch.store import keys as store_keys
from monarch.store.load import fetch_manifest
from monarch.store.url import StoreError


def check_stores(stores: Mapping[str, str], found: list | None = None, notes: list | None = None) -> list[str]:
    """Each store of ``stores`` (a root served from a store -> its URL, as configured:
    ``DatasetConfig.store_roots()``) answers and holds a manifest: the problems, one line
    each, naming the root. ``found`` gets (root, URL, manifest) of each store that is fine;
    ``notes`` a line per store whose keys seen so far include some not served as files."""
    problems = []
    for root, url_text in stores.items():
        try:
            url = store_client.parse_url(url_text)
            client = store_client.ping(url)
            try:  # an S3 bucket's ping is a whole check: listed in full only to be shown (check-config)
                manifest = fetch_manifest(client, url) if url.has_digests or found is not None else None
            finally:
                client.close()
            skipped = manifest.skipped if manifest is not None else getattr(client, "skipped", ())
            if notes is not None and skipped:
                partial = "" if manifest is not None else " in the listing's first page"
                notes.append(f"{root}: {store_keys.summary(skipped)}{partial} "
                             "(skipped; the rest is served; the report names them)")
            if found is not None:
                found.append((root, url, manifest))
        except StoreError as e:
            problems.append(f"{root}: {e}")
    return problems
