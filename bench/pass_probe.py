"""Run one controller pass inside the test host and report its cost as one JSON line.

Copied into the host by bench/run.py and run there with the service's environment (KUBECONFIG,
CNPA_BASE_DIR, CNPA_ARCHIVE_DIR, no HOME), so the pass sees what cnpa-op.service's passes see.
Reports wall time, CPU time (user + system) of every process of the pass (bash, kubectl, jq),
and the peak resident memory of the largest single process (getrusage of the waited children).
"""

import json
import resource
import subprocess
import sys
import time

t0 = time.monotonic()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=900, check=False)
wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "rc": proc.returncode, "wall_s": round(wall, 4),
    "cpu_s": round(ru.ru_utime + ru.ru_stime, 4), "maxrss_mib": round(ru.ru_maxrss / 1024, 1),
    "stderr": proc.stderr[-1500:],
}))
