"""The suite's check of the room its data needs (tests/support/space.py): one message, first, with
the figures and the fix, where /tmp or /dev/shm cannot hold it."""

from support.space import GiB, short_of_space


def test_a_host_with_room_runs_the_suite():
    assert short_of_space(free=lambda path: 100 * GiB) is None


def test_too_little_room_is_said_with_its_figures_and_the_fix():
    why = short_of_space(free=lambda path: {"/tmp": GiB // 2, "/dev/shm": 64 * GiB}[path])
    assert why.startswith("the test suite cannot run here: /tmp has 0.5 GiB free, and the suite needs 1 GiB there "
                          "(its datasets, run directories and disk tiers). Free some space there")
    assert "/dev/shm" not in why


def test_a_place_that_is_not_there_is_left_to_the_tests_that_need_it():
    def free(path):
        if path == "/dev/shm":
            raise FileNotFoundError(path)
        return 100 * GiB
    assert short_of_space(free=free) is None
