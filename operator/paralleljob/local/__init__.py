"""`paralleljob run`: a ParallelJob on one machine, with the operator's plan and pod environment.

`shape` sizes the simulated nodes and plans the job on them, `runner` prepares and executes a run, `gang` starts and stops the node processes together, `progress` shows
rank 0's metrics live, and `report` writes the summary and the loss curve.
"""
