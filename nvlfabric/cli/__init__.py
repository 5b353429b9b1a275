"""The command lines: `nvlfabric` (`main`: preview reports, cluster review, the policy pack's path)
and `nvlfabric-sim` (`sim`: the local simulator). Each is a thin argparse front over the room that
does the work (`nvlfabric.review`, `nvlfabric.sim` with `nvlfabric.testbed`); nothing imports this room."""
