"""Started by Python in a process whose PYTHONPATH holds this folder: with ``AE_TEST_SIMULATED_CUDA=1`` the whole
process runs on the simulated CUDA GPU of ``tests/gpu_sim.py`` (an app server a browser test starts)."""

import os
import sys

if os.environ.get("AE_TEST_SIMULATED_CUDA") == "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import gpu_sim

    SIMULATED = gpu_sim.simulated_cuda()  # kept: a collected context manager would close, and undo the patches
    SIMULATED.__enter__()  # for the life of the process
