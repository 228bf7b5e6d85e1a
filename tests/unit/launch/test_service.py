"""The daemon raises its soft descriptor limit at start (monarch.launch.service): a slow PFS
keeps hundreds of copies in flight, a few descriptors each, and a node's soft limit is often
1,024."""

import resource
import subprocess
import sys


def test_the_daemon_raises_its_soft_descriptor_limit_toward_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = ("import resource; h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, h)); "
            "from monarch.launch.service import raise_open_files_limit; raise_open_files_limit(); "
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    want = 1 << 16 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16)
    assert int(out) == max(256, want)
