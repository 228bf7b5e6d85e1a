"""The write-back's order across nodes (monarch/cluster/order.py): each node's journal counts asked
at an open, a publish held until every node applied up to them, refused when one's drain stopped
short or lost before it, never waiting on a lost node. Nodes here are WriteOrders joined by a queue that stands for
MPI (each node's engine thread delivers its messages in order)."""

import queue
import threading
import time

import pytest

from monarch.cluster.control import ControlTable
from monarch.cluster.order import UNKNOWN, OrderFailed, WriteOrder


class Net:
    """Every node's engine: one thread per node delivers the messages sent to it, in order."""

    def __init__(self, nodes):
        self.lost, self.silent = set(), set()
        self.inbox = [queue.Queue() for _ in range(nodes)]
        self.orders = [WriteOrder(Engine(self, k), k, nodes, lambda n: n in self.lost) for k in range(nodes)]
        self.tables = [ControlTable(lambda src: None, o.handlers()) for o in self.orders]
        for k in range(nodes):
            threading.Thread(target=self._deliver, args=(k,), daemon=True).start()

    def _deliver(self, k):
        while True:
            src, msg = self.inbox[k].get()
            if k not in self.silent:
                self.tables[k].dispatch(src, msg)


class Engine:
    def __init__(self, net, node):
        self.net, self.node = net, node

    def call(self, fn):
        fn()

    def send_obj(self, msg, dest):
        self.net.inbox[dest].put((self.node, msg))


class Journal:
    """A node's write-back, as its order sees it: made, applied, failed."""

    def __init__(self, order):
        self.made, self.applied, self.failed = 0, 0, False
        self.order = order
        order.serve(lambda: self.made, lambda: (self.applied, self.failed))

    def apply(self, upto, failed=False):
        self.applied, self.failed = upto, failed
        self.order.moved()


def test_an_open_takes_every_other_nodes_count_of_operations_recorded():
    net = Net(3)
    journals = [Journal(o) for o in net.orders]
    journals[0].made, journals[2].made = 7, 3
    assert net.orders[1].counts() == {0: 7, 2: 3}
    assert Net(1).orders[0].counts() == {}  # a single node asks nobody


def test_a_publish_waits_until_every_node_applied_what_was_recorded_before_its_open():
    net = Net(3)
    journals = [Journal(o) for o in net.orders]
    journals[0].made, journals[2].made = 5, 2
    needs = net.orders[1].counts()
    done = threading.Event()
    threading.Thread(target=lambda: (net.orders[1].wait_applied(needs), done.set()), daemon=True).start()
    journals[0].apply(5)
    assert not done.wait(0.3)  # node 2 has not applied its 2 yet
    journals[2].apply(1)
    assert not done.wait(0.3)
    journals[2].apply(2)
    assert done.wait(5)


def test_a_node_whose_drain_was_refused_fails_what_is_ordered_after_it():
    net = Net(2)
    journals = [Journal(o) for o in net.orders]
    journals[0].made = 4
    needs = net.orders[1].counts()
    journals[0].apply(2, failed=True)
    with pytest.raises(OrderFailed, match="node 0 could not publish"):
        net.orders[1].wait_applied(needs)
    net.orders[1].wait_applied({0: 2})  # what it did apply is not held


def test_a_lost_node_is_not_waited_for_nor_asked():
    """What a lost node had published is not held; what it had not fails at once (never torn: the
    file ordered after it is kept). Before, it was published without the lost node's files."""
    net = Net(3)
    journals = [Journal(o) for o in net.orders]
    journals[0].made = 3
    needs = net.orders[1].counts()
    journals[0].apply(2)
    net.orders[1].wait_applied({0: 2})  # heard before it was lost
    net.lost.add(0)
    net.orders[1].lost(0, "no heartbeat")
    t0 = time.monotonic()
    net.orders[1].wait_applied({0: 2})  # published before it was lost: nothing to hold
    with pytest.raises(OrderFailed, match="node 0 was lost before its write-back operation 3"):
        net.orders[1].wait_applied(needs)
    assert time.monotonic() - t0 < 2
    assert net.orders[1].counts() == {0: UNKNOWN, 2: 0}  # a file opened now is ordered after whatever it had


def test_a_node_that_does_not_answer_is_left_out_after_the_timeout(caplog):
    net = Net(2)
    [Journal(o) for o in net.orders]
    net.silent.add(0)
    assert net.orders[1].counts(timeout=0.3) == {}
    assert "did not say what they had written" in caplog.text


def test_a_progress_message_missed_is_asked_for_again():
    net = Net(2)
    journals = [Journal(o) for o in net.orders]
    journals[0].made = 1
    needs = net.orders[1].counts()
    journals[0].applied = 1  # applied, but the message saying so is never sent
    t0 = time.monotonic()
    net.orders[1].wait_applied(needs)
    assert time.monotonic() - t0 < 5
