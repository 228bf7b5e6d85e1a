"""Live progress: what a line says, whole lines off a terminal, one rewritten line on it, and off."""

import io
import threading
import time

from monarch.launch.progress import Progress, Publishing, duration, interval, line, publishing_line, wanted
from monarch.records.node_stats import NodeStats

MiB = 2**20


def stats(files, nbytes, ram_opens=0, pfs_bytes=0):
    return {"staging": {"files": files, "bytes": nbytes, "pfs_bytes_read": nbytes},
            "dataset": {"files": 100, "bytes": 100 * MiB},
            "opened_from": {"pfs": {"opens": 2, "bytes": pfs_bytes}, "ram": {"opens": ram_opens, "bytes": 0}}}


def test_a_line_says_staged_rate_opens_and_pfs_bytes():
    text = line(NodeStats.from_dict(stats(40, 40 * MiB, ram_opens=120, pfs_bytes=MiB)), rate=8 * MiB)
    assert text == ("monarch: staged 40/100 files, 40.0 MiB/100.0 MiB 40% | 8.0 MiB/s | opens pfs 2 ram 120 | "
                    "PFS read 41.0 MiB")


def test_a_line_gives_the_pfs_bytes_of_mmap_and_stdio_readers_as_the_report_does():
    """PFS opens read through mmap: a range up to the lengths mapped; through a FILE: at least."""
    mapped = stats(40, 40 * MiB)
    mapped["opened_from"]["pfs"] = {"opens": 2, "bytes": MiB, "opens_uncounted": 2, "opens_stdio": 0,
                                    "mapped_bytes": 4 * MiB}
    assert line(NodeStats.from_dict(mapped), rate=None).endswith("| PFS read 41.0 MiB to 45.0 MiB")
    mapped["opened_from"]["pfs"]["opens_stdio"] = 1
    assert line(NodeStats.from_dict(mapped), rate=None).endswith("| PFS read ≥ 41.0 MiB")


def test_a_line_says_the_store_bytes_beside_the_pfs_bytes():
    """A root served from a key-value store (dataset.stores): its bytes read so far, beside the PFS's."""
    st = stats(40, 40 * MiB, ram_opens=120)
    st["staging"] |= {"pfs_bytes_read": 0, "store_bytes_read": 40 * MiB, "store": {"refused_count": 0}}
    assert line(NodeStats.from_dict(st), rate=None).endswith("| PFS read 0 B | store read 40.0 MiB")


def test_during_the_walk_a_line_says_so():
    walking = stats(0, 0) | {"snapshot": "walking", "uptime_seconds": 3.2, "dataset": {"files": 0, "bytes": 0}}
    assert line(NodeStats.from_dict(walking), rate=None) == "monarch: walking the dataset (3 s) | opens pfs 2 ram 0 | PFS read 0 B"


def test_rate_comes_from_successive_polls():
    out = io.StringIO()
    p = Progress(lambda: None, out, tty=False, every=1)
    p.show(stats(10, 10 * MiB), now=100.0)
    p.show(stats(30, 30 * MiB), now=102.0)
    first, second = out.getvalue().splitlines()
    assert "MiB/s" not in first and "| 10.0 MiB/s |" in second


def test_not_a_terminal_gets_whole_lines_only():
    out = io.StringIO()
    polls = iter([stats(1, MiB), stats(2, 2 * MiB)] + [stats(3, 3 * MiB)] * 100)
    done = threading.Event()

    def poll():
        done.set()
        return next(polls)
    p = Progress(poll, out, tty=False, every=1).start()
    done.wait(5)
    time.sleep(1.5)
    p.stop()
    text = out.getvalue()
    assert text and text.endswith("\n") and "\r" not in text and "\x1b" not in text
    assert all(x.startswith("monarch: staged ") for x in text.splitlines())


def test_a_terminal_gets_its_bottom_row_outside_the_scrolling_region(monkeypatch):
    import os
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback: os.terminal_size((120, 40)))
    out = io.StringIO()
    p = Progress(lambda: None, out, tty=True, every=1)
    p.show(stats(1, MiB), 1.0)
    p.show(stats(2, 2 * MiB), 2.0)
    p.stop()
    reserve, first, second = out.getvalue().split("\x1b7\x1b[40;1H")  # each draws the bottom row
    assert reserve == "\n\x1b[1A\x1b7\x1b[1;39r\x1b8"  # the command's output scrolls in rows 1..39 only
    assert first.startswith("\x1b[Kmonarch: staged 1/100") and first.endswith("\x1b8")
    assert second.startswith("\x1b[Kmonarch: staged 2/100")
    # at the end the whole screen scrolls again and the bottom row is cleared
    assert second.endswith("\x1b8\x1b7\x1b[1;40r\x1b[40;1H\x1b[K\x1b8")
    assert out.getvalue().count("\n") == 1


