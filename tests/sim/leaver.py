"""A stand-in pod program that leaves processes behind, as NVIDIA's IMEX daemon manager does when it
restarts `nvidia-imex` while being stopped: a sleeper in a session of its own (`sleep <3000 + $TAG>`,
which a process-group kill does not reach), and a grandchild orphaned at once that exits after
half a second (re-parented to its PID namespace's first process: a zombie unless that reaps).
Then it waits to be stopped."""

import os
import subprocess
import time

subprocess.Popen(["sleep", str(3000 + int(os.environ["TAG"]))], start_new_session=True)
if os.fork() == 0:
    if os.fork() == 0:
        time.sleep(0.5)
        os._exit(0)
    os._exit(0)
os.wait()
while True:
    time.sleep(3600)
