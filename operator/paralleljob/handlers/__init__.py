"""kopf wiring of the operator: thin handlers over pure policies, the planner, manifests and `paralleljob.k8s`.

`registry` registers the kopf handlers (importing it is what `paralleljob operator` does); `reconcile`
decides and acts for one job from the cluster's state; `gang`, `conditions` and `placement` are the pure
policies it consults (`step_promise` too: the measured against the modeled step time); `coalescer` runs at most
one reconcile per job at a time; `metrics` exports the operator's Prometheus figures and `job_metrics` each job's
training figures.
"""
