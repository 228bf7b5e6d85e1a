"""A directory to open for a listing as the job sees it (docs/consistency.md, W1): the PFS's own
where nothing of the job's is pending in it, else one made in the run's area with the names the
view gives (files empty, directories directories), which the shim lists instead."""

from __future__ import annotations

import itertools
import os
import shutil

from monarch.writeback.view import View

LISTS = "lists"  # the area's directories made to list a directory as the job sees it


class Listings:
    """The listings made in one run's area."""

    def __init__(self, view: View, area_path: str):
        self.view = view
        self.path = os.path.join(area_path, LISTS)
        self._made = itertools.count(1)  # (next() is atomic: the calls' threads share it)

    def directory(self, directory: str) -> str:
        view = self.view
        names = view.listing(directory)
        kind, where = view.resolve(directory)
        on_pfs = not view.made_dir(directory) and view.is_dir(directory)  # (a directory it made: not yet)
        if kind == "pfs" and where == directory and on_pfs and not view.pending_in(directory):
            return directory
        made = os.path.join(self.path, str(next(self._made)))
        os.makedirs(made, mode=0o700)
        for name in names:
            child = os.path.join(directory, name)
            k, _ = view.resolve(child)
            if k == "pfs" and view.is_dir(child):
                os.mkdir(os.path.join(made, name), 0o700)
            else:
                os.close(os.open(os.path.join(made, name), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        return made

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
