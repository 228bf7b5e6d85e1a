"""What a job says of its shared copies: at the start and in the report's text."""

from monarch.report.sharing import sharing_at_start, sharing_lines


def tier(name, files=0, **shared):
    out = {"name": name, "files": files}
    if shared:
        out["shared"] = {"path": f"/dev/shm/monarch-1/share-ab-{name}", "capacity": 4 << 30,
                         "configured_capacity": 4 << 30, "jobs_at_join": 1, "from_others_files": 0,
                         "from_others_bytes": 0, "waited": 0, "set_bytes": 0} | shared
    return out


def test_the_report_says_what_came_from_other_jobs_and_what_the_last_job_left():
    report = {"nodes": [{"tiers": [tier("ram", 10, from_others_files=7, from_others_bytes=7 << 20,
                                        left_until=2_000_000_000.0, set_bytes=10 << 20),
                                   tier("ssd", 0, set_bytes=0),  # shared, but nothing in it: no line
                                   {"name": "nvme", "files": 3, "not_shared": "a compressing tier is not shared yet"}]}]}
    lines = sharing_lines(report)
    assert any(line.startswith("tier ram shared: 7 files (7.0 MiB) were copies another job staged") for line in lines)
    (left,) = [line for line in lines if line.startswith("left")]
    assert "10.0 MiB" in left and "share-ab-ram" in left and "`monarch cache drop` frees them now" in left
    assert not any("ssd" in line for line in lines)
    assert "tier nvme not shared: a compressing tier is not shared yet" in lines


def test_the_report_says_which_files_were_staged_anew_because_they_changed_since_the_sets_copy():
    report = {"nodes": [{"tiers": [tier("ram", 1, restaged_files=1, restaged_bytes=64 << 20)]}]}
    assert "tier ram re-staged: changed since the set's copy: 1 file (64.0 MiB), the set's copy replaced" \
        in sharing_lines(report)


def test_the_report_says_which_large_files_were_staged_on_from_blocks_another_job_left():
    report = {"nodes": [{"tiers": [tier("ram", 1, resumed_files=1, resumed_bytes=16 << 20,
                                        resumed_of_bytes=32 << 20)]}]}
    assert "tier ram resumed: 1 large file another job left partly staged, 16.0 MiB of 32.0 MiB kept, " \
        "the rest staged from there" in sharing_lines(report)


def test_at_the_start_a_per_job_base_and_another_capacity_are_said_in_one_line_each():
    lines = sharing_at_start({
        "ram": {"not_shared": "/dev/shm is private to each job on this node (Slurm's job_container/tmpfs): "
                              "jobs cannot share copies there"},
        "ssd": {"path": "/tmp/monarch-1/share-ab", "jobs": 2, "capacity": 1 << 30, "configured_capacity": 2 << 30},
        "off": {"not_shared": "staging.share is false"},
        "same": {"path": "/x", "jobs": 0, "capacity": 5, "configured_capacity": 5}})
    assert len(lines) == 2
    assert lines[0].startswith("tier ram: /dev/shm is private to each job")
    assert "joins the copies of 2 running job(s)" in lines[1] and "1.0 GiB" in lines[1] and "2.0 GiB" in lines[1]
