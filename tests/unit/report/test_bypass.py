"""The warning ``monarch run`` prints when the dataset was not read through Monarch."""

from monarch.report.bypass import LONG_RUN_SECONDS, MIN_DATASET_FILES, bypass_warning


def report(processes, opens, files=100, wall=1.0):
    return {"dataset": {"files": files, "bytes": files * 4096}, "processes_with_shim": processes,
            "opened_from": {"pfs": {"opens": 0, "bytes": 0}, "ram": {"opens": opens, "bytes": opens * 4096}},
            "job": {"wall_seconds": wall}}


def test_no_process_with_the_shim_says_it_was_never_loaded():
    w = bypass_warning(report(processes=0, opens=0))
    assert w.startswith("the dataset was not read through Monarch: no process of the command ran with the")
    assert "env -u LD_PRELOAD" in w and "statically linked" in w and "\n" not in w


def test_loaded_but_no_open_under_the_roots():
    w = bypass_warning(report(processes=2, opens=0))
    assert "2 process(es) ran with the shim but none opened a file under the dataset roots" in w


def test_far_fewer_opens_than_the_dataset_in_a_long_run():
    files = MIN_DATASET_FILES * 10
    assert "only 3 open(s) of the dataset's" in bypass_warning(report(1, 3, files=files, wall=LONG_RUN_SECONDS))
    assert bypass_warning(report(1, 3, files=files, wall=LONG_RUN_SECONDS / 2)) is None  # a short run: a subset


def test_a_run_through_the_shim_and_an_empty_dataset_are_quiet():
    assert bypass_warning(report(processes=1, opens=100)) is None
    assert bypass_warning(report(processes=0, opens=0, files=0)) is None
    assert bypass_warning(report(processes=None, opens=5)) is None  # an older shim: not counted, not blamed


def test_a_stat_only_command_answered_from_the_index_is_not_said_to_bypass_monarch():
    # `monarch run -- stat ...` has its stats answered from the index (the report's metadata.local):
    # it is not told "the dataset was not read through Monarch"
    r = report(processes=1, opens=0) | {"metadata": {"local": 7, "pfs": 0}}
    w = bypass_warning(r)
    assert "not read through Monarch" not in w
    assert w.startswith("no file of the dataset was opened through Monarch, though 7 stat or listing call(s) "
                        "under the roots were answered from its index")
    assert "\n" not in w
    # no metadata answered either: the shim served nothing, as before
    assert "none opened a file" in bypass_warning(report(processes=1, opens=0) | {"metadata": {"local": 0, "pfs": 3}})
