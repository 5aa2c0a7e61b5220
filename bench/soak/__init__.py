"""The soak (issue 39): jobs streamed in and faults injected from a seeded schedule for a set time, on the
upstream control plane with kwok nodes and a few process-kubelet nodes running real trainers, while invariants
are checked from outside the operator.

    flock /tmp/pj-heavy.lock .venv/bin/python -m bench.soak --minutes 20 --seed 39

`schedule` (what happens when: a pure function of the seed), `jobs` (the ParallelJob documents), `invariants`
(pure checks over what was read from the API), `report` (the printed report) are pure; `cluster` starts what
the soak runs on, `faults` injects each kind, `observe` reads the API and the operator's process, `run` drives.
"""