def test_on_off_and_intervals():
    assert wanted(False, {}) and not wanted(True, {})
    assert not wanted(False, {"MONARCH_PROGRESS": "0"}) and not wanted(False, {"MONARCH_PROGRESS": "off"})
    assert not wanted(False, {"MPI_LOCALRANKID": "2"}) and wanted(False, {"SLURM_LOCALID": "0"})
    assert wanted(False, {"MPI_LOCALRANKID": "2", "MONARCH_PROGRESS": "1"})
    assert interval(True, {}) == 1.0 and interval(False, {}) == 5.0
    assert interval(False, {"MONARCH_PROGRESS_INTERVAL": "0.1"}) == 1.0  # never polls faster than 1 s
    assert interval(False, {"MONARCH_PROGRESS_INTERVAL": "2"}) == 2.0


def test_while_a_saved_index_is_loaded_a_line_says_so_not_walking():
    # a job with keep: true loads the dataset's saved index: the line says so, not "walking"
    loading = stats(0, 0) | {"snapshot": "walking", "uptime_seconds": 2.0, "dataset": {"files": 0, "bytes": 0}}
    text = line(NodeStats.from_dict(loading), rate=None, saved_index=True)
    assert text.startswith("monarch: loading the dataset's saved index (2 s; walked again if a directory changed) |")
    assert "walking" not in text
    out = io.StringIO()
    Progress(lambda: None, out, tty=False, every=1, saved_index=True).show(loading, now=1.0)
    assert out.getvalue().startswith("monarch: loading the dataset's saved index")


def waiting(to_publish, files, copied=0, drain_seconds=0.0, records=10, applied=0):
    """A brief REPORT while the run waits for its write-back (W7)."""
    return stats(100, 100 * MiB) | {"writeback": {
        "publishing_bytes": to_publish, "publishing_files": files, "pending_bytes": to_publish,
        "bytes_copied": copied, "drain_seconds": drain_seconds, "records": records, "applied": applied}}


def test_while_the_run_waits_for_its_write_back_a_line_says_pending_rate_and_time_left():
    out = io.StringIO()
    p = Publishing(lambda: None, out, tty=False, every=1)
    p.begin(waiting(400 * MiB, 8), now=10.0)
    p.show(waiting(200 * MiB, 4), now=12.0)  # 200 MiB published in 2 s: 100 MiB/s, 2 s for the rest
    assert out.getvalue() == ("monarch: publishing the job's writes to the PFS: 200.0 MiB pending (4 files), "
                              "100.0 MiB/s, about 2 s left\n")


def test_before_a_file_is_published_in_the_wait_the_rate_is_the_drains_during_the_job():
    p = Publishing(lambda: None, io.StringIO(), tty=False, every=1)
    p.begin(waiting(MiB, 1), now=10.0)
    text = p.text(NodeStats.from_dict(waiting(MiB, 1, copied=6 * MiB, drain_seconds=3.0)), now=11.0)
    assert text == "monarch: publishing the job's writes to the PFS: 1.0 MiB pending (1 file), 2.0 MiB/s, about 1 s left"
    nothing = p.text(NodeStats.from_dict(waiting(MiB, 1)), now=11.0)  # no figure yet: no rate, no guess
    assert nothing == "monarch: publishing the job's writes to the PFS: 1.0 MiB pending (1 file)"


def test_with_no_bytes_left_the_line_counts_the_operations_still_to_apply():
    text = publishing_line(waiting(0, 0, records=12, applied=9)["writeback"], rate=None)
    assert text == "monarch: publishing the job's writes to the PFS: 0 B pending (0 files), 3 operations to apply"


def test_the_time_left_reads_in_seconds_minutes_then_hours():
    assert [duration(s) for s in (0.2, 2.4, 89, 150, 5000, 7170)] == ["1 s", "2 s", "89 s", "2 min", "83 min",
                                                                        "1 h 59 min"]


def test_the_wait_line_polls_on_its_thread_and_draws_as_the_command_line_does():
    out = io.StringIO()
    polls = iter([waiting(4 * MiB, 4), waiting(3 * MiB, 3)] + [waiting(2 * MiB, 2)] * 100)
    p = Publishing(lambda: next(polls), out, tty=False, every=1).start()
    time.sleep(2.5)
    p.stop()
    lines = out.getvalue().splitlines()
    assert lines and all(x.startswith("monarch: publishing the job's writes to the PFS: ") for x in lines)
    assert "/s, about " in lines[-1] and out.getvalue().endswith("\n") and "\x1b" not in out.getvalue()
