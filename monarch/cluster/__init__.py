"""The peer layer of the node daemons: placement, snapshot sharing and file transfer over MPI.

MPI lives only in the daemons (``monarch serve`` under mpiexec/srun). Importing this
package does not import mpi4py; ``Cluster.from_world()`` does.
"""

from ..errors import FailureReason
from .peer import Cluster
from .placement import owner
from .world import abort_on_unhandled_exception, mpi_world_rank

__all__ = ["Cluster", "FailureReason", "owner", "mpi_world_rank", "abort_on_unhandled_exception"]
