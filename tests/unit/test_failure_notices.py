"""Without MPI failure notices (no MPI_Comm_get_failed) the engine asks once, not every tick."""

from monarch.cluster.peer import Cluster


class FakeMPI:
    TAG_UB = 0
    UNDEFINED = -32766

    class Exception(Exception):
        pass


class NoFailureNotices:
    def __init__(self):
        self.asked = 0

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2

    def Get_attr(self, key):
        return 32767

    def Ack_failed(self):
        # what mpi4py raises for an MPI routine the loaded library lacks (an MPI without ULFM's calls)
        self.asked += 1
        raise NotImplementedError("MPI_Comm_ack_failed")


def test_an_mpi_without_failure_notices_is_asked_once():
    comm = NoFailureNotices()
    cluster = Cluster(FakeMPI, comm)
    for _ in range(5):
        cluster._check_failed()
    assert comm.asked == 1 and not cluster._lost
